//! Everything weir says to NATS below the level of rows: the connection,
//! the embedded default server, JetStream API helpers, ack subjects and the
//! KV watches and writes coordination needs.

pub mod ack;
pub mod connection;
pub mod embedded;
pub mod error;
pub mod jetstream;
pub mod kv;

pub use error::NatsError;
