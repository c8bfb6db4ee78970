//! The sandbox: one wasmtime `Engine` per process, a compiled component and
//! an `InstancePre` per plugin version, and instances whose every call is
//! bounded in memory (`StoreLimits`) and CPU time (epoch interruption).
//!
//! Architecture invariant: a plugin reaches nothing it was not granted. WASI
//! is linked because every std guest imports it, but the context is empty:
//! no preopens, no environment, no sockets, unless the TOML grants them.
//! `wasi:http` is linked only for plugins with `grants.http`, and each of
//! their requests must go to an authority in that list.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmtime::component::{Component, HasSelf, Linker, ResourceTable, types::ComponentItem};
use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, StoreLimits};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{
    RequestOptions, WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView,
};

use crate::config::{PluginConfig, World};
use crate::telemetry::{Metrics, PluginCounterLabels, PluginLabels};

/// Host bindings generated from `wit/`; the types in them are the ones that
/// cross the boundary.
pub mod bindings {
    pub mod transform {
        wasmtime::component::bindgen!({
            path: "../wit",
            world: "weir:plugin/transform",
            exports: { default: async },
        });
    }
    pub mod sink {
        wasmtime::component::bindgen!({
            path: "../wit",
            world: "weir:plugin/sink",
            exports: { default: async },
            with: {
                "weir:plugin/types": super::transform::weir::plugin::types,
                "weir:plugin/host": super::transform::weir::plugin::host,
            },
        });
    }
    pub mod budget {
        wasmtime::component::bindgen!({
            path: "../wit",
            world: "weir:plugin/budget",
            exports: { default: async },
            with: {
                "weir:plugin/host": super::transform::weir::plugin::host,
            },
        });
    }
    pub mod router {
        wasmtime::component::bindgen!({
            path: "../wit",
            world: "weir:plugin/router",
            exports: { default: async },
            with: {
                "weir:plugin/host": super::transform::weir::plugin::host,
                "weir:plugin/policy": super::budget::weir::plugin::policy,
            },
        });
    }
    pub use budget::weir::plugin::policy::{
        Admission, Decision, Route, TableRoute, Topology, Unit as RouteUnit, Usage,
    };
    pub use sink::weir::plugin::types::Delivered;
    pub use transform::weir::plugin::types::{Batch, Transformed};
}

use crate::batch::Batch;
use bindings::budget::{Budget, BudgetPre};
use bindings::router::{Router as RouterPolicy, RouterPre};
use bindings::sink::{Sink, SinkPre};
use bindings::transform::weir::plugin::host::{self as host_api, Level};
use bindings::transform::{Transform, TransformPre};
use bindings::{Admission, Decision, Delivered, Route, TableRoute, Topology, Transformed};

/// The version of the `weir:plugin` WIT package (`wit/types.wit`) this host speaks.
pub const WIT_VERSION: &str = "0.2.0";
/// How often the epoch advances: the granularity of every call deadline,
/// and how often a running call yields to the executor.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);
/// Instances the pooling allocator keeps slots for. Each unit holds at most
/// one instance per pipeline step, so this bounds units × steps per host.
const POOL_INSTANCES: u32 = 256;
/// Core instances per component: a std wasip2 guest has a handful.
const POOL_CORE_INSTANCES_PER_COMPONENT: u32 = 16;
/// Per-memory address space the pool reserves; per-plugin caps are lower.
const POOL_MAX_MEMORY_BYTES: usize = (crate::config::MAX_PLUGIN_MEMORY_MB as usize) << 20;
/// The tail of a plugin's stderr kept to explain a trap (a Rust panic prints there).
const STDERR_TAIL_BYTES: usize = 4096;
/// Longest log line a plugin may write through the host import.
const MAX_LOG_BYTES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot configure the wasm engine: {0:#}")]
    Engine(wasmtime::Error),
}

/// Why a plugin version could not be loaded. Each names the plugin and file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("plugin `{plugin}`: cannot read {path}: {source}")]
    Read {
        plugin: String,
        path: String,
        source: std::io::Error,
    },
    #[error("plugin `{plugin}`: {path} is not a valid WebAssembly component: {reason}")]
    Compile {
        plugin: String,
        path: String,
        reason: String,
    },
    #[error(
        "plugin `{plugin}`: {path} does not implement world `weir:plugin/{world}@{WIT_VERSION}`: missing export {missing}"
    )]
    WrongWorld {
        plugin: String,
        path: String,
        world: &'static str,
        missing: String,
    },
    #[error(
        "plugin `{plugin}`: {path} was built against `weir:plugin@{found}`; this weir speaks `weir:plugin@{WIT_VERSION}`: rebuild it with the matching SDK"
    )]
    WrongVersion {
        plugin: String,
        path: String,
        found: String,
    },
    #[error("plugin `{plugin}`: {path} imports something weir does not provide: {reason}")]
    Link {
        plugin: String,
        path: String,
        reason: String,
    },
    #[error(
        "plugin `{plugin}`: {path} imports `{import}` but has no `{grant}`; add the `host:port` authorities it may reach"
    )]
    Ungranted {
        plugin: String,
        path: String,
        import: String,
        /// The TOML key that would grant the import.
        grant: &'static str,
    },
    #[error("plugin `{plugin}`: grant of {dir}: {reason}")]
    Grant {
        plugin: String,
        dir: String,
        reason: String,
    },
    #[error("plugin `{plugin}`: init failed: {0}", .source)]
    Init { plugin: String, source: CallError },
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

/// The process-wide engine, its linkers and the epoch ticker.
pub struct Sandbox {
    engine: Engine,
    /// WASI with an empty context and weir's host API: every plugin.
    linker: Linker<PluginState>,
    /// The same plus `wasi:http`: only plugins with `grants.http`.
    http_linker: Linker<PluginState>,
    metrics: Metrics,
    ticker_stop: Arc<AtomicBool>,
    /// Where compiled components are kept between starts, if anywhere.
    cache: Option<PathBuf>,
}

impl Sandbox {
    pub fn new(metrics: Metrics) -> Result<Sandbox, SandboxError> {
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(POOL_INSTANCES)
            .total_core_instances(POOL_INSTANCES * POOL_CORE_INSTANCES_PER_COMPONENT)
            .total_memories(POOL_INSTANCES * 2)
            .total_tables(POOL_INSTANCES * 2)
            .total_stacks(POOL_INSTANCES)
            .max_core_instances_per_component(POOL_CORE_INSTANCES_PER_COMPONENT)
            .max_memories_per_component(POOL_CORE_INSTANCES_PER_COMPONENT)
            .max_tables_per_component(POOL_CORE_INSTANCES_PER_COMPONENT)
            .max_memory_size(POOL_MAX_MEMORY_BYTES);
        let mut config = wasmtime::Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        // `perf` names plugin functions only if the engine writes a perf map.
        if std::env::var("WEIR_WASM_PROFILER").is_ok_and(|value| value == "perfmap") {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&config).map_err(SandboxError::Engine)?;

        let base_linker = || -> wasmtime::Result<Linker<PluginState>> {
            let mut linker = Linker::new(&engine);
            wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
            host_api::add_to_linker::<PluginState, HasSelf<PluginState>>(&mut linker, |state| {
                state
            })?;
            Ok(linker)
        };
        let linker = base_linker().map_err(SandboxError::Engine)?;
        let mut http_linker = base_linker().map_err(SandboxError::Engine)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut http_linker)
            .map_err(SandboxError::Engine)?;

        let ticker_stop = Arc::new(AtomicBool::new(false));
        let (ticker_engine, stop) = (engine.clone(), ticker_stop.clone());
        std::thread::Builder::new()
            .name("weir-epoch".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    ticker_engine.increment_epoch();
                }
            })
            .map_err(|err| SandboxError::Engine(err.into()))?;

        Ok(Sandbox {
            engine,
            linker,
            http_linker,
            metrics,
            ticker_stop,
            cache: None,
        })
    }

    /// Keeps compiled components in `dir`, keyed by the `.wasm`'s SHA-256
    /// and the engine's compatibility hash, so a restart skips Cranelift.
    /// `dir` must be weir's own (its data directory): what is loaded from
    /// it runs as native code, so it is never a plugins directory.
    pub fn with_cache_dir(mut self, dir: PathBuf) -> Sandbox {
        self.cache = Some(dir);
        self
    }

    /// Compiles a plugin, checks it implements its world and links, and
    /// smoke-tests it with one instantiation and `init`.
    pub async fn load(&self, config: &PluginConfig) -> Result<Arc<Plugin>, LoadError> {
        let plugin = config.name.clone();
        let path = config.wasm.display().to_string();
        let bytes = tokio::fs::read(&config.wasm)
            .await
            .map_err(|source| LoadError::Read {
                plugin: plugin.clone(),
                path: path.clone(),
                source,
            })?;
        let version = version_of(&bytes);
        let engine = self.engine.clone();
        let cache = self.cache.clone();
        // Cranelift takes a while on a big component: keep it off the runtime threads.
        let component = tokio::task::spawn_blocking(move || compile(&engine, &bytes, cache))
            .await
            .map_err(|err| LoadError::Compile {
                plugin: plugin.clone(),
                path: path.clone(),
                reason: err.to_string(),
            })?
            .map_err(|err| LoadError::Compile {
                plugin: plugin.clone(),
                path: path.clone(),
                reason: format!("{err:#}"),
            })?;

        if let Some(found) = foreign_version(&self.engine, &component) {
            return Err(LoadError::WrongVersion {
                plugin,
                path,
                found,
            });
        }
        check_world(&self.engine, &component, config.world).map_err(|missing| {
            LoadError::WrongWorld {
                plugin: plugin.clone(),
                path: path.clone(),
                world: config.world.as_str(),
                missing,
            }
        })?;
        // An ungranted wasi:http import gets a message naming the grant,
        // not the linker's "unknown import".
        let linker = match (
            http_import(&self.engine, &component),
            config.grants.http.is_empty(),
        ) {
            (Some(import), true) => {
                return Err(LoadError::Ungranted {
                    plugin,
                    path,
                    import,
                    grant: "grants.http",
                });
            }
            (_, false) => &self.http_linker,
            (None, true) => &self.linker,
        };
        let instance_pre = linker
            .instantiate_pre(&component)
            .map_err(|err| LoadError::Link {
                plugin: plugin.clone(),
                path: path.clone(),
                reason: format!("{err:#}"),
            })?;
        let link_error = |err: wasmtime::Error| LoadError::Link {
            plugin: plugin.clone(),
            path: path.clone(),
            reason: format!("{err:#}"),
        };
        let pre = match config.world {
            World::Transform => {
                PluginPre::Transform(TransformPre::new(instance_pre).map_err(link_error)?)
            }
            World::Sink => PluginPre::Sink(SinkPre::new(instance_pre).map_err(link_error)?),
            World::Budget => PluginPre::Budget(BudgetPre::new(instance_pre).map_err(link_error)?),
            World::Router => PluginPre::Router(RouterPre::new(instance_pre).map_err(link_error)?),
        };
        for grant in &config.grants.dirs {
            if grant.writable {
                // A writable grant is weir's to create, so a fresh install just works.
                let _ = std::fs::create_dir_all(&grant.host);
            }
            if !grant.host.is_dir() {
                return Err(LoadError::Grant {
                    plugin,
                    dir: grant.host.display().to_string(),
                    reason: "not a directory".into(),
                });
            }
        }
        let loaded = Arc::new(Plugin {
            config: config.clone(),
            settings_json: config.settings.to_string(),
            version,
            pre,
            engine: self.engine.clone(),
            metrics: self.metrics.clone(),
            labels: PluginLabels {
                plugin: config.name.clone(),
            },
        });
        let smoke_test = loaded
            .instantiate()
            .await
            .map_err(|source| LoadError::Init {
                plugin: config.name.clone(),
                source,
            })?;
        drop(smoke_test);
        tracing::info!(plugin = %config.name, version = %loaded.version, world = config.world.as_str(), "plugin loaded");
        Ok(loaded)
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

/// The exports a world needs, checked before linking so a wrong component
/// gets a message that names what it lacks.
fn check_world(engine: &Engine, component: &Component, world: World) -> Result<(), String> {
    let required: &[&str] = match world {
        World::Transform => &["init", "transform"],
        World::Sink => &["init", "deliver"],
        World::Budget => &["init", "admit"],
        World::Router => &["init", "route-table", "route-keys"],
    };
    let ty = component.component_type();
    let missing: Vec<String> = required
        .iter()
        .filter(|name| {
            !ty.exports(engine).any(|(export, item)| {
                export == **name && matches!(item.ty, ComponentItem::ComponentFunc(_))
            })
        })
        .map(|name| format!("`{name}`"))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        let found: Vec<String> = ty
            .exports(engine)
            .map(|(name, _)| format!("`{name}`"))
            .collect();
        Err(format!(
            "{} (it exports {})",
            missing.join(", "),
            if found.is_empty() {
                "nothing".to_string()
            } else {
                found.join(", ")
            }
        ))
    }
}

/// The component's `wasi:http/…` import, if it has any; the outgoing
/// handler is named first, since that is what reaches the network.
/// The version of `weir:plugin` a component imports, when it is not this
/// host's (a plugin built with an older SDK).
fn foreign_version(engine: &Engine, component: &Component) -> Option<String> {
    component
        .component_type()
        .imports(engine)
        .find_map(|(name, _)| imported_version(name).filter(|v| *v != WIT_VERSION))
        .map(str::to_string)
}

/// `weir:plugin/host@0.1.0` → `0.1.0`; none for anything else.
fn imported_version(import: &str) -> Option<&str> {
    import
        .strip_prefix("weir:plugin/")?
        .split_once('@')
        .map(|(_, version)| version)
}

fn http_import(engine: &Engine, component: &Component) -> Option<String> {
    let mut imports: Vec<String> = component
        .component_type()
        .imports(engine)
        .filter(|(name, _)| name.starts_with("wasi:http/"))
        .map(|(name, _)| name.to_string())
        .collect();
    imports.sort_by_key(|name| !name.starts_with("wasi:http/outgoing-handler"));
    imports.into_iter().next()
}

/// Compiles a component, or loads it from the compiled cache when it holds
/// this exact `.wasm` for this exact engine. Cache trouble never fails a
/// load: it only costs a compilation.
fn compile(engine: &Engine, bytes: &[u8], cache: Option<PathBuf>) -> wasmtime::Result<Component> {
    let Some(dir) = cache else {
        return Component::new(engine, bytes);
    };
    use sha2::Digest;
    use std::hash::{Hash, Hasher};
    let digest: String = sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let path = dir.join(format!("{digest}-{:016x}.cwasm", hasher.finish()));
    if path.exists() {
        // SAFETY: the file was written by `Component::serialize` of this
        // engine configuration into weir's own data directory (the key
        // includes the engine's compatibility hash); nothing else writes
        // there.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => {
                tracing::debug!(cache = %path.display(), "compiled component loaded from the cache");
                return Ok(component);
            }
            Err(err) => {
                tracing::warn!(cache = %path.display(), error = %err, "unusable compiled component; compiling again");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let component = Component::new(engine, bytes)?;
    let stored = component
        .serialize()
        .map_err(std::io::Error::other)
        .and_then(|compiled| {
            std::fs::create_dir_all(&dir)?;
            // Written aside and renamed: a crash never leaves half a file under the key.
            let partial = path.with_extension(format!("partial-{}", std::process::id()));
            std::fs::write(&partial, compiled)?;
            std::fs::rename(&partial, &path)
        });
    if let Err(err) = stored {
        tracing::warn!(cache = %dir.display(), error = %err, "cannot keep the compiled component");
    }
    Ok(component)
}

/// A short content digest: the plugin's version as status and logs show it.
pub fn version_of(bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

enum PluginPre {
    Transform(TransformPre<PluginState>),
    Sink(SinkPre<PluginState>),
    Budget(BudgetPre<PluginState>),
    Router(RouterPre<PluginState>),
}

/// One loaded version of a plugin: compiled, linked, ready to instantiate.
pub struct Plugin {
    pub config: PluginConfig,
    /// Content digest of the `.wasm`.
    pub version: String,
    settings_json: String,
    pre: PluginPre,
    engine: Engine,
    metrics: Metrics,
    labels: PluginLabels,
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

    /// A fresh instance with its own store, limits and grants, `init`-ed.
    pub async fn instantiate(self: &Arc<Self>) -> Result<PluginInstance, CallError> {
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
            },
            table: ResourceTable::new(),
            limits: Limiter {
                limits,
                memory_bytes: 0,
            },
            plugin: self.clone(),
            call_ends: std::time::Instant::now(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.limits);
        // Every epoch tick, a running call yields to the executor (so a long
        // call never starves the host's other tasks) until its deadline passes.
        store.epoch_deadline_callback(|context| {
            Ok(if std::time::Instant::now() >= context.data().call_ends {
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
        let exports = match &self.pre {
            PluginPre::Transform(pre) => pre
                .instantiate_async(&mut instance.store)
                .await
                .map(Exports::Transform),
            PluginPre::Sink(pre) => pre
                .instantiate_async(&mut instance.store)
                .await
                .map(Exports::Sink),
            PluginPre::Budget(pre) => pre
                .instantiate_async(&mut instance.store)
                .await
                .map(Exports::Budget),
            PluginPre::Router(pre) => pre
                .instantiate_async(&mut instance.store)
                .await
                .map(Exports::Router),
        };
        instance.exports = exports.map_err(|err| instance.failure(err))?;
        self.metrics.plugin_instances.inc();

        instance.arm_deadline();
        let settings = self.settings_json.as_str();
        let result = match &instance.exports {
            Exports::Transform(t) => t.call_init(&mut instance.store, settings).await,
            Exports::Sink(s) => s.call_init(&mut instance.store, settings).await,
            Exports::Budget(b) => b.call_init(&mut instance.store, settings).await,
            Exports::Router(r) => r.call_init(&mut instance.store, settings).await,
            Exports::None => unreachable!("exports were just set"),
        };
        match result {
            Ok(Ok(())) => {
                instance.memory_after_init = instance.memory_bytes();
                Ok(instance)
            }
            Ok(Err(reason)) => Err(CallError {
                kind: FailureKind::Refused,
                message: format!("init refused its settings: {reason}"),
            }),
            Err(err) => Err(instance.failure(err)),
        }
    }
}

enum Exports {
    None,
    Transform(Transform),
    Sink(Sink),
    Budget(Budget),
    Router(RouterPolicy),
}

/// A live instance of one plugin version. Not shared: one caller at a time.
pub struct PluginInstance {
    store: Store<PluginState>,
    exports: Exports,
    plugin: Arc<Plugin>,
    stderr: StderrTail,
    batches: u64,
    /// Linear memory right after `init`: growth is measured from here.
    memory_after_init: usize,
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

    /// Linear memory the instance has now, in bytes.
    pub fn memory_bytes(&self) -> usize {
        self.store.data().limits.memory_bytes
    }

    fn arm_deadline(&mut self) {
        let call_ends = Instant::now() + self.plugin.config.deadline;
        let state = self.store.data_mut();
        state.call_ends = call_ends;
        state.gate.call_ends = call_ends;
        self.store.set_epoch_deadline(1);
    }

    fn begin_call(&mut self) {
        self.stderr.clear();
        self.arm_deadline();
        self.batches += 1;
        self.plugin
            .metrics
            .plugin_calls
            .get_or_create(&self.plugin.labels)
            .inc();
    }

    /// Runs a transform over a batch. Its answer is checked against the batch
    /// as it is read ([`crate::batch::Answer`]).
    pub async fn transform(&mut self, rows: &Batch) -> Result<Transformed, CallError> {
        self.begin_call();
        let Exports::Transform(exports) = &self.exports else {
            return Err(self.contract("is not a transform"));
        };
        exports
            .call_transform(&mut self.store, rows.packed())
            .await
            .map_err(|err| self.failure(err))
    }

    /// Hands a batch to a sink. Its answer is checked against the batch by
    /// [`crate::batch::delivered`].
    pub async fn deliver(&mut self, rows: &Batch) -> Result<Delivered, CallError> {
        self.begin_call();
        let Exports::Sink(exports) = &self.exports else {
            return Err(self.contract("is not a sink"));
        };
        exports
            .call_deliver(&mut self.store, rows.packed())
            .await
            .map_err(|err| self.failure(err))
    }

    /// Asks a budget about one request.
    pub async fn admit(&mut self, request: &Admission) -> Result<Decision, CallError> {
        self.begin_call();
        let Exports::Budget(exports) = &self.exports else {
            return Err(self.contract("is not a budget"));
        };
        exports
            .call_admit(&mut self.store, request)
            .await
            .map_err(|err| self.failure(err))
    }

    /// Asks a router how a table's rows are routed.
    pub async fn route_table(
        &mut self,
        topology: Topology,
        tenant: &str,
        table: &str,
    ) -> Result<TableRoute, CallError> {
        self.begin_call();
        let Exports::Router(exports) = &self.exports else {
            return Err(self.contract("is not a router"));
        };
        exports
            .call_route_table(&mut self.store, topology, tenant, table)
            .await
            .map_err(|err| self.failure(err))
    }

    /// Asks a router for the route of each key of one request.
    pub async fn route_keys(
        &mut self,
        topology: Topology,
        tenant: &str,
        table: &str,
        keys: &[Option<String>],
    ) -> Result<Vec<Route>, CallError> {
        self.begin_call();
        let Exports::Router(exports) = &self.exports else {
            return Err(self.contract("is not a router"));
        };
        let routes = exports
            .call_route_keys(&mut self.store, topology, tenant, table, keys)
            .await
            .map_err(|err| self.failure(err))?;
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

    fn count_failure(&self) {
        self.plugin
            .metrics
            .plugin_failures
            .get_or_create(&self.plugin.labels)
            .inc();
    }

    /// Classifies a wasmtime error and adds the guest's last stderr words.
    fn failure(&self, err: wasmtime::Error) -> CallError {
        self.count_failure();
        let limit = &self.plugin.config;
        let (kind, what) = match err.downcast_ref::<wasmtime::Trap>() {
            Some(wasmtime::Trap::Interrupt) => (
                FailureKind::Deadline,
                format!("ran past its deadline of {} ms", limit.deadline.as_millis()),
            ),
            _ if format!("{err:#}").contains("forcing trap when growing memory") => (
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
        // A Rust guest prints its panic message to stderr before it aborts.
        let tail = self.stderr.last_line();
        let message = if tail.is_empty() {
            format!("plugin `{}` {what}", self.plugin.name())
        } else {
            format!("plugin `{}` {what}: {tail}", self.plugin.name())
        };
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
struct Limiter {
    limits: StoreLimits,
    memory_bytes: usize,
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.limits.memory_growing(current, desired, maximum)?;
        if allowed {
            self.memory_bytes += desired.saturating_sub(current);
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
    wasi: WasiCtx,
    /// Used only through the `http_linker`, i.e. with `grants.http`.
    http: WasiHttpCtx,
    gate: HttpGate,
    table: ResourceTable,
    limits: Limiter,
    plugin: Arc<Plugin>,
    /// When the running call must have returned.
    call_ends: std::time::Instant,
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for PluginState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.gate,
        }
    }
}

/// Lets a plugin's outbound HTTP request out only to an authority in its
/// `grants.http`, and never for longer than what is left of its call.
struct HttpGate {
    plugin: String,
    /// Normalized `host:port` authorities (see `config::parse_authority`).
    allowed: Vec<String>,
    /// The running call's deadline (a copy of `PluginState::call_ends`).
    call_ends: Instant,
}

type ResponseFuture = Box<
    dyn Future<
            Output = wasmtime_wasi_http::Result<(
                axum::http::Response<WasiBody>,
                Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
            )>,
        > + Send,
>;

impl HttpGate {
    /// `host:port` of a request, the port defaulted from the scheme, lowercased.
    fn authority_of(uri: &axum::http::Uri) -> Option<String> {
        let authority = uri.authority()?;
        let port = authority.port_u16().unwrap_or(
            if uri.scheme() == Some(&axum::http::uri::Scheme::HTTPS) {
                443
            } else {
                80
            },
        );
        Some(format!("{}:{port}", authority.host().to_ascii_lowercase()))
    }

    /// The guest's timeouts, none longer than what is left of the call: a
    /// call blocked in the host on a response is not interrupted by the
    /// epoch, so these are what keep it within its deadline.
    fn bounded(&self, options: Option<RequestOptions>) -> RequestOptions {
        let left = self
            .call_ends
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let bound = |asked: Option<Duration>| Some(asked.map_or(left, |asked| asked.min(left)));
        let options = options.unwrap_or_default();
        RequestOptions {
            connect_timeout: bound(options.connect_timeout),
            first_byte_timeout: bound(options.first_byte_timeout),
            between_bytes_timeout: bound(options.between_bytes_timeout),
        }
    }
}

impl WasiHttpHooks for HttpGate {
    fn send_request(
        &mut self,
        request: axum::http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> ResponseFuture {
        drop(fut);
        let authority = Self::authority_of(request.uri());
        let granted = authority
            .as_ref()
            .is_some_and(|authority| self.allowed.contains(authority));
        if !granted {
            let authority = authority.unwrap_or_else(|| request.uri().to_string());
            tracing::warn!(
                plugin = %self.plugin,
                %authority,
                "outbound HTTP request denied: not in grants.http"
            );
            return Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) });
        }
        let options = self.bounded(options);
        Box::new(async move {
            let (response, io) =
                wasmtime_wasi_http::default_send_request(request, Some(options)).await?;
            Ok((
                response.map(WasiBody::new),
                Box::new(io) as Box<dyn Future<Output = _> + Send>,
            ))
        })
    }
}

impl host_api::Host for PluginState {
    fn log(&mut self, level: Level, mut message: String) {
        if message.len() > MAX_LOG_BYTES {
            let mut cut = MAX_LOG_BYTES;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        let (plugin, version) = (self.plugin.name(), self.plugin.version.as_str());
        match level {
            Level::Trace => tracing::trace!(plugin, version, "{message}"),
            Level::Debug => tracing::debug!(plugin, version, "{message}"),
            Level::Info => tracing::info!(plugin, version, "{message}"),
            Level::Warn => tracing::warn!(plugin, version, "{message}"),
            Level::Error => tracing::error!(plugin, version, "{message}"),
        }
    }

    fn add_counter(&mut self, name: String, delta: u64) {
        let labels = PluginCounterLabels {
            plugin: self.plugin.name().to_string(),
            name,
        };
        self.plugin
            .metrics
            .plugin_counters
            .get_or_create(&labels)
            .inc_by(delta);
    }
}

impl bindings::transform::weir::plugin::types::Host for PluginState {}

/// A plugin's stderr, of which only the tail is kept: enough to quote a
/// panic message when the call traps, never a growing buffer.
#[derive(Clone, Default)]
struct StderrTail(Arc<Mutex<Vec<u8>>>);

impl StderrTail {
    /// Forgets what earlier calls wrote, so a trap is explained by its own call.
    fn clear(&self) {
        if let Ok(mut bytes) = self.0.lock() {
            bytes.clear();
        }
    }

    fn last_line(&self) -> String {
        let Ok(bytes) = self.0.lock() else {
            return String::new();
        };
        let text = String::from_utf8_lossy(&bytes);
        text.trim_end()
            .lines()
            .rev()
            .find(|line| !line.trim().is_empty() && !line.contains("note: run with"))
            .unwrap_or("")
            .trim()
            .to_string()
    }
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
    fn the_wit_version_is_the_packages() {
        let wit = include_str!("../../wit/types.wit");
        assert!(
            wit.contains(&format!("package weir:plugin@{WIT_VERSION};")),
            "wit/types.wit names another version than WIT_VERSION"
        );
    }

    #[test]
    fn an_imports_weir_plugin_version_is_read_from_its_name() {
        assert_eq!(imported_version("weir:plugin/host@0.1.0"), Some("0.1.0"));
        assert_eq!(imported_version("weir:plugin/types@0.2.0"), Some("0.2.0"));
        assert_eq!(imported_version("wasi:io/streams@0.2.6"), None);
        assert_eq!(imported_version("weir:plugin/host"), None);
    }
}
