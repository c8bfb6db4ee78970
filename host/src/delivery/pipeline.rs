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

use tracing::Instrument;

use crate::config::Pipeline as PipelineConfig;
use crate::coordination::Lease;
use crate::delivery::batch::{Answer, Batch, Malformed, Outcome};
use crate::destination::{Ending, Finished, PostgresStep, PublishStep, Publisher};
use crate::reload::shadow::RowResult;
use crate::sandbox::bindings::{Delivered, Transformed};
use crate::sandbox::{CallError, FailureKind, Plugin, PluginInstance};
use crate::state::scope::Settled;
use crate::state::step::{RowEnd, StateStep};
use crate::state::store::UnitState;
use crate::telemetry::traces::TRACEPARENT;

pub use crate::delivery::verdict::Verdict;

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
    Fenced,
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
}

/// The rows on their way through a pipeline: as the next step gets them,
/// and each one's input row.
struct Flow {
    rows: Batch,
    origins: Vec<usize>,
    /// The first batch a step replaced: its buffers serve the next batch.
    spent: Option<Batch>,
}

impl Flow {
    /// Only the rows `kept` (indexes of the rows now) go on.
    fn keep(&mut self, kept: &[usize]) {
        let mut rows = Batch::with_capacity(kept.len(), self.rows.data_len());
        for &row in kept {
            rows.push_from(&self.rows, row);
        }
        self.origins = kept.iter().map(|&row| self.origins[row]).collect();
        let spent = std::mem::replace(&mut self.rows, rows);
        self.spent.get_or_insert(spent);
    }

    /// Folds a step's outcomes into the input rows' verdicts; the rows it
    /// passed on go on.
    fn after(self, stepped: Stepped, verdicts: &mut [Verdict], step: &Step) -> Flow {
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
            rows,
            origins,
            spent: self.spent.or(Some(self.rows)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Transform,
    Sink,
}

/// A plugin's answer to one call.
enum Reply {
    Transformed(Transformed),
    Delivered(Delivered),
}

/// One step: a loaded plugin version (a transform or the sink), the warm
/// instance running it, and the stateful step wrapping its call when it
/// is the pipeline's plugin granted `state`.
struct Step {
    role: Role,
    plugin: Arc<Plugin>,
    instance: Option<PluginInstance>,
    state: Option<StateStep>,
    /// The transaction step wrapping a sink granted `postgres`.
    postgres: Option<PostgresStep>,
    /// The publishes of a sink granted `nats`.
    nats: Option<PublishStep>,
    /// The input rows of the rows given to the last call.
    given: Vec<usize>,
}

/// The warm instance of `plugin` in `slot`, or a fresh one.
async fn warm<'a>(
    plugin: &Arc<Plugin>,
    slot: &'a mut Option<PluginInstance>,
) -> Result<&'a mut PluginInstance, StepFailure> {
    if slot.as_ref().is_some_and(PluginInstance::worn_out) {
        *slot = None;
    }
    match slot {
        Some(instance) => Ok(instance),
        None => {
            let fresh = plugin.instantiate().await.map_err(|error| StepFailure {
                plugin: plugin.clone(),
                error,
            })?;
            Ok(slot.insert(fresh))
        }
    }
}

impl Step {
    /// Before the batch enters the pipeline: the stateful step reads its
    /// scopes and settles the rows they settled before (their answer was
    /// lost) the same way again, without a call. False: every row comes
    /// back, nothing is to be called.
    /// `Err`: the destination cannot be read now; the batch runs again.
    async fn begin(&mut self, flow: &mut Flow, verdicts: &mut [Verdict]) -> Result<bool, String> {
        Ok(self.begin_state(flow, verdicts).await && self.begin_postgres(flow, verdicts).await?)
    }

    /// The destination step's part of [`Step::begin`]: rows a commit
    /// applied before are done without a call.
    async fn begin_postgres(
        &mut self,
        flow: &mut Flow,
        verdicts: &mut [Verdict],
    ) -> Result<bool, String> {
        let Some(postgres) = &mut self.postgres else {
            return Ok(true);
        };
        let rows = &flow.rows;
        let each = (0..rows.len()).map(|row| {
            let position = rows.position(row);
            (flow.origins[row], position.sequence, position.attempt)
        });
        let applied = postgres
            .begin(verdicts.len(), each)
            .await
            .map_err(|err| err.to_string())?;
        if applied.iter().any(|&applied| applied) {
            let fresh: Vec<usize> = (0..applied.len()).filter(|&row| !applied[row]).collect();
            flow.keep(&fresh);
        }
        Ok(true)
    }

    /// The stateful step's part of [`Step::begin`].
    async fn begin_state(&mut self, flow: &mut Flow, verdicts: &mut [Verdict]) -> bool {
        let Some(state) = &mut self.state else {
            return true;
        };
        let rows = &flow.rows;
        let each = (0..rows.len()).map(|row| {
            (
                rows.tenant(row),
                rows.table(row),
                rows.position(row).sequence,
            )
        });
        let settled = match state.begin(each).await {
            Ok(settled) => settled,
            Err(err) => {
                let reason = err.to_string();
                for verdict in verdicts {
                    verdict.retry_for_state(reason.clone());
                }
                return false;
            }
        };
        let mut fresh: Vec<usize> = Vec::with_capacity(rows.len());
        for (row, settled) in settled.into_iter().enumerate() {
            match settled {
                None => fresh.push(row),
                Some(Settled::Applied) => {}
                Some(Settled::DeadLettered) => {
                    verdicts[flow.origins[row]] = Verdict::DeadLetter {
                        plugin: None,
                        reason: format!(
                            "dead-lettered before by this pipeline (plugin `{}` keeps its state); \
                             its dead letter was not stored then",
                            state.plugin()
                        ),
                    }
                }
            }
        }
        if fresh.len() < flow.rows.len() {
            flow.keep(&fresh);
        }
        true
    }

    /// One call on the rows of `flow`. The sink is called only while
    /// `lease` holds, checked right before the call: transforms only
    /// compute, the sink is what the world sees.
    async fn call(
        &mut self,
        flow: Flow,
        verdicts: &mut [Verdict],
        lease: &Lease,
        observer: Option<&dyn Observer>,
    ) -> Result<Flow, RunError> {
        let span = call_span(&self.plugin);
        let instance = warm(&self.plugin, &mut self.instance).await?;
        if self.role == Role::Sink && !lease.held() {
            return Err(RunError::Fenced);
        }
        if let Some(state) = &mut self.state {
            instance.give_state(state.give(&flow.origins));
        }
        if let Some(postgres) = &mut self.postgres {
            instance.give_postgres(postgres.give());
            self.given.clone_from(&flow.origins);
        }
        if let Some(nats) = &mut self.nats {
            let rows = &flow.rows;
            let each = (0..rows.len()).map(|row| (flow.origins[row], rows.position(row).sequence));
            instance.give_nats(nats.give(verdicts.len(), each));
        }
        let packed = flow.rows.packed();
        let reply = match self.role {
            Role::Transform => instance
                .transform(packed)
                .instrument(span)
                .await
                .map(Reply::Transformed),
            Role::Sink => instance
                .deliver(packed)
                .instrument(span)
                .await
                .map(Reply::Delivered),
        };
        if let Some(state) = &mut self.state {
            state.took(instance.take_state());
        }
        if let Some(postgres) = &mut self.postgres {
            postgres.took(instance.take_postgres());
        }
        if let Some(nats) = &mut self.nats {
            nats.took(instance.take_nats());
        }
        let answered = reply
            .map_err(|error| self.failed(error))
            .and_then(|reply| read(&reply, &flow.rows).map_err(|err| self.malformed(err)));
        let stepped = match answered {
            Ok(stepped) => stepped,
            Err(failure) => {
                // Nothing of a failed call is written.
                if let Some(postgres) = &mut self.postgres {
                    postgres.abandon().await;
                }
                if let Some(nats) = &mut self.nats {
                    nats.abandon();
                }
                return Err(failure.into());
            }
        };
        if let Some(observer) = observer {
            observer.answered(&self.plugin, &flow.rows, &stepped);
        }
        Ok(flow.after(stepped, verdicts, self))
    }

    /// Once every input row has its verdict: the stateful step writes the
    /// scopes the call changed; rows whose scope was not written come back.
    async fn finish(&mut self, verdicts: &mut [Verdict], lease: &Lease) -> Result<(), Attempt> {
        // The destinations commit first: a row its commit applied is
        // settled again without a call if the state's write then fails.
        // Publishes go before the transaction: a row the ledger holds is
        // not called again, and a publish sent twice is dropped by its id.
        self.finish_nats(verdicts, lease).await?;
        self.finish_postgres(verdicts, lease).await?;
        Ok(self.finish_state(verdicts, lease).await?)
    }

    /// Commits the sink's transaction with the rows it applied, or rolls
    /// it back and sends every row of the call back.
    async fn finish_postgres(
        &mut self,
        verdicts: &mut [Verdict],
        lease: &Lease,
    ) -> Result<(), Attempt> {
        let Some(postgres) = &mut self.postgres else {
            return Ok(());
        };
        let given = std::mem::take(&mut self.given);
        let retried = given.iter().find_map(|&input| match &verdicts[input] {
            Verdict::Retry { reason, .. } => Some(reason.clone()),
            _ => None,
        });
        let ending = match retried {
            Some(reason) => Ending::RollBack(format!(
                "a row of the call was retried ({reason}): sink `{}` commits all of a call's rows or none",
                self.plugin.name()
            )),
            None => Ending::Commit(
                given
                    .iter()
                    .copied()
                    .filter(|&input| matches!(verdicts[input], Verdict::Done))
                    .collect(),
            ),
        };
        match postgres.finish(ending, lease).await {
            Ok(Finished::Committed) => Ok(()),
            Ok(Finished::RolledBack(reason)) => {
                for &input in &given {
                    verdicts[input].retry_for_state(reason.clone());
                }
                Ok(())
            }
            Ok(Finished::Again(reason)) => Err(Attempt::Again(reason)),
            Err(fenced) => {
                tracing::warn!(plugin = self.plugin.name(), reason = %fenced, "not committed: the unit is not this host's");
                Err(RunError::Fenced.into())
            }
        }
    }

    /// Sends the sink's publishes of the rows delivered and waits for them.
    async fn finish_nats(&mut self, verdicts: &[Verdict], lease: &Lease) -> Result<(), Attempt> {
        let Some(nats) = &mut self.nats else {
            return Ok(());
        };
        let delivered = |input: usize| matches!(verdicts.get(input), Some(Verdict::Done));
        match nats.finish(delivered, lease).await {
            Ok(Finished::Again(reason)) => Err(Attempt::Again(reason)),
            Ok(_) => Ok(()),
            Err(fenced) => {
                tracing::warn!(plugin = self.plugin.name(), reason = %fenced, "not published: the unit is not this host's");
                Err(RunError::Fenced.into())
            }
        }
    }

    /// The stateful step's part of [`Step::finish`].
    async fn finish_state(
        &mut self,
        verdicts: &mut [Verdict],
        lease: &Lease,
    ) -> Result<(), RunError> {
        let Some(state) = &mut self.state else {
            return Ok(());
        };
        let ends: Vec<RowEnd> = verdicts.iter().map(Verdict::end).collect();
        let retries = state
            .commit(&ends, lease)
            .await
            .map_err(|_| RunError::Fenced)?;
        for (row, reason) in retries {
            verdicts[row].retry_for_state(reason);
        }
        Ok(())
    }

    /// The plugin's answer does not fit the batch it was given.
    fn malformed(&mut self, err: Malformed) -> StepFailure {
        let what = format!("returned a malformed answer: {err}");
        let error = match &self.instance {
            Some(instance) => instance.contract(&what),
            None => CallError {
                kind: FailureKind::Contract,
                message: format!("plugin `{}` {what}", self.plugin.name()),
            },
        };
        self.failed(error)
    }

    /// A failed call leaves the instance in an unknown state: drop it.
    fn failed(&mut self, error: CallError) -> StepFailure {
        self.instance = None;
        StepFailure {
            plugin: self.plugin.clone(),
            error,
        }
    }
}

/// Reads a plugin's answer for the rows `given`, every row of it.
fn read(reply: &Reply, given: &Batch) -> Result<Stepped, Malformed> {
    let transformed = match reply {
        Reply::Transformed(transformed) => transformed,
        Reply::Delivered(delivered) => {
            let outcomes =
                crate::delivery::batch::delivered_as(delivered, given.len(), RowOutcome::from)?;
            return Ok(Stepped::Changed {
                outcomes,
                rows: Batch::default(),
                parents: Vec::new(),
            });
        }
    };
    let mut answer = Answer::new(transformed, given.len())?;
    // The common answer, every row passed on as it is, keeps the batch.
    if answer.all_ok() {
        return Ok(Stepped::Unchanged);
    }
    let mut outcomes = Vec::with_capacity(given.len());
    let mut rows = Batch::with_capacity(given.len(), transformed.data.len());
    let mut parents = Vec::with_capacity(given.len());
    for row in 0..given.len() {
        let outcome = answer.outcome(row)?;
        match &outcome {
            Outcome::Ok => {
                rows.push_from(given, row);
                parents.push(row);
            }
            Outcome::Emit(emitted) => {
                for new in emitted.clone() {
                    answer.push_emitted(&mut rows, given, row, new)?;
                    parents.push(row);
                }
            }
            Outcome::Retry(_) | Outcome::DeadLetter(_) => {}
        }
        outcomes.push(RowOutcome::from(outcome));
    }
    Ok(Stepped::Changed {
        outcomes,
        rows,
        parents,
    })
}

/// What a transform's answer `stepped` means for each row `given`, owned:
/// what a shadow compares.
pub fn row_results(given: &Batch, stepped: &Stepped) -> Vec<RowResult> {
    let Stepped::Changed {
        outcomes,
        rows,
        parents,
    } = stepped
    else {
        return vec![RowResult::Ok; given.len()];
    };
    let mut emitted: Vec<Vec<Vec<u8>>> = vec![Vec::new(); outcomes.len()];
    for (row, &parent) in parents.iter().enumerate() {
        if let (Some(RowOutcome::Emit(_)), Some(out)) =
            (outcomes.get(parent), emitted.get_mut(parent))
        {
            out.push(rows.payload(row).to_vec());
        }
    }
    outcomes
        .iter()
        .zip(emitted)
        .map(|(outcome, emitted)| match outcome {
            RowOutcome::Ok => RowResult::Ok,
            RowOutcome::Emit(_) => RowResult::Emit(emitted),
            RowOutcome::Retry(ms) => RowResult::Retry(*ms),
            RowOutcome::DeadLetter(reason) => RowResult::DeadLetter(reason.clone()),
        })
        .collect()
}

/// One call of transform `plugin` (its warm instance in `slot`) on
/// `given`, alone: a shadow's candidate, which no state, destination or
/// verdict ever sees.
pub async fn call_alone(
    plugin: &Arc<Plugin>,
    slot: &mut Option<PluginInstance>,
    given: &Batch,
) -> Result<Stepped, StepFailure> {
    let instance = warm(plugin, slot).await?;
    let reply = instance
        .transform(given.packed())
        .instrument(call_span(plugin))
        .await;
    let answered = match reply {
        Ok(transformed) => read(&Reply::Transformed(transformed), given)
            .map_err(|err| instance.contract(&format!("returned a malformed answer: {err}"))),
        Err(error) => Err(error),
    };
    answered.map_err(|error| {
        // A failed call leaves the instance in an unknown state.
        *slot = None;
        StepFailure {
            plugin: plugin.clone(),
            error,
        }
    })
}

/// The span of one plugin call: what a plugin logs meanwhile names it.
fn call_span(plugin: &Plugin) -> tracing::Span {
    tracing::info_span!(
        "plugin",
        plugin = plugin.name(),
        world = plugin.config.world.as_str()
    )
}

/// One plugin call of a run that was given rows of traced requests: a
/// child span of each such request's `deliver` span (`delivery::traced`).
#[derive(Debug, Clone)]
pub struct CallRecord {
    pub plugin: Arc<Plugin>,
    pub began: SystemTime,
    pub took: Duration,
    /// Each traced request among the rows given (its `traceparent`), with
    /// how many of its rows.
    pub requests: Vec<(Arc<str>, u32)>,
    /// Why the call failed, if it did.
    pub error: Option<String>,
}

/// Largest batch buffer a runner keeps between batches: more than a
/// default batch of 256 rows of 256 bytes, far less than `batch_bytes`' cap.
const SPARE_MAX_BYTES: usize = 256 << 10;

/// Runs one pipeline for one delivery worker. Not shared: each worker owns
/// its instances, so a call never waits for another worker's.
pub struct PipelineRunner {
    /// The transforms in order, then the sink.
    steps: Vec<Step>,
    observer: Option<Arc<dyn Observer>>,
    /// The calls made on rows of traced requests since the last take;
    /// `None`: not recorded (traces are off).
    calls: Option<Vec<CallRecord>>,
    /// The last batch run, its buffers kept for the next ([`Self::take_spare`]).
    spare: Option<Batch>,
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
        let step = |role: Role, name: &String| {
            lookup(name).map(|plugin| Step {
                role,
                plugin,
                instance: None,
                state: None,
                postgres: None,
                nats: None,
                given: Vec::new(),
            })
        };
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
            spare: None,
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

    /// An empty batch for the next run: the last run's, its buffers kept.
    pub fn take_spare(&mut self) -> Batch {
        let mut batch = self.spare.take().unwrap_or_default();
        batch.clear();
        batch
    }

    /// The same runner, its sink's statements committed (or, when not
    /// `commits`, always rolled back: `weir plugin test`) in the ledger of
    /// `unit` (the unit consumer's name), if the sink is granted `postgres`.
    pub fn with_destination(mut self, unit: &str, commits: bool) -> PipelineRunner {
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
        }
        self
    }

    /// The same runner, its sink's publishes (if granted `nats`) sent
    /// through `publisher`.
    pub fn with_publisher(mut self, publisher: &Publisher) -> PipelineRunner {
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
    /// after [`PipelineRunner::land_state`].
    pub fn overlap_state_writes(&mut self) {
        self.stateful().for_each(StateStep::overlap_writes);
    }

    /// The number of the batch about to run, which tags its state writes.
    pub fn set_batch(&mut self, batch: u64) {
        self.stateful().for_each(|state| state.set_batch(batch));
    }

    /// Whether state writes of batch `batch` or before are on their way.
    pub fn state_pending(&self, batch: u64) -> bool {
        self.steps
            .iter()
            .filter_map(|step| step.state.as_ref())
            .any(|state| state.writes_pending(batch))
    }

    /// Waits for the state writes of batch `batch` and before; the rows
    /// whose write failed since (stream sequences, with why) go to `failed`.
    pub async fn land_state(&mut self, batch: u64, failed: &mut Vec<(u64, String)>) {
        for state in self.stateful() {
            state.land(batch).await;
            state.take_failed(failed);
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
            .any(|step| step.state.is_some() || step.postgres.is_some())
    }

    /// The unit consumer's ack floor: what a stateful step or a
    /// destination's ledger may forget.
    pub fn set_ack_floor(&mut self, floor: u64) {
        self.stateful().for_each(|state| state.set_ack_floor(floor));
        self.steps
            .iter_mut()
            .filter_map(|step| step.postgres.as_mut())
            .for_each(|postgres| postgres.set_ack_floor(floor));
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
    pub async fn run(&mut self, rows: Batch, lease: &Lease) -> Result<Vec<Verdict>, RunError> {
        if !self
            .steps
            .iter()
            .any(|step| step.postgres.is_some() || step.nats.is_some())
        {
            return match self.run_once(rows, lease).await {
                Ok(verdicts) => Ok(verdicts),
                Err(Attempt::Stop(err)) => Err(err),
                // Only a destination asks for another run.
                Err(Attempt::Again(_)) => Err(RunError::Fenced),
            };
        }
        let mut pause = AGAIN_FIRST_PAUSE;
        let mut waiting_since: Option<tokio::time::Instant> = None;
        loop {
            match self.run_once(rows.clone(), lease).await {
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
                        return Err(RunError::Fenced);
                    }
                }
            }
        }
    }

    async fn run_once(&mut self, rows: Batch, lease: &Lease) -> Result<Vec<Verdict>, Attempt> {
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
            origins: (0..rows.len()).collect(),
            rows,
            spent: None,
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
            if flow.rows.is_empty() {
                break;
            }
            let observer = self.observer.as_deref();
            let requests = traced_requests(&traced, &flow.origins);
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
        // The batch given (or the one that went on unchanged) serves the
        // next, unless it is large: a runner of each unit keeps one.
        self.spare = flow
            .spent
            .or(Some(flow.rows))
            .filter(|batch| batch.capacity() <= SPARE_MAX_BYTES);
        Ok(verdicts)
    }
}

/// The traced requests of the input rows `origins` (each once, with its
/// rows), from each input row's `traced` request.
fn traced_requests(traced: &[Option<Arc<str>>], origins: &[usize]) -> Vec<(Arc<str>, u32)> {
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
