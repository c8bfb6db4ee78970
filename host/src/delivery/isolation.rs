//! Isolating the rows that fail their plugin: when a call fails, the rows
//! of the call are tried again in smaller calls until each failing row
//! stands alone, and the others go through. Delivery and `weir plugin
//! test` both run their rows through here, so they isolate alike.
//!
//! - a fast failure (trap, memory cap) splits the rows in halves until the
//!   failing rows stand alone: few calls, each cheap;
//! - a deadline runs every row of the call alone, [`ISOLATION_LANES`] at a
//!   time on instances of their own (`PipelineRunner::lane`): halving
//!   would cost one deadline-long call per step, one after another, and
//!   stall every tenant on the unit;
//! - a deadline in a stateful pipeline runs the rows alone one after
//!   another on the same runner: its state stays the one copy, written in
//!   row order.
//!
//! It works on the packed rows it is given and returns what became of
//! each: it never calls back into its caller.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::delivery::batch::Batch;
use crate::delivery::pipeline::{PipelineRunner, RunError, StepFailure};
use crate::delivery::verdict::Verdict;
use crate::fence::{Fence, Fenced};
use crate::sandbox::FailureKind;
use crate::state::landing::Landing;

/// Rows of a batch that failed on a deadline run alone this many at a
/// time, each lane on instances of its own.
pub const ISOLATION_LANES: usize = 8;

/// What became of one row: its verdict, or the failure of the call it
/// made alone (the caller decides: a retry with backoff, a report).
pub type RowVerdict = Result<Verdict, StepFailure>;

/// Runs `rows` through `runner`, isolating the rows whose call fails:
/// `results` (emptied first; a vector kept from the last batch, so a batch
/// that goes through costs no allocation here) gets each row's result, in
/// the order of `rows`.
pub async fn run(
    runner: &mut PipelineRunner,
    rows: &Batch,
    lease: &dyn Fence,
    results: &mut Vec<RowVerdict>,
) -> Result<(), Fenced> {
    results.clear();
    let failure = match runner.run_on(rows, lease).await {
        Ok(mut verdicts) => {
            results.extend(verdicts.drain(..).map(Ok));
            runner.keep_verdicts(verdicts);
            return Ok(());
        }
        Err(RunError::Failed(failure)) => failure,
        Err(RunError::Fenced(fenced)) => return Err(fenced),
    };
    results.extend((0..rows.len()).map(|_| Ok(Verdict::Done)));
    isolate(
        runner,
        rows,
        (0..rows.len()).collect(),
        failure,
        lease,
        results,
    )
    .await
}

/// After the call of `part` (indexes into `rows`) failed with `failure`:
/// smaller calls until every failing row stands alone, each row's result
/// written at its index in `results`.
async fn isolate(
    runner: &mut PipelineRunner,
    rows: &Batch,
    part: Vec<usize>,
    failure: StepFailure,
    lease: &dyn Fence,
    results: &mut [RowVerdict],
) -> Result<(), Fenced> {
    let mut failed = Some((part, failure));
    let mut parts: Vec<Vec<usize>> = Vec::new();
    let mut packed = Batch::default();
    loop {
        let (part, failure) = match failed.take() {
            Some(failed) => failed,
            None => {
                let Some(part) = parts.pop() else {
                    return Ok(());
                };
                pack(rows, &part, &mut packed);
                match runner.run_on(&packed, lease).await {
                    Ok(mut verdicts) => {
                        for (&index, verdict) in part.iter().zip(verdicts.drain(..)) {
                            results[index] = Ok(verdict);
                        }
                        runner.keep_verdicts(verdicts);
                        continue;
                    }
                    Err(RunError::Failed(failure)) => (part, failure),
                    Err(RunError::Fenced(fenced)) => return Err(fenced),
                }
            }
        };
        if let [index] = part[..] {
            results[index] = Err(failure);
            continue;
        }
        if failure.error.kind == FailureKind::Deadline && runner.is_stateful() {
            parts.extend(part.iter().rev().map(|&index| vec![index]));
        } else if failure.error.kind == FailureKind::Deadline {
            // Made before the wait: a runner is not shared across threads.
            let lanes = (0..ISOLATION_LANES.min(part.len()))
                .map(|_| runner.lane())
                .collect();
            let (alone, landing) = alone(lanes, rows, &part, lease).await?;
            runner.keep_landing(landing);
            for (index, result) in alone {
                results[index] = result;
            }
        } else {
            let (left, right) = part.split_at(part.len() / 2);
            parts.push(right.to_vec());
            parts.push(left.to_vec());
        }
    }
}

/// The rows `part` of `rows`, packed into `into` (emptied first).
fn pack(rows: &Batch, part: &[usize], into: &mut Batch) {
    into.clear();
    for &row in part {
        into.push_from(rows, row);
    }
}

/// Rows run alone, concurrently: a row that runs into its deadline costs
/// one deadline, shared with up to [`ISOLATION_LANES`] − 1 others, and the
/// rows that are fine go through meanwhile.
async fn alone(
    lanes: Vec<PipelineRunner>,
    rows: &Batch,
    part: &[usize],
    lease: &dyn Fence,
) -> Result<(Vec<(usize, RowVerdict)>, Landing), Fenced> {
    let next = AtomicUsize::new(0);
    let lanes = lanes
        .into_iter()
        .map(|runner| lane(runner, rows, part, &next, lease));
    let mut results = Vec::with_capacity(part.len());
    let mut landing = Landing::default();
    for lane in futures::future::join_all(lanes).await {
        let (lane, its) = lane?;
        results.extend(lane);
        landing.join(its);
    }
    Ok((results, landing))
}

/// One lane: its fresh instances (dropped afterwards, back to the pool)
/// take the next row of `part` until none is left.
async fn lane(
    mut runner: PipelineRunner,
    rows: &Batch,
    part: &[usize],
    next: &AtomicUsize,
    lease: &dyn Fence,
) -> Result<(Vec<(usize, RowVerdict)>, Landing), Fenced> {
    let mut results = Vec::new();
    let mut packed = Batch::default();
    while let Some(&index) = part.get(next.fetch_add(1, Ordering::Relaxed)) {
        pack(rows, &[index], &mut packed);
        let result = match runner.run_on(&packed, lease).await {
            Ok(verdicts) => Ok(verdicts.into_iter().next().unwrap_or(Verdict::Done)),
            Err(RunError::Failed(failure)) => Err(failure),
            Err(RunError::Fenced(fenced)) => return Err(fenced),
        };
        results.push((index, result));
    }
    // What its rows wait for (the objects they went into) is the batch's.
    Ok((results, runner.take_landing()))
}
