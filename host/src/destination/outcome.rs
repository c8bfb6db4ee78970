//! What a destination step's `finish` returns, the same for PostgreSQL
//! and NATS, so the pipeline reads both one way: the call's writes
//! committed, rolled back or to run again ([`Finished`]), or the unit no
//! longer this host's ([`Fenced`]); and how the pipeline ends a call's
//! transaction ([`Ending`]).

/// The unit is not this host's any more: nothing of the batch may be
/// answered. Unlike `fence::Fenced` it says why (the lease ran out, or a
/// later claim committed), for the pipeline's warning.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Fenced(pub String);

/// What became of a call's transaction, or of its publishes.
#[derive(Debug, PartialEq, Eq)]
pub enum Finished {
    /// Committed (or nothing to commit): the rows' verdicts stand.
    Committed,
    /// Rolled back because a row of the call is retried: every row of the
    /// call comes back, with this reason.
    RolledBack(String),
    /// The destination could not take it now: the batch is to run again
    /// once it can. PostgreSQL: unreachable, the connection lost, a
    /// serialisation failure, rows applied meanwhile (nothing was written).
    /// NATS: no connection, a publish or its PubAcks failed (the message ids
    /// make a JetStream target drop what it stored already).
    Again(String),
}

/// How a call's transaction ends.
pub enum Ending {
    /// Every row of the call has its verdict and none is retried: commit,
    /// recording these input rows (indexes into the batch) as applied.
    Commit(Vec<usize>),
    /// A row of the call is retried: nothing of it is written.
    RollBack(String),
}
