//! Who notices that a member died: each host follows the member keys of
//! the next [`WATCHED_SUCCESSORS`] members of the roster only (by name,
//! wrapping round), and once one of those keys has expired it deletes that
//! member's roster entry, which every host's watch then brings. A renewal
//! reaches two hosts, not the whole fleet: the fleet's watch traffic for
//! renewals is O(members), not O(members²).
//!
//! A roster entry is deleted only after the member's key expired (or the
//! key is gone altogether), and only at the roster revision written before
//! that expiry: the member's lease ran out a margin before its key did, so
//! it has stepped down already; a member that renewed again (a new term)
//! writes its roster entry anew and rejoins. An expiry the watch brings
//! late (followed by a renewal already) still removes an older entry: that
//! entry's term ended, and the member counts itself again only once its
//! entry of the new term is in.

use std::collections::{BTreeMap, BTreeSet};

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{MEMBERS, RETRY_PAUSE, roster_key};
use crate::nats::kv::{KvError, KvWatch, KvWrite, Watch, WatchEvent, WatchStart};

/// How many members after it in the roster each host follows: a member's
/// death goes unnoticed only if both hosts before it die too.
pub(super) const WATCHED_SUCCESSORS: usize = 2;

/// The roster as this host's coordination watch has it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Roster {
    /// The watch has caught up: before that, nobody is judged.
    pub ready: bool,
    /// Each member's roster entry, by its revision.
    pub members: BTreeMap<String, u64>,
}

/// The members `me` follows: the next `count` names after `me` among the
/// roster and `me`, wrapping round (never `me`).
pub(super) fn successors<'a>(
    members: impl IntoIterator<Item = &'a str>,
    me: &str,
    count: usize,
) -> Vec<String> {
    let ring: BTreeSet<&str> = members.into_iter().filter(|m| *m != me).collect();
    let (before, after): (Vec<&str>, Vec<&str>) = ring.into_iter().partition(|m| *m < me);
    after
        .into_iter()
        .chain(before)
        .take(count)
        .map(|m| m.to_string())
        .collect()
}

/// What a member key's last entry says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LeaseKey {
    /// No message at all: never written, or its marker aged out long ago.
    Absent,
    /// Renewed: the member is alive.
    Renewed,
    /// Expired (or deleted) at this revision.
    Gone(u64),
}

/// Whether the roster entry written at `roster_revision` is a dead
/// member's: its key is gone and the entry is older than the key's end (a
/// member writes its key before its roster entry, so a newer entry means a
/// member renewing again).
pub(super) fn dead(key: LeaseKey, roster_revision: u64) -> bool {
    match key {
        LeaseKey::Absent => true,
        LeaseKey::Renewed => false,
        LeaseKey::Gone(end) => roster_revision < end,
    }
}

/// The member keys followed now, and what each said last.
struct Following {
    members: Vec<String>,
    watch: Watch,
    keys: BTreeMap<String, LeaseKey>,
    caught_up: bool,
}

/// Follows the member keys of this host's successors in the roster (as
/// `roster` publishes it) and deletes the roster entry of each whose key
/// expired, until `stop`.
pub(super) async fn follow_successors<K>(
    kv: K,
    me: String,
    mut roster: watch::Receiver<Roster>,
    stop: CancellationToken,
) where
    K: KvWatch + KvWrite + Send + Sync + 'static,
{
    let mut following: Option<Following> = None;
    // Roster entries deleted (or found rewritten): not tried again.
    let mut done: BTreeSet<(String, u64)> = BTreeSet::new();
    let mut retry_at: Option<Instant> = None;
    loop {
        let now = roster.borrow_and_update().clone();
        let wanted = now.ready.then(|| {
            successors(
                now.members.keys().map(String::as_str),
                &me,
                WATCHED_SUCCESSORS,
            )
        });
        if following.as_ref().map(|f| &f.members) != wanted.as_ref() {
            if let Some(old) = following.take() {
                old.watch.close().await;
            }
            if let Some(members) = wanted.filter(|m| !m.is_empty()) {
                let keys: Vec<String> = members.iter().map(|m| format!("{MEMBERS}{m}")).collect();
                match kv.watch_prefixes(&keys, WatchStart::CurrentValues).await {
                    Ok(watch) => {
                        tracing::debug!(?members, "following the member keys of the next members");
                        following = Some(Following {
                            members,
                            watch,
                            keys: BTreeMap::new(),
                            caught_up: false,
                        });
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot follow the next members' keys");
                        retry_at = Some(Instant::now() + RETRY_PAUSE);
                    }
                }
            }
        }
        done.retain(|(member, revision)| now.members.get(member) == Some(revision));
        if let Some(f) = following.as_ref().filter(|f| f.caught_up) {
            for member in &f.members {
                let Some(&revision) = now.members.get(member) else {
                    continue;
                };
                let key = f.keys.get(member).copied().unwrap_or(LeaseKey::Absent);
                if !dead(key, revision) || done.contains(&(member.clone(), revision)) {
                    continue;
                }
                match kv.delete_at(&roster_key(member), revision).await {
                    Ok(_) => {
                        tracing::info!(%member, ?key, "removed a member whose key expired from the roster");
                        done.insert((member.clone(), revision));
                    }
                    // Rewritten since (it renewed again), or removed by
                    // another host: the watch brings what it is now.
                    Err(KvError::WrongRevision { .. }) => {
                        done.insert((member.clone(), revision));
                    }
                    Err(err) => {
                        tracing::warn!(%member, error = %err, "cannot remove a dead member from the roster yet");
                        retry_at = Some(Instant::now() + RETRY_PAUSE);
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            changed = roster.changed() => if changed.is_err() { break },
            _ = sleep_until(retry_at) => retry_at = None,
            event = next_event(&mut following) => match event {
                Some(Ok(WatchEvent::Update(entry))) => {
                    if let (Some(f), Some(member)) = (following.as_mut(), entry.key.strip_prefix(MEMBERS)) {
                        let key = match entry.operation.is_put() {
                            true => LeaseKey::Renewed,
                            false => LeaseKey::Gone(entry.revision),
                        };
                        f.keys.insert(member.to_string(), key);
                    }
                }
                Some(Ok(WatchEvent::CaughtUp)) => {
                    if let Some(f) = following.as_mut() {
                        f.caught_up = true;
                    }
                }
                Some(Err(err)) => {
                    tracing::warn!(error = %err, "following the next members' keys failed; following them again");
                    following = None;
                    retry_at = Some(Instant::now() + RETRY_PAUSE);
                }
                None => {
                    following = None;
                    retry_at = Some(Instant::now() + RETRY_PAUSE);
                }
            },
        }
    }
    if let Some(f) = following {
        f.watch.close().await;
    }
}

async fn next_event(
    following: &mut Option<Following>,
) -> Option<Result<WatchEvent, crate::nats::kv::KvError>> {
    use futures::StreamExt;
    match following {
        Some(f) => f.watch.next().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;
    use crate::nats::kv::MemoryKv;

    #[test]
    fn each_member_follows_the_next_ones_wrapping_round() {
        let ring = ["a", "b", "c", "d"];
        assert_eq!(successors(ring, "b", 2), ["c", "d"]);
        assert_eq!(successors(ring, "d", 2), ["a", "b"]);
        // Not in the roster yet: its place all the same.
        assert_eq!(successors(["a", "c"], "b", 2), ["c", "a"]);
        assert_eq!(successors(["a", "b"], "a", 2), ["b"]);
        assert!(successors(["a"], "a", 2).is_empty());
        // Every member is followed by exactly two others.
        let names: Vec<String> = (0..50).map(|i| format!("m{i:02}")).collect();
        let mut followers: BTreeMap<String, usize> = BTreeMap::new();
        for me in &names {
            for s in successors(names.iter().map(String::as_str), me, 2) {
                *followers.entry(s).or_default() += 1;
            }
        }
        assert!(followers.values().all(|&n| n == 2) && followers.len() == names.len());
    }

    #[test]
    fn only_an_entry_older_than_the_keys_end_is_a_dead_members() {
        assert!(dead(LeaseKey::Absent, 10));
        assert!(!dead(LeaseKey::Renewed, 10));
        assert!(dead(LeaseKey::Gone(11), 10));
        // Written after the expiry: the member renewed again and rejoined.
        assert!(!dead(LeaseKey::Gone(9), 10));
    }

    async fn roster_of(kv: &MemoryKv, members: &[&str]) -> Roster {
        let mut roster = Roster {
            ready: true,
            ..Roster::default()
        };
        for member in members {
            kv.put(&format!("{MEMBERS}{member}"), Bytes::from_static(b"{}"))
                .await
                .unwrap();
            let revision = kv
                .put(&roster_key(member), Bytes::from_static(b"{}"))
                .await
                .unwrap();
            roster.members.insert(member.to_string(), revision);
        }
        roster
    }

    async fn roster_entry_gone(kv: &MemoryKv, member: &str) -> bool {
        let entry = kv.entry(&roster_key(member)).await.unwrap();
        entry.is_some_and(|e| !e.operation.is_put())
    }

    /// Waits (5 s at most) until `member`'s roster entry is removed.
    async fn wait_until_gone(kv: &MemoryKv, member: &str, what: &str) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while !roster_entry_gone(kv, member).await {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect(what);
    }

    #[tokio::test]
    async fn a_followed_member_whose_key_ends_leaves_the_roster_and_no_other_does() {
        let kv = MemoryKv::new();
        let roster = roster_of(&kv, &["a", "b", "c", "d"]).await;
        let (publish, receiver) = watch::channel(roster.clone());
        let stop = CancellationToken::new();
        let task = tokio::spawn(follow_successors(
            kv.clone(),
            "a".into(),
            receiver,
            stop.clone(),
        ));
        // `d` is not a's to judge; `b` is.
        kv.delete(&format!("{MEMBERS}d")).await.unwrap();
        kv.delete(&format!("{MEMBERS}b")).await.unwrap();
        wait_until_gone(&kv, "b", "b's roster entry removed").await;
        assert!(!roster_entry_gone(&kv, "d").await);
        assert!(!roster_entry_gone(&kv, "c").await);

        // b gone from the roster: a now follows c and d, and d's key ended.
        let mut next = roster.clone();
        next.members.remove("b");
        publish.send_replace(next);
        wait_until_gone(&kv, "d", "d's roster entry removed once a follows it").await;
        assert!(!roster_entry_gone(&kv, "c").await);
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_member_that_rejoined_after_its_key_ended_is_left_alone() {
        let kv = MemoryKv::new();
        let mut roster = roster_of(&kv, &["a", "b", "c"]).await;
        // b's key ended, then b renewed and wrote its roster entry again.
        kv.delete(&format!("{MEMBERS}b")).await.unwrap();
        kv.put(&format!("{MEMBERS}b"), Bytes::from_static(b"{}"))
            .await
            .unwrap();
        kv.delete(&format!("{MEMBERS}b")).await.unwrap();
        let rewritten = kv
            .put(&roster_key("b"), Bytes::from_static(b"{}"))
            .await
            .unwrap();
        roster.members.insert("b".into(), rewritten);
        // c's key ended and c never came back.
        kv.delete(&format!("{MEMBERS}c")).await.unwrap();
        let (_publish, receiver) = watch::channel(roster);
        let stop = CancellationToken::new();
        let task = tokio::spawn(follow_successors(
            kv.clone(),
            "a".into(),
            receiver,
            stop.clone(),
        ));
        wait_until_gone(&kv, "c", "c's roster entry removed").await;
        // Both judged in the same pass: b's newer entry stays.
        assert!(!roster_entry_gone(&kv, "b").await);
        stop.cancel();
        task.await.unwrap();
    }
}
