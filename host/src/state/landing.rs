//! The state writes of one batch on their way, as its settlement waits
//! for them. A stateful step hands a batch's [`Landing`] out with the
//! batch's run; whoever answers the batch's rows awaits it there, without
//! reaching back into the step (which still awaits the same writes for
//! their revisions before its next compare-and-set).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::oneshot;

use crate::state::store::StoreError;
use crate::telemetry::StateWriteLabels;

/// A batch's state writes: for each, the rows it settles and its outcome
/// to come (why its rows come back, if it failed).
#[derive(Debug, Default)]
pub struct Landing {
    writes: Vec<WriteLanding>,
}

#[derive(Debug)]
struct WriteLanding {
    key: String,
    plugin: String,
    sequences: Vec<u64>,
    outcome: oneshot::Receiver<Option<String>>,
}

/// The sending half of one write's outcome, kept by the task writing it.
pub(crate) type Outcome = oneshot::Sender<Option<String>>;

impl Landing {
    /// Whether any write is on its way.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Adds the write of `key` by `plugin` settling rows `sequences`: its
    /// task sends the outcome on the sender returned.
    pub(crate) fn add(&mut self, key: &str, plugin: &str, sequences: Vec<u64>) -> Outcome {
        let (sender, outcome) = oneshot::channel();
        self.writes.push(WriteLanding {
            key: key.to_string(),
            plugin: plugin.to_string(),
            sequences,
            outcome,
        });
        sender
    }

    /// Every write of `other` joins these.
    pub fn join(&mut self, other: Landing) {
        self.writes.extend(other.writes);
    }

    /// Waits for every write: the rows whose write failed (stream
    /// sequences), with why, come back.
    pub async fn landed(self) -> Vec<(u64, String)> {
        let mut failed = Vec::new();
        for write in self.writes {
            let reason = write.outcome.await.unwrap_or_else(|_| {
                let unanswered = StoreError::Unanswered {
                    key: write.key,
                    reason: "its task ended".to_string(),
                };
                failure(&write.plugin, &Err(unanswered))
            });
            if let Some(reason) = reason {
                failed.extend(write.sequences.iter().map(|&row| (row, reason.clone())));
            }
        }
        failed
    }
}

/// What the task writing a scope does with the store's answer: counts it
/// in `writes` (as it lands, not when someone waits for it) and tells the
/// landing waiting for it.
pub(crate) fn tell(
    outcome: Outcome,
    writes: &Family<StateWriteLabels, Counter>,
    plugin: &str,
    landed: &Result<u64, StoreError>,
) {
    let result = match landed {
        Ok(_) => "stored",
        Err(StoreError::Fenced { .. }) => "conflict",
        Err(StoreError::Purged { .. }) => "purged",
        Err(_) => "failed",
    };
    let labels = StateWriteLabels {
        plugin: plugin.to_string(),
        result,
    };
    writes.get_or_create(&labels).inc();
    // No one waiting (a commit not overlapped): nothing more to tell.
    let _ = outcome.send(failure(plugin, landed));
}

/// Why the rows of a write by `plugin` come back, given its outcome
/// (`None`: it stored). The step and the landing say it alike.
pub(crate) fn failure(plugin: &str, landed: &Result<u64, StoreError>) -> Option<String> {
    match landed {
        Ok(_) => None,
        Err(err @ StoreError::Fenced { .. }) => {
            Some(format!("plugin `{plugin}`: {err}; read again"))
        }
        // `weir state purge`: the rows run again on empty state.
        Err(err @ StoreError::Purged { .. }) => Some(format!("plugin `{plugin}`: {err}")),
        Err(err) => Some(format!("the state of plugin `{plugin}`: {err}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failed_write_sends_back_its_rows_and_an_unanswered_one_too() {
        let mut landing = Landing::default();
        let stored = landing.add("a", "window", vec![1, 2]);
        let failed = landing.add("b", "window", vec![3]);
        let dropped = landing.add("c", "window", vec![4]);
        assert!(!landing.is_empty());
        stored.send(failure("window", &Ok(7))).unwrap();
        let purged = Err(StoreError::Purged { key: "b".into() });
        failed.send(failure("window", &purged)).unwrap();
        drop(dropped);
        let back = landing.landed().await;
        let rows: Vec<u64> = back.iter().map(|(row, _)| *row).collect();
        assert_eq!(rows, [3, 4]);
        assert!(back[1].1.contains("its task ended"), "{back:?}");
    }
}
