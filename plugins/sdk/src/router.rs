//! Routers: the [`Router`] trait a routing policy implements, and the
//! policy types it sees (those of the `budget` world: one `policy` interface).
//!
//! [`export_router!`](crate::export_router) exports an implementation. A
//! router is a value made by `init` and kept per instance, like a transform.

#[doc(hidden)]
pub use crate::bindings::budget::weir::plugin::policy::Unit;
#[doc(hidden)]
pub use crate::bindings::router::Guest;
pub use crate::bindings::router::{Route, TableRoute, Topology};

use crate::slot::Slot;

/// A routing policy: which unit stores a tenant's table, or each of its rows.
pub trait Router: Sized + 'static {
    /// Called once per instance before any question, with the plugin's
    /// settings as a JSON object. An error refuses the plugin.
    fn init(settings: String) -> Result<Self, String>;

    /// How the rows of `tenant`'s `table` are routed; asked once per table
    /// and generation (the host remembers a fixed route).
    fn route_table(&mut self, topology: Topology, tenant: &str, table: &str) -> TableRoute;

    /// The route of each row of one request to a `by-key` table, in order,
    /// from its routing key (`None` for a row without one). Rows with the
    /// same key must go to the same unit, so they keep their order.
    fn route_keys(
        &mut self,
        topology: Topology,
        tenant: &str,
        table: &str,
        keys: &[Option<String>],
    ) -> Vec<Route>;
}

/// The `route-table` export: asks the instance's plugin.
#[doc(hidden)]
pub fn route_table<P: Router>(
    slot: &'static Slot<P>,
    topology: Topology,
    tenant: String,
    table: String,
) -> TableRoute {
    crate::slot::with(slot, |plugin: &mut P| {
        plugin.route_table(topology, &tenant, &table)
    })
}

/// The `route-keys` export: asks the instance's plugin.
#[doc(hidden)]
pub fn route_keys<P: Router>(
    slot: &'static Slot<P>,
    topology: Topology,
    tenant: String,
    table: String,
    keys: Vec<Option<String>>,
) -> Vec<Route> {
    crate::slot::with(slot, |plugin: &mut P| {
        plugin.route_keys(topology, &tenant, &table, &keys)
    })
}

/// Exports a [`Router`] as the plugin's `router` world.
#[macro_export]
macro_rules! export_router {
    ($plugin:ty) => {
        const _: () = {
            ::std::thread_local! {
                static PLUGIN: $crate::slot::Cell<$plugin> = const { ::std::cell::RefCell::new(None) };
            }
            struct Export;
            impl $crate::bindings::router::Guest for Export {
                fn init(settings: String) -> Result<(), String> {
                    $crate::slot::fill(&PLUGIN, <$plugin as $crate::router::Router>::init(settings))
                }
                fn route_table(
                    topology: $crate::router::Topology,
                    tenant: String,
                    table: String,
                ) -> $crate::router::TableRoute {
                    $crate::router::route_table(&PLUGIN, topology, tenant, table)
                }
                fn route_keys(
                    topology: $crate::router::Topology,
                    tenant: String,
                    table: String,
                    keys: Vec<Option<String>>,
                ) -> Vec<$crate::router::Route> {
                    $crate::router::route_keys(&PLUGIN, topology, tenant, table, keys)
                }
            }
            $crate::bindings::router::export_world!(Export with_types_in $crate::bindings::router);
        };
    };
}
