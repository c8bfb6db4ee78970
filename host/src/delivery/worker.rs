//! Delivery: a worker per unit pulls batches (bounded by rows, bytes and
//! wait), runs each table's pipeline, and settles every row by its verdict:
//! ack, nak with a delay, or dead-letter then ack. Each batch goes one way
//! through the stages (`delivery` names them): pull, intake, dispatch,
//! hold, settle; the worker hands each stage's output to the next.
//!
//! Architecture invariant: a row is acked only after its pipeline finished
//! with it, or after its dead letter was stored. A crash at any point before
//! that means redelivery, never loss.
//!
//! Fencing: a worker runs under the [`Lease`] its unit was claimed under and
//! checks it right before every sink call, dead letter and answer; once it
//! no longer holds, the batch is abandoned unanswered (the next owner gets
//! its rows back) and the worker stops. The worker alone holds the lease;
//! what it calls sees it as a [`crate::fence::Fence`].

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
use crate::delivery::dispatch::dispatch;
use crate::delivery::hold::{Hold, RanBatch, Vectors, max_held_rows};
use crate::delivery::intake::Intake;
use crate::delivery::isolation::RowVerdict;
use crate::delivery::progress::{keep_alive, progress_period};
use crate::delivery::pull::{Puller, fill_batch, pull_size};
use crate::delivery::runners::Runners;
use crate::delivery::settle::{Settler, confirm_acks};
use crate::delivery::shadow::Shadows;
use crate::delivery::traced;
use crate::destination::Publisher;
use crate::fence::Fenced;
use crate::nats::ack;
use crate::nats::kv::NatsKv;
use crate::reload::generation::Generation;
use crate::state::prune::{AppliedPruning, CONFIRM_TIMEOUT};
use crate::state::store::{StateStore, UnitState};
use crate::telemetry::traces::Traces;
use crate::telemetry::{Metrics, UnitLabels};
use crate::topology::route::{Names, Unit};

#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error("unit {consumer}: cannot bind its consumer: {source}")]
    Bind {
        consumer: String,
        source: crate::delivery::pull::PullError,
    },
}

/// Pulls one unit and runs its rows through their pipelines.
pub struct UnitWorker {
    js: jetstream::Context,
    /// Answers rows in progress and asks the server about the unit.
    client: Client,
    router: Names,
    unit: Unit,
    /// The unit consumer's name.
    consumer: String,
    settings: DeliveryConfig,
    pipelines: Arc<Generation>,
    /// Where a hot reload publishes a new generation of pipelines; looked at
    /// only between batches, so a batch runs start to end on one version.
    generations: watch::Receiver<Arc<Generation>>,
    runners: Runners,
    hold: Hold,
    settler: Settler,
    metrics: Metrics,
    state: Option<UnitState>,
    applied: AppliedPruning,
    /// The ack subject of the last row acked (see `Settled::last_ack`).
    last_ack: Option<async_nats::Subject>,
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
    /// The vectors of a batch's intake and of isolation's results, kept
    /// for the next.
    intake_spare: Intake,
    results: Vec<RowVerdict>,
    /// When the held rows were last answered "in progress".
    held_alive: Instant,
}

/// What comes before the next batch.
enum Next {
    /// Its first row.
    Row(Message),
    /// The unit is released: finish what is here.
    Released,
    /// The lease ran out, with a batch of this many rows in hand besides
    /// those held (see [`UnitWorker::fenced`]).
    Fenced(usize),
}

/// The lease ran out with this many rows in hand besides those held: the
/// batch whose run or settlement it ended.
struct Abandoned(usize);

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
        let consumer = router.unit_consumer(unit);
        let publisher = Publisher::new(js.clone(), router.partition_stream(unit.partition));
        let runners = Runners::build(&pipelines, state.as_ref(), &consumer, &publisher, &shadows);
        let settler = Settler::new(
            &js,
            router.clone(),
            router.partition_stream(unit.partition),
            settings.clone(),
            metrics.clone(),
            UnitLabels {
                unit: consumer.clone(),
            },
            pipelines.config().dead_letters.redact.clone(),
        );
        UnitWorker {
            client: js.client(),
            js,
            router,
            unit,
            consumer,
            settings,
            pipelines,
            generations,
            runners,
            hold: Hold::default(),
            settler,
            metrics,
            behind: Arc::new(|| None),
            traces: Traces::default(),
            state,
            applied: AppliedPruning::default(),
            last_ack: None,
            publisher,
            settled: None,
            shadows,
            intake_spare: Intake::default(),
            results: Vec::new(),
            held_alive: Instant::now(),
        }
    }

    /// Pulls and runs batches until `release`; then finishes every row
    /// already here and waits (up to `drain_timeout`) until the server
    /// confirms their answers applied, so the next owner, or this host
    /// after a restart, starts exactly where this one stopped (rows still
    /// on their way come back to it when its claim creates the consumer).
    /// Aborting the task instead (a host that lost its membership) leaves
    /// the rows to redelivery, and so does the worker itself once `lease`
    /// no longer holds (it stops pulling, calls no sink and answers no row:
    /// [`UnitEnd::Fenced`]).
    pub async fn run(
        mut self,
        release: CancellationToken,
        mut lease: Lease,
        settled_through: u64,
    ) -> Result<UnitEnd, DeliveryError> {
        let stream = self.router.partition_stream(self.unit.partition);
        let (js, consumer) = (self.js.clone(), self.consumer.clone());
        let fence = Box::new(lease.clone());
        let size = pull_size(&self.settings);
        let mut puller = Puller::open(js, stream, consumer, size, fence, settled_through)
            .await
            .map_err(|source| DeliveryError::Bind {
                consumer: self.consumer.clone(),
                source,
            })?;
        loop {
            let first = match self.next_row(&mut puller, &mut lease, &release).await {
                Next::Row(first) => first,
                Next::Released => break,
                Next::Fenced(rows) => return Ok(self.fenced(rows)),
            };
            let began = Instant::now();
            let mut vectors = self.hold.buffers(self.settings.batch_rows);
            fill_batch(
                &self.settings,
                first,
                &mut puller,
                &lease,
                &mut vectors.messages,
            )
            .await;
            let processed = self
                .process(vectors, began, Some(&mut puller), &lease)
                .await;
            if let Err(Abandoned(rows)) = processed {
                return Ok(self.fenced(rows));
            }
        }
        Ok(self.finish_released(puller.release().await, &lease).await)
    }

    /// Waits for the first row of the next batch. Held batches go on
    /// while it waits: each is settled as soon as its writes landed (and
    /// every one after it that landed too), their rows kept alive meanwhile.
    async fn next_row(
        &mut self,
        puller: &mut Puller,
        lease: &mut Lease,
        release: &CancellationToken,
    ) -> Next {
        loop {
            if let Err(Abandoned(rows)) = self.settle_landed(lease).await {
                return Next::Fenced(rows);
            }
            let holding = self.hold.is_holding();
            let period = progress_period(self.settings.ack_wait);
            let alive_due = holding.then(|| self.held_alive + period);
            // Waits no longer than the unit's summary is due (an idle unit
            // still says what it dead-lettered), nor than held rows may go
            // unanswered.
            let until = [self.settler.summary_due(), alive_due]
                .into_iter()
                .flatten()
                .min();
            // Biased: a worker past its lease sends no further pull
            // request, which would be served rows of the unit's next owner.
            // Both waits after it are cancel-safe: a landing keeps what
            // landed, the puller what it received.
            let first = tokio::select! {
                biased;
                _ = release.cancelled() => return Next::Released,
                _ = lease.lost() => return Next::Fenced(0),
                () = self.hold.front_landed(), if holding => continue,
                first = puller.next_until(until) => first,
            };
            match first {
                Some(first) => return Next::Row(first),
                None => {
                    self.settler.flush_summary();
                    self.keep_held_alive_within(lease).await;
                }
            }
        }
    }

    /// Released: every row already here is run and settled (in batches),
    /// and the server's confirmation of their answers waited for.
    async fn finish_released(&mut self, mut rest: Vec<Message>, lease: &Lease) -> UnitEnd {
        // The held batches ran before these rows: they are answered first.
        if let Err(Abandoned(rows)) = self.settle_held(lease, false).await {
            return self.fenced(rows);
        }
        while !rest.is_empty() {
            let tail = rest.split_off(rest.len().min(self.settings.batch_rows));
            let batch = std::mem::replace(&mut rest, tail);
            let rows = batch.len();
            let vectors = Vectors {
                messages: batch,
                ..self.hold.buffers(rows)
            };
            let processed = self.process(vectors, Instant::now(), None, lease).await;
            if let Err(Abandoned(rows)) = processed {
                return self.fenced(rows);
            }
        }
        let last_ack = self.last_ack.clone();
        self.settler
            .confirm_applied(last_ack, self.settings.drain_timeout)
            .await;
        self.settler.stopped();
        UnitEnd::Drained
    }

    /// The lease ran out (with a batch of `in_hand` rows in hand, if any,
    /// and every held batch, all abandoned): said once per worker, which
    /// stops here.
    fn fenced(&mut self, in_hand: usize) -> UnitEnd {
        let rows = in_hand + self.hold.held_rows();
        self.settler.stopped();
        if rows > 0 {
            self.metrics.fenced_batches.inc();
        }
        tracing::warn!(
            unit = ?self.unit,
            consumer = %self.consumer,
            rows,
            "this host's lease ran out: the unit may be another host's now, so this batch is \
             abandoned unanswered (its rows go to the next owner) and the unit is no longer pulled here"
        );
        UnitEnd::Fenced
    }

    /// Runs a batch (the messages of `vectors`, its other vectors empty)
    /// through its pipelines, keeping its rows alive while it runs, then
    /// holds it until it and the batches before it settle (at once, if
    /// nothing is on its way). `puller`:
    /// where rows received meanwhile are kept alive too (`None`: released,
    /// no batch comes after this one to overlap its writes). `began`: when
    /// its first row was pulled.
    async fn process(
        &mut self,
        vectors: Vectors,
        began: Instant,
        puller: Option<&mut Puller>,
        lease: &Lease,
    ) -> Result<(), Abandoned> {
        let span =
            tracing::info_span!("batch", unit = %self.consumer, rows = vectors.messages.len());
        let processed = self
            .process_in_span(vectors, began, puller, lease)
            .instrument(span)
            .await;
        self.metrics
            .batch_duration
            .observe(began.elapsed().as_secs_f64());
        processed
    }

    /// pull → intake → dispatch → hold → settle, each stage given the
    /// last one's output.
    async fn process_in_span(
        &mut self,
        vectors: Vectors,
        began: Instant,
        mut puller: Option<&mut Puller>,
        lease: &Lease,
    ) -> Result<(), Abandoned> {
        let Vectors {
            messages: batch,
            verdicts,
            mut deliveries,
        } = vectors;
        let rows = batch.len();
        let caught_up = self.catch_up(&batch, puller.as_deref_mut(), lease).await;
        caught_up.map_err(|Abandoned(held)| Abandoned(held + rows))?;
        self.before_batch(puller.as_deref_mut(), lease).await;
        let spare = std::mem::take(&mut self.intake_spare);
        let intake = Intake::of(
            &batch,
            &mut deliveries,
            &self.router,
            &self.pipelines,
            self.unit,
            spare,
        );
        let work = dispatch(
            &mut self.runners,
            &intake,
            &self.pipelines,
            lease,
            self.traces.enabled(),
            verdicts,
            &mut self.results,
        );
        let rows_alive = batch.iter().chain(self.hold.held_messages());
        let ack_wait = self.settings.ack_wait;
        let ran = keep_alive(
            rows_alive,
            &self.client,
            puller.as_deref_mut(),
            ack_wait,
            lease,
            work,
        )
        .await;
        self.intake_spare = intake.spare();
        let ran = RanBatch {
            messages: batch,
            deliveries,
            ran: ran.map_err(|Fenced| Abandoned(rows))?,
            began,
        };
        self.hold.ran(ran);
        self.settle_held(lease, puller.is_some()).await
    }

    /// Before a batch runs: it runs start to end on one generation (the
    /// batches held before it settled first if a new one came), and only
    /// on the fleet's plugin versions (kept alive meanwhile).
    async fn catch_up(
        &mut self,
        batch: &[Message],
        puller: Option<&mut Puller>,
        lease: &Lease,
    ) -> Result<(), Abandoned> {
        if self.generations.has_changed().unwrap_or(false) {
            self.settle_held(lease, false).await?;
        }
        self.adopt_new_generation();
        let Some(reason) = (self.behind)() else {
            return Ok(());
        };
        self.settle_held(lease, false).await?;
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
        let ack_wait = self.settings.ack_wait;
        keep_alive(
            batch.iter(),
            &self.client,
            puller,
            ack_wait,
            lease,
            caught_up,
        )
        .await;
        self.adopt_new_generation();
        Ok(())
    }

    /// What a batch needs done first: the applied rows pruned, the rows
    /// received for later batches and those held kept alive, and its
    /// number given out.
    async fn before_batch(&mut self, puller: Option<&mut Puller>, lease: &Lease) {
        self.metrics.batches.inc();
        if self.runners.remembers_applied() {
            self.prune_applied().await;
        }
        if let Some(puller) = puller
            && lease.held()
        {
            puller
                .keep_received_alive_within(progress_period(self.settings.ack_wait))
                .await;
        }
        // Short batches get no tick of their own: held rows, which may
        // wait through many of them, are answered here.
        self.keep_held_alive_within(lease).await;
    }

    /// Settles the held batches whose writes landed, oldest first, up to
    /// the first one whose writes are still on their way.
    async fn settle_landed(&mut self, lease: &Lease) -> Result<(), Abandoned> {
        while let Some(batch) = self.hold.landed().await {
            let rows = batch.messages.len();
            self.settle(batch, lease)
                .await
                .map_err(|Fenced| Abandoned(rows))?;
        }
        Ok(())
    }

    /// Settles held batches in order, waiting for the front one's writes
    /// while the hold may not keep it ([`Hold::must_wait`]; without
    /// `overlap`, until none is held).
    async fn settle_held(&mut self, lease: &Lease, overlap: bool) -> Result<(), Abandoned> {
        let fills_objects = self.runners.fill_objects();
        loop {
            self.settle_landed(lease).await?;
            if !self
                .hold
                .must_wait(overlap, max_held_rows(&self.settings, fills_objects))
            {
                return Ok(());
            }
            // What is waited for now must not wait for an object's age.
            self.runners.flush_objects();
            self.wait_front(lease)
                .await
                .map_err(|Fenced| Abandoned(0))?;
        }
    }

    /// Waits for the front held batch's writes to land, keeping the held
    /// rows alive meanwhile (an object's writes may take a minute).
    async fn wait_front(&mut self, lease: &Lease) -> Result<(), Fenced> {
        let mut lost = lease.clone();
        loop {
            let due = self.held_alive + progress_period(self.settings.ack_wait);
            // Each cancel-safe: what landed is kept.
            tokio::select! {
                () = self.hold.front_landed() => return Ok(()),
                () = lost.lost() => return Err(Fenced),
                () = tokio::time::sleep_until(due) => self.keep_held_alive_within(lease).await,
            }
        }
    }

    /// Answers every held row "in progress", unless that was done within a
    /// progress period (which keeps it to once a period however many
    /// batches run).
    async fn keep_held_alive_within(&mut self, lease: &Lease) {
        let period = progress_period(self.settings.ack_wait);
        if !self.hold.is_holding() || self.held_alive.elapsed() < period {
            return;
        }
        // Past the lease a row's ack wait is the next owner's to run.
        if lease.held() {
            for message in self.hold.held_messages() {
                if let Err(err) = ack::reply(&self.client, message, AckKind::Progress).await {
                    tracing::debug!(error = %err, "cannot extend a held row's ack wait");
                }
            }
        }
        self.held_alive = Instant::now();
    }

    /// Answers every row of a batch run (acks, naks, dead letters) and
    /// tells who listens.
    async fn settle(&mut self, mut batch: RanBatch, lease: &Lease) -> Result<(), Fenced> {
        let traced = self
            .traces
            .enabled()
            .then(|| traced::traced_requests(&batch.messages, &batch.ran.verdicts));
        let mut settled = self
            .settler
            .settle(
                &batch.messages,
                &batch.deliveries,
                &mut batch.ran.verdicts,
                batch.ran.stateful,
                lease,
            )
            .await;
        if let (Some(traced), false) = (traced, settled.fenced) {
            let took = batch.began.elapsed();
            traced::record(&self.traces, &self.consumer, took, traced, &batch.ran.calls);
        }
        self.applied.answered(&mut settled.acked);
        if settled.last_ack.is_some() {
            self.last_ack = settled.last_ack.take();
        }
        if let Some(hook) = &self.settled {
            hook(self.unit.partition, settled.delivered);
        }
        self.hold.settled(batch);
        settled.result()
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
        self.runners = Runners::build(
            &next,
            self.state.as_ref(),
            &self.consumer,
            &self.publisher,
            &self.shadows,
        );
        if let Some(floor) = self.applied.floor() {
            self.runners.set_ack_floor(floor);
        }
        self.settings = next.config().delivery.clone();
        let redact = next.config().dead_letters.redact.clone();
        self.settler.adopt(self.settings.clone(), redact);
        self.pipelines = next;
        tracing::debug!(unit = ?self.unit, "running a new generation of pipelines");
    }

    /// Before a stateful pipeline's batch: drops from the scopes the
    /// sequences of rows whose acks the server confirmed, asks it to
    /// confirm those answered since, and every [`ACK_FLOOR_PERIOD`] reads
    /// the consumer's ack floor.
    async fn prune_applied(&mut self) {
        let applied = &mut self.applied;
        if let Some(sequences) = applied.confirmed().await {
            self.runners.forget_applied(&sequences);
        }
        if applied.wants_confirmation()
            && let Some(last_ack) = self.last_ack.clone()
        {
            let client = self.client.clone();
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
        let consumer = &self.consumer;
        match crate::nats::jetstream::ack_floor(&self.client, &stream, consumer).await {
            Ok(floor) => {
                applied.floor_read(Some(floor));
                self.runners.set_ack_floor(floor);
            }
            Err(err) => {
                applied.floor_read(None);
                tracing::debug!(consumer, error = %err, "cannot read the unit's ack floor");
            }
        }
    }
}

pub use crate::delivery::isolation::ISOLATION_LANES;
