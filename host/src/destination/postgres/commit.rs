//! The destination step: what wraps the call of a sink granted
//! `grants.postgres`, as `state::step` wraps a stateful plugin's. Before
//! the batch enters the pipeline it asks the ledger which of its
//! redelivered rows were applied before (they are acked again without a
//! call); around the call it hands the sink its transaction; once every
//! row has its verdict it commits the transaction with the rows it applied,
//! fenced by the unit's claim, or rolls it back and sends the call's rows
//! back.

use std::sync::Arc;

use crate::destination::outcome::{Ending, Fenced, Finished};
use crate::fence::Fence;

use super::ledger::{CommitError, Ledger};
use super::pool::PgPool;
use super::statements::{OpenTransaction, PgCall};

/// The ledger could not be read: every row comes back.
#[derive(Debug, thiserror::Error)]
#[error("sink `{sink}`: cannot read which rows were applied: {reason}")]
pub struct Unreadable {
    pub sink: String,
    pub reason: String,
}

/// A sink's transactions on one unit (see the module).
pub struct PostgresStep {
    pool: Arc<PgPool>,
    ledger: Ledger,
    /// False for `weir plugin test`: every transaction is rolled back.
    commits: bool,
    /// The unit consumer's ack floor as last read, and the one the ledger
    /// was last pruned to.
    floor: u64,
    pruned: u64,
    /// This batch: each input row's sequence.
    sequences: Vec<u64>,
    /// The highest sequence any commit had applied when this step first
    /// read the ledger: a row at or below it may have been applied by an
    /// earlier owner even on its first delivery (a takeover resets the
    /// consumer, and the delivery count with it). `None`: not read yet.
    applied_before: Option<u64>,
    call: Option<PgCall>,
}

impl PostgresStep {
    /// `sink` names the plugin; `unit` its unit (the consumer's name).
    pub fn new(pool: Arc<PgPool>, sink: &str, unit: String, commits: bool) -> PostgresStep {
        PostgresStep {
            pool,
            ledger: Ledger {
                sink: sink.to_string(),
                unit,
            },
            commits,
            floor: 0,
            pruned: 0,
            sequences: Vec::new(),
            applied_before: None,
            call: None,
        }
    }

    pub fn set_ack_floor(&mut self, floor: u64) {
        self.floor = self.floor.max(floor);
    }

    /// Before a batch of `inputs` rows enters the pipeline: for each row
    /// (its input row, `sequence`, `attempt`), whether a commit applied it
    /// before. Only a redelivered row, or one at or below what the ledger
    /// held when this step started, can have been: past those, a batch
    /// costs no query.
    pub async fn begin(
        &mut self,
        inputs: usize,
        rows: impl Iterator<Item = (usize, u64, u32)>,
    ) -> Result<Vec<bool>, Unreadable> {
        self.sequences.clear();
        self.sequences.resize(inputs, 0);
        let mut given = Vec::new();
        for (input, sequence, attempt) in rows {
            if let Some(slot) = self.sequences.get_mut(input) {
                *slot = sequence;
            }
            given.push((sequence, attempt));
        }
        let rows = given;
        let unreadable = |reason: String| Unreadable {
            sink: self.ledger.sink.clone(),
            reason,
        };
        let mut client = None;
        let applied_before = match self.applied_before {
            Some(highest) => highest,
            None => {
                let connected = self.pool.ready_client().await.map_err(|failure| {
                    unreadable(super::error::StatementError::from(failure).to_string())
                })?;
                let highest = self
                    .ledger
                    .highest(&connected)
                    .await
                    .map_err(|err| unreadable(err.to_string()))?;
                client = Some(connected);
                *self.applied_before.insert(highest)
            }
        };
        let again: Vec<u64> = rows
            .iter()
            .filter(|(sequence, attempt)| *attempt > 1 || *sequence <= applied_before)
            .map(|(sequence, _)| *sequence)
            .collect();
        if again.is_empty() {
            return Ok(vec![false; rows.len()]);
        }
        let client = match client {
            Some(client) => client,
            None => self.pool.ready_client().await.map_err(|failure| {
                unreadable(super::error::StatementError::from(failure).to_string())
            })?,
        };
        let applied = self
            .ledger
            .applied_among(&client, &again)
            .await
            .map_err(|err| unreadable(err.to_string()))?;
        Ok(rows
            .iter()
            .map(|(sequence, _)| applied.contains(sequence))
            .collect())
    }

    /// For the sink's call: its transaction, begun by its first statement.
    pub fn give(&mut self) -> PgCall {
        PgCall::new(self.pool.clone())
    }

    /// After the call: its transaction, for [`PostgresStep::finish`].
    pub fn took(&mut self, call: Option<PgCall>) {
        self.call = call;
    }

    /// Once the call's rows have their verdicts: commits (while `lease`
    /// holds, fenced in the database by its claim) or rolls back.
    pub async fn finish(&mut self, ending: Ending, lease: &dyn Fence) -> Result<Finished, Fenced> {
        let Some(mut call) = self.call.take() else {
            return Ok(Finished::Committed);
        };
        if !call.began() {
            return Ok(Finished::Committed);
        }
        if let Some(reason) = call.doomed() {
            return Ok(Finished::Again(format!(
                "sink `{}`: its transaction cannot commit: {reason}",
                self.ledger.sink
            )));
        }
        let Some(open) = call.take_connection() else {
            return Ok(Finished::Again(format!(
                "sink `{}`: its connection was lost",
                self.ledger.sink
            )));
        };
        let applied = match ending {
            Ending::RollBack(reason) => {
                roll_back(open).await;
                return Ok(Finished::RolledBack(reason));
            }
            Ending::Commit(_) if !self.commits => {
                roll_back(open).await;
                return Ok(Finished::Committed);
            }
            Ending::Commit(inputs) => inputs
                .iter()
                .filter_map(|&input| self.sequences.get(input).copied())
                .collect::<Vec<u64>>(),
        };
        if !lease.held() {
            roll_back(open).await;
            return Err(Fenced(format!(
                "sink `{}`: the lease ran out before COMMIT",
                self.ledger.sink
            )));
        }
        let floor = (self.floor > self.pruned).then_some(self.floor);
        let Some(client) = open.client() else {
            return Ok(Finished::Again(format!(
                "sink `{}`: its connection was lost",
                self.ledger.sink
            )));
        };
        match self
            .ledger
            .commit(client, lease.claim(), &applied, floor)
            .await
        {
            Ok(()) => {
                open.ended();
                if let Some(floor) = floor {
                    self.pruned = floor;
                }
                Ok(Finished::Committed)
            }
            Err(err @ CommitError::Fenced { .. }) => {
                roll_back(open).await;
                Err(Fenced(format!("sink `{}`: {err}", self.ledger.sink)))
            }
            Err(err) => {
                roll_back(open).await;
                Ok(Finished::Again(format!(
                    "sink `{}`: {err}",
                    self.ledger.sink
                )))
            }
        }
    }

    /// The call failed (a trap, a malformed answer): nothing of it is written.
    pub async fn abandon(&mut self) {
        if let Some(mut call) = self.call.take()
            && let Some(open) = call.take_connection()
        {
            roll_back(open).await;
        }
    }
}

/// Ends the connection's transaction; one that cannot is not pooled again.
async fn roll_back(open: OpenTransaction) {
    let rolled_back = match open.client() {
        Some(client) => client.batch_execute("ROLLBACK").await.is_ok(),
        None => false,
    };
    if rolled_back {
        open.ended();
    }
}
