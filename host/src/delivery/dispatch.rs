//! A batch's run, group by group ([`Intake`]): each group's rows through
//! its variant's runner with failing calls isolated (`isolation`), into one
//! verdict per row of the batch; a row whose call failed alone
//! is retried with backoff (a dead letter past `max_deliveries`), and a
//! canaried plugin's rows are tallied for its canary.

use tracing::Instrument;

use crate::config::DeliveryConfig;
use crate::delivery::batch::Batch;
use crate::delivery::intake::{Group, Intake};
use crate::delivery::isolation::{self, RowVerdict};
use crate::delivery::pipeline::StepFailure;
use crate::delivery::runners::Runners;
use crate::delivery::traced::CallRecord;
use crate::delivery::verdict::Verdict;
use crate::fence::{Fence, Fenced};
use crate::reload::canary::Tally;
use crate::reload::generation::Generation;
use crate::sandbox::FailureKind;
use crate::state::landing::Landing;

/// What a batch's run leaves for its settlement.
pub(super) struct Ran {
    /// One per row of the batch, in batch order.
    pub verdicts: Vec<Verdict>,
    /// Its plugin calls on rows of traced requests.
    pub calls: Vec<CallRecord>,
    /// Its state writes on their way: its rows are answered once they landed.
    pub landing: Landing,
    /// Whether a pipeline of it keeps state (its acks are recorded).
    pub stateful: bool,
}

/// Runs every group of `intake` through its runner (recording its calls
/// if `traced`): one verdict per row of the batch, in batch order, in
/// `verdicts` (an emptied vector kept from an earlier batch; `results`
/// likewise, for isolation's results).
pub(super) async fn dispatch(
    runners: &mut Runners,
    intake: &Intake,
    generation: &Generation,
    lease: &dyn Fence,
    traced: bool,
    verdicts: Vec<Verdict>,
    results: &mut Vec<RowVerdict>,
) -> Result<Ran, Fenced> {
    runners.begin_batch(traced);
    let stateful = runners.is_stateful();
    let verdicts = run_groups(runners, intake, generation, lease, verdicts, results).await;
    // Taken whatever the outcome: a later batch's spans show only its own.
    let (calls, landing) = runners.end_batch();
    Ok(Ran {
        verdicts: verdicts?,
        calls,
        landing,
        stateful,
    })
}

async fn run_groups(
    runners: &mut Runners,
    intake: &Intake,
    generation: &Generation,
    lease: &dyn Fence,
    mut verdicts: Vec<Verdict>,
    results: &mut Vec<RowVerdict>,
) -> Result<Vec<Verdict>, Fenced> {
    let settings = &generation.config().delivery;
    verdicts.clear();
    verdicts.resize(intake.rows, Verdict::Done);
    for (index, reason) in &intake.undeliverable {
        verdicts[*index] = Verdict::DeadLetter {
            plugin: None,
            reason: reason.clone(),
        };
    }
    for group in intake.groups() {
        let Some(runner) = runners.get_mut(group.variant) else {
            continue;
        };
        let span = tracing::info_span!(
            "pipeline",
            tenant = %few((0..group.rows.len()).map(|row| group.rows.tenant(row))),
            table = %few((0..group.rows.len()).map(|row| group.rows.table(row))),
        );
        async {
            isolation::run(runner, &group.rows, lease, results).await?;
            judge(group, generation, settings, results, &mut verdicts);
            Ok(())
        }
        .instrument(span)
        .await?;
    }
    Ok(verdicts)
}

/// Each row's verdict from isolation's results for `group`, its canaried
/// plugins' tallies counted.
fn judge(
    group: &Group,
    generation: &Generation,
    settings: &DeliveryConfig,
    results: &mut Vec<RowVerdict>,
    verdicts: &mut [Verdict],
) {
    let canaried = generation.variant_canaries(group.variant);
    let mut tallies = vec![Tally::default(); canaried.len()];
    let failed = results.iter().filter(|result| result.is_err()).count();
    let mut said = false;
    let each = results.drain(..).zip(&group.indexes).enumerate();
    for (row, (result, &index)) in each {
        verdicts[index] = match result {
            Ok(verdict) => {
                tally_verdict(&canaried, &mut tallies, &verdict);
                verdict
            }
            Err(failure) => {
                tally_failure(&canaried, &mut tallies, &failure);
                if !std::mem::replace(&mut said, true) {
                    tracing::warn!(
                        plugin = failure.plugin.name(),
                        version = %failure.plugin.version,
                        rows = failed,
                        of = group.rows.len(),
                        error = %failure.error,
                        "plugin call failed; the failing rows were isolated and will be retried"
                    );
                }
                failed_row(settings, &group.rows, row, failure)
            }
        };
    }
    for ((name, candidate), tally) in canaried.iter().zip(&tallies) {
        if let (Some(canary), Some(plugin)) = (
            generation.canary(name),
            generation.plugin_in(group.variant, name),
        ) {
            let counts = generation.canary_counts();
            counts.add(name, &canary.canary, *candidate, &plugin.version, tally);
        }
    }
}

/// Counts a row's verdict for each canaried plugin of its variant: a row
/// it ran, and a dead letter if that plugin asked for it.
fn tally_verdict(canaried: &[(&str, bool)], tallies: &mut [Tally], verdict: &Verdict) {
    for ((name, _), tally) in canaried.iter().zip(tallies.iter_mut()) {
        tally.rows += 1;
        if let Verdict::DeadLetter {
            plugin: Some(plugin),
            ..
        } = verdict
            && plugin.name() == *name
        {
            tally.dead_letters += 1;
        }
    }
}

/// Counts a row whose call failed on its own for each canaried plugin of
/// its variant: a trap or a deadline overrun of the plugin that failed.
fn tally_failure(canaried: &[(&str, bool)], tallies: &mut [Tally], failure: &StepFailure) {
    for ((name, _), tally) in canaried.iter().zip(tallies.iter_mut()) {
        tally.rows += 1;
        if failure.plugin.name() != *name {
            continue;
        }
        match failure.error.kind {
            FailureKind::Trap | FailureKind::Memory | FailureKind::Contract => tally.traps += 1,
            FailureKind::Deadline => tally.deadlines += 1,
            FailureKind::Refused => {}
        }
    }
}

/// The verdict of row `row` of `rows` whose plugin call failed on its own:
/// retry it with backoff, naming the plugin (a dead letter after the last
/// delivery).
fn failed_row(
    settings: &DeliveryConfig,
    rows: &Batch,
    row: usize,
    failure: StepFailure,
) -> Verdict {
    let position = rows.position(row);
    tracing::debug!(
        tenant = rows.tenant(row),
        table = rows.table(row),
        sequence = position.sequence,
        plugin = failure.plugin.name(),
        attempt = position.attempt,
        error = %failure.error,
        "a row fails its plugin; it will be retried"
    );
    Verdict::Retry {
        delay: settings.backoff(i64::from(position.attempt), position.sequence),
        plugin: Some(failure.plugin),
        reason: failure.error.message,
    }
}

/// Up to three distinct values, joined by commas (`…` when there are more):
/// a group's tenants or tables, for its span.
fn few<'a>(values: impl Iterator<Item = &'a str>) -> String {
    let mut distinct: Vec<&str> = Vec::with_capacity(4);
    for value in values {
        if !distinct.contains(&value) {
            distinct.push(value);
            if distinct.len() > 3 {
                distinct[3] = "…";
                break;
            }
        }
    }
    distinct.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_names_three_values_then_an_ellipsis() {
        assert_eq!(few(["a", "a", "b"].into_iter()), "a,b");
        assert_eq!(few(["a", "b", "c", "d", "e"].into_iter()), "a,b,c,…");
    }
}
