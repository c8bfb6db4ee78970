//! Batches between their run and their settlement. A batch whose state
//! writes are on their way (its run's [`Landing`](crate::state::landing::Landing)) is held here,
//! unanswered, while the next batch runs (its writes travel meanwhile); it
//! comes out once they landed, its rows whose write failed turned into
//! retries. Batches come out in the order they ran: a unit's rows are
//! answered in order.

use async_nats::Message;
use tokio::time::Instant;

use crate::delivery::dispatch::Ran;
use crate::delivery::intake::Delivery;
use crate::delivery::verdict::Verdict;

/// A batch that ran: its messages, one delivery each, and what its run
/// left for its settlement.
pub(super) struct RanBatch {
    pub messages: Vec<Message>,
    /// Each message's delivery, as the intake read it.
    pub deliveries: Vec<Option<Delivery>>,
    pub ran: Ran,
    pub began: Instant,
}

/// The batches ready to settle, in order: the one held before, if its
/// writes landed, then the one that just ran, unless it is held now.
pub(super) struct Landed([Option<RanBatch>; 2]);

impl IntoIterator for Landed {
    type Item = RanBatch;
    type IntoIter = std::iter::Flatten<std::array::IntoIter<Option<RanBatch>, 2>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter().flatten()
    }
}

/// A batch's per-message vectors, emptied: a settled batch's, for the next.
#[derive(Default)]
pub(super) struct Vectors {
    pub messages: Vec<Message>,
    pub verdicts: Vec<Verdict>,
    pub deliveries: Vec<Option<Delivery>>,
}

/// At most one batch whose state writes are on their way, and the emptied
/// vectors of settled batches for the next ones.
#[derive(Default)]
pub(super) struct Hold {
    held: Option<RanBatch>,
    spare: Vec<Vectors>,
}

/// Settled batches' vectors kept: one running, one held.
const SPARE_BATCHES: usize = 2;

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

    /// The rows of the batch held, if any (kept alive while the next runs).
    pub fn held_rows(&self) -> &[Message] {
        self.held.as_ref().map_or(&[], |held| &held.messages)
    }

    pub fn is_holding(&self) -> bool {
        self.held.is_some()
    }

    /// A batch just ran: the batches now ready. The batch held before comes
    /// out once its writes landed; `ran` is held in turn if its own writes
    /// are on their way and `overlap` (a next batch may run meanwhile),
    /// else its writes are waited for here.
    pub async fn ran(&mut self, mut ran: RanBatch, overlap: bool) -> Landed {
        let earlier = match self.held.take() {
            Some(held) => Some(land(held).await),
            None => None,
        };
        if !ran.ran.landing.is_empty() {
            if overlap {
                self.held = Some(ran);
                return Landed([earlier, None]);
            }
            ran = land(ran).await;
        }
        Landed([earlier, Some(ran)])
    }

    /// The batch held, once its writes landed: before the worker waits for
    /// rows, or runs a batch on another generation.
    pub async fn release(&mut self) -> Option<RanBatch> {
        Some(land(self.held.take()?).await)
    }
}

/// `batch` once its state writes landed: a row whose write failed comes
/// back. (A row of a later batch run on a scope whose write failed is
/// sent back by that batch's own commit.)
async fn land(mut batch: RanBatch) -> RanBatch {
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
