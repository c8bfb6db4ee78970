//! One batch's run: its rows decoded and grouped by the pipeline that
//! takes them (the tenant's variant), each group run through its runner
//! with failing calls isolated (`delivery::isolation`), into one verdict
//! per row. The worker (`delivery::worker`) pulls, holds and answers.

use std::borrow::Cow;

use async_nats::Message;
use tracing::Instrument;

use crate::config::DeliveryConfig;
use crate::coordination::Lease;
use crate::delivery::batch::{Batch, Position};
use crate::delivery::isolation;
use crate::delivery::pipeline::{PipelineRunner, StepFailure, Verdict};
use crate::delivery::recycle;
use crate::delivery::settle::Fenced;
use crate::destination::Publisher;
use crate::nats::ack;
use crate::nats::jetstream::is_delivery_header;
use crate::reload::canary::Tally;
use crate::reload::generation::Generation;
use crate::sandbox::FailureKind;
use crate::topology::route::{Names, Unit};

/// The unit a batch's rows belong to and the connection its sinks publish
/// on: what a lane's destinations are made with.
pub(super) struct Destinations<'a> {
    pub unit: Unit,
    pub publisher: &'a Publisher,
}

/// Runs each pipeline's rows of a batch into `scratch.verdicts` (one per
/// row). When a plugin call fails, the failing rows are found
/// (`delivery::isolation`) and retried alone (with backoff; past
/// `max_deliveries` dead-lettered with the failure as their reason) while
/// the others are delivered.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_pipelines(
    runners: &mut [Option<PipelineRunner>],
    pipelines: &Generation,
    router: &Names,
    settings: &DeliveryConfig,
    batch: &[Message],
    lease: &Lease,
    destinations: Destinations<'_>,
    scratch: &mut Scratch,
) -> Result<(), Fenced> {
    let unit = router.unit_consumer(destinations.unit);
    let publisher = destinations.publisher;
    let verdicts = &mut scratch.verdicts;
    verdicts.clear();
    verdicts.resize(batch.len(), Verdict::Done);
    let mut decoded: Vec<Option<Decoded>> = recycle(std::mem::take(&mut scratch.decoded));
    decoded.reserve(batch.len());
    // Batch indexes by pipeline, in batch order; the first `used` groups
    // are this batch's (the others' vectors wait, empty, for a later one).
    let groups = &mut scratch.groups;
    let mut used = 0;
    for (index, message) in batch.iter().enumerate() {
        match decode(router, pipelines, destinations.unit, message) {
            Ok(row) => {
                match groups[..used].iter_mut().find(|(p, _)| *p == row.pipeline) {
                    Some((_, indexes)) => indexes.push(index),
                    None => {
                        if used == groups.len() {
                            groups.push((row.pipeline, Vec::new()));
                        }
                        let (pipeline, indexes) = &mut groups[used];
                        *pipeline = row.pipeline;
                        indexes.clear();
                        // Most batches are one pipeline's: sized once.
                        indexes.reserve(batch.len() - index);
                        indexes.push(index);
                        used += 1;
                    }
                }
                decoded.push(Some(row));
            }
            Err(reason) => {
                decoded.push(None);
                verdicts[index] = Verdict::DeadLetter {
                    plugin: None,
                    reason,
                };
            }
        }
    }
    let mut ran = Ok(());
    for (pipeline, indexes) in &groups[..used] {
        let pipeline = *pipeline;
        let Some(Some(runner)) = runners.get_mut(pipeline) else {
            continue;
        };
        let span = tracing::info_span!(
            "pipeline",
            tenant = %few(indexes.iter().filter_map(|&i| decoded[i].as_ref().map(|r| &*r.tenant))),
            table = %few(indexes.iter().filter_map(|&i| decoded[i].as_ref().map(|r| &*r.table))),
        );
        let rows = PipelineRows {
            generation: pipelines,
            pipeline,
            batch,
            decoded: &decoded,
            unit: &unit,
            publisher,
        };
        let canaried = pipelines.variant_canaries(pipeline);
        ran = async {
            let mut tallies = vec![Tally::default(); canaried.len()];
            isolation::run(runner, &rows, indexes, lease, &mut |index, result| {
                verdicts[index] = match result {
                    Ok(verdict) => {
                        tally_verdict(&canaried, &mut tallies, &verdict);
                        verdict
                    }
                    Err(failure) => {
                        tally_failure(&canaried, &mut tallies, &failure);
                        failed_row(settings, &batch[index], failure)
                    }
                };
            })
            .await
            .map_err(|_| Fenced)?;
            for ((name, candidate), tally) in canaried.iter().zip(&tallies) {
                if let (Some(canary), Some(plugin)) =
                    (pipelines.canary(name), pipelines.plugin_in(pipeline, name))
                {
                    let counts = pipelines.canary_counts();
                    counts.add(name, &canary.canary, *candidate, &plugin.version, tally);
                }
            }
            Ok(())
        }
        .instrument(span)
        .await;
        if ran.is_err() {
            break;
        }
    }
    scratch.decoded = recycle(decoded);
    ran
}

/// A batch's per-row vectors, kept by a worker from one batch to the next
/// so that a batch allocates none of its rows' size (the delivery bench's
/// allocated bytes per row).
#[derive(Default)]
pub(super) struct Scratch {
    pub verdicts: Vec<Verdict>,
    /// Empty between batches: its rows borrow a batch's messages.
    decoded: Vec<Option<Decoded<'static>>>,
    groups: Vec<(usize, Vec<usize>)>,
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

/// Up to three distinct values, joined by commas (`…` when there are more):
/// a batch's tenants or tables, for its span.
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

/// The verdict of a row whose plugin call failed on its own: retry it
/// with backoff, naming the plugin (a dead letter after the last delivery).
fn failed_row(settings: &DeliveryConfig, message: &Message, failure: StepFailure) -> Verdict {
    let info = ack::info(message);
    let attempt = info.as_ref().map_or(1, |info| info.delivered);
    tracing::debug!(
        unit = info.as_ref().map_or("", |info| info.consumer),
        sequence = info.as_ref().map_or(0, |info| info.stream_sequence),
        subject = %message.subject,
        plugin = failure.plugin.name(),
        attempt,
        error = %failure.error,
        "a row fails its plugin; it will be retried"
    );
    Verdict::Retry {
        delay: settings.backoff(attempt, info.map_or(0, |i| i.stream_sequence)),
        plugin: Some(failure.plugin),
        reason: failure.error.message,
    }
}

/// The rows of one pipeline of a batch, for its isolation.
struct PipelineRows<'a> {
    generation: &'a Generation,
    /// The pipeline variant (see `Generation::variant_index`).
    pipeline: usize,
    batch: &'a [Message],
    decoded: &'a [Option<Decoded<'a>>],
    /// The unit consumer's name, for a lane's destination ledger.
    unit: &'a str,
    publisher: &'a Publisher,
}

impl isolation::Rows for PipelineRows<'_> {
    fn pack(&self, part: &[usize], into: Batch) -> Batch {
        pack(self.batch, self.decoded, part, into)
    }

    fn lane_runner(&self) -> Option<PipelineRunner> {
        let pipeline = self.generation.variant_pipeline(self.pipeline)?;
        let config = self.generation.config().pipelines.get(pipeline)?;
        let plugin = |name: &str| self.generation.plugin_in(self.pipeline, name).cloned();
        PipelineRunner::new(config, plugin, None).map(|runner| {
            runner
                .with_destination(self.unit, true)
                .with_publisher(self.publisher)
        })
    }

    fn isolating(&self, failure: &StepFailure, rows: usize) {
        tracing::warn!(
            plugin = failure.plugin.name(),
            version = %failure.plugin.version,
            rows,
            error = %failure.error,
            "plugin call failed; isolating the failing rows"
        );
    }
}

/// What delivery needs of a message besides its payload: the pipeline that
/// takes it and what the plugins are told. Borrows the subject: no copy.
struct Decoded<'a> {
    /// The pipeline variant that takes it.
    pipeline: usize,
    tenant: Cow<'a, str>,
    table: Cow<'a, str>,
    position: Position,
}

fn decode<'a>(
    router: &Names,
    pipelines: &Generation,
    unit: Unit,
    message: &'a Message,
) -> Result<Decoded<'a>, String> {
    let info = ack::info(message).ok_or("no delivery info: not a JetStream delivery")?;
    let (tenant, table) = router
        .parse(message.subject.as_str())
        .map_err(|err| err.to_string())?;
    // A tenant's rows run in its variant: a canary's candidate or not.
    let pipeline = pipelines
        .variant_index(&table, &tenant, unit)
        .ok_or_else(|| format!("no pipeline takes table `{table}`"))?;
    Ok(Decoded {
        pipeline,
        tenant,
        table,
        position: Position {
            sequence: info.stream_sequence,
            attempt: u32::try_from(info.delivered).unwrap_or(u32::MAX),
        },
    })
}

/// Packs the rows `part` of a batch for the plugins, straight from their
/// messages, into `rows` (empty; the last batch's buffers are reused, so
/// a full batch's copy costs no allocation).
fn pack(batch: &[Message], decoded: &[Option<Decoded>], part: &[usize], mut rows: Batch) -> Batch {
    let bytes = part.iter().map(|&i| batch[i].payload.len() + 64).sum();
    rows.reserve(part.len(), bytes);
    for &index in part {
        let (Some(message), Some(Some(row))) = (batch.get(index), decoded.get(index)) else {
            continue;
        };
        let headers = message.headers.iter().flat_map(|headers| {
            headers
                .iter()
                .filter(|(name, _)| !is_delivery_header(name.as_ref()))
                .flat_map(|(name, values)| {
                    values
                        .iter()
                        .map(move |value| (name.as_ref(), value.as_str()))
                })
        });
        rows.push(
            &row.tenant,
            &row.table,
            &message.payload,
            headers,
            row.position,
        );
    }
    rows
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
