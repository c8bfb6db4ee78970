//! Carries a batch's [`SettlementPlan`] out against NATS: its dead letters
//! stored first (waiting for their PubAcks), then every row answered in
//! batch order (ack or nak) while the lease holds, then counted and logged.
//!
//! Architecture invariant: a row is acked only after its pipeline finished
//! with it, or after its dead letter was stored.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, AckKind};
use async_nats::{Client, Message};
use tokio::time::Instant;

use crate::config::DeliveryConfig;
use crate::coordination::Lease;
use crate::delivery::dead_letter::{DeadLetter, DeadLetters};
use crate::delivery::pipeline::Verdict;
use crate::delivery::recycle;
use crate::delivery::settle::{
    Answer, Delivery, Fate, Fence, Fenced, Late, Named, OrderWatch, Reply, SettlementPlan,
};
use crate::nats::ack::{self, AckInfo};
use crate::sandbox::Plugin;
use crate::telemetry::{DeadLetterLabels, Metrics, UnitLabels};
use crate::topology::route::Names;

/// Rows dead-lettered or retried are logged one by one at DEBUG, and at
/// INFO as one summary per unit at most this often: a bad producer must
/// not turn the log into a copy of the dead-letter stream.
const SUMMARY_PERIOD: Duration = Duration::from_secs(10);
/// Distinct reasons a summary names; the rest are counted together.
const SUMMARY_REASONS: usize = 8;
/// Characters of a reason a summary keeps.
const SUMMARY_REASON_CHARS: usize = 120;

/// Settles rows: the part of a worker that holds no plugin instance, so it
/// can be borrowed across awaits while the worker is sent between threads.
pub(super) struct Settler {
    /// Answers every row's ack subject: one handle for all rows.
    pub(super) client: Client,
    router: Names,
    pub(super) settings: DeliveryConfig,
    dead_letters: DeadLetters,
    metrics: Metrics,
    /// The ack subject of the last row acked: repeated with a reply asked
    /// for, it confirms every answer sent before it was applied.
    pub(super) last_acked: Option<async_nats::Subject>,
    /// The stream sequences of the rows acked, kept while `record_acked`
    /// (a stateful pipeline's rows, whose scopes may then forget them).
    pub(super) acked: Vec<u64>,
    pub(super) record_acked: bool,
    /// The unit's pending-rows gauge.
    pub(super) unit_labels: UnitLabels,
    pub(super) summary: Summary,
    order: OrderWatch,
    /// `[dead_letters] redact` of the generation the worker runs.
    pub(super) redact: Vec<String>,
    /// Rows answered as delivered since the worker last took the count.
    pub(super) delivered: u64,
    /// The last batch's per-row vectors, kept for the next.
    spare: SettleSpare,
}

/// A settlement's per-row vectors, empty between batches (their elements
/// borrow a batch's messages and plan).
#[derive(Default)]
struct SettleSpare {
    infos: Vec<Option<AckInfo<'static>>>,
    deliveries: Vec<Delivery>,
    fates: Vec<Fate<Arc<Plugin>>>,
    answers: Vec<Answer<'static>>,
}

impl Settler {
    pub(super) fn new(
        js: &jetstream::Context,
        router: Names,
        settings: DeliveryConfig,
        metrics: Metrics,
        unit_labels: UnitLabels,
    ) -> Settler {
        Settler {
            client: js.client(),
            dead_letters: DeadLetters::new(js.clone(), router.clone()),
            router,
            settings,
            metrics,
            last_acked: None,
            acked: Vec::new(),
            record_acked: false,
            unit_labels,
            summary: Summary::new(),
            order: OrderWatch::default(),
            redact: Vec::new(),
            delivered: 0,
            spare: SettleSpare::default(),
        }
    }

    /// Acks, naks or dead-letters each row. Dead letters are stored before
    /// their rows are acked; a row whose letter was not stored is retried.
    /// Nothing is stored or answered once `lease` no longer holds: the rows
    /// left are the next owner's.
    pub(super) async fn settle(
        &mut self,
        batch: &[Message],
        verdicts: &mut Vec<Verdict>,
        lease: &Lease,
    ) -> Result<(), Fenced> {
        if !lease.held() {
            return Err(Fenced);
        }
        // Each per-row vector is the last batch's, reused.
        let spare = std::mem::take(&mut self.spare);
        // One read of each row's ack subject: its deliveries, and its order.
        let mut infos: Vec<Option<AckInfo<'_>>> = recycle(spare.infos);
        infos.extend(batch.iter().map(ack::info));
        let mut deliveries = spare.deliveries;
        deliveries.clear();
        deliveries.extend(infos.iter().map(|info| Delivery {
            sequence: info.as_ref().map(|info| info.stream_sequence),
            delivered: info.as_ref().map_or(1, |info| info.delivered),
        }));
        let plan = SettlementPlan::new_in(
            spare.fates,
            verdicts.drain(..).map(Fate::from),
            &deliveries,
            self.settings.max_deliveries,
            &mut self.order,
        );
        self.count_late(&plan.late);
        let stored = self.store_letters(&plan, batch, &infos, &deliveries).await;
        let mut answers = recycle(spare.answers);
        plan.answers_into(&stored, self.settings.failure_delay, &mut answers);
        let answered = self.answer_all(batch, &infos, &mut answers, lease).await;
        // The server says with every delivery how many rows are left after
        // it: the unit's backlog, without asking for the consumer's info.
        if let Some(Some(info)) = infos.last() {
            self.metrics
                .unit_pending_rows
                .get_or_create(&self.unit_labels)
                .set(i64::try_from(info.pending).unwrap_or(i64::MAX));
        }
        self.summary.flush(&self.unit_labels.unit, false);
        self.spare = SettleSpare {
            answers: recycle(answers),
            infos: recycle(infos),
            deliveries,
            fates: recycle(plan.rows),
        };
        answered
    }

    fn count_late(&self, late: &Late) {
        let Some((sequence, delivered, highest)) = late.first else {
            return;
        };
        tracing::debug!(
            consumer = %self.unit_labels.unit,
            rows = late.rows,
            sequence,
            delivered,
            highest,
            "rows came back behind newer ones"
        );
        self.metrics
            .rows_out_of_order
            .get_or_create(&self.unit_labels)
            .inc_by(late.rows);
    }

    /// Stores the plan's dead letters, waiting for their PubAcks: whether
    /// each was stored, in the plan's order.
    async fn store_letters<P: Named>(
        &self,
        plan: &SettlementPlan<P>,
        batch: &[Message],
        infos: &[Option<AckInfo<'_>>],
        deliveries: &[Delivery],
    ) -> Vec<bool> {
        let letters = plan.letters().map(|(index, plugin, reason)| {
            let (message, info) = (&batch[index], infos[index].as_ref());
            let (tenant, table) = self
                .router
                .parse(message.subject.as_str())
                .unwrap_or((Cow::Borrowed("unknown"), Cow::Borrowed("unknown")));
            DeadLetter {
                tenant,
                table,
                reason,
                plugin: plugin.map(|p| (p.name(), p.version())),
                deliveries: deliveries[index].delivered,
                stream: info.map_or("", |info| info.stream),
                sequence: info.map_or(0, |info| info.stream_sequence),
                payload: message.payload.clone(),
                original_headers: message.headers.as_ref(),
            }
        });
        let stored = self
            .dead_letters
            .publish_all(letters.collect(), &self.redact)
            .await;
        stored
            .into_iter()
            .map(|result| match result {
                Ok(()) => true,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot store a dead letter; the row will be retried");
                    false
                }
            })
            .collect()
    }

    /// Answers each row in batch order, the lease checked right before each;
    /// `Err` when it ran out (the rows after are left unanswered).
    async fn answer_all(
        &mut self,
        batch: &[Message],
        infos: &[Option<AckInfo<'_>>],
        answers: &mut Vec<Answer<'_>>,
        lease: &Lease,
    ) -> Result<(), Fenced> {
        let mut last_acked = None;
        let answers = answers.drain(..);
        let mut rows = Fence::new(batch.iter().zip(infos).zip(answers), || lease.held());
        for ((message, info), answer) in rows.by_ref() {
            let acked = answer.acks();
            if !acked && let Some(info) = info {
                self.order.handed_back(info.stream_sequence);
            }
            self.count(message, info.as_ref(), &answer);
            let kind = match answer.reply() {
                Reply::Ack => AckKind::Ack,
                Reply::Nak(delay) => AckKind::Nak(Some(delay)),
            };
            match self.answer(message, kind).await {
                Ok(()) if acked => {
                    last_acked = Some(message);
                    if let Some(info) = info {
                        if self.record_acked {
                            self.acked.push(info.stream_sequence);
                        }
                        // A server clock ahead of this host's counts as 0.
                        let waited = SystemTime::now()
                            .duration_since(info.created)
                            .unwrap_or_default();
                        self.metrics.accept_to_ack.observe(waited.as_secs_f64());
                    }
                }
                Ok(()) => {}
                Err(err) => {
                    tracing::warn!(error = %err, subject = %message.subject, "cannot settle a row; JetStream will redeliver it")
                }
            }
        }
        if let Some(message) = last_acked {
            self.last_acked = message.reply.clone();
        }
        rows.result()
    }

    /// Counts a row's answer (before it is sent) and logs it at DEBUG.
    fn count(&mut self, message: &Message, info: Option<&AckInfo<'_>>, answer: &Answer<'_>) {
        match *answer {
            Answer::Delivered => {
                self.metrics.rows_delivered.inc();
                self.delivered += 1;
            }
            Answer::Dropped => {
                self.metrics.rows_dropped.inc();
            }
            Answer::Unlettered { .. } => {
                self.metrics.rows_retried.inc();
            }
            Answer::DeadLettered {
                plugin,
                reason,
                cause,
            } => self.dead_lettered(message, info, plugin, reason, cause.label()),
            Answer::Retried {
                delay,
                plugin,
                reason,
            } => {
                self.metrics.rows_retried.inc();
                self.summary.retried += 1;
                tracing::debug!(
                    tenant = %self.router.parse(message.subject.as_str()).map_or(Cow::Borrowed(""), |(t, _)| t),
                    table = %self.router.parse(message.subject.as_str()).map_or(Cow::Borrowed(""), |(_, t)| t),
                    unit = %self.unit_labels.unit,
                    sequence = info.map_or(0, |info| info.stream_sequence),
                    plugin = plugin.unwrap_or(""),
                    %reason,
                    ?delay,
                    "row handed back for a retry"
                );
            }
        }
    }

    /// Counts and logs (at DEBUG) a row acked after its dead letter was stored.
    fn dead_lettered(
        &mut self,
        message: &Message,
        info: Option<&AckInfo<'_>>,
        plugin: Option<&str>,
        reason: &str,
        cause: &'static str,
    ) {
        self.metrics.rows_dead_lettered.inc();
        self.metrics
            .dead_letters
            .get_or_create(&DeadLetterLabels {
                plugin: plugin.unwrap_or("none").to_string(),
                cause,
            })
            .inc();
        self.summary.dead_lettered(plugin.unwrap_or(""), reason);
        // Parsing the subject again costs only when the line is wanted.
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let parsed = self.router.parse(message.subject.as_str()).ok();
        tracing::debug!(
            tenant = parsed.as_ref().map_or("", |(tenant, _)| tenant.as_ref()),
            table = parsed.as_ref().map_or("", |(_, table)| table.as_ref()),
            unit = %self.unit_labels.unit,
            sequence = info.map_or(0, |info| info.stream_sequence),
            plugin = plugin.unwrap_or(""),
            reason,
            cause,
            "row dead-lettered"
        );
    }

    async fn answer(&self, message: &Message, kind: AckKind) -> Result<(), crate::nats::NatsError> {
        ack::reply(&self.client, message, kind).await
    }

    /// Waits until the server has applied every answer this worker sent.
    ///
    /// Publishing an ack only hands it to the socket: the server queues acks
    /// per consumer and applies them in order, and with `sync = "always"` a
    /// work-queue ack is an fsync'd delete, so the queue can hold thousands
    /// of acks. A server stopped meanwhile would redeliver all of them. A
    /// repeated ack of an already acked row, with a reply asked for, is
    /// answered once every answer before it was applied (and, on a
    /// replicated consumer, once it has reached the quorum); re-acking it
    /// changes nothing.
    pub(super) async fn confirm_applied(&self, consumer: &str, within: Duration) {
        let Some(subject) = self.last_acked.clone() else {
            return;
        };
        let started = Instant::now();
        match confirm_acks(&self.client, subject, within).await {
            Ok(Ok(())) => tracing::debug!(
                consumer,
                waited = ?started.elapsed(),
                "the server applied every answer to this unit's rows"
            ),
            Ok(Err(err)) => tracing::warn!(
                consumer,
                error = %err,
                "cannot confirm this unit's last acks; rows whose ack was not applied will be redelivered"
            ),
            Err(_) => tracing::warn!(
                consumer,
                ?within,
                "the server did not apply this unit's last acks within the drain timeout (`[delivery] drain_timeout_secs`); rows whose ack was not applied will be redelivered"
            ),
        }
    }

    /// The unit is no longer pulled here: its summary is said now, and its
    /// backlog is another host's to report.
    pub(super) fn stopped(&mut self) {
        self.summary.flush(&self.unit_labels.unit, true);
        self.metrics.unit_pending_rows.remove(&self.unit_labels);
    }
}

/// Repeats the ack sent last on `client` (`last_ack`, its subject) as a
/// request: the server answers once it applied every answer sent before
/// it. The outer error: no answer `within`.
pub(super) async fn confirm_acks(
    client: &Client,
    last_ack: async_nats::Subject,
    within: Duration,
) -> Result<Result<(), async_nats::RequestError>, tokio::time::error::Elapsed> {
    // The whole `within`, not the client's request timeout: with `sync =
    // "always"` a busy server can take longer than that to apply thousands
    // of acks, and a worker that stopped waiting then let its host exit
    // with acks unapplied (rows delivered twice after a planned stop).
    let request = async_nats::Request::new()
        .payload(bytes::Bytes::from_static(b"+ACK"))
        .timeout(Some(within));
    Ok(
        tokio::time::timeout(within, client.send_request(last_ack, request))
            .await?
            .map(|_| ()),
    )
}

/// Rows dead-lettered and retried since the last INFO summary of a unit.
pub(super) struct Summary {
    since: Instant,
    retried: u64,
    /// Dead-lettered rows by plugin and reason (bounded; see
    /// [`SUMMARY_REASONS`]).
    dead_lettered: BTreeMap<(String, String), u64>,
}

impl Summary {
    fn new() -> Summary {
        Summary {
            since: Instant::now(),
            retried: 0,
            dead_lettered: BTreeMap::new(),
        }
    }

    /// When the summary is to be said, if there is anything to say.
    pub(super) fn due(&self) -> Option<Instant> {
        let quiet = self.dead_lettered.is_empty() && self.retried == 0;
        (!quiet).then_some(self.since + SUMMARY_PERIOD)
    }

    fn dead_lettered(&mut self, plugin: &str, reason: &str) {
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
    pub(super) fn flush(&mut self, unit: &str, now: bool) {
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
