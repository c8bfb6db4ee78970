//! Pruning a stateful pipeline's scopes: which rows can never come back,
//! so their sequences leave the scopes (which keep them to skip a row
//! applied but not acked). Mostly by asking the server to confirm the acks
//! sent (the last one again, as a request: answered once every ack before
//! it was applied), one request in flight at a time; and now and then from
//! the consumer's ack floor, which also covers acks confirmed by nobody (a
//! crash between an ack and its confirmation). The worker asks the server;
//! this is the bookkeeping.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How often a worker with a stateful pipeline reads its consumer's ack
/// floor (the confirmations do most of the pruning).
pub const ACK_FLOOR_PERIOD: Duration = Duration::from_secs(30);
/// How long a confirmation of acks may take before it counts as failed.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// A worker's pruning of its stateful pipelines' scopes (see the module).
#[derive(Default)]
pub struct AppliedPruning {
    /// The confirmation in flight, and the sequences of the rows it covers.
    confirming: Option<(JoinHandle<bool>, Vec<u64>)>,
    /// Rows acked since the confirmation in flight was asked for.
    answered: Vec<u64>,
    /// When the ack floor was last read, and what it was.
    floor: Option<(Instant, u64)>,
}

impl AppliedPruning {
    /// Rows acked: confirmed with the next confirmation.
    pub fn answered(&mut self, sequences: &mut Vec<u64>) {
        self.answered.append(sequences);
    }

    /// The rows of the confirmation in flight, once the server confirmed
    /// it (`None` while it runs, or when it failed).
    pub async fn confirmed(&mut self) -> Option<Vec<u64>> {
        let finished = self
            .confirming
            .as_ref()
            .is_some_and(|(reply, _)| reply.is_finished());
        if !finished {
            return None;
        }
        let (reply, sequences) = self.confirming.take()?;
        reply.await.unwrap_or(false).then_some(sequences)
    }

    /// Whether a confirmation of the rows answered since is to be asked for.
    pub fn wants_confirmation(&self) -> bool {
        self.confirming.is_none() && !self.answered.is_empty()
    }

    /// Asks for one (`confirm`: whether the server confirmed), covering
    /// the rows answered since the last.
    pub fn confirm(&mut self, confirm: impl Future<Output = bool> + Send + 'static) {
        let sequences = std::mem::take(&mut self.answered);
        self.confirming = Some((tokio::spawn(confirm), sequences));
    }

    /// Whether the ack floor is to be read again.
    pub fn floor_due(&self) -> bool {
        self.floor
            .is_none_or(|(read, _)| read.elapsed() >= ACK_FLOOR_PERIOD)
    }

    /// The ack floor as last read.
    pub fn floor(&self) -> Option<u64> {
        self.floor.map(|(_, floor)| floor)
    }

    /// The ack floor was read (`None`: it could not be; tried again at
    /// the next period, not at every batch).
    pub fn floor_read(&mut self, floor: Option<u64>) {
        let floor = floor.unwrap_or_else(|| self.floor().unwrap_or(0));
        self.floor = Some((Instant::now(), floor));
    }
}
