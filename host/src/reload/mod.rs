//! Hot reload: watches the TOML file and the plugins' `.wasm` files (and
//! listens for SIGHUP, and follows plugin releases pushed to the fleet
//! through the coordination watch), loads what changed in the background, and publishes
//! a new generation of pipelines that every delivery worker adopts between
//! batches.
//!
//! Architecture invariant: a swap happens only between batches. A worker
//! looks for a new generation before it runs a batch, so a batch in flight
//! finishes on the version it started with and its rows are settled as
//! usual; nothing is acked twice or lost. A refused reload (invalid TOML, a
//! plugin that does not compile, misses its world or traps in `init`)
//! changes nothing: the running generation keeps serving.
//!
//! Exported: the `Generation` of pipelines a worker runs, and
//! [`releases`] as a module: its `push`, `check`, `rollback`, `wait_for`…
//! are named through it.

pub mod canary;
pub(crate) mod generation;
pub mod releases;
pub mod shadow;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::config::PluginConfig;
use crate::config::keys::Reload;
use crate::config::{Config, ConfigError, Overrides};
use crate::coordination::FleetView;
use crate::ingest::front_door::Gate;
use crate::nats::kv::{KvWrite, NatsKv};
use crate::sandbox::{LoadError, Plugin, Sandbox, version_of};
use crate::telemetry::{Metrics, ReloadLabels};
use crate::topology::route::Names;
use canary::{Canary, Counts, Outcome, Report};
use generation::CanaryVersion;
pub use generation::Generation;
use releases::{Prepare, Ready, Release};

/// How often the watched files are looked at.
const POLL: Duration = Duration::from_millis(100);
/// How long the files must hold still before a reload: editors and `cp`
/// write in several steps, and a half-written file must not be loaded.
const SETTLE: Duration = Duration::from_millis(200);

/// Why a reload was refused; the running generation stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("config refused:\n{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Plugin(#[from] LoadError),
}

/// Asks the reloader for a reload; the answer says whether it was applied
/// or why it was refused.
/// A reload asked for (admin API): answered with the settings that changed
/// but need a restart (kept at their running values), or why it was refused.
pub type ReloadRequests = mpsc::Sender<ReloadReply>;
/// Where a requested reload's outcome goes.
pub type ReloadReply = oneshot::Sender<Result<Vec<String>, String>>;

/// The running generation of pipelines and what is needed to replace it.
pub struct Reloader {
    source: PathBuf,
    sandbox: Arc<Sandbox>,
    generations: watch::Sender<Arc<Generation>>,
    gates: watch::Sender<Arc<Gate>>,
    metrics: Metrics,
    fleet: Option<FleetReleases>,
    /// Plugins whose `.wasm` comes from a fleet release instead of the
    /// config: name → the fetched file.
    pushed: Mutex<BTreeMap<String, PathBuf>>,
    /// Versions loaded for a push being prepared, by plugin name: swapped in
    /// as they are when the push becomes the release.
    prepared: Mutex<BTreeMap<String, Arc<Plugin>>>,
    /// Reloads asked for through the admin API.
    requests: Option<mpsc::Receiver<ReloadReply>>,
    /// Candidates of canaries to run beside their releases: name → the
    /// fetched file and the canary.
    canaries: Mutex<BTreeMap<String, (PathBuf, Canary)>>,
    /// What canaried versions did here, kept across generations.
    counts: Arc<Counts>,
}

/// Where fleet releases come from: the coordination watch (through a
/// [`releases::ReleaseFollower`]), and the object store their `.wasm` is
/// fetched from into `dir` (weir's own).
pub struct FleetReleases {
    pub releases: watch::Receiver<BTreeMap<String, Release>>,
    pub client: async_nats::Client,
    pub router: Names,
    pub dir: PathBuf,
    /// The released files the first generation was loaded with
    /// ([`released_files`]).
    pub started_with: BTreeMap<String, PathBuf>,
    /// Pushes being prepared (the same follower's `prepare.` keys).
    pub prepares: watch::Receiver<BTreeMap<String, Prepare>>,
    /// Where this host answers them (`ready.<name>.<me>`).
    pub kv: NatsKv,
    pub me: String,
    /// Each member's counts of each canary (`canary.<name>.<member>`).
    pub tallies: watch::Receiver<BTreeMap<String, BTreeMap<String, Report>>>,
    /// Who the members are: the leader judges canaries.
    pub fleet: watch::Receiver<Arc<FleetView>>,
}

/// The files of the fleet's releases of `config`'s plugins, fetched into
/// `dir` (name → file): a starting host loads these instead of its own
/// files, before it claims a unit, so it never serves a version the fleet
/// no longer runs.
pub async fn released_files(
    client: &async_nats::Client,
    router: &Names,
    config: &Config,
    dir: &std::path::Path,
) -> Result<BTreeMap<String, PathBuf>, releases::StoreError> {
    let mut files = BTreeMap::new();
    for name in config.plugins.keys() {
        let Some(release) = releases::release(client, router, name).await? else {
            continue;
        };
        if let Some(digest) = &release.digest {
            let path = releases::fetch(client, router, name, digest, dir).await?;
            files.insert(name.clone(), path);
        }
    }
    Ok(files)
}

/// `config` with each plugin in `files` loaded from its file there.
pub fn with_files(config: &Config, files: &BTreeMap<String, PathBuf>) -> Config {
    let mut config = config.clone();
    for (name, wasm) in files {
        if let Some(entry) = config.plugins.get_mut(name) {
            entry.wasm = wasm.clone();
        }
    }
    config
}

/// Why `generation` is not what the fleet runs, if it is not: a plugin
/// whose release is another version, or a pushed version (a file under
/// `pushed_dir`) where the fleet went back to each host's own file.
/// Plugins the generation does not have are not this host's to run.
pub fn behind_fleet(
    generation: &Generation,
    releases: &BTreeMap<String, Release>,
    pushed_dir: &std::path::Path,
) -> Option<String> {
    let behind: Vec<String> = releases
        .iter()
        .filter_map(|(name, release)| {
            let plugin = generation.plugin(name)?;
            let candidate = generation.canary(name);
            match (&release.canary, candidate) {
                (None, None) => {}
                (Some(canary), Some(running)) if running.canary == *canary => {}
                (Some(canary), _) => {
                    return Some(format!(
                        "`{name}` has no canary of {} loaded here",
                        releases::version_of_digest(&canary.digest)
                    ));
                }
                (None, Some(running)) => {
                    return Some(format!(
                        "`{name}` runs a canary of {} here that the fleet ended",
                        running.plugin.version
                    ));
                }
            }
            match &release.digest {
                Some(digest) => {
                    let fleet = releases::version_of_digest(digest);
                    (plugin.version != fleet).then(|| {
                        format!(
                            "`{name}` runs {} here, {fleet} in the fleet",
                            plugin.version
                        )
                    })
                }
                None => plugin.config.wasm.starts_with(pushed_dir).then(|| {
                    format!(
                        "`{name}` runs the pushed {} here, each host's own file in the fleet",
                        plugin.version
                    )
                }),
            }
        })
        .collect();
    (!behind.is_empty()).then(|| behind.join("; "))
}

/// How often canary counts are shared and judged.
const CANARY_TICK: Duration = Duration::from_secs(1);
/// A host's counts are written again at least this often while it runs a
/// canary (their TTL is [`canary::TALLY_TTL`]).
const TALLY_REFRESH: Duration = Duration::from_secs(30);

/// Logs each canary that ended between `before` and `after`, and why: on
/// every host, whoever ended it.
fn say_ended(before: &BTreeMap<String, Release>, after: &BTreeMap<String, Release>) {
    for (name, release) in after {
        let Some(ended) = &release.ended else {
            continue;
        };
        if before.get(name).and_then(|r| r.ended.as_ref()) == Some(ended) {
            continue;
        }
        let version = releases::version_of_digest(&ended.digest);
        match ended.outcome {
            Outcome::RolledBack => {
                tracing::warn!(plugin = %name, %version, by = %ended.by, reason = %ended.reason, "the canary was rolled back")
            }
            Outcome::Promoted => {
                tracing::info!(plugin = %name, %version, by = %ended.by, reason = %ended.reason, "the canary was promoted")
            }
        }
    }
}

/// The modification time and length of each watched file (`None`: absent).
pub type Fingerprint = Vec<(PathBuf, Option<(SystemTime, u64)>)>;

impl Reloader {
    pub fn new(
        sandbox: Arc<Sandbox>,
        generations: watch::Sender<Arc<Generation>>,
        gates: watch::Sender<Arc<Gate>>,
        metrics: Metrics,
    ) -> Reloader {
        let source = generations.borrow().config().source.clone();
        let metrics_for_counts = metrics.clone();
        Reloader {
            source,
            sandbox,
            generations,
            gates,
            metrics,
            fleet: None,
            pushed: Mutex::new(BTreeMap::new()),
            prepared: Mutex::new(BTreeMap::new()),
            requests: None,
            canaries: Mutex::new(BTreeMap::new()),
            counts: Arc::new(Counts::with_metrics(metrics_for_counts)),
        }
    }

    /// Also reloads on request (`POST /v1/admin/reload`), answering each.
    pub fn with_requests(mut self, requests: mpsc::Receiver<ReloadReply>) -> Reloader {
        self.requests = Some(requests);
        self
    }

    /// Also follows plugin releases pushed to the fleet.
    pub fn with_fleet(mut self, fleet: FleetReleases) -> Reloader {
        self.pushed = Mutex::new(fleet.started_with.clone());
        self.fleet = Some(fleet);
        self
    }

    /// Re-reads the config and loads every plugin whose file or entry
    /// changed, then publishes the new generation; on any error nothing
    /// changes. Counted in `weir_reloads_total{result}`.
    pub async fn reload(&self) -> Result<Vec<String>, ReloadError> {
        self.reload_from(true).await
    }

    /// [`Reloader::reload`], from the config file or (`from_file` false)
    /// from the running config, with the pushed files in place.
    async fn reload_from(&self, from_file: bool) -> Result<Vec<String>, ReloadError> {
        let result = self.try_reload(from_file).await;
        let label = if result.is_ok() { "applied" } else { "refused" };
        self.metrics
            .reloads
            .get_or_create(&ReloadLabels {
                result: label.to_string(),
            })
            .inc();
        match &result {
            Ok(kept) if kept.is_empty() => {
                tracing::info!(config = %self.source.display(), "reload applied")
            }
            Ok(kept) => tracing::warn!(
                config = %self.source.display(),
                restart_needed = %kept.join(", "),
                "reload applied, except settings only a restart changes: they keep their running values"
            ),
            Err(err) => tracing::error!(
                error = %err,
                "reload refused; the running config and plugins keep serving"
            ),
        }
        result
    }

    async fn try_reload(&self, from_file: bool) -> Result<Vec<String>, ReloadError> {
        let running = self.generations.borrow().clone();
        let (config, kept) = match from_file {
            true => {
                let mut config = Config::load(&self.source, &same_overrides(running.config()))?;
                let kept = keep_restart_only(&mut config, running.config());
                (config, kept)
            }
            false => ((**running.config()).clone(), Vec::new()),
        };
        let mut config = config;
        if let Ok(pushed) = self.pushed.lock() {
            for (name, wasm) in pushed.iter() {
                if let Some(entry) = config.plugins.get_mut(name) {
                    entry.wasm = wasm.clone();
                }
            }
        }
        let mut plugins: HashMap<String, Arc<Plugin>> = HashMap::new();
        for entry in config.plugins.values() {
            let old = running.plugin(&entry.name);
            // Unreadable now: let the load below report it with its path.
            let digest = tokio::fs::read(&entry.wasm)
                .await
                .ok()
                .map(|bytes| version_of(&bytes));
            let plugin = match old {
                Some(old) if old.config == *entry && digest.as_ref() == Some(&old.version) => {
                    old.clone()
                }
                // Loaded already for the push that is now the release.
                _ if let Some(ready) = self.take_prepared(entry, digest.as_deref()) => ready,
                // A canary's candidate, promoted: loaded already.
                _ if let Some(candidate) = running.canary(&entry.name).filter(|c| {
                    c.plugin.config == *entry
                        && Some(c.plugin.version.as_str()) == digest.as_deref()
                }) =>
                {
                    tracing::info!(plugin = %entry.name, version = %candidate.plugin.version, "switching to the canary's candidate");
                    candidate.plugin.clone()
                }
                // Compile, instantiate and `init` it, as at boot.
                _ => {
                    let loaded = self.sandbox.load(entry).await?;
                    tracing::info!(
                        plugin = %entry.name,
                        version = %loaded.version,
                        "plugin version loaded"
                    );
                    loaded
                }
            };
            plugins.insert(entry.name.clone(), plugin);
        }
        let wanted = self
            .canaries
            .lock()
            .map(|canaries| canaries.clone())
            .unwrap_or_default();
        let mut canaries = BTreeMap::new();
        for (name, (path, canary)) in wanted {
            let Some(base) = config.plugins.get(&name) else {
                continue;
            };
            let entry = PluginConfig {
                wasm: path,
                ..base.clone()
            };
            let version = releases::version_of_digest(&canary.digest).to_string();
            let plugin = match running.canary(&name) {
                Some(c) if c.plugin.config == entry && c.plugin.version == version => {
                    c.plugin.clone()
                }
                _ if let Some(ready) = self.take_prepared(&entry, Some(&version)) => ready,
                _ => self.sandbox.load(&entry).await?,
            };
            canaries.insert(name, CanaryVersion { plugin, canary });
        }
        let next =
            Generation::with_canaries(Arc::new(config), plugins, canaries, self.counts.clone());
        // Workers first: a row the new gate lets in (a new table) finds its
        // pipeline when a worker pulls it.
        let gate = Gate::new(next.config().clone(), |name| next.plugin(name).cloned());
        self.generations.send_replace(Arc::new(next));
        self.gates.send_replace(Arc::new(gate));
        Ok(kept)
    }

    /// Reloads when a watched file differs from `baseline` (see
    /// [`Reloader::fingerprint`]) and then held still for [`SETTLE`], or on
    /// SIGHUP, until `shutdown`.
    pub async fn watch(mut self, baseline: Fingerprint, shutdown: CancellationToken) {
        let mut requests = self.requests.take();
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            Ok(signal) => Some(signal),
            Err(err) => {
                tracing::warn!(error = %err, "cannot listen for SIGHUP; file changes still reload");
                None
            }
        };
        let mut seen = baseline;
        let mut fleet_releases = self.fleet.as_ref().map(|fleet| fleet.releases.clone());
        let mut fleet_prepares = self.fleet.as_ref().map(|fleet| fleet.prepares.clone());
        let mut applied: BTreeMap<String, Release> = BTreeMap::new();
        let mut answered: BTreeMap<String, Prepare> = BTreeMap::new();
        let mut shared: BTreeMap<String, (Report, Instant)> = BTreeMap::new();
        let mut canary_tick = tokio::time::interval(CANARY_TICK);
        canary_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let signalled = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(POLL) => false,
                _ = canary_tick.tick(), if self.fleet.is_some() => {
                    self.share_counts(&mut shared).await;
                    self.judge_canaries(&applied).await;
                    continue;
                }
                Ok(()) = async {
                    match fleet_releases.as_mut() {
                        Some(releases) => releases.changed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    let releases = fleet_releases
                        .as_ref()
                        .map(|releases| releases.borrow().clone())
                        .unwrap_or_default();
                    if releases != applied {
                        say_ended(&applied, &releases);
                        self.take_releases(&releases).await;
                        applied = releases;
                        // The generation now watches the released files: a
                        // change of paths is not a change of files.
                        seen = self.fingerprint().await;
                    }
                    continue;
                }
                Ok(()) = async {
                    match fleet_prepares.as_mut() {
                        Some(prepares) => prepares.changed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    let prepares = fleet_prepares
                        .as_ref()
                        .map(|prepares| prepares.borrow().clone())
                        .unwrap_or_default();
                    self.take_prepares(&prepares, &mut answered).await;
                    continue;
                }
                Some(reply) = async {
                    match requests.as_mut() {
                        Some(requests) => requests.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    let result = self.reload().await.map_err(|err| err.to_string());
                    let _ = reply.send(result);
                    seen = self.fingerprint().await;
                    continue;
                }
                Some(()) = async {
                    match hangup.as_mut() {
                        Some(signal) => signal.recv().await,
                        None => std::future::pending().await,
                    }
                } => true,
            };
            let mut now = self.fingerprint().await;
            if !signalled && now == seen {
                continue;
            }
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(SETTLE) => {}
                }
                let again = self.fingerprint().await;
                if again == now {
                    break;
                }
                now = again;
            }
            let _ = self.reload().await;
            // The new generation may watch other `.wasm` files. A file that
            // changed again while loading is caught on the next poll.
            let after = self.fingerprint().await;
            let moved_meanwhile = after
                .iter()
                .any(|(path, state)| now.iter().any(|(p, s)| p == path && s != state));
            seen = if moved_meanwhile { Vec::new() } else { after };
        }
    }

    /// Shares this host's counts of each canary it runs
    /// (`canary.<name>.<me>`) when they changed, and at least every
    /// [`TALLY_REFRESH`] so they outlive their TTL while it runs.
    async fn share_counts(&self, shared: &mut BTreeMap<String, (Report, Instant)>) {
        let Some(fleet) = &self.fleet else { return };
        let running: BTreeMap<String, Canary> = self
            .generations
            .borrow()
            .canaries()
            .iter()
            .map(|(name, c)| (name.clone(), c.canary.clone()))
            .collect();
        let reports = self.counts.reports(&running);
        shared.retain(|name, _| reports.contains_key(name));
        for (name, report) in reports {
            if shared
                .get(&name)
                .is_some_and(|(last, at)| *last == report && at.elapsed() < TALLY_REFRESH)
            {
                continue;
            }
            // Plain data always serializes.
            let value = bytes::Bytes::from(serde_json::to_vec(&report).unwrap_or_default());
            let key = format!("{}{name}.{}", canary::TALLIES, fleet.me);
            match fleet.kv.put_with_ttl(&key, value, canary::TALLY_TTL).await {
                Ok(_) => {
                    shared.insert(name, (report, Instant::now()));
                }
                Err(err) => {
                    tracing::debug!(plugin = %name, error = %err, "cannot share a canary's counts")
                }
            }
        }
    }

    /// As the fleet's leader (its first live member), ends each canary with
    /// thresholds that the fleet's counts say crossed one (rolled back) or
    /// outlived its window under them (promoted), recording why.
    async fn judge_canaries(&self, releases: &BTreeMap<String, Release>) {
        let Some(fleet) = &self.fleet else { return };
        let leads = {
            let view = fleet.fleet.borrow();
            view.member && view.live_members().first() == Some(&fleet.me.as_str())
        };
        if !leads {
            return;
        }
        let tallies = fleet.tallies.borrow().clone();
        for (name, release) in releases {
            let Some(canary) = release.canary.as_ref().filter(|c| c.auto.is_some()) else {
                continue;
            };
            let reports = tallies.get(name).into_iter().flat_map(|m| m.values());
            let (serving, candidate) = canary::fleet_tally(canary, reports);
            let Some((outcome, reason)) = canary::judge(canary, &candidate, releases::unix_ms())
            else {
                continue;
            };
            let version = releases::version_of_digest(&canary.digest);
            let ended = releases::end_canary(
                &fleet.client,
                &fleet.router,
                name,
                Some(canary),
                outcome,
                "automatic",
                reason.clone(),
            )
            .await;
            match ended {
                Ok(Some(_)) if outcome == Outcome::RolledBack => tracing::warn!(
                    plugin = %name, %version, %reason,
                    serving = %serving.describe(), candidate = %candidate.describe(),
                    "canary rolled back automatically"
                ),
                Ok(Some(_)) => tracing::info!(
                    plugin = %name, %version, %reason,
                    serving = %serving.describe(), candidate = %candidate.describe(),
                    "canary promoted automatically"
                ),
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(plugin = %name, error = %err, "cannot end a canary; trying again")
                }
            }
        }
    }

    /// The version prepared for `entry`, if it is that file's (`digest`)
    /// with the same entry.
    fn take_prepared(&self, entry: &PluginConfig, digest: Option<&str>) -> Option<Arc<Plugin>> {
        let mut prepared = self.prepared.lock().ok()?;
        let ready = prepared.get(&entry.name)?;
        if ready.config != *entry || Some(ready.version.as_str()) != digest {
            return None;
        }
        tracing::info!(plugin = %entry.name, version = %ready.version, "switching to the prepared version");
        prepared.remove(&entry.name)
    }

    /// Loads each pushed version being prepared that this host has not
    /// answered yet, and answers: ready, or refused with the reason.
    async fn take_prepares(
        &self,
        prepares: &BTreeMap<String, Prepare>,
        answered: &mut BTreeMap<String, Prepare>,
    ) {
        let Some(fleet) = &self.fleet else { return };
        for (name, prepare) in prepares {
            if answered.get(name) == Some(prepare) {
                continue;
            }
            let version = releases::version_of_digest(&prepare.digest).to_string();
            let refused = self.prepare(fleet, name, prepare).await.err();
            match &refused {
                None => {
                    tracing::info!(plugin = %name, %version, "pushed version loaded, ready to switch")
                }
                Some(reason) => {
                    tracing::error!(plugin = %name, %version, %reason, "cannot run the pushed version; the push is refused")
                }
            }
            let ready = Ready {
                digest: prepare.digest.clone(),
                pushed_ms: prepare.pushed_ms,
                refused,
            };
            if let Err(err) = releases::answer(&fleet.kv, name, &fleet.me, &ready).await {
                tracing::warn!(plugin = %name, error = %err, "cannot answer a push's prepare request");
                continue;
            }
            answered.insert(name.clone(), prepare.clone());
        }
    }

    /// Fetches and loads one pushed version as the running config's plugin
    /// `name` would run it, and keeps it for the switch.
    async fn prepare(
        &self,
        fleet: &FleetReleases,
        name: &str,
        prepare: &Prepare,
    ) -> Result<(), String> {
        let running = self.generations.borrow().clone();
        let Some(entry) = running.config().plugins.get(name) else {
            return Err(format!("no plugin `{name}` in this host's config"));
        };
        let path = releases::fetch(
            &fleet.client,
            &fleet.router,
            name,
            &prepare.digest,
            &fleet.dir,
        )
        .await
        .map_err(|err| format!("{err:#}"))?;
        let entry = PluginConfig {
            wasm: path,
            ..entry.clone()
        };
        let loaded = self
            .sandbox
            .load(&entry)
            .await
            .map_err(|err| err.to_string())?;
        if let Ok(mut prepared) = self.prepared.lock() {
            prepared.insert(name.to_string(), loaded);
        }
        Ok(())
    }

    /// Fetches the `.wasm` of every pushed release (checking its digest)
    /// and reloads with them; a release that cannot be fetched is refused
    /// and the running version keeps serving.
    async fn take_releases(&self, releases: &BTreeMap<String, Release>) {
        let Some(fleet) = &self.fleet else { return };
        let mut pushed = BTreeMap::new();
        let mut canaries = BTreeMap::new();
        let mut files: Vec<(&String, &String, Option<Canary>)> = Vec::new();
        for (name, release) in releases {
            if let Some(digest) = &release.digest {
                files.push((name, digest, None));
            }
            if let Some(canary) = &release.canary {
                files.push((name, &canary.digest, Some(canary.clone())));
            }
        }
        for (name, digest, canary) in files {
            match releases::fetch(&fleet.client, &fleet.router, name, digest, &fleet.dir).await {
                Ok(path) => match canary {
                    Some(canary) => {
                        canaries.insert(name.clone(), (path, canary));
                    }
                    None => {
                        pushed.insert(name.clone(), path);
                    }
                },
                Err(err) => {
                    tracing::error!(error = %err, "pushed plugin refused; the running version keeps serving");
                    self.metrics
                        .reloads
                        .get_or_create(&ReloadLabels {
                            result: "refused".to_string(),
                        })
                        .inc();
                    return;
                }
            }
        }
        let same_canaries = self
            .canaries
            .lock()
            .is_ok_and(|current| *current == canaries);
        let before = match self.pushed.lock() {
            // What the host started with, or took already: nothing to load.
            Ok(current) if *current == pushed && same_canaries => return,
            Ok(mut current) => std::mem::replace(&mut *current, pushed),
            Err(_) => return,
        };
        let canaries_before = match self.canaries.lock() {
            Ok(mut current) => std::mem::replace(&mut *current, canaries),
            Err(_) => return,
        };
        let mut result = self.reload().await;
        if let Err(ReloadError::Config(_)) = &result {
            // An edit of the file that does not load must not keep this
            // host behind the fleet (its units wait meanwhile): the release
            // goes into the running config; the edit is refused as ever.
            tracing::warn!("taking the fleet's release into the running config");
            result = self.reload_from(false).await;
        }
        if result.is_err() {
            // Refused: keep following what actually runs.
            if let Ok(mut current) = self.pushed.lock() {
                *current = before;
            }
            if let Ok(mut current) = self.canaries.lock() {
                *current = canaries_before;
            }
        }
    }

    /// The state of the watched files now. Taken as the baseline while the
    /// host starts, so that a change right after start is not missed.
    pub async fn fingerprint(&self) -> Fingerprint {
        let mut paths = vec![self.source.clone()];
        paths.extend(
            self.generations
                .borrow()
                .config()
                .plugins
                .values()
                .map(|plugin| plugin.wasm.clone()),
        );
        let mut found = Vec::with_capacity(paths.len());
        for path in paths {
            let state = tokio::fs::metadata(&path)
                .await
                .ok()
                .and_then(|meta| Some((meta.modified().ok()?, meta.len())));
            found.push((path, state));
        }
        found
    }
}

/// Settings a running host cannot change: every key whose reload class is
/// [`Reload::Restart`] (the listener, the data dir, NATS, the topology, its
/// part in the fleet, its drain timeout, instance pool and compiled cache).
/// A reload that changes them keeps the running values and names each key,
/// or its section when all of the section restarts (`[stream]`).
fn keep_restart_only(next: &mut Config, running: &Config) -> Vec<String> {
    let mut kept: Vec<String> = Vec::new();
    for key in crate::config::all_keys() {
        let Reload::Restart(keep) = key.reload else {
            continue;
        };
        if !keep(next, running) {
            continue;
        }
        let name = if crate::config::restarts_as_a_whole(key.section) {
            format!("[{}]", key.section)
        } else {
            key.display()
        };
        if !kept.contains(&name) {
            kept.push(name);
        }
    }
    kept
}

/// What a host was started with on its command line and in its environment
/// cannot change while it runs: a reload reads the file again under the
/// same overrides, so an edit of the file's `listen` or `data_dir` is
/// compared with the running value (and named) like any restart-only key.
fn same_overrides(running: &Config) -> Overrides {
    running.overrides.clone()
}

#[cfg(test)]
mod tests;
