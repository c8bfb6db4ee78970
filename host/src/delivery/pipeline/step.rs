//! One step of a pipeline: a loaded plugin version (a transform or the
//! sink), its warm instance, and what wraps its call (the stateful step,
//! a sink's PostgreSQL transaction or publishes): begun before the call,
//! finished once every row has its verdict.

use std::sync::Arc;

use tracing::Instrument;

use crate::delivery::batch::Malformed;
use crate::delivery::verdict::Verdict;
use crate::destination::{Ending, Finished, ObjectsStep, PostgresStep, PublishStep, Waiting};
use crate::fence::{Fence, Fenced};
use crate::sandbox::{CallError, FailureKind, Plugin, PluginInstance};
use crate::state::scope::Settled;
use crate::state::step::{RowEnd, StateStep};

use super::reply::{Reply, read};
use super::{Attempt, Flow, Observer, RunError, StepFailure};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::delivery) enum Role {
    Transform,
    Sink,
}

/// One step: a loaded plugin version (a transform or the sink), the warm
/// instance running it, and the stateful step wrapping its call when it
/// is the pipeline's plugin granted `state`.
pub(in crate::delivery) struct Step {
    pub(super) role: Role,
    pub(super) plugin: Arc<Plugin>,
    pub(super) instance: Option<PluginInstance>,
    pub(super) state: Option<StateStep>,
    /// The transaction step wrapping a sink granted `postgres`.
    pub(super) postgres: Option<PostgresStep>,
    /// The publishes of a sink granted `nats`.
    pub(super) nats: Option<PublishStep>,
    /// The objects of a sink granted `objects`.
    pub(super) objects: Option<ObjectsStep>,
    /// What the last batch's rows in objects wait for (taken with the
    /// batch's landing).
    pub(super) waiting: Vec<Waiting>,
    /// The input rows of the rows given to the last call.
    pub(super) given: Vec<usize>,
}

impl Step {
    /// A step of `plugin` in `role`, with no instance yet and nothing
    /// wrapping its call.
    pub(super) fn of(role: Role, plugin: Arc<Plugin>) -> Step {
        Step {
            role,
            plugin,
            instance: None,
            state: None,
            postgres: None,
            nats: None,
            objects: None,
            waiting: Vec::new(),
            given: Vec::new(),
        }
    }
}

/// The warm instance of `plugin` in `slot`, or a fresh one.
pub(in crate::delivery) async fn warm<'a>(
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
    pub(super) async fn begin(
        &mut self,
        flow: &mut Flow<'_>,
        verdicts: &mut [Verdict],
    ) -> Result<bool, String> {
        Ok(self.begin_state(flow, verdicts).await && self.begin_postgres(flow, verdicts).await?)
    }

    /// The destination step's part of [`Step::begin`]: rows a commit
    /// applied before are done without a call.
    pub(super) async fn begin_postgres(
        &mut self,
        flow: &mut Flow<'_>,
        verdicts: &mut [Verdict],
    ) -> Result<bool, String> {
        let Some(postgres) = &mut self.postgres else {
            return Ok(true);
        };
        let rows = flow.rows();
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
    pub(super) async fn begin_state(
        &mut self,
        flow: &mut Flow<'_>,
        verdicts: &mut [Verdict],
    ) -> bool {
        let Some(state) = &mut self.state else {
            return true;
        };
        let rows = flow.rows();
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
        if fresh.len() < flow.rows().len() {
            flow.keep(&fresh);
        }
        true
    }

    /// One call on the rows of `flow`. The sink is called only while
    /// `lease` holds, checked right before the call: transforms only
    /// compute, the sink is what the world sees.
    pub(super) async fn call<'a>(
        &mut self,
        flow: Flow<'a>,
        verdicts: &mut [Verdict],
        lease: &dyn Fence,
        observer: Option<&dyn Observer>,
    ) -> Result<Flow<'a>, RunError> {
        let span = call_span(&self.plugin);
        let instance = warm(&self.plugin, &mut self.instance).await?;
        if self.role == Role::Sink && !lease.held() {
            return Err(Fenced.into());
        }
        if let Some(state) = &mut self.state {
            instance.give_state(state.give(&flow.origins));
        }
        if let Some(postgres) = &mut self.postgres {
            instance.give_postgres(postgres.give());
            self.given.clone_from(&flow.origins);
        }
        if let Some(nats) = &mut self.nats {
            let rows = flow.rows();
            let each = (0..rows.len()).map(|row| (flow.origins[row], rows.position(row).sequence));
            instance.give_nats(nats.give(verdicts.len(), each));
        }
        if let Some(objects) = &mut self.objects {
            let rows = flow.rows();
            let each = (0..rows.len()).map(|row| (flow.origins[row], rows.position(row).sequence));
            instance.give_objects(objects.give(verdicts.len(), each));
        }
        let packed = flow.rows().packed();
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
        if let Some(objects) = &mut self.objects {
            objects.took(instance.take_objects());
        }
        let answered = reply
            .map_err(|error| self.failed(error))
            .and_then(|reply| read(&reply, flow.rows()).map_err(|err| self.malformed(err)));
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
                if let Some(objects) = &mut self.objects {
                    objects.abandon();
                }
                return Err(failure.into());
            }
        };
        if let Some(observer) = observer {
            observer.answered(&self.plugin, flow.rows(), &stepped);
        }
        Ok(flow.after(stepped, verdicts, self))
    }

    /// Once every input row has its verdict: the stateful step writes the
    /// scopes the call changed; rows whose scope was not written come back.
    pub(super) async fn finish(
        &mut self,
        verdicts: &mut [Verdict],
        lease: &dyn Fence,
    ) -> Result<(), Attempt> {
        // The destinations commit first: a row its commit applied is
        // settled again without a call if the state's write then fails.
        // Publishes go before the transaction: a row the ledger holds is
        // not called again, and a publish sent twice is dropped by its id.
        self.finish_nats(verdicts, lease).await?;
        self.finish_postgres(verdicts, lease).await?;
        self.finish_state(verdicts, lease).await?;
        // Last: only rows still delivered go into objects.
        self.finish_objects(verdicts, lease).await
    }

    /// Hands the rows the sink delivered to the unit's objects: what the
    /// batch waits for before they are acked.
    pub(super) async fn finish_objects(
        &mut self,
        verdicts: &[Verdict],
        lease: &dyn Fence,
    ) -> Result<(), Attempt> {
        let Some(objects) = &mut self.objects else {
            return Ok(());
        };
        let delivered = |input: usize| matches!(verdicts.get(input), Some(Verdict::Done));
        match objects.finish(delivered, lease).await {
            Ok((Finished::Again(reason), _)) => Err(Attempt::Again(reason)),
            Ok((_, waiting)) => {
                self.waiting.extend(waiting);
                Ok(())
            }
            Err(fenced) => {
                tracing::warn!(plugin = self.plugin.name(), reason = %fenced, "not added to objects: the unit is not this host's");
                Err(Fenced.into())
            }
        }
    }

    /// Commits the sink's transaction with the rows it applied, or rolls
    /// it back and sends every row of the call back.
    pub(super) async fn finish_postgres(
        &mut self,
        verdicts: &mut [Verdict],
        lease: &dyn Fence,
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
                Err(Fenced.into())
            }
        }
    }

    /// Sends the sink's publishes of the rows delivered and waits for them.
    pub(super) async fn finish_nats(
        &mut self,
        verdicts: &[Verdict],
        lease: &dyn Fence,
    ) -> Result<(), Attempt> {
        let Some(nats) = &mut self.nats else {
            return Ok(());
        };
        let delivered = |input: usize| matches!(verdicts.get(input), Some(Verdict::Done));
        match nats.finish(delivered, lease).await {
            Ok(Finished::Again(reason)) => Err(Attempt::Again(reason)),
            Ok(_) => Ok(()),
            Err(fenced) => {
                tracing::warn!(plugin = self.plugin.name(), reason = %fenced, "not published: the unit is not this host's");
                Err(Fenced.into())
            }
        }
    }

    /// The stateful step's part of [`Step::finish`].
    pub(super) async fn finish_state(
        &mut self,
        verdicts: &mut [Verdict],
        lease: &dyn Fence,
    ) -> Result<(), RunError> {
        let Some(state) = &mut self.state else {
            return Ok(());
        };
        let ends: Vec<RowEnd> = verdicts.iter().map(Verdict::end).collect();
        let retries = state.commit(&ends, lease).await?;
        for (row, reason) in retries {
            verdicts[row].retry_for_state(reason);
        }
        Ok(())
    }

    /// The plugin's answer does not fit the batch it was given.
    pub(super) fn malformed(&mut self, err: Malformed) -> StepFailure {
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
    pub(super) fn failed(&mut self, error: CallError) -> StepFailure {
        self.instance = None;
        StepFailure {
            plugin: self.plugin.clone(),
            error,
        }
    }
}

/// The span of one plugin call: what a plugin logs meanwhile names it.
pub(in crate::delivery) fn call_span(plugin: &Plugin) -> tracing::Span {
    tracing::info_span!(
        "plugin",
        plugin = plugin.name(),
        world = plugin.config.world.as_str()
    )
}
