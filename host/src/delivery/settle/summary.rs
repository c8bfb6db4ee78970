//! What a unit dead-lettered and retried, said at INFO as one summary per
//! unit at most every [`SUMMARY_PERIOD`] (each row is logged at DEBUG).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// Rows dead-lettered or retried are logged one by one at DEBUG, and at
/// INFO as one summary per unit at most this often: a bad producer must
/// not turn the log into a copy of the dead-letter stream.
const SUMMARY_PERIOD: Duration = Duration::from_secs(10);
/// Distinct reasons a summary names; the rest are counted together.
const SUMMARY_REASONS: usize = 8;
/// Characters of a reason a summary keeps.
const SUMMARY_REASON_CHARS: usize = 120;

/// Rows dead-lettered and retried since the last INFO summary of a unit.
pub(in crate::delivery) struct Summary {
    since: Instant,
    pub(super) retried: u64,
    /// Dead-lettered rows by plugin and reason (bounded; see
    /// [`SUMMARY_REASONS`]).
    dead_lettered: BTreeMap<(String, String), u64>,
}

impl Summary {
    pub(super) fn new() -> Summary {
        Summary {
            since: Instant::now(),
            retried: 0,
            dead_lettered: BTreeMap::new(),
        }
    }

    /// When the summary is to be said, if there is anything to say.
    pub(in crate::delivery) fn due(&self) -> Option<Instant> {
        let quiet = self.dead_lettered.is_empty() && self.retried == 0;
        (!quiet).then_some(self.since + SUMMARY_PERIOD)
    }

    pub(super) fn dead_lettered(&mut self, plugin: &str, reason: &str) {
        let reason: String = reason.chars().take(SUMMARY_REASON_CHARS).collect();
        let key = (plugin.to_string(), reason);
        let key = if self.dead_lettered.len() < SUMMARY_REASONS
            || self.dead_lettered.contains_key(&key)
        {
            key
        } else {
            (String::new(), "other reasons".to_string())
        };
        *self.dead_lettered.entry(key).or_default() += 1;
    }

    /// Logs one INFO line if anything happened and `SUMMARY_PERIOD` has
    /// passed (or at once when `now`), then starts over.
    pub(in crate::delivery) fn flush(&mut self, unit: &str, now: bool) {
        let elapsed = self.since.elapsed();
        if !now && elapsed < SUMMARY_PERIOD {
            return;
        }
        let summary = std::mem::replace(self, Summary::new());
        let dead_lettered: u64 = summary.dead_lettered.values().sum();
        if dead_lettered == 0 && summary.retried == 0 {
            return;
        }
        let reasons = summary
            .dead_lettered
            .iter()
            .map(|((plugin, reason), rows)| match plugin.as_str() {
                "" => format!("{rows} × {reason}"),
                plugin => format!("{rows} × {plugin}: {reason}"),
            })
            .collect::<Vec<_>>()
            .join("; ");
        tracing::info!(
            unit,
            dead_lettered,
            retried = summary.retried,
            seconds = elapsed.as_secs(),
            reasons,
            "{dead_lettered} rows dead-lettered and {} retried in the last {} s",
            summary.retried,
            elapsed.as_secs()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_names_a_bounded_number_of_reasons() {
        let mut summary = Summary::new();
        assert_eq!(summary.due(), None, "nothing to say, nothing due");
        for n in 0..SUMMARY_REASONS + 5 {
            summary.dead_lettered("validate", &format!("reason {n}"));
            summary.dead_lettered("validate", &format!("reason {n}"));
        }
        assert_eq!(summary.dead_lettered.len(), SUMMARY_REASONS + 1);
        let others = &summary.dead_lettered[&(String::new(), "other reasons".to_string())];
        assert_eq!(*others, 10);
        assert!(summary.due().is_some());
    }
}
