//! A pipeline: the plugins a table's rows go through, in order, ending in an
//! optional sink — and the verdict for every row that went in.
//!
//! A row's verdict is the worst of what happened to it and to every row it
//! was turned into: one descendant asking for a retry retries the original,
//! one dead-lettered descendant dead-letters it.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::config::Pipeline as PipelineConfig;
use crate::coordination::Lease;
use crate::delivery::batch::{Answer, Batch, Malformed, Outcome};
use crate::sandbox::{CallError, FailureKind, Plugin, PluginInstance};

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
}

impl PipelineRunner {
    /// `lookup` gives the loaded version of each named plugin.
    pub fn new(
        config: &PipelineConfig,
        lookup: impl Fn(&str) -> Option<Arc<Plugin>>,
    ) -> Option<PipelineRunner> {
        let step = |name: &String| {
            lookup(name).map(|plugin| Step {
                plugin,
                instance: None,
            })
        };
        Some(PipelineRunner {
            transforms: config.transforms.iter().map(step).collect::<Option<_>>()?,
            sink: match &config.sink {
                Some(name) => Some(step(name)?),
                None => None,
            },
        })
    }

    /// Runs `rows` through every step; returns one verdict per input row.
    /// The sink is called only while `lease` holds, checked right before
    /// the call: transforms only compute, the sink is what the world sees.
    pub async fn run(&mut self, rows: Batch, lease: &Lease) -> Result<Vec<Verdict>, RunError> {
        let mut verdicts = vec![Verdict::Done; rows.len()];
        let mut origins: Vec<usize> = (0..rows.len()).collect();
        let mut rows = rows;

        for step in &mut self.transforms {
            if rows.is_empty() {
                break;
            }
            let span = call_span(&step.plugin);
            let instance = step.instance().await?;
            let result = instance.transform(rows.packed()).instrument(span).await;
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
            let result = instance.deliver(rows.packed()).instrument(span).await;
            let delivered = result.map_err(|error| step.failed(error))?;
            let outcomes = match crate::delivery::batch::delivered(&delivered, rows.len()) {
                Ok(outcomes) => outcomes,
                Err(err) => return Err(step.malformed(err).into()),
            };
            for (origin, outcome) in origins.into_iter().zip(outcomes) {
                verdicts[origin].merge(Verdict::of(outcome, &step.plugin, "sink"));
            }
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
