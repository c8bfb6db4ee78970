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
/// to come (why its rows come back, if it failed). A write's outcome is
/// kept as it arrives, so a landing may be looked at ([`Landing::is_landed`])
/// or waited for ([`Landing::wait`]) any number of times.
#[derive(Debug, Default)]
pub struct Landing {
    writes: Vec<WriteLanding>,
    /// How many writes at the front of `writes` have their outcome.
    arrived: usize,
}

#[derive(Debug)]
struct WriteLanding {
    key: String,
    plugin: String,
    sequences: Vec<u64>,
    outcome: Arrival,
    /// An object's commit (a sink's), not a scope's write.
    object: bool,
}

/// A write's outcome: to come, or come (why its rows come back, if it failed).
#[derive(Debug)]
enum Arrival {
    Pending(oneshot::Receiver<Option<String>>),
    Arrived(Option<String>),
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
            outcome: Arrival::Pending(outcome),
            object: false,
        });
        sender
    }

    /// Adds the commit of an object (its `path`) by sink `plugin` holding
    /// rows `sequences`, whose outcome comes on `outcome` (`None` once it
    /// stands, or why the rows come back).
    pub fn wait_for_object(
        &mut self,
        plugin: &str,
        path: String,
        sequences: Vec<u64>,
        outcome: oneshot::Receiver<Option<String>>,
    ) {
        self.writes.push(WriteLanding {
            key: format!("object `{path}`"),
            plugin: plugin.to_string(),
            sequences,
            outcome: Arrival::Pending(outcome),
            object: true,
        });
    }

    /// Every write of `other` joins these.
    pub fn join(&mut self, other: Landing) {
        self.writes.extend(other.writes);
    }

    /// Whether every write landed, without waiting: each outcome already
    /// sent is kept.
    pub fn is_landed(&mut self) -> bool {
        for write in &mut self.writes[self.arrived..] {
            if let Arrival::Pending(receiver) = &mut write.outcome {
                match receiver.try_recv() {
                    Ok(reason) => write.outcome = Arrival::Arrived(reason),
                    Err(oneshot::error::TryRecvError::Closed) => write.ended(),
                    Err(oneshot::error::TryRecvError::Empty) => continue,
                }
            }
        }
        self.advance();
        self.arrived == self.writes.len()
    }

    /// Waits until every write landed. Cancel-safe: each outcome is kept as
    /// it arrives, and one not yet come stays in its channel.
    pub async fn wait(&mut self) {
        while let Some(write) = self.writes.get_mut(self.arrived) {
            if let Arrival::Pending(receiver) = &mut write.outcome {
                match receiver.await {
                    Ok(reason) => write.outcome = Arrival::Arrived(reason),
                    Err(_) => write.ended(),
                }
            }
            self.arrived += 1;
        }
    }

    /// Waits for every write (at once if each already landed): the rows
    /// whose write failed (stream sequences), with why, come back.
    pub async fn landed(mut self) -> Vec<(u64, String)> {
        self.wait().await;
        let mut failed = Vec::new();
        for write in self.writes {
            if let Arrival::Arrived(Some(reason)) = write.outcome {
                failed.extend(write.sequences.iter().map(|&row| (row, reason.clone())));
            }
        }
        failed
    }

    /// Moves `arrived` past the writes whose outcome came.
    fn advance(&mut self) {
        let arrived = self.writes[self.arrived..]
            .iter()
            .take_while(|write| matches!(write.outcome, Arrival::Arrived(_)));
        self.arrived += arrived.count();
    }
}

impl WriteLanding {
    /// Its task ended without sending the outcome: its rows come back.
    fn ended(&mut self) {
        if self.object {
            let reason = format!(
                "sink `{}`: the commit of {} ended without an answer (its unit's objects were dropped); its rows come back",
                self.plugin, self.key
            );
            self.outcome = Arrival::Arrived(Some(reason));
            return;
        }
        let unanswered = StoreError::Unanswered {
            key: self.key.clone(),
            reason: "its task ended".to_string(),
        };
        self.outcome = Arrival::Arrived(failure(&self.plugin, &Err(unanswered)));
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
    use std::time::Duration;

    use futures::FutureExt;

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

    #[tokio::test]
    async fn a_landing_is_looked_at_and_waited_for_as_often_as_needed() {
        let mut landing = Landing::default();
        assert!(landing.is_landed(), "no write: landed");
        let failed = landing.add("a", "window", vec![1]);
        let stored = landing.add("b", "window", vec![2]);
        let dropped = landing.add("c", "window", vec![3]);
        assert!(!landing.is_landed());
        // Outcomes sent out of order are kept as they come.
        stored.send(None).unwrap();
        drop(dropped);
        assert!(!landing.is_landed());
        // A wait cancelled loses nothing: the outcome still comes.
        let waited = tokio::time::timeout(Duration::from_millis(20), landing.wait()).await;
        assert!(waited.is_err(), "a write is still on its way");
        let purged = Err(StoreError::Purged { key: "a".into() });
        failed.send(failure("window", &purged)).unwrap();
        assert!(landing.is_landed());
        landing.wait().await;
        let back = landing.landed().now_or_never().expect("landed: no wait");
        let rows: Vec<u64> = back.iter().map(|(row, _)| *row).collect();
        assert_eq!(rows, [1, 3]);
        assert!(back[0].1.contains("purged"), "{back:?}");
        assert!(back[1].1.contains("its task ended"), "{back:?}");
    }

    #[tokio::test]
    async fn a_wait_ends_as_the_last_write_lands() {
        let mut landing = Landing::default();
        let first = landing.add("a", "window", vec![1]);
        let second = landing.add("b", "window", vec![2]);
        let sent = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            second.send(None).unwrap();
            first.send(None).unwrap();
        });
        landing.wait().await;
        assert!(landing.is_landed());
        assert!(landing.landed().await.is_empty());
        sent.await.unwrap();
    }
}
