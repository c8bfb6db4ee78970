//! Delivery: a worker per unit pulls batches (bounded by rows, bytes and
//! wait), runs each table's pipeline, and settles every row by its verdict:
//! ack, nak with a delay, or dead-letter then ack.
//!
//! Architecture invariant: a row is acked only after its pipeline finished
//! with it, or after its dead letter was stored. A crash at any point before
//! that means redelivery, never loss.
//!
//! Fencing: a worker runs under the [`Lease`] its unit was claimed under and
//! checks it right before every sink call, dead letter and answer; once it
//! no longer holds, the batch is abandoned unanswered (the next owner gets
//! its rows back) and the worker stops.

use super::traced;
use crate::telemetry::traces::Traces;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use async_nats::{Client, Message};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::DeliveryConfig;
use crate::coordination::{Lease, UnitEnd};
use crate::delivery::pipeline::{CallRecord, PipelineRunner, Verdict};
use crate::delivery::pull::{PullSize, Puller};
use crate::delivery::run::{Destinations, Scratch, run_pipelines};
use crate::delivery::settle::Fenced;
use crate::delivery::settler::{Settler, confirm_acks};
use crate::delivery::shadow::Shadows;
use crate::destination::Publisher;
use crate::nats::ack;
use crate::nats::kv::NatsKv;
use crate::reload::generation::Generation;
use crate::state::prune::{AppliedPruning, CONFIRM_TIMEOUT};
use crate::state::store::{StateStore, UnitState};
use crate::telemetry::{Metrics, UnitLabels};
use crate::topology::route::{Names, Unit};

/// Shortest interval between in-progress acks of a running batch.
const MIN_PROGRESS_PERIOD: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error("unit {consumer}: cannot bind its consumer: {source}")]
    Bind {
        consumer: String,
        source: crate::delivery::pull::PullError,
    },
}

/// A fresh runner (its own instances) for every pipeline variant of a
/// generation (one per pipeline without canaries), by variant index.
/// `unit` is the unit consumer's name: a destination's ledger names it;
/// `publisher` is where a sink granted `nats` publishes; a runner with a
/// shadowed transform feeds its queue in `shadows`.
fn runners(
    generation: &Generation,
    state: Option<&UnitState>,
    unit: &str,
    publisher: &Publisher,
    shadows: &Shadows,
) -> Vec<Option<PipelineRunner>> {
    (0..generation.variant_count())
        .map(|variant| {
            let pipeline = generation
                .config()
                .pipelines
                .get(generation.variant_pipeline(variant)?)?;
            let plugin = |name: &str| generation.plugin_in(variant, name).cloned();
            let mut runner = PipelineRunner::new(pipeline, plugin, state.cloned())?
                .with_destination(unit, true)
                .with_publisher(publisher);
            // A batch's state writes travel while the next batch runs.
            runner.overlap_state_writes();
            Some(match shadows.tap(generation, variant) {
                Some(tap) => runner.observed(tap),
                None => runner,
            })
        })
        .collect()
}

/// Pulls one unit and runs its rows through their pipelines.
pub struct UnitWorker {
    js: jetstream::Context,
    router: Names,
    unit: Unit,
    settings: DeliveryConfig,
    pipelines: Arc<Generation>,
    /// Where a hot reload publishes a new generation of pipelines; looked at
    /// only between batches, so a batch runs start to end on one version.
    generations: watch::Receiver<Arc<Generation>>,
    runners: Vec<Option<PipelineRunner>>,
    settler: Settler,
    metrics: Metrics,
    state: Option<UnitState>,
    applied: AppliedPruning,
    /// The host's connection as a sink granted `nats` publishes on it.
    publisher: Publisher,
    /// Told the partition after each settled batch.
    settled: Option<SettledHook>,
    /// The host's shadow queues, which runners with a shadowed transform feed.
    shadows: Shadows,
    /// Why this host's plugin versions are not the fleet's, if they are not
    /// (a switch it has not loaded yet): no batch runs meanwhile.
    behind: Behind,
    /// A `deliver` span per traced request of each batch.
    traces: Traces,
    /// The per-row vectors of a batch, kept for the next.
    scratch: Scratch,
    /// The batch whose rows ran but whose state writes are on their way:
    /// answered once they landed, after the next batch ran.
    held: Option<Held>,
    /// The vectors of the last held batch, for the next.
    spare: Option<(Vec<Message>, Vec<Verdict>)>,
    /// Rows whose state write failed (stream sequences, with why), kept
    /// for the next.
    state_failed: Vec<(u64, String)>,
    /// Batches run so far: the number that tags a batch's state writes.
    batches_run: u64,
}

/// What a batch's answer needs of its run.
struct Ran {
    /// The number that tags its state writes.
    number: u64,
    began: Instant,
    calls: Vec<CallRecord>,
    stateful: bool,
}

/// A batch run whose state writes were still on their way.
struct Held {
    ran: Ran,
    batch: Vec<Message>,
    verdicts: Vec<Verdict>,
}

/// What a worker tells after settling a batch: its unit's partition (usage
/// re-reads that partition's counts) and how many of its rows were
/// delivered (the fleet's delivered rate).
pub type SettledHook = Arc<dyn Fn(u32, u64) + Send + Sync>;

/// Why this host's running plugin versions are not the fleet's, if they
/// are not; the host plugs in what it means.
pub type Behind = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// How often a held batch looks whether the host caught up.
const BEHIND_POLL: Duration = Duration::from_millis(20);
/// A batch held longer than this is worth a warning.
const BEHIND_WARN: Duration = Duration::from_secs(2);

impl UnitWorker {
    pub fn new(
        js: jetstream::Context,
        router: Names,
        unit: Unit,
        mut generations: watch::Receiver<Arc<Generation>>,
        metrics: Metrics,
        state: Option<StateStore<NatsKv>>,
        shadows: Shadows,
    ) -> UnitWorker {
        let pipelines = generations.borrow_and_update().clone();
        let settings = pipelines.config().delivery.clone();
        let state = state.map(|store| UnitState {
            store: store.into(),
            unit,
            metrics: metrics.clone(),
        });
        let publisher = Publisher::new(js.clone(), router.partition_stream(unit.partition));
        let runners = runners(
            &pipelines,
            state.as_ref(),
            &router.unit_consumer(unit),
            &publisher,
            &shadows,
        );
        let unit_labels = UnitLabels {
            unit: router.unit_consumer(unit),
        };
        let mut settler = Settler::new(
            &js,
            router.clone(),
            settings.clone(),
            metrics.clone(),
            unit_labels,
        );
        settler.redact = pipelines.config().dead_letters.redact.clone();
        UnitWorker {
            js,
            router,
            unit,
            settings,
            pipelines,
            generations,
            runners,
            settler,
            metrics,
            behind: Arc::new(|| None),
            traces: Traces::default(),
            state,
            applied: AppliedPruning::default(),
            publisher,
            settled: None,
            shadows,
            scratch: Scratch::default(),
            held: None,
            spare: None,
            state_failed: Vec::new(),
            batches_run: 0,
        }
    }

    /// Pulls and runs batches until `release`; then finishes every row
    /// already here and waits (up to `drain_timeout`) until the server
    /// confirms their answers applied, so the next owner, or this host
    /// after a restart, starts exactly where this one stopped (rows still
    /// on their way come back to it when its claim creates the consumer).
    /// Aborting the task instead (a host that lost its membership) leaves the rows to redelivery, and so does the worker
    /// itself once `lease` no longer holds (it stops pulling, calls no sink
    /// and answers no row: [`UnitEnd::Fenced`]).
    pub async fn run(
        mut self,
        release: CancellationToken,
        mut lease: Lease,
        settled_through: u64,
    ) -> Result<UnitEnd, DeliveryError> {
        let stream_name = self.router.partition_stream(self.unit.partition);
        let consumer_name = self.router.unit_consumer(self.unit);
        let mut puller = Puller::open(
            self.js.clone(),
            stream_name,
            consumer_name.clone(),
            PullSize {
                min_rows: self.settings.batch_rows,
                max_rows: self.settings.pull_rows,
                // As many bytes as the batches the largest request makes.
                bytes: self
                    .settings
                    .batch_bytes
                    .saturating_mul(self.settings.pull_rows.div_ceil(self.settings.batch_rows)),
            },
            lease.clone(),
            settled_through,
        )
        .await
        .map_err(|source| DeliveryError::Bind {
            consumer: consumer_name.clone(),
            source,
        })?;
        // One buffer of messages for every batch: no allocation per batch.
        let mut batch = Vec::with_capacity(self.settings.batch_rows);
        loop {
            // A batch held for its state writes goes on while the next rows
            // are already here, and is answered as soon as they are not.
            let ready = match self.held.is_some() && lease.held() && !release.is_cancelled() {
                true => puller.next_until(Some(Instant::now())).await,
                false => None,
            };
            let first = match ready {
                Some(first) => first,
                None => {
                    let held_rows = self.held.as_ref().map_or(0, |held| held.batch.len());
                    if let Err(Fenced) = self.answer_held(&lease, None).await {
                        return Ok(self.fenced(&consumer_name, held_rows));
                    }
                    // Biased: a worker past its lease sends no further pull
                    // request, which would be served rows of the unit's next owner.
                    let first = tokio::select! {
                        biased;
                        _ = release.cancelled() => break,
                        _ = lease.lost() => return Ok(self.fenced(&consumer_name, 0)),
                        // Waits no longer than the unit's summary is due, so an
                        // idle unit still says what it dead-lettered.
                        first = puller.next_until(self.settler.summary.due()) => first,
                    };
                    let Some(first) = first else {
                        self.settler.summary.flush(&consumer_name, false);
                        continue;
                    };
                    first
                }
            };
            let began = Instant::now();
            fill_batch(&self.settings, first, &mut puller, &lease, &mut batch).await;
            let rows = batch.len();
            let processed = self
                .process(&mut batch, began, Some(&mut puller), &lease)
                .await;
            batch.clear();
            if let Err(Fenced) = processed {
                return Ok(self.fenced(&consumer_name, rows));
            }
        }
        let mut rest = puller.release().await;
        while !rest.is_empty() {
            let tail = rest.split_off(rest.len().min(self.settings.batch_rows));
            let mut batch = std::mem::replace(&mut rest, tail);
            let rows = batch.len();
            if let Err(Fenced) = self.process(&mut batch, Instant::now(), None, &lease).await {
                return Ok(self.fenced(&consumer_name, rows));
            }
        }
        self.settler
            .confirm_applied(&consumer_name, self.settings.drain_timeout)
            .await;
        self.settler.stopped();
        Ok(UnitEnd::Drained)
    }

    /// The lease ran out (with a batch of `rows` in hand, if any): said once
    /// per worker, which stops here.
    fn fenced(&mut self, consumer: &str, rows: usize) -> UnitEnd {
        self.settler.stopped();
        if rows > 0 {
            self.metrics.fenced_batches.inc();
        }
        tracing::warn!(
            unit = ?self.unit,
            consumer,
            rows,
            "this host's lease ran out: the unit may be another host's now, so this batch is \
             abandoned unanswered (its rows go to the next owner) and the unit is no longer pulled here"
        );
        UnitEnd::Fenced
    }

    /// Runs a batch through its pipelines, keeping its rows alive while it
    /// runs, then settles every row.
    /// `puller`: where rows received meanwhile are kept alive too.
    /// `began`: when its first row was pulled.
    async fn process(
        &mut self,
        batch: &mut Vec<Message>,
        began: Instant,
        puller: Option<&mut Puller>,
        lease: &Lease,
    ) -> Result<(), Fenced> {
        let span = tracing::info_span!(
            "batch",
            unit = %self.settler.unit_labels.unit,
            rows = batch.len()
        );
        let processed = self
            .process_in_span(batch, began, puller, lease)
            .instrument(span)
            .await;
        self.metrics
            .batch_duration
            .observe(began.elapsed().as_secs_f64());
        processed
    }

    async fn process_in_span(
        &mut self,
        batch: &mut Vec<Message>,
        began: Instant,
        mut puller: Option<&mut Puller>,
        lease: &Lease,
    ) -> Result<(), Fenced> {
        // A batch runs start to end on one generation, and so do its writes.
        if self.generations.has_changed().unwrap_or(false) {
            self.answer_held(lease, None).await?;
        }
        self.adopt_new_generation();
        if let Some(reason) = (self.behind)() {
            self.answer_held(lease, None).await?;
            // One version per fleet: the batch waits (its rows kept alive)
            // rather than run on a version the fleet has left.
            // A switch takes moments; say so only when it takes longer.
            tracing::debug!(unit = ?self.unit, %reason, "holding a batch until this host runs the fleet's plugin versions");
            let (behind, unit) = (self.behind.clone(), self.unit);
            let caught_up = async move {
                let since = Instant::now();
                let mut said = false;
                while let Some(reason) = behind() {
                    if !said && since.elapsed() > BEHIND_WARN {
                        tracing::warn!(?unit, %reason, "a batch is held until this host runs the fleet's plugin versions");
                        said = true;
                    }
                    tokio::time::sleep(BEHIND_POLL).await;
                }
            };
            let client = &self.settler.client;
            let ack_wait = self.settings.ack_wait;
            keep_alive(
                [batch.as_slice(), &[]],
                client,
                puller.as_deref_mut(),
                ack_wait,
                lease,
                caught_up,
            )
            .await;
            self.adopt_new_generation();
        }
        self.metrics.batches.inc();
        let stateful = self
            .runners
            .iter()
            .flatten()
            .any(PipelineRunner::is_stateful);
        let remembers = self
            .runners
            .iter()
            .flatten()
            .any(PipelineRunner::remembers_applied);
        if remembers {
            self.prune_applied().await;
        }
        if let Some(puller) = puller.as_deref_mut()
            && lease.held()
        {
            puller
                .keep_received_alive_within(progress_period(self.settings.ack_wait))
                .await;
        }
        if self.traces.enabled() {
            self.runners
                .iter_mut()
                .flatten()
                .for_each(PipelineRunner::record_calls);
        }
        self.batches_run += 1;
        let number = self.batches_run;
        for runner in self.runners.iter_mut().flatten() {
            runner.set_batch(number);
        }
        let work = run_pipelines(
            &mut self.runners,
            &self.pipelines,
            &self.router,
            &self.settings,
            batch,
            lease,
            Destinations {
                unit: self.unit,
                publisher: &self.publisher,
            },
            &mut self.scratch,
        );
        let client = &self.settler.client;
        let ack_wait = self.settings.ack_wait;
        let held: &[Message] = self.held.as_ref().map_or(&[], |held| &held.batch);
        let ran = keep_alive(
            [batch.as_slice(), held],
            client,
            puller.as_deref_mut(),
            ack_wait,
            lease,
            work,
        )
        .await;
        // Taken whatever the outcome: a later batch's spans show only its own.
        let calls: Vec<CallRecord> = self
            .runners
            .iter_mut()
            .flatten()
            .flat_map(PipelineRunner::take_calls)
            .collect();
        ran?;
        let ran = Ran {
            number,
            began,
            calls,
            stateful,
        };
        self.finish_batch(batch, ran, puller.is_some(), lease).await
    }

    /// After a batch ran: answers the batch held before it, then this one,
    /// or holds this one while its state writes travel (`overlap`: a
    /// next batch may come to run meanwhile).
    async fn finish_batch(
        &mut self,
        batch: &mut Vec<Message>,
        ran: Ran,
        overlap: bool,
        lease: &Lease,
    ) -> Result<(), Fenced> {
        let mut verdicts = std::mem::take(&mut self.scratch.verdicts);
        let mut answered = self.answer_held(lease, Some((batch, &mut verdicts))).await;
        let pending = |runners: &[Option<PipelineRunner>]| {
            runners
                .iter()
                .flatten()
                .any(|r| r.state_pending(ran.number))
        };
        if answered.is_ok() && pending(&self.runners) {
            if overlap {
                // Answered after the next batch ran, once its writes landed.
                let (spare_batch, spare_verdicts) = self.spare.take().unwrap_or_default();
                self.scratch.verdicts = spare_verdicts;
                self.held = Some(Held {
                    ran,
                    batch: std::mem::replace(batch, spare_batch),
                    verdicts,
                });
                return Ok(());
            }
            self.land_state(ran.number, batch, &mut verdicts, None)
                .await;
        }
        if answered.is_ok() {
            answered = self.answer(batch, &mut verdicts, &ran, lease).await;
        }
        self.scratch.verdicts = verdicts;
        answered
    }

    /// Answers every row of a batch run (acks, naks, dead letters) and
    /// tells who listens.
    async fn answer(
        &mut self,
        batch: &[Message],
        verdicts: &mut Vec<Verdict>,
        ran: &Ran,
        lease: &Lease,
    ) -> Result<(), Fenced> {
        self.settler.record_acked = ran.stateful;
        let traced = self
            .traces
            .enabled()
            .then(|| traced::traced_requests(batch, verdicts));
        let settled = self.settler.settle(batch, verdicts, lease).await;
        if let (Some(traced), Ok(())) = (traced, &settled) {
            let unit = &self.settler.unit_labels.unit;
            traced::record(&self.traces, unit, ran.began.elapsed(), traced, &ran.calls);
        }
        self.applied.answered(&mut self.settler.acked);
        let delivered = std::mem::take(&mut self.settler.delivered);
        if let Some(hook) = &self.settled {
            hook(self.unit.partition, delivered);
        }
        settled
    }

    /// Answers the batch held for its state writes once they landed; rows
    /// whose write failed come back, in it and in `current` (the batch
    /// run since, whose earlier calls' writes may have failed too).
    async fn answer_held(
        &mut self,
        lease: &Lease,
        current: Option<(&[Message], &mut [Verdict])>,
    ) -> Result<(), Fenced> {
        let Some(mut held) = self.held.take() else {
            return Ok(());
        };
        self.land_state(held.ran.number, &held.batch, &mut held.verdicts, current)
            .await;
        let answered = self
            .answer(&held.batch, &mut held.verdicts, &held.ran, lease)
            .await;
        held.batch.clear();
        held.verdicts.clear();
        self.spare = Some((held.batch, held.verdicts));
        answered
    }

    /// Waits for the state writes of batch `number` and before; a row
    /// whose write failed comes back, in `batch` or in `current`.
    async fn land_state(
        &mut self,
        number: u64,
        batch: &[Message],
        verdicts: &mut [Verdict],
        current: Option<(&[Message], &mut [Verdict])>,
    ) {
        let mut failed = std::mem::take(&mut self.state_failed);
        for runner in self.runners.iter_mut().flatten() {
            runner.land_state(number, &mut failed).await;
        }
        if !failed.is_empty() {
            retry_failed(batch, verdicts, &failed);
            if let Some((batch, verdicts)) = current {
                retry_failed(batch, verdicts, &failed);
            }
            failed.clear();
        }
        self.state_failed = failed;
    }
}

/// Rows of `batch` among `failed` (stream sequences whose state write
/// failed, with why) come back.
fn retry_failed(batch: &[Message], verdicts: &mut [Verdict], failed: &[(u64, String)]) {
    for (message, verdict) in batch.iter().zip(verdicts) {
        let Some(sequence) = ack::info(message).map(|info| info.stream_sequence) else {
            continue;
        };
        if let Some((_, reason)) = failed.iter().find(|(failed, _)| *failed == sequence) {
            verdict.retry_for_state(reason.clone());
        }
    }
}

/// What every unit worker of a host shares: each worker made here follows
/// `generations` (hot reloads).
#[derive(Clone)]
pub struct Workers {
    pub js: jetstream::Context,
    pub router: Names,
    pub generations: watch::Sender<Arc<Generation>>,
    pub metrics: Metrics,
    /// The plugin state bucket, for pipelines with a plugin granted `state`.
    pub state: Option<StateStore<NatsKv>>,
    /// Told each settled batch's partition (the host's usage ledger).
    pub settled: Option<SettledHook>,
    /// Holds every batch while this host's versions are not the fleet's.
    pub behind: Behind,
    /// Where the spans of traced rows go (`[traces]`).
    pub traces: Traces,
    /// Each shadow's queue and task on this host.
    pub shadows: Shadows,
}

impl Workers {
    /// The worker of a unit this host was given.
    pub fn worker(&self, unit: Unit) -> UnitWorker {
        let mut worker = UnitWorker::new(
            self.js.clone(),
            self.router.clone(),
            unit,
            self.generations.subscribe(),
            self.metrics.clone(),
            self.state.clone(),
            self.shadows.clone(),
        );
        worker.settled = self.settled.clone();
        worker.behind = self.behind.clone();
        worker.traces = self.traces.clone();
        worker
    }
}

impl UnitWorker {
    /// Between batches: if a reload published new pipelines, drops the old
    /// instances and builds runners (fresh instances) of the new versions.
    fn adopt_new_generation(&mut self) {
        // A closed channel (the host is stopping) keeps the current generation.
        if !self.generations.has_changed().unwrap_or(false) {
            return;
        }
        let next = self.generations.borrow_and_update().clone();
        self.runners = runners(
            &next,
            self.state.as_ref(),
            &self.router.unit_consumer(self.unit),
            &self.publisher,
            &self.shadows,
        );
        if let Some(floor) = self.applied.floor() {
            self.runners
                .iter_mut()
                .flatten()
                .for_each(|r| r.set_ack_floor(floor));
        }
        self.settings = next.config().delivery.clone();
        self.settler.settings = self.settings.clone();
        self.settler.redact = next.config().dead_letters.redact.clone();
        self.pipelines = next;
        tracing::debug!(unit = ?self.unit, "running a new generation of pipelines");
    }
}

impl UnitWorker {
    /// Before a stateful pipeline's batch: drops from the scopes the
    /// sequences of rows whose acks the server confirmed, asks it to
    /// confirm those answered since, and every [`ACK_FLOOR_PERIOD`] reads
    /// the consumer's ack floor.
    async fn prune_applied(&mut self) {
        let applied = &mut self.applied;
        if let Some(sequences) = applied.confirmed().await {
            for runner in self.runners.iter_mut().flatten() {
                runner.forget_applied(&sequences);
            }
        }
        if applied.wants_confirmation()
            && let Some(last_ack) = self.settler.last_acked.clone()
        {
            let client = self.settler.client.clone();
            applied.confirm(async move {
                matches!(
                    confirm_acks(&client, last_ack, CONFIRM_TIMEOUT).await,
                    Ok(Ok(()))
                )
            });
        }
        if !applied.floor_due() {
            return;
        }
        let stream = self.router.partition_stream(self.unit.partition);
        let consumer = self.router.unit_consumer(self.unit);
        match crate::nats::jetstream::ack_floor(&self.js.client(), &stream, &consumer).await {
            Ok(floor) => {
                applied.floor_read(Some(floor));
                self.runners
                    .iter_mut()
                    .flatten()
                    .for_each(|r| r.set_ack_floor(floor));
            }
            Err(err) => {
                applied.floor_read(None);
                tracing::debug!(consumer, error = %err, "cannot read the unit's ack floor");
            }
        }
    }
}

pub use crate::delivery::isolation::ISOLATION_LANES;

/// How often rows being worked on are answered "in progress": a third of
/// the ack wait, so a row is answered in time even when a tick comes late.
fn progress_period(ack_wait: Duration) -> Duration {
    (ack_wait / 3).max(MIN_PROGRESS_PERIOD)
}

/// Runs `work` while telling JetStream every third of the ack wait that the
/// batch's rows, and those received for the next batches, are still being
/// worked on, so a long batch is not redelivered under its own feet.
async fn keep_alive<F: std::future::Future>(
    batches: [&[Message]; 2],
    client: &Client,
    mut puller: Option<&mut Puller>,
    ack_wait: Duration,
    lease: &Lease,
    work: F,
) -> F::Output {
    let period = progress_period(ack_wait);
    let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
    tokio::pin!(work);
    loop {
        tokio::select! {
            output = &mut work => return output,
            // Past the lease a row's ack wait is the next owner's to run.
            _ = ticker.tick(), if lease.held() => {
                for message in batches.into_iter().flatten() {
                    if let Err(err) = ack::reply(client, message, AckKind::Progress).await {
                        tracing::debug!(error = %err, "cannot extend a row's ack wait");
                    }
                }
                if let Some(puller) = puller.as_deref_mut() {
                    puller.keep_received_alive().await;
                }
            }
        }
    }
}

/// Adds rows to a batch until it is full, `batch_wait` has passed, or no
/// row came for `batch_idle` (zero: none is waiting). `batch` is empty.
async fn fill_batch(
    settings: &DeliveryConfig,
    first: Message,
    puller: &mut Puller,
    lease: &Lease,
    batch: &mut Vec<Message>,
) {
    let mut bytes = first.payload.len();
    batch.push(first);
    let deadline = Instant::now() + settings.batch_wait;
    // Only an idle gap shorter than the wait can close a batch first;
    // with a gap of the whole wait no clock is read per row.
    let closes_when_idle = settings.batch_idle < settings.batch_wait;
    // Past the lease, no further pull request (see `UnitWorker::run`).
    while batch.len() < settings.batch_rows && bytes < settings.batch_bytes && lease.held() {
        // A batch at low load goes when its rows stop coming, not after the
        // whole wait: that wait was most of a row's way to its sink.
        let until = if closes_when_idle {
            deadline.min(Instant::now() + settings.batch_idle)
        } else {
            deadline
        };
        match puller.next_until(Some(until)).await {
            Some(message) => {
                bytes += message.payload.len();
                batch.push(message);
            }
            // Out of tokio's cooperative budget a waiting row looks absent,
            // which would close a batch at ~128 rows under load: yield (the
            // thread's other tasks run, the budget is renewed) and look again.
            None if !tokio::task::coop::has_budget_remaining() && Instant::now() < deadline => {
                tokio::task::yield_now().await;
            }
            None => break,
        }
    }
}
