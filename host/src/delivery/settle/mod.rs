//! Settlement: what becomes of each row of a batch once its pipeline ran.
//!
//! - [`plan`]: pure: each row's fate (ack, nak with a delay, dead letter
//!   then ack) from its verdict and deliveries, and its answer once the
//!   letters were sent;
//! - [`apply`]: the plan carried out against NATS (letters stored, then
//!   every row answered while the unit's fence holds, counted and logged);
//! - [`summary`]: what a unit dead-lettered and retried, said at INFO.

mod apply;
mod plan;
mod summary;

pub(super) use apply::{Settler, confirm_acks};
