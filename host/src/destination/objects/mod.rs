//! Object storage a sink is granted (S3 and the stores that speak it): the
//! store (`store.rs`), each unit's commit log there (`log.rs`), which
//! keeps every row in exactly one visible object across owners, crashes
//! and late writers, what an object holds (`encode.rs`: Parquet or
//! NDJSON), the objects a unit's sink fills until each commits
//! (`filling.rs`), and what a sink's call appends and the delivery step
//! that hands it over (`append.rs`).

mod encode;
mod filling;
mod log;
mod append;
mod store;

pub use append::{ObjectsCall, ObjectsDestination, ObjectsStep};
pub use encode::{
    AppendError, Column, ColumnType, EncodeError, Format, NdjsonCompression, ObjectWriter,
    ParquetCompression, Record, RowRefused,
};
pub use filling::{Delivered, OpenError, UnitObjects, Waiting, check_path};
pub use log::{Committed, Entry, LogError, Recovery, UnitLog};
pub use store::{Store, StoreError, StoreSettings};
