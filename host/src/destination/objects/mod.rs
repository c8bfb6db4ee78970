//! Object storage a sink is granted (S3 and the stores that speak it): the
//! store (`store.rs`), each unit's commit log there (`log.rs`), which
//! keeps every row in exactly one visible object across owners, crashes
//! and late writers, and what an object holds (`encode.rs`: Parquet or
//! NDJSON).

mod encode;
mod log;
mod store;

pub use encode::{
    AppendError, Column, ColumnType, EncodeError, Format, NdjsonCompression, ObjectWriter,
    ParquetCompression, RowRefused,
};
pub use log::{Committed, Entry, LogError, Recovery, UnitLog};
pub use store::{Store, StoreError, StoreSettings};
