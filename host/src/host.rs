//! A running weir host: wires the parts together in the order a row meets
//! them, and takes them down in reverse on shutdown.
//!
//! Start: NATS (embedded or configured) → topology → sandbox and plugins →
//! delivery workers → front door. Stop: front door → workers finish their
//! batch → NATS flushed → embedded server stopped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, SyncPolicy};
use crate::coordination::{Coordination, CoordinationError, Membership, host_id};
use crate::delivery::{Pipelines, UnitWorker};
use crate::embedded_nats::{EmbeddedError, EmbeddedNats, EmbeddedOptions};
use crate::front_door::{FrontDoor, Gate};
use crate::kv::NatsKv;
use crate::publish::Publisher;
use crate::reload::{FleetReleases, Reloader, plugin_status};
use crate::route::Router;
use crate::sandbox::{LoadError, Sandbox, SandboxError};
use crate::status::{NatsStatus, StatusSource};
use crate::telemetry::Metrics;
use crate::telemetry::SeverityLabels;
use crate::topology::{Manifest, Mismatch, RECHECK_PERIOD, Severity, TopologyError};
use crate::usage::Ledger;

/// How long the first connection to NATS may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Permission violations remembered for the boot report.
const MAX_REMEMBERED_REFUSALS: usize = 32;
/// How long shutdown waits for the last acks to reach NATS.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a host could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("embedded nats-server: {0}")]
    Embedded(#[from] EmbeddedError),
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("topology: {0}")]
    Topology(#[from] TopologyError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Plugin(#[from] LoadError),
    #[error(transparent)]
    Coordination(#[from] CoordinationError),
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
}

impl RunningHost {
    /// Starts every part of a host from a validated config.
    pub async fn start(config: Config) -> Result<RunningHost, StartError> {
        let config = Arc::new(config);
        let metrics = Metrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);

        let embedded = match &config.nats.url {
            Some(_) => None,
            None => {
                let options = EmbeddedOptions {
                    binary: config.nats.embedded.binary.clone(),
                    data_dir: config.data_dir.join("nats"),
                    sync: config.nats.embedded.sync,
                    port: None,
                    extra_config: String::new(),
                };
                let started = tokio::task::spawn_blocking(move || EmbeddedNats::start(&options))
                    .await
                    .map_err(|err| EmbeddedError::NotReady {
                        output: err.to_string(),
                    })??;
                Some(started)
            }
        };
        let nats_url = match (&config.nats.url, &embedded) {
            (Some(url), _) => url.clone(),
            (None, Some(server)) => server.url().to_string(),
            (None, None) => unreachable!("an embedded server is started when no url is set"),
        };
        let refusals = Refusals::default();
        let client = connect(&nats_url, &refusals).await?;
        let js = jetstream::new(client.clone());
        let router = Router::new(
            &config.stream.prefix,
            config.stream.partitions,
            config.stream.shards,
        );
        let manifest = Manifest::new(&router, &config.stream, &config.delivery, None);
        if embedded.is_some() || config.stream.create {
            manifest.create(&js).await?;
        } else {
            let mut mismatches = manifest.verify(&js).await;
            if let Ok(list) = refusals.lock() {
                mismatches.extend(list.iter().map(|refused| Mismatch::refused(refused)));
            }
            record_mismatches(&metrics, &mismatches);
            if mismatches.iter().any(|m| m.severity == Severity::Required) {
                return Err(TopologyError::Mismatch(mismatches).into());
            }
        }

        let sandbox = Arc::new(
            Sandbox::new(metrics.clone())?.with_cache_dir(config.data_dir.join("compiled")),
        );
        let mut plugins = HashMap::new();
        for plugin in config.plugins.values() {
            plugins.insert(plugin.name.clone(), sandbox.load(plugin).await?);
        }
        let pipelines = Pipelines::new(config.clone(), plugins);
        let first_gate = Gate::new(&pipelines);
        let running_plugins = Arc::new(std::sync::RwLock::new(plugin_status(pipelines.plugins())));
        let (generations, _) = tokio::sync::watch::channel(Arc::new(pipelines));

        let shutdown = CancellationToken::new();
        let mut tasks = Vec::new();
        if embedded.is_none() && !config.stream.create {
            let (js, metrics, stop) = (js.clone(), metrics.clone(), shutdown.clone());
            tasks.push(tokio::spawn(async move {
                recheck_topology(manifest, js, metrics, stop).await;
            }));
        }
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| StartError::Listen {
                addr: config.listen,
                source,
            })?;
        let http_addr = listener.local_addr().map_err(|source| StartError::Listen {
            addr: config.listen,
            source,
        })?;

        let workers = UnitWorker::factory(
            js.clone(),
            router.clone(),
            generations.clone(),
            metrics.clone(),
        );
        let me = host_id(config.coordination.host_id.as_deref(), &config.data_dir)?;
        let kv = NatsKv::open(&client, &router.coordination_bucket())
            .await
            .map_err(CoordinationError::from)?;
        let ledger = Ledger::new(&me);
        let coordination = Coordination::join(Membership {
            kv: kv.clone(),
            client: client.clone(),
            router: router.clone(),
            me: me.clone(),
            http: http_addr.to_string(),
            ttl: config.coordination.member_ttl,
            workers,
            metrics: metrics.clone(),
            plugins: running_plugins.clone(),
            ledger: ledger.clone(),
        })
        .await?;
        let usage = ledger.clone().run(
            client.clone(),
            kv,
            router.clone(),
            coordination.view(),
            shutdown.clone(),
        );
        tasks.push(tokio::spawn(usage));

        let (gates, gate) = tokio::sync::watch::channel(Arc::new(first_gate));
        let (reload_sender, reload_requests) = tokio::sync::mpsc::channel(4);
        let reloader = Reloader::new(
            sandbox.clone(),
            generations,
            gates,
            running_plugins.clone(),
            metrics.clone(),
        )
        .with_requests(reload_requests)
        .with_fleet(FleetReleases {
            view: coordination.view(),
            client: client.clone(),
            router: router.clone(),
            dir: config.data_dir.join("pushed"),
        });
        let stop = shutdown.clone();
        let baseline = reloader.fingerprint().await;
        tasks.push(tokio::spawn(reloader.watch(baseline, stop)));

        let status = StatusSource {
            metrics: metrics.clone(),
            registry: Arc::new(registry),
            plugins: running_plugins,
            client: client.clone(),
            router: router.clone(),
            fleet: coordination.view(),
            ledger: ledger.clone(),
            nats: NatsStatus {
                url: nats_url.clone(),
                connected: true,
                embedded: embedded.is_some(),
                sync: embedded.as_ref().map(|_| {
                    match config.nats.embedded.sync {
                        SyncPolicy::Always => "always",
                        SyncPolicy::Periodic => "periodic",
                    }
                    .to_string()
                }),
            },
        };
        let front_door = FrontDoor::new(
            gate,
            Publisher::new(client.clone(), router.clone()),
            metrics.clone(),
            status.clone(),
            reload_sender,
            ledger.clone(),
        );
        let stop = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            let served = axum::serve(listener, front_door.router())
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
            if let Err(err) = served {
                tracing::error!(error = %err, "front door stopped");
            }
        }));
        tracing::info!(listen = %http_addr, nats = %nats_url, member = %me, "weir is running");

        Ok(RunningHost {
            http_addr,
            nats_url,
            status,
            shutdown,
            tasks,
            coordination: Some(coordination),
            client,
            embedded,
            _sandbox: sandbox,
        })
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
        if self.client.connection_state() != async_nats::connection::State::Connected {
            tracing::warn!("NATS is disconnected; rows not acked yet will be redelivered");
        } else {
            match tokio::time::timeout(FLUSH_TIMEOUT, self.client.flush()).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::warn!(error = %err, "cannot flush the last acks to NATS"),
                Err(_) => tracing::warn!(
                    "NATS did not take the last acks in time; those rows will be redelivered"
                ),
            }
        }
        drop(self.client);
        if let Some(mut server) = self.embedded.take() {
            let _ = tokio::task::spawn_blocking(move || server.stop()).await;
        }
        tracing::info!("weir stopped");
    }
}

/// A plain connection for operator commands (`weir dlq`), with the same
/// handling of credentials in the URL as a host's.
pub async fn connect_to(url: &str) -> Result<async_nats::Client, StartError> {
    connect(url, &Refusals::default()).await
}

/// Permission violations the server reported, kept to explain a failed boot.
type Refusals = Arc<std::sync::Mutex<Vec<String>>>;

async fn connect(url: &str, denied: &Refusals) -> Result<async_nats::Client, StartError> {
    let error = |reason: String| StartError::Connect {
        url: url.to_string(),
        reason,
    };
    // Credentials in the URL (`nats://user:password@host`) are not used by
    // async-nats on their own: pass them explicitly.
    let address: async_nats::ServerAddr = url.parse().map_err(|err| error(format!("{err}")))?;
    let options = match (address.username(), address.password()) {
        (Some(user), Some(password)) => {
            async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
        }
        _ => async_nats::ConnectOptions::new(),
    };
    let refusals = denied.clone();
    let options = options
        .event_callback(move |event| {
            let refusals = refusals.clone();
            async move {
                match event {
                    async_nats::Event::ServerError(async_nats::ServerError::Other(text))
                        if text.contains("Permissions Violation") =>
                    {
                        tracing::error!(refused = %text, "NATS refused an operation to weir's user");
                        if let Ok(mut list) = refusals.lock()
                            && list.len() < MAX_REMEMBERED_REFUSALS
                        {
                            list.push(text);
                        }
                    }
                    async_nats::Event::Connected => tracing::info!("connected to NATS"),
                    other => tracing::warn!(event = %other, "NATS connection event"),
                }
            }
        })
        .name("weir")
        .connection_timeout(CONNECT_TIMEOUT)
        .retry_on_initial_connect();
    tokio::time::timeout(CONNECT_TIMEOUT, options.connect(url))
        .await
        .map_err(|_| error(format!("no answer within {CONNECT_TIMEOUT:?}")))?
        .map_err(|err| error(err.to_string()))
}

/// Logs every difference and exposes the counts as a metric.
fn record_mismatches(metrics: &Metrics, mismatches: &[Mismatch]) {
    for severity in [Severity::Required, Severity::Recommended] {
        let count = mismatches.iter().filter(|m| m.severity == severity).count();
        metrics
            .topology_mismatches
            .get_or_create(&SeverityLabels { severity })
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
/// boot shows up in the logs and the `weir_topology_mismatches` metric.
async fn recheck_topology(
    manifest: Manifest,
    js: jetstream::Context,
    metrics: Metrics,
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
            last = found;
        }
    }
}
