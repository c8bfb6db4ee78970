//! `[delivery]`: how rows are fetched from a unit, batched and retried.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::checker::{Checker, Legacy};
use super::keys::{Fallback, Key, Reload, keep};
use super::units::{HumanDuration, Size};

pub const DEFAULT_BATCH_ROWS: usize = 256;
/// Rows per pull request (raised to `batch_rows` when that is larger).
pub const DEFAULT_PULL_ROWS: usize = 1000;
pub const DEFAULT_BATCH_BYTES: u64 = 1 << 20;
/// Largest `batch_bytes`: 4 GiB.
const MAX_BATCH_BYTES: u64 = 1 << 32;
pub const DEFAULT_BATCH_WAIT: Duration = Duration::from_millis(5);
/// A batch closes as soon as no further row is waiting: at low load a
/// request's rows go at once; under load rows wait while a batch runs, so
/// batches grow with the load (up to `batch_rows`, `batch_bytes`, `batch_wait`).
pub const DEFAULT_BATCH_IDLE: Duration = Duration::ZERO;
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);
const MIN_ACK_WAIT: Duration = Duration::from_secs(1);
pub const DEFAULT_MAX_DELIVERIES: u32 = 10;
pub const DEFAULT_FAILURE_DELAY: Duration = Duration::from_secs(1);
const MIN_FAILURE_DELAY: Duration = Duration::from_millis(1);
/// Longest retry delay (raised to `failure_delay` when that is larger).
pub const DEFAULT_FAILURE_DELAY_CAP: Duration = Duration::from_secs(60);
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
const MIN_DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// `[delivery]`: workers take it between batches, but the drain runs on
/// the process's shutdown path, set up at start.
pub(super) const KEYS: &[Key] = &[
    Key::new(
        "delivery",
        "batch_rows",
        Fallback::Count(DEFAULT_BATCH_ROWS as u64),
        Reload::Hot,
    ),
    Key::new(
        "delivery",
        "batch_bytes",
        Fallback::Bytes(DEFAULT_BATCH_BYTES),
        Reload::Hot,
    ),
    Key::new(
        "delivery",
        "batch_wait",
        Fallback::Time(DEFAULT_BATCH_WAIT),
        Reload::Hot,
    )
    .or_legacy("batch_wait_ms"),
    Key::new(
        "delivery",
        "batch_idle",
        Fallback::Time(DEFAULT_BATCH_IDLE),
        Reload::Hot,
    ),
    Key::new(
        "delivery",
        "pull_rows",
        Fallback::Count(DEFAULT_PULL_ROWS as u64),
        Reload::UnitStart,
    ),
    Key::new(
        "delivery",
        "ack_wait",
        Fallback::Time(DEFAULT_ACK_WAIT),
        Reload::Hot,
    )
    .or_legacy("ack_wait_secs"),
    Key::new(
        "delivery",
        "max_deliveries",
        Fallback::Count(DEFAULT_MAX_DELIVERIES as u64),
        Reload::Hot,
    ),
    Key::new(
        "delivery",
        "failure_delay",
        Fallback::Time(DEFAULT_FAILURE_DELAY),
        Reload::Hot,
    )
    .or_legacy("failure_delay_ms"),
    Key::new(
        "delivery",
        "failure_delay_cap",
        Fallback::Time(DEFAULT_FAILURE_DELAY_CAP),
        Reload::Hot,
    )
    .or_legacy("failure_delay_cap_ms"),
    Key::new(
        "delivery",
        "drain_timeout",
        Fallback::Time(DEFAULT_DRAIN_TIMEOUT),
        Reload::Restart(|n, r| keep(&mut n.delivery.drain_timeout, &r.delivery.drain_timeout)),
    )
    .or_legacy("drain_timeout_secs"),
];

/// How rows are fetched and handed to pipelines.
#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    pub batch_rows: usize,
    /// Rows asked for per pull request (at least `batch_rows`): the server
    /// sends the next batches' rows while one runs, in fewer requests.
    pub pull_rows: usize,
    pub batch_bytes: usize,
    /// How long a batch may go on filling after its first row.
    pub batch_wait: Duration,
    /// A batch also closes once no row arrived for this long (zero, the
    /// default: as soon as none is waiting), so a lone request's rows need
    /// not wait out `batch_wait`; at least `batch_wait`: no early close.
    pub batch_idle: Duration,
    /// Time JetStream waits for an ack before redelivering a row.
    pub ack_wait: Duration,
    /// After this many deliveries a row that still asks for a retry is dead-lettered.
    pub max_deliveries: u32,
    /// Delay before a row whose plugin call failed is redelivered the first
    /// time; it doubles with each delivery up to `failure_delay_cap`.
    pub failure_delay: Duration,
    pub failure_delay_cap: Duration,
    /// How long a planned stop (or handover) waits for a unit's last rows
    /// and for the server to confirm their acks applied.
    pub drain_timeout: Duration,
}

impl DeliveryConfig {
    /// Delay before the retry of a failing row at its `attempt`-th delivery:
    /// doubling from `failure_delay` up to `failure_delay_cap`, with ±20%
    /// jitter (from the row's sequence) so rows that failed together do not
    /// all come back at once.
    pub fn backoff(&self, attempt: i64, sequence: u64) -> Duration {
        let doublings = attempt.saturating_sub(1).clamp(0, 20) as u32;
        let delay = self
            .failure_delay
            .saturating_mul(1 << doublings)
            .min(self.failure_delay_cap);
        let mixed =
            (sequence ^ (attempt as u64).rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let permille = (mixed >> 54) % 401;
        delay.mul_f64(0.8 + permille as f64 / 1000.0)
    }
}

/// `[delivery]` as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDelivery {
    batch_rows: Option<Spanned<usize>>,
    pull_rows: Option<Spanned<usize>>,
    batch_bytes: Option<Spanned<Size>>,
    batch_wait: Option<Spanned<HumanDuration>>,
    batch_wait_ms: Option<Spanned<u64>>,
    batch_idle: Option<Spanned<HumanDuration>>,
    ack_wait: Option<Spanned<HumanDuration>>,
    ack_wait_secs: Option<Spanned<u64>>,
    max_deliveries: Option<Spanned<u32>>,
    failure_delay: Option<Spanned<HumanDuration>>,
    failure_delay_ms: Option<Spanned<u64>>,
    failure_delay_cap: Option<Spanned<HumanDuration>>,
    failure_delay_cap_ms: Option<Spanned<u64>>,
    drain_timeout: Option<Spanned<HumanDuration>>,
    drain_timeout_secs: Option<Spanned<u64>>,
}

impl Checker<'_> {
    pub(super) fn delivery(&self, d: &RawDelivery) -> DeliveryConfig {
        let batch_rows = self.at_least("batch_rows", &d.batch_rows, 1, DEFAULT_BATCH_ROWS);
        let failure_delay = self.duration(
            "failure_delay",
            &d.failure_delay,
            (Legacy::Millis, &d.failure_delay_ms),
            MIN_FAILURE_DELAY,
            DEFAULT_FAILURE_DELAY,
        );
        let failure_delay_cap = self.duration(
            "failure_delay_cap (the retry delay's cap, at least failure_delay)",
            &d.failure_delay_cap,
            (Legacy::Millis, &d.failure_delay_cap_ms),
            failure_delay,
            DEFAULT_FAILURE_DELAY_CAP.max(failure_delay),
        );
        let batch_wait = self.duration(
            "batch_wait",
            &d.batch_wait,
            (Legacy::Millis, &d.batch_wait_ms),
            Duration::ZERO,
            DEFAULT_BATCH_WAIT,
        );
        DeliveryConfig {
            batch_rows,
            pull_rows: self.at_least(
                "pull_rows (at least batch_rows)",
                &d.pull_rows,
                batch_rows,
                DEFAULT_PULL_ROWS.max(batch_rows),
            ),
            batch_bytes: usize::try_from(self.size(
                "batch_bytes",
                &d.batch_bytes,
                1,
                MAX_BATCH_BYTES,
                DEFAULT_BATCH_BYTES,
            ))
            .unwrap_or(usize::MAX),
            batch_wait,
            batch_idle: self.duration(
                "batch_idle",
                &d.batch_idle,
                (Legacy::Millis, &None),
                Duration::ZERO,
                DEFAULT_BATCH_IDLE,
            ),
            ack_wait: self.duration(
                "ack_wait",
                &d.ack_wait,
                (Legacy::Secs, &d.ack_wait_secs),
                MIN_ACK_WAIT,
                DEFAULT_ACK_WAIT,
            ),
            max_deliveries: self.at_least(
                "max_deliveries",
                &d.max_deliveries,
                1,
                DEFAULT_MAX_DELIVERIES,
            ),
            failure_delay,
            failure_delay_cap,
            drain_timeout: self.duration(
                "drain_timeout",
                &d.drain_timeout,
                (Legacy::Secs, &d.drain_timeout_secs),
                MIN_DRAIN_TIMEOUT,
                DEFAULT_DRAIN_TIMEOUT,
            ),
        }
    }
}
