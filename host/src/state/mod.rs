//! Plugin state (#23): what a stateful plugin keeps for one tenant's
//! table, stored as one NATS KV key per scope (each write the batch's
//! changes, the whole scope now and then) and written with the batch's
//! acks. A scope's value, its encoding and limits (`scope`), the
//! overlays a call reads and writes through (`batch`), the store behind
//! them, the state bucket or memory (`store`), the stateful step that
//! wraps the granted plugin's call (`step`), a batch's writes on their way
//! as its settlement waits for them (`landing`) and the pruning of the rows
//! that cannot come back (`prune`).

//!
//! Exported: the store (`StateStore`, `UnitState`, `ScopeStore`) and a
//! scope's key in the bucket (`scope_key`).

pub(crate) mod batch;
pub(crate) mod landing;
pub(crate) mod prune;
pub(crate) mod scope;
pub(crate) mod step;
pub(crate) mod store;

pub use store::{ScopeStore, StateStore, UnitState, scope_key};
