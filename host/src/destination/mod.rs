//! Destinations the host holds for a sink: PostgreSQL (`grants.postgres`),
//! whose writes commit with the unit's claim and the batch's acks, and
//! NATS subjects (`grants.nats`), published once the rows are delivered.
//!
//! - [`postgres`]: the pool, a call's transaction and its errors (what the
//!   sandbox's `postgres` import runs), and the step that commits it over
//!   weir's ledger tables;
//! - [`nats`]: a call's publishes, checked against the grant, and the step
//!   that sends them with message ids;
//! - [`objects`]: an object store (S3), each unit's commit log in it, and
//!   the objects a unit's sink fills until they commit;
//! - [`outcome`]: what either step's `finish` returns.
//!
//! Exported by name, so callers never name the files: what the sandbox
//! holds (`PgPool`, `PoolError`, `PgCall`, `Param`, `StatementError`,
//! `PublishCall`) and what delivery drives (`PostgresStep`, `PublishStep`,
//! `Publisher`, `Ending`, `Finished`).

mod nats;
mod objects;
mod outcome;
mod postgres;

pub use nats::{PublishCall, PublishStep, Publisher};
pub use objects::{
    AppendError, Column, ColumnType, Committed, Delivered, EncodeError, Entry, Format, LogError,
    NdjsonCompression, ObjectWriter, ObjectsCall, ObjectsDestination, ObjectsStep, OpenError,
    ParquetCompression, Record, Recovery, RowRefused, Store, StoreError, StoreSettings, UnitLog,
    UnitObjects, Waiting, check_path,
};
pub use outcome::{Ending, Finished};

/// The rows a sink's call is given, as a destination step keeps them: each
/// input row's sequence in `sequences` (`inputs` long, 0 for rows not
/// given) and, returned, each given row's input row.
fn call_rows(
    inputs: usize,
    rows: impl Iterator<Item = (usize, u64)>,
    sequences: &mut Vec<u64>,
) -> Vec<usize> {
    sequences.clear();
    sequences.resize(inputs, 0);
    rows.map(|(input, sequence)| {
        if let Some(slot) = sequences.get_mut(input) {
            *slot = sequence;
        }
        input
    })
    .collect()
}
pub use postgres::{Param, PgCall, PgPool, PoolError, PostgresStep, StatementError};
