//! The shape of weir's JetStream world: the names of partitions, units and
//! subjects and the default route ([`route`]), the streams, consumers and
//! buckets described once ([`manifest`]), and the NATS user a host needs
//! ([`permissions`]).

pub mod manifest;
pub mod permissions;
pub mod route;
