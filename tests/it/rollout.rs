//! One plugin version per fleet: a pushed release is what every host
//! serves with, also a host restarted after the push (with an empty or a
//! warm compiled cache), and a push under load switches each table from
//! the old version to the new once, never back.
//!
//! The versions tell themselves apart in the rows: the configured
//! `validate` (the validator) masks `email` as `***`, the pushed
//! pass-through leaves it as sent.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use weir_test_artifacts::PASSTHROUGH;

use crate::support::{
    Host, Nats, PRODUCERS, TABLES, all_tables, balanced, every_table_grows, fleet_config, operator,
    produce, sizes,
};

const MEMBER_TTL_SECS: u64 = 5;

/// A fleet host as member `id`.
fn spawn(nats_url: &str, id: &'static str) -> Host {
    Host::spawn_with(id, fleet_config(nats_url, id, 0, MEMBER_TTL_SECS))
}

/// Whether a sink line was written by the validator (email masked).
fn masked(line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line)
        .ok()
        .is_some_and(|row| row["email"] == "***")
}

/// The byte length of each table's output of each host: where "after" starts.
fn marks(hosts: &[&Host]) -> BTreeMap<(&'static str, String), u64> {
    let mut marks = BTreeMap::new();
    for host in hosts {
        for table in all_tables() {
            let size = std::fs::metadata(host.output(&table)).map_or(0, |m| m.len());
            marks.insert((host.id, table), size);
        }
    }
    marks
}

/// Complete lines written after `marks` by each of `hosts`: (old, new)
/// version counts.
fn versions_since(hosts: &[&Host], marks: &BTreeMap<(&'static str, String), u64>) -> (u64, u64) {
    let (mut old, mut new) = (0, 0);
    for host in hosts {
        for table in all_tables() {
            let text = std::fs::read(host.output(&table)).unwrap_or_default();
            let from = marks.get(&(host.id, table.clone())).copied().unwrap_or(0) as usize;
            let text = String::from_utf8_lossy(text.get(from..).unwrap_or_default());
            for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
                if masked(line) { old += 1 } else { new += 1 }
            }
        }
    }
    (old, new)
}

/// `weir plugin push validate FILE --wait 60` through `host`'s config.
fn push(host: &Host, file: &str) -> String {
    let config = host.dir.path().join("weir.toml");
    let output = operator(
        &config,
        ["plugin", "push"],
        &["validate", file, "--wait", "60"],
    );
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "push: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Stops `host` (SIGTERM: it hands its units over, so it takes them back
/// from `released` records at once when it starts), points its compiled cache at `cache`, and
/// starts it again on the same data dir.
fn restart_with_cache(host: &mut Host, cache: &Path) {
    host.terminate();
    host.child.wait().unwrap();
    let path = host.dir.path().join("weir.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    let line = config
        .lines()
        .find(|line| line.starts_with("compile_cache_dir = "))
        .unwrap()
        .to_string();
    let config = config.replace(
        &line,
        &format!("compile_cache_dir = \"{}\"", cache.display()),
    );
    std::fs::write(&path, config).unwrap();
    let (child, url) = Host::run(host.dir.path());
    host.child = child;
    host.url = url;
}

/// After a push is acknowledged, a host restarted with an empty compiled
/// cache, then with a warm one, delivers nothing with the version it has
/// in its own config: it loads the fleet's release before it claims a unit.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_restarted_after_a_push_never_serves_the_old_version() {
    let nats = Nats::start();
    let a = spawn(nats.url(), "host-a");
    let mut b = spawn(nats.url(), "host-b");
    balanced(&a, &["host-a", "host-b"]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| tokio::spawn(produce(a.url.clone(), p, stop.clone())))
        .collect();
    let tables = all_tables();
    let dirs = |a: &Host, b: &Host| [a.dir.path().to_path_buf(), b.dir.path().to_path_buf()];
    let grows = |what: &'static str, before: Vec<u64>, a: &Host, b: &Host| {
        let dirs = dirs(a, b);
        let tables = tables.clone();
        async move {
            let dirs: Vec<&Path> = dirs.iter().map(|d| d.as_path()).collect();
            every_table_grows(&dirs, &tables, &before, what).await;
        }
    };
    grows("rows on every unit", vec![0; TABLES], &a, &b).await;

    let pushed = Instant::now();
    let said = push(&a, PASSTHROUGH);
    println!("push --wait: {:?}\n{said}", pushed.elapsed());
    // Batches that started before the switch finish on the old version:
    // the mark is taken once every table has had a row since.
    let now = |a: &Host, b: &Host| {
        let dirs = dirs(a, b);
        let dirs: Vec<&Path> = dirs.iter().map(|d| d.as_path()).collect();
        sizes(&dirs, &tables)
    };
    grows("rows after the push", now(&a, &b), &a, &b).await;
    grows("more rows after the push", now(&a, &b), &a, &b).await;
    let mark = marks(&[&a, &b]);

    // One cache dir for both restarts: empty at the first, filled by it
    // for the second.
    let cache = tempfile::tempdir().unwrap();
    for what in ["empty", "warm"] {
        let restarted = Instant::now();
        restart_with_cache(&mut b, cache.path());
        balanced(&a, &["host-a", "host-b"]).await;
        grows("rows after the restart", now(&a, &b), &a, &b).await;
        println!(
            "host-b restarted with an {what} compiled cache: serving again in {:?}",
            restarted.elapsed()
        );
    }

    stop.store(true, Ordering::Relaxed);
    for producer in producers {
        producer.await.unwrap();
    }
    let (old, new) = versions_since(&[&a, &b], &mark);
    println!("after the push: {old} rows with the old version, {new} with the new");
    assert!(new > 0, "rows flowed after the push");
    assert_eq!(
        old,
        0,
        "rows delivered with the old version after the push\n{}",
        b.log()
    );
}
