//! Scopes in the state bucket: `<tenant>.<plugin>.<table>.<partition>.<shard>`
//! (each name encoded to KV's alphabet, tenant first so a tenant's state is
//! one prefix), read once by a unit's owner and written by compare-and-set,
//! so a host that lost the unit cannot overwrite its new owner's state.
//!
//! The unit is in the key because a scope must have one writer and one
//! sequence space: a table lives in one unit under the default route, but
//! a router may spread it over several by key (each key's rows stay in one).
//!
//! A write stores the batch's changes, not the whole scope, so its cost
//! follows the keys the batch changed. The bucket keeps each key's last
//! `history` revisions (64): a read takes the last value and, if it is
//! changes, the chain back to the whole value (or deletion) it builds on.
//! Every `history - 1` changes, or once they weigh `CHAIN_WEIGHT` wholes, the whole
//! is written again (compaction), so the chain always fits the history. A
//! bucket kept at history 1 (made before the change) gets the whole scope
//! every write, as before; a whole value of that time is a chain's start.

use std::sync::Arc;

use bytes::Bytes;

use crate::nats::kv::{KvError, KvWrite, MemoryKv, NatsKv};
use crate::state::scope::{Changes, Scope, StateError, Value};
use crate::topology::route::Unit;

/// Why a scope could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Someone else wrote the scope since it was read: the unit has
    /// another owner. Nothing of the batch may be acked.
    #[error("the state of `{key}` was written by another host")]
    Fenced { key: String },
    /// The scope was removed (`weir state purge`) since it was read.
    #[error("the state of `{key}` was purged; its rows run again on empty state")]
    Purged { key: String },
    #[error("the state of `{key}` is unreadable: {source}")]
    Corrupt { key: String, source: StateError },
    /// The task sending the write ended without its answer.
    #[error("the write of `{key}` ended without an answer: {reason}")]
    Unanswered { key: String, reason: String },
    #[error(transparent)]
    Kv(#[from] KvError),
}

/// Changes written after a whole value at most: bounds a read's chain
/// (and fits the state bucket's history of 64 with its start).
pub const MAX_CHAIN: u64 = 63;

/// A chain of changes outweighing this many whole scopes is compacted: a
/// read costs at most that many more, a write carries the whole at most
/// once per this many scopes' worth of changes.
pub const CHAIN_WEIGHT: usize = 8;

/// A scope as read, with the revision a write must still find.
#[derive(Debug, Clone, Default)]
pub struct Stored {
    /// Shared with a batch's overlays while it runs; changed in place
    /// by the write after it.
    pub scope: Arc<Scope>,
    /// `None`: the bucket never held the key.
    pub revision: Option<u64>,
    /// Where the chain of changes starts: the whole value's revision, a
    /// deletion's, or 0 (the key held nothing).
    base: u64,
    /// Changes written since `base`, and their bytes.
    chain: u64,
    chain_bytes: usize,
}

impl Stored {
    fn whole(scope: Scope, revision: u64) -> Stored {
        Stored {
            scope: Arc::new(scope),
            revision: Some(revision),
            base: revision,
            chain: 0,
            chain_bytes: 0,
        }
    }
}

/// The bucket key of one plugin's state of one tenant's table in `unit`.
pub fn scope_key(tenant: &str, plugin: &str, table: &str, unit: Unit) -> String {
    format!(
        "{}.{}.{}.{}.{}",
        kv_token(tenant),
        kv_token(plugin),
        kv_token(table),
        unit.partition,
        unit.shard
    )
}

/// The state bucket as one unit's worker uses it.
#[derive(Clone)]
pub struct UnitState {
    pub store: ScopeStore,
    pub unit: Unit,
    pub metrics: crate::telemetry::Metrics,
}

/// The prefix of every key of `tenant`, for `weir state purge`.
pub fn tenant_prefix(tenant: &str) -> String {
    format!("{}.", kv_token(tenant))
}

/// Any name as one KV key token, reversibly: letters, digits, `_` and `-`
/// stay, every other byte becomes `=XX` (`=` is in KV's alphabet, `~` of
/// subject tokens is not).
fn kv_token(name: &str) -> String {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
    let mut token = String::with_capacity(name.len());
    for byte in name.bytes() {
        if plain(byte) {
            token.push(byte as char);
        } else {
            token.push_str(&format!("={byte:02X}"));
        }
    }
    if token.is_empty() {
        // An empty name still needs a token; `=` alone is no escape.
        token.push('=');
    }
    token
}

/// Reads and writes scopes in a KV bucket.
#[derive(Clone)]
pub struct StateStore<K> {
    kv: K,
}

impl<K: KvWrite + Sync> StateStore<K> {
    pub fn new(kv: K) -> StateStore<K> {
        StateStore { kv }
    }

    pub async fn load(&self, key: &str) -> Result<Stored, StoreError> {
        let corrupt = |source| StoreError::Corrupt {
            key: key.to_string(),
            source,
        };
        let last = match self.kv.entry(key).await? {
            Some(entry) if entry.operation.is_put() => entry,
            // Purged: empty, but a write must still find the purge marker.
            Some(marker) => return Ok(Stored::whole(Scope::default(), marker.revision)),
            None => return Ok(Stored::default()),
        };
        let base = match Value::decode(&last.value).map_err(corrupt)? {
            Value::Whole(scope) => return Ok(Stored::whole(scope, last.revision)),
            Value::Changes { base, .. } => base,
        };
        // Changes: replay the chain from its base up to the value read.
        let mut stored = Stored {
            base,
            ..Stored::default()
        };
        let mut scope = Scope::default();
        for entry in self.kv.revisions(key, base).await? {
            if entry.revision > last.revision {
                break;
            }
            if entry.revision == base && base > 0 {
                if entry.operation.is_put() {
                    match Value::decode(&entry.value).map_err(corrupt)? {
                        Value::Whole(whole) => scope = whole,
                        Value::Changes { .. } => {
                            return Err(corrupt(StateError::Corrupt(
                                "a chain of changes built on changes",
                            )));
                        }
                    }
                }
                stored.revision = Some(base);
                continue;
            }
            if base > 0 && stored.revision.is_none() {
                return Err(corrupt(StateError::BaseGone { base }));
            }
            match Value::decode(&entry.value).map_err(corrupt)? {
                Value::Changes {
                    base: built_on,
                    changes,
                } if built_on == base && entry.operation.is_put() => scope.apply(changes),
                _ => {
                    return Err(corrupt(StateError::Corrupt(
                        "a chain of changes broken by another value",
                    )));
                }
            }
            stored.revision = Some(entry.revision);
            stored.chain += 1;
            stored.chain_bytes += entry.value.len();
        }
        if stored.revision != Some(last.revision) {
            return Err(corrupt(StateError::BaseGone { base }));
        }
        stored.scope = Arc::new(scope);
        Ok(stored)
    }

    /// Writes `changes` over what `read` was, if nobody wrote in between
    /// (as changes, or as the whole scope when the chain is long enough);
    /// returns what a later write must find. (The stateful step prepares
    /// and sends apart, so that a write travels while the next batch runs.)
    #[cfg(test)]
    pub async fn commit(
        &self,
        key: &str,
        read: Stored,
        changes: Changes,
    ) -> Result<Stored, StoreError> {
        let mut next = read;
        let write = self.prepare(&mut next, changes);
        let revision = self.send(key, &write).await?;
        next.landed(&write, revision);
        Ok(next)
    }

    /// Applies `changes` to `stored` (in place: the scope is not copied
    /// when nothing else holds it) and says what to write for them: the
    /// changes over the chain's base, or the whole scope when the chain is
    /// long enough. `stored` is what a later write must find only once
    /// the write landed ([`Stored::landed`]); if it fails, `stored` is
    /// ahead of the bucket and must be read again.
    pub fn prepare(&self, stored: &mut Stored, changes: Changes) -> Write {
        let chain_limit = self
            .kv
            .history()
            .unwrap_or(u64::MAX)
            .saturating_sub(1)
            .min(MAX_CHAIN);
        let delta = (stored.chain < chain_limit).then(|| changes.encode(stored.base));
        Arc::make_mut(&mut stored.scope).apply(changes);
        // A longer chain makes a read (once per scope per runner) cost
        // more; a shorter one makes writes carry the whole more often. One
        // batch's changes larger than the whole (a scope emptied and
        // refilled) go as the whole: it is what `max_bytes` keeps within
        // the server's `max_payload`.
        let whole = stored.scope.bytes() + 64;
        let (value, chained) = match delta {
            Some(delta)
                if delta.len() <= whole
                    && stored.chain_bytes + delta.len() <= CHAIN_WEIGHT * whole =>
            {
                (delta, true)
            }
            _ => (stored.scope.encode(), false),
        };
        Write {
            value: Bytes::from(value),
            after: stored.revision,
            chained,
        }
    }

    /// Stores a prepared write by compare-and-set on the revision it was
    /// prepared over; the revision it got.
    pub async fn send(&self, key: &str, write: &Write) -> Result<u64, StoreError> {
        let written = match write.after {
            Some(revision) => self.kv.update(key, write.value.clone(), revision).await,
            None => self.kv.create(key, write.value.clone()).await,
        };
        match written {
            Ok(revision) => Ok(revision),
            Err(KvError::WrongRevision { .. } | KvError::AlreadyExists { .. }) => {
                let key = key.to_string();
                // A write since is another owner's; a removal is a purge.
                match self.kv.entry(&key).await? {
                    Some(entry) if entry.operation.is_put() => Err(StoreError::Fenced { key }),
                    _ => Err(StoreError::Purged { key }),
                }
            }
            Err(err) => Err(err.into()),
        }
    }
}

/// One scope's write, prepared from a batch's changes ([`StateStore::prepare`]).
#[derive(Debug, Clone)]
pub struct Write {
    value: Bytes,
    /// The revision it must find: `None`, the key must not exist.
    after: Option<u64>,
    /// Changes over the chain, or the whole scope (a new chain's start).
    chained: bool,
}

impl Stored {
    /// `write`, prepared from this scope, landed as `revision`.
    pub fn landed(&mut self, write: &Write, revision: u64) {
        self.revision = Some(revision);
        if write.chained {
            self.chain += 1;
            self.chain_bytes += write.value.len();
        } else {
            (self.base, self.chain, self.chain_bytes) = (revision, 0, 0);
        }
    }
}

/// The store behind a stateful step: the state bucket, or memory for
/// `weir plugin test` (the same reads and compare-and-set writes).
#[derive(Clone)]
pub enum ScopeStore {
    /// Boxed: a bucket handle is large, memory's a pointer.
    Nats(Box<StateStore<NatsKv>>),
    Memory(StateStore<MemoryKv>),
}

impl ScopeStore {
    /// An empty store of this process alone.
    pub fn in_memory() -> ScopeStore {
        ScopeStore::Memory(StateStore::new(MemoryKv::new()))
    }

    pub async fn load(&self, key: &str) -> Result<Stored, StoreError> {
        match self {
            ScopeStore::Nats(store) => store.load(key).await,
            ScopeStore::Memory(store) => store.load(key).await,
        }
    }

    /// See [`StateStore::prepare`].
    pub fn prepare(&self, stored: &mut Stored, changes: Changes) -> Write {
        match self {
            ScopeStore::Nats(store) => store.prepare(stored, changes),
            ScopeStore::Memory(store) => store.prepare(stored, changes),
        }
    }

    /// See [`StateStore::send`].
    pub async fn send(&self, key: &str, write: &Write) -> Result<u64, StoreError> {
        match self {
            ScopeStore::Nats(store) => store.send(key, write).await,
            ScopeStore::Memory(store) => store.send(key, write).await,
        }
    }
}

impl From<StateStore<NatsKv>> for ScopeStore {
    fn from(store: StateStore<NatsKv>) -> ScopeStore {
        ScopeStore::Nats(Box::new(store))
    }
}

impl StateStore<NatsKv> {
    /// Deletes every scope of `tenant` (`weir state purge`); the keys that
    /// held state. A host running one of them finds it purged at its next
    /// write and runs those rows again on empty state.
    pub async fn purge_tenant(&self, tenant: &str) -> Result<Vec<String>, StoreError> {
        let mut purged = Vec::new();
        for key in self.kv.keys_under(&tenant_prefix(tenant)).await? {
            if self
                .kv
                .entry(&key)
                .await?
                .is_some_and(|e| e.operation.is_put())
            {
                self.kv.delete(&key).await?;
                purged.push(key);
            }
        }
        Ok(purged)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::nats::kv::MemoryKv;
    use crate::state::scope::{Limits, Overlay, Value};

    const LIMITS: Limits = Limits {
        max_keys: 10,
        max_bytes: 1000,
    };

    #[test]
    fn keys_put_the_tenant_first_and_encode_what_kv_does_not_take() {
        let unit = Unit {
            partition: 2,
            shard: 0,
        };
        assert_eq!(
            scope_key("acme", "window", "orders", unit),
            "acme.window.orders.2.0"
        );
        assert_eq!(scope_key("a.b", "w", "t~1", unit), "a=2Eb.w.t=7E1.2.0");
        assert_eq!(scope_key("", "w", "t", unit), "=.w.t.2.0");
        assert!(scope_key("acme", "w", "t", unit).starts_with(&tenant_prefix("acme")));
        assert!(!scope_key("acme2", "w", "t", unit).starts_with(&tenant_prefix("acme")));
    }

    #[tokio::test]
    async fn a_write_lands_once_and_a_host_that_read_before_it_is_fenced() {
        let store = StateStore::new(MemoryKv::new());
        let key = scope_key(
            "acme",
            "window",
            "orders",
            Unit {
                partition: 0,
                shard: 0,
            },
        );
        let first = store.load(&key).await.unwrap();
        assert_eq!(first.revision, None);

        let mut overlay = Overlay::new(first.scope.clone(), LIMITS);
        overlay.set(b"count", b"1").unwrap();
        let owner = store
            .commit(&key, first.clone(), overlay.commit([1], [], 0))
            .await
            .unwrap();

        // A host that read the scope before that write lost the unit.
        let mut stale = Overlay::new(first.scope.clone(), LIMITS);
        stale.set(b"count", b"99").unwrap();
        let refused = store
            .commit(&key, first.clone(), stale.commit([1], [], 0))
            .await;
        assert!(
            matches!(refused, Err(StoreError::Fenced { .. })),
            "{refused:?}"
        );

        let mut next = Overlay::new(owner.scope.clone(), LIMITS);
        next.set(b"count", b"2").unwrap();
        let changes = next.commit([2], [], 1);
        store.commit(&key, owner, changes).await.unwrap();
        let read = store.load(&key).await.unwrap();
        assert_eq!(read.scope.get(b"count"), Some(&b"2"[..]));
        assert!(read.scope.applied(2) && !read.scope.applied(1));

        // Removed since it was read: purged, not fenced; the next write
        // starts from the removal.
        store.kv.delete(&key).await.unwrap();
        let mut after = Overlay::new(read.scope.clone(), LIMITS);
        after.set(b"count", b"3").unwrap();
        let changes = after.commit([3], [], 2);
        let refused = store.commit(&key, read, changes).await;
        assert!(
            matches!(refused, Err(StoreError::Purged { .. })),
            "{refused:?}"
        );
        let empty = store.load(&key).await.unwrap();
        assert_eq!(empty.scope.keys(), 0);
        let mut again = Overlay::new(empty.scope.clone(), LIMITS);
        again.set(b"count", b"1").unwrap();
        let changes = again.commit([3], [], 2);
        store.commit(&key, empty, changes).await.unwrap();
        let read = store.load(&key).await.unwrap();
        assert_eq!(read.scope.get(b"count"), Some(&b"1"[..]));
    }

    /// Writes store changes; a read replays them from the last whole
    /// value, and the whole is written again before the chain outgrows
    /// the bucket's history or outweighs `CHAIN_WEIGHT` wholes. A whole value written
    /// before changes existed (format 1) starts a chain as it is.
    #[tokio::test]
    async fn changes_chain_from_the_last_whole_value_and_are_compacted() {
        const WIDE: Limits = Limits {
            max_keys: 10_000,
            max_bytes: 1 << 20,
        };
        let store = StateStore::new(MemoryKv::new());
        let key = "acme.window.orders.0.0";
        // As a host before the change left it: one whole value.
        let mut old = Scope::default();
        old.apply({
            let mut overlay = Overlay::new(Arc::new(Scope::default()), WIDE);
            for i in 0..1000 {
                overlay.set(format!("k{i}").as_bytes(), b"0").unwrap();
            }
            overlay.commit([], [], 0)
        });
        store.kv.create(key, old.encode().into()).await.unwrap();

        let mut read = store.load(key).await.unwrap();
        let mut sizes = Vec::new();
        for batch in 1..=(MAX_CHAIN + 5) {
            let mut overlay = Overlay::new(read.scope.clone(), WIDE);
            overlay
                .set(format!("k{batch}").as_bytes(), batch.to_string().as_bytes())
                .unwrap();
            overlay.delete(format!("k{}", 500 + batch));
            let changes = overlay.commit([batch], [], batch.saturating_sub(2));
            read = store.commit(key, read, changes).await.unwrap();
            let last = store.kv.entry(key).await.unwrap().unwrap();
            sizes.push(last.value.len());
            // What a new owner reads is what this one holds.
            let fresh = store.load(key).await.unwrap();
            assert_eq!(*fresh.scope, *read.scope, "after batch {batch}");
            assert!(fresh.chain <= MAX_CHAIN);
        }
        let whole = read.scope.encode().len();
        let small = sizes.iter().filter(|&&size| size < whole / 10).count();
        assert!(small >= MAX_CHAIN as usize, "{sizes:?}");
        assert!(
            sizes.iter().any(|&size| size >= whole / 2),
            "compacted once: {sizes:?}"
        );
        assert_eq!(read.scope.keys(), 1000 - (MAX_CHAIN as usize + 5));
        assert!(read.scope.applied(MAX_CHAIN + 5) && !read.scope.applied(1));

        // A bucket that keeps one revision per key gets the whole each time.
        let nats_like = StateStore::new(KeepOne(MemoryKv::new()));
        let mut read = nats_like.load(key).await.unwrap();
        for batch in 1..=3 {
            let mut overlay = Overlay::new(read.scope.clone(), WIDE);
            overlay.set(b"count", batch.to_string().as_bytes()).unwrap();
            read = nats_like
                .commit(key, read, overlay.commit([batch], [], 0))
                .await
                .unwrap();
            let last = nats_like.kv.0.entry(key).await.unwrap().unwrap();
            assert!(matches!(Value::decode(&last.value), Ok(Value::Whole(_))));
        }
    }

    /// A bucket of history 1, as made before changes existed.
    struct KeepOne(MemoryKv);

    impl KvWrite for KeepOne {
        async fn entry(&self, key: &str) -> Result<Option<crate::nats::kv::Entry>, KvError> {
            self.0.entry(key).await
        }
        async fn revisions(
            &self,
            key: &str,
            from: u64,
        ) -> Result<Vec<crate::nats::kv::Entry>, KvError> {
            let mut all = self.0.revisions(key, from).await?;
            Ok(all.pop().into_iter().collect())
        }
        fn history(&self) -> Option<u64> {
            Some(1)
        }
        async fn put(&self, key: &str, value: Bytes) -> Result<u64, KvError> {
            self.0.put(key, value).await
        }
        async fn create(&self, key: &str, value: Bytes) -> Result<u64, KvError> {
            self.0.create(key, value).await
        }
        async fn create_with_ttl(
            &self,
            key: &str,
            value: Bytes,
            ttl: std::time::Duration,
        ) -> Result<u64, KvError> {
            self.0.create_with_ttl(key, value, ttl).await
        }
        async fn update(&self, key: &str, value: Bytes, revision: u64) -> Result<u64, KvError> {
            self.0.update(key, value, revision).await
        }
        async fn delete(&self, key: &str) -> Result<u64, KvError> {
            self.0.delete(key).await
        }
        async fn delete_at(&self, key: &str, revision: u64) -> Result<u64, KvError> {
            self.0.delete_at(key, revision).await
        }
        async fn put_with_ttl(
            &self,
            key: &str,
            value: Bytes,
            ttl: std::time::Duration,
        ) -> Result<u64, KvError> {
            self.0.put_with_ttl(key, value, ttl).await
        }
        async fn update_with_ttl(
            &self,
            key: &str,
            value: Bytes,
            revision: u64,
            ttl: std::time::Duration,
        ) -> Result<u64, KvError> {
            self.0.update_with_ttl(key, value, revision, ttl).await
        }
    }
}
