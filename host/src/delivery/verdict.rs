//! What becomes of one input row of a batch: its verdict, decided by the
//! steps of its pipeline and merged (the worst wins), then settled.

use std::sync::Arc;
use std::time::Duration;

use crate::sandbox::Plugin;
use crate::state::step::{RowEnd, STATE_RETRY};

/// What becomes of one input row.
#[derive(Debug, Clone)]
pub enum Verdict {
    /// Every descendant was delivered or dropped (at least one delivered,
    /// or the pipeline has no sink): ack it.
    Done,
    /// A transform dropped it, or every row it became: ack it, counted as
    /// dropped rather than delivered. Decided once the run is over; a
    /// step's `finish` sees it as `Done`.
    Dropped,
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
    /// How the row ended, for the state of its scope.
    pub(super) fn end(&self) -> RowEnd {
        match self {
            Verdict::Done | Verdict::Dropped => RowEnd::Applied,
            Verdict::DeadLetter { .. } => RowEnd::DeadLettered,
            Verdict::Retry { .. } => RowEnd::Retried,
        }
    }

    /// The row's scope was not stored: it comes back.
    pub(super) fn retry_for_state(&mut self, reason: String) {
        self.merge(Verdict::Retry {
            delay: STATE_RETRY,
            plugin: None,
            reason,
        });
    }

    /// Keeps the worse of two verdicts: retry beats dead letter beats done.
    pub(super) fn merge(&mut self, other: Verdict) {
        let rank = |v: &Verdict| match v {
            Verdict::Done | Verdict::Dropped => 0,
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
