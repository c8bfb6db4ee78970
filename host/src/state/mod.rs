//! Plugin state (#23, in progress): what a stateful plugin keeps for one
//! tenant's table, stored as one NATS KV value per scope and written with
//! the batch's acks. This module holds the pure part: a scope's value, its
//! encoding, the batch overlay the plugin reads and writes through, and
//! the limits. The KV store, the WIT interface and the worker's commit
//! step build on it.

pub mod batch;
pub mod scope;
pub mod store;
