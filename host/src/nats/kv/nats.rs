//! A KV bucket on NATS JetStream: opening or creating it, the writes, and
//! [`KvWatch`] through one multi-filter consumer per watch.
//!
//! Writes are raw publishes to `$KV.<bucket>.<key>` with the headers the KV
//! protocol uses (`KV-Operation`, `Nats-Expected-Last-Subject-Sequence`,
//! `Nats-TTL`), so every kind of write — including a put with a TTL, which
//! async-nats lacks — goes through one function and one error mapping.

use std::time::{Duration, SystemTime};

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, StorageType};
use async_nats::jetstream::{self, ErrorCode, kv};
use bytes::Bytes;

use super::prefix::{check_key, filter_subject, fold_prefixes};
use super::watch::{self, WatchTarget, operation};
use super::{Entry, KvError, KvWatch, KvWrite, Watch, WatchStart, ttl_seconds};

/// Server error: the stream does not accept per-message TTLs.
const TTL_DISABLED: ErrorCode = ErrorCode(10166);

/// How a bucket is created when it does not exist yet (and updated to when
/// it does).
#[derive(Debug, Clone)]
pub struct BucketOptions {
    pub bucket: String,
    pub description: String,
    /// Revisions kept per key (1..=64).
    pub history: i64,
    pub storage: StorageType,
    /// Enables per-key TTLs: a key that expires (or ages out under the
    /// bucket's max age) leaves a delete marker that watchers see as
    /// [`super::Operation::Expired`]; the marker itself is kept this long.
    /// Server >= 2.11. `None` refuses TTL writes.
    pub limit_markers: Option<Duration>,
    /// Copies of the bucket's stream on a cluster.
    pub replicas: usize,
}

impl BucketOptions {
    /// One revision per key, file storage, no TTLs.
    pub fn new(bucket: impl Into<String>) -> BucketOptions {
        BucketOptions {
            bucket: bucket.into(),
            description: String::new(),
            history: 1,
            storage: StorageType::File,
            limit_markers: None,
            replicas: 1,
        }
    }
}

/// A KV bucket on NATS. Cheap to clone.
#[derive(Clone)]
pub struct NatsKv {
    client: async_nats::Client,
    js: jetstream::Context,
    bucket: String,
    /// `KV_<bucket>`.
    stream: jetstream::stream::Stream,
}

impl std::fmt::Debug for NatsKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsKv")
            .field("bucket", &self.bucket)
            .finish()
    }
}

/// What a write does besides setting a value.
struct WriteSpec {
    /// `KV-Operation` header: `None` for a put.
    operation: Option<&'static str>,
    /// The revision the key must be at (0: no message at all for the key).
    expect: Option<u64>,
    ttl_seconds: Option<u64>,
    /// Names the write in errors.
    what: &'static str,
}

/// Whether creating a bucket failed because a request timed out (async-nats
/// reports a timed-out stream create inside as a JetStream error).
fn timed_out(err: &jetstream::context::CreateKeyValueError) -> bool {
    use jetstream::context::{CreateKeyValueErrorKind, CreateStreamErrorKind};
    err.kind() == CreateKeyValueErrorKind::TimedOut
        || stream_error(err).is_some_and(|source| source.kind() == CreateStreamErrorKind::TimedOut)
}

/// The stream create behind a failed bucket create, if that is what failed.
fn stream_error(
    err: &jetstream::context::CreateKeyValueError,
) -> Option<&jetstream::context::CreateStreamError> {
    std::error::Error::source(err)?.downcast_ref()
}

/// How long a bucket just created may be "not found", and how often it is
/// looked for meanwhile.
const FOUND_AFTER_CREATE: Duration = Duration::from_secs(10);
const FOUND_RETRY: Duration = Duration::from_millis(250);

impl NatsKv {
    /// Opens an existing bucket.
    pub async fn open(client: &async_nats::Client, bucket: &str) -> Result<NatsKv, KvError> {
        let js = jetstream::new(client.clone());
        let stream =
            js.get_stream(format!("KV_{bucket}"))
                .await
                .map_err(|err| match err.kind() {
                    jetstream::context::GetStreamErrorKind::JetStream(error)
                        if error.error_code() == ErrorCode::STREAM_NOT_FOUND =>
                    {
                        KvError::BucketNotFound {
                            bucket: bucket.to_string(),
                        }
                    }
                    jetstream::context::GetStreamErrorKind::Request => KvError::Unavailable {
                        bucket: bucket.to_string(),
                        reason: err.to_string(),
                    },
                    _ => KvError::Bucket {
                        bucket: bucket.to_string(),
                        reason: err.to_string(),
                    },
                })?;
        Ok(NatsKv {
            client: client.clone(),
            js,
            bucket: bucket.to_string(),
            stream,
        })
    }

    /// Creates the bucket, or updates an existing one to `options` (so
    /// turning TTLs on for an existing bucket works too; the server refuses
    /// to turn them off again).
    pub async fn open_or_create(
        client: &async_nats::Client,
        options: &BucketOptions,
    ) -> Result<NatsKv, KvError> {
        let config = kv::Config {
            bucket: options.bucket.clone(),
            description: options.description.clone(),
            history: options.history,
            storage: options.storage,
            limit_markers: options.limit_markers,
            num_replicas: options.replicas,
            ..Default::default()
        };
        // Hosts started together race to create it (`CREATE_TIMEOUTS`), and
        // a cluster just booted may not place its replicas at once.
        let what = format!("bucket {}", options.bucket);
        crate::nats::jetstream::create_patiently(
            &what,
            |timeout| {
                let mut js = jetstream::new(client.clone());
                js.set_timeout(timeout);
                let config = config.clone();
                async move { js.create_or_update_key_value(config).await }
            },
            timed_out,
            |err| stream_error(err).is_some_and(crate::nats::jetstream::cannot_place_yet),
        )
        .await
        .map_err(|err| KvError::Bucket {
            bucket: options.bucket.clone(),
            reason: err.to_string(),
        })?;
        // A replicated bucket just created can be "not found" for a moment
        // on a slow cluster (a host of three started together stopped at
        // boot on it), until its stream has a leader to answer.
        let give_up = tokio::time::Instant::now() + FOUND_AFTER_CREATE;
        loop {
            match NatsKv::open(client, &options.bucket).await {
                Err(KvError::BucketNotFound { .. }) if tokio::time::Instant::now() < give_up => {
                    tokio::time::sleep(FOUND_RETRY).await;
                }
                opened => return opened,
            }
        }
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The bucket's stream, `KV_<bucket>`.
    pub fn stream_name(&self) -> &str {
        &self.stream.cached_info().config.name
    }

    /// Every key under `prefix` the bucket holds a message of (a value or
    /// a delete marker), from the stream's subjects: no consumer needed.
    pub async fn keys_under(&self, prefix: &str) -> Result<Vec<String>, KvError> {
        use futures::TryStreamExt;
        let base = format!("$KV.{}.", self.bucket);
        let listing = |err: jetstream::stream::InfoError| {
            self.unavailable(format!("cannot list the keys under `{prefix}`: {err}"))
        };
        let mut subjects = self
            .stream
            .info_with_subjects(format!("{base}{prefix}>"))
            .await
            .map_err(listing)?;
        let mut keys = Vec::new();
        while let Some((subject, _)) = subjects.try_next().await.map_err(listing)? {
            if let Some(key) = subject.strip_prefix(&base) {
                keys.push(key.to_string());
            }
        }
        keys.sort();
        Ok(keys)
    }

    fn subject(&self, key: &str) -> String {
        format!("$KV.{}.{key}", self.bucket)
    }

    fn unavailable(&self, reason: impl std::fmt::Display) -> KvError {
        KvError::Unavailable {
            bucket: self.bucket.clone(),
            reason: reason.to_string(),
        }
    }

    async fn last_revision(&self) -> Result<u64, KvError> {
        let info =
            self.stream.get_info().await.map_err(|err| {
                self.unavailable(format!("cannot read the stream's state: {err}"))
            })?;
        Ok(info.state.last_sequence)
    }

    /// Publishes one write and waits for its PubAck; the revision is the
    /// stream sequence the server gave it.
    async fn write(&self, key: &str, value: Bytes, spec: WriteSpec) -> Result<u64, KvError> {
        check_key(key)?;
        let mut message = PublishMessage::build().payload(value);
        if let Some(operation) = spec.operation {
            message = message.header("KV-Operation", operation);
        }
        if let Some(revision) = spec.expect {
            message = message.expected_last_subject_sequence(revision);
        }
        if let Some(seconds) = spec.ttl_seconds {
            message = message.header("Nats-TTL", seconds.to_string());
        }
        let failed = |reason: String| KvError::Write {
            bucket: self.bucket.clone(),
            key: key.to_string(),
            operation: spec.what,
            reason,
        };
        let classify = |err: jetstream::context::PublishError| match err.kind() {
            PublishErrorKind::WrongLastSequence => KvError::WrongRevision {
                bucket: self.bucket.clone(),
                key: key.to_string(),
                expected: spec.expect.unwrap_or_default(),
            },
            PublishErrorKind::TimedOut
            | PublishErrorKind::BrokenPipe
            | PublishErrorKind::StreamNotFound
            | PublishErrorKind::MaxAckPending => self.unavailable(err),
            _ if server_error(&err) == Some(TTL_DISABLED) => KvError::TtlDisabled {
                bucket: self.bucket.clone(),
            },
            _ => failed(err.to_string()),
        };
        let ack = self
            .js
            .send_publish(self.subject(key), message)
            .await
            .map_err(classify)?
            .await
            .map_err(classify)?;
        Ok(ack.sequence)
    }

    /// `create` with an optional TTL: a key that was deleted or expired still
    /// has a marker as its last message, so "absent" means "no message, or a
    /// marker" — the marker's revision is what the write must expect then.
    async fn create_maybe_ttl(
        &self,
        key: &str,
        value: Bytes,
        ttl_seconds: Option<u64>,
    ) -> Result<u64, KvError> {
        let spec = |expect| WriteSpec {
            operation: None,
            expect: Some(expect),
            ttl_seconds,
            what: "create",
        };
        let already_exists = || KvError::AlreadyExists {
            bucket: self.bucket.clone(),
            key: key.to_string(),
        };
        match self.write(key, value.clone(), spec(0)).await {
            Err(KvError::WrongRevision { .. }) => {}
            other => return other,
        }
        match self.entry(key).await? {
            Some(entry) if !entry.operation.is_put() => {
                match self.write(key, value, spec(entry.revision)).await {
                    Err(KvError::WrongRevision { .. }) => Err(already_exists()),
                    other => other,
                }
            }
            _ => Err(already_exists()),
        }
    }
}

/// The JetStream error code behind a failed publish, if the server sent one.
fn server_error(err: &jetstream::context::PublishError) -> Option<ErrorCode> {
    let source = std::error::Error::source(err)?;
    source
        .downcast_ref::<jetstream::Error>()
        .map(|error| error.error_code())
}

impl KvWatch for NatsKv {
    async fn watch_prefixes<P: AsRef<str> + Sync>(
        &self,
        prefixes: &[P],
        start: WatchStart,
    ) -> Result<Watch, KvError> {
        let folded = fold_prefixes(prefixes)?;
        if folded.is_empty() {
            return Ok(Watch::of_nothing());
        }
        let target = WatchTarget {
            client: self.client.clone(),
            js: self.js.clone(),
            bucket: self.bucket.clone(),
            stream: self.stream_name().to_string(),
            key_prefix: format!("$KV.{}.", self.bucket),
            filters: folded
                .iter()
                .map(|prefix| filter_subject(&self.bucket, prefix))
                .collect(),
        };
        watch::start(target, start, self.last_revision()).await
    }
}

impl KvWrite for NatsKv {
    async fn entry(&self, key: &str) -> Result<Option<Entry>, KvError> {
        check_key(key)?;
        match self
            .stream
            .direct_get_last_for_subject(self.subject(key))
            .await
        {
            Ok(message) => Ok(Some(Entry {
                key: key.to_string(),
                operation: operation(Some(&message.headers)),
                value: message.payload,
                revision: message.sequence,
                created: SystemTime::from(message.time),
            })),
            Err(err) if err.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(err) if err.kind() == DirectGetErrorKind::TimedOut => Err(self.unavailable(err)),
            Err(err) => Err(KvError::Read {
                bucket: self.bucket.clone(),
                key: key.to_string(),
                reason: err.to_string(),
            }),
        }
    }

    async fn revisions(&self, key: &str, from: u64) -> Result<Vec<Entry>, KvError> {
        check_key(key)?;
        let subject = self.subject(key);
        let mut entries = Vec::new();
        let mut next = from.max(1);
        loop {
            match self
                .stream
                .direct_get_next_for_subject(subject.as_str(), Some(next))
                .await
            {
                Ok(message) => {
                    next = message.sequence + 1;
                    entries.push(Entry {
                        key: key.to_string(),
                        operation: operation(Some(&message.headers)),
                        value: message.payload,
                        revision: message.sequence,
                        created: SystemTime::from(message.time),
                    });
                }
                Err(err) if err.kind() == DirectGetErrorKind::NotFound => return Ok(entries),
                Err(err) if err.kind() == DirectGetErrorKind::TimedOut => {
                    return Err(self.unavailable(err));
                }
                Err(err) => {
                    return Err(KvError::Read {
                        bucket: self.bucket.clone(),
                        key: key.to_string(),
                        reason: err.to_string(),
                    });
                }
            }
        }
    }

    fn history(&self) -> Option<u64> {
        // Read when the bucket was opened: a bucket's history changes only
        // with `weir mq apply`, which hosts pick up at their next start.
        u64::try_from(self.stream.cached_info().config.max_messages_per_subject).ok()
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<u64, KvError> {
        let spec = WriteSpec {
            operation: None,
            expect: None,
            ttl_seconds: None,
            what: "put",
        };
        self.write(key, value, spec).await
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<u64, KvError> {
        self.create_maybe_ttl(key, value, None).await
    }

    async fn create_with_ttl(
        &self,
        key: &str,
        value: Bytes,
        ttl: Duration,
    ) -> Result<u64, KvError> {
        self.create_maybe_ttl(key, value, Some(ttl_seconds(key, ttl)?))
            .await
    }

    async fn update(&self, key: &str, value: Bytes, revision: u64) -> Result<u64, KvError> {
        let spec = WriteSpec {
            operation: None,
            expect: Some(revision),
            ttl_seconds: None,
            what: "update",
        };
        self.write(key, value, spec).await
    }

    async fn delete(&self, key: &str) -> Result<u64, KvError> {
        let spec = WriteSpec {
            operation: Some("DEL"),
            expect: None,
            ttl_seconds: None,
            what: "delete",
        };
        self.write(key, Bytes::new(), spec).await
    }

    async fn delete_at(&self, key: &str, revision: u64) -> Result<u64, KvError> {
        let spec = WriteSpec {
            operation: Some("DEL"),
            expect: Some(revision),
            ttl_seconds: None,
            what: "delete",
        };
        self.write(key, Bytes::new(), spec).await
    }

    async fn put_with_ttl(&self, key: &str, value: Bytes, ttl: Duration) -> Result<u64, KvError> {
        let spec = WriteSpec {
            operation: None,
            expect: None,
            ttl_seconds: Some(ttl_seconds(key, ttl)?),
            what: "put with TTL",
        };
        self.write(key, value, spec).await
    }

    async fn update_with_ttl(
        &self,
        key: &str,
        value: Bytes,
        revision: u64,
        ttl: Duration,
    ) -> Result<u64, KvError> {
        let spec = WriteSpec {
            operation: None,
            expect: Some(revision),
            ttl_seconds: Some(ttl_seconds(key, ttl)?),
            what: "update with TTL",
        };
        self.write(key, value, spec).await
    }
}
