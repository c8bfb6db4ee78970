//! A loaded plugin version (`Plugin`: compiled, linked, ready to
//! instantiate) and its instances: each with its own store
//! ([`PluginState`]), memory cap (`Limiter`) and per-call deadline,
//! discarded after a failed call and recycled before its memory grows
//! without bound; a trap is quoted from the tail of its stderr.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use wasmtime::component::ResourceTable;
use wasmtime::{Engine, Store, StoreLimits};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder};
use wasmtime_wasi_http::WasiHttpCtx;

use crate::config::PluginConfig;
use crate::telemetry::{Metrics, PluginCallLabels, PluginLabels, PluginVersionLabels};

use super::bindings::{
    Admission, Batch, Decision, Delivered, Route, TableRoute, Topology, Transformed,
};
use super::http::HttpGate;
use super::served;
use super::worlds::{Exports, PluginPre};
use super::*;

/// Pause before a new instance tries the full pool again.
const POOL_FULL_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);
/// At most one warning per plugin waiter this often while the pool stays full.
const POOL_FULL_WARNING_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// Why an instance could not be made.
enum Instantiate {
    /// Every slot of the pool is taken (the limit, as wasmtime words it).
    PoolFull(String),
    Failed(CallError),
}

impl From<CallError> for Instantiate {
    fn from(error: CallError) -> Instantiate {
        Instantiate::Failed(error)
    }
}

/// What went wrong in one plugin call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureKind {
    /// The guest trapped (a panic, an unreachable, a bad access).
    Trap,
    /// The call ran past its deadline and was interrupted.
    Deadline,
    /// The guest tried to grow its memory past its cap.
    Memory,
    /// `init` returned an error.
    Refused,
    /// The plugin broke the contract (e.g. wrong number of outcomes).
    Contract,
}

/// A failed plugin call; the instance that made it is discarded.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    pub kind: FailureKind,
    pub message: String,
}

/// One loaded version of a plugin: compiled, linked, ready to instantiate.
pub struct Plugin {
    pub config: PluginConfig,
    /// Content digest of the `.wasm`.
    pub version: String,
    pub(super) settings_json: String,
    pub(super) pre: PluginPre<PluginState>,
    pub(super) engine: Engine,
    pub(super) metrics: Metrics,
    pub(super) labels: PluginLabels,
    pub(super) version_labels: PluginVersionLabels,
    pub(super) call_labels: PluginCallLabels,
    /// The counter names this version has used (`add-counter`), bounded.
    pub(super) counter_names: Mutex<std::collections::HashSet<String>>,
    /// The process's pauses, taken off this plugin's deadlines.
    pub(super) pauses: Arc<super::Pauses>,
    /// The database of its `grants.postgres`, if any.
    pub postgres: Option<Arc<crate::destination::PgPool>>,
    /// The object store of its `grants.objects`, if any.
    pub objects: Option<crate::destination::ObjectsDestination>,
    /// Keep-alive connections of its `grants.http`, shared by its instances.
    pub(super) http_pool: Option<super::http::HttpPool>,
    /// Places for its `http-batch` requests in flight (`http_max_in_flight`),
    /// shared by its instances.
    pub(super) http_in_flight: Arc<tokio::sync::Semaphore>,
    /// Its component imports `json-members`: each call's store keeps the
    /// batch's bytes for it (a copy, so only for plugins that read them).
    pub(super) reads_json_members: bool,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.config.name)
            .field("version", &self.version)
            .finish()
    }
}

impl Plugin {
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Asks its granted object store, if any, for one listing under the
    /// grant's prefix: a missing bucket, refused keys or an unreachable
    /// endpoint, named by the grant (`weir check`).
    pub async fn probe_objects(&self) -> Result<(), String> {
        let Some(objects) = &self.objects else {
            return Ok(());
        };
        objects
            .store
            .probe(&objects.grant.target.prefix)
            .await
            .map_err(|err| format!("plugin `{}`: grants.objects: {err}", self.name()))
    }

    /// A fresh instance with its own store, limits and grants, `init`-ed.
    /// When the instance pool is full, waits for a slot (back-pressure)
    /// rather than failing the rows: a full pool is the host's limit, not
    /// the plugin's fault.
    pub async fn instantiate(self: &Arc<Self>) -> Result<PluginInstance, CallError> {
        let mut warned: Option<Instant> = None;
        loop {
            match self.try_instantiate().await {
                Err(Instantiate::PoolFull(limit)) => {
                    self.metrics.plugin_instance_waits.inc();
                    if warned.is_none_or(|at| at.elapsed() >= POOL_FULL_WARNING_PERIOD) {
                        tracing::warn!(
                            plugin = self.name(),
                            %limit,
                            "the plugin instance pool is full; waiting for a free slot (raise `max_plugin_instances`)"
                        );
                        warned = Some(Instant::now());
                    }
                    tokio::time::sleep(POOL_FULL_PAUSE).await;
                }
                Err(Instantiate::Failed(error)) => return Err(error),
                Ok(instance) => return Ok(instance),
            }
        }
    }

    async fn try_instantiate(self: &Arc<Self>) -> Result<PluginInstance, Instantiate> {
        let stderr = StderrTail::default();
        let mut wasi = WasiCtxBuilder::new();
        wasi.stderr(stderr.clone());
        for (name, value) in &self.config.grants.env {
            wasi.env(name, value);
        }
        for grant in &self.config.grants.dirs {
            let perms = if grant.writable {
                FsPerms::ReadWrite
            } else {
                FsPerms::ReadOnly
            };
            wasi.preopened_dir(&grant.host, &grant.guest, perms)
                .map_err(|err| CallError {
                    kind: FailureKind::Refused,
                    message: format!(
                        "cannot open granted directory {}: {err:#}",
                        grant.host.display()
                    ),
                })?;
        }
        let limits = wasmtime::StoreLimitsBuilder::new()
            .memory_size(self.config.memory_bytes)
            .trap_on_grow_failure(true)
            .build();
        let state = PluginState {
            wasi: wasi.build(),
            http: WasiHttpCtx::new(),
            gate: HttpGate {
                plugin: self.config.name.clone(),
                allowed: self.config.grants.http.clone(),
                call_ends: Instant::now(),
                deadline: self.config.deadline,
                pool: self.http_pool.clone(),
                keep_alive: self.config.http_keep_alive,
                in_flight: self.http_in_flight.clone(),
                max_body_bytes: self.config.memory_bytes,
            },
            table: ResourceTable::new(),
            limits: Limiter {
                limits,
                memory_bytes: 0,
                refused_growth: false,
            },
            plugin: self.clone(),
            call_ends: std::time::Instant::now(),
            paused_before: Duration::ZERO,
            state: None,
            postgres: None,
            nats: None,
            objects: None,
            batch: None,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.limits);
        // Every epoch tick, a running call yields to the executor (so a long
        // call never starves the host's other tasks) until its deadline passes.
        store.epoch_deadline_callback(|context| {
            let state = context.data();
            let pauses = &state.plugin.pauses;
            let paused = pauses.total().saturating_sub(state.paused_before);
            let now = std::time::Instant::now();
            let over = now >= state.call_ends + paused;
            Ok(if over && pauses.current_at(now) {
                wasmtime::UpdateDeadline::Interrupt
            } else {
                wasmtime::UpdateDeadline::Yield(1)
            })
        });
        let mut instance = PluginInstance {
            store,
            exports: Exports::None,
            plugin: self.clone(),
            stderr,
            batches: 0,
            memory_after_init: 0,
        };
        instance.arm_deadline();
        let exports = self.pre.instantiate(&mut instance.store).await;
        instance.exports = exports.map_err(|err| {
            match err.downcast_ref::<wasmtime::PoolConcurrencyLimitError>() {
                Some(full) => Instantiate::PoolFull(full.to_string()),
                None => Instantiate::Failed(instance.failure(err)),
            }
        })?;
        self.metrics.plugin_instances.inc();

        instance.arm_deadline();
        let settings = self.settings_json.as_str();
        let result = instance
            .exports
            .call_init(&mut instance.store, settings)
            .await;
        match result {
            Ok(Ok(())) => {
                instance.memory_after_init = instance.memory_bytes();
                Ok(instance)
            }
            Ok(Err(reason)) => Err(Instantiate::Failed(CallError {
                kind: FailureKind::Refused,
                message: format!(
                    "init refused its settings: {}{}",
                    escape_line(reason.trim()),
                    // What the guest printed before refusing, such as a stack.
                    instance.stderr.block()
                ),
            })),
            Err(err) => Err(Instantiate::Failed(instance.failure(err))),
        }
    }
}

/// A live instance of one plugin version. Not shared: one caller at a time.
pub struct PluginInstance {
    pub(super) store: Store<PluginState>,
    pub(super) exports: Exports,
    pub(super) plugin: Arc<Plugin>,
    pub(super) stderr: StderrTail,
    pub(super) batches: u64,
    /// Linear memory right after `init`: growth is measured from here.
    pub(super) memory_after_init: usize,
}

impl PluginInstance {
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    /// True once the instance has served enough batches, or its memory has
    /// grown enough since `init`, to be replaced by a fresh one.
    pub fn worn_out(&self) -> bool {
        let grown = self
            .store
            .data()
            .limits
            .memory_bytes
            .saturating_sub(self.memory_after_init);
        self.batches >= self.plugin.config.recycle_after_batches
            || grown >= self.plugin.config.recycle_after_growth_bytes
    }

    /// Hands the next call the state it may read and write.
    pub fn give_state(&mut self, state: crate::state::batch::BatchState) {
        self.store.data_mut().state = Some(state);
    }

    /// Takes back what [`PluginInstance::give_state`] gave, with the call's writes.
    pub fn take_state(&mut self) -> Option<crate::state::batch::BatchState> {
        self.store.data_mut().state.take()
    }

    /// Hands the next call the transaction its `postgres` statements run in.
    pub fn give_postgres(&mut self, call: crate::destination::PgCall) {
        self.store.data_mut().postgres = Some(call);
    }

    /// Takes back what [`PluginInstance::give_postgres`] gave, after the call.
    pub fn take_postgres(&mut self) -> Option<crate::destination::PgCall> {
        self.store.data_mut().postgres.take()
    }

    /// Hands the next call the buffer its `nats` publishes go to.
    pub fn give_nats(&mut self, call: crate::destination::PublishCall) {
        self.store.data_mut().nats = Some(call);
    }

    /// Takes back what [`PluginInstance::give_nats`] gave, with the call's publishes.
    pub fn take_nats(&mut self) -> Option<crate::destination::PublishCall> {
        self.store.data_mut().nats.take()
    }

    /// Hands the next call the buffer its `objects` appends go to.
    pub fn give_objects(&mut self, call: crate::destination::ObjectsCall) {
        self.store.data_mut().objects = Some(call);
    }

    /// Takes back what [`PluginInstance::give_objects`] gave, with the call's appends.
    pub fn take_objects(&mut self) -> Option<crate::destination::ObjectsCall> {
        self.store.data_mut().objects.take()
    }

    /// Linear memory the instance has now, in bytes.
    pub fn memory_bytes(&self) -> usize {
        self.store.data().limits.memory_bytes
    }

    pub(super) fn arm_deadline(&mut self) {
        let call_ends = Instant::now() + self.plugin.config.deadline;
        let state = self.store.data_mut();
        state.call_ends = call_ends;
        state.paused_before = state.plugin.pauses.total();
        state.gate.call_ends = call_ends;
        self.store.set_epoch_deadline(1);
    }

    /// Counts a call and arms its deadline; returns when it began, for
    /// [`PluginInstance::end_call`].
    pub(super) fn begin_call(&mut self) -> Instant {
        self.stderr.clear();
        self.arm_deadline();
        self.batches += 1;
        self.plugin
            .metrics
            .plugin_calls
            .get_or_create(&self.plugin.version_labels)
            .inc();
        Instant::now()
    }

    /// Records a call's duration, failed or not.
    fn end_call<T>(&self, began: Instant, result: T) -> T {
        self.plugin
            .metrics
            .plugin_call_duration
            .get_or_create(&self.plugin.call_labels)
            .observe(began.elapsed().as_secs_f64());
        result
    }

    /// Gives the call's `json-members` the batch's bytes, for a plugin
    /// that imports it.
    fn keep_batch(store: &mut Store<PluginState>, rows: &Batch) {
        if store.data().plugin.reads_json_members {
            store.data_mut().batch = Some(Batch {
                data: rows.data.clone(),
                rows: rows.rows.clone(),
                sequences: Vec::new(),
                attempts: Vec::new(),
                headers: Vec::new(),
            });
        }
    }

    /// Runs a transform over a packed batch. The caller checks the answer
    /// against the batch as it reads it: the sandbox only runs the call.
    pub async fn transform(&mut self, rows: &Batch) -> Result<Transformed, CallError> {
        let began = self.begin_call();
        let result = match &self.exports {
            Exports::Transform(exports) => {
                Self::keep_batch(&mut self.store, rows);
                exports.call_transform(&mut self.store, rows).await
            }
            Exports::TransformV0_2(exports) => {
                Self::keep_batch(&mut self.store, rows);
                let rows = served::batch_v0_2(rows);
                let answer = exports.call_transform(&mut self.store, &rows).await;
                answer.map(served::transformed)
            }
            _ => return Err(self.contract("is not a transform")),
        }
        .map_err(|err| self.failure(err));
        self.store.data_mut().batch = None;
        self.end_call(began, result)
    }

    /// Hands a packed batch to a sink; the caller checks the answer.
    pub async fn deliver(&mut self, rows: &Batch) -> Result<Delivered, CallError> {
        let began = self.begin_call();
        let result = match &self.exports {
            Exports::Sink(exports) => {
                Self::keep_batch(&mut self.store, rows);
                exports.call_deliver(&mut self.store, rows).await
            }
            Exports::SinkV0_2(exports) => {
                Self::keep_batch(&mut self.store, rows);
                let rows = served::batch_v0_2(rows);
                let answer = exports.call_deliver(&mut self.store, &rows).await;
                answer.map(served::delivered)
            }
            _ => return Err(self.contract("is not a sink")),
        }
        .map_err(|err| self.failure(err));
        self.store.data_mut().batch = None;
        self.end_call(began, result)
    }

    /// Asks a budget about one request.
    pub async fn admit(&mut self, request: &Admission) -> Result<Decision, CallError> {
        let began = self.begin_call();
        let Exports::Budget(exports) = &self.exports else {
            return Err(self.contract("is not a budget"));
        };
        let result = exports
            .call_admit(&mut self.store, request)
            .await
            .map_err(|err| self.failure(err));
        self.end_call(began, result)
    }

    /// Asks a router how a table's rows are routed.
    pub async fn route_table(
        &mut self,
        topology: Topology,
        tenant: &str,
        table: &str,
    ) -> Result<TableRoute, CallError> {
        let began = self.begin_call();
        let Exports::Router(exports) = &self.exports else {
            return Err(self.contract("is not a router"));
        };
        let result = exports
            .call_route_table(&mut self.store, topology, tenant, table)
            .await
            .map_err(|err| self.failure(err));
        self.end_call(began, result)
    }

    /// Asks a router for the route of each key of one request.
    pub async fn route_keys(
        &mut self,
        topology: Topology,
        tenant: &str,
        table: &str,
        keys: &[Option<String>],
    ) -> Result<Vec<Route>, CallError> {
        let began = self.begin_call();
        let Exports::Router(exports) = &self.exports else {
            return Err(self.contract("is not a router"));
        };
        let routes = exports
            .call_route_keys(&mut self.store, topology, tenant, table, keys)
            .await
            .map_err(|err| self.failure(err));
        let routes = self.end_call(began, routes)?;
        if routes.len() != keys.len() {
            return Err(self.contract(&format!(
                "returned {} routes for {} keys",
                routes.len(),
                keys.len()
            )));
        }
        Ok(routes)
    }

    /// The plugin broke the WIT contract (`what` it did), e.g. an answer
    /// that does not fit the batch it was given.
    pub fn contract(&self, what: &str) -> CallError {
        self.count_failure();
        CallError {
            kind: FailureKind::Contract,
            message: format!("plugin `{}` {what}", self.plugin.name()),
        }
    }

    pub(super) fn count_failure(&self) {
        self.plugin
            .metrics
            .plugin_failures
            .get_or_create(&self.plugin.version_labels)
            .inc();
    }

    /// Classifies a wasmtime error and adds the guest's last stderr words.
    pub(super) fn failure(&self, err: wasmtime::Error) -> CallError {
        self.count_failure();
        let limit = &self.plugin.config;
        let (kind, what) = match err.downcast_ref::<wasmtime::Trap>() {
            Some(wasmtime::Trap::Interrupt) => (
                FailureKind::Deadline,
                format!("ran past its deadline of {} ms", limit.deadline.as_millis()),
            ),
            _ if self.store.data().limits.refused_growth => (
                FailureKind::Memory,
                format!(
                    "tried to grow memory past its cap of {} MiB",
                    limit.memory_bytes >> 20
                ),
            ),
            // The trap itself, not the wasm backtrace wasmtime wraps it in.
            Some(trap) => (FailureKind::Trap, format!("trapped ({trap})")),
            None => (FailureKind::Trap, format!("trapped ({})", err.root_cause())),
        };
        // A guest prints its cause to stderr before it traps: a Rust panic
        // message, a Python traceback, a JS error and its stack.
        let message = format!(
            "plugin `{}` {what}{}",
            self.plugin.name(),
            self.stderr.quoted()
        );
        CallError { kind, message }
    }
}

impl Drop for PluginInstance {
    fn drop(&mut self) {
        if !matches!(self.exports, Exports::None) {
            self.plugin.metrics.plugin_instances.dec();
        }
    }
}

/// The store's limits, plus a tally of how much linear memory the instance
/// has grown to: a warm instance is recycled when it has grown too much.
pub(super) struct Limiter {
    pub(super) limits: StoreLimits,
    pub(super) memory_bytes: usize,
    /// Set when a growth past the cap was refused (which traps): how a
    /// failed call is known to be a memory failure, not by its message.
    pub(super) refused_growth: bool,
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self
            .limits
            .memory_growing(current, desired, maximum)
            .inspect_err(|_| self.refused_growth = true)?;
        if allowed {
            self.memory_bytes += desired.saturating_sub(current);
        } else {
            self.refused_growth = true;
        }
        Ok(allowed)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.limits.memory_grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.limits.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.limits.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.limits.instances()
    }

    fn tables(&self) -> usize {
        self.limits.tables()
    }

    fn memories(&self) -> usize {
        self.limits.memories()
    }
}

/// What each store holds: the empty-by-default WASI context, the limits,
/// and who the plugin is (for its logs and counters).
pub struct PluginState {
    pub(super) wasi: WasiCtx,
    /// Used only through the `http_linker`, by plugins importing `wasi:http`.
    pub(super) http: WasiHttpCtx,
    pub(super) gate: HttpGate,
    pub(super) table: ResourceTable,
    pub(super) limits: Limiter,
    pub(super) plugin: Arc<Plugin>,
    /// When the running call must have returned, not counting pauses of
    /// the whole process since `paused_before` (of [`super::Pauses`]).
    pub(super) call_ends: std::time::Instant,
    pub(super) paused_before: Duration,
    /// The state a call of a plugin granted `state` may use; `None` outside
    /// such a call, and always for a plugin without the grant.
    pub(super) state: Option<crate::state::batch::BatchState>,
    /// The transaction a call of a sink granted `postgres` writes in;
    /// `None` outside such a call, and always without the grant.
    pub(super) postgres: Option<crate::destination::PgCall>,
    /// What a call of a sink granted `nats` publishes; `None` outside such
    /// a call, and always without the grant.
    pub(super) nats: Option<crate::destination::PublishCall>,
    /// What a call of a sink granted `objects` appends; `None` outside
    /// such a call, and always without the grant.
    pub(super) objects: Option<crate::destination::ObjectsCall>,
    /// The running transform's or sink's batch, for `json-members`; `None`
    /// outside a call, and always for a plugin that does not import it.
    pub(super) batch: Option<Batch>,
}

/// A plugin's stderr, of which only the tail is kept: enough to quote a
/// panic message when the call traps, never a growing buffer.
#[derive(Clone, Default)]
pub(super) struct StderrTail(Arc<Mutex<Vec<u8>>>);

impl StderrTail {
    /// Forgets what earlier calls wrote, so a trap is explained by its own call.
    pub(super) fn clear(&self) {
        if let Ok(mut bytes) = self.0.lock() {
            bytes.clear();
        }
    }

    /// The guest's last stderr lines as a trap's reason quotes them: the
    /// last line after `: ` (a panic message, `KeyError: 'id'`), the lines
    /// before it below, each indented with `  | ` and its control
    /// characters escaped, so a guest cannot forge host log lines. Empty
    /// when the call wrote nothing.
    pub(super) fn quoted(&self) -> String {
        let Ok(bytes) = self.0.lock() else {
            return String::new();
        };
        quote_tail(&String::from_utf8_lossy(&bytes))
    }

    /// Every line the guest wrote, quoted as the lines of [`Self::quoted`].
    pub(super) fn block(&self) -> String {
        let Ok(bytes) = self.0.lock() else {
            return String::new();
        };
        quote_block(
            &meaningful_lines(&String::from_utf8_lossy(&bytes)),
            STDERR_TAIL_BYTES,
        )
    }
}

/// See [`StderrTail::quoted`]; a pure function of the captured text.
fn quote_tail(text: &str) -> String {
    let mut lines = meaningful_lines(text);
    let Some(last) = lines.pop() else {
        return String::new();
    };
    let last = escape_line(last.trim());
    let block = quote_block(&lines, STDERR_TAIL_BYTES.saturating_sub(last.len()));
    format!(": {last}{block}")
}

/// Lines worth quoting: not blank, not Rust's backtrace hint.
fn meaningful_lines(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim_end)
        .filter(|line| !line.trim().is_empty() && !line.contains("note: run with"))
        .collect()
}

/// `lines` each on its own line after `  | `, the latest kept when they
/// exceed `budget` bytes once escaped (the reason stays bounded).
fn quote_block(lines: &[&str], budget: usize) -> String {
    let mut kept = Vec::new();
    let mut bytes = 0;
    for line in lines.iter().rev() {
        let quoted = format!("\n  | {}", escape_line(line));
        bytes += quoted.len();
        if bytes > budget {
            break;
        }
        kept.push(quoted);
    }
    kept.reverse();
    kept.concat()
}

/// A line with its control characters (escapes, carriage returns) written
/// out, tabs kept: a traceback stays readable, a forged log line does not.
fn escape_line(line: &str) -> String {
    let mut escaped = String::with_capacity(line.len());
    for c in line.chars() {
        if c.is_control() && c != '\t' {
            escaped.extend(c.escape_default());
        } else {
            escaped.push(c);
        }
    }
    escaped
}

impl IsTerminal for StderrTail {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for StderrTail {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl tokio::io::AsyncWrite for StderrTail {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if let Ok(mut tail) = self.0.lock() {
            tail.extend_from_slice(buf);
            if tail.len() > STDERR_TAIL_BYTES {
                let excess = tail.len() - STDERR_TAIL_BYTES;
                tail.drain(..excess);
            }
        }
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceback_is_quoted_whole_with_its_last_line_first() {
        let text = "Traceback (most recent call last):\n  File \"app.py\", line 7, in transform\n    row[\"id\"]\nKeyError: 'id'\n";
        assert_eq!(
            quote_tail(text),
            ": KeyError: 'id'\n  | Traceback (most recent call last):\n  |   File \"app.py\", line 7, in transform\n  |     row[\"id\"]"
        );
    }

    #[test]
    fn a_rust_panic_drops_the_backtrace_hint_and_nothing_is_quoted_from_silence() {
        let text = "thread '<unnamed>' panicked at src/lib.rs:1:1:\nboom\nnote: run with `RUST_BACKTRACE=1`\n";
        assert_eq!(
            quote_tail(text),
            ": boom\n  | thread '<unnamed>' panicked at src/lib.rs:1:1:"
        );
        assert_eq!(quote_tail("\n  \n"), "");
    }

    #[test]
    fn a_guest_cannot_forge_a_host_log_line_or_grow_the_reason_unbounded() {
        let forged = quote_tail("x\r\u{1b}[31m INFO weir: forged\nlast");
        assert_eq!(forged, ": last\n  | x\\r\\u{1b}[31m INFO weir: forged");
        let long: String = (0..2000).map(|n| format!("line {n}\n")).collect();
        let quoted = quote_tail(&long);
        assert!(quoted.len() <= STDERR_TAIL_BYTES + 2, "{}", quoted.len());
        assert!(quoted.starts_with(": line 1999\n  | "), "{quoted}");
        assert!(quoted.ends_with("  | line 1998"), "{quoted}");
    }
}
