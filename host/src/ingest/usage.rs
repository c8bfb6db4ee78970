//! Fleet-wide usage per tenant: rows and bytes queued (accepted, not yet
//! acked or dead-lettered) across every host and partition, and what was
//! accepted lately, for the budget policy.
//!
//! The streams are the truth, read only where something happened. Every
//! host shares what it does as it does it (`<prefix>.usage.accepts`, core
//! NATS): the rows it accepted, right after each PubAck, each tagged with
//! the stream sequence of its PubAck, and (at most every 250 ms) the
//! partitions whose rows its workers settled. The fleet's leader (its first live member) marks those
//! partitions, and once a second re-reads the per-subject counts of the
//! marked ones only (twice: the second read catches acks the server had
//! not applied at the first), then writes a snapshot (`usage.snapshot` in
//! the coordination bucket) with each stream's last sequence when it
//! changed. Every `SLOW_CHECK` it asks for every partition's state in one
//! listing and re-reads those that differ from what it holds (rows a host
//! stored and crashed before sharing, a lost message, a purge), and writes
//! the snapshot again, so every host sees one at least that often. An idle
//! fleet thus reads nothing per partition. Between snapshots every host
//! adds the accepts since: its own at once, the others' as they arrive; a
//! snapshot that covers one drops it exactly. Nothing is kept per host that
//! a crash could lose: after a crash, the next snapshot is right again.
//! Rows settled since the last snapshot still count until the next one
//! (about a second). A host whose accepts no snapshot covered within
//! `STALE_AFTER` (a leader gone), or that saw none for
//! `SLOW_CHECK + STALE_AFTER`, reads every stream itself.
//!
//! A snapshot counts rows exactly; a stream does not keep bytes per
//! subject, so a tenant's queued bytes are its rows times its mean row size
//! (from the accepts the fleet shared, else the partition's mean).
//!
//! The ledger also holds each tenant's settings (written by `weir tenant`,
//! see [`super::tenants`]) as the coordination watch brings them.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_nats::Client;
use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::coordination::{FleetView, KeyFollower};
use crate::nats::jetstream::api_error;
use crate::nats::kv::{Entry, KvWrite, NatsKv};
use crate::topology::route::Names;

use super::tenants::{TENANTS, tenant_of_key};

/// Key prefix of the usage snapshot in the coordination bucket.
pub const USAGE: &str = "usage.";
/// The snapshot's key.
const SNAPSHOT_KEY: &str = "usage.snapshot";
/// How often the leader re-reads the partitions something happened in.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(1);
/// How often the leader checks every partition's state in one listing.
pub const SLOW_CHECK: Duration = Duration::from_secs(10);
/// How often settled partitions are shared when no accept carries them.
const SETTLED_SHARE: Duration = Duration::from_millis(250);
/// Reads of a partition after something happened in it: the second catches
/// acks the server had not applied yet at the first.
const READS_PER_CHANGE: u8 = 2;
/// The window of `recent-rows`/`recent-bytes`.
pub const RATE_WINDOW: Duration = Duration::from_secs(1);
/// Accepts no snapshot covered for this long (or no snapshot for
/// `SLOW_CHECK` plus this long): any host reads the streams itself.
const STALE_AFTER: Duration = Duration::from_secs(3);

/// Rows and their payload bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queued {
    pub rows: u64,
    pub bytes: u64,
}

impl Queued {
    fn add(&mut self, other: Queued) {
        self.rows = self.rows.saturating_add(other.rows);
        self.bytes = self.bytes.saturating_add(other.bytes);
    }
}

/// What a tenant has queued and sent lately, fleet-wide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub queued: Queued,
    pub recent: Queued,
}

/// Rows of one tenant one request stored in one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accept {
    pub tenant: String,
    pub partition: u32,
    /// The highest stream sequence among them.
    pub last_seq: u64,
    pub rows: u64,
    pub bytes: u64,
}

impl Accept {
    fn amount(&self) -> Queued {
        Queued {
            rows: self.rows,
            bytes: self.bytes,
        }
    }
}

/// The streams' truth at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Who took it.
    pub by: String,
    /// Each partition stream's last sequence when it was read.
    pub last_seq: Vec<u64>,
    pub tenants: BTreeMap<String, Queued>,
}

impl Snapshot {
    fn covers(&self, accept: &Accept) -> bool {
        self.last_seq
            .get(accept.partition as usize)
            .is_some_and(|last| accept.last_seq <= *last)
    }

    /// Streams only grow their sequences: a snapshot older in any partition
    /// than the one held (two leaders for a moment) is ignored.
    fn is_newer_than(&self, other: &Snapshot) -> bool {
        if other.last_seq.is_empty() {
            return true;
        }
        self.last_seq.len() == other.last_seq.len()
            && self
                .last_seq
                .iter()
                .zip(&other.last_seq)
                .all(|(mine, theirs)| mine >= theirs)
    }
}

/// What a host shares with the others after its PubAcks and settlements.
#[derive(Debug, Serialize, Deserialize)]
struct Shared {
    host: String,
    accepts: Vec<Accept>,
    /// Partitions whose rows this host's workers settled.
    #[serde(default)]
    settled: Vec<u32>,
    /// Rows this host's workers delivered since its last share (absent
    /// from older hosts): the fleet's delivered rate on every host's page.
    #[serde(default)]
    delivered: u64,
}

/// Rows the fleet accepted and delivered since this host started, as the
/// hosts shared them (core NATS: a share lost on the way is not counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    pub accepted: u64,
    pub delivered: u64,
}

/// One host's view of fleet-wide usage. Cheap to clone.
#[derive(Clone)]
pub struct Ledger {
    me: String,
    state: Arc<Mutex<State>>,
    /// Wakes the task that shares the outbox.
    to_share: Arc<Notify>,
}

#[derive(Default)]
struct State {
    snapshot: Snapshot,
    snapshot_at: Option<Instant>,
    /// Accepts no snapshot covers yet, by tenant.
    pending: HashMap<String, Pending>,
    /// Admitted requests of this host still being published.
    reserved: HashMap<String, Queued>,
    /// Accepts within the rate window, by tenant.
    recent: HashMap<String, Window>,
    /// Everything accepted fleet-wide since this host started, by tenant:
    /// the mean row size a snapshot's bytes are estimated with.
    accepted: HashMap<String, Queued>,
    /// This host's accepts not shared yet.
    outbox: Vec<Accept>,
    /// Partitions this host settled rows of, not shared yet.
    settled_outbox: BTreeSet<u32>,
    /// Rows this host delivered, not shared yet.
    delivered_outbox: u64,
    /// Rows accepted and delivered fleet-wide since this host started.
    moved: Moved,
    /// Partitions something happened in, and how many reads they still
    /// get (the leader's work).
    changed: BTreeMap<u32, u8>,
    /// Since when accepts wait for a snapshot to cover them.
    waiting_since: Option<Instant>,
    /// `tenants.<tenant>` settings from the coordination bucket.
    settings: HashMap<String, Arc<str>>,
}

impl Ledger {
    pub fn new(me: &str) -> Ledger {
        Ledger {
            me: me.to_string(),
            state: Arc::default(),
            to_share: Arc::new(Notify::new()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain counters behind: keep going.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The tenant's fleet-wide usage now.
    pub fn usage(&self, tenant: &str) -> Usage {
        let mut state = self.state();
        let mut queued = state
            .snapshot
            .tenants
            .get(tenant)
            .copied()
            .unwrap_or_default();
        if let Some(pending) = state.pending.get(tenant) {
            queued.add(pending.total);
        }
        if let Some(reserved) = state.reserved.get(tenant) {
            queued.add(*reserved);
        }
        let recent = state
            .recent
            .get_mut(tenant)
            .map(|window| {
                window.prune(Instant::now());
                window.total
            })
            .unwrap_or_default();
        Usage { queued, recent }
    }

    /// Every tenant with rows queued or sent lately, by name.
    pub fn tenants(&self) -> Vec<(String, Usage)> {
        let names: std::collections::BTreeSet<String> = {
            let state = self.state();
            state
                .snapshot
                .tenants
                .keys()
                .chain(state.pending.keys())
                .chain(state.reserved.keys())
                .chain(state.recent.keys())
                .cloned()
                .collect()
        };
        names
            .into_iter()
            .map(|tenant| {
                let usage = self.usage(&tenant);
                (tenant, usage)
            })
            .filter(|(_, usage)| *usage != Usage::default())
            .collect()
    }

    /// The tenant's settings from the coordination bucket, if set.
    pub fn tenant_settings(&self, tenant: &str) -> Option<Arc<str>> {
        self.state().settings.get(tenant).cloned()
    }

    /// Counts an admitted request as queued while it is being published, so
    /// concurrent requests on this host see each other. Released on drop.
    pub fn reserve(&self, tenant: &str, amount: Queued) -> Reservation {
        self.state()
            .reserved
            .entry(tenant.to_string())
            .or_default()
            .add(amount);
        Reservation {
            ledger: self.clone(),
            tenant: tenant.to_string(),
            amount,
        }
    }

    /// Rows this host stored: counted at once, shared with the others
    /// right away (accepts that pile up meanwhile go in one message).
    pub fn accepted(&self, accepts: Vec<Accept>) {
        if accepts.is_empty() {
            return;
        }
        let mut state = self.state();
        for accept in accepts {
            state.outbox.push(accept.clone());
            state.record(accept, Instant::now());
        }
        drop(state);
        self.to_share.notify_one();
    }

    /// This host's workers settled rows of `partition`, `delivered` of them
    /// delivered: its counts change (the leader re-reads it). Shared with
    /// the next accepts, or within `SETTLED_SHARE`: one message per batch
    /// would reach every host.
    pub fn settled(&self, partition: u32, delivered: u64) {
        let mut state = self.state();
        state.changed_in(partition);
        state.settled_outbox.insert(partition);
        state.delivered_outbox = state.delivered_outbox.saturating_add(delivered);
        state.moved.delivered = state.moved.delivered.saturating_add(delivered);
    }

    /// Rows accepted and delivered fleet-wide since this host started.
    pub fn moved(&self) -> Moved {
        self.state().moved
    }

    /// Another host's accepts and settlements.
    fn shared(&self, shared: Shared) {
        if shared.host == self.me {
            return;
        }
        let mut state = self.state();
        let now = Instant::now();
        for accept in shared.accepts {
            state.record(accept, now);
        }
        for partition in shared.settled {
            state.changed_in(partition);
        }
        state.moved.delivered = state.moved.delivered.saturating_add(shared.delivered);
    }

    /// A snapshot from the coordination bucket (or taken here).
    pub fn apply_snapshot(&self, snapshot: Snapshot) {
        let mut state = self.state();
        if !snapshot.is_newer_than(&state.snapshot) {
            return;
        }
        for pending in state.pending.values_mut() {
            pending.accepts.retain(|accept| !snapshot.covers(accept));
            pending.total = Queued::default();
            for accept in &pending.accepts {
                pending.total.add(accept.amount());
            }
        }
        state
            .pending
            .retain(|_, pending| !pending.accepts.is_empty());
        state.snapshot = snapshot;
        let now = Instant::now();
        state.snapshot_at = Some(now);
        // What still waits came after this snapshot: the next one is due.
        state.waiting_since = (!state.pending.is_empty()).then_some(now);
    }

    /// What this host has not shared yet; `None`: nothing.
    fn take_outbox(&self) -> Option<Shared> {
        let mut state = self.state();
        let accepts = std::mem::take(&mut state.outbox);
        let settled = std::mem::take(&mut state.settled_outbox);
        let delivered = std::mem::take(&mut state.delivered_outbox);
        (!accepts.is_empty() || !settled.is_empty() || delivered > 0).then(|| Shared {
            host: self.me.clone(),
            accepts,
            settled: settled.into_iter().collect(),
            delivered,
        })
    }

    /// Time since this host applied the last usage snapshot (`None`: none
    /// yet): how stale queued counts may be, e.g. while NATS is down. The
    /// leader writes one at least every `SLOW_CHECK`.
    pub fn snapshot_age(&self) -> Option<Duration> {
        self.state().snapshot_at.map(|at| at.elapsed())
    }

    /// Whether this host should read the streams itself: accepts waited
    /// `STALE_AFTER` for a snapshot, or none came for
    /// `SLOW_CHECK` plus that (a leader gone, or none yet).
    fn stale(&self, started: Instant) -> bool {
        let state = self.state();
        let waited = state
            .waiting_since
            .is_some_and(|since| since.elapsed() > STALE_AFTER);
        let silent = state.snapshot_at.unwrap_or(started).elapsed() > SLOW_CHECK + STALE_AFTER;
        waited || silent
    }

    /// The partitions to read now (each read counted down).
    fn take_changed(&self) -> Vec<u32> {
        let mut state = self.state();
        let partitions: Vec<u32> = state.changed.keys().copied().collect();
        state.changed.retain(|_, reads| {
            *reads -= 1;
            *reads > 0
        });
        partitions
    }

    /// Mean payload bytes of each tenant's rows, from what the fleet
    /// accepted: read once per snapshot, not once per subject.
    fn mean_row_bytes(&self) -> HashMap<String, f64> {
        self.state()
            .accepted
            .iter()
            .filter(|(_, accepted)| accepted.rows > 0)
            .map(|(tenant, accepted)| {
                (tenant.clone(), accepted.bytes as f64 / accepted.rows as f64)
            })
            .collect()
    }

    /// Shares this host's accepts and settlements, follows the others',
    /// and (as the leader) reconciles from the streams, until `stop`.
    pub async fn run(
        self,
        client: Client,
        kv: NatsKv,
        router: Names,
        fleet: watch::Receiver<Arc<FleetView>>,
        stop: CancellationToken,
    ) {
        let subject = router.usage_subject();
        let mut incoming = match client.subscribe(subject.clone()).await {
            Ok(subscription) => Some(subscription),
            Err(err) => {
                tracing::error!(error = %err, "cannot follow the fleet's accepts; usage lags by a snapshot");
                None
            }
        };
        let started = Instant::now();
        let mut reader = Reader::default();
        let mut reconcile = tokio::time::interval(RECONCILE_INTERVAL);
        reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut share_settled = tokio::time::interval(SETTLED_SHARE);
        share_settled.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                Some(message) = async {
                    match incoming.as_mut() {
                        Some(subscription) => subscription.next().await,
                        None => std::future::pending().await,
                    }
                } => match serde_json::from_slice::<Shared>(&message.payload) {
                    Ok(shared) => self.shared(shared),
                    Err(err) => tracing::debug!(error = %err, "ignoring an unreadable usage message"),
                },
                _ = async {
                    tokio::select! {
                        _ = self.to_share.notified() => {}
                        _ = share_settled.tick() => {}
                    }
                } => {
                    if let Some(shared) = self.take_outbox() {
                        let payload = Bytes::from(serde_json::to_vec(&shared).unwrap_or_default());
                        tokio::select! {
                            _ = stop.cancelled() => break,
                            sent = client.publish(subject.clone(), payload) => if let Err(err) = sent {
                                tracing::debug!(error = %err, "cannot share accepts; the next snapshot counts them");
                            }
                        }
                    }
                }
                _ = reconcile.tick() => {
                    let leads = leads(&fleet.borrow(), &self.me);
                    let read = if leads {
                        self.leader_reads(&mut reader, router.partitions())
                    } else if self.stale(started) {
                        // Not the leader: what this host holds may be old.
                        reader = Reader::default();
                        Reads::All
                    } else {
                        reader = Reader::default();
                        Reads::Nothing
                    };
                    // NATS may be down: a stop does not wait for the request's timeout.
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = self.reconcile(&client, &kv, &router, &mut reader, read) => {}
                    }
                }
            }
        }
        // What is still in the outbox is in the streams: the next snapshot
        // counts it. The host flushes the client (with a timeout) after this.
    }

    /// What the leader reads this tick: everything once it starts leading,
    /// every `SLOW_CHECK` the listing, else the partitions that changed.
    fn leader_reads(&self, reader: &mut Reader, partitions: u32) -> Reads {
        if reader.partitions.len() != partitions as usize {
            self.take_changed();
            return Reads::All;
        }
        let check = reader
            .checked_at
            .is_none_or(|at| at.elapsed() >= SLOW_CHECK);
        let changed = self.take_changed();
        if check {
            Reads::Check(changed)
        } else if changed.is_empty() {
            Reads::Nothing
        } else {
            Reads::Some(changed)
        }
    }

    /// Reads what `read` says, and writes and applies the snapshot if it
    /// changed (or the slow check is due to say it still holds).
    async fn reconcile(
        &self,
        client: &Client,
        kv: &NatsKv,
        router: &Names,
        reader: &mut Reader,
        read: Reads,
    ) {
        let (partitions, checked): (Vec<u32>, bool) = match read {
            Reads::Nothing => return,
            Reads::All => ((0..router.partitions()).collect(), true),
            Reads::Some(partitions) => (partitions, false),
            Reads::Check(mut partitions) => match list_partitions(client, router).await {
                Ok(states) => {
                    for (partition, state) in states.into_iter().enumerate() {
                        let partition = partition as u32;
                        let held = reader
                            .partitions
                            .get(partition as usize)
                            .map(|read| read.state);
                        if held != Some(state) && !partitions.contains(&partition) {
                            partitions.push(partition);
                        }
                    }
                    (partitions, true)
                }
                Err(err) => {
                    tracing::warn!(error = %err, "cannot list the partition streams; reading every one");
                    ((0..router.partitions()).collect(), true)
                }
            },
        };
        if reader.partitions.len() != router.partitions() as usize {
            reader.partitions = vec![PartitionRead::default(); router.partitions() as usize];
        }
        let means = self.mean_row_bytes();
        for partition in partitions {
            match read_partition(client, router, partition, &means).await {
                Ok(read) => reader.partitions[partition as usize] = read,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot reconcile usage from the streams");
                    // Read it again next time.
                    reader.partitions.clear();
                    return;
                }
            }
        }
        if checked {
            reader.checked_at = Some(Instant::now());
        }
        let snapshot = reader.snapshot(&self.me);
        let changed = reader.written.as_ref().is_none_or(|written| {
            written.last_seq != snapshot.last_seq || written.tenants != snapshot.tenants
        });
        if changed || checked {
            if let Ok(value) = serde_json::to_vec(&snapshot)
                && let Err(err) = kv.put(SNAPSHOT_KEY, value.into()).await
            {
                tracing::warn!(error = %err, "cannot write the usage snapshot");
            }
            reader.written = Some(snapshot.clone());
        }
        self.apply_snapshot(snapshot);
    }
}

/// What a reconciliation reads.
enum Reads {
    Nothing,
    /// These partitions.
    Some(Vec<u32>),
    /// The listing of every partition's state, then these and those that
    /// differ from what was read.
    Check(Vec<u32>),
    All,
}

/// The leader's reads of each partition: the snapshot is their sum.
#[derive(Default)]
struct Reader {
    /// Empty until every partition was read once.
    partitions: Vec<PartitionRead>,
    checked_at: Option<Instant>,
    written: Option<Snapshot>,
}

impl Reader {
    fn snapshot(&self, me: &str) -> Snapshot {
        let mut tenants: BTreeMap<String, (u64, f64)> = BTreeMap::new();
        for read in &self.partitions {
            for (tenant, (rows, bytes)) in &read.tenants {
                let entry = tenants.entry(tenant.clone()).or_default();
                entry.0 += rows;
                entry.1 += bytes;
            }
        }
        Snapshot {
            by: me.to_string(),
            last_seq: self
                .partitions
                .iter()
                .map(|read| read.state.last_seq)
                .collect(),
            tenants: tenants
                .into_iter()
                .map(|(tenant, (rows, bytes))| {
                    (
                        tenant,
                        Queued {
                            rows,
                            bytes: bytes.round() as u64,
                        },
                    )
                })
                .collect(),
        }
    }
}

/// A partition stream's size: equal sizes mean nothing was stored or
/// removed in between (a work queue only appends and removes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct StreamSize {
    messages: u64,
    last_seq: u64,
}

/// One partition's counts by tenant, as read.
#[derive(Debug, Clone, Default)]
struct PartitionRead {
    state: StreamSize,
    /// Rows and estimated bytes by tenant.
    tenants: BTreeMap<String, (u64, f64)>,
}

/// Usage snapshots and tenant settings come through the host's coordination watch.
impl KeyFollower for Ledger {
    fn prefixes(&self) -> &'static [&'static str] {
        &[USAGE, TENANTS]
    }

    /// A change of `usage.` or `tenants.` keys, from the coordination watch.
    fn apply(&self, entry: &Entry) {
        if let Some(tenant) = entry.key.strip_prefix(TENANTS).and_then(tenant_of_key) {
            let mut state = self.state();
            if entry.operation.is_put() {
                let settings = Arc::from(String::from_utf8_lossy(&entry.value).as_ref());
                state.settings.insert(tenant, settings);
            } else {
                state.settings.remove(&tenant);
            }
        } else if entry.key == SNAPSHOT_KEY && entry.operation.is_put() {
            match serde_json::from_slice::<Snapshot>(&entry.value) {
                Ok(snapshot) => self.apply_snapshot(snapshot),
                Err(err) => tracing::warn!(error = %err, "ignoring an unreadable usage snapshot"),
            }
        }
    }

    /// The coordination watch starts over: settings come again in full.
    fn restart(&self) {
        self.state().settings.clear();
    }
}

impl State {
    /// Something happened in `partition`: the leader reads it (again).
    fn changed_in(&mut self, partition: u32) {
        self.changed.insert(partition, READS_PER_CHANGE);
    }

    fn record(&mut self, accept: Accept, now: Instant) {
        let amount = accept.amount();
        self.moved.accepted = self.moved.accepted.saturating_add(accept.rows);
        self.accepted
            .entry(accept.tenant.clone())
            .or_default()
            .add(amount);
        let window = self.recent.entry(accept.tenant.clone()).or_default();
        window.prune(now);
        window.entries.push_back((now, amount));
        window.total.add(amount);
        if !self.snapshot.covers(&accept) {
            // An accept always moves its stream's last sequence: the
            // leader's next snapshot covers it, or this host reads itself.
            self.changed_in(accept.partition);
            self.waiting_since.get_or_insert(now);
            let pending = self.pending.entry(accept.tenant.clone()).or_default();
            pending.total.add(amount);
            pending.accepts.push(accept);
        }
    }
}

/// A tenant's accepts no snapshot covers yet, and their sum.
#[derive(Default)]
struct Pending {
    accepts: Vec<Accept>,
    total: Queued,
}

/// A tenant's accepts within the rate window, oldest first, and their sum.
#[derive(Default)]
struct Window {
    entries: VecDeque<(Instant, Queued)>,
    total: Queued,
}

impl Window {
    fn prune(&mut self, now: Instant) {
        while let Some((at, amount)) = self.entries.front().copied() {
            if now.duration_since(at) <= RATE_WINDOW {
                break;
            }
            self.entries.pop_front();
            self.total.rows = self.total.rows.saturating_sub(amount.rows);
            self.total.bytes = self.total.bytes.saturating_sub(amount.bytes);
        }
    }
}

/// The leader is the first live member; a host that is not a member (yet)
/// leads only when the snapshot is stale.
fn leads(fleet: &FleetView, me: &str) -> bool {
    fleet.member && fleet.live_members().first() == Some(&me)
}

/// An admitted request's rows, counted until its publish is over.
pub struct Reservation {
    ledger: Ledger,
    tenant: String,
    amount: Queued,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut state = self.ledger.state();
        if let Some(reserved) = state.reserved.get_mut(&self.tenant) {
            reserved.rows = reserved.rows.saturating_sub(self.amount.rows);
            reserved.bytes = reserved.bytes.saturating_sub(self.amount.bytes);
            if reserved.rows == 0 && reserved.bytes == 0 {
                state.reserved.remove(&self.tenant);
            }
        }
    }
}

/// Why a snapshot could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("stream {stream}: {reason}")]
    Stream { stream: String, reason: String },
}

#[derive(Deserialize)]
struct StreamInfoReply {
    state: StreamStateReply,
    #[serde(default)]
    total: usize,
    #[serde(default)]
    offset: usize,
}

#[derive(Deserialize)]
struct StreamStateReply {
    #[serde(default)]
    messages: u64,
    #[serde(default)]
    bytes: u64,
    #[serde(default)]
    last_seq: u64,
    #[serde(default)]
    subjects: Option<HashMap<String, u64>>,
}

/// Reads one partition stream's per-subject counts (one paged request)
/// and sums them by tenant.
async fn read_partition(
    client: &Client,
    router: &Names,
    partition: u32,
    mean_row_bytes: &HashMap<String, f64>,
) -> Result<PartitionRead, SnapshotError> {
    let stream = router.partition_stream(partition);
    let failed = |reason: String| SnapshotError::Stream {
        stream: stream.clone(),
        reason,
    };
    let filter = router.partition_subjects(partition);
    let mut read = PartitionRead::default();
    let mut offset = 0;
    let mut first_page = true;
    loop {
        let request = serde_json::json!({ "subjects_filter": filter, "offset": offset });
        let reply = client
            .request(
                format!("$JS.API.STREAM.INFO.{stream}"),
                Bytes::from(request.to_string()),
            )
            .await
            .map_err(|err| failed(err.to_string()))?;
        if let Some(error) = api_error(&reply.payload) {
            return Err(failed(error));
        }
        let info: StreamInfoReply = serde_json::from_slice(&reply.payload)
            .map_err(|err| failed(format!("unreadable info: {err}")))?;
        // The first page's sequence: later pages only add subjects
        // stored after it, which the accepts count as well (a brief
        // overcount, never a loss).
        if std::mem::take(&mut first_page) {
            read.state = StreamSize {
                messages: info.state.messages,
                last_seq: info.state.last_seq,
            };
        }
        let partition_mean = if info.state.messages > 0 {
            info.state.bytes as f64 / info.state.messages as f64
        } else {
            0.0
        };
        let subjects = info.state.subjects.unwrap_or_default();
        let page = subjects.len();
        for (subject, count) in subjects {
            let Ok((tenant, _table)) = router.parse(&subject) else {
                continue;
            };
            let mean = mean_row_bytes
                .get(tenant.as_ref())
                .copied()
                .unwrap_or(partition_mean);
            let entry = read.tenants.entry(tenant.into_owned()).or_default();
            entry.0 += count;
            entry.1 += count as f64 * mean;
        }
        offset = info.offset + page;
        if page == 0 || offset >= info.total {
            break;
        }
    }
    Ok(read)
}

#[derive(Deserialize)]
struct StreamListReply {
    #[serde(default)]
    total: usize,
    #[serde(default)]
    offset: usize,
    #[serde(default)]
    streams: Vec<ListedStream>,
}

#[derive(Deserialize)]
struct ListedStream {
    config: ListedConfig,
    state: StreamStateReply,
}

#[derive(Deserialize)]
struct ListedConfig {
    name: String,
}

/// Every partition stream's size, from the account's stream listing (256
/// streams a request): what the slow check compares with its reads.
async fn list_partitions(
    client: &Client,
    router: &Names,
) -> Result<Vec<StreamSize>, SnapshotError> {
    let failed = |reason: String| SnapshotError::Stream {
        stream: "(listing)".into(),
        reason,
    };
    let index: HashMap<String, usize> = (0..router.partitions())
        .map(|partition| (router.partition_stream(partition), partition as usize))
        .collect();
    let mut sizes: Vec<Option<StreamSize>> = vec![None; index.len()];
    let mut offset = 0;
    loop {
        let request = serde_json::json!({ "offset": offset });
        let reply = client
            .request("$JS.API.STREAM.LIST", Bytes::from(request.to_string()))
            .await
            .map_err(|err| failed(err.to_string()))?;
        if let Some(error) = api_error(&reply.payload) {
            return Err(failed(error));
        }
        let list: StreamListReply = serde_json::from_slice(&reply.payload)
            .map_err(|err| failed(format!("unreadable listing: {err}")))?;
        let page = list.streams.len();
        for stream in list.streams {
            if let Some(&partition) = index.get(&stream.config.name) {
                sizes[partition] = Some(StreamSize {
                    messages: stream.state.messages,
                    last_seq: stream.state.last_seq,
                });
            }
        }
        offset = list.offset + page;
        if page == 0 || offset >= list.total {
            break;
        }
    }
    sizes
        .into_iter()
        .enumerate()
        .map(|(partition, size)| {
            size.ok_or_else(|| {
                failed(format!(
                    "partition stream {} is not listed",
                    router.partition_stream(partition as u32)
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
