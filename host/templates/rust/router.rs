use std::collections::BTreeSet;

use serde_json::{Map, Value};
use weir_plugin::Router;
use weir_plugin::router::{Route, TableRoute, Topology, Unit};

struct Plugin {
    by_key_tables: BTreeSet<String>,
}

impl Router for Plugin {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Map<String, Value> = weir_plugin::settings(&settings)?;
        let tables = settings.get("by_key").and_then(Value::as_array);
        Ok(Plugin {
            by_key_tables: tables
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect(),
        })
    }

    fn route_table(&mut self, _: Topology, _tenant: &str, table: &str) -> TableRoute {
        if self.by_key_tables.contains(table) {
            TableRoute::ByKey
        } else {
            TableRoute::Fixed(Route::DefaultRoute)
        }
    }

    fn route_keys(
        &mut self,
        topology: Topology,
        _: &str,
        _: &str,
        keys: &[Option<String>],
    ) -> Vec<Route> {
        // Deterministic on every host: the sum of the key's bytes.
        let unit =
            |key: &String| key.bytes().map(u32::from).sum::<u32>() % topology.partitions.max(1);
        keys.iter()
            .map(|key| match key {
                Some(key) => Route::To(Unit {
                    partition: unit(key),
                    shard: 0,
                }),
                None => Route::DefaultRoute,
            })
            .collect()
    }
}

weir_plugin::export_router!(Plugin);
