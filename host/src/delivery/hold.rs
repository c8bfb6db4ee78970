//! Batches between their run and their settlement. A batch whose state
//! writes are on their way (its run's [`Landing`](crate::state::landing::Landing))
//! is held here, unanswered, while the next batches run (its writes travel
//! meanwhile, for as long as they take: an object's writes land only when
//! it commits); it comes out once they landed, its rows whose write failed
//! turned into retries. Batches come out strictly in the order they ran (a
//! unit's rows are answered in order), so a batch behind one still held is
//! held too, whatever its own writes. What is held is bounded
//! ([`Hold::must_wait`]): past the bound the worker waits for the front.

use std::collections::VecDeque;

use async_nats::Message;
use tokio::time::Instant;

use crate::config::DeliveryConfig;
use crate::delivery::dispatch::Ran;
use crate::delivery::intake::Delivery;
use crate::delivery::verdict::Verdict;
use crate::topology::manifest::MAX_ACK_PENDING;

/// A batch that ran: its messages, one delivery each, and what its run
/// left for its settlement.
pub(super) struct RanBatch {
    pub messages: Vec<Message>,
    /// Each message's delivery, as the intake read it.
    pub deliveries: Vec<Option<Delivery>>,
    pub ran: Ran,
    pub began: Instant,
}

/// A batch's per-message vectors, emptied: a settled batch's, for the next.
#[derive(Default)]
pub(super) struct Vectors {
    pub messages: Vec<Message>,
    pub verdicts: Vec<Verdict>,
    pub deliveries: Vec<Option<Delivery>>,
}

/// The batches that ran and are not settled yet, oldest first, and the
/// emptied vectors of settled batches for the next ones.
#[derive(Default)]
pub(super) struct Hold {
    held: VecDeque<RanBatch>,
    /// The rows of the batches in `held`.
    rows: usize,
    spare: Vec<Vectors>,
}

/// Settled batches' vectors kept: one running, one just settled.
const SPARE_BATCHES: usize = 2;

/// At most this many batches held: at low load batches are a row or two,
/// and each held one is settled on its own (its acks, its landing's
/// channels), so rows alone would not bound the work a landing holds up.
pub(super) const MAX_HELD_BATCHES: usize = 256;

impl Hold {
    /// Empty vectors for the next batch: a settled batch's, or new ones.
    pub fn buffers(&mut self, rows: usize) -> Vectors {
        self.spare.pop().unwrap_or_else(|| Vectors {
            messages: Vec::with_capacity(rows),
            verdicts: Vec::with_capacity(rows),
            deliveries: Vec::with_capacity(rows),
        })
    }

    /// Takes back a settled batch's vectors.
    pub fn settled(&mut self, batch: RanBatch) {
        if self.spare.len() < SPARE_BATCHES {
            let mut vectors = Vectors {
                messages: batch.messages,
                verdicts: batch.ran.verdicts,
                deliveries: batch.deliveries,
            };
            vectors.messages.clear();
            vectors.verdicts.clear();
            vectors.deliveries.clear();
            self.spare.push(vectors);
        }
    }

    /// Every held row, oldest batch first (kept alive while they wait).
    pub fn held_messages(&self) -> impl Iterator<Item = &Message> + Clone {
        self.held.iter().flat_map(|batch| batch.messages.iter())
    }

    /// How many rows the held batches hold.
    pub fn held_rows(&self) -> usize {
        self.rows
    }

    pub fn is_holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// A batch just ran: it is held behind every batch before it (it comes
    /// out of [`Hold::landed`] in turn, at once if nothing is before it and
    /// its writes landed or it has none).
    pub fn ran(&mut self, batch: RanBatch) {
        self.rows += batch.messages.len();
        self.held.push_back(batch);
    }

    /// Whether the worker must wait for the front batch's writes
    /// ([`Hold::front_landed`]) before it goes on: without `overlap` (no
    /// next batch runs meanwhile: released) everything is waited for, and
    /// with it at most `max_held_rows` rows and [`MAX_HELD_BATCHES`]
    /// batches are held.
    pub fn must_wait(&self, overlap: bool, max_held_rows: usize) -> bool {
        self.is_holding()
            && (!overlap || self.rows > max_held_rows || self.held.len() > MAX_HELD_BATCHES)
    }

    /// Resolves once the front batch's writes landed (never, with nothing
    /// held). Cancel-safe: what landed is kept.
    pub async fn front_landed(&mut self) {
        match self.held.front_mut() {
            Some(front) => front.ran.landing.wait().await,
            None => std::future::pending().await,
        }
    }

    /// The front batch, if its writes landed (looked at, not waited for).
    pub async fn landed(&mut self) -> Option<RanBatch> {
        if !self.held.front_mut()?.ran.landing.is_landed() {
            return None;
        }
        let batch = self.held.pop_front()?;
        self.rows -= batch.messages.len();
        Some(land(batch).await)
    }
}

/// Rows the hold may keep while later batches run: a few pull requests'
/// worth, so a landing slower than a batch does not stall the unit, yet at
/// most half the consumer's max ack pending (past which the server sends
/// no more rows, and the held rows would only wait), and at least a batch
/// (one held batch, as before batches queued). A sink filling objects
/// holds its rows until their object commits: up to the max ack pending,
/// less two pulls in flight (past it, the worker seals its objects).
pub(super) fn max_held_rows(settings: &DeliveryConfig, fills_objects: bool) -> usize {
    let pull = settings.pull_rows.max(settings.batch_rows);
    if fills_objects {
        let max = MAX_ACK_PENDING as usize;
        return max
            .saturating_sub(pull.saturating_mul(2))
            .max(settings.batch_rows);
    }
    let max = (MAX_ACK_PENDING / 2) as usize;
    pull.saturating_mul(4).min(max).max(settings.batch_rows)
}

/// `batch`, whose state writes landed: a row whose write failed comes
/// back. (A row of a later batch run on a scope whose write failed is
/// sent back by that batch's own commit.)
async fn land(mut batch: RanBatch) -> RanBatch {
    // Landed already: this looks at the outcomes kept, it does not wait.
    let failed = std::mem::take(&mut batch.ran.landing).landed().await;
    if failed.is_empty() {
        return batch;
    }
    let verdicts = batch.deliveries.iter().zip(&mut batch.ran.verdicts);
    for (delivery, verdict) in verdicts {
        let Some(sequence) = delivery.map(|delivery| delivery.sequence) else {
            continue;
        };
        if let Some((_, reason)) = failed.iter().find(|(failed, _)| *failed == sequence) {
            verdict.retry_for_state(reason.clone());
        }
    }
    batch
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::state::landing::Landing;

    /// A batch of rows at `sequences`, its writes `landing`.
    fn batch(sequences: &[u64], landing: Landing) -> RanBatch {
        let message = |sequence: u64| Message {
            subject: format!("in.{sequence}").into(),
            reply: None,
            payload: Default::default(),
            headers: None,
            status: None,
            description: None,
            length: 0,
        };
        let delivery = |sequence| Delivery {
            sequence,
            delivered: 1,
            created: SystemTime::UNIX_EPOCH,
            pending: 0,
        };
        RanBatch {
            messages: sequences.iter().map(|&s| message(s)).collect(),
            deliveries: sequences.iter().map(|&s| Some(delivery(s))).collect(),
            ran: Ran {
                verdicts: sequences.iter().map(|_| Verdict::Done).collect(),
                calls: Vec::new(),
                landing,
                stateful: true,
            },
            began: Instant::now(),
        }
    }

    /// The first sequence of each batch that comes out now.
    async fn out(hold: &mut Hold) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some(batch) = hold.landed().await {
            out.push(batch.deliveries[0].map_or(0, |d| d.sequence));
        }
        out
    }

    #[tokio::test]
    async fn batches_behind_one_still_landing_wait_and_come_out_in_order() {
        let mut hold = Hold::default();
        let mut landing = Landing::default();
        let write = landing.add("a", "window", vec![1]);
        hold.ran(batch(&[1, 2], landing));
        hold.ran(batch(&[3], Landing::default()));
        let mut landed = Landing::default();
        landed.add("b", "window", vec![4]).send(None).unwrap();
        hold.ran(batch(&[4], landed));
        assert!(out(&mut hold).await.is_empty(), "all wait for the first");
        assert_eq!(hold.held_rows(), 4);
        assert_eq!(hold.held_messages().count(), 4);
        assert!(!hold.must_wait(true, 4), "within the bound: the next runs");
        assert!(hold.must_wait(true, 3), "past the bound: the worker waits");
        assert!(
            hold.must_wait(false, 100),
            "no overlap: everything is waited for"
        );
        let waited = tokio::time::timeout(Duration::from_millis(20), hold.front_landed()).await;
        assert!(waited.is_err(), "the first batch's write is on its way");
        let purged = Err(crate::state::store::StoreError::Purged { key: "a".into() });
        write
            .send(crate::state::landing::failure("window", &purged))
            .unwrap();
        hold.front_landed().await;
        let first = hold.landed().await.expect("the first batch landed");
        assert!(
            matches!(first.ran.verdicts[0], Verdict::Retry { .. }),
            "its write failed"
        );
        assert!(
            matches!(first.ran.verdicts[1], Verdict::Done),
            "row 2 had no write"
        );
        hold.settled(first);
        assert_eq!(out(&mut hold).await, [3, 4]);
        assert!(!hold.is_holding());
        assert_eq!(hold.held_rows(), 0);
        assert!(
            !hold.must_wait(false, 0),
            "nothing held: nothing to wait for"
        );
        assert!(
            hold.buffers(8).messages.is_empty(),
            "a settled batch's vectors, emptied"
        );
    }

    #[tokio::test]
    async fn a_batch_with_nothing_on_its_way_comes_out_at_once_unless_one_is_before_it() {
        let mut hold = Hold::default();
        hold.ran(batch(&[1], Landing::default()));
        assert_eq!(out(&mut hold).await, [1]);
        let mut landing = Landing::default();
        let _write = landing.add("a", "window", vec![2]);
        hold.ran(batch(&[2], landing));
        for sequence in 3..(2 + MAX_HELD_BATCHES as u64) {
            hold.ran(batch(&[sequence], Landing::default()));
            assert!(!hold.must_wait(true, usize::MAX));
        }
        hold.ran(batch(&[1000], Landing::default()));
        assert!(hold.must_wait(true, usize::MAX), "too many batches held");
        assert!(out(&mut hold).await.is_empty());
    }
}
