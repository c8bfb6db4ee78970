//! PostgreSQL for a sink granted `grants.postgres`. What the sandbox holds
//! while a call runs: the pool ([`pool`]), the call's transaction
//! ([`statements`]) and what a failed statement tells the plugin ([`error`]).
//! What the pipeline drives around the call: the step ([`commit`]: rows
//! applied before skip the call; the transaction commits once the rows
//! have their verdicts, fenced by the unit's claim) over weir's own tables
//! ([`ledger`]).

mod commit;
mod error;
mod ledger;
mod pool;
mod statements;

pub use commit::PostgresStep;
pub use error::StatementError;
pub use pool::{PgPool, PoolError};
pub use statements::{Param, PgCall};
