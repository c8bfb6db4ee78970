//! The sandbox: one wasmtime `Engine` per process, a compiled component and
//! an `InstancePre` per plugin version, and instances whose every call is
//! bounded in memory (`StoreLimits`) and CPU time (epoch interruption).
//!
//! Architecture invariant: a plugin reaches nothing it was not granted. WASI
//! is linked because every std guest imports it, but the context is empty:
//! no preopens, no environment, no sockets, unless the TOML grants them.
//! `wasi:http` is linked only for plugins that import it, and each of
//! their requests must go to an authority in their `grants.http` (none
//! without one: every request is refused at call time).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use wasmtime::component::{Component, Linker, types::ComponentItem};
use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::capability::{Capability, Linked};
use crate::config::PluginConfig;
use crate::telemetry::{Metrics, PluginCallLabels, PluginLabels, PluginVersionLabels};
use crate::world::World;

pub(crate) mod bindings;
mod cache;
mod capabilities;
mod http;
mod http_batch;
mod imports;
mod json_members;
mod served;
pub mod shared;
mod inspect;
mod instance;
mod worlds;

pub use bindings::{Admission, Decision, Route, TableRoute, Topology, Usage};
use cache::CompileCache;
pub use cache::Origin;
pub use inspect::Inspection;
use instance::PluginState;
pub use instance::{CallError, FailureKind, Plugin, PluginInstance};
pub use served::SERVED_WIT_VERSIONS;
pub use shared::{Claim, FleetArtifacts};
use worlds::PluginPre;

/// The log target of the lines around a compilation, so a command that
/// logs only warnings can still show them (a first compile can take half
/// a minute and must not look hung).
pub const COMPILE_LOG: &str = "weir::compile";
/// The version of the `weir:plugin` WIT package (`wit/types.wit`) this host speaks.
pub const WIT_VERSION: &str = "0.3.0";
/// How often the epoch advances: the granularity of every call deadline,
/// and how often a running call yields to the executor.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);
/// A ticker sleep that overshoots by more than this was the whole process
/// standing still (SIGSTOP, a VM stall), not a plugin running.
const PAUSE_THRESHOLD: Duration = Duration::from_millis(250);
/// The longest a host waits for the artifact another process compiles for
/// the fleet before compiling its own (a 20 MB component takes seconds).
const FLEET_WAIT: Duration = Duration::from_secs(300);
/// How often a host waiting for the fleet's artifact looks for it.
const FLEET_POLL: Duration = Duration::from_millis(100);
/// Core instances per component: a std wasip2 guest has a handful.
const POOL_CORE_INSTANCES_PER_COMPONENT: u32 = 16;
/// Per-memory address space the pool reserves; per-plugin caps are lower.
const POOL_MAX_MEMORY_BYTES: usize = (crate::config::MAX_PLUGIN_MEMORY_MB as usize) << 20;
/// The tail of a plugin's stderr kept to explain a trap (a Rust panic prints there).
const STDERR_TAIL_BYTES: usize = 4096;
/// Longest log line a plugin may write through the host import.
const MAX_LOG_BYTES: usize = 4096;
/// Longest name of a plugin's counter (`add-counter`).
const MAX_COUNTER_NAME_BYTES: usize = 64;
/// Distinct counters one plugin version may keep.
const MAX_COUNTERS: usize = 64;

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
    #[error("plugin `{plugin}`: {path} {}", wrong_version(found))]
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
    #[error("plugin `{plugin}`: grant of {dir}: {reason}")]
    Grant {
        plugin: String,
        dir: String,
        reason: String,
    },
    /// Its `grants.postgres` cannot be used (the message names the plugin).
    #[error(transparent)]
    Postgres(#[from] crate::destination::PoolError),
    /// Its `grants.objects` cannot be used (the message names the plugin).
    #[error("{0}")]
    Objects(String),
    // Not a `source`: the message already says it, and a printer that
    // walks the chain would say it twice.
    #[error("plugin `{plugin}`: init failed: {error}")]
    Init { plugin: String, error: CallError },
}

/// The destinations a sink's grants name, opened: nothing is sent until a
/// call needs it.
fn destinations(config: &PluginConfig) -> Result<Destinations, LoadError> {
    let postgres = match &config.grants.postgres {
        Some(grant) => Some(crate::destination::PgPool::new(&config.name, grant)?),
        None => None,
    };
    let objects = match &config.grants.objects {
        Some(grant) => Some(
            crate::destination::ObjectsDestination::open(&config.name, grant)
                .map_err(LoadError::Objects)?,
        ),
        None => None,
    };
    Ok((postgres, objects))
}

type Destinations = (
    Option<Arc<crate::destination::PgPool>>,
    Option<crate::destination::ObjectsDestination>,
);

/// How long the process stood still, as the epoch ticker saw it. Taken
/// off plugin deadlines: a deadline measures the plugin, not the host, so
/// a pause never turns a finished call into a failed one.
#[derive(Debug)]
pub struct Pauses {
    since: std::time::Instant,
    total_nanos: AtomicU64,
    /// When the ticker last woke, in nanoseconds after `since`.
    last_tick_nanos: AtomicU64,
}

impl Pauses {
    fn new() -> Pauses {
        Pauses {
            since: std::time::Instant::now(),
            total_nanos: AtomicU64::new(0),
            last_tick_nanos: AtomicU64::new(0),
        }
    }

    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.total_nanos.load(Ordering::SeqCst))
    }

    /// The ticker woke at `now` after a pause of `paused` (zero if none).
    /// The pause is counted before the wake is: whoever sees the new wake
    /// sees the pause too.
    fn ticked(&self, now: std::time::Instant, paused: Duration) {
        if !paused.is_zero() {
            self.total_nanos.fetch_add(nanos(paused), Ordering::SeqCst);
        }
        self.last_tick_nanos
            .store(nanos(now.duration_since(self.since)), Ordering::SeqCst);
    }

    /// Whether the ticker has woken within [`PAUSE_THRESHOLD`] of `now`. If
    /// not, the process may just have stood still and the ticker not yet
    /// counted it (a call can see an epoch moved before a SIGSTOP first),
    /// so no deadline is judged until it has.
    fn current_at(&self, now: std::time::Instant) -> bool {
        let last_tick = Duration::from_nanos(self.last_tick_nanos.load(Ordering::SeqCst));
        now.duration_since(self.since).saturating_sub(last_tick) <= PAUSE_THRESHOLD
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The process-wide engine, its linkers and the epoch ticker.
pub struct Sandbox {
    engine: Engine,
    /// The engine's settings without its pool: each compilation gets an
    /// engine of its own, dropped with Cranelift's buffers once it is done.
    compile_config: wasmtime::Config,
    /// WASI with an empty context and weir's host API: every plugin.
    linker: Linker<PluginState>,
    /// The same plus `wasi:http`: only plugins that import it.
    http_linker: Linker<PluginState>,
    metrics: Metrics,
    ticker_stop: Arc<AtomicBool>,
    pauses: Arc<Pauses>,
    /// Where compiled components are kept between starts, if anywhere.
    cache: Option<Arc<CompileCache>>,
    /// The fleet's compiled components, if shared.
    fleet: Option<Arc<dyn FleetArtifacts>>,
    /// Components loaded so far, by [`Origin`].
    origins: [AtomicU64; 3],
}

impl Sandbox {
    pub fn new(metrics: Metrics) -> Result<Sandbox, SandboxError> {
        Sandbox::with_pool(metrics, crate::config::DEFAULT_PLUGIN_INSTANCES)
    }

    /// An engine whose pool holds `instances` plugin instances at once.
    /// Slots are address space reserved up front, not memory.
    pub fn with_pool(metrics: Metrics, instances: u32) -> Result<Sandbox, SandboxError> {
        let instances = instances.max(1);
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(instances)
            .total_core_instances(instances.saturating_mul(POOL_CORE_INSTANCES_PER_COMPONENT))
            .total_memories(instances.saturating_mul(2))
            .total_tables(instances.saturating_mul(2))
            .total_stacks(instances)
            .max_core_instances_per_component(POOL_CORE_INSTANCES_PER_COMPONENT)
            .max_memories_per_component(POOL_CORE_INSTANCES_PER_COMPONENT)
            .max_tables_per_component(POOL_CORE_INSTANCES_PER_COMPONENT)
            .max_memory_size(POOL_MAX_MEMORY_BYTES);
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true).epoch_interruption(true);
        // `perf` names plugin functions only if the engine writes a perf map.
        if std::env::var("WEIR_WASM_PROFILER").is_ok_and(|value| value == "perfmap") {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        // Compiling needs no pool: the allocation strategy is not part of
        // the compiled code, so the run engine loads what this config compiles.
        let compile_config = config.clone();
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(SandboxError::Engine)?;

        let base_linker = || -> wasmtime::Result<Linker<PluginState>> {
            let mut linker = Linker::new(&engine);
            capabilities::link_all(&mut linker, Linked::Always)?;
            Ok(linker)
        };
        let linker = base_linker().map_err(SandboxError::Engine)?;
        let mut http_linker = base_linker().map_err(SandboxError::Engine)?;
        capabilities::link_all(&mut http_linker, Linked::WhenImported)
            .map_err(SandboxError::Engine)?;

        let ticker_stop = Arc::new(AtomicBool::new(false));
        let pauses = Arc::new(Pauses::new());
        let (ticker_engine, stop, ticker_pauses) =
            (engine.clone(), ticker_stop.clone(), pauses.clone());
        std::thread::Builder::new()
            .name("weir-epoch".into())
            .spawn(move || {
                let mut last = std::time::Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    let now = std::time::Instant::now();
                    let slept = now - last;
                    last = now;
                    // Recorded before the epoch moves: a call checks its
                    // deadline only on an epoch change, so it sees the pause.
                    let paused = if slept > EPOCH_TICK + PAUSE_THRESHOLD {
                        slept - EPOCH_TICK
                    } else {
                        Duration::ZERO
                    };
                    ticker_pauses.ticked(now, paused);
                    ticker_engine.increment_epoch();
                }
            })
            .map_err(|err| SandboxError::Engine(err.into()))?;

        Ok(Sandbox {
            engine,
            compile_config,
            linker,
            http_linker,
            metrics,
            ticker_stop,
            pauses,
            cache: None,
            fleet: None,
            origins: Default::default(),
        })
    }

    /// Keeps compiled components in `dir` (see [`cache`]), at most
    /// `max_bytes` of them, so a restart or another data dir skips
    /// Cranelift. `dir` must be weir's own: what is loaded from it runs as
    /// native code, so it is never a plugins directory.
    pub fn with_cache(mut self, dir: PathBuf, max_bytes: u64) -> Sandbox {
        self.cache = Some(Arc::new(CompileCache::new(dir, max_bytes)));
        self
    }

    /// The compiled cache, when there is one (its hit and miss counts).
    pub fn compile_cache(&self) -> Option<&CompileCache> {
        self.cache.as_deref()
    }

    /// Shares compiled components with the fleet through `artifacts` (see
    /// [`shared`]): a component one host compiled is loaded by the others.
    pub fn with_fleet(mut self, artifacts: Arc<dyn FleetArtifacts>) -> Sandbox {
        self.fleet = Some(artifacts);
        self
    }

    /// How many components this sandbox loaded from `origin` so far.
    pub fn loaded_from(&self, origin: Origin) -> u64 {
        self.origins[origin as usize].load(Ordering::Relaxed)
    }

    /// A component: from the compiled cache, else the fleet's artifact,
    /// else compiled here (and shared with the fleet, if this process won
    /// the claim to compile it while the others wait).
    pub(crate) async fn compile(
        &self,
        plugin: &str,
        path: &str,
        bytes: Vec<u8>,
    ) -> Result<Compiled, LoadError> {
        let bytes = Arc::new(bytes);
        let compiled = match self.cached(&bytes).await {
            Some(component) => {
                tracing::debug!(plugin, "compiled component loaded from the cache");
                Ok(Compiled {
                    component,
                    origin: Origin::Cache,
                })
            }
            None => match self.fleet.clone() {
                Some(fleet) => self.through_fleet(&*fleet, plugin, path, &bytes).await,
                None => self
                    .compile_here(plugin, path, &bytes)
                    .await
                    .map(|(c, _)| c),
            },
        };
        if let Ok(compiled) = &compiled {
            self.origins[compiled.origin as usize].fetch_add(1, Ordering::Relaxed);
        }
        compiled
    }

    /// The compiled cache's entry of `bytes`, if it has one.
    async fn cached(&self, bytes: &Arc<Vec<u8>>) -> Option<Component> {
        let cache = self.cache.clone()?;
        let (engine, bytes) = (self.engine.clone(), bytes.clone());
        tokio::task::spawn_blocking(move || cache.load(&engine, &bytes))
            .await
            .ok()
            .flatten()
    }

    /// The fleet's artifact of `bytes`; while another process holds the
    /// claim to compile it, waits for it (at most [`FLEET_WAIT`]); with the
    /// claim, compiles and shares it. Any trouble with the store: compiled
    /// here, as without a fleet.
    async fn through_fleet(
        &self,
        fleet: &dyn FleetArtifacts,
        plugin: &str,
        path: &str,
        bytes: &Arc<Vec<u8>>,
    ) -> Result<Compiled, LoadError> {
        let key = shared::key(&self.engine, bytes);
        let gave_up = std::time::Instant::now() + FLEET_WAIT;
        let mut waiting_for = None;
        let from_fleet = |component| Compiled {
            component,
            origin: Origin::Fleet,
        };
        let trouble = loop {
            match self.artifact(fleet, plugin, &key, bytes).await {
                Artifact::Loaded(component) => return Ok(from_fleet(component)),
                Artifact::Refused => break None,
                Artifact::Unreadable(reason) => break Some(reason),
                Artifact::Absent => {}
            }
            match fleet.claim(&key).await {
                Ok(Claim::Taken(claim)) => {
                    // Kept by the last holder between our look and our claim?
                    match self.artifact(fleet, plugin, &key, bytes).await {
                        Artifact::Loaded(component) => return Ok(from_fleet(component)),
                        Artifact::Refused => break None,
                        Artifact::Absent | Artifact::Unreadable(_) => {}
                    }
                    let (compiled, code) = self.compile_here(plugin, path, bytes).await?;
                    match self.share(fleet, &key, bytes, code).await {
                        Ok(()) => {
                            tracing::info!(plugin, artifact = %key, "kept the compiled plugin {plugin} for the fleet")
                        }
                        Err(reason) => {
                            tracing::warn!(plugin, artifact = %key, %reason, "cannot keep the compiled plugin {plugin} for the fleet")
                        }
                    }
                    drop(claim);
                    return_freed_memory();
                    return Ok(compiled);
                }
                Ok(Claim::HeldBy(who)) if std::time::Instant::now() < gave_up => {
                    if waiting_for.as_ref() != Some(&who) {
                        tracing::info!(target: COMPILE_LOG, plugin, "plugin {plugin}: {who} compiles it for the fleet; waiting for its artifact");
                        waiting_for = Some(who);
                    }
                    tokio::time::sleep(FLEET_POLL).await;
                }
                Ok(Claim::HeldBy(who)) => {
                    break Some(format!("{who} has not kept it within {FLEET_WAIT:?}"));
                }
                Err(reason) => break Some(reason),
            }
        };
        if let Some(reason) = trouble {
            tracing::warn!(plugin, artifact = %key, %reason, "the fleet's compiled artifacts cannot be used; compiling plugin {plugin} here");
        }
        self.compile_here(plugin, path, bytes).await.map(|(c, _)| c)
    }

    /// The fleet's artifact `key` of `bytes`, loaded if it is there and
    /// accepted.
    async fn artifact(
        &self,
        fleet: &dyn FleetArtifacts,
        plugin: &str,
        key: &str,
        bytes: &Arc<Vec<u8>>,
    ) -> Artifact {
        match fleet.get(key).await {
            Ok(Some(sealed)) => match self.unsealed(plugin, key, bytes, sealed).await {
                Some(component) => Artifact::Loaded(component),
                None => Artifact::Refused,
            },
            Ok(None) => Artifact::Absent,
            Err(reason) => Artifact::Unreadable(reason),
        }
    }

    /// Keeps `code`, compiled here from `bytes`, as the fleet's artifact
    /// `key`: read from the compiled cache's file where it kept it.
    async fn share(
        &self,
        fleet: &dyn FleetArtifacts,
        key: &str,
        bytes: &[u8],
        code: Code,
    ) -> Result<(), String> {
        match code {
            Code::Kept { path, digest } => {
                let mut file = tokio::fs::File::open(&path)
                    .await
                    .map_err(|err| format!("{}: {err}", path.display()))?;
                let header = shared::seal_header(&self.engine, bytes, &digest);
                fleet.put(key, &header, &mut file).await
            }
            Code::Bytes(code) => {
                let header = shared::seal_header(&self.engine, bytes, &shared::code_digest(&code));
                fleet.put(key, &header, &mut code.as_slice()).await
            }
        }
    }

    /// The component in a sealed artifact, if [`shared::unseal`] and then
    /// wasmtime accept it; a refusal is logged (the caller compiles).
    async fn unsealed(
        &self,
        plugin: &str,
        key: &str,
        bytes: &Arc<Vec<u8>>,
        sealed: Vec<u8>,
    ) -> Option<Component> {
        let (engine, cache, bytes) = (self.engine.clone(), self.cache.clone(), bytes.clone());
        let loaded = tokio::task::spawn_blocking(move || -> Result<Component, String> {
            let code =
                shared::unseal(&engine, &bytes, &sealed).map_err(|refusal| refusal.to_string())?;
            if let Some(component) = cache
                .as_ref()
                .and_then(|cache| cache.store(&engine, &bytes, code))
                .map(|(component, _)| component)
            {
                return Ok(component);
            }
            // SAFETY: `unseal` checked that this code was made from this
            // component by an engine of this build and settings, and is the
            // code that was sealed, in a store only hosts may write;
            // wasmtime checks its own header again.
            unsafe { Component::deserialize(&engine, code) }.map_err(|err| format!("{err:#}"))
        })
        .await
        .map_err(|err| err.to_string())
        .and_then(|loaded| loaded);
        return_freed_memory();
        match loaded {
            Ok(component) => {
                tracing::info!(target: COMPILE_LOG, plugin, artifact = %key, "plugin {plugin}: loaded the fleet's compiled artifact");
                Some(component)
            }
            Err(reason) => {
                tracing::warn!(plugin, artifact = %key, %reason, "refused the fleet's compiled artifact of plugin {plugin}; compiling it here");
                None
            }
        }
    }

    /// Compiles a component here (logged before: it can take half a
    /// minute, and after), keeps it in the compiled cache, and returns it
    /// with the native code it was loaded from.
    async fn compile_here(
        &self,
        plugin: &str,
        path: &str,
        bytes: &Arc<Vec<u8>>,
    ) -> Result<(Compiled, Code), LoadError> {
        let engine = self.engine.clone();
        let compile_config = self.compile_config.clone();
        let cache = self.cache.clone();
        let (name, shown, bytes) = (plugin.to_string(), path.to_string(), bytes.clone());
        // Cranelift takes a while on a big component: keep it off the runtime threads.
        let compiled = tokio::task::spawn_blocking(move || -> wasmtime::Result<(Compiled, Code)> {
            tracing::info!(target: COMPILE_LOG, plugin = %name, path = %shown, "compiling plugin {name} ({})…", megabytes(bytes.len()));
            let started = std::time::Instant::now();
            // The engine that compiles keeps Cranelift's contexts (tens of
            // MiB after a Python or JavaScript component) for as long as it
            // lives: a throwaway one frees them with the compilation.
            let compiled = Engine::new(&compile_config)?.precompile_component(&bytes)?;
            let took = started.elapsed();
            tracing::info!(target: COMPILE_LOG, plugin = %name, "compiled plugin {name} in {:.1} s", took.as_secs_f64());
            // Loaded on a fresh thread: what the component keeps for its
            // life then lands in another malloc arena than the compiler's
            // freed buffers, which can then go back to the system whole.
            let load = || -> wasmtime::Result<(Component, Option<PathBuf>)> {
                let kept = cache.as_ref().and_then(|cache| cache.store(&engine, &bytes, &compiled));
                match kept {
                    Some((component, path)) => Ok((component, Some(path))),
                    // SAFETY: `compiled` was produced just now by an engine of
                    // this engine's configuration; it never left the process.
                    None => unsafe { Component::deserialize(&engine, &compiled) }.map(|c| (c, None)),
                }
            };
            let (component, kept) = std::thread::scope(|scope| scope.spawn(load).join())
                .map_err(|_| wasmtime::Error::msg("loading the compiled component panicked"))??;
            // The code is shared from the cache's file when it is there: not
            // held here meanwhile (tens of MB for a Python or JS component).
            let code = match kept {
                Some(path) => {
                    let digest = shared::code_digest(&compiled);
                    drop(compiled);
                    Code::Kept { path, digest }
                }
                None => Code::Bytes(compiled),
            };
            return_freed_memory();
            Ok((
                Compiled {
                    component,
                    origin: Origin::Compiled,
                },
                code,
            ))
        })
        .await;
        let compile_error = |reason: String| LoadError::Compile {
            plugin: plugin.to_string(),
            path: path.to_string(),
            reason,
        };
        match compiled {
            Err(err) => Err(compile_error(err.to_string())),
            Ok(Err(err)) => Err(compile_error(format!("{err:#}"))),
            Ok(Ok(compiled)) => Ok(compiled),
        }
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
        let component = self.compile(&plugin, &path, bytes).await?.component;

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
        // A component that imports wasi:http without a grant still loads
        // (componentize-js imports it by default): its gate, with nothing
        // allowed, refuses each request at call time.
        let linker = match (
            http_import(&self.engine, &component),
            config.grants.http.is_empty(),
        ) {
            (Some(import), true) => {
                tracing::warn!(
                    plugin = %config.name,
                    %import,
                    "plugin imports wasi:http but has no grants.http: its requests will be refused"
                );
                &self.http_linker
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
        let pre = PluginPre::new(config.world, instance_pre).map_err(|err| LoadError::Link {
            plugin: plugin.clone(),
            path: path.clone(),
            reason: format!("{err:#}"),
        })?;
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
        let (postgres, objects) = destinations(config)?;
        let http_pool = http_pool(config)?;
        let wit = built_for(&self.engine, &component);
        let loaded = Arc::new(Plugin {
            config: config.clone(),
            settings_json: config.settings.to_string(),
            version: version.clone(),
            pre,
            engine: self.engine.clone(),
            metrics: self.metrics.clone(),
            labels: PluginLabels {
                plugin: config.name.clone(),
            },
            version_labels: PluginVersionLabels {
                plugin: config.name.clone(),
                version: version.clone(),
            },
            call_labels: PluginCallLabels {
                plugin: config.name.clone(),
                world: config.world.as_str(),
                version: version.clone(),
            },
            counter_names: Default::default(),
            pauses: self.pauses.clone(),
            postgres,
            objects,
            http_pool,
            http_in_flight: Arc::new(tokio::sync::Semaphore::new(config.http_max_in_flight)),
            reads_json_members: imports_json_members(&self.engine, &component),
        });
        let smoke_test = loaded
            .instantiate()
            .await
            .map_err(|error| LoadError::Init {
                plugin: config.name.clone(),
                error,
            })?;
        drop(smoke_test);
        said_loaded(config, &loaded.version, &wit);
        Ok(loaded)
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

/// The exports of `world` the component lacks (none: it implements it).
fn missing_exports(engine: &Engine, component: &Component, world: World) -> Vec<&'static str> {
    let ty = component.component_type();
    world
        .exports()
        .iter()
        .copied()
        .filter(|name| {
            !ty.exports(engine).any(|(export, item)| {
                export == *name && matches!(item.ty, ComponentItem::ComponentFunc(_))
            })
        })
        .collect()
}

/// The exports a world needs, checked before linking so a wrong component
/// gets a message that names what it lacks.
fn check_world(engine: &Engine, component: &Component, world: World) -> Result<(), String> {
    let missing: Vec<String> = missing_exports(engine, component, world)
        .iter()
        .map(|name| format!("`{name}`"))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        let found: Vec<String> = component
            .component_type()
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

/// Logs a plugin loaded, and a warning when it was built for the previous
/// world version (`wit`), which is served until the next one.
fn said_loaded(config: &PluginConfig, version: &str, wit: &str) {
    let (plugin, world) = (&config.name, config.world.as_str());
    tracing::info!(%plugin, %version, world, wit, "plugin loaded");
    if wit != WIT_VERSION {
        tracing::warn!(
            %plugin,
            wit,
            current = WIT_VERSION,
            "plugin built for the previous weir:plugin version, which this weir still serves \
             (converting each batch); rebuild it with the current SDK before the next world version"
        );
    }
}

/// Why a component built for `found` cannot run, and what to do about it:
/// this host serves today's world version and the previous one only
/// (`wit/README.md`), so only a rebuild helps.
pub fn wrong_version(found: &str) -> String {
    format!(
        "was built for `weir:plugin@{found}`, but this weir speaks `weir:plugin@{WIT_VERSION}` \
         (and still runs plugins built for {}) and cannot run it: rebuild the plugin with the \
         current SDK (Rust: the `weir-plugin` crate of this weir's checkout; Python and \
         JavaScript: copy `weir_plugin/` or `weir/` and `wit/` from a project made by this \
         weir's `weir plugin new`)",
        SERVED_WIT_VERSIONS[1..].join(", ")
    )
}

/// The version of `weir:plugin` a component imports, when this host does
/// not serve it (a plugin built with an SDK older than the previous one).
fn foreign_version(engine: &Engine, component: &Component) -> Option<String> {
    imported_versions(engine, component)
        .into_iter()
        .find(|version| !SERVED_WIT_VERSIONS.contains(&version.as_str()))
}

/// The version of `weir:plugin` a component was built for, as its imports
/// name it (today's when it imports none of weir's interfaces).
fn built_for(engine: &Engine, component: &Component) -> String {
    imported_versions(engine, component)
        .into_iter()
        .next()
        .unwrap_or_else(|| WIT_VERSION.to_string())
}

/// The `weir:plugin` versions a component's imports name, in import order.
fn imported_versions(engine: &Engine, component: &Component) -> Vec<String> {
    component
        .component_type()
        .imports(engine)
        .filter_map(|(name, _)| imported_version(name).map(str::to_string))
        .collect()
}

/// `weir:plugin/host@0.1.0` → `0.1.0`; none for anything else.
fn imported_version(import: &str) -> Option<&str> {
    import
        .strip_prefix("weir:plugin/")?
        .split_once('@')
        .map(|(_, version)| version)
}

/// Whether the component imports `weir:plugin/host`'s `json-members`.
fn imports_json_members(engine: &Engine, component: &Component) -> bool {
    component
        .component_type()
        .imports(engine)
        .any(|(name, item)| match item.ty {
            ComponentItem::ComponentInstance(instance) if name.starts_with("weir:plugin/host") => {
                instance
                    .exports(engine)
                    .any(|(export, _)| export == "json-members")
            }
            _ => false,
        })
}

/// The component's `wasi:http/…` import, if it has any; the outgoing
/// handler is named first, since that is what reaches the network.
fn http_import(engine: &Engine, component: &Component) -> Option<String> {
    let wasi_http = Capability::WasiHttp.spec();
    let mut imports: Vec<String> = component
        .component_type()
        .imports(engine)
        .filter(|(name, _)| wasi_http.serves(name))
        .map(|(name, _)| name.to_string())
        .collect();
    imports.sort_by_key(|name| !name.starts_with("wasi:http/outgoing-handler"));
    imports.into_iter().next()
}

/// What a look for the fleet's artifact found.
enum Artifact {
    Loaded(Component),
    /// There, but not this component's, this engine's, or whole (logged).
    Refused,
    Absent,
    /// The store did not answer: the reason.
    Unreadable(String),
}

/// The native code a compilation made, as it is shared: the compiled
/// cache's file of it, or its bytes when no cache kept them.
enum Code {
    Kept { path: PathBuf, digest: [u8; 32] },
    Bytes(Vec<u8>),
}

/// A compiled component and what it cost.
pub(crate) struct Compiled {
    pub(crate) component: Component,
    pub(crate) origin: Origin,
}

/// `18.4 MB`, as the compile log line shows a component's size.
pub fn megabytes(bytes: usize) -> String {
    format!("{:.1} MB", bytes as f64 / 1_000_000.0)
}

/// A short content digest: the plugin's version as status and logs show it.
pub fn version_of(bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// The plugin's outbound HTTP pool, if it is granted any host: trusting
/// its `http_ca` besides the public roots. A connect never usefully
/// outlasts a call.
fn http_pool(config: &PluginConfig) -> Result<Option<http::HttpPool>, LoadError> {
    if config.grants.http.is_empty() {
        return Ok(None);
    }
    let refused = |reason: String| LoadError::Grant {
        plugin: config.name.clone(),
        dir: "grants.http".to_string(),
        reason,
    };
    let private_roots = match &config.http_ca {
        Some(path) => {
            crate::config::read_roots(path).map_err(|err| refused(format!("http_ca: {err}")))?
        }
        None => Vec::new(),
    };
    http::pool(config.deadline, config.http_keep_alive, private_roots)
        .map(Some)
        .map_err(|err| refused(format!("no TLS client: {err}")))
}

/// Cranelift's threads free hundreds of MiB once a big component (a Python
/// or JavaScript one) is compiled, and glibc keeps what they freed in their
/// arenas (360 MiB resident with one Python plugin; 165 after a trim).
/// Hand it back to the system.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free pages of the allocator's arenas, under their locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wit_version_is_the_packages() {
        let wit = include_str!("../../../wit/types.wit");
        assert!(
            wit.contains(&format!("package weir:plugin@{WIT_VERSION};")),
            "wit/types.wit names another version than WIT_VERSION"
        );
    }

    #[test]
    fn an_imports_weir_plugin_version_is_read_from_its_name() {
        assert_eq!(imported_version("weir:plugin/host@0.1.0"), Some("0.1.0"));
        assert_eq!(imported_version("weir:plugin/types@0.3.0"), Some("0.3.0"));
        assert_eq!(imported_version("wasi:io/streams@0.2.6"), None);
        assert_eq!(imported_version("weir:plugin/host"), None);
    }

    #[test]
    fn a_deadline_waits_for_the_ticker_to_count_a_pause_it_has_not_seen() {
        let pauses = Pauses::new();
        let woke = pauses.since + Duration::from_secs(1);
        pauses.ticked(woke, Duration::ZERO);
        assert!(pauses.current_at(woke + EPOCH_TICK));
        // A SIGSTOP the ticker slept through: until it wakes, not current.
        let resumed = woke + Duration::from_millis(2500);
        assert!(!pauses.current_at(resumed));
        pauses.ticked(resumed, resumed - woke - EPOCH_TICK);
        assert!(pauses.current_at(resumed));
        assert_eq!(pauses.total(), Duration::from_millis(2490));
    }
}
