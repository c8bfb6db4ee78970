//! A pipeline: the plugins a table's rows go through, in order, ending in an
//! optional sink — and the verdict for every row that went in.
//!
//! A row's verdict is the worst of what happened to it and to every row it
//! was turned into: one descendant asking for a retry retries the original,
//! one dead-lettered descendant dead-letters it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::config::Pipeline as PipelineConfig;
use crate::coordination::Lease;
use crate::delivery::batch::{Answer, Batch, Malformed, Outcome};
use crate::sandbox::{CallError, FailureKind, Plugin, PluginInstance};
use crate::state::batch::BatchState;
use crate::state::scope::{Limits, Overlay, Settled};
use crate::state::store::{StoreError, Stored, UnitState, scope_key};
use crate::telemetry::{PluginLabels, StateWriteLabels};
use crate::topology::route::Unit;

/// What becomes of one input row.
#[derive(Debug, Clone)]
pub enum Verdict {
    /// Every descendant was delivered or dropped: ack it.
    Done,
    /// Hand it back to JetStream for another try after `delay`; `plugin`
    /// (the one that asked, or whose call failed) is named if the row is
    /// dead-lettered after its last delivery.
    Retry {
        delay: Duration,
        plugin: Option<Arc<Plugin>>,
        reason: String,
    },
    /// Write it to the dead-letter stream, then ack it.
    DeadLetter {
        plugin: Option<Arc<Plugin>>,
        reason: String,
    },
}

impl Verdict {
    /// The verdict of a plugin's outcome for a row (`Ok` and `Emit` leave the
    /// row to the steps after: done here); `what` names the plugin's role.
    fn of(outcome: Outcome<'_>, plugin: &Arc<Plugin>, what: &str) -> Verdict {
        match outcome {
            Outcome::Ok | Outcome::Emit(_) => Verdict::Done,
            Outcome::Retry(delay_ms) => Verdict::Retry {
                delay: Duration::from_millis(delay_ms.into()),
                plugin: Some(plugin.clone()),
                reason: format!("{what} `{}` asked for a retry", plugin.name()),
            },
            Outcome::DeadLetter(reason) => Verdict::DeadLetter {
                plugin: Some(plugin.clone()),
                reason: reason.to_string(),
            },
        }
    }

    /// Keeps the worse of two verdicts: retry beats dead letter beats done.
    fn merge(&mut self, other: Verdict) {
        let rank = |v: &Verdict| match v {
            Verdict::Done => 0,
            Verdict::DeadLetter { .. } => 1,
            Verdict::Retry { .. } => 2,
        };
        match (&mut *self, other) {
            (Verdict::Retry { delay, .. }, Verdict::Retry { delay: other, .. }) => {
                *delay = (*delay).max(other);
            }
            (current, other) if rank(&other) > rank(current) => *current = other,
            _ => {}
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

/// One step: a loaded plugin version and the warm instance running it.
struct Step {
    plugin: Arc<Plugin>,
    instance: Option<PluginInstance>,
}

impl Step {
    async fn instance(&mut self) -> Result<&mut PluginInstance, StepFailure> {
        if self.instance.as_ref().is_some_and(PluginInstance::worn_out) {
            self.instance = None;
        }
        match &mut self.instance {
            Some(instance) => Ok(instance),
            slot @ None => {
                let fresh = self
                    .plugin
                    .instantiate()
                    .await
                    .map_err(|error| StepFailure {
                        plugin: self.plugin.clone(),
                        error,
                    })?;
                Ok(slot.insert(fresh))
            }
        }
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

/// The span of one plugin call: what a plugin logs meanwhile names it.
fn call_span(plugin: &Plugin) -> tracing::Span {
    tracing::info_span!(
        "plugin",
        plugin = plugin.name(),
        world = plugin.config.world.as_str()
    )
}

/// Runs one pipeline for one delivery worker. Not shared: each worker owns
/// its instances, so a call never waits for another worker's.
pub struct PipelineRunner {
    transforms: Vec<Step>,
    sink: Option<Step>,
    stateful: Option<Stateful>,
}

/// The pipeline's plugin granted `state` (at most one), and its scopes.
struct Stateful {
    /// Its index in `transforms`, or `transforms.len()` for the sink.
    step: usize,
    plugin: String,
    limits: Limits,
    store: crate::state::store::StateStore<crate::nats::kv::NatsKv>,
    /// The unit whose rows this runner runs: part of every scope's key.
    unit: Unit,
    metrics: crate::telemetry::Metrics,
    /// Scopes as this runner last read or wrote them, by key: it runs
    /// under one owner of the unit, whose writes are the only ones.
    cache: HashMap<String, Stored>,
    /// The unit consumer's ack floor as last read: applied sequences at or
    /// below it are dropped from a scope as it is written.
    ack_floor: u64,
}

/// What a stateful run keeps between the plugin's call and the commit.
struct ScopeRun {
    key: String,
    overlay: Overlay,
}

/// How soon rows come back when their state could not be read or written.
const STATE_RETRY: Duration = Duration::from_secs(1);

impl Stateful {
    /// Reads every scope of `keys` this runner does not hold yet.
    async fn load(&mut self, keys: &[String]) -> Result<(), StoreError> {
        for key in keys {
            if !self.cache.contains_key(key) {
                let stored = self.store.load(key).await?;
                self.cache.insert(key.clone(), stored);
            }
        }
        Ok(())
    }

    fn settled(&self, key: &str, sequence: u64) -> Option<Settled> {
        self.cache
            .get(key)
            .and_then(|stored| stored.scope.settled(sequence))
    }

    /// One overlay per scope of the rows the call gets (`origins`: each
    /// one's input row) and each row's overlay; with the scopes' keys, in
    /// the overlays' order, for [`Stateful::runs`].
    fn batch_state(&self, keys: &[String], origins: &[usize]) -> (BatchState, Vec<String>) {
        let mut scopes: Vec<String> = Vec::new();
        let mut row_scopes = Vec::with_capacity(origins.len());
        for &origin in origins {
            let key = keys.get(origin).map_or("", String::as_str);
            let index = match scopes.iter().position(|k| k == key) {
                Some(index) => index,
                None => {
                    scopes.push(key.to_string());
                    scopes.len() - 1
                }
            };
            row_scopes.push(index);
        }
        let overlays = scopes
            .iter()
            .map(|key| {
                let base = self
                    .cache
                    .get(key)
                    .map(|stored| Arc::new(stored.scope.clone()))
                    .unwrap_or_default();
                Overlay::new(base, self.limits)
            })
            .collect();
        (BatchState::new(overlays, row_scopes), scopes)
    }

    /// The call's overlays, named by the keys [`Stateful::batch_state`] gave.
    fn runs(scopes: Vec<String>, state: Option<BatchState>) -> Vec<ScopeRun> {
        let Some(state) = state else {
            return Vec::new();
        };
        scopes
            .into_iter()
            .zip(state.into_overlays())
            .map(|(key, overlay)| ScopeRun { key, overlay })
            .collect()
    }

    /// Stores each scope the call wrote whose rows are all settled, before
    /// they are answered; a scope with a row to retry keeps its old state
    /// and all its rows come back. Nothing is written once `lease` no
    /// longer holds. A write someone else made since this runner read the
    /// scope (a host that owned the unit before, woken past its lease)
    /// sends the rows back to run again on what is stored now.
    async fn commit(
        &mut self,
        runs: Vec<ScopeRun>,
        keys: &[String],
        sequences: &[u64],
        verdicts: &mut [Verdict],
        lease: &Lease,
    ) -> Result<(), RunError> {
        for run in runs {
            if !run.overlay.changed() {
                continue;
            }
            let rows: Vec<usize> = (0..keys.len())
                .filter(|&row| keys[row] == run.key)
                .collect();
            let retried = rows
                .iter()
                .any(|&row| matches!(verdicts[row], Verdict::Retry { .. }));
            let failure = if retried {
                Some(format!(
                    "a row of its state scope was retried: plugin `{}`'s writes wait for all of them",
                    self.plugin
                ))
            } else {
                if !lease.held() {
                    return Err(RunError::Fenced);
                }
                let read = self.cache.get(&run.key).cloned().unwrap_or_default();
                let (dead, applied): (Vec<usize>, Vec<usize>) = rows
                    .iter()
                    .partition(|&&row| matches!(verdicts[row], Verdict::DeadLetter { .. }));
                let next = run.overlay.commit(
                    applied.into_iter().map(|row| sequences[row]),
                    dead.into_iter().map(|row| sequences[row]),
                    self.ack_floor,
                );
                let written = self.store.commit(&run.key, &read, next).await;
                let result = match &written {
                    Ok(_) => "stored",
                    Err(StoreError::Fenced { .. }) => "conflict",
                    Err(StoreError::Purged { .. }) => "purged",
                    Err(_) => "failed",
                };
                let labels = StateWriteLabels {
                    plugin: self.plugin.clone(),
                    result,
                };
                self.metrics.state_writes.get_or_create(&labels).inc();
                match written {
                    Ok(stored) => {
                        self.cache.insert(run.key.clone(), stored);
                        None
                    }
                    Err(err @ StoreError::Fenced { .. }) => {
                        self.cache.remove(&run.key);
                        Some(format!("plugin `{}`: {err}; read again", self.plugin))
                    }
                    // `weir state purge`: the rows run again on empty state.
                    Err(err @ StoreError::Purged { .. }) => {
                        self.cache.remove(&run.key);
                        Some(format!("plugin `{}`: {err}", self.plugin))
                    }
                    Err(err) => {
                        self.cache.remove(&run.key);
                        Some(format!("the state of plugin `{}`: {err}", self.plugin))
                    }
                }
            };
            if let Some(reason) = failure {
                for &row in &rows {
                    verdicts[row].merge(Verdict::Retry {
                        delay: STATE_RETRY,
                        plugin: None,
                        reason: reason.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

impl PipelineRunner {
    /// `lookup` gives the loaded version of each named plugin; `state` is
    /// the state bucket, for a plugin granted `state`.
    pub fn new(
        config: &PipelineConfig,
        lookup: impl Fn(&str) -> Option<Arc<Plugin>>,
        state: Option<UnitState>,
    ) -> Option<PipelineRunner> {
        let step = |name: &String| {
            lookup(name).map(|plugin| Step {
                plugin,
                instance: None,
            })
        };
        let transforms: Vec<Step> = config.transforms.iter().map(step).collect::<Option<_>>()?;
        let sink = match &config.sink {
            Some(name) => Some(step(name)?),
            None => None,
        };
        let stateful =
            transforms
                .iter()
                .chain(sink.iter())
                .enumerate()
                .find_map(|(index, step)| {
                    let limits = step.plugin.config.grants.state?;
                    let state = state.clone()?;
                    Some(Stateful {
                        step: index,
                        plugin: step.plugin.name().to_string(),
                        limits,
                        store: state.store,
                        unit: state.unit,
                        metrics: state.metrics,
                        cache: HashMap::new(),
                        ack_floor: 0,
                    })
                });
        Some(PipelineRunner {
            transforms,
            sink,
            stateful,
        })
    }

    /// Whether a plugin of this pipeline keeps durable state.
    pub fn is_stateful(&self) -> bool {
        self.stateful.is_some()
    }

    /// The unit consumer's ack floor: what a stateful step may forget.
    pub fn set_ack_floor(&mut self, floor: u64) {
        if let Some(stateful) = &mut self.stateful {
            stateful.ack_floor = stateful.ack_floor.max(floor);
        }
    }

    /// Rows whose acks the server applied: they never come back, so the
    /// scopes this runner holds need not remember them.
    pub fn forget_applied(&mut self, sequences: &[u64]) {
        if let Some(stateful) = &mut self.stateful {
            for stored in stateful.cache.values_mut() {
                stored.scope.forget(sequences);
            }
        }
    }

    /// Runs `rows` through every step; returns one verdict per input row.
    /// The sink is called only while `lease` holds, checked right before
    /// the call: transforms only compute, the sink is what the world sees.
    pub async fn run(&mut self, rows: Batch, lease: &Lease) -> Result<Vec<Verdict>, RunError> {
        let mut verdicts = vec![Verdict::Done; rows.len()];
        let mut origins: Vec<usize> = (0..rows.len()).collect();
        let mut rows = rows;
        // With the stateful plugin: each input row's sequence and scope key.
        let mut rows_sequences: Vec<u64> = Vec::new();
        let mut keys: Vec<String> = Vec::new();
        let mut scope_runs: Vec<ScopeRun> = Vec::new();
        if let Some(stateful) = &mut self.stateful {
            rows_sequences = (0..rows.len())
                .map(|row| rows.position(row).sequence)
                .collect();
            keys = (0..rows.len())
                .map(|row| {
                    let (tenant, table) = (rows.tenant(row), rows.table(row));
                    scope_key(tenant, &stateful.plugin, table, stateful.unit)
                })
                .collect();
            if let Err(err) = stateful.load(&keys).await {
                let reason = format!("the state of plugin `{}`: {err}", stateful.plugin);
                for verdict in &mut verdicts {
                    verdict.merge(Verdict::Retry {
                        delay: STATE_RETRY,
                        plugin: None,
                        reason: reason.clone(),
                    });
                }
                return Ok(verdicts);
            }
            // Rows the state already settled came back after their answer
            // was lost: settled the same way again, without a call.
            let mut fresh: Vec<usize> = Vec::with_capacity(rows.len());
            let labels = PluginLabels {
                plugin: stateful.plugin.clone(),
            };
            let settled_again = stateful
                .metrics
                .state_rows_settled_again
                .get_or_create(&labels);
            for row in 0..rows.len() {
                let settled = stateful.settled(&keys[row], rows_sequences[row]);
                if settled.is_some() {
                    settled_again.inc();
                }
                match settled {
                    None => fresh.push(row),
                    Some(Settled::Applied) => {}
                    Some(Settled::DeadLettered) => {
                        verdicts[row] = Verdict::DeadLetter {
                            plugin: None,
                            reason: format!(
                                "dead-lettered before by this pipeline (plugin `{}` keeps its state); \
                                 its dead letter was not stored then",
                                stateful.plugin
                            ),
                        }
                    }
                }
            }
            if fresh.len() < rows.len() {
                let mut kept = Batch::with_capacity(fresh.len(), rows.data_len());
                for &row in &fresh {
                    kept.push_from(&rows, row);
                }
                rows = kept;
                origins = fresh;
            }
        }

        for (index, step) in self.transforms.iter_mut().enumerate() {
            if rows.is_empty() {
                break;
            }
            let span = call_span(&step.plugin);
            let instance = step.instance().await?;
            let stateful = self.stateful.as_ref().filter(|s| s.step == index);
            let scopes = stateful.map(|stateful| {
                let (state, scopes) = stateful.batch_state(&keys, &origins);
                instance.give_state(state);
                scopes
            });
            let result = instance.transform(rows.packed()).instrument(span).await;
            if let Some(scopes) = scopes {
                scope_runs = Stateful::runs(scopes, instance.take_state());
            }
            let transformed = result.map_err(|error| step.failed(error))?;
            let mut answer = match Answer::new(&transformed, rows.len()) {
                Ok(answer) => answer,
                Err(err) => return Err(step.malformed(err).into()),
            };
            // The common answer, every row passed on as it is, keeps the batch.
            if answer.all_ok() {
                continue;
            }
            let mut next_rows = Batch::with_capacity(rows.len(), transformed.data.len());
            let mut next_origins = Vec::with_capacity(rows.len());
            for (index, origin) in origins.into_iter().enumerate() {
                let outcome = match answer.outcome(index) {
                    Ok(outcome) => outcome,
                    Err(err) => return Err(step.malformed(err).into()),
                };
                match outcome {
                    Outcome::Ok => {
                        next_rows.push_from(&rows, index);
                        next_origins.push(origin);
                    }
                    Outcome::Emit(emitted) => {
                        for new in emitted {
                            if let Err(err) = answer.push_emitted(&mut next_rows, &rows, index, new)
                            {
                                return Err(step.malformed(err).into());
                            }
                            next_origins.push(origin);
                        }
                    }
                    other => verdicts[origin].merge(Verdict::of(other, &step.plugin, "plugin")),
                }
            }
            rows = next_rows;
            origins = next_origins;
        }

        if let Some(step) = &mut self.sink
            && !rows.is_empty()
        {
            let span = call_span(&step.plugin);
            let instance = step.instance().await?;
            if !lease.held() {
                return Err(RunError::Fenced);
            }
            let sink_index = self.transforms.len();
            let stateful = self.stateful.as_ref().filter(|s| s.step == sink_index);
            let scopes = stateful.map(|stateful| {
                let (state, scopes) = stateful.batch_state(&keys, &origins);
                instance.give_state(state);
                scopes
            });
            let result = instance.deliver(rows.packed()).instrument(span).await;
            if let Some(scopes) = scopes {
                scope_runs = Stateful::runs(scopes, instance.take_state());
            }
            let delivered = result.map_err(|error| step.failed(error))?;
            let outcomes = match crate::delivery::batch::delivered(&delivered, rows.len()) {
                Ok(outcomes) => outcomes,
                Err(err) => return Err(step.malformed(err).into()),
            };
            for (origin, outcome) in origins.iter().copied().zip(outcomes) {
                verdicts[origin].merge(Verdict::of(outcome, &step.plugin, "sink"));
            }
        }
        if let Some(stateful) = &mut self.stateful {
            stateful
                .commit(scope_runs, &keys, &rows_sequences, &mut verdicts, lease)
                .await?;
        }
        Ok(verdicts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_wins_over_dead_letter_and_keeps_the_longest_delay() {
        let mut verdict = Verdict::Done;
        verdict.merge(Verdict::DeadLetter {
            plugin: None,
            reason: "bad".into(),
        });
        assert!(matches!(verdict, Verdict::DeadLetter { .. }));
        verdict.merge(Verdict::Retry {
            delay: Duration::from_millis(10),
            plugin: None,
            reason: "a".into(),
        });
        verdict.merge(Verdict::Retry {
            delay: Duration::from_millis(30),
            plugin: None,
            reason: "b".into(),
        });
        verdict.merge(Verdict::Done);
        match verdict {
            Verdict::Retry { delay, .. } => assert_eq!(delay, Duration::from_millis(30)),
            other => panic!("expected a retry, got {other:?}"),
        }
    }
}
