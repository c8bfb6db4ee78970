//! The `deliver` spans of a batch (`[traces]`): one per traced request
//! among its rows (rows carry their request's `traceparent`), child of
//! that request's span at the front door, saying what became of them,
//! with a child span per plugin call on the request's rows.

use std::time::{Duration, SystemTime};

use async_nats::Message;
use opentelemetry::KeyValue;

use std::sync::Arc;

use super::verdict::Verdict;
use crate::sandbox::Plugin;
use crate::telemetry::traces::{PluginCall, TRACEPARENT, Traces};

/// One plugin call of a run that was given rows of traced requests: a
/// child span of each such request's `deliver` span (`delivery::traced`).
#[derive(Debug, Clone)]
pub struct CallRecord {
    pub plugin: Arc<Plugin>,
    pub began: SystemTime,
    pub took: Duration,
    /// Each traced request among the rows given (its `traceparent`), with
    /// how many of its rows.
    pub requests: Vec<(Arc<str>, u32)>,
    /// Why the call failed, if it did.
    pub error: Option<String>,
}

/// What became of one traced request's rows in a batch.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Outcomes {
    delivered: i64,
    dropped: i64,
    retried: i64,
    dead_lettered: i64,
}

/// The batch's traced requests, in order of first row, with their rows'
/// outcomes (`verdicts` is the batch's, row for row).
pub(super) fn traced_requests(batch: &[Message], verdicts: &[Verdict]) -> Vec<(String, Outcomes)> {
    let mut requests: Vec<(String, Outcomes)> = Vec::new();
    for (message, verdict) in batch.iter().zip(verdicts) {
        let Some(traceparent) = message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(TRACEPARENT))
            .map(|value| value.as_str())
        else {
            continue;
        };
        // Rows of one request come together: the last entry is the usual hit.
        let index = match requests.iter().rposition(|(tp, _)| tp == traceparent) {
            Some(index) => index,
            None => {
                requests.push((traceparent.to_string(), Outcomes::default()));
                requests.len() - 1
            }
        };
        let outcomes = &mut requests[index].1;
        match verdict {
            Verdict::Done => outcomes.delivered += 1,
            Verdict::Dropped => outcomes.dropped += 1,
            Verdict::Retry { .. } => outcomes.retried += 1,
            Verdict::DeadLetter { .. } => outcomes.dead_lettered += 1,
        }
    }
    requests
}

/// Ends a `deliver` span per traced request of a batch of `unit` that ran
/// for `took` until now, with a child span per call of `calls` on its rows.
pub(super) fn record(
    traces: &Traces,
    unit: &str,
    took: Duration,
    requests: Vec<(String, Outcomes)>,
    calls: &[CallRecord],
) {
    let began = SystemTime::now() - took;
    for (traceparent, outcomes) in requests {
        let of_request: Vec<PluginCall<'_>> = calls
            .iter()
            .filter_map(|call| {
                let rows = call
                    .requests
                    .iter()
                    .find(|(request, _)| **request == *traceparent)?
                    .1;
                Some(PluginCall {
                    name: call.plugin.name(),
                    version: &call.plugin.version,
                    world: call.plugin.config.world.as_str(),
                    began: call.began,
                    took: call.took,
                    rows,
                    error: call.error.as_deref(),
                })
            })
            .collect();
        traces.delivered(
            &traceparent,
            began,
            vec![
                KeyValue::new("weir.unit", unit.to_string()),
                KeyValue::new("weir.rows_delivered", outcomes.delivered),
                KeyValue::new("weir.rows_dropped", outcomes.dropped),
                KeyValue::new("weir.rows_retried", outcomes.retried),
                KeyValue::new("weir.rows_dead_lettered", outcomes.dead_lettered),
            ],
            &of_request,
        );
    }
}
