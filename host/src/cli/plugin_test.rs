//! `weir plugin test FILE.wasm --rows rows.ndjson`: runs a plugin on rows
//! without NATS, in the sandbox `weir run` uses (same limits and grants,
//! from the config when given), and prints what it decided for each row.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use serde_json::{Value, json};
use weir::config::{Config, Overrides, PluginConfig};
use weir::coordination::Lease;
use weir::delivery::isolation::{self, ISOLATION_LANES};
use weir::delivery::{Batch, Observer, PipelineRunner, Position, RowOutcome, Stepped};
use weir::ingest::ndjson::{self, Fields, Line};
use weir::sandbox::{
    Admission, CallError, Decision, FailureKind, Plugin, Route, Sandbox, TableRoute, Topology,
    Usage,
};
use weir::state::{ScopeStore, UnitState};
use weir::topology::Unit;
use weir::world::World;

use super::plugin_expect as expect;

/// Instances `weir plugin test` needs at once: one per lane of a
/// deadline's isolation, plus the runner's and room for a retry.
const TEST_POOL_INSTANCES: u32 = ISOLATION_LANES as u32 + 2;
/// Nothing fences `weir plugin test`: its lease outlasts any file.
const TEST_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

#[derive(clap::Args)]
pub struct TestArgs {
    /// The component to run.
    file: PathBuf,
    /// The rows, as the front door takes them: one JSON object per line
    /// (NDJSON), blank lines skipped. Every row has the tenant `--tenant`
    /// and the table `--table`.
    #[arg(long, value_name = "FILE")]
    rows: PathBuf,
    /// The settings handed to `init`, a JSON object (default: the
    /// plugin's settings in `--config`, else `{}`).
    #[arg(long, value_name = "JSON")]
    settings: Option<String>,
    /// The world to run it as (default: the plugin's in `--config`, else
    /// the one world the component implements).
    #[arg(long, value_name = "WORLD", value_enum)]
    world: Option<World>,
    /// A weir config: the plugin runs with its limits, grants and settings
    /// there (needs `--plugin`), its compiled cache and topology.
    #[arg(long, short, value_name = "FILE", requires = "plugin")]
    config: Option<PathBuf>,
    /// The plugin's name in `--config`.
    #[arg(long, value_name = "NAME", requires = "config")]
    plugin: Option<String>,
    /// The tenant of every row (default: the first tenant of `--config`,
    /// else `test`).
    #[arg(long)]
    tenant: Option<String>,
    /// The table of every row (default: the first table of the first
    /// pipeline of `--config` the plugin is in, else `test`).
    #[arg(long)]
    table: Option<String>,
    /// A router's routing field: the top-level field whose value is each
    /// row's key (default: `[policies] routing_field` in `--config`).
    #[arg(long, value_name = "FIELD")]
    routing_field: Option<String>,
    /// A budget's tenant settings (what `weir tenant set` stores), a JSON object.
    #[arg(long, value_name = "JSON")]
    tenant_settings: Option<String>,
    /// Compare each row's outcome with this file's (one JSON outcome per
    /// row, as the scaffolds' `expected.ndjson`): as JSON values, an
    /// emitted JSON payload as JSON. Every difference is printed with its
    /// line and field, and the exit code is 7.
    #[arg(long, value_name = "FILE")]
    expect: Option<PathBuf>,
    /// Print one JSON object instead of text, for scripts.
    #[arg(long)]
    json: bool,
}

/// The plugin failed a call (trap, deadline, memory cap, broken contract):
/// `weir plugin test` exits with its own code (docs/cli.md).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PluginFailed(pub String);

/// A failure's kind as the JSON report names it.
fn kind_name(kind: &FailureKind) -> &'static str {
    match kind {
        FailureKind::Trap => "trap",
        FailureKind::Deadline => "deadline",
        FailureKind::Memory => "memory",
        FailureKind::Refused => "refused",
        FailureKind::Contract => "contract",
    }
}

/// The sandbox `weir run` would build: its compiled cache from the config,
/// else the user's (`~/.cache/weir/compiled`), if there is a home.
pub fn sandbox(config: Option<&Config>) -> anyhow::Result<Sandbox> {
    let sandbox = Sandbox::with_pool(weir::telemetry::Metrics::default(), TEST_POOL_INSTANCES)?;
    Ok(match config {
        Some(config) => sandbox.with_cache(
            config.compile_cache_dir.clone(),
            config.compile_cache_max_bytes,
        ),
        None => match weir::config::user_compile_cache_dir() {
            Some(dir) => sandbox.with_cache(dir, weir::config::DEFAULT_COMPILE_CACHE_MAX_BYTES),
            None => sandbox,
        },
    })
}

/// What happened to one input row.
struct RowReport {
    /// 1-based line in the rows file.
    line: usize,
    answer: Value,
    text: String,
}

impl TestArgs {
    pub async fn run(mut self) -> anyhow::Result<()> {
        let given = match &self.config {
            Some(path) => Some(Config::load(path, &Overrides::default())?),
            None => None,
        };
        // Without a config, the defaults `weir run` has for an empty one.
        let config = match &given {
            Some(config) => config.clone(),
            None => default_config("")?,
        };
        // The rows are read first: a bad line is found before a long compile.
        let body = Bytes::from(
            std::fs::read(&self.rows)
                .with_context(|| format!("cannot read {}", self.rows.display()))?,
        );
        let routing_field = self
            .routing_field
            .clone()
            .or_else(|| config.policies.routing_field.clone());
        let fields = Fields {
            key: None,
            route: routing_field.as_deref(),
        };
        let lines = ndjson::split(&body, fields)
            .map_err(|bad| anyhow::anyhow!("{}: {bad}", self.rows.display()))?;
        let expected = self.expect.as_deref().map(expect::read).transpose()?;

        let sandbox = sandbox(given.as_ref())?;
        let plugin_config = self.plugin_config(&sandbox, given.as_ref()).await?;
        let plugin = sandbox.load(&plugin_config).await?;
        if self.tenant.is_none() {
            self.tenant = config.tenants.first().map(|tenant| tenant.name.clone());
        }
        if self.table.is_none() {
            self.table = config
                .pipelines
                .iter()
                .find(|pipeline| {
                    pipeline.transforms.contains(&plugin_config.name)
                        || pipeline.sink.as_ref() == Some(&plugin_config.name)
                })
                .and_then(|pipeline| pipeline.tables.first().cloned());
        }

        let topology = Topology {
            partitions: config.stream.partitions,
            shards: config.stream.shards,
        };
        let mut reports = Vec::new();
        let failures = match plugin_config.world {
            World::Transform | World::Sink => self.isolating(&plugin, &lines, &mut reports).await?,
            World::Budget => self
                .admit(&plugin, &lines, &mut reports)
                .await
                .err()
                .into_iter()
                .collect(),
            World::Router => self
                .route(&plugin, &lines, topology, &mut reports)
                .await
                .err()
                .into_iter()
                .collect(),
        };
        let differences = expected.map(|expected| {
            let got: Vec<(usize, Value)> = reports
                .iter()
                .map(|report| {
                    let answer = expect::normalize(report.answer.clone(), Some(self.table()));
                    (report.line, answer)
                })
                .collect();
            expect::differences(&got, &expected)
        });
        self.print(
            &plugin,
            lines.len(),
            &reports,
            failures.first(),
            differences.as_deref(),
        );
        if let Some(differences) = differences {
            // Expected failures are outcomes like any other.
            return match differences.len() {
                0 => Ok(()),
                1 => Err(expect::NotAsExpected("1 outcome is not as expected".into()).into()),
                count => Err(expect::NotAsExpected(format!(
                    "{count} outcomes are not as expected"
                ))
                .into()),
            };
        }
        match failures.first() {
            // The first failure in full (the others are printed per row).
            Some(first) => Err(PluginFailed(match failures.len() {
                1 => first.message.clone(),
                count => format!(
                    "{count} rows fail the plugin call; the first: {}",
                    first.message
                ),
            })
            .into()),
            None => Ok(()),
        }
    }

    /// The plugin as `weir run` would load it: from `--config` (with this
    /// file and any `--settings`), or with every default.
    async fn plugin_config(
        &self,
        sandbox: &Sandbox,
        config: Option<&Config>,
    ) -> anyhow::Result<PluginConfig> {
        let wasm = std::path::absolute(&self.file)
            .with_context(|| format!("cannot resolve {}", self.file.display()))?;
        let mut plugin = match (config, &self.plugin) {
            (Some(config), Some(name)) => config.plugins.get(name).cloned().with_context(|| {
                format!(
                    "{}: no plugin `{name}` in the config",
                    config.source.display()
                )
            })?,
            _ => {
                let world = match self.world {
                    Some(world) => world,
                    None => only_world(sandbox, &wasm).await?,
                };
                defaults(&wasm, world)?
            }
        };
        plugin.wasm = wasm;
        if let Some(world) = self.world
            && world != plugin.world
        {
            anyhow::bail!(
                "plugin `{}` is a {} in the config, not a {}",
                plugin.name,
                plugin.world.as_str(),
                world.as_str()
            );
        }
        if let Some(settings) = &self.settings {
            let value: Value = serde_json::from_str(settings).context("--settings")?;
            anyhow::ensure!(value.is_object(), "--settings must be a JSON object");
            plugin.settings = value;
        }
        Ok(plugin)
    }

    /// The rows' tenant: `--tenant`, the config's first, or `test`.
    fn tenant(&self) -> &str {
        self.tenant.as_deref().unwrap_or("test")
    }

    /// The rows' table: `--table`, the plugin's pipeline's first, or `test`.
    fn table(&self) -> &str {
        self.table.as_deref().unwrap_or("test")
    }

    fn batch(&self, lines: &[&Line]) -> Batch {
        let mut batch = Batch::with_capacity(lines.len(), 0);
        for line in lines {
            let position = Position {
                sequence: line.number as u64,
                attempt: 1,
            };
            batch.push(self.tenant(), self.table(), &line.payload, [], position);
        }
        batch
    }

    /// Every row through the transform or sink as delivery runs it: one
    /// pipeline runner of this plugin alone (a plugin granted state in
    /// `--config` keeps it in memory, empty at first), rows isolated as
    /// delivery isolates the rows that fail their plugin, until each
    /// failing row is alone. Returns the errors of the rows that fail on
    /// their own.
    async fn isolating(
        &self,
        plugin: &Arc<Plugin>,
        lines: &[Line],
        reports: &mut Vec<RowReport>,
    ) -> anyhow::Result<Vec<CallError>> {
        let rows = FileRows {
            args: self,
            plugin,
            reports: Arc::new(Reports {
                sink: plugin.config.world == World::Sink,
                rows: Mutex::default(),
            }),
        };
        // The file's rows share one tenant and table: one scope, which
        // sees each row's writes in turn.
        let state = plugin.config.grants.state.map(|_| UnitState {
            store: ScopeStore::in_memory(),
            unit: Unit {
                partition: 0,
                shard: 0,
            },
            metrics: weir::telemetry::Metrics::default(),
        });
        let mut runner = rows.runner(state).context("the plugin's pipeline")?;
        let lease = Lease::until(tokio::time::Instant::now() + TEST_LEASE);
        let packed = self.batch(&lines.iter().collect::<Vec<_>>());
        let mut results = Vec::with_capacity(lines.len());
        isolation::run(&mut runner, &packed, &lease, &mut results).await?;
        let mut failures = Vec::new();
        for (index, result) in results.into_iter().enumerate() {
            let (Err(failure), Some(line)) = (result, lines.get(index)) else {
                continue;
            };
            let error = failure.error;
            reports.push(RowReport {
                line: line.number,
                answer: json!({ "outcome": "failed", "kind": kind_name(&error.kind), "error": error.message }),
                text: format!(
                    "fails its call (retried, then dead-lettered): {}",
                    error.message
                ),
            });
            failures.push(error);
        }
        reports.append(
            &mut rows
                .reports
                .rows
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        reports.sort_by_key(|report| report.line);
        Ok(failures)
    }

    /// One request per row; what the budget admitted counts as queued and
    /// recent for the next (nothing is acked while the file runs).
    async fn admit(
        &self,
        plugin: &Arc<Plugin>,
        lines: &[Line],
        reports: &mut Vec<RowReport>,
    ) -> Result<(), CallError> {
        if let Some(settings) = &self.tenant_settings
            && !serde_json::from_str::<Value>(settings).is_ok_and(|value| value.is_object())
        {
            return Err(CallError {
                kind: weir::sandbox::FailureKind::Refused,
                message: "--tenant-settings must be a JSON object".into(),
            });
        }
        let mut instance = plugin.instantiate().await?;
        let (mut rows, mut bytes) = (0u64, 0u64);
        for line in lines {
            let size = line.payload.len() as u64;
            let request = Admission {
                tenant: self.tenant().to_string(),
                table: self.table().to_string(),
                rows: 1,
                bytes: size,
                usage: Usage {
                    queued_rows: rows,
                    queued_bytes: bytes,
                    recent_rows: rows,
                    recent_bytes: bytes,
                    window_ms: u32::try_from(weir::ingest::RATE_WINDOW.as_millis())
                        .unwrap_or(u32::MAX),
                },
                tenant_settings: self.tenant_settings.clone(),
            };
            let (answer, text) = match instance.admit(&request).await? {
                Decision::Admit => {
                    rows += 1;
                    bytes += size;
                    (json!({ "decision": "admit" }), "admit".to_string())
                }
                Decision::Throttle(ms) => (
                    json!({ "decision": "throttle", "after_ms": ms }),
                    format!("throttle: retry after {ms} ms (429)"),
                ),
                Decision::Reject(reason) => (
                    json!({ "decision": "reject", "reason": reason }),
                    format!("reject (403): {reason}"),
                ),
            };
            reports.push(RowReport {
                line: line.number,
                answer,
                text,
            });
        }
        Ok(())
    }

    /// The table's route, then (when it goes by key) each row's.
    async fn route(
        &self,
        plugin: &Arc<Plugin>,
        lines: &[Line],
        topology: Topology,
        reports: &mut Vec<RowReport>,
    ) -> Result<(), CallError> {
        let mut instance = plugin.instantiate().await?;
        let table_route = instance
            .route_table(topology, self.tenant(), self.table())
            .await?;
        let routes = match table_route {
            TableRoute::Fixed(route) => vec![route; lines.len()],
            TableRoute::ByKey => {
                let keys: Vec<Option<String>> =
                    lines.iter().map(|line| line.route_key.clone()).collect();
                instance
                    .route_keys(topology, self.tenant(), self.table(), &keys)
                    .await?
            }
        };
        let by_key = matches!(table_route, TableRoute::ByKey);
        for (line, route) in lines.iter().zip(routes) {
            let (unit, shown) = match route {
                Route::DefaultRoute => (Value::Null, "default route".to_string()),
                Route::To(unit) => (
                    json!({ "partition": unit.partition, "shard": unit.shard }),
                    format!("partition {} shard {}", unit.partition, unit.shard),
                ),
            };
            let how = if by_key { "by key" } else { "fixed" };
            reports.push(RowReport {
                line: line.number,
                answer: json!({ "table_route": how, "key": line.route_key, "unit": unit }),
                text: match &line.route_key {
                    Some(key) if by_key => format!("{shown} (key {key:?})"),
                    _ => format!("{shown} ({how} for the table)"),
                },
            });
        }
        Ok(())
    }

    fn print(
        &self,
        plugin: &Plugin,
        rows: usize,
        reports: &[RowReport],
        failure: Option<&CallError>,
        differences: Option<&[String]>,
    ) {
        let world = plugin.config.world.as_str();
        if self.json {
            let rows: Vec<Value> = reports
                .iter()
                .map(|report| {
                    let mut row = json!({ "line": report.line });
                    if let (Some(row), Some(answer)) =
                        (row.as_object_mut(), report.answer.as_object())
                    {
                        row.extend(answer.clone());
                    }
                    row
                })
                .collect();
            let failure = failure
                .map(|error| json!({ "kind": kind_name(&error.kind), "message": error.message }));
            let mut out = json!({
                "plugin": plugin.name(),
                "version": plugin.version,
                "world": world,
                "tenant": self.tenant(),
                "table": self.table(),
                "rows": rows,
                "failure": failure,
            });
            if let Some(differences) = differences {
                out["differences"] = json!(differences);
            }
            println!("{out}");
            return;
        }
        println!(
            "{} ({world}, version {}) on {} rows of tenant {} table {}",
            self.file.display(),
            plugin.version,
            rows,
            self.tenant(),
            self.table()
        );
        for report in reports {
            println!("line {}: {}", report.line, report.text);
        }
        if failure.is_some() && reports.len() < rows {
            // The error itself goes to stderr, once, as every error does.
            println!("a call failed: the rows after it were not tried");
        }
        match differences {
            Some([]) => println!("every row as expected"),
            Some(differences) => {
                println!("not as expected:");
                for difference in differences {
                    println!("  {difference}");
                }
            }
            None => {}
        }
    }
}

/// A config holding only this plugin, every limit at its default: the
/// plugin as `weir run` would load it with no limits or grants written.
fn defaults(wasm: &Path, world: World) -> anyhow::Result<PluginConfig> {
    // Named after its file, as far as a plugin name allows.
    let name: String = wasm
        .file_stem()
        .map(|stem| stem.to_string_lossy())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
        .take(64)
        .collect();
    let name = if name.is_empty() {
        "plugin".to_string()
    } else {
        name
    };
    let text = format!(
        "[plugins.{name}]\nwasm = {}\nworld = \"{}\"\n",
        serde_json::to_string(&wasm.display().to_string())?,
        world.as_str()
    );
    default_config(&text)?
        .plugins
        .remove(&name)
        .context("the generated config holds its plugin")
}

/// `text` parsed as a config file in the working directory.
fn default_config(text: &str) -> anyhow::Result<Config> {
    Ok(Config::parse(
        Path::new("weir-plugin-test.toml"),
        text,
        &Overrides::default(),
    )?)
}

/// The one world the component implements, or an error saying which it misses.
async fn only_world(sandbox: &Sandbox, wasm: &Path) -> anyhow::Result<World> {
    let inspection = sandbox.inspect(wasm).await?;
    match inspection.implemented().as_slice() {
        [world] => Ok(*world),
        [] => Err(super::Refused(format!(
            "{} implements no weir world (see `weir plugin check`)",
            wasm.display()
        ))
        .into()),
        several => {
            let names: Vec<&str> = several.iter().map(|world| world.as_str()).collect();
            anyhow::bail!(
                "{} implements several worlds ({}): pick one with --world",
                wasm.display(),
                names.join(", ")
            )
        }
    }
}

/// The plugin the file's rows run through, and what it answered.
struct FileRows<'a> {
    args: &'a TestArgs,
    plugin: &'a Arc<Plugin>,
    reports: Arc<Reports>,
}

impl FileRows<'_> {
    /// A runner of the plugin alone, reporting every answer (its lanes'
    /// too: each failing row is reported on its own).
    fn runner(&self, state: Option<UnitState>) -> Option<PipelineRunner> {
        let name = self.plugin.name().to_string();
        let (transforms, sink) = match self.plugin.config.world {
            World::Sink => (Vec::new(), Some(name)),
            _ => (vec![name], None),
        };
        let pipeline = weir::config::Pipeline {
            tables: vec![self.args.table().to_string()],
            transforms,
            sink,
            bad_lines: Default::default(),
        };
        let runner = PipelineRunner::new(&pipeline, |_| Some(self.plugin.clone()), state)?;
        // A sink granted `postgres` runs its statements for real, and
        // every transaction is rolled back: a test writes nothing.
        let runner = runner.with_destination("weir-plugin-test", false);
        Some(runner.observed(self.reports.clone()))
    }
}

/// Each row's outcome, as the plugin answered it, by line.
struct Reports {
    sink: bool,
    rows: Mutex<Vec<RowReport>>,
}

impl Observer for Reports {
    fn answered(&self, _plugin: &Plugin, given: &Batch, stepped: &Stepped) {
        let mut reports = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        for row in 0..given.len() {
            let outcome = match stepped {
                Stepped::Unchanged => &RowOutcome::Ok,
                Stepped::Changed { outcomes, .. } => match outcomes.get(row) {
                    Some(outcome) => outcome,
                    None => continue,
                },
            };
            let (answer, text) = match (outcome, stepped) {
                (RowOutcome::Ok, _) if self.sink => {
                    (json!({ "outcome": "delivered" }), "delivered".to_string())
                }
                (RowOutcome::Emit(0), _) => (json!({ "outcome": "drop" }), "dropped".to_string()),
                (RowOutcome::Emit(_), Stepped::Changed { rows, parents, .. }) => {
                    let mut emitted = Batch::default();
                    for (new, _) in parents.iter().enumerate().filter(|(_, p)| **p == row) {
                        emitted.push_from(rows, new);
                    }
                    emitted_report(&emitted)
                }
                (other, _) => outcome_report(other),
            };
            reports.push(RowReport {
                line: usize::try_from(given.position(row).sequence).unwrap_or(usize::MAX),
                answer,
                text,
            });
        }
    }
}

/// Retry, dead letter (and ok, for a transform) as text and JSON.
fn outcome_report(outcome: &RowOutcome) -> (Value, String) {
    match outcome {
        RowOutcome::Ok => (json!({ "outcome": "ok" }), "ok".to_string()),
        RowOutcome::Emit(rows) => (
            json!({ "outcome": "emit", "rows": rows }),
            format!("emit {rows} rows"),
        ),
        RowOutcome::Retry(ms) => (
            json!({ "outcome": "retry", "after_ms": ms }),
            format!("retry after {ms} ms"),
        ),
        RowOutcome::DeadLetter(reason) => (
            json!({ "outcome": "dead_letter", "reason": reason }),
            format!("dead-letter: {reason}"),
        ),
    }
}

/// The rows a transform emitted in place of one row: table, payload
/// (as JSON when it is JSON) and headers.
fn emitted_report(emitted: &Batch) -> (Value, String) {
    let mut rows = Vec::new();
    let mut text = match emitted.len() {
        1 => "emit 1 row".to_string(),
        count => format!("emit {count} rows"),
    };
    for index in 0..emitted.len() {
        let bytes = emitted.payload(index);
        let payload = serde_json::from_slice::<Value>(bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()));
        let headers: serde_json::Map<String, Value> = emitted
            .headers(index)
            .map(|(name, value)| (name.to_string(), Value::String(value.to_string())))
            .collect();
        text.push_str(&format!(
            "\n    -> {}: {}",
            emitted.table(index),
            printable(&String::from_utf8_lossy(bytes))
        ));
        if !headers.is_empty() {
            text.push_str(&format!("  headers {}", Value::Object(headers.clone())));
        }
        rows.push(json!({ "table": emitted.table(index), "payload": payload, "headers": headers }));
    }
    (json!({ "outcome": "emit", "emitted": rows }), text)
}

/// `text` with its control characters escaped: a payload printed on one
/// line stays on one line.
fn printable(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    shown
}
