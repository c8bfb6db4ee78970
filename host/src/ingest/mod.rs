//! Ingest, the first half of a row's path: a door (HTTP, or NATS in
//! `nats_door`) takes a request to the front door's one path,
//! [`ndjson`] splits it into rows, [`policy`] asks the tenant's budget (with
//! the fleet-wide [`usage`] and the tenant's own [`tenants`] settings) and
//! router, and [`publish`] stores every row in its partition stream before
//! the 202.

//!
//! Exported: the NATS door's start error and answer header
//! (`NatsDoorError`, `STATUS_HEADER`), the tenant's policies and what they decide (`Policies`,
//! `Admit`, `Placement`), the publisher (`Publisher`, `Ids`,
//! `PublishError`), the usage ledger (`Ledger`, `Usage`, `Queued`,
//! `RATE_WINDOW`), the tenant settings calls `weir tenant` makes, and
//! [`ndjson`] as a module (its `split` is named through it).

pub(crate) mod listener;
mod answer;
mod encoding;
pub(crate) mod front_door;
pub(crate) mod idempotency;
pub(crate) mod nats_door;
pub mod ndjson;
mod policy;
pub(crate) mod publish;
mod tenants;
pub(crate) mod tls;
pub(crate) mod usage;

pub use nats_door::{NatsDoorError, STATUS_HEADER};
pub use policy::{Admit, Placement, Policies};
pub use publish::{Ids, PublishError, Published, Publisher};
pub use tenants::{
    all_tenant_settings, check_tenant_settings, set_tenant_settings, tenant_settings,
};
pub use usage::{Ledger, Queued, RATE_WINDOW, Usage};
