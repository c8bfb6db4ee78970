//! weir: a WebAssembly-plugin ingest host on NATS JetStream.
//!
//! The path of a row, module by module:
//!
//! - ingest: [`front_door`] (HTTP, API keys) → [`ndjson`] (rows, line
//!   numbers, keys) → [`policy`] (the tenant's budget, from [`usage`]; its
//!   router) → [`route`] (which unit and subject) → [`publish`]
//!   (JetStream, PubAck before 2xx);
//! - delivery: [`topology`] (streams and consumers) → [`delivery`] (pull a
//!   unit, batch, settle every row) → [`batch`] (rows packed into one
//!   buffer) → [`pipeline`] (plugins in order) →
//!   [`sandbox`] (wasmtime, limits, grants) → [`dead_letter`].
//!
//! Beside the path: [`config`], [`embedded_nats`], [`permissions`], [`telemetry`], [`status`],
//! [`send`] (the `weir send` client), [`kv`] (watching key prefixes through
//! one consumer, and the KV writes coordination needs) and [`host`], which
//! wires them together.

pub mod ack;
pub mod batch;
pub mod config;
pub mod coordination;
pub mod dead_letter;
pub mod delivery;
pub mod embedded_nats;
pub mod front_door;
pub mod host;
pub mod kv;
pub mod ndjson;
pub mod permissions;
pub mod pipeline;
pub mod plugin_store;
pub mod policy;
pub mod publish;
pub mod pull;
pub mod reload;
pub mod route;
pub mod sandbox;
pub mod send;
pub mod status;
pub mod telemetry;
pub mod topology;
pub mod usage;
