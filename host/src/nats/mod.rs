//! Everything weir says to NATS below the level of rows: the connection,
//! the embedded default server, JetStream API helpers, ack subjects and the
//! KV watches and writes coordination needs.

//!
//! Exported: `connect` and `close` (and `ConnectError`), the embedded
//! server (`EmbeddedNats`, `EmbeddedOptions`), and [`kv`] as a module: its
//! `NatsKv`, `MemoryKv`, `Watch`, `Entry`… are named through it.

pub(crate) mod ack;
pub(crate) mod connection;
pub(crate) mod embedded;
mod error;
pub(crate) mod jetstream;
pub mod kv;

pub use connection::{ConnectError, Refusals, close, connect, connect_producer, redact};
pub use embedded::{EmbeddedNats, EmbeddedOptions};
pub(crate) use error::NatsError;
