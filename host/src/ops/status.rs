//! What a host reports about itself: row counts, the fleet (members, each
//! unit's owner, unowned units), unit backlogs, plugin versions and its
//! NATS connection. Served as JSON at `/v1/status` and read back by
//! `weir status`.
//!
//! Owners and unowned units come from the coordination watch (no request);
//! backlogs from one paged consumer listing per partition (256 units a
//! request) rather than a request per unit.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use async_nats::jetstream;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::coordination::FleetView;
use crate::ingest::usage::Ledger;
use crate::reload::generation::{Generation, PluginStatus};
use crate::telemetry::Metrics;
use crate::topology::route::Router;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusReport {
    pub rows: RowCounts,
    #[serde(default)]
    pub fleet: FleetStatus,
    pub units: Vec<UnitStatus>,
    pub plugins: Vec<PluginStatus>,
    pub nats: NatsStatus,
    /// Each tenant's fleet-wide usage as this host counts it (what its
    /// budget is asked with).
    #[serde(default)]
    pub tenants: Vec<TenantUsage>,
}

/// One tenant's queued rows and bytes fleet-wide, and what it sent in the
/// last second.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TenantUsage {
    pub tenant: String,
    pub queued_rows: u64,
    pub queued_bytes: u64,
    pub recent_rows: u64,
    pub recent_bytes: u64,
}

/// The fleet as the answering host sees it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FleetStatus {
    /// The answering host's member id.
    pub me: String,
    /// Whether it currently acts as a member (holds its lease).
    pub member: bool,
    pub members: Vec<MemberStatus>,
    /// Consumers of the units no live member holds.
    pub unowned: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberStatus {
    pub id: String,
    pub http: String,
    /// Milliseconds since the member started.
    pub age_ms: u64,
    /// The plugin versions the member runs, by name.
    #[serde(default)]
    pub plugins: std::collections::BTreeMap<String, String>,
}

impl StatusReport {
    /// True when every unit's backlog is empty and nothing is in flight.
    pub fn drained(&self) -> bool {
        self.units
            .iter()
            .all(|unit| unit.pending == Some(0) && unit.ack_pending == Some(0))
    }

    /// The one-line summary `weir status` prints.
    pub fn summary(&self) -> String {
        let backlog: u64 = self.units.iter().filter_map(|u| u.pending).sum();
        let counted = |count: usize, what: &str| {
            format!("{count} {what}{}", if count == 1 { "" } else { "s" })
        };
        format!(
            "accepted {}, delivered {}, dead-lettered {}, retried {}, backlog {}; {}, {}",
            self.rows.accepted,
            self.rows.delivered,
            self.rows.dead_lettered,
            self.rows.retried,
            backlog,
            counted(self.fleet.members.len(), "member"),
            counted(self.fleet.unowned.len(), "unowned unit")
        )
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RowCounts {
    pub accepted: u64,
    pub delivered: u64,
    pub dead_lettered: u64,
    pub retried: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UnitStatus {
    pub consumer: String,
    /// Rows stored but not yet delivered; `None` when NATS did not answer.
    pub pending: Option<u64>,
    /// Rows delivered to this unit's worker and not yet acked.
    pub ack_pending: Option<u64>,
    /// The live member that pulls this unit; `None`: unowned.
    #[serde(default)]
    pub owner: Option<String>,
    /// Milliseconds since the owner claimed the unit.
    #[serde(default)]
    pub owned_for_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NatsStatus {
    /// Credentials redacted; empty unless asked with an admin key.
    pub url: String,
    pub connected: bool,
    /// True when weir runs its own nats-server.
    pub embedded: bool,
    /// The embedded server's durability (`always` or `periodic`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync: Option<String>,
}

/// Everything needed to build a report; cheap to clone.
#[derive(Clone)]
pub struct StatusSource {
    pub(crate) metrics: Metrics,
    pub(crate) registry: Arc<Registry>,
    /// The running generation: always the plugin versions running now.
    pub(crate) generations: watch::Receiver<Arc<Generation>>,
    pub(crate) client: async_nats::Client,
    pub(crate) router: Router,
    pub(crate) nats: NatsStatus,
    pub(crate) fleet: watch::Receiver<Arc<FleetView>>,
    pub(crate) ledger: Ledger,
}

/// Pending and ack-pending rows by consumer name.
pub type Backlogs = HashMap<String, (u64, u64)>;

impl StatusSource {
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// Whether the NATS connection is up now.
    pub fn nats_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// The row counters alone: no request to NATS.
    pub fn rows(&self) -> RowCounts {
        let metrics = &self.metrics;
        RowCounts {
            accepted: metrics.rows_accepted.get(),
            delivered: metrics.rows_delivered.get(),
            dead_lettered: metrics.rows_dead_lettered.get(),
            retried: metrics.rows_retried.get(),
        }
    }

    /// The fleet as this host's watch shows it: no request to NATS.
    pub fn fleet(&self) -> Arc<FleetView> {
        self.fleet.borrow().clone()
    }

    /// The whole report.
    pub async fn report(&self) -> StatusReport {
        let backlogs = unit_backlogs(&self.client, &self.router).await;
        let fleet = self.fleet();
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let all_units = self.router.units();
        let units = all_units
            .iter()
            .map(|&unit| {
                let consumer = self.router.unit_consumer(unit);
                let backlog = backlogs.get(&consumer);
                let owner = fleet.owner(unit).map(str::to_string);
                let owned_for_ms = owner
                    .as_ref()
                    .and_then(|_| fleet.owners.get(&unit))
                    .map(|(record, _)| now_ms.saturating_sub(record.since_ms));
                UnitStatus {
                    pending: backlog.map(|b| b.0),
                    ack_pending: backlog.map(|b| b.1),
                    consumer,
                    owner,
                    owned_for_ms,
                }
            })
            .collect();
        let fleet_status = FleetStatus {
            me: fleet.me.clone(),
            member: fleet.member,
            members: fleet
                .members
                .iter()
                .filter(|(id, _)| fleet.is_live(id))
                .map(|(id, record)| MemberStatus {
                    id: id.clone(),
                    http: record.http.clone(),
                    age_ms: now_ms.saturating_sub(record.since_ms),
                    plugins: record.plugins.clone(),
                })
                .collect(),
            unowned: fleet
                .unowned(&all_units)
                .into_iter()
                .map(|unit| self.router.unit_consumer(unit))
                .collect(),
        };
        StatusReport {
            rows: self.rows(),
            fleet: fleet_status,
            units,
            plugins: self.generations.borrow().plugin_status(),
            nats: NatsStatus {
                connected: self.nats_connected(),
                ..self.nats.clone()
            },
            tenants: self
                .ledger
                .tenants()
                .into_iter()
                .map(|(tenant, usage)| TenantUsage {
                    tenant,
                    queued_rows: usage.queued.rows,
                    queued_bytes: usage.queued.bytes,
                    recent_rows: usage.recent.rows,
                    recent_bytes: usage.recent.bytes,
                })
                .collect(),
        }
    }
}

/// Every unit's backlog (pending, ack pending) by consumer name, from one
/// paged consumer listing per partition: 256 units a request.
pub async fn unit_backlogs(client: &async_nats::Client, router: &Router) -> Backlogs {
    use futures::StreamExt;
    let js = jetstream::new(client.clone());
    let mut backlogs = Backlogs::new();
    for partition in 0..router.partitions() {
        let Ok(stream) = js
            .get_stream_no_info(router.partition_stream(partition))
            .await
        else {
            continue;
        };
        let mut consumers = stream.consumers();
        while let Some(Ok(info)) = consumers.next().await {
            backlogs.insert(info.name, (info.num_pending, info.num_ack_pending as u64));
        }
    }
    backlogs
}
