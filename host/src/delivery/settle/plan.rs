//! The settlement of a batch, planned from its verdicts before anything is
//! stored or answered: what each row gets (ack, nak with a delay, or a dead
//! letter then an ack), which retries are given up on, which rows came back
//! out of order, and where fencing cuts the answers short. Pure (no NATS,
//! no clock, no message), so every case is unit-tested here; `apply`
//! carries a plan out.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::delivery::intake::Delivery;
use crate::delivery::verdict::Verdict;
use crate::fence::Fenced;
use crate::sandbox::Plugin;

/// What settlement needs of the plugin a verdict names: its name (metrics,
/// logs) and its version (the dead letter).
pub trait Named {
    fn name(&self) -> &str;
    fn version(&self) -> &str;
}

impl Named for Arc<Plugin> {
    fn name(&self) -> &str {
        Plugin::name(self)
    }

    fn version(&self) -> &str {
        &self.version
    }
}

/// Why a row is dead-lettered: the `cause` label of its metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// A plugin said so.
    Verdict,
    /// No plugin could take the row (no delivery info, no row's subject, no
    /// pipeline for its table).
    Undeliverable,
    /// Its retries ran out at `max_deliveries`.
    Retries,
}

impl Cause {
    pub fn label(self) -> &'static str {
        match self {
            Cause::Verdict => "verdict",
            Cause::Undeliverable => "undeliverable",
            Cause::Retries => "retries",
        }
    }
}

/// What becomes of one row of a batch.
#[derive(Debug, PartialEq)]
pub enum Fate<P> {
    /// Its pipeline is done with it (every descendant delivered or dropped): ack.
    Ack,
    /// A transform dropped it (and every row it became): ack.
    Dropped,
    /// Nak: delivered again after `delay`; `plugin` asked for it or failed.
    Retry {
        delay: Duration,
        plugin: Option<P>,
        reason: String,
    },
    /// Its dead letter is stored first, then it is acked; a row whose letter
    /// was not stored is retried instead.
    DeadLetter {
        plugin: Option<P>,
        reason: String,
        cause: Cause,
    },
}

impl From<Verdict> for Fate<Arc<Plugin>> {
    fn from(verdict: Verdict) -> Self {
        match verdict {
            Verdict::Done => Fate::Ack,
            Verdict::Dropped => Fate::Dropped,
            Verdict::Retry {
                delay,
                plugin,
                reason,
            } => Fate::Retry {
                delay,
                plugin,
                reason,
            },
            Verdict::DeadLetter { plugin, reason } => Fate::DeadLetter {
                cause: match plugin {
                    Some(_) => Cause::Verdict,
                    None => Cause::Undeliverable,
                },
                plugin,
                reason,
            },
        }
    }
}

/// Rows that came back behind newer rows of their unit, unasked.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Late {
    pub rows: u64,
    /// The first of them: its sequence, its deliveries, and the highest
    /// sequence received before it.
    pub first: Option<(u64, i64, u64)>,
}

/// A batch's settlement: each row's fate, in batch order, and the rows that
/// came back out of order.
#[derive(Debug, PartialEq)]
pub struct SettlementPlan<P> {
    pub rows: Vec<Fate<P>>,
    pub late: Late,
}

impl<P: Named> SettlementPlan<P> {
    /// Plans a batch from its verdicts and deliveries (one each per row):
    /// a retry of a row delivered `max_deliveries` times becomes a dead
    /// letter naming the same plugin. Takes every row into `order`.
    #[cfg(test)]
    pub fn new<V: Into<Fate<P>>>(
        verdicts: impl IntoIterator<Item = V>,
        deliveries: &[Option<Delivery>],
        max_deliveries: u32,
        order: &mut OrderWatch,
    ) -> SettlementPlan<P> {
        SettlementPlan::new_in(Vec::new(), verdicts, deliveries, max_deliveries, order)
    }

    /// [`Self::new`], its fates kept in `rows` (emptied first): the last
    /// batch's vector, reused.
    pub fn new_in<V: Into<Fate<P>>>(
        mut rows: Vec<Fate<P>>,
        verdicts: impl IntoIterator<Item = V>,
        deliveries: &[Option<Delivery>],
        max_deliveries: u32,
        order: &mut OrderWatch,
    ) -> SettlementPlan<P> {
        let mut late = Late::default();
        for delivery in deliveries.iter().flatten() {
            let highest = order.highest;
            if order.received(delivery.sequence, delivery.delivered) {
                late.rows += 1;
                late.first
                    .get_or_insert((delivery.sequence, delivery.delivered, highest));
            }
        }
        rows.clear();
        rows.extend(
            verdicts
                .into_iter()
                .zip(deliveries)
                .map(|(verdict, delivery)| {
                    // A message that is no JetStream delivery counts as a first.
                    let delivered = delivery.map_or(1, |delivery| delivery.delivered);
                    give_up(verdict.into(), delivered, max_deliveries)
                }),
        );
        SettlementPlan { rows, late }
    }

    /// The rows whose dead letters are stored before any row is answered:
    /// index, plugin and reason, in batch order.
    pub fn letters(&self) -> impl Iterator<Item = (usize, Option<&P>, &str)> {
        self.rows
            .iter()
            .enumerate()
            .filter_map(|(index, fate)| match fate {
                Fate::DeadLetter { plugin, reason, .. } => {
                    Some((index, plugin.as_ref(), reason.as_str()))
                }
                _ => None,
            })
    }

    /// Each row's answer, in batch order, once the letters were sent:
    /// `stored` says of each of [`Self::letters`], in order, whether it was
    /// stored. A row whose letter was not (or of which nothing is said) is
    /// retried after `failure_delay`.
    #[cfg(test)]
    pub fn answers(&self, stored: &[bool], failure_delay: Duration) -> Vec<RowAnswer<'_>> {
        let mut answers = Vec::with_capacity(self.rows.len());
        self.answers_into(stored, failure_delay, &mut answers);
        answers
    }

    /// [`Self::answers`], appended to `answers` (a reused vector).
    pub fn answers_into<'a>(
        &'a self,
        stored: &[bool],
        failure_delay: Duration,
        answers: &mut Vec<RowAnswer<'a>>,
    ) {
        let mut stored = stored.iter();
        answers.extend(self.rows.iter().map(|fate| match fate {
            Fate::Ack => RowAnswer::Delivered,
            Fate::Dropped => RowAnswer::Dropped,
            Fate::Retry {
                delay,
                plugin,
                reason,
            } => RowAnswer::Retried {
                delay: *delay,
                plugin: plugin.as_ref().map(Named::name),
                reason,
            },
            Fate::DeadLetter {
                plugin,
                reason,
                cause,
            } => match stored.next() {
                Some(true) => RowAnswer::DeadLettered {
                    plugin: plugin.as_ref().map(Named::name),
                    reason,
                    cause: *cause,
                },
                _ => RowAnswer::Unlettered {
                    delay: failure_delay,
                },
            },
        }));
    }
}

/// A retry past the last delivery is given up on: dead-lettered with the
/// reason it was retried for.
fn give_up<P>(fate: Fate<P>, delivered: i64, max_deliveries: u32) -> Fate<P> {
    match fate {
        Fate::Retry { plugin, reason, .. } if delivered >= i64::from(max_deliveries) => {
            Fate::DeadLetter {
                plugin,
                reason: format!("gave up after {delivered} deliveries: {reason}"),
                cause: Cause::Retries,
            }
        }
        fate => fate,
    }
}

/// How a row is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckReply {
    Ack,
    Nak(Duration),
}

/// What is done for a row once the letters were sent: its answer, and what
/// it is counted and logged as.
#[derive(Debug, PartialEq, Eq)]
pub enum RowAnswer<'a> {
    /// Acked: its pipeline is done with it.
    Delivered,
    /// Acked: a transform dropped it.
    Dropped,
    /// Acked: its dead letter is stored.
    DeadLettered {
        plugin: Option<&'a str>,
        reason: &'a str,
        cause: Cause,
    },
    /// Nakked as its verdict asked.
    Retried {
        delay: Duration,
        plugin: Option<&'a str>,
        reason: &'a str,
    },
    /// Nakked: its dead letter could not be stored.
    Unlettered { delay: Duration },
}

impl RowAnswer<'_> {
    pub fn reply(&self) -> AckReply {
        match self {
            RowAnswer::Delivered | RowAnswer::Dropped | RowAnswer::DeadLettered { .. } => {
                AckReply::Ack
            }
            RowAnswer::Retried { delay, .. } | RowAnswer::Unlettered { delay } => {
                AckReply::Nak(*delay)
            }
        }
    }

    /// Whether the row leaves the unit (an ack), rather than coming back.
    pub fn acks(&self) -> bool {
        self.reply() == AckReply::Ack
    }
}

/// A batch's answers, each given only if the lease still holds right before
/// it (a clock read, against answering after a freeze): once it does not,
/// no further row is answered.
pub struct WhileHeld<I, F> {
    answers: I,
    held: F,
    fenced: bool,
}

impl<I: Iterator, F: FnMut() -> bool> WhileHeld<I, F> {
    pub fn new(answers: I, held: F) -> WhileHeld<I, F> {
        WhileHeld {
            answers,
            held,
            fenced: false,
        }
    }

    /// `Err` if the lease ran out before a row was answered.
    pub fn result(&self) -> Result<(), Fenced> {
        if self.fenced { Err(Fenced) } else { Ok(()) }
    }
}

impl<I: Iterator, F: FnMut() -> bool> Iterator for WhileHeld<I, F> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        if self.fenced {
            return None;
        }
        // Checked only when there is a row to answer: a batch answered whole
        // is not fenced.
        let next = self.answers.next()?;
        if (self.held)() {
            Some(next)
        } else {
            self.fenced = true;
            None
        }
    }
}

/// Rows handed back for a retry remembered at most: past it the set is
/// forgotten, and a retried row may be counted as out of order once.
const HANDED_BACK_LIMIT: usize = 65_536;

/// Notices rows redelivered behind newer rows of their unit that were not
/// retries this worker asked for (`weir_rows_out_of_order_total`): what a
/// pull request lost with a NATS node costs the order of a table.
#[derive(Default)]
pub struct OrderWatch {
    /// The highest stream sequence received.
    highest: u64,
    /// Rows this worker nakked and has not received again.
    handed_back: HashSet<u64>,
}

impl OrderWatch {
    /// Whether a row is out of order; takes it into the watch.
    fn received(&mut self, sequence: u64, delivered: i64) -> bool {
        let late = delivered > 1 && sequence < self.highest && !self.handed_back.remove(&sequence);
        self.highest = self.highest.max(sequence);
        late
    }

    pub fn handed_back(&mut self, sequence: u64) {
        if self.handed_back.len() >= HANDED_BACK_LIMIT {
            self.handed_back.clear();
        }
        self.handed_back.insert(sequence);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX_DELIVERIES: u32 = 5;
    const FAILURE_DELAY: Duration = Duration::from_millis(250);

    /// A plugin as the plan sees it (a real one needs a compiled component).
    #[derive(Debug, PartialEq)]
    struct TestPlugin(&'static str);

    impl Named for TestPlugin {
        fn name(&self) -> &str {
            self.0
        }

        fn version(&self) -> &str {
            "v1"
        }
    }

    fn delivery(sequence: u64, delivered: i64) -> Option<Delivery> {
        Some(Delivery {
            sequence,
            delivered,
            created: std::time::SystemTime::UNIX_EPOCH,
            pending: 0,
        })
    }

    /// Rows 1, 2, … delivered as often as `delivered` says, planned with a
    /// fresh order watch.
    fn plan<P: Named, V: Into<Fate<P>>>(verdicts: Vec<V>, delivered: &[i64]) -> SettlementPlan<P> {
        let deliveries: Vec<Option<Delivery>> = (1..)
            .zip(delivered)
            .map(|(sequence, &delivered)| delivery(sequence, delivered))
            .collect();
        let mut order = OrderWatch::default();
        SettlementPlan::new(verdicts, &deliveries, MAX_DELIVERIES, &mut order)
    }

    fn retry(delay_ms: u64, plugin: &'static str) -> Fate<TestPlugin> {
        Fate::Retry {
            delay: Duration::from_millis(delay_ms),
            plugin: Some(TestPlugin(plugin)),
            reason: format!("`{plugin}` failed"),
        }
    }

    #[test]
    fn a_row_done_is_acked_and_stores_no_letter() {
        let plan: SettlementPlan<Arc<Plugin>> = plan(vec![Verdict::Done], &[1]);
        assert!(matches!(plan.rows[..], [Fate::Ack]), "{plan:?}");
        assert_eq!(plan.letters().count(), 0);
        let answers = plan.answers(&[], FAILURE_DELAY);
        assert_eq!(answers, [RowAnswer::Delivered]);
        assert_eq!(answers[0].reply(), AckReply::Ack);
        assert!(answers[0].acks());
        assert_eq!(plan.late, Late::default());
    }

    #[test]
    fn a_row_that_emitted_rows_is_acked_once_its_descendants_were_delivered() {
        // The pipeline folds an `emit` (its descendants delivered by the
        // steps after) into the input row's `Done`: one ack for the input,
        // nothing to answer for the descendants, which are no messages.
        let plan: SettlementPlan<TestPlugin> = plan(vec![Fate::Ack, Fate::Ack], &[1, 3]);
        assert_eq!(plan.rows, [Fate::Ack, Fate::Ack]);
        assert_eq!(
            plan.answers(&[], FAILURE_DELAY),
            [RowAnswer::Delivered, RowAnswer::Delivered]
        );
    }

    #[test]
    fn a_retry_is_nakked_with_its_delay_naming_its_plugin() {
        // Delivered once short of the last delivery: still a retry, with
        // the (capped) backoff the failed call was given.
        let plan = plan(
            vec![retry(1_600, "enrich")],
            &[i64::from(MAX_DELIVERIES) - 1],
        );
        assert_eq!(plan.rows, [retry(1_600, "enrich")]);
        assert_eq!(plan.letters().count(), 0);
        let answers = plan.answers(&[], FAILURE_DELAY);
        assert_eq!(
            answers,
            [RowAnswer::Retried {
                delay: Duration::from_millis(1_600),
                plugin: Some("enrich"),
                reason: "`enrich` failed",
            }]
        );
        assert_eq!(
            answers[0].reply(),
            AckReply::Nak(Duration::from_millis(1_600))
        );
        assert!(!answers[0].acks());
    }

    #[test]
    fn a_verdicts_retry_keeps_its_delay_plugin_and_reason() {
        let verdict = Verdict::Retry {
            delay: Duration::from_secs(3),
            plugin: None,
            reason: "sink `s` asked for a retry".into(),
        };
        let plan: SettlementPlan<Arc<Plugin>> = plan(vec![verdict], &[1]);
        assert_eq!(
            plan.answers(&[], FAILURE_DELAY),
            [RowAnswer::Retried {
                delay: Duration::from_secs(3),
                plugin: None,
                reason: "sink `s` asked for a retry",
            }]
        );
    }

    #[test]
    fn a_retry_at_the_last_delivery_is_given_up_on_as_a_dead_letter() {
        let plan = plan(
            vec![retry(1_600, "enrich"), retry(10, "enrich")],
            &[i64::from(MAX_DELIVERIES), 9],
        );
        let gave_up = |deliveries: i64| Fate::DeadLetter {
            plugin: Some(TestPlugin("enrich")),
            reason: format!("gave up after {deliveries} deliveries: `enrich` failed"),
            cause: Cause::Retries,
        };
        assert_eq!(plan.rows, [gave_up(5), gave_up(9)]);
        let letters: Vec<_> = plan.letters().collect();
        assert_eq!(
            letters,
            [
                (
                    0,
                    Some(&TestPlugin("enrich")),
                    "gave up after 5 deliveries: `enrich` failed"
                ),
                (
                    1,
                    Some(&TestPlugin("enrich")),
                    "gave up after 9 deliveries: `enrich` failed"
                ),
            ]
        );
        // Acked once its letter is stored; retried after the failure delay
        // (not its own) when it is not.
        assert_eq!(
            plan.answers(&[true, false], FAILURE_DELAY),
            [
                RowAnswer::DeadLettered {
                    plugin: Some("enrich"),
                    reason: "gave up after 5 deliveries: `enrich` failed",
                    cause: Cause::Retries,
                },
                RowAnswer::Unlettered {
                    delay: FAILURE_DELAY
                },
            ]
        );
        assert_eq!(Cause::Retries.label(), "retries");
    }

    #[test]
    fn a_dead_letter_is_stored_then_acked_or_else_retried() {
        let lettered = Fate::DeadLetter {
            plugin: Some(TestPlugin("validate")),
            reason: "no id".to_string(),
            cause: Cause::Verdict,
        };
        // Past the last delivery too: a dead letter stays what it is.
        let plan = plan(vec![lettered], &[i64::from(MAX_DELIVERIES) + 1]);
        assert_eq!(
            plan.rows,
            [Fate::DeadLetter {
                plugin: Some(TestPlugin("validate")),
                reason: "no id".to_string(),
                cause: Cause::Verdict,
            }]
        );
        assert_eq!(
            plan.letters().collect::<Vec<_>>(),
            [(0, Some(&TestPlugin("validate")), "no id")]
        );
        let stored = plan.answers(&[true], FAILURE_DELAY);
        assert_eq!(
            stored,
            [RowAnswer::DeadLettered {
                plugin: Some("validate"),
                reason: "no id",
                cause: Cause::Verdict,
            }]
        );
        assert_eq!(stored[0].reply(), AckReply::Ack);
        let lost = plan.answers(&[false], FAILURE_DELAY);
        assert_eq!(
            lost,
            [RowAnswer::Unlettered {
                delay: FAILURE_DELAY
            }]
        );
        assert_eq!(lost[0].reply(), AckReply::Nak(FAILURE_DELAY));
        // Nothing said of a letter: not acked.
        assert_eq!(plan.answers(&[], FAILURE_DELAY), lost);
        assert_eq!(Cause::Verdict.label(), "verdict");
    }

    #[test]
    fn a_row_no_plugin_could_take_is_dead_lettered_as_undeliverable() {
        let verdict = Verdict::DeadLetter {
            plugin: None,
            reason: "no pipeline takes table `t`".into(),
        };
        let plan: SettlementPlan<Arc<Plugin>> = plan(vec![verdict], &[1]);
        assert!(
            matches!(&plan.rows[..], [Fate::DeadLetter { plugin: None, cause: Cause::Undeliverable, reason }] if reason == "no pipeline takes table `t`"),
            "{plan:?}"
        );
        assert_eq!(
            plan.answers(&[true], FAILURE_DELAY),
            [RowAnswer::DeadLettered {
                plugin: None,
                reason: "no pipeline takes table `t`",
                cause: Cause::Undeliverable,
            }]
        );
        assert_eq!(Cause::Undeliverable.label(), "undeliverable");
    }

    #[test]
    fn a_mixed_batch_gets_one_answer_per_row_in_batch_order() {
        let plan = plan(
            vec![
                Fate::Ack,
                retry(200, "enrich"),
                retry(200, "enrich"),
                Fate::DeadLetter {
                    plugin: Some(TestPlugin("validate")),
                    reason: "no id".into(),
                    cause: Cause::Verdict,
                },
                Fate::DeadLetter {
                    plugin: None,
                    reason: "not a row".into(),
                    cause: Cause::Undeliverable,
                },
                Fate::Ack,
            ],
            &[1, 1, 5, 2, 1, 1],
        );
        let letters: Vec<usize> = plan.letters().map(|(index, _, _)| index).collect();
        assert_eq!(letters, [2, 3, 4]);
        let answers = plan.answers(&[true, false, true], FAILURE_DELAY);
        assert_eq!(
            answers,
            [
                RowAnswer::Delivered,
                RowAnswer::Retried {
                    delay: Duration::from_millis(200),
                    plugin: Some("enrich"),
                    reason: "`enrich` failed",
                },
                RowAnswer::DeadLettered {
                    plugin: Some("enrich"),
                    reason: "gave up after 5 deliveries: `enrich` failed",
                    cause: Cause::Retries,
                },
                RowAnswer::Unlettered {
                    delay: FAILURE_DELAY
                },
                RowAnswer::DeadLettered {
                    plugin: None,
                    reason: "not a row",
                    cause: Cause::Undeliverable,
                },
                RowAnswer::Delivered,
            ]
        );
        let acked: Vec<bool> = answers.iter().map(RowAnswer::acks).collect();
        assert_eq!(acked, [true, false, true, false, true, true]);
    }

    #[test]
    fn fenced_before_the_first_answer_nothing_is_answered() {
        let plan = plan(vec![Fate::Ack, retry(200, "enrich")], &[1, 1]);
        let mut fence = WhileHeld::new(plan.answers(&[], FAILURE_DELAY).into_iter(), || false);
        assert_eq!(fence.next(), None);
        assert_eq!(fence.next(), None, "stays fenced");
        assert_eq!(fence.result(), Err(Fenced));
    }

    #[test]
    fn fenced_mid_batch_the_rows_after_are_left_unanswered() {
        let plan: SettlementPlan<TestPlugin> =
            plan(vec![Fate::Ack, Fate::Ack, Fate::Ack], &[1, 1, 1]);
        let mut checks = 0;
        let mut fence = WhileHeld::new(plan.answers(&[], FAILURE_DELAY).into_iter(), || {
            checks += 1;
            checks <= 2
        });
        let answered: Vec<RowAnswer<'_>> = fence.by_ref().collect();
        assert_eq!(answered, [RowAnswer::Delivered, RowAnswer::Delivered]);
        assert_eq!(fence.result(), Err(Fenced));
    }

    #[test]
    fn a_batch_answered_whole_is_not_fenced() {
        let plan: SettlementPlan<TestPlugin> = plan(vec![Fate::Ack, Fate::Ack], &[1, 1]);
        let mut checks = 0;
        let mut fence = WhileHeld::new(plan.answers(&[], FAILURE_DELAY).into_iter(), || {
            checks += 1;
            true
        });
        assert_eq!(fence.by_ref().count(), 2);
        assert_eq!(fence.result(), Ok(()));
        drop(fence);
        assert_eq!(
            checks, 2,
            "the lease is read once per row, not after the last"
        );
        let mut empty = WhileHeld::new(std::iter::empty::<()>(), || false);
        assert_eq!(empty.next(), None);
        assert_eq!(empty.result(), Ok(()), "no row, nothing fenced");
    }

    #[test]
    fn the_plan_counts_rows_back_behind_newer_ones_unasked() {
        let mut order = OrderWatch::default();
        let first: SettlementPlan<TestPlugin> = SettlementPlan::new(
            vec![Fate::Ack, retry(10, "enrich")],
            &[delivery(10, 1), delivery(11, 1)],
            MAX_DELIVERIES,
            &mut order,
        );
        assert_eq!(first.late, Late::default());
        order.handed_back(11);
        let no_info = None;
        let second: SettlementPlan<TestPlugin> = SettlementPlan::new(
            vec![Fate::Ack, Fate::Ack, Fate::Ack, Fate::Ack, Fate::Ack],
            &[
                delivery(12, 1),
                delivery(11, 2),
                delivery(8, 2),
                delivery(9, 3),
                no_info,
            ],
            MAX_DELIVERIES,
            &mut order,
        );
        assert_eq!(
            second.late,
            Late {
                rows: 2,
                first: Some((8, 2, 12)),
            }
        );
    }

    #[test]
    fn only_rows_redelivered_behind_newer_ones_unasked_are_out_of_order() {
        let mut order = OrderWatch::default();
        assert!(!order.received(10, 1));
        assert!(!order.received(11, 1));
        // A retry this worker asked for comes back behind newer rows: expected.
        order.handed_back(10);
        assert!(!order.received(12, 1));
        assert!(!order.received(10, 2));
        // A row lost in flight comes back after the ack wait: out of order.
        assert!(order.received(9, 2));
        // A redelivery at the front (after a takeover's reset) is in order.
        let mut fresh = OrderWatch::default();
        assert!(!fresh.received(5, 3));
        assert!(!fresh.received(6, 2));
    }
}
