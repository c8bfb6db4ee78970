//! An in-process KV bucket with the semantics of [`super::NatsKv`] —
//! revisions, last values, compare-and-set, TTL expiry markers, watches —
//! for unit tests of logic built on [`KvWatch`] and [`KvWrite`]. The
//! integration tests run one scenario against both to keep them alike.
//!
//! It keeps every revision (no history limit) and its markers never expire.
//! TTLs run on tokio's clock, so a test with paused time expires keys at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::prefix::{check_key, covers, fold_prefixes};
use super::{
    Entry, KvError, KvWatch, KvWrite, Operation, WATCH_BUFFER, Watch, WatchEvent, WatchStart,
    ttl_seconds,
};

/// The name errors give the in-process bucket.
const BUCKET: &str = "memory";

/// An in-process bucket; clones share it.
#[derive(Clone)]
pub struct MemoryKv {
    shared: Arc<Shared>,
}

struct Shared {
    log: Mutex<Log>,
    /// The last revision, announced to watches after every write.
    latest: watch::Sender<u64>,
}

#[derive(Default)]
struct Log {
    /// Every revision; revision `n` is at index `n - 1`.
    entries: Vec<Entry>,
    /// The last revision of each key.
    last: HashMap<String, u64>,
}

impl Default for MemoryKv {
    fn default() -> MemoryKv {
        MemoryKv::new()
    }
}

impl MemoryKv {
    pub fn new() -> MemoryKv {
        MemoryKv {
            shared: Arc::new(Shared {
                log: Mutex::new(Log::default()),
                latest: watch::channel(0).0,
            }),
        }
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        // Nothing panics while holding the lock; a poisoned log is still whole.
        self.shared
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends one revision if `expect` (the key's last revision, 0 for
    /// none) holds, and arms its TTL.
    fn append(
        &self,
        key: &str,
        value: Bytes,
        operation: Operation,
        expect: Option<u64>,
        ttl: Option<u64>,
    ) -> Result<u64, KvError> {
        check_key(key)?;
        let revision = {
            let mut log = self.log();
            let last = log.last.get(key).copied().unwrap_or(0);
            if let Some(expected) = expect
                && expected != last
            {
                return Err(KvError::WrongRevision {
                    bucket: BUCKET.into(),
                    key: key.to_string(),
                    expected,
                });
            }
            log.push(key, value, operation)
        };
        self.shared.latest.send_replace(revision);
        if let Some(seconds) = ttl {
            let kv = self.clone();
            let key = key.to_string();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(seconds)).await;
                kv.expire(&key, revision);
            });
        }
        Ok(revision)
    }

    /// Writes only if the key has no value: never written, or its last
    /// revision is a delete, purge or expiry marker.
    fn create_maybe_ttl(&self, key: &str, value: Bytes, ttl: Option<u64>) -> Result<u64, KvError> {
        check_key(key)?;
        let already_exists = || KvError::AlreadyExists {
            bucket: BUCKET.into(),
            key: key.to_string(),
        };
        let expect = {
            let log = self.log();
            match log.last.get(key).and_then(|revision| log.entry(*revision)) {
                Some(entry) if entry.operation.is_put() => return Err(already_exists()),
                Some(marker) => marker.revision,
                None => 0,
            }
        };
        self.append(key, value, Operation::Put, Some(expect), ttl)
            .map_err(|err| match err {
                KvError::WrongRevision { .. } => already_exists(),
                other => other,
            })
    }

    /// Leaves an expiry marker if `revision` is still the key's last one
    /// (a later write replaced the value and its TTL).
    fn expire(&self, key: &str, revision: u64) {
        let marker = {
            let mut log = self.log();
            if log.last.get(key) != Some(&revision) {
                return;
            }
            log.push(key, Bytes::new(), Operation::Expired)
        };
        self.shared.latest.send_replace(marker);
    }
}

impl Log {
    fn push(&mut self, key: &str, value: Bytes, operation: Operation) -> u64 {
        let revision = self.entries.len() as u64 + 1;
        self.entries.push(Entry {
            key: key.to_string(),
            value,
            revision,
            operation,
            created: SystemTime::now(),
        });
        self.last.insert(key.to_string(), revision);
        revision
    }

    fn entry(&self, revision: u64) -> Option<&Entry> {
        let index = usize::try_from(revision.checked_sub(1)?).ok()?;
        self.entries.get(index)
    }
}

impl KvWatch for MemoryKv {
    async fn watch_prefixes<P: AsRef<str> + Sync>(
        &self,
        prefixes: &[P],
        start: WatchStart,
    ) -> Result<Watch, KvError> {
        let prefixes = fold_prefixes(prefixes)?;
        if prefixes.is_empty() {
            return Ok(Watch::of_nothing());
        }
        let watched = move |entry: &Entry| prefixes.iter().any(|prefix| covers(prefix, &entry.key));
        let mut latest = self.shared.latest.subscribe();
        // What exists now is decided here, before returning, so that
        // `NewChanges` means "after this call".
        let (backlog, mut seen) = {
            let log = self.log();
            let backlog: Vec<Entry> = match start {
                WatchStart::CurrentValues => {
                    let mut last: Vec<u64> = log.last.values().copied().collect();
                    last.sort_unstable();
                    last.iter()
                        .filter_map(|revision| log.entry(*revision))
                        .filter(|entry| watched(entry))
                        .cloned()
                        .collect()
                }
                WatchStart::NewChanges => Vec::new(),
                WatchStart::AfterRevision(after) => log
                    .entries
                    .iter()
                    .filter(|entry| entry.revision > after && watched(entry))
                    .cloned()
                    .collect(),
            };
            (backlog, log.entries.len() as u64)
        };
        let (events, receiver) = mpsc::channel(WATCH_BUFFER);
        let stop = CancellationToken::new();
        let kv = self.clone();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            for entry in backlog {
                if events.send(Ok(WatchEvent::Update(entry))).await.is_err() {
                    return;
                }
            }
            if events.send(Ok(WatchEvent::CaughtUp)).await.is_err() {
                return;
            }
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    changed = latest.changed() => if changed.is_err() { return },
                }
                let fresh: Vec<Entry> = {
                    let log = kv.log();
                    let fresh = log.entries[seen as usize..]
                        .iter()
                        .filter(|entry| watched(entry))
                        .cloned()
                        .collect();
                    seen = log.entries.len() as u64;
                    fresh
                };
                for entry in fresh {
                    if events.send(Ok(WatchEvent::Update(entry))).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Watch::running(receiver, stop, task))
    }
}

impl KvWrite for MemoryKv {
    async fn entry(&self, key: &str) -> Result<Option<Entry>, KvError> {
        check_key(key)?;
        let log = self.log();
        Ok(log
            .last
            .get(key)
            .and_then(|revision| log.entry(*revision))
            .cloned())
    }

    async fn revisions(&self, key: &str, from: u64) -> Result<Vec<Entry>, KvError> {
        check_key(key)?;
        let log = self.log();
        Ok(log
            .entries
            .iter()
            .skip(usize::try_from(from.saturating_sub(1)).unwrap_or(usize::MAX))
            .filter(|entry| entry.key == key)
            .cloned()
            .collect())
    }

    fn history(&self) -> Option<u64> {
        None
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<u64, KvError> {
        self.append(key, value, Operation::Put, None, None)
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<u64, KvError> {
        self.create_maybe_ttl(key, value, None)
    }

    async fn create_with_ttl(
        &self,
        key: &str,
        value: Bytes,
        ttl: Duration,
    ) -> Result<u64, KvError> {
        let seconds = ttl_seconds(key, ttl)?;
        self.create_maybe_ttl(key, value, Some(seconds))
    }

    async fn update(&self, key: &str, value: Bytes, revision: u64) -> Result<u64, KvError> {
        self.append(key, value, Operation::Put, Some(revision), None)
    }

    async fn delete(&self, key: &str) -> Result<u64, KvError> {
        self.append(key, Bytes::new(), Operation::Delete, None, None)
    }

    async fn delete_at(&self, key: &str, revision: u64) -> Result<u64, KvError> {
        self.append(key, Bytes::new(), Operation::Delete, Some(revision), None)
    }

    async fn put_with_ttl(&self, key: &str, value: Bytes, ttl: Duration) -> Result<u64, KvError> {
        let seconds = ttl_seconds(key, ttl)?;
        self.append(key, value, Operation::Put, None, Some(seconds))
    }

    async fn update_with_ttl(
        &self,
        key: &str,
        value: Bytes,
        revision: u64,
        ttl: Duration,
    ) -> Result<u64, KvError> {
        let seconds = ttl_seconds(key, ttl)?;
        self.append(key, value, Operation::Put, Some(revision), Some(seconds))
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    async fn next(watch: &mut Watch) -> WatchEvent {
        match tokio::time::timeout(Duration::from_secs(5), watch.next()).await {
            Ok(Some(Ok(event))) => event,
            other => panic!("no event: {other:?}"),
        }
    }

    fn update(event: WatchEvent) -> Entry {
        match event {
            WatchEvent::Update(entry) => entry,
            WatchEvent::CaughtUp => panic!("an update was due, not CaughtUp"),
        }
    }

    #[tokio::test]
    async fn last_values_then_caught_up_then_live_changes() {
        let kv = MemoryKv::new();
        kv.put("a.x", "1".into()).await.expect("put");
        kv.put("a.x", "2".into()).await.expect("put");
        kv.put("c.x", "no".into()).await.expect("put");
        kv.delete("a.y").await.expect("delete");
        let mut watch = kv
            .watch_prefixes(&["a."], WatchStart::CurrentValues)
            .await
            .expect("watch");
        let first = update(next(&mut watch).await);
        assert_eq!((first.key.as_str(), &first.value[..]), ("a.x", &b"2"[..]));
        let second = update(next(&mut watch).await);
        assert_eq!(
            (second.key.as_str(), second.operation),
            ("a.y", Operation::Delete)
        );
        assert_eq!(next(&mut watch).await, WatchEvent::CaughtUp);
        kv.put("c.y", "no".into()).await.expect("put");
        let live = kv.put("a.z", "3".into()).await.expect("put");
        assert_eq!(update(next(&mut watch).await).revision, live);
    }

    #[tokio::test(start_paused = true)]
    async fn a_ttl_leaves_an_expiry_marker_unless_rewritten() {
        let kv = MemoryKv::new();
        let mut watch = kv
            .watch_prefixes(&["lease."], WatchStart::NewChanges)
            .await
            .expect("watch");
        assert_eq!(next(&mut watch).await, WatchEvent::CaughtUp);
        let put = kv
            .put_with_ttl("lease.a", "me".into(), Duration::from_secs(2))
            .await
            .expect("put");
        assert_eq!(update(next(&mut watch).await).revision, put);
        let expired = update(next(&mut watch).await);
        assert_eq!(
            (expired.key.as_str(), expired.operation),
            ("lease.a", Operation::Expired)
        );
        // A key renewed before its TTL keeps its value.
        let first = kv
            .put_with_ttl("lease.b", "me".into(), Duration::from_secs(2))
            .await
            .expect("put");
        let renewed = kv
            .update_with_ttl("lease.b", "me".into(), first, Duration::from_secs(60))
            .await
            .expect("renew");
        tokio::time::sleep(Duration::from_secs(5)).await;
        let current = kv.entry("lease.b").await.expect("entry").expect("present");
        assert_eq!(
            (current.revision, current.operation),
            (renewed, Operation::Put)
        );
    }

    #[tokio::test]
    async fn compare_and_set_fails_with_the_typed_kinds() {
        let kv = MemoryKv::new();
        let first = kv.create("k", "1".into()).await.expect("create");
        assert!(matches!(
            kv.create("k", "again".into()).await,
            Err(KvError::AlreadyExists { .. })
        ));
        let second = kv.update("k", "2".into(), first).await.expect("update");
        assert!(matches!(
            kv.update("k", "stale".into(), first).await,
            Err(KvError::WrongRevision { expected, .. }) if expected == first
        ));
        assert!(matches!(
            kv.delete_at("k", first).await,
            Err(KvError::WrongRevision { .. })
        ));
        kv.delete_at("k", second).await.expect("delete");
        kv.create("k", "back".into())
            .await
            .expect("create after delete");
    }
}
