//! What a host reports about itself and its fleet: fleet-wide row counts
//! (from the streams), the fleet (members, each unit's owner, unowned
//! units), every unit's backlog, dead letters by reason, tenants' usage,
//! plugin versions and its NATS connection — plus this host's own counters.
//! Served as JSON at `/v1/status` and read back by `weir status`.
//!
//! Owners and unowned units come from the coordination watch (no request).
//! What only NATS knows is read per report, all reads at once under one
//! deadline (`NATS_READ_TIMEOUT`), and not at all while the client is
//! disconnected: a report answers within that bound whatever the server
//! does, and what NATS did not answer is `None` (unknown), never 0.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::coordination::{FleetView, MEMBERS};
use crate::delivery::dlq::headers;
use crate::ingest::usage::Ledger;
use crate::reload::canary::{fleet_diff, fleet_tally};
use crate::reload::generation::{CanaryStatus, Generation, PluginStatus};
use crate::reload::releases::{Release, Tallies, version_of_digest};
use crate::telemetry::{Metrics, plural};
use crate::topology::route::Names;

/// How long one report waits for NATS, all its reads together. A frozen
/// server (SIGSTOP, a partition) keeps the client "connected" until its
/// pings fail; without this bound a report waited 20 s (4 × 5 s requests).
pub const NATS_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Dead letters read (headers only, the newest) to count them by reason:
/// a bound on what one report costs however many letters are kept.
pub const REASON_SCAN: u64 = 1000;
/// Longest reason kept in a count: reasons are plugins' own text.
const REASON_CHARS: usize = 120;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusReport {
    /// This host's own counters since it started (not the fleet's).
    pub rows: RowCounts,
    /// The fleet's counters, from the streams: the same on every host.
    #[serde(default)]
    pub totals: FleetTotals,
    #[serde(default)]
    pub fleet: FleetStatus,
    pub units: Vec<UnitStatus>,
    pub plugins: Vec<PluginStatus>,
    pub nats: NatsStatus,
    /// Each tenant's fleet-wide usage as this host counts it (what its
    /// budget is asked with).
    #[serde(default)]
    pub tenants: Vec<TenantUsage>,
    /// Milliseconds since this host applied the last usage snapshot (one
    /// as usage changes, and at least every 10 s while NATS is up);
    /// `None`: none yet.
    #[serde(default)]
    pub usage_age_ms: Option<u64>,
    #[serde(default)]
    pub dead_letters: DeadLetterStatus,
}

/// Rows of the whole fleet, from the streams (not any process's memory):
/// every host reports the same, and a restart changes nothing. `None`:
/// NATS did not answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct FleetTotals {
    /// Rows ever stored in the partition streams (the sum of their last
    /// sequences). A replayed dead letter is stored, so counted, again.
    pub accepted: Option<u64>,
    /// Rows that left the partition streams: acked after delivery or after
    /// their dead letter was stored (work-queue streams drop acked rows).
    pub settled: Option<u64>,
    /// Settled rows that were not dead-lettered.
    pub delivered: Option<u64>,
    /// Dead letters ever stored (the dead-letter stream's last sequence;
    /// replays and purges do not lower it).
    pub dead_lettered: Option<u64>,
    /// Rows in the partition streams now: queued or in flight.
    pub queued: Option<u64>,
}

impl FleetTotals {
    /// The partition streams hold no row: nothing is queued, for anyone.
    pub fn streams_empty(&self) -> bool {
        self.queued == Some(0)
    }
}

/// Dead letters as the dead-letter stream holds them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeadLetterStatus {
    /// Letters kept now (not yet replayed or purged); `None`: unknown.
    pub held: Option<u64>,
    /// How many of the newest held letters `by_reason` counts (at most
    /// `REASON_SCAN`); `None`: not read.
    pub scanned: Option<u64>,
    /// The scanned letters by plugin and reason, most first.
    pub by_reason: Vec<ReasonCount>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReasonCount {
    /// The plugin that gave up on the rows; `None`: the host did.
    pub plugin: Option<String>,
    /// The reason, cut at 120 characters.
    pub reason: String,
    pub count: u64,
}

/// One tenant's queued rows and bytes fleet-wide, and what it sent in the
/// last second.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TenantUsage {
    pub tenant: String,
    pub queued_rows: u64,
    pub queued_bytes: u64,
    pub recent_rows: u64,
    pub recent_bytes: u64,
}

/// The fleet as the answering host sees it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FleetStatus {
    /// The answering host's member id.
    pub me: String,
    /// Whether it currently acts as a member (holds its lease).
    pub member: bool,
    /// False while NATS is disconnected or did not answer this report:
    /// members and owners are as last seen, and may have changed since.
    #[serde(default = "yes")]
    pub current: bool,
    pub members: Vec<MemberStatus>,
    /// Consumers of the units no live member holds.
    pub unowned: Vec<String>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberStatus {
    pub id: String,
    pub http: String,
    /// Milliseconds since the member started.
    pub age_ms: u64,
    /// The plugin versions the member runs, by name.
    #[serde(default)]
    pub plugins: std::collections::BTreeMap<String, String>,
    /// Milliseconds since the server stored its last key renewal, by the
    /// answering host's clock (read per report: renewals reach only the
    /// hosts that follow the member's key).
    #[serde(default)]
    pub renewed_ms_ago: Option<u64>,
    /// Its renewal is overdue: stopped, frozen or cut off, it is still a
    /// member until its key expires (and its units move).
    #[serde(default)]
    pub late: bool,
}

impl StatusReport {
    /// True when every unit's backlog is known to be empty and nothing is
    /// in flight: an unknown backlog is not a drained one. Rows the streams
    /// still hold (an ack the server had not applied when it was read) are
    /// not drained either.
    pub fn drained(&self) -> bool {
        self.units
            .iter()
            .all(|unit| unit.pending == Some(0) && unit.ack_pending == Some(0))
            && self.totals.queued.is_none_or(|rows| rows == 0)
    }

    /// Rows waiting or in flight on every unit; `None` when any unit's is
    /// unknown (a partial sum would read as a smaller backlog).
    pub fn backlog(&self) -> Option<u64> {
        self.units
            .iter()
            .map(|u| Some(u.pending? + u.ack_pending?))
            .sum()
    }

    /// Why the fleet is not drained, in a few words.
    pub fn not_drained_because(&self) -> String {
        match self.backlog() {
            None if !self.nats.connected => "backlog unknown: NATS is disconnected".to_string(),
            None => "backlog unknown: NATS did not answer in time".to_string(),
            Some(0) => format!(
                "{} rows still in the streams (acks not yet applied)",
                known(self.totals.queued)
            ),
            Some(rows) => format!("{rows} rows not yet settled"),
        }
    }

    /// The one-line summary `weir status` prints: fleet-wide counts, `?`
    /// for what is unknown.
    pub fn summary(&self) -> String {
        let counted = |count: usize, what: &str| plural(count, what, &format!("{what}s"));
        let totals = &self.totals;
        let fleet = format!(
            "{}, {}",
            counted(self.fleet.members.len(), "member"),
            counted(self.fleet.unowned.len(), "unowned unit")
        );
        let fleet = if !self.nats.connected {
            format!("members ? (NATS disconnected; last seen: {fleet})")
        } else if !self.fleet.current {
            format!("members ? (NATS did not answer in time; last seen: {fleet})")
        } else {
            fleet
        };
        format!(
            "accepted {}, delivered {}, dead-lettered {}, backlog {}; {fleet}",
            known(totals.accepted),
            known(totals.delivered),
            known(totals.dead_lettered),
            known(self.backlog()),
        )
    }
}

/// A count, or `?` when unknown.
pub fn known(count: Option<u64>) -> String {
    count.map_or_else(|| "?".to_string(), |count| count.to_string())
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RowCounts {
    pub accepted: u64,
    pub delivered: u64,
    /// Acked because a transform dropped them; absent from older hosts.
    #[serde(default)]
    pub dropped: u64,
    pub dead_lettered: u64,
    pub retried: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UnitStatus {
    pub consumer: String,
    /// Rows stored but not yet delivered; `None` when NATS did not answer.
    pub pending: Option<u64>,
    /// Rows delivered to this unit's worker and not yet acked.
    pub ack_pending: Option<u64>,
    /// The live member that pulls this unit; `None`: unowned.
    #[serde(default)]
    pub owner: Option<String>,
    /// Milliseconds since the owner claimed the unit.
    #[serde(default)]
    pub owned_for_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NatsStatus {
    /// Credentials redacted; empty unless asked with an admin key.
    pub url: String,
    /// The client's connection state when the report was made.
    pub connected: bool,
    /// Whether every read this report made answered within
    /// `NATS_READ_TIMEOUT` (false while disconnected: nothing was asked).
    #[serde(default)]
    pub answered: bool,
    /// True when weir runs its own nats-server.
    pub embedded: bool,
    /// The embedded server's durability (`always` or `periodic`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync: Option<String>,
}

/// Everything needed to build a report; cheap to clone.
#[derive(Clone)]
pub struct StatusSource {
    pub(crate) metrics: Metrics,
    pub(crate) registry: Arc<Registry>,
    /// The running generation: always the plugin versions running now.
    pub(crate) generations: watch::Receiver<Arc<Generation>>,
    pub(crate) client: async_nats::Client,
    pub(crate) router: Names,
    pub(crate) nats: NatsStatus,
    pub(crate) fleet: watch::Receiver<Arc<FleetView>>,
    pub(crate) ledger: Ledger,
    /// The fleet's queued rows, sampled from `ledger` (the page's chart).
    pub(crate) queued_history: crate::ops::history::QueuedHistory,
    /// The fleet's releases and each member's canary counts, as the
    /// coordination watch brings them.
    pub(crate) releases: watch::Receiver<BTreeMap<String, Release>>,
    pub(crate) tallies: watch::Receiver<Tallies>,
    /// The last reason counts and the dead-letter stream state they were
    /// read at: read again only when that state changed.
    pub(crate) reasons: Arc<Mutex<Option<ReasonScan>>>,
}

impl StatusSource {
    /// The running plugins, each with its canary (both versions' fleet-wide
    /// counts) and how its last canary ended.
    fn plugin_status(&self) -> Vec<PluginStatus> {
        let mut plugins = self.generations.borrow().plugin_status();
        let releases = self.releases.borrow();
        let tallies = self.tallies.borrow();
        for plugin in &mut plugins {
            let Some(release) = releases.get(&plugin.name) else {
                continue;
            };
            plugin.last_canary = release.ended.clone();
            plugin.canary = release.canary.as_ref().map(|canary| {
                let reports = tallies
                    .get(&plugin.name)
                    .into_iter()
                    .flat_map(|m| m.values());
                let (serving, candidate) = fleet_tally(canary, reports.clone());
                CanaryStatus {
                    shadow: canary.shadow.then(|| fleet_diff(canary, reports)),
                    version: version_of_digest(&canary.digest).to_string(),
                    serves: canary.describe(),
                    started_ms: canary.started_ms,
                    auto: canary.auto.clone(),
                    serving,
                    candidate,
                }
            });
        }
        plugins
    }
}

/// Reason counts read at a dead-letter stream state (last sequence, kept).
#[derive(Clone)]
pub(crate) struct ReasonScan {
    at: (u64, u64),
    scanned: u64,
    by_reason: Vec<ReasonCount>,
}

/// Pending and ack-pending rows by consumer name.
pub type Backlogs = HashMap<String, (u64, u64)>;

/// What one report read from NATS; each part `None` when it did not
/// answer in time.
#[derive(Default)]
struct NatsReads {
    /// Per partition: (last sequence, messages) and its consumers' backlogs.
    partitions: Vec<Option<((u64, u64), Backlogs)>>,
    /// The dead-letter stream's (last sequence, messages).
    dead_letters: Option<(u64, u64)>,
    reasons: Option<ReasonScan>,
}

/// When the server stored each member's last key renewal (members whose
/// key did not answer, or is gone, are left out).
type Renewals = BTreeMap<String, SystemTime>;

impl NatsReads {
    /// Whether every count and backlog was read. Reasons are not needed:
    /// a scan refused (a user without the DLQ reader's permissions) leaves
    /// only them unknown.
    fn answered(&self, partitions: u32) -> bool {
        self.partitions.len() == partitions as usize
            && self.partitions.iter().all(Option::is_some)
            && self.dead_letters.is_some()
    }

    fn totals(&self) -> FleetTotals {
        let streams: Option<Vec<(u64, u64)>> = self
            .partitions
            .iter()
            .map(|p| p.as_ref().map(|(state, _)| *state))
            .collect();
        let streams = streams.filter(|s| !s.is_empty());
        let accepted = streams
            .as_ref()
            .map(|s| s.iter().map(|(last, _)| last).sum());
        let queued: Option<u64> = streams.as_ref().map(|s| s.iter().map(|(_, n)| n).sum());
        let settled = accepted
            .zip(queued)
            .map(|(a, q): (u64, u64)| a.saturating_sub(q));
        let dead_lettered = self.dead_letters.map(|(last, _)| last);
        FleetTotals {
            accepted,
            settled,
            // A letter is stored before its row is acked: for that moment
            // it is dead-lettered and not yet settled, hence saturating.
            delivered: settled.zip(dead_lettered).map(|(s, d)| s.saturating_sub(d)),
            dead_lettered,
            queued,
        }
    }
}

impl StatusSource {
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// Whether the NATS connection is up now.
    pub fn nats_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// This host's row counters alone: no request to NATS.
    pub fn rows(&self) -> RowCounts {
        let metrics = &self.metrics;
        RowCounts {
            accepted: metrics.rows_accepted.get(),
            delivered: metrics.rows_delivered.get(),
            dropped: metrics.rows_dropped.get(),
            dead_lettered: metrics.rows_dead_lettered.get(),
            retried: metrics.rows_retried.get(),
        }
    }

    /// The fleet as this host's watch shows it: no request to NATS.
    pub fn fleet(&self) -> Arc<FleetView> {
        self.fleet.borrow().clone()
    }

    /// The whole report, within `NATS_READ_TIMEOUT` (at once while NATS is
    /// disconnected).
    pub async fn report(&self) -> StatusReport {
        let connected = self.nats_connected();
        let (reads, renewals) = if connected {
            let members: Vec<String> = self.fleet().members.keys().cloned().collect();
            self.read_nats(Instant::now() + NATS_READ_TIMEOUT, &members)
                .await
        } else {
            Default::default()
        };
        let answered = connected && reads.answered(self.router.partitions());
        let backlogs: Backlogs = reads
            .partitions
            .iter()
            .flatten()
            .flat_map(|(_, backlogs)| backlogs.iter().map(|(k, v)| (k.clone(), *v)))
            .collect();
        let fleet = self.fleet();
        let now = SystemTime::now();
        let now_ms = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let all_units = self.router.units();
        let units = all_units
            .iter()
            .map(|&unit| {
                let consumer = self.router.unit_consumer(unit);
                let backlog = backlogs.get(&consumer);
                let owner = fleet.owner(unit).map(str::to_string);
                let owned_for_ms = owner
                    .as_ref()
                    .and_then(|_| fleet.owners.get(&unit))
                    .map(|(record, _)| now_ms.saturating_sub(record.since_ms));
                UnitStatus {
                    pending: backlog.map(|b| b.0),
                    ack_pending: backlog.map(|b| b.1),
                    consumer,
                    owner,
                    owned_for_ms,
                }
            })
            .collect();
        let fleet_status = FleetStatus {
            me: fleet.me.clone(),
            member: fleet.member,
            // The watch goes quiet when NATS does, without a word.
            current: connected && answered,
            members: fleet
                .members
                .iter()
                .filter(|(id, _)| fleet.is_live(id))
                .map(|(id, record)| {
                    let renewed = renewals
                        .get(id)
                        .map(|at| now.duration_since(*at).unwrap_or(Duration::ZERO));
                    MemberStatus {
                        id: id.clone(),
                        http: record.http.clone(),
                        age_ms: now_ms.saturating_sub(record.since_ms),
                        plugins: record.plugins.clone(),
                        renewed_ms_ago: renewed.map(|d| d.as_millis() as u64),
                        late: renewed.is_some_and(|since| record.renewal_overdue(since)),
                    }
                })
                .collect(),
            unowned: fleet
                .unowned(&all_units)
                .into_iter()
                .map(|unit| self.router.unit_consumer(unit))
                .collect(),
        };
        let dead_letters = DeadLetterStatus {
            held: reads.dead_letters.map(|(_, held)| held),
            scanned: reads.reasons.as_ref().map(|scan| scan.scanned),
            by_reason: reads
                .reasons
                .as_ref()
                .map(|scan| scan.by_reason.clone())
                .unwrap_or_default(),
        };
        let totals = reads.totals();
        // Streams that hold no row leave no tenant anything queued, though
        // this host's ledger counts the accepts its next snapshot (within
        // a second) would drop: the streams are the truth.
        let streams_empty = totals.streams_empty();
        StatusReport {
            rows: self.rows(),
            totals,
            fleet: fleet_status,
            units,
            plugins: self.plugin_status(),
            nats: NatsStatus {
                connected,
                answered,
                ..self.nats.clone()
            },
            tenants: self
                .ledger
                .tenants()
                .into_iter()
                .map(|(tenant, usage)| TenantUsage {
                    tenant,
                    queued_rows: if streams_empty { 0 } else { usage.queued.rows },
                    queued_bytes: if streams_empty { 0 } else { usage.queued.bytes },
                    recent_rows: usage.recent.rows,
                    recent_bytes: usage.recent.bytes,
                })
                .collect(),
            usage_age_ms: self.ledger.snapshot_age().map(|age| age.as_millis() as u64),
            dead_letters,
        }
    }

    /// Every read a report needs, all at once, each given up at `deadline`.
    async fn read_nats(&self, deadline: Instant, members: &[String]) -> (NatsReads, Renewals) {
        let js = jetstream::new(self.client.clone());
        let partitions = futures::future::join_all((0..self.router.partitions()).map(|p| {
            let name = self.router.partition_stream(p);
            let js = &js;
            async move {
                tokio::time::timeout_at(deadline, partition_reads(js, name))
                    .await
                    .ok()
                    .flatten()
            }
        }));
        let dead_letters = self.dead_letter_reads(&js, deadline);
        let renewals = tokio::time::timeout_at(deadline, self.renewal_reads(&js, members));
        let (partitions, dead_letters, renewals) = tokio::join!(partitions, dead_letters, renewals);
        let (dead_letters, reasons) = dead_letters.unzip();
        let reads = NatsReads {
            partitions,
            dead_letters,
            reasons: reasons.flatten(),
        };
        (reads, renewals.unwrap_or_default())
    }

    /// When the server stored each member's last key renewal: one direct
    /// get per member, at once.
    async fn renewal_reads(&self, js: &jetstream::Context, members: &[String]) -> Renewals {
        let bucket = self.router.coordination_bucket();
        let Ok(stream) = js.get_stream_no_info(format!("KV_{bucket}")).await else {
            return BTreeMap::new();
        };
        let reads = members.iter().map(|member| {
            let subject = format!("$KV.{bucket}.{MEMBERS}{member}");
            let stream = &stream;
            async move {
                let message = stream.direct_get_last_for_subject(subject).await.ok()?;
                // A delete or expiry marker: no renewal stands.
                let marker = message
                    .headers
                    .get("KV-Operation")
                    .is_some_and(|op| op.as_str() != "PUT");
                (!marker && !message.payload.is_empty())
                    .then(|| (member.clone(), SystemTime::from(message.time)))
            }
        });
        futures::future::join_all(reads)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// The dead-letter stream's (last sequence, messages) and its reason
    /// counts (from the last report when the stream has not changed).
    async fn dead_letter_reads(
        &self,
        js: &jetstream::Context,
        deadline: Instant,
    ) -> Option<((u64, u64), Option<ReasonScan>)> {
        let stream = js.get_stream(self.router.dead_letter_stream());
        let mut stream = tokio::time::timeout_at(deadline, stream).await.ok()?.ok()?;
        let state = &stream.cached_info().state;
        let at = (state.last_sequence, state.messages);
        let first = state.first_sequence;
        let cached = self.reasons.lock().ok().and_then(|cache| cache.clone());
        if let Some(scan) = cached.filter(|scan| scan.at == at) {
            return Some((at, Some(scan)));
        }
        // A scan cut short (or refused) leaves the counts above known.
        let scan = tokio::time::timeout_at(deadline, scan_reasons(&mut stream, at, first))
            .await
            .ok()
            .flatten();
        if let (Some(scan), Ok(mut cache)) = (&scan, self.reasons.lock()) {
            *cache = Some(scan.clone());
        }
        Some((at, scan))
    }
}

/// Every unit's backlog by consumer name, from one paged consumer listing
/// per partition (256 units a request); a partition that did not answer
/// is left out. Unbounded in time: for benches and tools, not reports.
pub async fn unit_backlogs(client: &async_nats::Client, router: &Names) -> Backlogs {
    let js = jetstream::new(client.clone());
    let mut backlogs = Backlogs::new();
    for partition in 0..router.partitions() {
        if let Some((_, found)) = partition_reads(&js, router.partition_stream(partition)).await {
            backlogs.extend(found);
        }
    }
    backlogs
}

/// One partition stream's (last sequence, messages) and its consumers'
/// backlogs, from its info and one paged consumer listing (256 a request).
async fn partition_reads(js: &jetstream::Context, name: String) -> Option<((u64, u64), Backlogs)> {
    use futures::StreamExt;
    let stream = js.get_stream(name).await.ok()?;
    let state = &stream.cached_info().state;
    let counts = (state.last_sequence, state.messages);
    let mut backlogs = Backlogs::new();
    let mut consumers = stream.consumers();
    while let Some(info) = consumers.next().await {
        // A listing cut short would leave units unknown, not empty.
        let info = info.ok()?;
        backlogs.insert(info.name, (info.num_pending, info.num_ack_pending as u64));
    }
    Some((counts, backlogs))
}

/// Counts the newest (at most `REASON_SCAN`) letters by plugin and reason,
/// reading their headers only through an ordered consumer.
async fn scan_reasons(
    stream: &mut jetstream::stream::Stream,
    at: (u64, u64),
    first: u64,
) -> Option<ReasonScan> {
    use futures::StreamExt;
    use jetstream::consumer::{DeliverPolicy, pull};
    let (last, held) = at;
    let mut scan = ReasonScan {
        at,
        scanned: 0,
        by_reason: Vec::new(),
    };
    if held == 0 {
        return Some(scan);
    }
    // Every held letter when they are few; else the last `REASON_SCAN`
    // sequences (replayed letters leave gaps, so maybe fewer letters).
    let deliver_policy = if held <= REASON_SCAN {
        DeliverPolicy::All
    } else {
        DeliverPolicy::ByStartSequence {
            start_sequence: last.saturating_sub(REASON_SCAN - 1).max(first),
        }
    };
    let reader = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: String::new(),
            deliver_policy,
            headers_only: true,
            description: Some("weir status: dead letters by reason".into()),
            ..Default::default()
        })
        .await
        .ok()?;
    // What the server counted at creation bounds the read: it never waits
    // for letters that are not there.
    let mut to_read = reader.cached_info().num_pending.min(REASON_SCAN);
    if to_read == 0 {
        return Some(scan);
    }
    let mut messages = reader.messages().await.ok()?;
    let mut counts: BTreeMap<(Option<String>, String), u64> = BTreeMap::new();
    while let Some(message) = messages.next().await {
        let message = message.ok()?;
        let info = message.info().ok()?;
        let (sequence, pending) = (info.stream_sequence, info.pending);
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_string())
        };
        let reason: String = header(headers::REASON)
            .unwrap_or_default()
            .chars()
            .take(REASON_CHARS)
            .collect();
        *counts.entry((header(headers::PLUGIN), reason)).or_default() += 1;
        scan.scanned += 1;
        to_read -= 1;
        // Letters stored after the state read are left for the next scan.
        if to_read == 0 || pending == 0 || sequence >= last {
            break;
        }
    }
    let mut by_reason: Vec<ReasonCount> = counts
        .into_iter()
        .map(|((plugin, reason), count)| ReasonCount {
            plugin,
            reason,
            count,
        })
        .collect();
    by_reason.sort_by_key(|count| std::cmp::Reverse(count.count));
    scan.by_reason = by_reason;
    Some(scan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(last: u64, messages: u64) -> Option<((u64, u64), Backlogs)> {
        Some(((last, messages), Backlogs::new()))
    }

    #[test]
    fn totals_come_from_stream_sequences_and_what_did_not_answer_stays_unknown() {
        let reads = NatsReads {
            partitions: vec![partition(10, 2), partition(5, 0)],
            dead_letters: Some((3, 1)),
            reasons: None,
        };
        assert_eq!(
            reads.totals(),
            FleetTotals {
                accepted: Some(15),
                settled: Some(13),
                delivered: Some(10),
                dead_lettered: Some(3),
                queued: Some(2),
            }
        );
        // One partition silent: no partial sum passes for the fleet's.
        let reads = NatsReads {
            partitions: vec![partition(10, 2), None],
            dead_letters: Some((3, 1)),
            reasons: None,
        };
        let totals = reads.totals();
        assert_eq!((totals.accepted, totals.delivered), (None, None));
        assert_eq!(totals.dead_lettered, Some(3));
        assert!(!reads.answered(2));
        // Disconnected: nothing was read, nothing is known.
        assert_eq!(NatsReads::default().totals(), FleetTotals::default());
    }

    fn report(units: &[(Option<u64>, Option<u64>)], connected: bool) -> StatusReport {
        let units: Vec<serde_json::Value> = units
            .iter()
            .map(|(pending, ack_pending)| {
                serde_json::json!({"consumer": "c", "pending": pending, "ack_pending": ack_pending})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "rows": {"accepted": 0, "delivered": 0, "dropped": 0, "dead_lettered": 0, "retried": 0},
            "units": units,
            "plugins": [],
            "nats": {"url": "", "connected": connected, "answered": connected, "embedded": false},
        }))
        .expect("a report")
    }

    #[test]
    fn a_backlog_with_one_unknown_unit_is_unknown_and_not_drained() {
        let known = report(&[(Some(0), Some(0)), (Some(3), Some(1))], true);
        assert_eq!(known.backlog(), Some(4));
        assert!(!known.drained());
        assert_eq!(known.not_drained_because(), "4 rows not yet settled");
        let partial = report(&[(Some(0), Some(0)), (None, None)], false);
        assert_eq!(partial.backlog(), None);
        assert!(!partial.drained());
        assert!(
            partial.summary().contains("backlog ?;"),
            "{}",
            partial.summary()
        );
        assert!(partial.summary().starts_with("accepted ?, delivered ?"));
        assert_eq!(
            partial.not_drained_because(),
            "backlog unknown: NATS is disconnected"
        );
        assert!(report(&[(Some(0), Some(0))], true).drained());
    }

    #[test]
    fn rows_the_streams_still_hold_are_not_drained_though_no_unit_has_a_backlog() {
        let mut held = report(&[(Some(0), Some(0))], true);
        held.totals.queued = Some(2);
        assert!(!held.drained());
        assert_eq!(
            held.not_drained_because(),
            "2 rows still in the streams (acks not yet applied)"
        );
        held.totals.queued = Some(0);
        assert!(held.drained());
    }
}
