//! A pipeline: the steps a table's rows go through, in order — transforms,
//! then an optional sink — and the verdict for every row that went in.
//!
//! A step takes a batch and gives each row's outcome and the rows it
//! passes on ([`Stepped`]). The one plugin granted `state` runs wrapped in
//! the stateful step (`state::step`), which reads the batch's scopes
//! before the first step and writes them once every row has its verdict.
//!
//! A row's verdict is the worst of what happened to it and to every row it
//! was turned into: one descendant asking for a retry retries the original,
//! one dead-lettered descendant dead-letters it.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::config::Pipeline as PipelineConfig;
use crate::delivery::batch::{Batch, Outcome};
use crate::delivery::traced::CallRecord;
use crate::delivery::verdict::Verdict;
use crate::destination::{ObjectsStep, PostgresStep, PublishStep, Publisher};
use crate::fence::{Fence, Fenced};
use crate::sandbox::{CallError, Plugin};
use crate::state::landing::Landing;
use crate::state::step::StateStep;
use crate::state::store::UnitState;
use crate::telemetry::traces::TRACEPARENT;

mod reply;
mod step;

pub(super) use reply::Reply;
pub(super) use reply::read;
use step::{Role, Step};
pub(super) use step::{call_span, warm};

impl Verdict {
    /// The verdict of a plugin's outcome for a row (`Ok` and `Emit` leave the
    /// row to the steps after: done here); `what` names the plugin's role.
    fn of(outcome: &RowOutcome, plugin: &Arc<Plugin>, what: &str) -> Verdict {
        match outcome {
            RowOutcome::Ok | RowOutcome::Emit(_) => Verdict::Done,
            RowOutcome::Retry(delay_ms) => Verdict::Retry {
                delay: Duration::from_millis((*delay_ms).into()),
                plugin: Some(plugin.clone()),
                reason: format!("{what} `{}` asked for a retry", plugin.name()),
            },
            RowOutcome::DeadLetter(reason) => Verdict::DeadLetter {
                plugin: Some(plugin.clone()),
                reason: reason.clone(),
            },
        }
    }
}

/// A plugin call failed: the whole batch goes back for a retry.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct StepFailure {
    pub plugin: Arc<Plugin>,
    pub error: CallError,
}

/// Why a pipeline run ended without verdicts.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Failed(#[from] StepFailure),
    /// The host's lease ran out before the sink call: the unit may be
    /// someone else's now, so nothing was delivered.
    #[error("the lease ran out before the sink call")]
    Fenced(Fenced),
}

// Not `#[from]`: that would make `Fenced` the error's source, and a report
// of the chain would say the lease ran out twice.
impl From<Fenced> for RunError {
    fn from(fenced: Fenced) -> RunError {
        RunError::Fenced(fenced)
    }
}

/// Why one run of a batch ended without verdicts: as [`RunError`], or the
/// destination could not take it now and the batch is to run again.
enum Attempt {
    Stop(RunError),
    Again(String),
}

impl<E: Into<RunError>> From<E> for Attempt {
    fn from(err: E) -> Attempt {
        Attempt::Stop(err.into())
    }
}

/// How long a batch waits before it runs again while its destination cannot
/// take it: doubling from the first to the last.
const AGAIN_FIRST_PAUSE: Duration = Duration::from_millis(250);
const AGAIN_LAST_PAUSE: Duration = Duration::from_secs(5);

/// What a step decided for one row it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowOutcome {
    /// Passed on as it is (a transform), or delivered (a sink).
    Ok,
    /// Replaced by this many rows (none: dropped).
    Emit(usize),
    /// Asked to be retried after this many milliseconds.
    Retry(u32),
    DeadLetter(String),
}

impl From<Outcome<'_>> for RowOutcome {
    fn from(outcome: Outcome<'_>) -> RowOutcome {
        match outcome {
            Outcome::Ok => RowOutcome::Ok,
            Outcome::Emit(range) => RowOutcome::Emit(range.len()),
            Outcome::Retry(ms) => RowOutcome::Retry(ms),
            Outcome::DeadLetter(reason) => RowOutcome::DeadLetter(reason.to_string()),
        }
    }
}

/// What a step made of the rows it was given.
#[derive(Debug)]
pub enum Stepped {
    /// Every row passed on as it is: the same batch goes on (no copy).
    Unchanged,
    /// Each given row's outcome, the rows passed on (a sink passes none)
    /// and, per row passed on, the given row it came from.
    Changed {
        outcomes: Vec<RowOutcome>,
        rows: Batch,
        parents: Vec<usize>,
    },
}

/// Sees every answer of a runner's steps (`weir plugin test` reports them).
pub trait Observer: Send + Sync {
    /// `plugin` answered `stepped` for the rows `given`.
    fn answered(&self, plugin: &Plugin, given: &Batch, stepped: &Stepped);

    /// Whether it also sees the calls of isolation's lanes (rows run alone
    /// after a deadline), not only those of the runner it was given to.
    fn sees_lanes(&self) -> bool {
        true
    }
}

/// The rows on their way through a pipeline: as the next step gets them,
/// and each one's input row. The batch given is borrowed: only a step that
/// changes the rows makes a batch of its own.
struct Flow<'a> {
    given: &'a Batch,
    /// The rows as the last step that changed them made them.
    made: Option<Batch>,
    origins: Vec<usize>,
}

impl Flow<'_> {
    /// The rows now.
    fn rows(&self) -> &Batch {
        self.made.as_ref().unwrap_or(self.given)
    }

    /// Only the rows `kept` (indexes of the rows now) go on.
    fn keep(&mut self, kept: &[usize]) {
        let now = self.rows();
        let mut rows = Batch::with_capacity(kept.len(), now.data_len());
        for &row in kept {
            rows.push_from(now, row);
        }
        self.origins = kept.iter().map(|&row| self.origins[row]).collect();
        self.made = Some(rows);
    }

    /// Folds a step's outcomes into the input rows' verdicts; the rows it
    /// passed on go on.
    fn after(self, stepped: Stepped, verdicts: &mut [Verdict], step: &Step) -> Self {
        let Stepped::Changed {
            outcomes,
            rows,
            parents,
        } = stepped
        else {
            return self;
        };
        let what = match step.role {
            Role::Transform => "plugin",
            Role::Sink => "sink",
        };
        for (outcome, &origin) in outcomes.iter().zip(&self.origins) {
            verdicts[origin].merge(Verdict::of(outcome, &step.plugin, what));
        }
        let origins = parents.iter().map(|&parent| self.origins[parent]).collect();
        Flow {
            given: self.given,
            made: Some(rows),
            origins,
        }
    }
}

/// Runs one pipeline for one delivery worker. Not shared: each worker owns
/// its instances, so a call never waits for another worker's.
pub struct PipelineRunner {
    /// The transforms in order, then the sink.
    steps: Vec<Step>,
    observer: Option<Arc<dyn Observer>>,
    /// The calls made on rows of traced requests since the last take;
    /// `None`: not recorded (traces are off).
    calls: Option<Vec<CallRecord>>,
    /// The unit whose ledger a sink granted `postgres` commits in, and
    /// whether it commits: what a lane's destinations are made with.
    destination: Option<(String, bool)>,
    /// Where a sink granted `nats` publishes.
    publisher: Option<Publisher>,
    /// What the rows its isolation lanes ran wait for, until the batch's
    /// landing is taken.
    lanes_landing: Landing,
    /// The last run's vector of verdicts, given back ([`Self::keep_verdicts`])
    /// to hold the next run's.
    spare_verdicts: Vec<Verdict>,
}

impl PipelineRunner {
    /// `lookup` gives the loaded version of each named plugin; `state` is
    /// the state store, for a plugin granted `state`.
    pub fn new(
        config: &PipelineConfig,
        lookup: impl Fn(&str) -> Option<Arc<Plugin>>,
        state: Option<UnitState>,
    ) -> Option<PipelineRunner> {
        let step = |role: Role, name: &String| lookup(name).map(|plugin| Step::of(role, plugin));
        let mut steps: Vec<Step> = config
            .transforms
            .iter()
            .map(|name| step(Role::Transform, name))
            .collect::<Option<_>>()?;
        if let Some(name) = &config.sink {
            steps.push(step(Role::Sink, name)?);
        }
        // At most one plugin is granted state (config check): the first.
        if let Some(state) = state
            && let Some((step, limits)) = steps
                .iter_mut()
                .find_map(|step| step.plugin.config.grants.state.map(|limits| (step, limits)))
        {
            step.state = Some(StateStep::new(step.plugin.name(), limits, state));
        }
        Some(PipelineRunner {
            steps,
            observer: None,
            calls: None,
            destination: None,
            publisher: None,
            lanes_landing: Landing::default(),
            spare_verdicts: Vec::new(),
        })
    }

    /// Takes back a vector of verdicts [`Self::run`] returned, for the next
    /// run: a batch then costs no allocation of its rows' size here.
    pub fn keep_verdicts(&mut self, mut verdicts: Vec<Verdict>) {
        verdicts.clear();
        if verdicts.capacity() >= self.spare_verdicts.capacity() {
            self.spare_verdicts = verdicts;
        }
    }

    /// A runner of the same pipeline on instances of its own, without state
    /// and without an observer that does not watch lanes: one lane of a
    /// deadline's isolation (`delivery::isolation`).
    pub fn lane(&self) -> PipelineRunner {
        let mut lane = PipelineRunner {
            steps: self
                .steps
                .iter()
                .map(|step| Step::of(step.role, step.plugin.clone()))
                .collect(),
            observer: self
                .observer
                .clone()
                .filter(|observer| observer.sees_lanes()),
            calls: None,
            destination: None,
            publisher: None,
            lanes_landing: Landing::default(),
            spare_verdicts: Vec::new(),
        };
        if let Some((unit, commits)) = &self.destination {
            lane = lane.with_destination(unit, *commits);
            // A lane's rows go into the runner's objects: one owner of the
            // unit's log.
            for (step, own) in lane.steps.iter_mut().zip(&self.steps) {
                if let (Some(objects), Some(own)) = (&mut step.objects, &own.objects) {
                    objects.share(own);
                }
            }
        }
        match &self.publisher {
            Some(publisher) => lane.with_publisher(publisher),
            None => lane,
        }
    }

    /// The same runner, its sink's statements committed (or, when not
    /// `commits`, always rolled back: `weir plugin test`) in the ledger of
    /// `unit` (the unit consumer's name), if the sink is granted `postgres`.
    pub fn with_destination(mut self, unit: &str, commits: bool) -> PipelineRunner {
        self.destination = Some((unit.to_string(), commits));
        for step in &mut self.steps {
            if step.role == Role::Sink
                && let Some(pool) = &step.plugin.postgres
            {
                step.postgres = Some(PostgresStep::new(
                    pool.clone(),
                    step.plugin.name(),
                    unit.to_string(),
                    commits,
                ));
            }
            if step.role == Role::Sink
                && let Some(grant) = &step.plugin.config.grants.nats
            {
                step.nats = Some(PublishStep::new(step.plugin.name(), grant.clone(), commits));
            }
            if step.role == Role::Sink
                && let Some(destination) = &step.plugin.objects
            {
                step.objects = Some(ObjectsStep::new(
                    destination.clone(),
                    step.plugin.name(),
                    unit.to_string(),
                    commits,
                ));
            }
        }
        self
    }

    /// The same runner, its sink's publishes (if granted `nats`) sent
    /// through `publisher`.
    pub fn with_publisher(mut self, publisher: &Publisher) -> PipelineRunner {
        self.publisher = Some(publisher.clone());
        for nats in self.steps.iter_mut().filter_map(|step| step.nats.as_mut()) {
            nats.set_publisher(publisher.clone());
        }
        self
    }

    /// The same runner, showing `observer` every step's answer.
    pub fn observed(mut self, observer: Arc<dyn Observer>) -> PipelineRunner {
        self.observer = Some(observer);
        self
    }

    /// Records from now on the calls made on rows of traced requests.
    pub fn record_calls(&mut self) {
        self.calls.get_or_insert_with(Vec::new);
    }

    /// The calls recorded since the last take.
    pub fn take_calls(&mut self) -> Vec<CallRecord> {
        self.calls.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn stateful(&mut self) -> impl Iterator<Item = &mut StateStep> {
        self.steps.iter_mut().filter_map(|step| step.state.as_mut())
    }

    /// The stateful step's commits return with their writes on their way
    /// (see [`StateStep::commit`]): the caller answers a batch's rows only
    /// once the batch's [`Landing`] landed ([`PipelineRunner::take_landing`]).
    pub fn overlap_state_writes(&mut self) {
        self.stateful().for_each(StateStep::overlap_writes);
    }

    /// The state writes of the batch just run, on their way, and the
    /// commits of the objects its rows went into.
    pub fn take_landing(&mut self) -> Landing {
        let mut landing = std::mem::take(&mut self.lanes_landing);
        for state in self.stateful() {
            landing.join(state.take_landing());
        }
        for step in &mut self.steps {
            for waiting in step.waiting.drain(..) {
                landing.wait_for_object(
                    step.plugin.name(),
                    waiting.path,
                    waiting.sequences,
                    waiting.outcome,
                );
            }
        }
        landing
    }

    /// Its sink's objects go where the same sink's of the runners before
    /// it go (`first`, by sink, filled as runners come): one owner of a
    /// unit's log per sink and host.
    pub fn share_objects(&mut self, first: &mut Vec<ObjectsStep>) {
        for objects in self
            .steps
            .iter_mut()
            .filter_map(|step| step.objects.as_mut())
        {
            match first.iter().find(|other| other.sink() == objects.sink()) {
                Some(other) => objects.share(other),
                None => first.push(objects.shared_handle()),
            }
        }
    }

    /// Whether its sink fills objects: its rows wait for their object's
    /// commit, many batches later.
    pub fn fills_objects(&self) -> bool {
        self.steps.iter().any(|step| step.objects.is_some())
    }

    /// What rows run by an isolation lane of this runner wait for.
    pub fn keep_landing(&mut self, landing: Landing) {
        self.lanes_landing.join(landing);
    }

    /// Seals every object its sink is filling, to be committed now (the
    /// unit is released, or the generation changes).
    pub fn flush_objects(&self) {
        for objects in self.steps.iter().filter_map(|step| step.objects.as_ref()) {
            objects.flush();
        }
    }

    /// Whether a plugin of this pipeline keeps durable state.
    pub fn is_stateful(&self) -> bool {
        self.steps.iter().any(|step| step.state.is_some())
    }

    /// Whether a step remembers the rows it applied (durable state, a
    /// destination's ledger), which the unit's ack floor lets it forget.
    pub fn remembers_applied(&self) -> bool {
        self.steps
            .iter()
            .any(|step| step.state.is_some() || step.postgres.is_some() || step.objects.is_some())
    }

    /// The unit consumer's ack floor: what a stateful step or a
    /// destination's ledger may forget.
    pub fn set_ack_floor(&mut self, floor: u64) {
        self.stateful().for_each(|state| state.set_ack_floor(floor));
        self.steps
            .iter_mut()
            .filter_map(|step| step.postgres.as_mut())
            .for_each(|postgres| postgres.set_ack_floor(floor));
        self.steps
            .iter()
            .filter_map(|step| step.objects.as_ref())
            .for_each(|objects| objects.set_ack_floor(floor));
    }

    /// Rows whose acks the server applied: they never come back, so the
    /// scopes this runner holds need not remember them.
    pub fn forget_applied(&mut self, sequences: &[u64]) {
        self.stateful()
            .for_each(|state| state.forget_applied(sequences));
    }

    /// Runs `rows` through every step; returns one verdict per input row.
    /// Nothing reaches the sink, or the state, once `lease` no longer holds.
    /// While the sink's database cannot take the batch (it is down, the
    /// connection was lost), the batch waits and runs again, as long as the
    /// lease holds: an outage delays rows, it does not use up their deliveries.
    pub async fn run(&mut self, rows: Batch, lease: &dyn Fence) -> Result<Vec<Verdict>, RunError> {
        self.run_on(&rows, lease).await
    }

    /// [`Self::run`] on rows the caller keeps (isolation calls parts of
    /// them again; a worker packs the next batch into their buffers).
    pub async fn run_on(
        &mut self,
        rows: &Batch,
        lease: &dyn Fence,
    ) -> Result<Vec<Verdict>, RunError> {
        if !self
            .steps
            .iter()
            .any(|step| step.postgres.is_some() || step.nats.is_some() || step.objects.is_some())
        {
            return match self.run_once(rows, lease).await {
                Ok(verdicts) => Ok(verdicts),
                Err(Attempt::Stop(err)) => Err(err),
                // Only a destination asks for another run.
                Err(Attempt::Again(_)) => Err(Fenced.into()),
            };
        }
        let mut pause = AGAIN_FIRST_PAUSE;
        let mut waiting_since: Option<tokio::time::Instant> = None;
        loop {
            match self.run_once(rows, lease).await {
                Ok(verdicts) => {
                    if let Some(since) = waiting_since {
                        tracing::info!(waited = ?since.elapsed(), "the sink's destination takes the batch again");
                    }
                    return Ok(verdicts);
                }
                Err(Attempt::Stop(err)) => return Err(err),
                Err(Attempt::Again(reason)) => {
                    if waiting_since.is_none() {
                        tracing::warn!(%reason, "the sink's destination cannot take the batch; it waits and runs again");
                        waiting_since = Some(tokio::time::Instant::now());
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(AGAIN_LAST_PAUSE);
                    if !lease.held() {
                        return Err(Fenced.into());
                    }
                }
            }
        }
    }

    async fn run_once(&mut self, rows: &Batch, lease: &dyn Fence) -> Result<Vec<Verdict>, Attempt> {
        let mut verdicts = std::mem::take(&mut self.spare_verdicts);
        verdicts.clear();
        verdicts.resize(rows.len(), Verdict::Done);
        // Each input row's request, if traced (only while recording).
        let traced: Vec<Option<Arc<str>>> = match self.calls {
            Some(_) => (0..rows.len())
                .map(|row| {
                    rows.headers(row)
                        .find(|(name, _)| name.eq_ignore_ascii_case(TRACEPARENT))
                        .map(|(_, value)| Arc::from(value))
                })
                .collect(),
            None => Vec::new(),
        };
        let mut flow = Flow {
            given: rows,
            made: None,
            origins: (0..rows.len()).collect(),
        };
        for step in &mut self.steps {
            if !step
                .begin(&mut flow, &mut verdicts)
                .await
                .map_err(Attempt::Again)?
            {
                return Ok(verdicts);
            }
        }
        let mut reached = None;
        for step in &mut self.steps {
            if step.role == Role::Sink {
                reached = Some(flow.origins.clone());
            }
            if flow.rows().is_empty() {
                break;
            }
            let observer = self.observer.as_deref();
            let requests = requests_among(&traced, &flow.origins);
            let (began, clock) = (SystemTime::now(), Instant::now());
            let called = step.call(flow, &mut verdicts, lease, observer).await;
            if let Some(calls) = self.calls.as_mut()
                && !requests.is_empty()
            {
                calls.push(CallRecord {
                    plugin: step.plugin.clone(),
                    began,
                    took: clock.elapsed(),
                    requests,
                    error: called.as_ref().err().map(ToString::to_string),
                });
            }
            flow = called?;
        }
        for step in &mut self.steps {
            step.finish(&mut verdicts, lease).await?;
        }
        // Without a sink, rows that come out of the last transform are done.
        let reached = reached.unwrap_or(flow.origins);
        mark_dropped(&mut verdicts, &reached);
        Ok(verdicts)
    }
}

/// The traced requests of the input rows `origins` (each once, with its
/// rows), from each input row's `traced` request.
fn requests_among(traced: &[Option<Arc<str>>], origins: &[usize]) -> Vec<(Arc<str>, u32)> {
    let mut requests: Vec<(Arc<str>, u32)> = Vec::new();
    for request in origins.iter().filter_map(|&row| traced.get(row)?.as_ref()) {
        // Rows of one request come together: the last entry is the usual hit.
        match requests.iter_mut().rev().find(|(r, _)| r == request) {
            Some((_, rows)) => *rows += 1,
            None => requests.push((request.clone(), 1)),
        }
    }
    requests
}

/// Rows done without a descendant in `reached` (the origins of the rows
/// given to the sink) were dropped on the way.
fn mark_dropped(verdicts: &mut [Verdict], reached: &[usize]) {
    let mut kept = vec![false; verdicts.len()];
    for &origin in reached {
        if let Some(kept) = kept.get_mut(origin) {
            *kept = true;
        }
    }
    for (verdict, kept) in verdicts.iter_mut().zip(kept) {
        if !kept && matches!(verdict, Verdict::Done) {
            *verdict = Verdict::Dropped;
        }
    }
}

#[cfg(test)]
mod tests;
