//! `[policies]`: the per-tenant policies the front door asks.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

use super::World;
use super::checker::Checker;
use super::keys::{Fallback, Key, Reload};
use super::plugins::PluginConfig;

/// `[policies]`: the front door takes them before its next request.
pub(super) const KEYS: &[Key] = &[
    Key::new("policies", "budget", Fallback::Off, Reload::Hot),
    Key::new("policies", "router", Fallback::Off, Reload::Hot),
    Key::new("policies", "routing_field", Fallback::Off, Reload::Hot),
];

/// The per-tenant policies the front door asks (plugins of the `budget`
/// and `router` worlds). None: no budget, the default route.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policies {
    pub budget: Option<String>,
    pub router: Option<String>,
    /// A top-level row field whose value is the row's routing key.
    pub routing_field: Option<String>,
}

/// `[policies]` as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicies {
    budget: Option<Spanned<String>>,
    router: Option<Spanned<String>>,
    routing_field: Option<String>,
}

impl Checker<'_> {
    pub(super) fn policies(
        &self,
        raw: RawPolicies,
        plugins: &BTreeMap<String, PluginConfig>,
    ) -> Policies {
        let uses = [(&raw.budget, World::Budget), (&raw.router, World::Router)];
        for (used, world) in uses {
            if let Some(used) = used {
                self.check_plugin_world(plugins, used, world, "policies");
            }
        }
        Policies {
            budget: raw.budget.map(Spanned::into_inner),
            router: raw.router.map(Spanned::into_inner),
            routing_field: raw.routing_field,
        }
    }
}
