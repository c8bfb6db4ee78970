//! Batches between their run and their settlement. A batch whose state
//! writes are on their way is held here, unanswered, while the next batch
//! runs (its writes travel meanwhile); it comes out once they landed, its
//! rows whose write failed turned into retries (and so are those of the
//! batch run since, whose calls saw the same scopes). Batches come out in
//! the order they ran: a unit's rows are answered in order.

use async_nats::Message;
use tokio::time::Instant;

use crate::delivery::intake::Delivery;
use crate::delivery::runners::Runners;
use crate::delivery::traced::CallRecord;
use crate::delivery::verdict::Verdict;

/// A batch that ran: its messages, one verdict and one delivery each, and
/// what its settlement needs of the run.
pub(super) struct RanBatch {
    pub messages: Vec<Message>,
    pub verdicts: Vec<Verdict>,
    /// Each message's delivery, as the intake read it.
    pub deliveries: Vec<Option<Delivery>>,
    /// The number that tags its state writes.
    pub number: u64,
    pub began: Instant,
    /// Its plugin calls on rows of traced requests.
    pub calls: Vec<CallRecord>,
    /// Whether a pipeline of it keeps state (its acks are recorded).
    pub stateful: bool,
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
    /// Rows whose state write failed (stream sequences, with why), kept
    /// for the next landing.
    failed: Vec<(u64, String)>,
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
                verdicts: batch.verdicts,
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
    pub async fn ran(&mut self, mut ran: RanBatch, runners: &mut Runners, overlap: bool) -> Landed {
        let earlier = match self.held.take() {
            Some(mut held) => {
                self.land(runners, &mut held, Some(&mut ran)).await;
                Some(held)
            }
            None => None,
        };
        if runners.state_pending(ran.number) {
            if overlap {
                self.held = Some(ran);
                return Landed([earlier, None]);
            }
            self.land(runners, &mut ran, None).await;
        }
        Landed([earlier, Some(ran)])
    }

    /// The batch held, once its writes landed: before the worker waits for
    /// rows, or runs a batch on another generation.
    pub async fn release(&mut self, runners: &mut Runners) -> Option<RanBatch> {
        let mut held = self.held.take()?;
        self.land(runners, &mut held, None).await;
        Some(held)
    }

    /// Waits for the writes of `batch` and before; a row whose write failed
    /// comes back, in `batch` or in `after` (run since).
    async fn land(
        &mut self,
        runners: &mut Runners,
        batch: &mut RanBatch,
        after: Option<&mut RanBatch>,
    ) {
        runners.land_state(batch.number, &mut self.failed).await;
        if self.failed.is_empty() {
            return;
        }
        retry_failed(batch, &self.failed);
        if let Some(after) = after {
            retry_failed(after, &self.failed);
        }
        self.failed.clear();
    }
}

/// Rows of `batch` among `failed` (stream sequences whose state write
/// failed, with why) come back.
fn retry_failed(batch: &mut RanBatch, failed: &[(u64, String)]) {
    for (delivery, verdict) in batch.deliveries.iter().zip(&mut batch.verdicts) {
        let Some(sequence) = delivery.map(|delivery| delivery.sequence) else {
            continue;
        };
        if let Some((_, reason)) = failed.iter().find(|(failed, _)| *failed == sequence) {
            verdict.retry_for_state(reason.clone());
        }
    }
}
