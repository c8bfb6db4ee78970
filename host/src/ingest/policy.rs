//! The front door's per-tenant policies, both plugins: a budget asked once
//! per request (admit, throttle or reject, from fleet-wide usage), and a
//! router asked once per table (remembered until a reload) and, for a table
//! it routes by key, once per request. Without them: no budget, the default route.
//!
//! A generation of policies lives in the front door's `Gate`: a reload
//! brings fresh instances and forgets every remembered table route.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::Config;
use crate::ingest::usage::Usage;
use crate::sandbox::bindings::{Admission, Decision, Route, RouteUnit, TableRoute, Topology};
use crate::sandbox::{CallError, Plugin, PluginInstance};
use crate::topology::route::{Names, Unit};

/// Idle instances kept per policy; more concurrent requests instantiate more.
const MAX_IDLE_INSTANCES: usize = 8;
/// Table routes remembered per generation; past it the memory starts over.
const MAX_REMEMBERED_TABLES: usize = 65_536;

/// What the budget decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    Yes,
    /// Retry after this long (HTTP 429).
    Throttle(Duration),
    /// Refused for this reason (HTTP 403).
    Reject(String),
}

/// Which unit each row of a request goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Every row to one unit.
    Table(Unit),
    /// Row `i` to unit `i`.
    Rows(Vec<Unit>),
}

impl Placement {
    pub fn unit(&self, row: usize) -> Option<Unit> {
        match self {
            Placement::Table(unit) => Some(*unit),
            Placement::Rows(units) => units.get(row).copied(),
        }
    }
}

/// A policy that could not answer: the request is refused with a 503 and
/// nothing is stored.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{}", .0.message)]
    Call(CallError),
    #[error(
        "router `{plugin}` sent tenant `{tenant}` table `{table}` to unit {partition}.{shard}, which this topology ({partitions} partitions × {shards} shards) does not have"
    )]
    NoSuchUnit {
        plugin: String,
        tenant: String,
        table: String,
        partition: u32,
        shard: u32,
        partitions: u32,
        shards: u32,
    },
}

/// One policy plugin and its idle instances.
struct Pool {
    plugin: Arc<Plugin>,
    idle: Mutex<Vec<PluginInstance>>,
}

impl Pool {
    fn new(plugin: Arc<Plugin>) -> Pool {
        Pool {
            plugin,
            idle: Mutex::new(Vec::new()),
        }
    }

    async fn take(&self) -> Result<PluginInstance, PolicyError> {
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        match idle {
            Some(instance) => Ok(instance),
            None => self.plugin.instantiate().await.map_err(PolicyError::Call),
        }
    }

    /// Keeps an instance whose call succeeded; a failed one is dropped.
    fn put(&self, instance: PluginInstance) {
        if instance.worn_out() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE_INSTANCES
        {
            idle.push(instance);
        }
    }
}

/// The policies of one generation.
pub struct Policies {
    budget: Option<Pool>,
    router: Option<Pool>,
    routes: Mutex<HashMap<(String, String), TableRoute>>,
    default_routes: Names,
    topology: Topology,
}

impl Policies {
    /// The policies `config` names, from the loaded `plugins`; a name
    /// without a loaded plugin (config validation prevents it) means none.
    pub fn new(config: &Config, plugin: impl Fn(&str) -> Option<Arc<Plugin>>) -> Policies {
        let pool = |name: &Option<String>| name.as_deref().and_then(&plugin).map(Pool::new);
        Policies {
            budget: pool(&config.policies.budget),
            router: pool(&config.policies.router),
            routes: Mutex::new(HashMap::new()),
            default_routes: Names::new(
                &config.stream.prefix,
                config.stream.partitions,
                config.stream.shards,
            ),
            topology: Topology {
                partitions: config.stream.partitions,
                shards: config.stream.shards,
            },
        }
    }

    pub fn has_budget(&self) -> bool {
        self.budget.is_some()
    }

    /// Asks the budget about a request of `rows` rows and `bytes` bytes.
    pub async fn admit(
        &self,
        tenant: &str,
        table: &str,
        rows: usize,
        bytes: u64,
        usage: Usage,
        tenant_settings: Option<Arc<str>>,
    ) -> Result<Admit, PolicyError> {
        let Some(budget) = &self.budget else {
            return Ok(Admit::Yes);
        };
        let request = Admission {
            tenant: tenant.to_string(),
            table: table.to_string(),
            rows: u32::try_from(rows).unwrap_or(u32::MAX),
            bytes,
            usage: crate::sandbox::bindings::Usage {
                queued_rows: usage.queued.rows,
                queued_bytes: usage.queued.bytes,
                recent_rows: usage.recent.rows,
                recent_bytes: usage.recent.bytes,
                window_ms: crate::ingest::usage::RATE_WINDOW.as_millis() as u32,
            },
            tenant_settings: tenant_settings.map(|s| s.to_string()),
        };
        let mut instance = budget.take().await?;
        let decision = instance.admit(&request).await.map_err(PolicyError::Call)?;
        budget.put(instance);
        Ok(match decision {
            Decision::Admit => Admit::Yes,
            Decision::Throttle(ms) => Admit::Throttle(Duration::from_millis(u64::from(ms))),
            Decision::Reject(reason) => Admit::Reject(reason),
        })
    }

    /// Where each row of a request goes. `keys` (each row's routing key)
    /// is asked for only when the router routes the table by key.
    pub async fn place(
        &self,
        tenant: &str,
        table: &str,
        keys: impl FnOnce() -> Vec<Option<String>>,
    ) -> Result<Placement, PolicyError> {
        let Some(router) = &self.router else {
            return Ok(Placement::Table(self.default_routes.route(tenant, table)));
        };
        let remembered = self.routes.lock().ok().and_then(|routes| {
            routes
                .get(&(tenant.to_string(), table.to_string()))
                .copied()
        });
        let table_route = match remembered {
            Some(table_route) => table_route,
            None => {
                let mut instance = router.take().await?;
                let table_route = instance
                    .route_table(self.topology, tenant, table)
                    .await
                    .map_err(PolicyError::Call)?;
                router.put(instance);
                self.remember(tenant, table, table_route);
                table_route
            }
        };
        if let TableRoute::Fixed(route) = table_route {
            return Ok(Placement::Table(self.unit_of(
                &router.plugin,
                tenant,
                table,
                &route,
            )?));
        }
        let keys = keys();
        let mut instance = router.take().await?;
        let routes = instance
            .route_keys(self.topology, tenant, table, &keys)
            .await
            .map_err(PolicyError::Call)?;
        router.put(instance);
        routes
            .iter()
            .map(|route| self.unit_of(&router.plugin, tenant, table, route))
            .collect::<Result<Vec<Unit>, PolicyError>>()
            .map(Placement::Rows)
    }

    fn remember(&self, tenant: &str, table: &str, route: TableRoute) {
        if let Ok(mut routes) = self.routes.lock() {
            if routes.len() >= MAX_REMEMBERED_TABLES {
                routes.clear();
            }
            routes.insert((tenant.to_string(), table.to_string()), route);
        }
    }

    fn unit_of(
        &self,
        plugin: &Plugin,
        tenant: &str,
        table: &str,
        route: &Route,
    ) -> Result<Unit, PolicyError> {
        match route {
            Route::DefaultRoute => Ok(self.default_routes.route(tenant, table)),
            Route::To(RouteUnit { partition, shard })
                if *partition < self.topology.partitions && *shard < self.topology.shards =>
            {
                Ok(Unit {
                    partition: *partition,
                    shard: *shard,
                })
            }
            Route::To(RouteUnit { partition, shard }) => Err(PolicyError::NoSuchUnit {
                plugin: plugin.name().to_string(),
                tenant: tenant.to_string(),
                table: table.to_string(),
                partition: *partition,
                shard: *shard,
                partitions: self.topology.partitions,
                shards: self.topology.shards,
            }),
        }
    }
}
