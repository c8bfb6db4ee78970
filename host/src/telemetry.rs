//! Metrics (Prometheus text format) and structured logs. The counters here
//! are also what `/v1/status` and `weir status` report, so both always agree.

pub mod traces;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    pub plugin: String,
}

/// A stateful plugin's scope writes, by how they ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateWriteLabels {
    pub plugin: String,
    /// `stored`, `conflict` (written by another host since it was read),
    /// `purged` or `failed` (KV unavailable).
    pub result: &'static str,
}

/// A plugin's `http-batch` requests, by how each ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginHttpLabels {
    pub plugin: String,
    /// `response` (any status), `refused`, `timeout` or `failed`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginCallLabels {
    pub plugin: String,
    /// `transform`, `sink`, `budget` or `router`.
    pub world: &'static str,
    /// The plugin version (12 hex digits of its SHA-256): a canary's two
    /// versions side by side.
    pub version: String,
}

/// A plugin version: bounded by the config's plugins times the versions
/// a host loaded (the release and at most one canary each, plus those a
/// host ran before a switch).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginVersionLabels {
    pub plugin: String,
    pub version: String,
}

/// What one version of a canaried plugin did with rows.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CanaryLabels {
    pub plugin: String,
    pub version: String,
    /// `serving` (the release) or `candidate`.
    pub role: &'static str,
    /// `ran` (rows it was called with), `dead_lettered` (it asked),
    /// `trapped` (its call failed: trap, memory, contract), `overran` (its
    /// call ran past its deadline).
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginCounterLabels {
    pub plugin: String,
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SeverityLabels {
    /// `required` or `recommended` (a string: telemetry knows nothing of
    /// the topology, which imports it through `nats`).
    pub severity: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `applied` or `refused`.
    pub result: String,
}

/// A front door (`http` or `nats`) and the status code of its answer
/// (NATS answers carry the same codes, in `Weir-Status`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DoorLabels {
    pub door: &'static str,
    pub code: u16,
}

/// A unit, by its consumer's name (`weir_in_0_3`): bounded by the topology.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UnitLabels {
    pub unit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeadLetterLabels {
    /// The plugin that dead-lettered the row or whose calls failed it;
    /// `none` when no plugin was involved (a row no pipeline takes).
    pub plugin: String,
    /// `verdict` (the plugin said so), `retries` (it failed
    /// `max_deliveries` times) or `undeliverable` (no pipeline took it).
    pub cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: &'static str,
    /// `WEIR_GIT_COMMIT` at build time, or `unknown`.
    pub commit: &'static str,
}

/// A histogram family whose histograms share one bucket layout.
pub type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Durations of a request or a batch: 0.5 ms to 16 s, doubling.
fn request_buckets() -> Histogram {
    Histogram::new(readable_buckets(0.000_5, 2.0, 16))
}

/// Plugin calls are shorter: 50 µs to 6.5 s, doubling.
fn call_buckets() -> Histogram {
    Histogram::new(readable_buckets(0.000_05, 2.0, 18))
}

/// Accept-to-ack: 0.5 ms to 28 s in steps of 1.5×, fine enough for a p50
/// and a p99 read from the buckets within a step.
fn latency_buckets() -> Histogram {
    Histogram::new(readable_buckets(0.000_5, 1.5, 28))
}

/// Exponential bucket edges rounded to 4 significant digits: an `le` label
/// reads `0.001125`, not the float error `0.0011250000000000002`.
fn readable_buckets(start: f64, factor: f64, count: u16) -> impl Iterator<Item = f64> {
    exponential_buckets(start, factor, count).map(|edge| {
        let scale = 10f64.powi(3 - edge.log10().floor() as i32);
        (edge * scale).round() / scale
    })
}

/// Every metric a host keeps. Cheap to clone: each metric is an `Arc`.
/// The exported names are in `docs/metrics.md` (a test compares the two).
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Rows JetStream acknowledged at the front door.
    pub rows_accepted: Counter,
    /// Bad lines the front door wrote to the dead-letter stream.
    pub rows_dead_lettered_at_ingest: Counter,
    /// Rows whose pipeline finished and that were acked.
    pub rows_delivered: Counter,
    /// Rows acked because a transform dropped them (and all they became).
    pub rows_dropped: Counter,
    /// Rows acked after being written to the dead-letter stream.
    pub rows_dead_lettered: Counter,
    /// The same rows, by plugin and cause.
    pub dead_letters: Family<DeadLetterLabels, Counter>,
    /// Rows handed back to JetStream for a later retry.
    pub rows_retried: Counter,
    /// Batches run through a pipeline.
    pub batches: Counter,
    /// How long a batch took, from its first row pulled to its last answer.
    pub batch_duration: Histogram,
    /// From a row's storage in its stream (the server's clock) to its ack
    /// (this host's clock), for rows delivered or dead-lettered.
    pub accept_to_ack: Histogram,
    /// Ingest requests refused, by door and status code.
    pub requests_refused: Family<DoorLabels, Counter>,
    /// Ingest request durations, by door and status code (accepted ones too).
    pub request_duration: Histograms<DoorLabels>,
    /// Of the refused, requests the budget throttled (429).
    pub requests_throttled: Counter,
    /// Of the refused, requests the budget rejected (403).
    pub requests_rejected: Counter,
    /// Connections closed at once because too many were open.
    pub connections_refused: Counter,
    /// Plugin calls that trapped, ran out of time or out of memory.
    pub plugin_failures: Family<PluginVersionLabels, Counter>,
    /// Plugin calls made.
    pub plugin_calls: Family<PluginVersionLabels, Counter>,
    /// Rows of canaried plugins, by version, role and outcome.
    pub canary_rows: Family<CanaryLabels, Counter>,
    /// Plugin call durations, by plugin and world.
    pub plugin_call_duration: Histograms<PluginCallLabels>,
    /// Counters plugins keep through the `host.add-counter` import.
    pub plugin_counters: Family<PluginCounterLabels, Counter>,
    /// `add-counter` calls refused: a malformed name, or one name too many.
    pub plugin_counter_refusals: Family<PluginLabels, Counter>,
    /// `http-batch` requests (`fetch-all`), by result.
    pub plugin_http_requests: Family<PluginHttpLabels, Counter>,
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
    /// Units no live member pulls, as this host's watch sees them.
    pub units_unowned: Gauge,
    /// Rows left for each unit this host pulls, as the last row delivered
    /// said (JetStream puts it in every delivery's reply subject).
    pub unit_pending_rows: Family<UnitLabels, Gauge>,
    /// Rows redelivered behind a newer row of their unit that this host had
    /// already received, not handed back for a retry by it: rows lost in
    /// flight (a NATS node's death) and back after the ack wait.
    pub rows_out_of_order: Family<UnitLabels, Counter>,
    /// Scope writes of plugins granted state, by result.
    pub state_writes: Family<StateWriteLabels, Counter>,
    /// Rows a scope had settled already, settled again without a call
    /// (redelivered after their answer was lost).
    pub state_rows_settled_again: Family<PluginLabels, Counter>,
    /// Always 1, labelled with the version and commit.
    pub build_info: Family<BuildLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                commit: option_env!("WEIR_GIT_COMMIT").unwrap_or("unknown"),
            })
            .set(1);
        Metrics {
            rows_accepted: Counter::default(),
            rows_dead_lettered_at_ingest: Counter::default(),
            rows_delivered: Counter::default(),
            rows_dropped: Counter::default(),
            rows_dead_lettered: Counter::default(),
            dead_letters: Family::default(),
            rows_retried: Counter::default(),
            batches: Counter::default(),
            batch_duration: request_buckets(),
            accept_to_ack: latency_buckets(),
            requests_refused: Family::default(),
            request_duration: Family::new_with_constructor(request_buckets),
            requests_throttled: Counter::default(),
            requests_rejected: Counter::default(),
            connections_refused: Counter::default(),
            plugin_failures: Family::default(),
            plugin_http_requests: Family::default(),
            plugin_calls: Family::default(),
            canary_rows: Family::default(),
            plugin_call_duration: Family::new_with_constructor(call_buckets),
            plugin_counters: Family::default(),
            plugin_counter_refusals: Family::default(),
            plugin_instances: Gauge::default(),
            plugin_instance_waits: Counter::default(),
            topology_mismatches: Family::default(),
            reloads: Family::default(),
            unit_takeovers: Counter::default(),
            coordination_step_downs: Counter::default(),
            fenced_batches: Counter::default(),
            units_owned: Gauge::default(),
            units_unowned: Gauge::default(),
            unit_pending_rows: Family::default(),
            rows_out_of_order: Family::default(),
            state_writes: Family::default(),
            state_rows_settled_again: Family::default(),
            build_info,
        }
    }
}

impl Metrics {
    /// Registers every metric under the `weir_` prefix. Counters get their
    /// `_total` suffix from the encoder; the names here are documented in
    /// `docs/metrics.md`.
    pub fn register(&self, registry: &mut Registry) {
        let weir = registry.sub_registry_with_prefix("weir");
        weir.register(
            "build_info",
            "Always 1: the version and git commit of this weir",
            self.build_info.clone(),
        );
        self.register_rows(weir);
        self.register_ingest(weir);
        self.register_plugin_calls(weir);
        self.register_resources(weir);
        self.register_state(weir);
        self.register_coordination(weir);
    }

    /// The row path: rows accepted, delivered, retried and dead-lettered, and
    /// the batches they went through.
    fn register_rows(&self, weir: &mut Registry) {
        weir.register(
            "rows_accepted",
            "Rows acknowledged by JetStream at the front door",
            self.rows_accepted.clone(),
        );
        weir.register(
            "ingest_rows_dead_lettered",
            "Bad lines the front door wrote to the dead-letter stream (bad_lines = dead-letter)",
            self.rows_dead_lettered_at_ingest.clone(),
        );
        weir.register(
            "rows_delivered",
            "Rows that went through their pipeline and were acked",
            self.rows_delivered.clone(),
        );
        weir.register(
            "rows_dropped",
            "Rows acked because a transform dropped them (and every row they became)",
            self.rows_dropped.clone(),
        );
        weir.register(
            "rows_dead_lettered",
            "Rows written to the dead-letter stream",
            self.rows_dead_lettered.clone(),
        );
        weir.register(
            "dead_letters",
            "Rows written to the dead-letter stream, by plugin and cause (verdict, retries, undeliverable)",
            self.dead_letters.clone(),
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
            "batch_duration_seconds",
            "Time from a batch's first row pulled to its last row answered",
            self.batch_duration.clone(),
        );
        weir.register(
            "accept_to_ack_seconds",
            "Time from a row's storage in its stream (server clock) to its ack (host clock)",
            self.accept_to_ack.clone(),
        );
    }

    /// The front door's requests and their refusals.
    fn register_ingest(&self, weir: &mut Registry) {
        weir.register(
            "ingest_request_duration_seconds",
            "Ingest request durations, by door and status code",
            self.request_duration.clone(),
        );
        weir.register(
            "ingest_requests_refused",
            "Ingest requests answered with an error, by door and status code",
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
    }

    /// Plugin calls, their failures and the counters plugins keep.
    fn register_plugin_calls(&self, weir: &mut Registry) {
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
            "plugin_call_duration_seconds",
            "Plugin call durations, by plugin, world and version",
            self.plugin_call_duration.clone(),
        );
        weir.register(
            "canary_rows",
            "Rows of canaried plugins, by version, role (serving, candidate) and outcome",
            self.canary_rows.clone(),
        );
        weir.register(
            "plugin_http_requests",
            "Requests plugins sent through http-batch, by result",
            self.plugin_http_requests.clone(),
        );
        weir.register(
            "plugin_counter_refusals",
            "Plugin counters refused (a malformed name, or more than 64 names)",
            self.plugin_counter_refusals.clone(),
        );
        weir.register(
            "plugin_counter",
            "Counters kept by plugins (at most 64 names per plugin version)",
            self.plugin_counters.clone(),
        );
    }

    /// What this host holds: connections, plugin instances, the topology it
    /// checked and the reloads it applied.
    fn register_resources(&self, weir: &mut Registry) {
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
    }

    /// Plugin state: scope writes and rows settled again.
    fn register_state(&self, weir: &mut Registry) {
        weir.register(
            "state_writes",
            "Scope writes of plugins granted state, by result (stored, conflict, purged, failed)",
            self.state_writes.clone(),
        );
        weir.register(
            "state_rows_settled_again",
            "Rows redelivered that their plugin's state had settled already, settled again without a call",
            self.state_rows_settled_again.clone(),
        );
    }

    /// Coordination: units owned, taken over and fenced, and what is left
    /// in each.
    fn register_coordination(&self, weir: &mut Registry) {
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
        weir.register(
            "units_unowned",
            "Units no live member pulls, as this host's watch sees them",
            self.units_unowned.clone(),
        );
        weir.register(
            "unit_pending_rows",
            "Rows left for a unit this host pulls, as of its last delivered row",
            self.unit_pending_rows.clone(),
        );
        weir.register(
            "rows_out_of_order",
            "Rows redelivered behind a newer row of their unit, other than retries this host asked for",
            self.rows_out_of_order.clone(),
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
/// Colours only when stderr is a terminal: a file or a collector gets none.
pub fn init_logging_at(level: &str) {
    use std::io::IsTerminal;
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
        builder
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(FlatJson)
            .try_init()
    } else {
        builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init()
    };
}

/// One JSON object per line with every field at the top: `timestamp`,
/// `level`, `target`, `span` (the innermost span's name), the fields of
/// every span the event is in (outermost first), then the event's own
/// fields (`message` among them). An event field wins over a span's.
struct FlatJson;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for FlatJson
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        use serde_json::{Map, Value};
        use tracing_subscriber::fmt::FormattedFields;
        let meta = event.metadata();
        let mut object = Map::new();
        let now = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        object.insert("timestamp".into(), Value::String(now));
        object.insert("level".into(), Value::String(meta.level().as_str().into()));
        object.insert("target".into(), Value::String(meta.target().into()));
        if let Some(scope) = ctx.event_scope() {
            let mut innermost = None;
            for span in scope.from_root() {
                innermost = Some(span.name());
                let extensions = span.extensions();
                // Span fields were written by `JsonFields`: a JSON object.
                if let Some(fields) = extensions.get::<FormattedFields<N>>()
                    && let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields)
                {
                    object.extend(fields);
                }
            }
            if let Some(name) = innermost {
                object.insert("span".into(), Value::String(name.into()));
            }
        }
        event.record(&mut JsonVisitor(&mut object));
        writeln!(writer, "{}", Value::Object(object))
    }
}

/// Writes an event's fields into a JSON object, numbers as numbers.
struct JsonVisitor<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl tracing::field::Visit for JsonVisitor<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}

#[cfg(test)]
#[test]
fn bucket_edges_print_without_float_noise() {
    let edges: Vec<String> = readable_buckets(0.000_5, 1.5, 28)
        .map(|edge| edge.to_string())
        .collect();
    assert_eq!(edges[..4], ["0.0005", "0.00075", "0.001125", "0.001688"]);
    assert!(edges.iter().all(|edge| edge.len() <= 9), "{edges:?}");
}

/// `count` and the noun for it: "1 row", "2 rows" (`many` for every count but 1).
pub fn plural(count: impl TryInto<u64>, one: &str, many: &str) -> String {
    let count: u64 = count.try_into().unwrap_or(u64::MAX);
    format!("{count} {}", if count == 1 { one } else { many })
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
