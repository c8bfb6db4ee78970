//! Carries a batch's [`SettlementPlan`] out against NATS: its dead letters
//! stored first (waiting for their PubAcks), then every row answered in
//! batch order (ack or nak) while the lease holds, then counted and logged.
//!
//! Architecture invariant: a row is acked only after its pipeline finished
//! with it, or after its dead letter was stored.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, AckKind};
use async_nats::{Client, Message};
use tokio::time::Instant;

use super::plan::{AckReply, Fate, Late, Named, OrderWatch, RowAnswer, SettlementPlan, WhileHeld};
use super::summary::Summary;
use crate::config::DeliveryConfig;
use crate::delivery::dlq::{DeadLetter, DeadLetters};
use crate::delivery::intake::Delivery;
use crate::delivery::recycle;
use crate::delivery::verdict::Verdict;
use crate::fence::{Fence, Fenced};
use crate::nats::ack;
use crate::sandbox::Plugin;
use crate::telemetry::{DeadLetterLabels, Metrics, UnitLabels};
use crate::topology::route::Names;

/// Settles rows: the part of a worker that holds no plugin instance, so it
/// can be borrowed across awaits while the worker is sent between threads.
pub(in crate::delivery) struct Settler {
    /// Answers every row's ack subject: one handle for all rows.
    client: Client,
    router: Names,
    /// The unit's partition stream, named in its dead letters.
    stream: String,
    settings: DeliveryConfig,
    dead_letters: DeadLetters,
    metrics: Metrics,
    /// The unit's pending-rows gauge.
    unit_labels: UnitLabels,
    summary: Summary,
    order: OrderWatch,
    /// `[dead_letters] redact` of the generation the worker runs.
    redact: Vec<String>,
    /// The last batch's per-row vectors, kept for the next.
    spare: SettleSpare,
}

/// What settling a batch did.
#[derive(Debug, Default)]
pub(in crate::delivery) struct Settled {
    /// Rows answered as delivered.
    pub delivered: u64,
    /// The stream sequences of the rows acked, when asked for (a stateful
    /// pipeline's rows, whose scopes may then forget them).
    pub acked: Vec<u64>,
    /// The ack subject of the last row acked: repeated with a reply asked
    /// for, it confirms every answer sent before it was applied.
    pub last_ack: Option<async_nats::Subject>,
    /// The fence failed before every row was answered: the rows after are
    /// the next owner's.
    pub fenced: bool,
}

impl Settled {
    pub fn result(&self) -> Result<(), Fenced> {
        if self.fenced { Err(Fenced) } else { Ok(()) }
    }
}

/// A settlement's per-row vectors, empty between batches (their elements
/// borrow a batch's messages and plan).
#[derive(Default)]
struct SettleSpare {
    fates: Vec<Fate<Arc<Plugin>>>,
    answers: Vec<RowAnswer<'static>>,
}

impl Settler {
    pub(in crate::delivery) fn new(
        js: &jetstream::Context,
        router: Names,
        stream: String,
        settings: DeliveryConfig,
        metrics: Metrics,
        unit_labels: UnitLabels,
        redact: Vec<String>,
    ) -> Settler {
        Settler {
            client: js.client(),
            dead_letters: DeadLetters::new(js.clone(), router.clone()),
            router,
            stream,
            settings,
            metrics,
            unit_labels,
            summary: Summary::new(),
            order: OrderWatch::default(),
            redact,
            spare: SettleSpare::default(),
        }
    }

    /// The settings and redaction of a new generation, from its next batch.
    pub(in crate::delivery) fn adopt(&mut self, settings: DeliveryConfig, redact: Vec<String>) {
        self.settings = settings;
        self.redact = redact;
    }

    /// When the unit's INFO summary is to be said, if there is anything to say.
    pub(in crate::delivery) fn summary_due(&self) -> Option<Instant> {
        self.summary.due()
    }

    /// Says the unit's summary if it is due.
    pub(in crate::delivery) fn flush_summary(&mut self) {
        self.summary.flush(&self.unit_labels.unit, false);
    }

    /// Acks, naks or dead-letters each row (`deliveries`: each one's, as
    /// the intake read it). Dead letters are stored before
    /// their rows are acked; a row whose letter was not stored is retried.
    /// Nothing is stored or answered once `lease` no longer holds: the rows
    /// left are the next owner's. `record_acked`: the acked rows' sequences
    /// are returned.
    pub(in crate::delivery) async fn settle(
        &mut self,
        batch: &[Message],
        deliveries: &[Option<Delivery>],
        verdicts: &mut Vec<Verdict>,
        record_acked: bool,
        lease: &dyn Fence,
    ) -> Settled {
        if !lease.held() {
            return Settled {
                fenced: true,
                ..Settled::default()
            };
        }
        // Each per-row vector is the last batch's, reused.
        let spare = std::mem::take(&mut self.spare);
        let plan = SettlementPlan::new_in(
            spare.fates,
            verdicts.drain(..).map(Fate::from),
            deliveries,
            self.settings.max_deliveries,
            &mut self.order,
        );
        self.count_late(&plan.late);
        let stored = self.store_letters(&plan, batch, deliveries).await;
        let mut answers = recycle(spare.answers);
        plan.answers_into(&stored, self.settings.failure_delay, &mut answers);
        let settled = self
            .answer_all(batch, deliveries, &mut answers, record_acked, lease)
            .await;
        // The server says with every delivery how many rows are left after
        // it: the unit's backlog, without asking for the consumer's info.
        if let Some(Some(last)) = deliveries.last() {
            self.metrics
                .unit_pending_rows
                .get_or_create(&self.unit_labels)
                .set(i64::try_from(last.pending).unwrap_or(i64::MAX));
        }
        self.summary.flush(&self.unit_labels.unit, false);
        self.spare = SettleSpare {
            answers: recycle(answers),
            fates: recycle(plan.rows),
        };
        settled
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
        deliveries: &[Option<Delivery>],
    ) -> Vec<bool> {
        let letters = plan.letters().map(|(index, plugin, reason)| {
            let (message, delivery) = (&batch[index], deliveries[index].as_ref());
            let (tenant, table) = self
                .router
                .parse(message.subject.as_str())
                .unwrap_or((Cow::Borrowed("unknown"), Cow::Borrowed("unknown")));
            DeadLetter {
                tenant,
                table,
                reason,
                plugin: plugin.map(|p| (p.name(), p.version())),
                deliveries: delivery.map_or(1, |delivery| delivery.delivered),
                stream: if delivery.is_some() { &self.stream } else { "" },
                sequence: delivery.map_or(0, |delivery| delivery.sequence),
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
    /// fenced when it ran out (the rows after are left unanswered).
    async fn answer_all(
        &mut self,
        batch: &[Message],
        deliveries: &[Option<Delivery>],
        answers: &mut Vec<RowAnswer<'_>>,
        record_acked: bool,
        lease: &dyn Fence,
    ) -> Settled {
        let mut settled = Settled::default();
        let mut last_acked = None;
        let answers = answers.drain(..);
        let mut rows = WhileHeld::new(batch.iter().zip(deliveries).zip(answers), || lease.held());
        for ((message, delivery), answer) in rows.by_ref() {
            let acked = answer.acks();
            if !acked && let Some(delivery) = delivery {
                self.order.handed_back(delivery.sequence);
            }
            if answer == RowAnswer::Delivered {
                settled.delivered += 1;
            }
            self.count(message, delivery.as_ref(), &answer);
            let kind = match answer.reply() {
                AckReply::Ack => AckKind::Ack,
                AckReply::Nak(delay) => AckKind::Nak(Some(delay)),
            };
            match self.answer(message, kind).await {
                Ok(()) if acked => {
                    last_acked = Some(message);
                    if let Some(delivery) = delivery {
                        if record_acked {
                            settled.acked.push(delivery.sequence);
                        }
                        // A server clock ahead of this host's counts as 0.
                        let waited = SystemTime::now()
                            .duration_since(delivery.created)
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
        settled.last_ack = last_acked.and_then(|message: &Message| message.reply.clone());
        settled.fenced = rows.result().is_err();
        settled
    }

    /// Counts a row's answer (before it is sent) and logs it at DEBUG.
    fn count(&mut self, message: &Message, delivery: Option<&Delivery>, answer: &RowAnswer<'_>) {
        match *answer {
            RowAnswer::Delivered => {
                self.metrics.rows_delivered.inc();
            }
            RowAnswer::Dropped => {
                self.metrics.rows_dropped.inc();
            }
            RowAnswer::Unlettered { .. } => {
                self.metrics.rows_retried.inc();
            }
            RowAnswer::DeadLettered {
                plugin,
                reason,
                cause,
            } => self.dead_lettered(message, delivery, plugin, reason, cause.label()),
            RowAnswer::Retried {
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
                    sequence = delivery.map_or(0, |delivery| delivery.sequence),
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
        delivery: Option<&Delivery>,
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
            sequence = delivery.map_or(0, |delivery| delivery.sequence),
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
    pub(in crate::delivery) async fn confirm_applied(
        &self,
        last_ack: Option<async_nats::Subject>,
        within: Duration,
    ) {
        let consumer = self.unit_labels.unit.as_str();
        let Some(subject) = last_ack else {
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
    pub(in crate::delivery) fn stopped(&mut self) {
        self.summary.flush(&self.unit_labels.unit, true);
        self.metrics.unit_pending_rows.remove(&self.unit_labels);
    }
}

/// Repeats the ack sent last on `client` (`last_ack`, its subject) as a
/// request: the server answers once it applied every answer sent before
/// it. The outer error: no answer `within`.
pub(in crate::delivery) async fn confirm_acks(
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
