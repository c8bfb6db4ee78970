//! A running weir host, assembled in a straight line from the validated
//! config: NATS → topology → sandbox (the first generation of plugins) →
//! coordination (with delivery workers plugged in) → reload → front door
//! (HTTP and NATS doors) and operator endpoints. Shutdown runs the other
//! way: the doors stop (the NATS door drains its subscription, answering
//! what it took), every unit is handed over after its last batch, acks are
//! flushed, the embedded server stops.
//!
//! This is the only module that knows every subsystem: each of them takes
//! the handles it needs here, and none reaches for another's internals.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, SyncPolicy};
use crate::coordination::{
    ClaimGate, Coordination, CoordinationError, KeyFollower, Lease, Membership, PluginVersions,
    UnitEnd, UnitError, UnitRunner, host_id,
};
use crate::delivery::worker::{Behind, DeliveryError, ISOLATION_LANES, Workers};
use crate::ingest::front_door::{FrontDoor, Gate};
use crate::ingest::idempotency::RequestKeys;
use crate::ingest::listener;
use crate::ingest::nats_door::{self, NatsDoorError};
use crate::ingest::publish::Publisher;
use crate::ingest::tls::FrontDoorTls;
use crate::ingest::usage::Ledger;
use crate::nats::connection::{self, ConnectError, Refusals};
use crate::nats::embedded::{
    EmbeddedError, EmbeddedNats, EmbeddedOptions, random_password, write_private,
};
use crate::nats::kv::NatsKv;
use crate::ops::history::QueuedHistory;
use crate::ops::http::Ops;
use crate::ops::page::Page;
use crate::ops::readiness::Readiness;
use crate::ops::status::{NatsStatus, StatusSource};
use crate::reload::generation::Generation;
use crate::reload::releases::{
    FleetCompiled, Prepare, Release, ReleaseFollower, StoreError, Tallies,
};
use crate::reload::{FleetReleases, Reloader, behind_fleet, released_files, with_files};
use crate::sandbox::{LoadError, Sandbox, SandboxError};
use crate::state::store::StateStore;
use crate::telemetry::traces::{Traces, TracesError};
use crate::telemetry::{Metrics, SeverityLabels};
use crate::topology::manifest::{Manifest, Mismatch, RECHECK_PERIOD, Severity, TopologyError};
use crate::topology::route::{Names, Unit};

/// How long shutdown waits for the connection to NATS to close.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the boot's verification looks for a refusal by the server,
/// and how long it then waits for the refusals of its other requests.
const REFUSAL_POLL: Duration = Duration::from_millis(50);
const REFUSALS_GRACE: Duration = Duration::from_millis(500);

/// Why a host could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("embedded nats-server: {0}")]
    Embedded(#[from] EmbeddedError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("topology: {0}")]
    Topology(#[from] TopologyError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Plugin(#[from] LoadError),
    #[error("[traces]: {0}")]
    Traces(#[from] TracesError),
    #[error("[tls]: {0}")]
    Tls(#[from] crate::config::TlsFileError),
    #[error("the fleet's plugin releases: {0}")]
    Release(#[from] StoreError),
    #[error(transparent)]
    Coordination(#[from] CoordinationError),
    #[error(
        "data dir {dir} is in use by another weir (pid {holder}): give each host its own `data_dir`"
    )]
    DataDirInUse { dir: String, holder: String },
    #[error("cannot lock data dir {dir}: {source}")]
    DataDir { dir: String, source: std::io::Error },
    #[error(transparent)]
    NatsDoor(#[from] NatsDoorError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A host that is serving. Call [`RunningHost::shutdown`] to stop it cleanly.
pub struct RunningHost {
    http_addr: SocketAddr,
    nats_url: String,
    status: StatusSource,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    coordination: Option<Coordination>,
    client: async_nats::Client,
    embedded: Option<EmbeddedNats>,
    _sandbox: Arc<Sandbox>,
    /// Sent on at the stop: spans still batched.
    traces: Traces,
    /// Held until the host has stopped: one host per data dir.
    data_dir_lock: std::fs::File,
}

/// What a start has once NATS is reached and the topology is in place.
struct Connected {
    embedded: Option<EmbeddedNats>,
    nats_url: String,
    client: async_nats::Client,
    js: jetstream::Context,
    router: Names,
    readiness: Readiness,
}

/// What a start has once it joined the fleet.
struct Joined {
    me: String,
    coordination: Coordination,
    ledger: Ledger,
    request_keys: RequestKeys,
    /// The coordination bucket (fleet release answers go there).
    kv: NatsKv,
    releases: watch::Receiver<std::collections::BTreeMap<String, Release>>,
    prepares: watch::Receiver<std::collections::BTreeMap<String, Prepare>>,
    /// Each member's canary counts, as the coordination watch brings them.
    tallies: watch::Receiver<Tallies>,
    traces: Traces,
    /// The page's chart, sampled from `ledger`.
    queued_history: QueuedHistory,
    /// Why this host's plugin versions are not the fleet's, if not.
    behind: Behind,
}

impl Joined {
    /// What the status report reads: the counters, the running
    /// generation, NATS, and the fleet as this host joined it.
    fn status_source(
        &self,
        (metrics, registry): (&Metrics, Registry),
        generations: &watch::Sender<Arc<Generation>>,
        (client, router): (&async_nats::Client, &Names),
        nats: NatsStatus,
    ) -> StatusSource {
        StatusSource {
            metrics: metrics.clone(),
            registry: Arc::new(registry),
            generations: generations.subscribe(),
            client: client.clone(),
            router: router.clone(),
            nats,
            fleet: self.coordination.view(),
            ledger: self.ledger.clone(),
            queued_history: self.queued_history.clone(),
            releases: self.releases.clone(),
            tallies: self.tallies.clone(),
            reasons: Default::default(),
        }
    }
}

impl RunningHost {
    /// Starts every part of a host from a validated config.
    pub async fn start(config: Config) -> Result<RunningHost, StartError> {
        let config = Arc::new(config);
        let data_dir_lock = lock_data_dir(&config.data_dir)?;
        let shutdown = CancellationToken::new();
        // A start that fails half-way stops the tasks it had started.
        let stop_if_failed = shutdown.clone().drop_guard();
        let mut tasks = Vec::new();
        let metrics = Metrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);

        // NATS and the topology on it.
        let Connected {
            embedded,
            nats_url,
            client,
            js,
            router,
            readiness,
        } = Self::connect(&config, &metrics, &shutdown, &mut tasks).await?;

        // Sandbox: the first generation of plugins, each the fleet's release
        // of it where one was pushed (not this host's own file).
        let pushed_dir = config.data_dir.join("pushed");
        let released = released_files(&client, &router, &config, &pushed_dir).await?;
        let (sandbox, generation) =
            Self::first_generation(&config, &released, (&client, &router), &metrics).await?;
        let first_gate = Gate::new(generation.config().clone(), |name| {
            generation.plugin(name).cloned()
        });
        let (generations, _) = watch::channel(Arc::new(generation));
        let (gates, gate) = watch::channel(Arc::new(first_gate));

        // The front door's socket, bound before joining: members advertise it.
        let (listener, http_addr) = Self::bind(config.listen).await?;

        // Coordination: join the fleet; delivery runs the units it gives us.
        let joined = Self::join(
            &config,
            (&client, &js, &router),
            http_addr,
            &generations,
            &metrics,
            &pushed_dir,
            &shutdown,
            &mut tasks,
        )
        .await?;

        readiness.follow_fleet(joined.behind.clone());
        // Reload: files, SIGHUP, the admin API and fleet releases.
        let (reload_requests, requests) = tokio::sync::mpsc::channel(4);
        let reloader = Reloader::new(sandbox.clone(), generations.clone(), gates, metrics.clone())
            .with_requests(requests)
            .with_fleet(FleetReleases {
                releases: joined.releases.clone(),
                client: client.clone(),
                router: router.clone(),
                dir: pushed_dir,
                started_with: released,
                prepares: joined.prepares.clone(),
                kv: joined.kv.clone(),
                me: joined.me.clone(),
                tallies: joined.tallies.clone(),
                fleet: joined.coordination.view(),
            });
        let baseline = reloader.fingerprint().await;
        tasks.push(tokio::spawn(reloader.watch(baseline, shutdown.clone())));

        // The front door and the operator endpoints, on one listener.
        let status = joined.status_source(
            (&metrics, registry),
            &generations,
            (&client, &router),
            nats_status(&config, &nats_url, embedded.is_some()),
        );
        let front_door = Arc::new(
            FrontDoor::new(
                gate,
                Publisher::new(client.clone(), router.clone(), config.stream.max_bytes),
                metrics.clone(),
                joined.ledger,
                joined.request_keys,
            )
            .with_traces(joined.traces.clone()),
        );
        let ops = Ops {
            status: status.clone(),
            generations: generations.subscribe(),
            reloads: reload_requests,
            readiness: readiness.clone(),
        };
        let page = Page::new(status.clone(), generations.subscribe());
        let scheme = Self::serve_doors(
            &config,
            listener,
            (front_door, ops, page),
            (&nats_url, &router),
            &metrics,
            &shutdown,
            &mut tasks,
        )
        .await?;
        tracing::info!(listen = %http_addr, scheme, nats = %connection::redact(&nats_url), member = %joined.me, "weir is running");
        stop_if_failed.disarm();

        Ok(RunningHost {
            http_addr,
            nats_url,
            status,
            shutdown,
            tasks,
            coordination: Some(joined.coordination),
            client,
            embedded,
            _sandbox: sandbox,
            traces: joined.traces,
            data_dir_lock,
        })
    }

    /// Joins the fleet as this host's member: delivery runs the units the
    /// assignment gives it, the ledger and the plugin releases follow the
    /// coordination bucket, and claims wait while this host's plugin
    /// versions are not the fleet's.
    #[allow(clippy::too_many_arguments)]
    async fn join(
        config: &Config,
        (client, js, router): (&async_nats::Client, &jetstream::Context, &Names),
        http_addr: SocketAddr,
        generations: &watch::Sender<Arc<Generation>>,
        metrics: &Metrics,
        pushed_dir: &std::path::Path,
        shutdown: &CancellationToken,
        tasks: &mut Vec<JoinHandle<()>>,
    ) -> Result<Joined, StartError> {
        let me = host_id(config.coordination.host_id.as_deref(), &config.data_dir)?;
        let traces = match &config.traces.otlp_endpoint {
            Some(endpoint) => Traces::export(
                endpoint,
                &config.traces.service_name,
                &me,
                config.traces.sample_percent,
            )?,
            None => Traces::default(),
        };
        let (kv, state) = Self::open_buckets(client, router).await?;
        let ledger = Ledger::new(&me);
        let (release_follower, releases) = ReleaseFollower::new();
        let prepares = release_follower.prepares();
        let tallies = release_follower.tallies();
        let followers: Vec<Arc<dyn KeyFollower>> = vec![Arc::new(ledger.clone()), release_follower];
        let claims = claim_gate(
            generations.subscribe(),
            releases.clone(),
            pushed_dir.to_path_buf(),
            shutdown,
            tasks,
        );
        let workers = Workers {
            js: js.clone(),
            router: router.clone(),
            generations: generations.clone(),
            metrics: metrics.clone(),
            state,
            settled: Some({
                let ledger = ledger.clone();
                Arc::new(move |partition, delivered| ledger.settled(partition, delivered))
            }),
            behind: claims.holds_back.clone(),
            traces: traces.clone(),
            shadows: Default::default(),
        };
        let behind = claims.holds_back.clone();
        let coordination = Self::join_fleet(
            config, client, &kv, &me, http_addr, workers, followers, claims,
        )
        .await?;
        let request_keys = RequestKeys::new(kv.clone(), config.stream.duplicate_window);
        tasks.push(tokio::spawn(ledger.clone().run(
            client.clone(),
            kv.clone(),
            router.clone(),
            coordination.view(),
            shutdown.clone(),
        )));

        let queued_history = QueuedHistory::default();
        tasks.push(tokio::spawn(
            queued_history
                .clone()
                .record(ledger.clone(), shutdown.clone()),
        ));
        Ok(Joined {
            me,
            queued_history,
            behind,
            coordination,
            ledger,
            request_keys,
            kv,
            releases,
            prepares,
            tallies,
            traces,
        })
    }

    /// Serves the front door, the operator endpoints and the live page on
    /// `listener` (HTTPS with `[tls]`, its files followed), and the NATS
    /// door through the same front door; says the scheme served.
    async fn serve_doors(
        config: &Config,
        listener: tokio::net::TcpListener,
        (front_door, ops, page): (Arc<FrontDoor>, Ops, Page),
        (nats_url, router): (&str, &Names),
        metrics: &Metrics,
        shutdown: &CancellationToken,
        tasks: &mut Vec<JoinHandle<()>>,
    ) -> Result<&'static str, StartError> {
        let routes = front_door
            .clone()
            .router()
            .merge(ops.router())
            .merge(page.router());
        let tls = match &config.tls {
            Some(files) => {
                let tls = FrontDoorTls::load(files.clone())?;
                tasks.push(tokio::spawn(tls.clone().follow(shutdown.clone())));
                Some(tls)
            }
            None => None,
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        tasks.push(tokio::spawn(listener::serve(
            listener,
            routes,
            metrics.clone(),
            tls,
            shutdown.clone(),
        )));
        // The NATS door, through the same front door, on a connection of its
        // own: one task reads and writes a connection, and on `client` that
        // task carries every row's publish and PubAck; the requests' bodies
        // and answers must not queue behind them (nor they behind a body).
        if config.nats.ingest {
            let door_client =
                connection::connect(nats_url, &config.nats.auth, &Refusals::default()).await?;
            tasks.push(
                nats_door::start(door_client, router.clone(), front_door, shutdown.clone()).await?,
            );
        }
        Ok(scheme)
    }

    /// Joins the fleet as `me`: delivery (`workers`) runs the units it gives
    /// us, and the followers follow the coordination bucket; `gate` holds
    /// claims back while this host's plugin versions are not the fleet's.
    #[allow(clippy::too_many_arguments)]
    async fn join_fleet(
        config: &Config,
        client: &async_nats::Client,
        kv: &NatsKv,
        me: &str,
        http_addr: SocketAddr,
        workers: Workers,
        followers: Vec<Arc<dyn KeyFollower>>,
        gate: ClaimGate,
    ) -> Result<Coordination, StartError> {
        let membership = Membership {
            kv: kv.clone(),
            client: client.clone(),
            router: workers.router.clone(),
            me: me.to_string(),
            http: http_addr.to_string(),
            ttl: config.coordination.member_ttl,
            metrics: workers.metrics.clone(),
            plugins: running_versions(workers.generations.subscribe()),
            plugins_changed: generation_changes(workers.generations.subscribe()),
            units: Arc::new(DeliveryUnits(workers)),
            followers,
            drain_timeout: config.delivery.drain_timeout,
            gate,
            ack_wait: config.delivery.ack_wait,
        };
        Ok(Coordination::join(membership).await?)
    }

    /// NATS (the embedded default, or the configured server), then the
    /// topology on it: created, or verified (and re-verified while running).
    async fn connect(
        config: &Config,
        metrics: &Metrics,
        shutdown: &CancellationToken,
        tasks: &mut Vec<JoinHandle<()>>,
    ) -> Result<Connected, StartError> {
        let embedded = start_embedded(config).await?;
        let nats_url = match (&config.nats.url, &embedded) {
            (Some(url), _) => url.clone(),
            (None, Some(server)) => server.url().to_string(),
            (None, None) => unreachable!("an embedded server is started when no url is set"),
        };
        let refusals = Refusals::default();
        let client = connection::connect(&nats_url, &config.nats.auth, &refusals).await?;
        let js = jetstream::new(client.clone());

        let router = Names::new(
            &config.stream.prefix,
            config.stream.partitions,
            config.stream.shards,
        );
        let manifest = Manifest::new(&router, &config.stream, &config.delivery, None)
            .with_dead_letters(&router, &config.dead_letters);
        let readiness = Readiness::new(client.clone());
        tasks.push(tokio::spawn(
            readiness.clone().probe(router.clone(), shutdown.clone()),
        ));
        if embedded.is_some() || config.stream.create {
            manifest.create(&js).await?;
        } else {
            let readiness_subject = router.readiness_subject();
            verify_topology(&manifest, &js, &readiness_subject, &refusals, metrics).await?;
            let (js, metrics, stop) = (js.clone(), metrics.clone(), shutdown.clone());
            let ready = readiness.clone();
            tasks.push(tokio::spawn(recheck_topology(
                manifest, js, metrics, ready, stop,
            )));
        }
        Ok(Connected {
            embedded,
            nats_url,
            client,
            js,
            router,
            readiness,
        })
    }

    /// The sandbox and the first generation of plugins it loads: the
    /// config's, with the fleet's released files (`released`) in place,
    /// each compiled once for the fleet (`FleetCompiled`).
    async fn first_generation(
        config: &Arc<Config>,
        released: &std::collections::BTreeMap<String, std::path::PathBuf>,
        (client, router): (&async_nats::Client, &Names),
        metrics: &Metrics,
    ) -> Result<(Arc<Sandbox>, Generation), StartError> {
        let mut sandbox = Sandbox::with_pool(metrics.clone(), instance_pool(config))?.with_cache(
            config.compile_cache_dir.clone(),
            config.compile_cache_max_bytes,
        );
        let me = host_id(config.coordination.host_id.as_deref(), &config.data_dir)?;
        if let Some(fleet) = FleetCompiled::open(client, router, &me).await {
            sandbox = sandbox.with_fleet(fleet);
        }
        let sandbox = Arc::new(sandbox);
        let config = match released.is_empty() {
            true => config.clone(),
            false => Arc::new(with_files(config, released)),
        };
        let mut plugins = HashMap::new();
        for plugin in config.plugins.values() {
            let loaded = sandbox.load(plugin).await?;
            if released.contains_key(&plugin.name) {
                tracing::info!(plugin = %plugin.name, version = %loaded.version, "loaded the fleet's release");
            }
            plugins.insert(plugin.name.clone(), loaded);
        }
        Ok((sandbox, Generation::new(config, plugins)))
    }

    /// The HTTP listener's socket and the address it got.
    async fn bind(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), StartError> {
        let listen = |source| StartError::Listen { addr, source };
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(listen)?;
        let http_addr = listener.local_addr().map_err(listen)?;
        Ok((listener, http_addr))
    }

    /// The coordination bucket, and the plugin state store. The state's
    /// bucket is in the manifest, so verification already said whether it
    /// is there; it is opened whether or not a plugin keeps state now: a
    /// reload may grant it.
    async fn open_buckets(
        client: &async_nats::Client,
        router: &Names,
    ) -> Result<(NatsKv, Option<StateStore<NatsKv>>), StartError> {
        let kv = NatsKv::open(client, &router.coordination_bucket())
            .await
            .map_err(CoordinationError::from)?;
        let state = NatsKv::open(client, &router.state_bucket())
            .await
            .map_err(CoordinationError::from)?;
        Ok((kv, Some(StateStore::new(state))))
    }

    /// Where the front door listens.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn nats_url(&self) -> &str {
        &self.nats_url
    }

    pub fn status(&self) -> &StatusSource {
        &self.status
    }

    /// Stops taking requests, hands every unit over (each worker finishes
    /// the rows it was sent), flushes acks and stops the embedded server.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        if let Some(coordination) = self.coordination.take() {
            coordination.leave().await;
        }
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        // The exporter's flush blocks its caller until the collector answers.
        let traces = self.traces.clone();
        let flushed = tokio::task::spawn_blocking(move || traces.flush());
        if tokio::time::timeout(FLUSH_TIMEOUT, flushed).await.is_err() {
            tracing::warn!("the OTLP collector did not take the last spans in time");
        }
        if !connection::connected(&self.client) {
            tracing::warn!("NATS is disconnected; rows not acked yet will be redelivered");
        } else if let Err(err) = connection::close(&self.client, FLUSH_TIMEOUT).await {
            tracing::warn!(error = %err, "cannot close the NATS connection cleanly");
        }
        drop(self.client);
        if let Some(mut server) = self.embedded.take() {
            let _ = tokio::task::spawn_blocking(move || server.stop()).await;
        }
        // Last: the next host on this data dir may start now.
        let _ = self.data_dir_lock.unlock();
        tracing::info!("weir stopped");
    }
}

/// Units whose isolation lanes the instance pool makes room for at once;
/// more wait for instances (back-pressure).
const ISOLATING_UNITS: u32 = 8;

/// The plugin instance pool's size, from the config (see
/// [`Config::plugin_instances`]).
fn instance_pool(config: &Config) -> u32 {
    let lanes = u32::try_from(ISOLATION_LANES).unwrap_or(u32::MAX);
    let instances = config.plugin_instances(lanes, ISOLATING_UNITS);
    tracing::debug!(instances, "plugin instance pool");
    instances
}

/// Delivery plugged into coordination: running a unit is running its worker.
pub struct DeliveryUnits(pub Workers);

impl UnitRunner for DeliveryUnits {
    fn run(
        &self,
        unit: Unit,
        release: CancellationToken,
        lease: Lease,
        settled_through: u64,
    ) -> BoxFuture<'static, Result<UnitEnd, UnitError>> {
        let worker = self.0.worker(unit);
        async move {
            worker
                .run(release, lease, settled_through)
                .await
                .map_err(|err| match err {
                    DeliveryError::Bind { consumer, source } => UnitError::Bind {
                        consumer,
                        source: Box::new(source),
                    },
                })
        }
        .boxed()
    }
}

/// Holds claims back while the running generation is not what the fleet's
/// releases say (a push this host has not loaded yet); woken by every new
/// generation and every release change.
fn claim_gate(
    generations: watch::Receiver<Arc<Generation>>,
    releases: watch::Receiver<std::collections::BTreeMap<String, Release>>,
    pushed_dir: std::path::PathBuf,
    shutdown: &CancellationToken,
    tasks: &mut Vec<JoinHandle<()>>,
) -> ClaimGate {
    let wake = Arc::new(tokio::sync::Notify::new());
    let (mut changed_generation, mut changed_releases) = (generations.clone(), releases.clone());
    let (waker, stop) = (wake.clone(), shutdown.clone());
    tasks.push(tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                Ok(()) = changed_generation.changed() => waker.notify_one(),
                Ok(()) = changed_releases.changed() => waker.notify_one(),
                else => return,
            }
        }
    }));
    ClaimGate {
        holds_back: Arc::new(move || {
            behind_fleet(&generations.borrow(), &releases.borrow(), &pushed_dir)
        }),
        wake,
    }
}

/// The plugin versions of the running generation, for member keys.
fn running_versions(generations: watch::Receiver<Arc<Generation>>) -> PluginVersions {
    Arc::new(move || {
        generations
            .borrow()
            .plugins()
            .map(|plugin| (plugin.name().to_string(), plugin.version.clone()))
            .collect()
    })
}

/// Notified at each new generation, for as long as generations are made.
fn generation_changes(
    mut generations: watch::Receiver<Arc<Generation>>,
) -> Arc<tokio::sync::Notify> {
    let changed = Arc::new(tokio::sync::Notify::new());
    let told = changed.clone();
    tokio::spawn(async move {
        while generations.changed().await.is_ok() {
            told.notify_one();
        }
    });
    changed
}

/// Takes the data dir for this host: a second weir on the same dir would
/// run a second nats-server on the same store under the same member id.
/// The lock is the kernel's (released however the process ends); the file
/// names the holder for the error.
fn lock_data_dir(dir: &std::path::Path) -> Result<std::fs::File, StartError> {
    let io_error = |source| StartError::DataDir {
        dir: dir.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io_error)?;
    let path = dir.join("weir.lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_error)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            return Err(StartError::DataDirInUse {
                dir: dir.display().to_string(),
                holder: holder.trim().to_string(),
            });
        }
        Err(std::fs::TryLockError::Error(source)) => return Err(io_error(source)),
    }
    use std::io::Write;
    file.set_len(0).map_err(io_error)?;
    write!(file, "{}", std::process::id()).map_err(io_error)?;
    Ok(file)
}

/// Where a running host leaves its embedded server's URL (with the
/// password it generated, mode 0600) for operator commands on this machine.
pub fn embedded_url_file(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("nats").join("url")
}

/// Starts the embedded nats-server when no URL is configured. It listens on
/// loopback only and lets in only `weir` with a password generated for this
/// start: other local users can neither publish rows as a tenant nor change
/// the fleet's keys.
async fn start_embedded(config: &Config) -> Result<Option<EmbeddedNats>, EmbeddedError> {
    if config.nats.url.is_some() {
        return Ok(None);
    }
    let data_dir = config.data_dir.join("nats");
    let private = |source| EmbeddedError::DataDir {
        dir: data_dir.clone(),
        source,
    };
    std::fs::create_dir_all(&data_dir).map_err(private)?;
    let options = EmbeddedOptions {
        binary: config.nats.embedded.binary.clone(),
        data_dir: data_dir.clone(),
        sync: config.nats.embedded.sync,
        port: None,
        extra_config: String::new(),
        password: Some(random_password().map_err(private)?),
    };
    let started = tokio::task::spawn_blocking(move || EmbeddedNats::start(&options))
        .await
        .map_err(|err| EmbeddedError::NotReady {
            output: err.to_string(),
        })??;
    write_private(&embedded_url_file(&config.data_dir), started.url()).map_err(private)?;
    Ok(Some(started))
}

fn nats_status(config: &Config, url: &str, embedded: bool) -> NatsStatus {
    NatsStatus {
        url: connection::redact(url),
        connected: true,
        answered: true,
        embedded,
        sync: embedded.then(|| {
            match config.nats.embedded.sync {
                SyncPolicy::Always => "always",
                SyncPolicy::Periodic => "periodic",
            }
            .to_string()
        }),
    }
}

/// Verifies an operator's topology at boot: every difference is logged and
/// counted, and a required one (or a refused request) stops the host.
async fn verify_topology(
    manifest: &Manifest,
    js: &jetstream::Context,
    readiness_subject: &str,
    refusals: &Refusals,
    metrics: &Metrics,
) -> Result<(), TopologyError> {
    // The readiness probe's subject is checked here too: a user on
    // permissions printed before it existed would boot and never be ready,
    // where now the boot names it. Its refusal comes before the flush's.
    let client = js.client();
    if client
        .publish(readiness_subject.to_string(), Bytes::new())
        .await
        .is_ok()
    {
        let _ = client.flush().await;
    }
    // A refused request gets no answer and waits out its timeout (30 s
    // before a missing permission was named), but the server says at once
    // what it refused: the verification's requests are all sent together,
    // so their refusals are in within a round trip of the first.
    let refused = async {
        while refusals.list().is_empty() {
            tokio::time::sleep(REFUSAL_POLL).await;
        }
        tokio::time::sleep(REFUSALS_GRACE).await;
    };
    let mut mismatches = tokio::select! {
        found = manifest.verify(js) => found,
        () = refused => Vec::new(),
    };
    mismatches.extend(
        refusals
            .list()
            .iter()
            .map(|refused| Mismatch::refused(refused)),
    );
    record_mismatches(metrics, &mismatches);
    if mismatches.iter().any(|m| m.severity == Severity::Required) {
        return Err(TopologyError::Mismatch(mismatches));
    }
    Ok(())
}

/// Logs every difference and exposes the counts as a metric.
fn record_mismatches(metrics: &Metrics, mismatches: &[Mismatch]) {
    for severity in [Severity::Required, Severity::Recommended] {
        let count = mismatches.iter().filter(|m| m.severity == severity).count();
        metrics
            .topology_mismatches
            .get_or_create(&SeverityLabels {
                severity: severity.as_str(),
            })
            .set(count as i64);
    }
    for mismatch in mismatches {
        match mismatch.severity {
            Severity::Required => tracing::error!(%mismatch, "topology mismatch"),
            Severity::Recommended => {
                tracing::warn!(%mismatch, "topology differs from the recommended")
            }
        }
    }
}

/// Verifies the topology again every period: an operator's change after
/// boot shows up in the logs, the `weir_topology_mismatches` metric and
/// `/readyz` (a required difference makes the host not ready).
async fn recheck_topology(
    manifest: Manifest,
    js: jetstream::Context,
    metrics: Metrics,
    readiness: Readiness,
    shutdown: CancellationToken,
) {
    let mut last: Vec<Mismatch> = Vec::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(RECHECK_PERIOD) => {}
        }
        let found = manifest.verify(&js).await;
        if found != last {
            record_mismatches(&metrics, &found);
            readiness.set_topology(
                found
                    .iter()
                    .filter(|m| m.severity == Severity::Required)
                    .map(ToString::to_string)
                    .collect(),
            );
            last = found;
        }
    }
}
