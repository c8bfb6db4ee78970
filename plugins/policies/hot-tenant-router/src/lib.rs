//! A weir router: the tables of the tenants named hot are spread over
//! several units by each row's routing key; every other table keeps weir's
//! default route (one unit per table).
//!
//! ```toml
//! [policies]
//! router = "router"
//! routing_field = "user_id"     # the row field whose value is its routing key
//!
//! [plugins.router.settings.hot_tenants]
//! acme = 8                      # acme's tables each spread over 8 units
//! ```
//!
//! A table's units are consecutive (wrapping) from a place its name hashes
//! to, so two hot tables do not pile onto the same units; a key always maps
//! to the same unit, so rows with one key keep their order.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::Deserialize;
use weir_plugin::router::{Guest, Route, TableRoute, Topology, Unit};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    /// Tenant → how many units each of its tables spreads over.
    #[serde(default)]
    hot_tenants: BTreeMap<String, u32>,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

struct HotTenantRouter;

impl Guest for HotTenantRouter {
    fn init(settings: String) -> Result<(), String> {
        let settings: Settings = weir_plugin::settings(&settings)?;
        if let Some((tenant, _)) = settings.hot_tenants.iter().find(|(_, n)| **n == 0) {
            return Err(format!(
                "settings.hot_tenants.{tenant}: must spread over at least 1 unit"
            ));
        }
        SETTINGS
            .set(settings)
            .map_err(|_| "init called twice".to_string())
    }

    fn route_table(_topology: Topology, tenant: String, _table: String) -> TableRoute {
        match spread_of(&tenant) {
            Some(_) => TableRoute::ByKey,
            None => TableRoute::Fixed(Route::DefaultRoute),
        }
    }

    fn route_keys(
        topology: Topology,
        tenant: String,
        table: String,
        keys: Vec<Option<String>>,
    ) -> Vec<Route> {
        let units = u64::from(topology.partitions.max(1)) * u64::from(topology.shards.max(1));
        let spread = u64::from(spread_of(&tenant).unwrap_or(1)).min(units);
        let first = fnv1a(&[tenant.as_bytes(), &[0xff], table.as_bytes()]);
        keys.iter()
            .map(|key| {
                let slot = key
                    .as_deref()
                    .map_or(0, |key| fnv1a(&[key.as_bytes()]) % spread);
                let index = (first % units + slot) % units;
                let shards = u64::from(topology.shards.max(1));
                Route::To(Unit {
                    partition: (index / shards) as u32,
                    shard: (index % shards) as u32,
                })
            })
            .collect()
    }
}

fn spread_of(tenant: &str) -> Option<u32> {
    SETTINGS.get()?.hot_tenants.get(tenant).copied()
}

/// FNV-1a, 64-bit: stable across builds, which a route must be.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in *part {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

weir_plugin::export_router!(HotTenantRouter);
