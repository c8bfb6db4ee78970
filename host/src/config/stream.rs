//! `[stream]`: the partition streams rows are stored in, and the names of
//! every JetStream object weir uses.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::Overrides;
use super::checker::{Checker, Legacy};
use super::keys::{Fallback, Key, Reload, keep};
use super::units::{HumanDuration, Size};

/// Prefix of every subject and stream name when `prefix` is not set.
pub const DEFAULT_PREFIX: &str = "weir";
/// Default partitions: four units (one shard each), enough to spread a few
/// hosts' work. Separate streams deliver at the raw limit, where four
/// shards of one stream reach ~0.6 of it (ARCHITECTURE.md, "Topology").
pub const DEFAULT_PARTITIONS: u32 = 4;
/// Default shards per partition.
pub const DEFAULT_SHARDS: u32 = 1;
/// Partition streams a topology may have.
pub const MAX_PARTITIONS: u32 = 64;
/// Shards per partition; below the per-stream consumer limit weir sets.
pub const MAX_SHARDS: u32 = 200;
/// Byte limit of each partition stream when `max_bytes` is not set.
pub const DEFAULT_STREAM_MAX_BYTES: u64 = 1 << 30;
/// How long a message id dedupes a row by default (JetStream's own default).
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
const MIN_DUPLICATE_WINDOW: Duration = Duration::from_secs(1);
/// One copy: right for the embedded server, which is a single node.
pub const DEFAULT_REPLICAS: u32 = 1;
/// Raft groups need an odd size.
const REPLICAS: [u32; 3] = [1, 3, 5];

/// `[stream]`, all of it a restart's: the units and streams are set up at start.
pub(super) const KEYS: &[Key] = &[
    Key::new(
        "stream",
        "prefix",
        Fallback::Text(DEFAULT_PREFIX),
        Reload::Restart(|n, r| keep(&mut n.stream.prefix, &r.stream.prefix)),
    ),
    Key::new(
        "stream",
        "partitions",
        Fallback::Count(DEFAULT_PARTITIONS as u64),
        Reload::Restart(|n, r| keep(&mut n.stream.partitions, &r.stream.partitions)),
    ),
    Key::new(
        "stream",
        "shards",
        Fallback::Count(DEFAULT_SHARDS as u64),
        Reload::Restart(|n, r| keep(&mut n.stream.shards, &r.stream.shards)),
    ),
    Key::new(
        "stream",
        "replicas",
        Fallback::Count(DEFAULT_REPLICAS as u64),
        Reload::Restart(|n, r| keep(&mut n.stream.replicas, &r.stream.replicas)),
    ),
    Key::new(
        "stream",
        "create",
        Fallback::Bool(false),
        Reload::Restart(|n, r| keep(&mut n.stream.create, &r.stream.create)),
    ),
    Key::new(
        "stream",
        "max_bytes",
        Fallback::Bytes(DEFAULT_STREAM_MAX_BYTES),
        Reload::Restart(|n, r| keep(&mut n.stream.max_bytes, &r.stream.max_bytes)),
    ),
    Key::new(
        "stream",
        "duplicate_window",
        Fallback::Time(DEFAULT_DUPLICATE_WINDOW),
        Reload::Restart(|n, r| keep(&mut n.stream.duplicate_window, &r.stream.duplicate_window)),
    )
    .or_legacy("duplicate_window_secs"),
];

/// The partition stream(s) rows are stored in.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamConfig {
    /// Prefix of every subject and stream name weir uses.
    pub prefix: String,
    /// N: partition streams.
    pub partitions: u32,
    /// V: shards per partition; a unit is one shard's durable consumer.
    pub shards: u32,
    /// Create the topology instead of only verifying it. Always on for the
    /// embedded server, which is weir's own.
    pub create: bool,
    /// Byte limit of a partition stream; past it, publishes are refused.
    pub max_bytes: i64,
    /// Window in which a repeated message id is stored only once.
    pub duplicate_window: Duration,
    /// Copies of every stream, bucket and store weir uses (1, 3 or 5).
    pub replicas: u32,
}

/// `[stream]` as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStream {
    prefix: Option<Spanned<String>>,
    partitions: Option<Spanned<u32>>,
    shards: Option<Spanned<u32>>,
    create: Option<bool>,
    max_bytes: Option<Spanned<Size>>,
    duplicate_window: Option<Spanned<HumanDuration>>,
    duplicate_window_secs: Option<Spanned<u64>>,
    pub(super) replicas: Option<Spanned<u32>>,
}

impl Checker<'_> {
    pub(super) fn stream(&self, raw: &RawStream, overrides: &Overrides) -> StreamConfig {
        let prefix = raw
            .prefix
            .clone()
            .unwrap_or_else(|| Spanned::new(0..0, DEFAULT_PREFIX.to_string()));
        self.check_token("stream prefix", &prefix);
        let partitions = self.check_count(
            "partitions",
            raw.partitions.as_ref(),
            DEFAULT_PARTITIONS,
            MAX_PARTITIONS,
        );
        let shards = self.check_count("shards", raw.shards.as_ref(), DEFAULT_SHARDS, MAX_SHARDS);
        StreamConfig {
            prefix: prefix.into_inner(),
            partitions,
            shards,
            create: overrides.create_topology || raw.create.unwrap_or(false),
            max_bytes: i64::try_from(self.size(
                "max_bytes",
                &raw.max_bytes,
                1,
                i64::MAX as u64,
                DEFAULT_STREAM_MAX_BYTES,
            ))
            .unwrap_or(i64::MAX),
            duplicate_window: self.duration(
                "duplicate_window",
                &raw.duplicate_window,
                (Legacy::Secs, &raw.duplicate_window_secs),
                MIN_DUPLICATE_WINDOW,
                DEFAULT_DUPLICATE_WINDOW,
            ),
            replicas: match &raw.replicas {
                Some(set) if !REPLICAS.contains(set.get_ref()) => {
                    self.report(set.span().start, "replicas must be 1, 3 or 5");
                    DEFAULT_REPLICAS
                }
                Some(set) => *set.get_ref(),
                None => DEFAULT_REPLICAS,
            },
        }
    }
}
