//! The fleet's queued rows and its accepted and delivered rates over the
//! last five minutes, kept by every host so that a page opened now shows
//! the past too (the browser kept it before, so a fresh wall screen started
//! empty). Each sample is read from the usage ledger, which the host keeps
//! in memory anyway (fleet-wide queued rows, and the rows every host shares
//! it accepted and delivered): keeping the history asks NATS nothing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::ingest::usage::{Ledger, Moved};

/// One sample a second, five minutes of them: the page's own pace.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
pub const SAMPLES: usize = 300;

/// The fleet at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// When it was taken, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Rows accepted and not yet settled (acked or dead-lettered).
    pub queued_rows: u64,
    /// Rows accepted since the previous sample (about a second before).
    #[serde(default)]
    pub accepted_rows: u64,
    /// Rows delivered since the previous sample (not dropped or
    /// dead-lettered ones).
    #[serde(default)]
    pub delivered_rows: u64,
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
        let mut before = ledger.moved();
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
            let moved = ledger.moved();
            let since = Moved {
                accepted: moved.accepted.saturating_sub(before.accepted),
                delivered: moved.delivered.saturating_sub(before.delivered),
            };
            before = moved;
            self.push(Sample {
                at_ms,
                queued_rows,
                accepted_rows: since.accepted,
                delivered_rows: since.delivered,
            });
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
                accepted_rows: n,
                delivered_rows: n,
            });
        }
        let samples = history.samples();
        assert_eq!(samples.len(), SAMPLES);
        assert_eq!(samples[0].at_ms, 10);
        assert_eq!(samples[SAMPLES - 1].at_ms, SAMPLES as u64 + 9);
    }

    #[tokio::test(start_paused = true)]
    async fn each_sample_counts_the_rows_moved_since_the_one_before() {
        let ledger = Ledger::new("me");
        let history = QueuedHistory::default();
        let stop = CancellationToken::new();
        let task = tokio::spawn(history.clone().record(ledger.clone(), stop.clone()));
        // The first sample is taken at once; the others a second apart.
        tokio::time::sleep(Duration::from_millis(10)).await;
        ledger.accepted(vec![crate::ingest::usage::Accept {
            tenant: "a".into(),
            partition: 0,
            last_seq: 3,
            rows: 3,
            bytes: 30,
        }]);
        ledger.settled(0, 2);
        tokio::time::sleep(SAMPLE_EVERY).await;
        ledger.settled(0, 1);
        tokio::time::sleep(SAMPLE_EVERY).await;
        stop.cancel();
        task.await.expect("the recorder stops");
        let samples = history.samples();
        let moved: Vec<(u64, u64, u64)> = samples
            .iter()
            .map(|s| (s.queued_rows, s.accepted_rows, s.delivered_rows))
            .collect();
        assert_eq!(moved, vec![(0, 0, 0), (3, 3, 2), (3, 0, 1)]);
    }
}
