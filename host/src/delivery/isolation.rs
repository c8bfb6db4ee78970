//! Isolating the rows that fail their plugin: when a call fails, the rows
//! of the call are tried again in smaller calls until each failing row
//! stands alone, and the others go through. Delivery and `weir plugin
//! test` both run their rows through here, so they isolate alike.
//!
//! - a fast failure (trap, memory cap) splits the rows in halves until the
//!   failing rows stand alone: few calls, each cheap;
//! - a deadline runs every row of the call alone, [`ISOLATION_LANES`] at a
//!   time on instances of their own: halving would cost one deadline-long
//!   call per step, one after another, and stall every tenant on the unit;
//! - a deadline in a stateful pipeline runs the rows alone one after
//!   another on the same runner: its state stays the one copy, written in
//!   row order.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::coordination::Lease;
use crate::delivery::batch::Batch;
use crate::delivery::pipeline::{PipelineRunner, RunError, StepFailure, Verdict};
use crate::sandbox::FailureKind;

/// Rows of a batch that failed on a deadline run alone this many at a
/// time, each lane on instances of its own.
pub const ISOLATION_LANES: usize = 8;

/// The rows being isolated, by the caller's indexes.
pub trait Rows: Sync {
    /// The rows `part`, packed for the pipeline into `into` (empty; its
    /// buffers, the last batch's, may be reused).
    fn pack(&self, part: &[usize], into: Batch) -> Batch;
    /// A runner of the same pipeline on instances of its own and without
    /// state: one lane of a deadline's isolation.
    fn lane_runner(&self) -> Option<PipelineRunner>;
    /// A call of `rows` rows failed: isolation begins (said once per run).
    fn isolating(&self, failure: &StepFailure, rows: usize);
}

/// What became of one row: its verdict, or the failure of the call it
/// made alone (the caller decides: a retry with backoff, a report).
pub type RowResult = Result<Verdict, StepFailure>;

/// The lease ran out: nothing more may be delivered.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the lease ran out")]
pub struct Fenced;

/// Runs the rows `indexes` through `runner`, isolating the rows whose call
/// fails; hands each row's result, with its index, to `settle` (no vector
/// of results: a batch that goes through costs no allocation here).
pub async fn run(
    runner: &mut PipelineRunner,
    rows: &impl Rows,
    indexes: &[usize],
    lease: &Lease,
    settle: &mut impl FnMut(usize, RowResult),
) -> Result<(), Fenced> {
    let Some(failure) = call(runner, rows, indexes, lease, settle).await? else {
        return Ok(());
    };
    let mut failed = Some((indexes.to_vec(), failure));
    let mut parts: Vec<Vec<usize>> = Vec::new();
    let mut isolating = false;
    loop {
        let (part, failure) = match failed.take() {
            Some(failed) => failed,
            None => {
                let Some(part) = parts.pop() else {
                    return Ok(());
                };
                match call(runner, rows, &part, lease, settle).await? {
                    Some(failure) => (part, failure),
                    None => continue,
                }
            }
        };
        if let [index] = part[..] {
            settle(index, Err(failure));
            continue;
        }
        if !isolating {
            rows.isolating(&failure, part.len());
            isolating = true;
        }
        if failure.error.kind == FailureKind::Deadline && runner.is_stateful() {
            parts.extend(part.iter().rev().map(|&index| vec![index]));
        } else if failure.error.kind == FailureKind::Deadline {
            for (index, result) in alone(rows, &part, lease).await? {
                settle(index, result);
            }
        } else {
            let (left, right) = part.split_at(part.len() / 2);
            parts.push(right.to_vec());
            parts.push(left.to_vec());
        }
    }
}

/// One call of the rows `part`: each row's verdict handed to `settle`, or
/// the call's failure (nothing handed over).
async fn call(
    runner: &mut PipelineRunner,
    rows: &impl Rows,
    part: &[usize],
    lease: &Lease,
    settle: &mut impl FnMut(usize, RowResult),
) -> Result<Option<StepFailure>, Fenced> {
    let packed = rows.pack(part, runner.take_spare());
    match runner.run(packed, lease).await {
        Ok(mut verdicts) => {
            for (&index, verdict) in part.iter().zip(verdicts.drain(..)) {
                settle(index, Ok(verdict));
            }
            runner.keep_verdicts(verdicts);
            Ok(None)
        }
        Err(RunError::Failed(failure)) => Ok(Some(failure)),
        Err(RunError::Fenced) => Err(Fenced),
    }
}

/// Rows run alone, concurrently: a row that runs into its deadline costs
/// one deadline, shared with up to [`ISOLATION_LANES`] − 1 others, and the
/// rows that are fine go through meanwhile.
async fn alone(
    rows: &impl Rows,
    part: &[usize],
    lease: &Lease,
) -> Result<Vec<(usize, RowResult)>, Fenced> {
    let next = AtomicUsize::new(0);
    let lanes = (0..ISOLATION_LANES.min(part.len())).map(|_| lane(rows, part, &next, lease));
    let mut results = Vec::with_capacity(part.len());
    for lane in futures::future::join_all(lanes).await {
        results.extend(lane?);
    }
    Ok(results)
}

/// One lane: fresh instances (dropped afterwards, back to the pool),
/// taking the next row of `part` until none is left.
async fn lane(
    rows: &impl Rows,
    part: &[usize],
    next: &AtomicUsize,
    lease: &Lease,
) -> Result<Vec<(usize, RowResult)>, Fenced> {
    let mut results = Vec::new();
    let Some(mut runner) = rows.lane_runner() else {
        return Ok(results);
    };
    while let Some(&index) = part.get(next.fetch_add(1, Ordering::Relaxed)) {
        let packed = rows.pack(&[index], runner.take_spare());
        let result = match runner.run(packed, lease).await {
            Ok(verdicts) => Ok(verdicts.into_iter().next().unwrap_or(Verdict::Done)),
            Err(RunError::Failed(failure)) => Err(failure),
            Err(RunError::Fenced) => return Err(Fenced),
        };
        results.push((index, result));
    }
    Ok(results)
}
