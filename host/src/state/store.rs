//! Scopes in the state bucket: `<tenant>.<plugin>.<table>.<partition>.<shard>`
//! (each name encoded to KV's alphabet, tenant first so a tenant's state is
//! one prefix), read once by a unit's owner and written by compare-and-set,
//! so a host that lost the unit cannot overwrite its new owner's state.
//!
//! The unit is in the key because a scope must have one writer and one
//! sequence space: a table lives in one unit under the default route, but
//! a router may spread it over several by key (each key's rows stay in one).

use bytes::Bytes;

use crate::nats::kv::{KvError, KvWrite, MemoryKv, NatsKv};
use crate::state::scope::{Scope, StateError};
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
    #[error(transparent)]
    Kv(#[from] KvError),
}

/// A scope as read, with the revision a write must still find.
#[derive(Debug, Clone, Default)]
pub struct Stored {
    pub scope: Scope,
    /// `None`: the bucket never held the key.
    pub revision: Option<u64>,
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
        match self.kv.entry(key).await? {
            Some(entry) if entry.operation.is_put() => Ok(Stored {
                scope: Scope::decode(&entry.value).map_err(|source| StoreError::Corrupt {
                    key: key.to_string(),
                    source,
                })?,
                revision: Some(entry.revision),
            }),
            // Purged: empty, but a write must still find the purge marker.
            Some(marker) => Ok(Stored {
                scope: Scope::default(),
                revision: Some(marker.revision),
            }),
            None => Ok(Stored::default()),
        }
    }

    /// Writes `next` over what `read` was, if nobody wrote in between;
    /// returns what a later write must find.
    pub async fn commit(
        &self,
        key: &str,
        read: &Stored,
        next: Scope,
    ) -> Result<Stored, StoreError> {
        let value = Bytes::from(next.encode());
        let written = match read.revision {
            Some(revision) => self.kv.update(key, value, revision).await,
            None => self.kv.create(key, value).await,
        };
        match written {
            Ok(revision) => Ok(Stored {
                scope: next,
                revision: Some(revision),
            }),
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

    /// See [`StateStore::commit`].
    pub async fn commit(
        &self,
        key: &str,
        read: &Stored,
        next: Scope,
    ) -> Result<Stored, StoreError> {
        match self {
            ScopeStore::Nats(store) => store.commit(key, read, next).await,
            ScopeStore::Memory(store) => store.commit(key, read, next).await,
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
    use crate::state::scope::{Limits, Overlay};

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

        let mut overlay = Overlay::new(Arc::new(first.scope.clone()), LIMITS);
        overlay.set(b"count", b"1").unwrap();
        let owner = store
            .commit(&key, &first, overlay.commit([1], [], 0))
            .await
            .unwrap();

        // A host that read the scope before that write lost the unit.
        let mut stale = Overlay::new(Arc::new(first.scope.clone()), LIMITS);
        stale.set(b"count", b"99").unwrap();
        let refused = store.commit(&key, &first, stale.commit([1], [], 0)).await;
        assert!(
            matches!(refused, Err(StoreError::Fenced { .. })),
            "{refused:?}"
        );

        let mut next = Overlay::new(Arc::new(owner.scope.clone()), LIMITS);
        next.set(b"count", b"2").unwrap();
        store
            .commit(&key, &owner, next.commit([2], [], 1))
            .await
            .unwrap();
        let read = store.load(&key).await.unwrap();
        assert_eq!(read.scope.get(b"count"), Some(&b"2"[..]));
        assert!(read.scope.applied(2) && !read.scope.applied(1));

        // Removed since it was read: purged, not fenced; the next write
        // starts from the removal.
        store.kv.delete(&key).await.unwrap();
        let mut after = Overlay::new(Arc::new(read.scope.clone()), LIMITS);
        after.set(b"count", b"3").unwrap();
        let refused = store.commit(&key, &read, after.commit([3], [], 2)).await;
        assert!(
            matches!(refused, Err(StoreError::Purged { .. })),
            "{refused:?}"
        );
        let empty = store.load(&key).await.unwrap();
        assert_eq!(empty.scope.keys(), 0);
        let mut again = Overlay::new(Arc::new(empty.scope.clone()), LIMITS);
        again.set(b"count", b"1").unwrap();
        store
            .commit(&key, &empty, again.commit([3], [], 2))
            .await
            .unwrap();
    }
}
