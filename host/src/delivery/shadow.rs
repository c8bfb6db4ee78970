//! A shadow's side of delivery (`reload::shadow`): when the release of a
//! shadowed transform answers a batch, a tap copies the rows it was given
//! and what it answered into a bounded queue; one task per shadow and host
//! runs the candidate on the copy, compares each row's outcomes and adds
//! the differences to the host's counts. The candidate's answer goes
//! nowhere else: no sink, no ack, no dead letter, no state.
//!
//! The bound: the serving path only looks whether the queue has room
//! (copying the batch if it has) and never waits. A full queue skips the
//! batch, counted as not compared, so a slow candidate costs comparisons,
//! not delivery; what it costs besides is its own CPU.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::delivery::batch::Batch;
use crate::delivery::pipeline::{
    Observer, Reply, RowOutcome, StepFailure, Stepped, call_span, read, warm,
};
use crate::reload::canary::{Canary, Counts};
use crate::reload::generation::{CanaryVersion, Generation};
use crate::reload::shadow::{Diff, RowResult};
use crate::sandbox::Plugin;
use crate::sandbox::PluginInstance;
use tracing::Instrument;

/// Batch copies queued per shadow and host; past it batches are skipped.
pub const QUEUE_BATCHES: usize = 4;

/// A copy of what the release was given and what it answered.
struct Job {
    given: Batch,
    serving: Vec<RowResult>,
}

/// Which shadow a queue runs: plugin, candidate digest, start.
type Key = (String, String, u64);

/// Every shadow's queue on this host, shared by its unit workers; a queue
/// (and its task) ends once no worker's runner taps it any more.
#[derive(Clone, Default)]
pub struct Shadows {
    queues: Arc<Mutex<HashMap<Key, mpsc::WeakSender<Job>>>>,
}

impl Shadows {
    /// The tap for variant `variant` of `generation`'s runner, if a shadow
    /// runs beside one of its transforms.
    pub fn tap(&self, generation: &Generation, variant: usize) -> Option<Arc<dyn Observer>> {
        let shadows = generation.variant_shadows(variant);
        // Outside a runtime (never in a host) there is no task to run it.
        if shadows.is_empty() || tokio::runtime::Handle::try_current().is_err() {
            return None;
        }
        let mut queues = self
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        queues.retain(|_, weak| weak.upgrade().is_some());
        let mut lanes = Vec::new();
        for (name, candidate) in shadows {
            let Some(serving) = generation.plugin(name) else {
                continue;
            };
            let key = (
                name.to_string(),
                candidate.canary.digest.clone(),
                candidate.canary.started_ms,
            );
            let sender = match queues.get(&key).and_then(mpsc::WeakSender::upgrade) {
                Some(sender) => sender,
                None => {
                    let (sender, receiver) = mpsc::channel(QUEUE_BATCHES);
                    let counts = generation.canary_counts().clone();
                    tokio::spawn(run(name.to_string(), candidate.clone(), counts, receiver));
                    queues.insert(key, sender.downgrade());
                    sender
                }
            };
            lanes.push(Lane {
                name: name.to_string(),
                serving: serving.version.clone(),
                canary: candidate.canary.clone(),
                sender,
                counts: generation.canary_counts().clone(),
            });
        }
        (!lanes.is_empty()).then(|| Arc::new(Tap { lanes }) as Arc<dyn Observer>)
    }
}

/// One shadow as a runner's tap sees it.
struct Lane {
    name: String,
    /// The release's version: only its answers are copied.
    serving: String,
    canary: Canary,
    sender: mpsc::Sender<Job>,
    counts: Arc<Counts>,
}

/// Copies the release's answers of shadowed transforms into their queues.
struct Tap {
    lanes: Vec<Lane>,
}

impl Observer for Tap {
    /// Rows isolation runs alone are not copied: a shadow compares the
    /// batches the release serves.
    fn sees_lanes(&self) -> bool {
        false
    }

    fn answered(&self, plugin: &Plugin, given: &Batch, stepped: &Stepped) {
        for lane in &self.lanes {
            if plugin.name() != lane.name || plugin.version != lane.serving {
                continue;
            }
            // Looked at before the copy: a full queue costs no copy.
            let sent = lane.sender.capacity() > 0
                && lane
                    .sender
                    .try_send(Job {
                        given: given.clone(),
                        serving: row_results(given, stepped),
                    })
                    .is_ok();
            if !sent {
                let skipped = Diff {
                    skipped: given.len() as u64,
                    ..Diff::default()
                };
                lane.counts.add_diff(&lane.name, &lane.canary, &skipped);
            }
        }
    }
}

/// Runs the candidate on each queued copy and counts the differences.
async fn run(
    name: String,
    candidate: CanaryVersion,
    counts: Arc<Counts>,
    mut jobs: mpsc::Receiver<Job>,
) {
    let mut instance = None;
    while let Some(job) = jobs.recv().await {
        let given = &job.given;
        let answered = match call_alone(&candidate.plugin, &mut instance, given).await {
            Ok(stepped) => row_results(given, &stepped),
            // The whole call failed: every row of it did.
            Err(failure) => vec![RowResult::Failed(failure.error.message); given.len()],
        };
        let mut diff = Diff::default();
        for (row, (serving, candidate)) in job.serving.iter().zip(&answered).enumerate() {
            let at = (
                given.tenant(row),
                given.table(row),
                given.position(row).sequence,
            );
            diff.compare(at, serving, candidate);
        }
        counts.add_diff(&name, &candidate.canary, &diff);
    }
}

/// What a transform's answer `stepped` means for each row `given`, owned:
/// what a shadow compares.
fn row_results(given: &Batch, stepped: &Stepped) -> Vec<RowResult> {
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
async fn call_alone(
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

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::config::{Config, Overrides};
    use crate::delivery::batch::Position;
    use crate::sandbox::Sandbox;

    /// A generation whose pipeline of table `t` runs the pass-through,
    /// with a shadow of `candidate` (settings: chaos's trap mode, which
    /// the pass-through ignores), and the counts it adds to.
    async fn shadowed(candidate: &str) -> (Generation, Arc<Plugin>, Canary, Arc<Counts>) {
        let text = format!(
            "[plugins.p]\nwasm = \"{}\"\nworld = \"transform\"\nsettings = {{ mode = \"trap\" }}\n\n[[pipelines]]\ntables = [\"t\"]\ntransforms = [\"p\"]\n",
            weir_test_artifacts::PASSTHROUGH
        );
        let config = Config::parse(
            Path::new("/etc/weir/weir.toml"),
            &text,
            &Overrides::default(),
        );
        let config = Arc::new(config.unwrap());
        let sandbox = Sandbox::new(crate::telemetry::Metrics::default()).unwrap();
        let serving = sandbox.load(&config.plugins["p"]).await.unwrap();
        let mut other = config.plugins["p"].clone();
        other.wasm = candidate.into();
        let candidate = sandbox.load(&other).await.unwrap();
        let shadow = Canary {
            digest: "aa".into(),
            share: 0,
            tenants: Vec::new(),
            units: Vec::new(),
            started_ms: 1,
            auto: None,
            shadow: true,
        };
        let counts = Arc::new(Counts::default());
        let generation = Generation::with_canaries(
            config,
            HashMap::from([("p".to_string(), serving.clone())]),
            BTreeMap::from([(
                "p".to_string(),
                CanaryVersion {
                    plugin: candidate,
                    canary: shadow.clone(),
                },
            )]),
            counts.clone(),
        );
        (generation, serving, shadow, counts)
    }

    fn batch(rows: u64) -> Batch {
        let mut batch = Batch::default();
        for sequence in 0..rows {
            batch.push(
                "acme",
                "t",
                b"{\"a\":1}",
                [],
                Position {
                    sequence,
                    attempt: 1,
                },
            );
        }
        batch
    }

    /// The counts' diff once `compared` rows were compared (or after 5 s).
    async fn compared(counts: &Counts, shadow: &Canary, rows: u64) -> Diff {
        let running = BTreeMap::from([("p".to_string(), shadow.clone())]);
        let diff = || {
            let reports = counts.reports(&running);
            reports
                .get("p")
                .and_then(|r| r.diff.clone())
                .unwrap_or_default()
        };
        for _ in 0..500 {
            if diff().compared >= rows {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        diff()
    }

    #[tokio::test]
    async fn the_serving_path_never_waits_a_full_queue_skips_and_the_rest_is_compared() {
        let (generation, serving, shadow, counts) =
            shadowed(weir_test_artifacts::PASSTHROUGH).await;
        let tap = Shadows::default()
            .tap(&generation, 0)
            .expect("a shadow runs there");
        let batch = batch(2);
        // One thread, not yielded: the task has taken nothing yet, so the
        // queue fills and the batches past it are skipped, at once.
        for _ in 0..QUEUE_BATCHES + 2 {
            tap.answered(&serving, &batch, &Stepped::Unchanged);
        }
        let diff = compared(&counts, &shadow, (QUEUE_BATCHES * 2) as u64).await;
        assert_eq!(
            (diff.compared, diff.skipped),
            ((QUEUE_BATCHES * 2) as u64, 4)
        );
        assert_eq!(diff.differing(), 0, "{diff:?}");
    }

    #[tokio::test]
    async fn a_candidate_that_traps_is_a_difference_of_every_row_of_its_call() {
        let (generation, serving, shadow, counts) = shadowed(weir_test_artifacts::CHAOS).await;
        let tap = Shadows::default()
            .tap(&generation, 0)
            .expect("a shadow runs there");
        tap.answered(&serving, &batch(3), &Stepped::Unchanged);
        let diff = compared(&counts, &shadow, 3).await;
        let failed = &diff.classes["ok→failed"];
        assert_eq!((diff.compared, failed.rows), (3, 3), "{diff:?}");
        assert!(
            failed.examples[0].candidate.contains("trapping on purpose"),
            "{:?}",
            failed.examples[0]
        );
    }
}
