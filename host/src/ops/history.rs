//! The fleet's queued rows over the last five minutes, kept by every host
//! so that a page opened now shows the past too (the browser kept it
//! before, so a fresh wall screen started empty). Each sample is the sum of
//! the usage ledger's fleet-wide queued rows, which the host keeps in
//! memory anyway: keeping the history asks NATS nothing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::ingest::usage::Ledger;

/// One sample a second, five minutes of them: the page's own pace.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
pub const SAMPLES: usize = 300;

/// Rows accepted and not yet settled (acked or dead-lettered), fleet-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// When it was taken, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub queued_rows: u64,
}

/// The last [`SAMPLES`] samples, oldest first. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct QueuedHistory(Arc<Mutex<VecDeque<Sample>>>);

impl QueuedHistory {
    pub fn samples(&self) -> Vec<Sample> {
        let samples = self.0.lock().unwrap_or_else(|e| e.into_inner());
        samples.iter().copied().collect()
    }

    fn push(&self, sample: Sample) {
        let mut samples = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if samples.len() == SAMPLES {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// Samples `ledger` every [`SAMPLE_EVERY`] until `stop`.
    pub async fn record(self, ledger: Ledger, stop: CancellationToken) {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let queued_rows = ledger
                .tenants()
                .iter()
                .map(|(_, usage)| usage.queued.rows)
                .sum();
            let at_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            self.push(Sample { at_ms, queued_rows });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_five_minutes_oldest_first() {
        let history = QueuedHistory::default();
        for n in 0..SAMPLES as u64 + 10 {
            history.push(Sample {
                at_ms: n,
                queued_rows: n,
            });
        }
        let samples = history.samples();
        assert_eq!(samples.len(), SAMPLES);
        assert_eq!(samples[0].at_ms, 10);
        assert_eq!(samples[SAMPLES - 1].at_ms, SAMPLES as u64 + 9);
    }
}
