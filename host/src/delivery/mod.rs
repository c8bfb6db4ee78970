//! Delivery, the second half of a row's path. A [`worker`] per owned unit
//! moves each batch one way, every stage taking the last one's output:
//!
//! ```text
//! pull       Puller::next_until            → Vec<Message>
//! intake     Intake::of(&[Message])        → Intake (decoded once, grouped, packed),
//!                                            and each message's Delivery (its ack subject)
//! dispatch   dispatch(&Intake)             → Ran (a verdict per row, calls, state Landing)
//!              isolation::run(&Batch)      → Vec<RowVerdict>   (per group)
//!                PipelineRunner::run_on    → Vec<Verdict>      (pipeline/)
//! hold       Hold::ran(RanBatch)           → held, in the order it ran
//!            Hold::landed()                → RanBatch (the oldest, once its Landing landed)
//! settle     Settler::settle(..)           → Settled (settle/)
//! ```
//!
//! Batches held for their landings are bounded ([`hold`]); their rows, a
//! running batch's and those received for the next are kept alive
//! ([`progress`]).
//!
//! A shadow's candidate runs off that path, on copies ([`shadow`]).
//!
//! Exported: the batch a pipeline is given (`Batch`, `Position`, `Answer`,
//! `Outcome`), the pipeline runner and its verdicts (`PipelineRunner`,
//! `Verdict`, `RowOutcome`, `Stepped`, `StepFailure`, `RunError`,
//! `Observer`), the dead letters (`DeadLetters`, `LetterFilter`,
//! `StoredLetter`, `parse_since`, `SinceError`, their `headers`), the
//! `Workers` a host runs and the `Shadows` they feed, and [`isolation`]
//! (the rows that fail their call found alone) as a module.

pub(crate) mod batch;
mod dispatch;
pub(crate) mod dlq;
mod hold;
mod intake;
pub mod isolation;
mod pipeline;
mod progress;
mod pull;
mod runners;
mod settle;
mod shadow;
mod traced;
mod verdict;
pub(crate) mod worker;

pub use batch::{Answer, Batch, Outcome, Position};
pub use dlq::{
    DeadLetters, LetterFilter, Replayed, SinceError, StoredLetter, headers, parse_since,
};
pub use pipeline::{Observer, PipelineRunner, RowOutcome, RunError, StepFailure, Stepped};
pub use shadow::{QUEUE_BATCHES as SHADOW_QUEUE_BATCHES, Shadows};
pub use verdict::Verdict;
pub use worker::Workers;

/// `vector` emptied, as a vector of `U`: a per-batch vector kept from one
/// batch to the next although its elements borrow each batch (`T` and `U`
/// differ only in a lifetime). Collecting a vector's own iterator into a
/// vector of the same layout reuses its allocation.
fn recycle<T, U>(mut vector: Vec<T>) -> Vec<U> {
    vector.clear();
    vector.into_iter().filter_map(|_| None::<U>).collect()
}
