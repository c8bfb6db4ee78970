//! `weir plugin`: roll a plugin out to the fleet, or back, and see what it
//! ran.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use weir::config::Config;
use weir::reload::canary::{self, Auto, Canary, Outcome};
use weir::reload::releases::{self, Release, RollbackTo};
use weir::topology::{Names, NotAUnit, Unit};

use super::target::{FleetTarget, router_of};

/// How long a push waits for its first phase without `--wait SECS`.
const DEFAULT_WAIT_SECS: u64 = 60;

#[derive(clap::Subcommand)]
pub enum PluginCommand {
    /// Run a plugin on rows from a file, without NATS, in the sandbox
    /// `weir run` uses, and print each row's outcome.
    Test(super::plugin_test::TestArgs),
    /// Name the world a `.wasm` implements (or what it misses), its
    /// imports, the grants it would need, its size and compile time.
    Check(super::plugin_check::CheckArgs),
    /// Check a `.wasm` against plugin NAME's world and settings (as `weir
    /// check` would), then roll it out in two phases: every live host
    /// fetches it, checks its digest and loads it, and only once all are
    /// ready does the fleet switch to it, each host between batches. A host
    /// that cannot run it refuses with the reason, and nothing switches.
    Push {
        #[command(flatten)]
        fleet: FleetTarget,
        /// The plugin's name in the config.
        name: String,
        /// The component to roll out.
        file: PathBuf,
        /// Wait at most SECS (default 60) for every live member to be
        /// ready, then until every one runs it; fail naming those that do
        /// not. Without it, the first phase is still waited for (60 s).
        /// Put it after NAME FILE when giving no SECS.
        #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "60")]
        wait: Option<u64>,
        #[command(flatten)]
        canary: CanaryArgs,
    },
    /// Make plugin NAME's canary serve every tenant: its candidate becomes
    /// the release (every host holds it loaded already).
    Promote {
        #[command(flatten)]
        fleet: FleetTarget,
        /// The plugin's name in the config.
        name: String,
    },
    /// Point plugin NAME back at an earlier release: by default the one
    /// before the current one. Two phases as a push: every live host loads
    /// it before the fleet switches (not for `--to file`). While a canary
    /// runs, it ends the canary instead: the release serves every tenant
    /// again.
    Rollback {
        #[command(flatten)]
        fleet: FleetTarget,
        /// The plugin's name in the config.
        name: String,
        /// The release to go back to: a digest (or a unique prefix of one,
        /// such as the version `weir plugin list` shows) from its history,
        /// or `file` for each host's own file from its config.
        #[arg(long, value_name = "VERSION")]
        to: Option<String>,
        /// Then wait (at most SECS, default 60) until every live member
        /// runs it; fail naming those that do not. For `--to file`, the
        /// version waited for is that of the file this config names here.
        #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "60")]
        wait: Option<u64>,
    },
    /// Each configured plugin (or NAME only): the release the fleet runs,
    /// its release history newest first, and what each live member runs.
    List {
        #[command(flatten)]
        fleet: FleetTarget,
        /// Only this plugin.
        name: Option<String>,
    },
    /// Where plugin NAME's shadow and its release answered rows
    /// differently, fleet-wide: each difference class (`ok→dead_letter`,
    /// `emit payload differs`) with its count and a few examples.
    Diff {
        #[command(flatten)]
        fleet: FleetTarget,
        /// The plugin's name in the config.
        name: String,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a new plugin project (Rust, Python or JavaScript) that builds
    /// on its own, with fixture rows, their expected outcomes and a test.
    New(super::plugin_new::NewArgs),
}

/// A push as a canary: who the candidate serves, and when the fleet ends
/// it on its own.
#[derive(clap::Args, Default)]
pub struct CanaryArgs {
    /// Serve the new version to this share of tenants only (`25%`),
    /// picked by a stable hash of plugin and tenant, so a tenant's rows
    /// always see one version; the others keep the release.
    #[arg(long, value_name = "SHARE", value_parser = parse_share)]
    canary: Option<u32>,
    /// Serve the new version to these tenants (comma-separated), besides
    /// any `--canary` share.
    #[arg(long, value_name = "TENANTS", value_delimiter = ',')]
    tenants: Vec<String>,
    /// Serve the new version on these units' rows, whatever their tenant
    /// (comma-separated `<partition>.<shard>`, such as `0.1,1.3`), besides
    /// any `--canary` share or `--tenants`.
    #[arg(long, value_name = "UNITS", value_delimiter = ',', value_parser = parse_unit)]
    units: Vec<Unit>,
    /// Promote the canary once it ran this long (`10m`, `1h30m`) without
    /// crossing a threshold below.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    promote_after: Option<Duration>,
    /// Roll the canary back as soon as its candidate dead-letters more
    /// than this share of its rows (`1%`; a rate above zero is judged
    /// from its 100th row on).
    #[arg(long, value_name = "RATE", value_parser = parse_share)]
    max_dead_letter_rate: Option<u32>,
    /// Roll the canary back as soon as its candidate's calls trap on more
    /// than this share of its rows (`0`: the first trap).
    #[arg(long, value_name = "RATE", value_parser = parse_share)]
    max_trap_rate: Option<u32>,
    /// Serve no tenant with the new version: every host runs it on copies
    /// of the rows the release transforms, off the serving path, and
    /// records where their outcomes differ (`weir plugin diff NAME`).
    /// Transforms only, and none granted `state`, outbound HTTP or a
    /// writable directory.
    #[arg(long, conflicts_with_all = ["canary", "tenants", "units", "promote_after", "max_dead_letter_rate", "max_trap_rate"])]
    shadow: bool,
}

fn parse_share(text: &str) -> Result<u32, String> {
    canary::parse_percent(text).map_err(|err| err.to_string())
}

fn parse_unit(text: &str) -> Result<Unit, String> {
    text.parse().map_err(|err: NotAUnit| err.to_string())
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|err| format!("`{text}` is not a duration such as 10m or 1h30m: {err}"))
}

impl CanaryArgs {
    /// The canary this push asks for, if it is one; an error naming what
    /// does not fit.
    fn canary(
        &self,
        config: &Config,
        plugin: &weir::config::PluginConfig,
        digest: String,
    ) -> anyhow::Result<Option<Canary>> {
        if self.shadow {
            return shadow(plugin, digest).map(Some);
        }
        let share = self.canary.unwrap_or(0);
        let thresholds = self.promote_after.is_some()
            || self.max_dead_letter_rate.is_some()
            || self.max_trap_rate.is_some();
        if share == 0 && self.tenants.is_empty() && self.units.is_empty() {
            anyhow::ensure!(
                !thresholds,
                "--promote-after, --max-dead-letter-rate and --max-trap-rate judge a canary: give --canary SHARE, --tenants or --units too"
            );
            anyhow::ensure!(
                self.canary.is_none(),
                "--canary 0% serves no tenant; push without --canary to serve every tenant"
            );
            return Ok(None);
        }
        let world = plugin.world.as_str();
        anyhow::ensure!(
            matches!(world, "transform" | "sink"),
            "plugin `{}` is a {world} policy: a canary serves some tenants' rows in delivery, \
             but a {world} is asked at the front door per request, before any row is stored \
             (a router's canary would move some tenants' tables to other units mid-stream, \
             breaking their order); push it to serve every tenant, and roll it back if needed",
            plugin.name
        );
        let unknown: Vec<&str> = self
            .tenants
            .iter()
            .filter(|t| !config.tenants.iter().any(|known| known.name == **t))
            .map(String::as_str)
            .collect();
        anyhow::ensure!(
            unknown.is_empty(),
            "--tenants names {} not in {}'s tenants ({})",
            unknown.join(", "),
            config.source.display(),
            config
                .tenants
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let (partitions, shards) = (config.stream.partitions, config.stream.shards);
        let outside: Vec<String> = self
            .units
            .iter()
            .filter(|u| u.partition >= partitions || u.shard >= shards)
            .map(Unit::to_string)
            .collect();
        anyhow::ensure!(
            outside.is_empty(),
            "--units names {} outside {}'s topology of {partitions} partition{} × {shards} shard{} \
             (units 0.0 to {}.{})",
            outside.join(", "),
            config.source.display(),
            if partitions == 1 { "" } else { "s" },
            if shards == 1 { "" } else { "s" },
            partitions.saturating_sub(1),
            shards.saturating_sub(1)
        );
        let mut units = self.units.clone();
        units.sort();
        units.dedup();
        let auto = thresholds.then(|| Auto {
            promote_after_ms: self.promote_after.map(|d| d.as_millis() as u64),
            max_dead_letter_rate: self.max_dead_letter_rate,
            max_trap_rate: self.max_trap_rate,
        });
        Ok(Some(Canary {
            digest,
            share,
            tenants: self.tenants.clone(),
            units,
            started_ms: releases::unix_ms(),
            auto,
            shadow: false,
        }))
    }
}

/// A shadow of `plugin`, or why it cannot have one: its candidate's calls
/// must have no effect outside the call.
fn shadow(plugin: &weir::config::PluginConfig, digest: String) -> anyhow::Result<Canary> {
    let (name, world) = (&plugin.name, plugin.world.as_str());
    anyhow::ensure!(
        world == "transform",
        "plugin `{name}` is a {world}: a shadow runs transforms only. {}",
        match world {
            "sink" =>
                "A sink's outcome is its side effect (a write, a publish): its shadow would deliver every row a second time; canary it instead (--canary, --tenants, --units)",
            _ =>
                "A budget or router is asked at the front door per request, where there is no copy to run a second version on; push it to serve every tenant, and roll it back if needed",
        }
    );
    anyhow::ensure!(
        plugin.grants.state.is_none(),
        "plugin `{name}` is granted `state`: its shadow would read and write the scopes the release keeps (a second, diverging writer); canary it instead (--canary, --tenants, --units)"
    );
    anyhow::ensure!(
        plugin.grants.http.is_empty(),
        "plugin `{name}` is granted outbound HTTP ({}): its shadow would call those hosts a second time per row; canary it instead (--canary, --tenants, --units)",
        plugin.grants.http.join(", ")
    );
    let writable: Vec<String> = plugin
        .grants
        .dirs
        .iter()
        .filter(|dir| dir.writable)
        .map(|dir| dir.guest.clone())
        .collect();
    anyhow::ensure!(
        writable.is_empty(),
        "plugin `{name}` may write to {}: its shadow would write there beside the release; canary it instead (--canary, --tenants, --units)",
        writable.join(", ")
    );
    Ok(Canary {
        digest,
        share: 0,
        tenants: Vec::new(),
        units: Vec::new(),
        started_ms: releases::unix_ms(),
        auto: None,
        shadow: true,
    })
}

impl PluginCommand {
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            PluginCommand::Test(args) => return args.run().await,
            PluginCommand::Check(args) => return args.run().await,
            PluginCommand::New(args) => args.run()?,
            PluginCommand::Push {
                fleet,
                name,
                file,
                wait,
                canary,
            } => push(fleet, name, file, wait, canary).await?,
            PluginCommand::Promote { fleet, name } => {
                let (config, client) = fleet.connect().await?;
                configured(&config, &fleet, &name)?;
                let router = router_of(&config);
                let release = releases::end_canary(
                    &client,
                    &router,
                    &name,
                    None,
                    Outcome::Promoted,
                    "operator",
                    "weir plugin promote".to_string(),
                )
                .await?
                .context("the release vanished meanwhile")?;
                client.flush().await?;
                announce(&name, &release);
            }
            PluginCommand::Rollback {
                fleet,
                name,
                to,
                wait,
            } => rollback(fleet, name, to, wait).await?,
            PluginCommand::List { fleet, name } => list(fleet, name).await?,
            PluginCommand::Diff { fleet, name, json } => diff(fleet, name, json).await?,
        }
        Ok(())
    }
}

/// `weir plugin push`: checked here (through the compiled cache), then the
/// two phases: every live member ready, then the release (or canary).
async fn push(
    fleet: FleetTarget,
    name: String,
    file: PathBuf,
    wait: Option<u64>,
    canary: CanaryArgs,
) -> anyhow::Result<()> {
    let bytes = std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
    let config = Config::load(&fleet.config, &Default::default())?;
    let plugin = configured(&config, &fleet, &name)?;
    // Refused before anything is checked or stored.
    let canary = canary.canary(&config, plugin, releases::digest(&bytes))?;
    // Checked before the push is staged: a plugin no host can run is
    // refused before any host is asked to load it. With the config's compiled
    // cache and the fleet's artifacts: a version compiled before (here, by
    // a host on this machine, or for the fleet) is not compiled again, and
    // what is compiled here is the fleet's one compilation when this weir
    // is the hosts' build and may keep it (a host's credentials).
    let connected = fleet.connect().await;
    let mut sandbox = weir::sandbox::Sandbox::new(weir::telemetry::Metrics::default())?.with_cache(
        config.compile_cache_dir.clone(),
        config.compile_cache_max_bytes,
    );
    if let Ok((config, client)) = &connected
        && let Some(artifacts) =
            releases::FleetCompiled::open(client, &router_of(config), "weir plugin push").await
    {
        sandbox = sandbox.with_fleet(artifacts);
    }
    let version = weir::sandbox::version_of(&bytes);
    let began = std::time::Instant::now();
    releases::check(&sandbox, plugin, &file, &bytes).await?;
    use weir::sandbox::Origin;
    let origin = [Origin::Cache, Origin::Fleet, Origin::Compiled]
        .into_iter()
        .find(|origin| sandbox.loaded_from(*origin) > 0);
    println!(
        "plugin {name}: {version} checked in {:.1} s ({})",
        began.elapsed().as_secs_f64(),
        match origin {
            Some(Origin::Cache) => "from the compiled cache",
            Some(Origin::Fleet) => "from the fleet's compiled artifact",
            _ => "compiled",
        }
    );
    drop(sandbox);
    let (config, client) = connected?;
    let router = router_of(&config);
    let staged = releases::stage(&client, &router, &name, &bytes).await?;
    if let Some(canary) = canary {
        let Some(staged) = staged else {
            return Err(releases::StoreError::CanaryOfServing {
                name: name.clone(),
                version: version.clone(),
            }
            .into());
        };
        let timeout = Duration::from_secs(wait.unwrap_or(DEFAULT_WAIT_SECS));
        let ready = releases::prepare(&client, &router, &staged, timeout).await?;
        println!(
            "plugin {name}: every live member is ready to run {version} ({})",
            ready.join(", ")
        );
        let release = releases::activate_canary(&client, &router, staged, canary).await?;
        client.flush().await?;
        if let Some(canary) = release.canary.as_ref().filter(|c| c.shadow) {
            println!(
                "plugin {name}: shadow of {} running beside {} on copies of its rows, delivering nothing; `weir plugin diff {name}` shows where they differ",
                releases::version_of_digest(&canary.digest),
                what(release.digest.as_deref())
            );
        } else if let Some(canary) = &release.canary {
            println!(
                "plugin {name}: canary of {version} serving {}{}; the others keep {}",
                canary.describe(),
                thresholds(canary),
                what(release.digest.as_deref())
            );
        }
        return Ok(());
    }
    match staged {
        None => println!("plugin {name}: the fleet already runs {version}"),
        Some(staged) => {
            let timeout = Duration::from_secs(wait.unwrap_or(DEFAULT_WAIT_SECS));
            let ready = releases::prepare(&client, &router, &staged, timeout).await?;
            println!(
                "plugin {name}: every live member is ready to run {version} ({})",
                ready.join(", ")
            );
            let release = releases::activate(&client, &router, staged).await?;
            client.flush().await?;
            announce(&name, &release);
        }
    }
    if let Some(secs) = wait {
        wait_for(&client, &router, &name, &version, secs).await?;
    }
    Ok(())
}

/// `weir plugin rollback`: ends a running canary, else goes back (`--to`)
/// through the same two phases as a push.
async fn rollback(
    fleet: FleetTarget,
    name: String,
    to: Option<String>,
    wait: Option<u64>,
) -> anyhow::Result<()> {
    let (config, client) = fleet.connect().await?;
    let plugin = configured(&config, &fleet, &name)?;
    let router = router_of(&config);
    let running = releases::release(&client, &router, &name).await?;
    if let Some(canary) = running.as_ref().and_then(|r| r.canary.as_ref()) {
        anyhow::ensure!(
            to.is_none(),
            "plugin `{name}` has a canary of {} running: `weir plugin rollback {name}` ends it first, then --to goes further back",
            releases::version_of_digest(&canary.digest)
        );
        let release = releases::end_canary(
            &client,
            &router,
            &name,
            Some(canary),
            Outcome::RolledBack,
            "operator",
            "weir plugin rollback".to_string(),
        )
        .await?
        .context("the canary ended meanwhile")?;
        client.flush().await?;
        println!(
            "plugin {name}: canary of {} ended; every tenant is served by {}",
            releases::version_of_digest(&canary.digest),
            what(release.digest.as_deref())
        );
        return Ok(());
    }
    let to = RollbackTo::parse(to.as_deref());
    // Two phases as a push: every live member loads the version
    // gone back to before the fleet switches to it.
    let release = match releases::stage_rollback(&client, &router, &name, &to).await? {
        None => releases::release(&client, &router, &name)
            .await?
            .context("the release vanished meanwhile")?,
        Some(staged) => {
            let timeout = Duration::from_secs(wait.unwrap_or(DEFAULT_WAIT_SECS));
            let ready = releases::prepare(&client, &router, &staged, timeout).await?;
            if let Some(digest) = &staged.digest {
                println!(
                    "plugin {name}: every live member is ready to run {} ({})",
                    releases::version_of_digest(digest),
                    ready.join(", ")
                );
            }
            releases::activate(&client, &router, staged).await?
        }
    };
    client.flush().await?;
    announce(&name, &release);
    if let Some(secs) = wait {
        let version = match &release.digest {
            Some(digest) => releases::version_of_digest(digest).to_string(),
            None => {
                let bytes = std::fs::read(&plugin.wasm).with_context(|| {
                    format!(
                        "cannot read {} to know the version to wait for",
                        plugin.wasm.display()
                    )
                })?;
                weir::sandbox::version_of(&bytes)
            }
        };
        wait_for(&client, &router, &name, &version, secs).await?;
    }
    Ok(())
}

/// `weir plugin list`: each configured plugin (or `name` only), its
/// release, history and what each live member runs.
async fn list(fleet: FleetTarget, name: Option<String>) -> anyhow::Result<()> {
    let (config, client) = fleet.connect().await?;
    let router = router_of(&config);
    let names: Vec<&String> = match &name {
        Some(name) => {
            configured(&config, &fleet, name)?;
            vec![name]
        }
        None => config.plugins.keys().collect(),
    };
    let members = releases::member_versions(&client, &router).await?;
    for name in names {
        let release = releases::release(&client, &router, name).await?;
        list_one(&config, name, release.as_ref(), &members);
        if let Some(release) = &release {
            let reports = releases::canary_reports(&client, &router, name).await?;
            list_canary(release, &reports);
        }
        if let Some(prepare) = releases::preparing(&client, &router, name).await? {
            println!(
                "  being prepared (not serving yet): {}, pushed {}",
                prepare.digest,
                when(prepare.pushed_ms)
            );
        }
    }
    Ok(())
}

/// `weir plugin diff`: the fleet's differences of plugin `name`'s shadow,
/// the running one or else the last one (kept in its release when it
/// ended, until the plugin's next shadow starts).
async fn diff(fleet: FleetTarget, name: String, json: bool) -> anyhow::Result<()> {
    let (config, client) = fleet.connect().await?;
    configured(&config, &fleet, &name)?;
    let router = router_of(&config);
    let release = releases::release(&client, &router, &name).await?;
    let running = release
        .as_ref()
        .and_then(|r| r.canary.as_ref())
        .filter(|c| c.shadow);
    let serving_version = |digest: Option<&str>| {
        digest
            .map_or("file", releases::version_of_digest)
            .to_string()
    };
    let (candidate, serving, started_ms, ended_ms, diff) = match (
        running,
        release.as_ref().and_then(|r| r.last_shadow.as_ref()),
    ) {
        (Some(shadow), _) => {
            let reports = releases::canary_reports(&client, &router, &name).await?;
            (
                shadow.digest.clone(),
                serving_version(release.as_ref().and_then(|r| r.digest.as_deref())),
                shadow.started_ms,
                None,
                canary::fleet_diff(shadow, reports.values()),
            )
        }
        (None, Some(last)) => (
            last.digest.clone(),
            serving_version(last.serving.as_deref()),
            last.started_ms,
            Some(last.ended_ms),
            last.diff.clone(),
        ),
        (None, None) => anyhow::bail!(
            "plugin `{name}` has no shadow running and none ended (`weir plugin push {name} FILE --shadow` starts one)"
        ),
    };
    let candidate = releases::version_of_digest(&candidate);
    if json {
        let value = serde_json::json!({
            "plugin": name,
            "serving": serving,
            "candidate": candidate,
            "started_ms": started_ms,
            "ended_ms": ended_ms,
            "diff": diff,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    match ended_ms {
        None => println!(
            "plugin {name}: shadow of {candidate} beside {serving} since {}",
            when(started_ms)
        ),
        Some(ended_ms) => println!(
            "plugin {name}: the last shadow, of {candidate} beside {serving}, from {} until it ended {}",
            when(started_ms),
            when(ended_ms)
        ),
    }
    let share = match diff.compared {
        0 => String::new(),
        rows => format!(" ({:.2}%)", diff.differing() as f64 * 100.0 / rows as f64),
    };
    println!(
        "  compared {} rows, {} differ{share}, {} not compared (shadow queue full)",
        diff.compared,
        diff.differing(),
        diff.skipped
    );
    for (class, found) in &diff.classes {
        println!("  {class}: {} rows", found.rows);
        for example in &found.examples {
            println!(
                "    {}/{} #{}: serving {} | candidate {}",
                example.tenant, example.table, example.sequence, example.serving, example.candidate
            );
        }
    }
    Ok(())
}

/// Plugin `name` from the config, or an error naming the file.
fn configured<'a>(
    config: &'a Config,
    fleet: &FleetTarget,
    name: &str,
) -> anyhow::Result<&'a weir::config::PluginConfig> {
    config.plugins.get(name).with_context(|| {
        format!(
            "{}: no plugin `{name}` in the config",
            fleet.config.display()
        )
    })
}

fn announce(name: &str, release: &Release) {
    match &release.digest {
        Some(digest) => println!("plugin {name}: the fleet now runs {digest}"),
        None => println!("plugin {name}: the fleet now runs each host's own file"),
    }
}

async fn wait_for(
    client: &async_nats::Client,
    router: &Names,
    name: &str,
    version: &str,
    secs: u64,
) -> anyhow::Result<()> {
    let members =
        releases::wait_for(client, router, name, version, Duration::from_secs(secs)).await?;
    println!(
        "plugin {name}: every live member runs {version} ({})",
        members.join(", ")
    );
    Ok(())
}

fn list_one(
    config: &Config,
    name: &str,
    release: Option<&Release>,
    members: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
) {
    let world = config
        .plugins
        .get(name)
        .map_or("?", |plugin| plugin.world.as_str());
    println!("{name} ({world})");
    match release {
        None => println!("  release: each host's own file (never pushed)"),
        Some(release) => {
            println!("  release: {}", what(release.digest.as_deref()));
            println!("  history, newest first:");
            for (index, step) in release.steps().enumerate() {
                println!(
                    "    {}  {:<8}  {}{}",
                    when(step.pushed_ms),
                    step.how.map_or("-", |how| how.as_str()),
                    what(step.digest.as_deref()),
                    if index == 0 { "  (current)" } else { "" }
                );
            }
        }
    }
    for (member, plugins) in members {
        let running = plugins.get(name).map_or("nothing", String::as_str);
        println!("  member {member} runs {running}");
    }
}

/// A release's canary, both versions' fleet-wide counts side by side, and
/// how the last canary ended.
fn list_canary(release: &Release, reports: &std::collections::BTreeMap<String, canary::Report>) {
    if let Some(shadow) = release.canary.as_ref().filter(|c| c.shadow) {
        let diff = canary::fleet_diff(shadow, reports.values());
        println!(
            "  shadow: {} beside the release since {} (serves no tenant)",
            shadow.digest,
            when(shadow.started_ms)
        );
        println!(
            "    compared {} rows, {} differ, {} not compared; `weir plugin diff` shows them",
            diff.compared,
            diff.differing(),
            diff.skipped
        );
    } else if let Some(canary) = &release.canary {
        println!(
            "  canary: {} serving {} since {}{}",
            canary.digest,
            canary.describe(),
            when(canary.started_ms),
            thresholds(canary)
        );
        let (serving, candidate) = canary::fleet_tally(canary, reports.values());
        let serving_version = release
            .digest
            .as_deref()
            .map_or("file", releases::version_of_digest);
        println!(
            "    serving   {serving_version:<12}  {}",
            serving.describe()
        );
        println!(
            "    candidate {:<12}  {}",
            releases::version_of_digest(&canary.digest),
            candidate.describe()
        );
        let counted: Vec<&str> = reports
            .iter()
            .filter(|(_, r)| r.digest == canary.digest && r.started_ms == canary.started_ms)
            .map(|(member, _)| member.as_str())
            .collect();
        println!(
            "    counted by {}",
            match counted.is_empty() {
                true => "no member yet".to_string(),
                false => counted.join(", "),
            }
        );
    }
    if let Some(ended) = &release.ended {
        println!(
            "  last canary: {} {} ({}) at {}: {}",
            releases::version_of_digest(&ended.digest),
            ended.outcome.as_str(),
            ended.by,
            when(ended.at_ms),
            ended.reason
        );
    }
}

/// `; promoted after 10m under …`, or nothing without thresholds.
fn thresholds(canary: &Canary) -> String {
    let Some(auto) = &canary.auto else {
        return String::new();
    };
    let mut limits = Vec::new();
    if let Some(rate) = auto.max_dead_letter_rate {
        limits.push(format!("dead letters ≤ {}", canary::percent(rate)));
    }
    if let Some(rate) = auto.max_trap_rate {
        limits.push(format!("traps ≤ {}", canary::percent(rate)));
    }
    let limits = match limits.is_empty() {
        true => "no limit".to_string(),
        false => limits.join(", "),
    };
    match auto.promote_after_ms {
        Some(ms) => format!(
            "; rolled back at once past {limits}, promoted after {} under it",
            humantime::format_duration(Duration::from_millis(ms))
        ),
        None => format!("; rolled back at once past {limits}"),
    }
}

fn what(digest: Option<&str>) -> String {
    match digest {
        Some(digest) => digest.to_string(),
        None => "file (each host's own)".to_string(),
    }
}

/// RFC 3339 in UTC; releases from an older weir may have no time.
fn when(unix_ms: u64) -> String {
    let formatted =
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_ms) * 1_000_000)
            .ok()
            .filter(|_| unix_ms > 0)
            .and_then(|at| {
                at.replace_millisecond(0)
                    .ok()?
                    .format(&time::format_description::well_known::Rfc3339)
                    .ok()
            });
    formatted.unwrap_or_else(|| "(time unknown)".to_string())
}
