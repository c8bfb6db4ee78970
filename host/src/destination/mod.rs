//! Destinations the host holds for a sink: PostgreSQL (`grants.postgres`),
//! whose writes commit with the unit's claim and the batch's acks, and
//! NATS subjects (`grants.nats`), published once the rows are delivered.
//!
//! - [`pool`]: one connection pool per loaded sink version, TLS when asked;
//! - [`error`]: what a plugin is told when a statement fails;
//! - [`call`]: one `deliver` call's transaction, statement by statement
//!   (what the sandbox's `postgres` import runs);
//! - [`ledger`]: weir's tables in the database, which fence a unit's old
//!   owner and record what each commit applied;
//! - [`step`]: the pipeline step wrapping the sink's call (skip rows applied
//!   before, commit or roll back once the rows have their verdicts);
//! - [`nats`]: a call's publishes, checked against the grant, sent with
//!   message ids once the rows have their verdicts.

mod call;
mod error;
mod ledger;
mod nats;
mod pool;
pub(crate) mod step;

pub use call::{Param, PgCall};
pub use error::StatementError;
pub use nats::{PublishCall, PublishStep, Publisher};
pub use pool::{PgPool, PoolError};
pub use step::{Ending, Finished, PostgresStep};
