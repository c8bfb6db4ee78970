//! Releases' tests: records, history, rollback targets, the follower.

use super::rollback::resolve;
use super::*;

fn pushed(digest: &str, history: Vec<Step>) -> Release {
    Release {
        digest: Some(digest.to_string()),
        previous: None,
        pushed_ms: 1,
        how: Some(How::Push),
        history,
        canary: None,
        ended: None,
        last_shadow: None,
    }
}

fn entry(key: &str, value: Option<&str>, revision: u64) -> Entry {
    Entry {
        key: key.to_string(),
        value: bytes::Bytes::from(value.unwrap_or_default().to_string()),
        revision,
        operation: match value {
            Some(_) => crate::nats::kv::Operation::Put,
            None => crate::nats::kv::Operation::Delete,
        },
        created: std::time::SystemTime::UNIX_EPOCH,
    }
}

#[test]
fn the_follower_publishes_releases_and_prepares_once_caught_up() {
    let (follower, releases) = ReleaseFollower::new();
    let prepares = follower.prepares();
    let release = serde_json::to_string(&pushed("aa", Vec::new())).unwrap();
    let prepare = r#"{"digest":"bb","pushed_ms":7}"#;
    follower.apply(&entry("plugins.p", Some(&release), 1));
    follower.apply(&entry("prepare.p", Some(prepare), 2));
    // Not caught up yet: a watch starting over is no withdrawal.
    assert!(releases.borrow().is_empty() && prepares.borrow().is_empty());
    follower.caught_up();
    assert_eq!(releases.borrow()["p"].digest.as_deref(), Some("aa"));
    let expected = Prepare {
        digest: "bb".into(),
        pushed_ms: 7,
    };
    assert_eq!(prepares.borrow().get("p"), Some(&expected));
    // The switch, then the request withdrawn.
    follower.apply(&entry("prepare.p", None, 3));
    assert!(prepares.borrow().is_empty());
    assert_eq!(releases.borrow().len(), 1);
    // Keys under neither prefix are not its to follow.
    follower.apply(&entry("ready.p.host-a", Some("{}"), 4));
    assert!(prepares.borrow().is_empty());
    // Each member's canary counts, by plugin then member (whose id may
    // hold a dot); a deleted key goes.
    let tallies = follower.tallies();
    let report = r#"{"digest":"bb","started_ms":7,"serving":{"rows":3,"dead_letters":0,"traps":0,"deadlines":0},"candidate":{"rows":1,"dead_letters":0,"traps":1,"deadlines":0}}"#;
    follower.apply(&entry("canary.p.host.a", Some(report), 5));
    assert_eq!(tallies.borrow()["p"]["host.a"].candidate.traps, 1);
    follower.apply(&entry("canary.p.host.a", None, 6));
    assert!(tallies.borrow().is_empty());
}

#[test]
fn a_digests_version_is_what_the_sandbox_reports() {
    let bytes = b"not really a component";
    assert_eq!(
        version_of_digest(&digest(bytes)),
        crate::sandbox::version_of(bytes)
    );
}

#[test]
fn each_release_remembers_the_ones_before_it_newest_first_and_boundedly() {
    let mut release = pushed("aa", Vec::new());
    for n in 0..HISTORY_KEPT + 5 {
        release = release.followed_by(Some(format!("{n:02x}")), How::Push);
    }
    assert_eq!(release.history.len(), HISTORY_KEPT);
    let last = HISTORY_KEPT + 4;
    assert_eq!(release.digest, Some(format!("{last:02x}")));
    assert_eq!(release.history[0].digest, Some(format!("{:02x}", last - 1)));
    assert_eq!(
        release.previous,
        Some(Previous {
            digest: Some(format!("{:02x}", last - 1))
        })
    );
}

#[test]
fn a_rollback_target_is_a_unique_prefix_of_a_remembered_digest() {
    let step = |d: &str| Step {
        digest: Some(d.to_string()),
        pushed_ms: 0,
        how: None,
    };
    let release = pushed("abc123", vec![step("abd456"), step("ff0011")]);
    assert_eq!(resolve("p", &release, "ff").unwrap(), "ff0011");
    assert_eq!(resolve("p", &release, "abd").unwrap(), "abd456");
    assert!(matches!(
        resolve("p", &release, "ab"),
        Err(StoreError::AmbiguousRelease { .. })
    ));
    assert!(matches!(
        resolve("p", &release, "0123"),
        Err(StoreError::NoSuchRelease { .. })
    ));
    assert!(matches!(
        resolve("p", &release, "xyz"),
        Err(StoreError::NotADigest { .. })
    ));
}
