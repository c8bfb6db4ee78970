//! Coordination: which host of a fleet pulls which unit, with no central
//! coordinator and no polling.
//!
//! Every host keeps a member key (`members.<id>`) in the coordination KV
//! bucket with a per-key TTL it renews (its lease), and a roster entry
//! (`roster.<id>`) written only when it joins or its record changes. Every
//! host follows `roster.` and `owners.` through ONE watch, which also
//! carries the prefixes other subsystems follow ([`KeyFollower`]: plugin
//! releases, usage, tenant settings) without coordination knowing what they
//! mean; member keys reach only the two hosts before each member in the
//! roster ([`ring`]), which remove its roster entry once its key expired.
//! From the roster each host computes the same [`assignment`]; a host pulls
//! only units assigned to it, and records what it holds in
//! `owners.<partition>.<shard>` so every host (and `weir status`) sees
//! owners and unowned units from its watch alone.
//!
//! - Every claim creates the unit's consumer afresh ([`takeover`]): the
//!   pull requests of whoever pulled it before end, and the rows it was
//!   sent and never acked come back at once, oldest first.
//! - Handover (a join elsewhere, a planned shutdown): the old owner stops
//!   pulling, finishes and acks the rows it holds and writes `released`;
//!   the new owner claims on that event. Rows still on their way to the old
//!   owner come back to the new one when it creates the consumer.
//! - Takeover (a member key expired): the same claim, from an owner that is
//!   no longer a member. A claimer asked to let go before its consumer is
//!   created deletes its claim instead of writing `released`.
//! - Fencing: the consumer created afresh at each claim ends a previous
//!   owner's requests (the server serves one puller per unit), and a host
//!   that cannot renew its key steps down on its own clock a margin before
//!   the key can expire, aborting its workers. Each
//!   worker holds the [`Lease`] its unit was claimed under and checks it
//!   before every sink call and ack: a host frozen past its lease (SIGSTOP,
//!   a VM pause) delivers nothing more when it wakes, before its coordinator
//!   even runs.
//!
//! Architecture invariant: a unit is pulled only by the host whose claim is
//! recorded in `owners.`, and a claim is taken only from a `released`
//! record or from an owner that is no longer a member (no roster entry: it
//! left, or its member key expired).
//!
//! Exported: what this file defines (`Coordination`, `Membership`,
//! `UnitRunner`, the owner records and keys, …), the `Lease` a worker
//! holds and the `assign`ment every host computes.

mod assignment;
mod claim;
mod lease;
mod ring;
mod takeover;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::nats::connection::connected;
use crate::nats::kv::{Entry, KvError, KvWatch, KvWrite, NatsKv, Watch, WatchEvent, WatchStart};
use crate::telemetry::Metrics;
use crate::topology::route::{Names, Unit};
pub use assignment::assign;
use claim::{
    TaskDone, UnitContext, UnitWork, Written, claim, drop_claim, orphaned_claim, run_unit,
};
pub use lease::Lease;
use lease::LeaseState;
use lease::{Renewal, renew};

/// Key prefix of member keys: each member's lease, renewed with a TTL.
pub const MEMBERS: &str = "members.";
/// Key prefix of the roster: who the members are, written when one joins,
/// leaves or changes its record, and removed once its member key expired.
pub const ROSTER: &str = "roster.";
/// Key prefix of unit owner records.
pub const OWNERS: &str = "owners.";
/// A member steps down this long before its key can expire; a dead owner
/// has delivered nothing for at least this long when its key expires.
pub const STEP_DOWN_MARGIN: Duration = Duration::from_secs(1);
/// Pause before a unit's consumer is created again after the server
/// refused (a cluster electing its leaders, say).
const TAKEOVER_RECHECK: Duration = Duration::from_millis(250);
/// Pause before a failed renewal or watch is tried again.
const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// How long a planned leave waits, beyond the units' drain timeout, for
/// the handovers to be recorded and the member key removed.
const LEAVE_MARGIN: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum CoordinationError {
    #[error("cannot keep the host id in {path}: {source}")]
    HostId {
        path: String,
        source: std::io::Error,
    },
    #[error("coordination bucket: {0}")]
    Kv(#[from] KvError),
}

/// The value of a member key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// Changes with every process start: tells a restart from the same run.
    pub run: String,
    /// The member's front door.
    pub http: String,
    pub since_ms: u64,
    /// The plugin versions it runs, by name: a half-rolled-out release
    /// shows from any host.
    #[serde(default)]
    pub plugins: BTreeMap<String, String>,
    /// The member key's TTL: it is renewed every third of it (0: an older
    /// host that did not say).
    #[serde(default)]
    pub ttl_ms: u64,
}

impl MemberRecord {
    /// Whether a renewal last seen `since` ago is overdue: a member renews
    /// every third of its TTL, so one renewal missed by half a period more
    /// says it is stopped, frozen or cut off, seconds before its key
    /// expires and its units move.
    pub fn renewal_overdue(&self, since: Duration) -> bool {
        let period = Duration::from_millis(self.ttl_ms) / 3;
        self.ttl_ms > 0 && since > period + (period / 2).max(Duration::from_millis(500))
    }
}

/// The value of a unit's owner record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRecord {
    pub member: String,
    pub run: String,
    pub state: OwnerState,
    pub since_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OwnerState {
    /// The member pulls the unit (or is taking it over).
    Owned,
    /// The member handed it over cleanly: nothing in flight.
    Released,
}

/// What a host knows of the fleet, all from its watch.
#[derive(Debug, Clone, Default)]
pub struct FleetView {
    pub me: String,
    /// Whether this host currently acts as a member (its lease is valid
    /// and its roster entry came through its watch).
    pub member: bool,
    /// The roster: each member's record.
    pub members: BTreeMap<String, MemberRecord>,
    /// Each unit's owner record and its revision.
    pub owners: BTreeMap<Unit, (OwnerRecord, u64)>,
}

impl FleetView {
    /// Members that count: every roster entry, with this host only while
    /// it is a member.
    pub fn live_members(&self) -> BTreeSet<&str> {
        let mut live: BTreeSet<&str> = self.members.keys().map(String::as_str).collect();
        if self.member {
            live.insert(&self.me);
        } else {
            live.remove(self.me.as_str());
        }
        live
    }

    /// Whether `member` counts, as [`FleetView::live_members`] has it.
    pub fn is_live(&self, member: &str) -> bool {
        if member == self.me {
            self.member
        } else {
            self.members.contains_key(member)
        }
    }

    /// The live member that holds `unit`, if any.
    pub fn owner(&self, unit: Unit) -> Option<&str> {
        let (record, _) = self.owners.get(&unit)?;
        (record.state == OwnerState::Owned && self.is_live(&record.member))
            .then_some(record.member.as_str())
    }

    /// Units no live member holds.
    pub fn unowned(&self, units: &[Unit]) -> Vec<Unit> {
        units
            .iter()
            .copied()
            .filter(|unit| self.owner(*unit).is_none())
            .collect()
    }
}

/// Runs a unit this host claimed until `release` is cancelled, finishing
/// every row it was sent, and delivers nothing (no sink call, no ack) once
/// `lease` no longer holds. Coordination decides *which* units run here;
/// what running one means (delivery) is the host's to plug in. Rows at or
/// below stream sequence `settled_through` were settled before the unit
/// was taken, and are acked unrun if they come again.
pub trait UnitRunner: Send + Sync + 'static {
    fn run(
        &self,
        unit: Unit,
        release: CancellationToken,
        lease: Lease,
        settled_through: u64,
    ) -> BoxFuture<'static, Result<UnitEnd, UnitError>>;
}

/// Why a unit runner could not run its unit; coordination logs it and
/// records the handover (nothing was pulled).
#[derive(Debug, thiserror::Error)]
pub enum UnitError {
    /// The runner could not start pulling: the unit's consumer could not be
    /// bound (its inbox subscribed, say).
    #[error("unit {consumer}: cannot bind its consumer: {source}")]
    Bind {
        consumer: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// How a unit runner stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitEnd {
    /// Released: every row it was sent is settled, so the claim ends with
    /// a `released` record (nothing for the next owner to redo).
    Drained,
    /// The lease ran out: rows may be left unsettled, so the claim stays
    /// for the next owner to take over (reset to the ack floor).
    Fenced,
}

/// A subsystem that follows some key prefixes of the coordination bucket
/// through the host's one watch (plugin releases, usage, tenant settings):
/// coordination hands their changes over and knows nothing of what they mean.
pub trait KeyFollower: Send + Sync + 'static {
    /// The key prefixes it follows (each ends with `.`).
    fn prefixes(&self) -> &'static [&'static str];
    /// A key under one of its prefixes changed (put, delete or expiry).
    fn apply(&self, entry: &Entry);
    /// The watch starts over from the bucket's current values: what was
    /// applied before is stale until [`KeyFollower::caught_up`].
    fn restart(&self);
    /// Every current value has been applied.
    fn caught_up(&self) {}
}

/// The plugin versions this host runs now, by name (member keys carry them).
pub type PluginVersions = Arc<dyn Fn() -> BTreeMap<String, String> + Send + Sync>;

/// Whether this host may claim units now. The host plugs in what it means
/// (its plugin versions are the fleet's); coordination asks before every
/// claim and looks again whenever `wake` is notified.
#[derive(Clone)]
pub struct ClaimGate {
    /// `Some(reason)`: no new claim until it says `None`.
    pub holds_back: Arc<dyn Fn() -> Option<String> + Send + Sync>,
    pub wake: Arc<tokio::sync::Notify>,
}

impl ClaimGate {
    /// A gate that never holds back.
    pub fn open() -> ClaimGate {
        ClaimGate {
            holds_back: Arc::new(|| None),
            wake: Arc::new(tokio::sync::Notify::new()),
        }
    }
}

/// What a host brings to the fleet.
pub struct Membership {
    pub kv: NatsKv,
    pub client: async_nats::Client,
    pub router: Names,
    pub me: String,
    pub http: String,
    pub ttl: Duration,
    pub units: Arc<dyn UnitRunner>,
    pub metrics: Metrics,
    pub plugins: PluginVersions,
    /// Notified when `plugins` changed: the member key says so at once,
    /// not at its next renewal (what `weir plugin push --wait` waits for).
    pub plugins_changed: Arc<tokio::sync::Notify>,
    /// Who else follows keys through this host's coordination watch.
    pub followers: Vec<Arc<dyn KeyFollower>>,
    /// How long a planned leave lets units finish their rows in hand.
    pub drain_timeout: Duration,
    /// What may hold new claims back.
    pub gate: ClaimGate,
    /// The unit consumers' ack wait (`[delivery]`): each claim creates its
    /// unit's consumer afresh.
    pub ack_wait: Duration,
}

/// A host's part in coordination, running. [`Coordination::leave`] hands
/// every unit over before the member key goes.
pub struct Coordination {
    view: watch::Receiver<Arc<FleetView>>,
    leave: CancellationToken,
    task: JoinHandle<()>,
    drain_timeout: Duration,
}

impl Coordination {
    /// Joins the fleet: starts renewing the member key and following the
    /// bucket; units are claimed once the watch has caught up.
    pub async fn join(membership: Membership) -> Result<Coordination, CoordinationError> {
        let watch = open_watch(&membership.kv, &membership.followers).await?;
        let run = format!(
            "{}-{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        let record = MemberRecord {
            run: run.clone(),
            http: membership.http.clone(),
            since_ms: unix_ms(),
            plugins: BTreeMap::new(),
            ttl_ms: u64::try_from(membership.ttl.as_millis()).unwrap_or(u64::MAX),
        };
        let view = FleetView {
            me: membership.me.clone(),
            ..FleetView::default()
        };
        let (published, receiver) = watch::channel(Arc::new(view.clone()));
        let drain_timeout = membership.drain_timeout;
        let (lease_tx, lease) = watch::channel(None);
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let renewing = CancellationToken::new();
        let rewrite_roster = Arc::new(tokio::sync::Notify::new());
        let renewal = tokio::spawn(renew(
            Renewal {
                kv: membership.kv.clone(),
                me: membership.me.clone(),
                plugins: membership.plugins.clone(),
                plugins_changed: membership.plugins_changed.clone(),
                ttl: membership.ttl,
                rewrite_roster: rewrite_roster.clone(),
            },
            record,
            lease_tx,
            renewing.clone(),
        ));
        let (roster, roster_rx) = watch::channel(ring::Roster::default());
        let ring_stop = CancellationToken::new();
        let ring = Ring {
            roster,
            stop: ring_stop.clone(),
            task: Some(tokio::spawn(ring::follow_successors(
                membership.kv.clone(),
                membership.me.clone(),
                roster_rx,
                ring_stop,
            ))),
        };
        let coordinator = Coordinator {
            ctx: Arc::new(UnitContext { membership, run }),
            view,
            published,
            caught_up: false,
            lease,
            member_term: None,
            tasks: BTreeMap::new(),
            done_tx,
            done_rx,
            next_task: 0,
            leaving: false,
            assigned: None,
            held_back: None,
            rewrite_roster,
            roster_revisions: BTreeMap::new(),
            unlisted: BTreeSet::new(),
            ring,
        };
        let leave = CancellationToken::new();
        let task = tokio::spawn(coordinator.run(watch, leave.clone(), renewal, renewing));
        Ok(Coordination {
            view: receiver,
            leave,
            task,
            drain_timeout,
        })
    }

    /// The fleet as this host sees it now; `changed()` on the receiver
    /// wakes on every update.
    pub fn view(&self) -> watch::Receiver<Arc<FleetView>> {
        self.view.clone()
    }

    /// Hands every unit over (each finishes and acks the rows it holds),
    /// then deletes the member key so the others take
    /// them at once.
    pub async fn leave(self) {
        self.leave.cancel();
        let mut task = self.task;
        if tokio::time::timeout(self.drain_timeout + LEAVE_MARGIN, &mut task)
            .await
            .is_err()
        {
            tracing::warn!("units were not handed over in time; the others will take them over");
            task.abort();
        }
    }
}

/// A unit this host claims, pulls or is releasing.
struct UnitTask {
    id: u64,
    release: CancellationToken,
    releasing: bool,
    /// Deletes an orphaned claim rather than running the unit.
    dropping: bool,
    handle: JoinHandle<()>,
}

struct Coordinator {
    ctx: Arc<UnitContext>,
    view: FleetView,
    published: watch::Sender<Arc<FleetView>>,
    caught_up: bool,
    /// Until when this host may act as a member (renewal time + TTL − margin).
    lease: watch::Receiver<Option<LeaseState>>,
    /// The lease term this host became a member in: a renewal in a new term
    /// means the lease lapsed meanwhile, even if this loop missed the lapse.
    member_term: Option<u64>,
    tasks: BTreeMap<Unit, UnitTask>,
    done_tx: mpsc::UnboundedSender<TaskDone>,
    done_rx: mpsc::UnboundedReceiver<TaskDone>,
    next_task: u64,
    leaving: bool,
    /// The last assignment and the members it was computed for.
    assigned: Option<(Vec<String>, assignment::Owners)>,
    /// Why the gate held claims back at the last reconcile (logged once).
    held_back: Option<String>,
    /// Asks the renewals to write this host's roster entry again (it went).
    rewrite_roster: Arc<tokio::sync::Notify>,
    /// Each roster entry's revision, for the ring.
    roster_revisions: BTreeMap<String, u64>,
    /// Hosts whose roster entry the watch brought removed: their claims
    /// are taken over whatever their member key says (a host never listed
    /// is one from before the roster, whose key decides).
    unlisted: BTreeSet<String>,
    ring: Ring,
}

/// The task that follows the next members' keys ([`ring`]), and the roster
/// it is given.
struct Ring {
    roster: watch::Sender<ring::Roster>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Coordinator {
    async fn run(
        mut self,
        mut watch: Watch,
        leave: CancellationToken,
        renewal: JoinHandle<()>,
        renewing: CancellationToken,
    ) {
        let gate = self.ctx.membership.gate.wake.clone();
        loop {
            let lease = *self.lease.borrow_and_update();
            let lease_until = lease.map(|l| l.until);
            let step_down_at = lease_until.filter(|_| self.view.member);
            // Most events are renewals that change nothing: those cost no
            // reconcile and no new view.
            let mut changed = false;
            tokio::select! {
                _ = leave.cancelled(), if !self.leaving => {
                    self.leaving = true;
                    self.abandon_claim_drops();
                }
                event = watch.next() => {
                    let mut event = event;
                    // Take every change already here before reconciling once.
                    loop {
                        match event {
                            Some(Ok(WatchEvent::Update(entry))) => changed |= self.apply(entry),
                            Some(Ok(WatchEvent::CaughtUp)) => {
                                for follower in &self.ctx.membership.followers {
                                    follower.caught_up();
                                }
                                self.caught_up = true;
                                changed = true;
                            }
                            Some(Err(err)) => {
                                tracing::error!(error = %err, "coordination watch failed; watching again");
                                watch = self.rewatch().await;
                                break;
                            }
                            None => {
                                watch = self.rewatch().await;
                                break;
                            }
                        }
                        match watch.next().now_or_never() {
                            Some(next) => event = next,
                            None => break,
                        }
                    }
                }
                _ = self.lease.changed() => {}
                _ = gate.notified() => changed = true,
                _ = sleep_until(step_down_at) => {}
                Some((unit, id, written)) = self.done_rx.recv() => {
                    changed = self.task_done(unit, id, written);
                }
            }
            // Read again: a renewal may have landed while this task waited
            // (a busy host runs it late, with a wake-up already past the
            // old lease's end), and judging by the lease read before the
            // wait stepped a renewed member down.
            let lease = *self.lease.borrow_and_update();
            let lease_valid = lease.is_some_and(|l| Instant::now() < l.until);
            let term = lease.map(|l| l.term);
            let was_member = self.view.member;
            // Counted by the others only once its roster entry of this term
            // is in the watch: every claim it writes comes after it there,
            // and after any expiry of its key in an earlier term. A watch
            // starting over is not a removal.
            let listed_at = self.lease.borrow().and_then(|l| l.listed);
            let listed = listed_at.is_some_and(|at| {
                self.roster_revisions
                    .get(&self.view.me)
                    .is_some_and(|seen| *seen >= at)
            }) || (was_member && !self.caught_up);
            let lapsed = !lease_valid || term != self.member_term;
            let stepped_down = was_member && (lapsed || !listed) && !self.leaving;
            if stepped_down {
                self.step_down(match lapsed {
                    true => "cannot renew the member key in time; stepping down",
                    false => "no longer in the roster; stepping down until listed again",
                });
            }
            let member = lease_valid && listed && !self.leaving;
            if member && (!was_member || stepped_down) {
                self.member_term = lease.map(|l| l.term);
            }
            changed |= member != was_member || stepped_down || self.leaving;
            self.view.member = member;
            if !changed {
                continue;
            }
            self.reconcile();
            self.publish();
            if self.leaving && self.tasks.is_empty() {
                break;
            }
        }
        renewing.cancel();
        let _ = renewal.await;
        self.leave_fleet(watch).await;
    }

    /// A unit task ended: its slot is free, and what it wrote last counts
    /// now, not when the watch brings it (the unit is not mistaken for an
    /// orphan). Says whether the view changed.
    fn task_done(&mut self, unit: Unit, id: u64, written: Option<Written>) -> bool {
        let mut changed = false;
        if self.tasks.get(&unit).is_some_and(|task| task.id == id) {
            self.tasks.remove(&unit);
            changed = true;
        }
        let newer = |view: &FleetView, revision: u64| {
            view.owners
                .get(&unit)
                .is_none_or(|(_, seen)| *seen < revision)
        };
        match written {
            Some(Written::Record(record, revision)) if newer(&self.view, revision) => {
                self.view.owners.insert(unit, (record, revision));
            }
            Some(Written::Deleted(revision)) if newer(&self.view, revision) => {
                self.view.owners.remove(&unit);
            }
            _ => {}
        }
        changed
    }

    /// Hands the ring its roster and publishes the view and unit gauges.
    fn publish(&mut self) {
        let roster = ring::Roster {
            ready: self.caught_up,
            members: self.roster_revisions.clone(),
        };
        self.ring.roster.send_if_modified(|old| {
            let modified = *old != roster;
            *old = roster;
            modified
        });
        let metrics = &self.ctx.membership.metrics;
        metrics.units_owned.set(self.tasks.len() as i64);
        let units = self.ctx.membership.router.units();
        metrics
            .units_unowned
            .set(self.view.unowned(&units).len() as i64);
        self.published.send_replace(Arc::new(self.view.clone()));
    }

    /// Stops following the ring and removes this member's keys.
    async fn leave_fleet(&mut self, watch: Watch) {
        self.ring.stop.cancel();
        if let Some(task) = self.ring.task.take() {
            let _ = task.await;
        }
        let me = &self.ctx.membership.me;
        if connected(&self.ctx.membership.client) {
            // The roster entry first: the others see the leave at once, and
            // nobody sees a roster entry without its member key.
            if let Err(err) = self.ctx.membership.kv.delete(&roster_key(me)).await {
                tracing::warn!(error = %err, "cannot delete the roster entry; the others remove it once the member key expires");
            }
            let key = format!("{MEMBERS}{me}");
            if let Err(err) = self.ctx.membership.kv.delete(&key).await {
                tracing::warn!(error = %err, "cannot delete the member key; it expires on its own");
            }
        } else {
            // Each delete would wait out its timeout: the keys expire on
            // their own, and the others take the units over then.
            tracing::warn!(member = %me, "NATS is unreachable: this member's keys are not deleted; the others take its units over once they expire");
        }
        watch.close().await;
        tracing::info!(member = %me, "left the fleet");
    }

    /// Takes one change into the view; says whether the view changed.
    fn apply(&mut self, entry: Entry) -> bool {
        if let Some(id) = entry.key.strip_prefix(ROSTER) {
            let record = entry
                .operation
                .is_put()
                .then(|| serde_json::from_slice::<MemberRecord>(&entry.value).ok())
                .flatten();
            match &record {
                Some(_) => {
                    self.roster_revisions.insert(id.to_string(), entry.revision);
                    self.unlisted.remove(id);
                }
                None => {
                    self.roster_revisions.remove(id);
                    self.unlisted.insert(id.to_string());
                    // Removed by the others (its key expired while this
                    // host was frozen or cut off): written again once the
                    // lease is renewed, and this host rejoins.
                    if id == self.view.me && !self.leaving {
                        self.rewrite_roster.notify_one();
                    }
                }
            }
            match record {
                Some(record) => match self.view.members.insert(id.to_string(), record.clone()) {
                    None => {
                        tracing::info!(member = %id, "member joined");
                        true
                    }
                    // Written again (a new term, new plugin versions): the
                    // ring needs its revision even if the record is the same.
                    Some(_) => true,
                },
                None => {
                    let left = self.view.members.remove(id).is_some();
                    if left {
                        tracing::info!(member = %id, change = ?entry.operation, "member left");
                    }
                    left
                }
            }
        } else if let Some(follower) = self
            .ctx
            .membership
            .followers
            .iter()
            .find(|f| f.prefixes().iter().any(|p| entry.key.starts_with(p)))
        {
            // Not the fleet's shape: nothing to reassign.
            follower.apply(&entry);
            false
        } else if let Some(unit) = entry.key.strip_prefix(OWNERS).and_then(parse_unit) {
            let record = entry
                .operation
                .is_put()
                .then(|| serde_json::from_slice::<OwnerRecord>(&entry.value).ok())
                .flatten();
            match record {
                Some(record) => {
                    self.view.owners.insert(unit, (record, entry.revision));
                }
                None => {
                    self.view.owners.remove(&unit);
                }
            }
            true
        } else {
            false
        }
    }

    /// The watch ended for good (the bucket was recreated, the client
    /// closed): start over from the bucket's current values.
    async fn rewatch(&mut self) -> Watch {
        self.caught_up = false;
        self.view.members.clear();
        self.roster_revisions.clear();
        self.unlisted.clear();
        self.view.owners.clear();
        // The bucket may have been recreated: the roster entry with it.
        self.rewrite_roster.notify_one();
        for follower in &self.ctx.membership.followers {
            follower.restart();
        }
        loop {
            match open_watch(&self.ctx.membership.kv, &self.ctx.membership.followers).await {
                Ok(watch) => return watch,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot watch the coordination bucket");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
    }

    /// The lease ran out before a renewal got through: the others may take
    /// this host's units any moment, so stop pulling them now.
    fn step_down(&mut self, why: &str) {
        tracing::warn!(units = self.tasks.len(), "{why}");
        for (_, task) in std::mem::take(&mut self.tasks) {
            task.handle.abort();
        }
        self.ctx.membership.metrics.coordination_step_downs.inc();
    }

    /// A leaving host drops no claim (see `reconcile`), nor waits on a drop
    /// begun before: with NATS down, each would hold the stop for its
    /// timeout. The claims stay `owned`, and the others take the units over
    /// once this member's keys are gone.
    fn abandon_claim_drops(&mut self) {
        self.tasks.retain(|_, task| {
            if task.dropping {
                task.handle.abort();
            }
            !task.dropping
        });
    }

    /// Starts pulling the units assigned here that can be claimed, and
    /// releases the units no longer assigned here.
    fn reconcile(&mut self) {
        if !self.caught_up {
            return;
        }
        let units = self.ctx.membership.router.units();
        let live = self.view.live_members();
        let me = self.view.me.as_str();
        // Owner records change far more often than the member set.
        let same_members = self
            .assigned
            .as_ref()
            .is_some_and(|(m, _)| m.iter().map(String::as_str).eq(live.iter().copied()));
        if !same_members {
            let members: Vec<String> = live.iter().map(|m| m.to_string()).collect();
            let owners = assignment::assign_shared(&units, &members);
            self.assigned = Some((members, owners));
        }
        let held = (self.ctx.membership.gate.holds_back)();
        if held != self.held_back {
            match &held {
                Some(reason) => tracing::warn!(%reason, "claiming no unit for now"),
                None => tracing::info!("claiming units again"),
            }
            self.held_back = held;
        }
        let Some((_, assigned)) = &self.assigned else {
            return;
        };
        let mut work = Vec::new();
        for unit in units {
            let mine = assigned.get(&unit).is_some_and(|owner| owner == me);
            match self.tasks.get_mut(&unit) {
                Some(task) if !mine && !task.releasing => {
                    task.release.cancel();
                    task.releasing = true;
                }
                Some(_) => {}
                None if mine => {
                    if self.held_back.is_some() {
                        continue;
                    }
                    if let Some(claim) = claim(&self.view, unit) {
                        // Whose claim it takes, if a host's never listed
                        // (from before the roster): its key is looked at
                        // before the claim. A removed entry's term ended.
                        let from = claim
                            .from_other
                            .then(|| self.view.owners.get(&unit).map(|(r, _)| r.member.clone()))
                            .flatten()
                            .filter(|owner| !self.unlisted.contains(owner));
                        work.push((unit, UnitWork::Claim(claim, from)));
                    }
                }
                // A leaving host drops no claim: its member key goes next,
                // and the others take the unit over from it then (checking
                // for rows in flight as a drop would have them do). Dropping
                // would keep the leave alive, one attempt after another,
                // while NATS is down.
                None if self.leaving => {}
                None => {
                    if let Some(revision) = orphaned_claim(&self.view, unit) {
                        work.push((unit, UnitWork::DropClaim(revision)));
                    }
                }
            }
        }
        for (unit, work) in work {
            self.spawn(unit, work);
        }
    }

    fn spawn(&mut self, unit: Unit, work: UnitWork) {
        let id = self.next_task;
        self.next_task += 1;
        let release = CancellationToken::new();
        let dropping = matches!(work, UnitWork::DropClaim(_));
        let (ctx, done, stop) = (self.ctx.clone(), self.done_tx.clone(), release.clone());
        let lease = Lease::current(self.lease.clone());
        let handle = tokio::spawn(async move {
            let written = match work {
                UnitWork::Claim(claim, from) => {
                    run_unit(&ctx, unit, (claim, from), stop, lease).await
                }
                UnitWork::DropClaim(revision) => drop_claim(&ctx, unit, revision).await,
            };
            let _ = done.send((unit, id, written));
        });
        self.tasks.insert(
            unit,
            UnitTask {
                id,
                release,
                releasing: dropping,
                dropping,
                handle,
            },
        );
    }
}

async fn open_watch(kv: &NatsKv, followers: &[Arc<dyn KeyFollower>]) -> Result<Watch, KvError> {
    let mut prefixes = vec![ROSTER, OWNERS];
    for follower in followers {
        prefixes.extend_from_slice(follower.prefixes());
    }
    kv.watch_prefixes(&prefixes, WatchStart::CurrentValues)
        .await
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// `roster.<member>`.
pub fn roster_key(member: &str) -> String {
    format!("{ROSTER}{member}")
}

/// `owners.<partition>.<shard>`.
pub fn owner_key(unit: Unit) -> String {
    format!("{OWNERS}{}.{}", unit.partition, unit.shard)
}

fn parse_unit(key: &str) -> Option<Unit> {
    let (partition, shard) = key.split_once('.')?;
    Some(Unit {
        partition: partition.parse().ok()?,
        shard: shard.parse().ok()?,
    })
}

fn to_bytes<T: Serialize>(value: &T) -> Bytes {
    // Plain structs of strings and numbers always serialize.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// This host's member id: configured, or generated once and kept in the
/// data directory so a restarted process takes its own units back.
pub fn host_id(configured: Option<&str>, data_dir: &Path) -> Result<String, CoordinationError> {
    if let Some(id) = configured {
        return Ok(id.to_string());
    }
    let path = data_dir.join("host-id");
    let error = |source| CoordinationError::HostId {
        path: path.display().to_string(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_string()),
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(error(err)),
    }
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let hostname: String = hostname
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(32)
        .collect();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let id = format!(
        "{}-{:x}{:05x}",
        if hostname.is_empty() {
            "weir"
        } else {
            &hostname
        },
        std::process::id(),
        nanos & 0xfffff
    );
    std::fs::create_dir_all(data_dir).map_err(error)?;
    std::fs::write(&path, &id).map_err(error)?;
    Ok(id)
}

#[cfg(test)]
mod tests;
