//! weir: a WebAssembly-plugin ingest host on NATS JetStream.
//!
//! The subsystems, in the order a row meets them:
//!
//! - [`ingest`]: front door (HTTP, API keys) → NDJSON rows → the tenant's
//!   budget and router policies → publish (JetStream, PubAck before 2xx);
//! - [`topology`]: the partition streams and units a row is routed to;
//! - [`coordination`]: which host of the fleet pulls which unit;
//! - [`delivery`]: pull a unit, pack a batch, run its pipeline, settle every
//!   row (ack, retry, dead letter);
//! - [`sandbox`]: the plugins a pipeline runs (wasmtime, limits, grants);
//! - [`reload`]: the generation of config and plugins a hot reload swaps.
//!
//! Beside the path: [`nats`] (connection, embedded server, JetStream and KV
//! helpers), [`ops`] (status and operator endpoints), [`config`],
//! [`telemetry`], [`client`] (the `weir send` client) and [`host`], which
//! assembles a running host from them; the tables of plugin worlds
//! ([`world`]) and of what a plugin may import ([`capability`]); and
//! [`fence`], what the row path sees of a unit's lease.

// The path of a row, in order.
pub mod ingest;
pub mod topology;
pub mod coordination;
pub mod delivery;
pub mod sandbox;
pub mod destination;
pub mod state;
pub mod reload;

// Beside it.
pub mod capability;
pub mod client;
pub mod config;
pub mod fence;
pub mod host;
pub mod nats;
pub mod ops;
pub mod telemetry;
pub mod world;

#[cfg(test)]
mod fuzz;
