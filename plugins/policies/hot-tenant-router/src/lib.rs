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

use serde::Deserialize;
use weir_plugin::Router;
use weir_plugin::router::{Route, TableRoute, Topology, Unit};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    /// Tenant → how many units each of its tables spreads over.
    #[serde(default)]
    hot_tenants: BTreeMap<String, u32>,
}

struct HotTenantRouter {
    settings: Settings,
}

impl Router for HotTenantRouter {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Settings = weir_plugin::settings(&settings)?;
        if let Some((tenant, _)) = settings.hot_tenants.iter().find(|(_, n)| **n == 0) {
            return Err(format!(
                "settings.hot_tenants.{tenant}: must spread over at least 1 unit"
            ));
        }
        Ok(HotTenantRouter { settings })
    }

    fn route_table(&mut self, _topology: Topology, tenant: &str, _table: &str) -> TableRoute {
        match self.spread_of(tenant) {
            Some(_) => TableRoute::ByKey,
            None => TableRoute::Fixed(Route::DefaultRoute),
        }
    }

    fn route_keys(
        &mut self,
        topology: Topology,
        tenant: &str,
        table: &str,
        keys: &[Option<String>],
    ) -> Vec<Route> {
        let units = u64::from(topology.partitions.max(1)) * u64::from(topology.shards.max(1));
        let spread = u64::from(self.spread_of(tenant).unwrap_or(1)).min(units);
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

impl HotTenantRouter {
    fn spread_of(&self, tenant: &str) -> Option<u32> {
        self.settings.hot_tenants.get(tenant).copied()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn router(settings: &str) -> HotTenantRouter {
        HotTenantRouter::init(settings.to_string()).unwrap()
    }

    /// (partition, shard) of each route, or `None` for the default route.
    fn units(routes: &[Route]) -> Vec<Option<(u32, u32)>> {
        routes
            .iter()
            .map(|route| match route {
                Route::To(unit) => Some((unit.partition, unit.shard)),
                Route::DefaultRoute => None,
            })
            .collect()
    }

    #[test]
    fn hot_tenants_route_by_key_and_others_keep_the_default_route() {
        let mut router = router(r#"{"hot_tenants": {"acme": 4}}"#);
        let topology = Topology {
            partitions: 2,
            shards: 4,
        };
        assert!(matches!(
            router.route_table(topology, "acme", "orders"),
            TableRoute::ByKey
        ));
        assert!(matches!(
            router.route_table(topology, "beta", "orders"),
            TableRoute::Fixed(Route::DefaultRoute)
        ));
        // Pinned: a route must not move between builds. The table starts at
        // unit 1 (FNV-1a of "acme", 0xff, "orders", mod 8 units); keys spread
        // over 4 units from there, a row without a key goes to the first.
        let keys = [
            Some("u1".into()),
            Some("u2".into()),
            None,
            Some("u1".into()),
        ];
        assert_eq!(
            units(&router.route_keys(topology, "acme", "orders", &keys)),
            vec![Some((1, 0)), Some((0, 3)), Some((0, 1)), Some((1, 0))]
        );
    }

    #[test]
    fn a_tenant_spread_over_no_unit_is_refused() {
        let refused = HotTenantRouter::init(r#"{"hot_tenants": {"acme": 0}}"#.into());
        assert!(refused.is_err_and(|e| e.contains("settings.hot_tenants.acme")));
        assert!(HotTenantRouter::init(r#"{"hot_tenant": {}}"#.into()).is_err());
    }
}
