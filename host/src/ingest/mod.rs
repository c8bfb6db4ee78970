//! Ingest, the first half of a row's path: the front door takes a request,
//! [`ndjson`] splits it into rows, [`policy`] asks the tenant's budget (with
//! the fleet-wide [`usage`] and the tenant's own [`tenants`] settings) and
//! router, and [`publish`] stores every row in its partition stream before
//! the 202.

pub mod listener;
pub mod front_door;
pub mod idempotency;
pub mod ndjson;
pub mod policy;
pub mod publish;
pub mod tenants;
pub mod usage;
