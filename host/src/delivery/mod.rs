//! Delivery, the second half of a row's path: a [`worker`] per owned unit
//! [`pull`]s rows, packs them into a [`batch`], runs the table's
//! [`pipeline`] of plugins and settles every row: ack, nak with a delay, or
//! [`dead_letter`] then ack (`settle` plans it from the verdicts, `settler`
//! carries the plan out).

pub mod batch;
pub mod dead_letter;
pub mod isolation;
pub mod pipeline;
pub mod pull;
mod settle;
mod settler;
pub mod worker;
