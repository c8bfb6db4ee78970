//! Delivery, the second half of a row's path: a [`worker`] per owned unit
//! [`pull`]s rows, packs them into a [`batch`], runs the table's
//! [`pipeline`] of plugins and settles every row: ack, nak with a delay, or
//! [`dead_letter`] then ack (`settle` plans it from the verdicts, `settler`
//! carries the plan out). A shadow's candidate runs off that path, on
//! copies ([`shadow`]).

//!
//! Exported: the batch a pipeline is given (`Batch`, `Position`, `Answer`,
//! `Outcome`), the pipeline runner and its verdicts (`PipelineRunner`,
//! `Verdict`, `RowOutcome`, `Stepped`, `StepFailure`, `RunError`,
//! `Observer`), the dead letters (`DeadLetters`, `LetterFilter`,
//! `StoredLetter`, `parse_since`, `SinceError`, their `headers`), the
//! `Workers` a host runs and the `Shadows` they feed, and [`isolation`] (a failing row found by
//! halving) as a module: its `run` and `Rows` are named through it.

pub(crate) mod batch;
pub(crate) mod dead_letter;
pub mod isolation;
mod pipeline;
mod pull;
mod run;
mod settle;
mod shadow;
mod settler;
mod traced;
mod verdict;
pub(crate) mod worker;

pub use batch::{Answer, Batch, Outcome, Position};
pub use dead_letter::{
    DeadLetters, LetterFilter, Replayed, SinceError, StoredLetter, headers, parse_since,
};
pub use pipeline::{Observer, PipelineRunner, RowOutcome, RunError, StepFailure, Stepped, Verdict};
pub use shadow::{QUEUE_BATCHES as SHADOW_QUEUE_BATCHES, Shadows};
pub use worker::Workers;

/// `vector` emptied, as a vector of `U`: a per-batch vector kept from one
/// batch to the next although its elements borrow each batch (`T` and `U`
/// differ only in a lifetime). Collecting a vector's own iterator into a
/// vector of the same layout reuses its allocation.
fn recycle<T, U>(mut vector: Vec<T>) -> Vec<U> {
    vector.clear();
    vector.into_iter().filter_map(|_| None::<U>).collect()
}
