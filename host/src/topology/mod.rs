//! The shape of weir's JetStream world: the names of partitions, units and
//! subjects and the default route ([`route`]), the streams, consumers and
//! buckets described once ([`manifest`]), and the NATS user a host needs
//! ([`permissions`]).
//!
//! Exported: the names and units (`Names`, `Unit`), the manifest and what
//! checking it finds (`Manifest`, `ManifestFile`, `Mismatch`, `Severity`,
//! `TopologyError`), the revisions the state bucket keeps (`STATE_HISTORY`)
//! and the host's NATS `Permissions`.

pub(crate) mod manifest;
mod permissions;
pub(crate) mod route;

pub use manifest::{Manifest, ManifestFile, Mismatch, STATE_HISTORY, Severity, TopologyError};
pub use permissions::Permissions;
pub use route::{Names, NotAUnit, Unit};
