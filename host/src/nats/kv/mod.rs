//! Keys in a NATS KV bucket: following several key prefixes through ONE
//! server consumer, and the writes weir needs (create, compare-and-set by
//! revision, delete by revision, put with a per-key TTL).
//!
//! Coordination, hot reload and tenant settings all follow keys. A watcher
//! that opened a consumer per prefix would cost the server K consumers per
//! host; [`KvWatch::watch_prefixes`] costs one, whatever K is:
//!
//! - prefixes are token-wise (`plugins.` covers `plugins.a`; `plugins`
//!   without the dot is the exact key) and folded before they reach the
//!   server, which refuses overlapping filters — see `prefix::fold_prefixes`;
//! - an empty prefix list watches nothing and creates no consumer — never
//!   the whole bucket;
//! - a watch starts from the current value of every key (deletes included),
//!   from new changes only, or after a revision the caller kept, and says
//!   [`WatchEvent::CaughtUp`] once, when it has reached the present;
//! - puts, deletes, purges and TTL expiries all arrive as [`Entry`]s in
//!   revision order, each at most once, none missed, across disconnects,
//!   server restarts and a lost consumer;
//! - dropping a [`Watch`] deletes its consumer at once (the server would
//!   otherwise keep it until its inactivity threshold).
//!
//! [`NatsKv`] is the real thing; [`MemoryKv`] is an in-process stand-in with
//! the same semantics, for unit tests of logic built on these traits.

mod memory;
mod nats;
mod prefix;
mod watch;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

pub use memory::MemoryKv;
pub use nats::{BucketOptions, NatsKv};

/// What a change did to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// A value was written.
    Put,
    /// The key was deleted (its history may remain).
    Delete,
    /// The key and its history were purged.
    Purge,
    /// The key's TTL (or the bucket's max age) ran out; the server left a
    /// delete marker in its place.
    Expired,
}

impl Operation {
    /// Whether the key holds a value after this change.
    pub fn is_put(self) -> bool {
        self == Operation::Put
    }
}

/// One revision of one key: a value written, or a marker that it is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    /// Empty for deletes, purges and expiries.
    pub value: Bytes,
    /// The stream sequence of this change: unique and increasing across the
    /// whole bucket, so revisions of different keys are ordered too.
    pub revision: u64,
    pub operation: Operation,
    /// When the server stored the change.
    pub created: SystemTime,
}

/// An item of a [`Watch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    Update(Entry),
    /// Every change that existed when the watch started has been delivered;
    /// what follows is live. Sent exactly once per watch.
    CaughtUp,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// The last revision of every watched key (delete markers included) in
    /// revision order, then every change.
    CurrentValues,
    /// Only changes made after the watch started.
    NewChanges,
    /// Every change with a revision greater than this one (still in the
    /// bucket's history): resuming from a revision the caller kept.
    AfterRevision(u64),
}

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("invalid key prefix `{prefix}`: {reason}")]
    InvalidPrefix {
        prefix: String,
        reason: &'static str,
    },
    #[error(
        "invalid key `{key}`: keys are dot-separated tokens of letters, digits and `-/_=`, with no empty token"
    )]
    InvalidKey { key: String },
    #[error("key `{key}` already exists in bucket `{bucket}`")]
    AlreadyExists { bucket: String, key: String },
    #[error("key `{key}` in bucket `{bucket}` is no longer at revision {expected}")]
    WrongRevision {
        bucket: String,
        key: String,
        expected: u64,
    },
    #[error("TTL {ttl:?} for key `{key}` is shorter than the one second the server counts in")]
    InvalidTtl { key: String, ttl: Duration },
    #[error(
        "bucket `{bucket}` does not allow per-key TTLs: open it with `limit_markers` (server >= 2.11)"
    )]
    TtlDisabled { bucket: String },
    #[error("bucket `{bucket}` does not exist")]
    BucketNotFound { bucket: String },
    #[error("cannot open or create bucket `{bucket}`: {reason}")]
    Bucket { bucket: String, reason: String },
    #[error("NATS is unavailable for bucket `{bucket}`: {reason}")]
    Unavailable { bucket: String, reason: String },
    #[error("{operation} of key `{key}` in bucket `{bucket}` failed: {reason}")]
    Write {
        bucket: String,
        key: String,
        operation: &'static str,
        reason: String,
    },
    #[error("cannot read key `{key}` of bucket `{bucket}`: {reason}")]
    Read {
        bucket: String,
        key: String,
        reason: String,
    },
    #[error("watch of {filters:?} in bucket `{bucket}` failed: {reason}")]
    Watch {
        bucket: String,
        filters: Vec<String>,
        reason: String,
    },
}

/// Following keys. One implementation per store; logic built on it is
/// tested against [`MemoryKv`].
pub trait KvWatch {
    /// Follows every key under any of `prefixes` (see
    /// `prefix::fold_prefixes` for what a prefix covers) from `start`. One
    /// server consumer per watch, whatever the number of prefixes; none for
    /// an empty list, which delivers [`WatchEvent::CaughtUp`] and then
    /// nothing.
    fn watch_prefixes<P: AsRef<str> + Sync>(
        &self,
        prefixes: &[P],
        start: WatchStart,
    ) -> impl Future<Output = Result<Watch, KvError>> + Send;
}

/// Writing keys. Every write returns the revision it created; the
/// conditional ones fail with a typed error the caller can match on.
pub trait KvWrite {
    /// The last revision of `key` — a value, or the marker of its deletion
    /// or expiry — or `None` if the bucket holds nothing for it.
    fn entry(&self, key: &str) -> impl Future<Output = Result<Option<Entry>, KvError>> + Send;

    /// Every revision of `key` the bucket still keeps at or after
    /// `from` — values and markers — oldest first.
    fn revisions(
        &self,
        key: &str,
        from: u64,
    ) -> impl Future<Output = Result<Vec<Entry>, KvError>> + Send;

    /// How many revisions of a key the bucket keeps (its `history`);
    /// `None`: every one.
    fn history(&self) -> Option<u64>;

    /// Writes `value` whatever the key holds.
    fn put(&self, key: &str, value: Bytes) -> impl Future<Output = Result<u64, KvError>> + Send;

    /// Writes `value` only if the key has no value (never written, deleted,
    /// purged or expired); else [`KvError::AlreadyExists`].
    fn create(&self, key: &str, value: Bytes) -> impl Future<Output = Result<u64, KvError>> + Send;

    /// [`KvWrite::create`] of a value that expires after `ttl` (see
    /// [`KvWrite::put_with_ttl`]): taking a lease.
    fn create_with_ttl(
        &self,
        key: &str,
        value: Bytes,
        ttl: Duration,
    ) -> impl Future<Output = Result<u64, KvError>> + Send;

    /// Writes `value` only if `revision` is still the key's last one; else
    /// [`KvError::WrongRevision`] (compare-and-set).
    fn update(
        &self,
        key: &str,
        value: Bytes,
        revision: u64,
    ) -> impl Future<Output = Result<u64, KvError>> + Send;

    /// Deletes the key whatever it holds.
    fn delete(&self, key: &str) -> impl Future<Output = Result<u64, KvError>> + Send;

    /// Deletes the key only if `revision` is still its last one; else
    /// [`KvError::WrongRevision`].
    fn delete_at(
        &self,
        key: &str,
        revision: u64,
    ) -> impl Future<Output = Result<u64, KvError>> + Send;

    /// Writes `value` that expires after `ttl` (whole seconds, rounded up;
    /// at least one): watchers then see [`Operation::Expired`]. The bucket
    /// must allow TTLs ([`BucketOptions::limit_markers`]).
    fn put_with_ttl(
        &self,
        key: &str,
        value: Bytes,
        ttl: Duration,
    ) -> impl Future<Output = Result<u64, KvError>> + Send;

    /// [`KvWrite::update`] with a TTL: renews a lease only if nobody took it.
    fn update_with_ttl(
        &self,
        key: &str,
        value: Bytes,
        revision: u64,
        ttl: Duration,
    ) -> impl Future<Output = Result<u64, KvError>> + Send;
}

/// Events waiting in a watch before the watcher stops reading (and the
/// server, through flow control, stops sending).
const WATCH_BUFFER: usize = 256;

/// A running watch: a stream of [`WatchEvent`]s. An `Err` item is final
/// (the bucket is gone, the connection closed); transient failures are
/// retried inside. Dropping it stops the watch and deletes its consumer at
/// once; [`Watch::close`] does the same and waits until it is done.
pub struct Watch {
    events: mpsc::Receiver<Result<WatchEvent, KvError>>,
    /// Stops the task that feeds `events` when the watch is dropped.
    _stop: DropGuard,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    /// Holds an empty watch's channel open, so it stays quiet instead of ending.
    _quiet: Option<mpsc::Sender<Result<WatchEvent, KvError>>>,
}

impl Watch {
    /// A watch fed by a task that stops when `stop` is cancelled.
    fn running(
        events: mpsc::Receiver<Result<WatchEvent, KvError>>,
        stop: CancellationToken,
        task: JoinHandle<()>,
    ) -> Watch {
        Watch {
            events,
            _stop: stop.clone().drop_guard(),
            stop,
            task: Some(task),
            _quiet: None,
        }
    }

    /// A watch of nothing: caught up at once, then silent forever.
    fn of_nothing() -> Watch {
        let (sender, events) = mpsc::channel(1);
        // A fresh channel with room for one: this cannot fail.
        let _ = sender.try_send(Ok(WatchEvent::CaughtUp));
        let stop = CancellationToken::new();
        Watch {
            events,
            _stop: stop.clone().drop_guard(),
            stop,
            task: None,
            _quiet: Some(sender),
        }
    }

    /// Stops the watch and waits until its consumer is deleted (or the
    /// attempt gave up), so a count of the stream's consumers taken after it
    /// no longer includes this watch.
    pub async fn close(self) {
        let Watch {
            events, stop, task, ..
        } = self;
        // Nobody reads any more: a task waiting to hand over an event gives
        // up at once instead of waiting for room.
        drop(events);
        stop.cancel();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl futures::Stream for Watch {
    type Item = Result<WatchEvent, KvError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.events.poll_recv(cx)
    }
}

/// Rounds a TTL up to the whole seconds the server counts in.
fn ttl_seconds(key: &str, ttl: Duration) -> Result<u64, KvError> {
    if ttl < Duration::from_secs(1) {
        return Err(KvError::InvalidTtl {
            key: key.to_string(),
            ttl,
        });
    }
    Ok(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_seconds("k", Duration::from_secs(1)).ok(), Some(1));
        assert_eq!(ttl_seconds("k", Duration::from_millis(1500)).ok(), Some(2));
        assert!(matches!(
            ttl_seconds("k", Duration::from_millis(999)),
            Err(KvError::InvalidTtl { .. })
        ));
    }
}
