//! What a host reports about itself: row counts, unit backlogs, plugin
//! versions and its NATS connection. Served as JSON at `/v1/status` and
//! read back by `weir status`.

use std::collections::HashMap;
use std::sync::Arc;

use async_nats::jetstream;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

use crate::route::Router;
use crate::telemetry::Metrics;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusReport {
    pub rows: RowCounts,
    pub units: Vec<UnitStatus>,
    pub plugins: Vec<PluginStatus>,
    pub nats: NatsStatus,
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
        format!(
            "accepted {}, delivered {}, dead-lettered {}, retried {}, backlog {}",
            self.rows.accepted,
            self.rows.delivered,
            self.rows.dead_lettered,
            self.rows.retried,
            backlog
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
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PluginStatus {
    pub name: String,
    pub world: String,
    pub version: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NatsStatus {
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
    /// Replaced by a hot reload: always the versions running now.
    pub(crate) plugins: Arc<std::sync::RwLock<Vec<PluginStatus>>>,
    pub(crate) client: async_nats::Client,
    pub(crate) router: Router,
    pub(crate) nats: NatsStatus,
}

impl StatusSource {
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
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

    /// The whole report. Unit backlogs come from one paged consumer listing
    /// per partition (256 consumers a request), not one request per unit.
    pub async fn report(&self) -> StatusReport {
        use futures::StreamExt;
        let js = jetstream::new(self.client.clone());
        let mut backlogs: HashMap<String, (u64, u64)> = HashMap::new();
        for partition in 0..self.router.partitions() {
            let Ok(stream) = js.get_stream(self.router.partition_stream(partition)).await else {
                continue;
            };
            let mut consumers = stream.consumers();
            while let Some(Ok(info)) = consumers.next().await {
                backlogs.insert(info.name, (info.num_pending, info.num_ack_pending as u64));
            }
        }
        let units = self
            .router
            .units()
            .into_iter()
            .map(|unit| {
                let consumer = self.router.unit_consumer(unit);
                let backlog = backlogs.get(&consumer);
                UnitStatus {
                    pending: backlog.map(|b| b.0),
                    ack_pending: backlog.map(|b| b.1),
                    consumer,
                }
            })
            .collect();
        StatusReport {
            rows: self.rows(),
            units,
            plugins: self
                .plugins
                .read()
                .map(|plugins| plugins.clone())
                .unwrap_or_default(),
            nats: NatsStatus {
                connected: self.client.connection_state()
                    == async_nats::connection::State::Connected,
                ..self.nats.clone()
            },
        }
    }
}
