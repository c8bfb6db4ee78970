//! Metrics (Prometheus text format) and structured logs. The counters here
//! are also what `/v1/status` and `weir status` report, so both always agree.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    pub plugin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginCounterLabels {
    pub plugin: String,
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SeverityLabels {
    pub severity: crate::topology::manifest::Severity,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `applied` or `refused`.
    pub result: String,
}

/// Every counter a host keeps. Cheap to clone: each metric is an `Arc`.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Rows JetStream acknowledged at the front door.
    pub rows_accepted: Counter,
    /// Rows whose pipeline finished and that were acked.
    pub rows_delivered: Counter,
    /// Rows acked after being written to the dead-letter stream.
    pub rows_dead_lettered: Counter,
    /// Rows handed back to JetStream for a later retry.
    pub rows_retried: Counter,
    /// Batches run through a pipeline.
    pub batches: Counter,
    /// Ingest requests refused with a 4xx or 5xx.
    pub requests_refused: Counter,
    /// Of those, requests the budget throttled (429).
    pub requests_throttled: Counter,
    /// Of those, requests the budget rejected (403).
    pub requests_rejected: Counter,
    /// Connections closed at once because too many were open.
    pub connections_refused: Counter,
    /// Plugin calls that trapped, ran out of time or out of memory.
    pub plugin_failures: Family<PluginLabels, Counter>,
    /// Plugin calls made.
    pub plugin_calls: Family<PluginLabels, Counter>,
    /// Counters plugins keep through the `host.add-counter` import.
    pub plugin_counters: Family<PluginCounterLabels, Counter>,
    /// `add-counter` calls refused: a malformed name, or one name too many.
    pub plugin_counter_refusals: Family<PluginLabels, Counter>,
    /// Plugin instances alive now.
    pub plugin_instances: Gauge,
    /// Times an instance had to wait for a free slot in the instance pool.
    pub plugin_instance_waits: Counter,
    /// Differences between the NATS topology and what weir needs, by severity.
    pub topology_mismatches: Family<SeverityLabels, Gauge>,
    /// Hot reloads of the config and plugins, by result.
    pub reloads: Family<ReloadLabels, Counter>,
    /// Units this host took over from a dead owner with rows left in flight.
    pub unit_takeovers: Counter,
    /// Times this host lost its lease and stopped pulling every unit.
    pub coordination_step_downs: Counter,
    /// Batches abandoned unanswered because the lease ran out before their
    /// sink call or acks (the rows go to the unit's next owner).
    pub fenced_batches: Counter,
    /// Units this host pulls now.
    pub units_owned: Gauge,
}

impl Metrics {
    /// Registers every metric under the `weir_` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let weir = registry.sub_registry_with_prefix("weir");
        weir.register(
            "rows_accepted",
            "Rows acknowledged by JetStream at the front door",
            self.rows_accepted.clone(),
        );
        weir.register(
            "rows_delivered",
            "Rows that went through their pipeline and were acked",
            self.rows_delivered.clone(),
        );
        weir.register(
            "rows_dead_lettered",
            "Rows written to the dead-letter stream",
            self.rows_dead_lettered.clone(),
        );
        weir.register(
            "rows_retried",
            "Rows handed back to JetStream for a retry",
            self.rows_retried.clone(),
        );
        weir.register(
            "batches",
            "Batches run through a pipeline",
            self.batches.clone(),
        );
        weir.register(
            "requests_refused",
            "Ingest requests answered with an error",
            self.requests_refused.clone(),
        );
        weir.register(
            "requests_throttled",
            "Ingest requests the tenant's budget throttled (429)",
            self.requests_throttled.clone(),
        );
        weir.register(
            "requests_rejected",
            "Ingest requests the tenant's budget rejected (403)",
            self.requests_rejected.clone(),
        );
        weir.register(
            "plugin_failures",
            "Plugin calls that trapped, timed out or ran out of memory",
            self.plugin_failures.clone(),
        );
        weir.register(
            "plugin_calls",
            "Plugin calls made",
            self.plugin_calls.clone(),
        );
        weir.register(
            "plugin_counter_refusals",
            "Plugin counters refused (a malformed name, or more than 64 names)",
            self.plugin_counter_refusals.clone(),
        );
        weir.register(
            "plugin_counter",
            "Counters kept by plugins",
            self.plugin_counters.clone(),
        );
        weir.register(
            "connections_refused",
            "HTTP connections refused because too many were open",
            self.connections_refused.clone(),
        );
        weir.register(
            "plugin_instances",
            "Plugin instances alive",
            self.plugin_instances.clone(),
        );
        weir.register(
            "plugin_instance_waits",
            "Times a new plugin instance waited for a free slot (raise max_plugin_instances)",
            self.plugin_instance_waits.clone(),
        );
        weir.register(
            "topology_mismatches",
            "Differences between the NATS topology and what weir needs",
            self.topology_mismatches.clone(),
        );
        weir.register(
            "reloads",
            "Hot reloads of the config and plugins, by result (applied, refused)",
            self.reloads.clone(),
        );
        weir.register(
            "unit_takeovers",
            "Units taken over from a dead owner whose unacked rows were redelivered",
            self.unit_takeovers.clone(),
        );
        weir.register(
            "coordination_step_downs",
            "Times this host could not renew its member key and stopped pulling",
            self.coordination_step_downs.clone(),
        );
        weir.register(
            "fenced_batches",
            "Batches abandoned unanswered because this host's lease ran out before the sink call or the acks",
            self.fenced_batches.clone(),
        );
        weir.register(
            "units_owned",
            "Units this host pulls",
            self.units_owned.clone(),
        );
    }
}

/// Starts structured logging to stderr: `WEIR_LOG` (or `RUST_LOG`) filters,
/// `WEIR_LOG_FORMAT=json` switches to JSON lines.
pub fn init_logging() {
    init_logging_at("info");
}

/// Logging at `level` for weir's own lines (`WEIR_LOG` or `RUST_LOG` win):
/// a host logs at info, an operator command only warnings unless asked.
pub fn init_logging_at(level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("WEIR_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| {
            EnvFilter::new(format!(
                "{level},wasmtime=warn,cranelift=warn,async_nats=warn"
            ))
        });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let json = std::env::var("WEIR_LOG_FORMAT").is_ok_and(|f| f == "json");
    // A second init (tests start several hosts in one process) is harmless.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// An error and its causes, each said once: a cause whose text the message
/// already carries (thiserror messages often quote their source) is not
/// repeated.
pub fn each_cause_once(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}
