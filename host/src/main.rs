//! The `weir` command: thin glue over the library. Errors are printed once,
//! as a chain, and turn into a non-zero exit code.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use weir::client::{SendOptions, default_url, fetch_status, send};
use weir::config::{Config, ConfigError, Overrides};
use weir::delivery::dead_letter::{DeadLetters, LetterFilter};
use weir::host::{RunningHost, embedded_url_file};
use weir::reload::releases;
use weir::topology::manifest::Manifest;
use weir::topology::permissions::Permissions;
use weir::topology::route::Router;

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "A WebAssembly-plugin ingest host on NATS JetStream"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a host: front door, delivery and plugins (starts its own
    /// nats-server when no NATS URL is configured).
    Run {
        /// The TOML config file.
        #[arg(long, env = "WEIR_CONFIG")]
        config: PathBuf,
        /// HTTP listen address of the front door (overrides the file).
        #[arg(long, env = "WEIR_LISTEN")]
        listen: Option<SocketAddr>,
        /// NATS server URL (overrides the file; absent everywhere = embedded).
        #[arg(long, env = "WEIR_NATS_URL")]
        nats_url: Option<String>,
        /// Where weir keeps its data (overrides the file).
        #[arg(long, env = "WEIR_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// Create (or update) streams and consumers on the configured NATS
        /// instead of only verifying them.
        #[arg(long, env = "WEIR_CREATE_TOPOLOGY")]
        create_topology: bool,
    },
    /// Look at dead letters, and re-inject them after a fix.
    Dlq {
        #[command(subcommand)]
        what: DlqCommand,
    },
    /// Per-tenant settings the budget policy reads, fleet-wide.
    Tenant {
        #[command(subcommand)]
        what: TenantCommand,
    },
    /// Roll a plugin out to every host of the fleet, or back.
    Plugin {
        #[command(subcommand)]
        what: PluginCommand,
    },
    /// What an operator applies to NATS for this config.
    Mq {
        #[command(subcommand)]
        what: MqCommand,
    },
    /// Post an NDJSON file to a front door, in chunks, with a progress bar.
    Send {
        /// The table the rows go to.
        #[arg(long)]
        table: String,
        /// The tenant's API key.
        #[arg(long, env = "WEIR_API_KEY")]
        key: String,
        /// Front door URL.
        #[arg(long, env = "WEIR_URL", default_value_t = default_url())]
        url: String,
        /// Rows per request.
        #[arg(long, default_value_t = 1000)]
        chunk_rows: usize,
        /// The NDJSON file.
        file: PathBuf,
    },
    /// Print a host's status: rows accepted, delivered, dead-lettered, backlog.
    Status {
        /// Front door URL.
        #[arg(long, env = "WEIR_URL", default_value_t = default_url())]
        url: String,
        /// Wait (up to this many seconds) until every row is settled.
        #[arg(long)]
        wait_drained: Option<u64>,
        /// Print the whole report as JSON.
        #[arg(long)]
        json: bool,
        /// An admin key (every tenant's usage, where NATS is) or a tenant's
        /// key (its own usage).
        #[arg(long, env = "WEIR_STATUS_KEY")]
        key: Option<String>,
    },
    /// Check a config file and report every problem in it.
    Check {
        #[arg(long, env = "WEIR_CONFIG")]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum MqCommand {
    /// Print the streams and consumers (JSON) the config needs.
    Manifests {
        #[arg(long, env = "WEIR_CONFIG")]
        config: PathBuf,
        /// `nats`: the JetStream API's JSON (for the nats CLI and clients);
        /// `nack`: Kubernetes resources for the NATS controllers.
        #[arg(long, value_enum, default_value_t = ManifestFormat::Nats)]
        format: ManifestFormat,
        /// Split this many bytes of file store between the streams
        /// (e.g. 500G), instead of each partition's `max_bytes`.
        #[arg(long, value_parser = parse_bytes)]
        file_store: Option<i64>,
    },
    /// Print the least-privilege NATS user permissions a host needs.
    Permissions {
        #[arg(long, env = "WEIR_CONFIG")]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum DlqCommand {
    /// Print dead letters as JSON lines, oldest first.
    List {
        #[command(flatten)]
        target: DlqTarget,
    },
    /// Re-publish dead letters to their table's unit, then remove them.
    Replay {
        #[command(flatten)]
        target: DlqTarget,
    },
}

#[derive(Subcommand)]
enum TenantCommand {
    /// Set a tenant's settings for the budget policy (a JSON object, e.g.
    /// '{"queued_bytes": 1000000}'); every host sees them at once, no reload.
    Set {
        #[command(flatten)]
        fleet: FleetTarget,
        tenant: String,
        settings: String,
    },
    /// Remove a tenant's settings: the policy's own settings apply again.
    Unset {
        #[command(flatten)]
        fleet: FleetTarget,
        tenant: String,
    },
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Store a `.wasm` as plugin NAME's release: every host fetches it,
    /// checks its digest and swaps it in between batches.
    Push {
        #[command(flatten)]
        fleet: FleetTarget,
        /// The plugin's name in the config.
        name: String,
        /// The component to roll out.
        file: PathBuf,
    },
    /// Go back to plugin NAME's release before the current one.
    Rollback {
        #[command(flatten)]
        fleet: FleetTarget,
        name: String,
    },
}

/// A fleet's NATS: from the flag, the config, or the running host.
#[derive(clap::Args)]
struct FleetTarget {
    #[arg(long, env = "WEIR_CONFIG")]
    config: PathBuf,
    /// NATS URL; default: the config's, else the running host's (asked at
    /// the config's listen address).
    #[arg(long, env = "WEIR_NATS_URL")]
    nats_url: Option<String>,
}

impl FleetTarget {
    async fn connect(&self) -> anyhow::Result<(Config, async_nats::Client)> {
        let config = Config::load(&self.config, &Overrides::default())?;
        let url = match (&self.nats_url, &config.nats.url) {
            (Some(url), _) | (None, Some(url)) => url.clone(),
            (None, None) if embedded_url_file(&config.data_dir).is_file() => {
                // A host on this machine runs the embedded server: its URL
                // (and password) are in the data dir, readable by us only.
                let path = embedded_url_file(&config.data_dir);
                std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?
                    .trim()
                    .to_string()
            }
            (None, None) => {
                let host = format!("http://{}", config.listen);
                let admin_key = config.admin_api_keys.first().map(String::as_str);
                let url = fetch_status(&host, admin_key)
                    .await
                    .context("no NATS URL given and no running weir host to ask")?
                    .nats
                    .url;
                anyhow::ensure!(
                    !url.is_empty(),
                    "the running host tells where NATS is only to an admin key: set `admin_api_keys` in {} or pass --nats-url",
                    self.config.display()
                );
                url
            }
        };
        let client = weir::nats::connection::connect(&url, &Default::default()).await?;
        Ok((config, client))
    }
}

/// Where the dead letters are, and which ones.
#[derive(clap::Args)]
struct DlqTarget {
    #[command(flatten)]
    fleet: FleetTarget,
    #[arg(long)]
    tenant: Option<String>,
    #[arg(long)]
    table: Option<String>,
    /// Dead-letter stream sequences (repeatable); default: every match.
    #[arg(long = "seq")]
    sequences: Vec<u64>,
}

impl DlqTarget {
    async fn dead_letters(&self) -> anyhow::Result<(DeadLetters, LetterFilter)> {
        let (config, client) = self.fleet.connect().await?;
        let letters = DeadLetters::new(async_nats::jetstream::new(client), router_of(&config));
        let filter = LetterFilter {
            tenant: self.tenant.clone(),
            table: self.table.clone(),
            sequences: self.sequences.clone(),
        };
        Ok((letters, filter))
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ManifestFormat {
    Nats,
    Nack,
}

/// Bytes with an optional binary suffix: 1024, 64K, 500M, 2G, 1T.
fn parse_bytes(text: &str) -> Result<i64, String> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last() {
        Some((at, unit)) if unit.is_ascii_alphabetic() => {
            let shift = match unit.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                other => return Err(format!("unknown unit `{other}`: use K, M, G or T")),
            };
            (&text[..at], shift)
        }
        _ => (text, 0),
    };
    let value: i64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size"))?;
    value
        .checked_shl(shift)
        .filter(|bytes| *bytes > 0)
        .ok_or_else(|| format!("`{text}` is out of range"))
}

fn main() -> ExitCode {
    weir::telemetry::init_logging();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("weir: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Config problems are already one per line with file:line:col.
            if let Some(ConfigError::Invalid(problems)) = err.downcast_ref::<ConfigError>() {
                eprintln!("weir: invalid config:\n{problems}");
            } else {
                eprintln!("weir: error: {err:#}");
            }
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run {
            config,
            listen,
            nats_url,
            data_dir,
            create_topology,
        } => {
            let overrides = Overrides {
                listen,
                nats_url,
                data_dir,
                create_topology,
            };
            let config = Config::load(&config, &overrides)?;
            let host = RunningHost::start(config).await?;
            wait_for_signal().await?;
            tracing::info!(
                "shutting down: finishing the rows in hand (a second signal stops at once)"
            );
            tokio::select! {
                () = host.shutdown() => Ok(()),
                signal = wait_for_signal() => {
                    signal?;
                    tracing::warn!("stopping at once: rows not acked yet will be redelivered");
                    std::process::exit(130);
                }
            }
        }
        Command::Send {
            table,
            key,
            url,
            chunk_rows,
            file,
        } => {
            let options = SendOptions {
                url,
                table,
                api_key: key,
                file,
                chunk_rows,
                progress: true,
            };
            let accepted = send(&options).await?;
            println!("{accepted} rows accepted");
            Ok(())
        }
        Command::Status {
            url,
            wait_drained,
            json,
            key,
        } => {
            let mut report = fetch_status(&url, key.as_deref()).await?;
            if let Some(seconds) = wait_drained {
                let deadline = Instant::now() + Duration::from_secs(seconds);
                while !report.drained() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    report = fetch_status(&url, key.as_deref()).await?;
                }
                anyhow::ensure!(
                    report.drained(),
                    "not drained after {seconds} s: {}",
                    report.summary()
                );
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("{}", report.summary());
                for member in &report.fleet.members {
                    let units = report
                        .units
                        .iter()
                        .filter(|u| u.owner.as_deref() == Some(member.id.as_str()))
                        .count();
                    println!(
                        "  member {} at {} ({} units, up {} s)",
                        member.id,
                        member.http,
                        units,
                        member.age_ms / 1000
                    );
                }
                if !report.fleet.unowned.is_empty() {
                    println!("  unowned: {}", report.fleet.unowned.join(", "));
                }
                for plugin in &report.plugins {
                    println!(
                        "  plugin {} ({}) version {}",
                        plugin.name, plugin.world, plugin.version
                    );
                }
            }
            Ok(())
        }
        Command::Dlq { what } => match what {
            DlqCommand::List { target } => {
                let (letters, filter) = target.dead_letters().await?;
                for (letter, _) in letters.list(&filter).await? {
                    println!("{}", serde_json::to_string(&letter)?);
                }
                Ok(())
            }
            DlqCommand::Replay { target } => {
                let (letters, filter) = target.dead_letters().await?;
                let replayed = letters.replay(&filter).await?;
                for letter in &replayed {
                    println!(
                        "replayed dead letter {} ({}/{}): {}",
                        letter.sequence, letter.tenant, letter.table, letter.reason
                    );
                }
                println!("{} dead letters replayed", replayed.len());
                Ok(())
            }
        },
        Command::Plugin { what } => {
            let (name, release) = match &what {
                PluginCommand::Push { fleet, name, file } => {
                    let bytes = std::fs::read(file)
                        .with_context(|| format!("cannot read {}", file.display()))?;
                    let (config, client) = fleet.connect().await?;
                    anyhow::ensure!(
                        config.plugins.contains_key(name),
                        "{}: no plugin `{name}` in the config",
                        fleet.config.display()
                    );
                    let release =
                        releases::push(&client, &router_of(&config), name, &bytes).await?;
                    client.flush().await?;
                    (name, release)
                }
                PluginCommand::Rollback { fleet, name } => {
                    let (config, client) = fleet.connect().await?;
                    let release = releases::rollback(&client, &router_of(&config), name).await?;
                    client.flush().await?;
                    (name, release)
                }
            };
            match &release.digest {
                Some(digest) => println!("plugin {name}: the fleet now runs {digest}"),
                None => println!("plugin {name}: the fleet now runs each host's own file"),
            }
            Ok(())
        }
        Command::Tenant { what } => {
            let (fleet, tenant, settings) = match &what {
                TenantCommand::Set {
                    fleet,
                    tenant,
                    settings,
                } => (fleet, tenant, Some(settings.as_str())),
                TenantCommand::Unset { fleet, tenant } => (fleet, tenant, None),
            };
            let (config, client) = fleet.connect().await?;
            anyhow::ensure!(
                config.tenants.iter().any(|t| &t.name == tenant),
                "{}: no tenant `{tenant}` in the config",
                fleet.config.display()
            );
            weir::ingest::usage::set_tenant_settings(
                &client,
                &router_of(&config),
                tenant,
                settings,
            )
            .await?;
            client.flush().await?;
            match settings {
                Some(settings) => println!("tenant {tenant}: settings are now {settings}"),
                None => println!("tenant {tenant}: settings removed"),
            }
            Ok(())
        }
        Command::Mq { what } => {
            let output = match what {
                MqCommand::Manifests {
                    config,
                    format,
                    file_store,
                } => {
                    let config = Config::load(&config, &Overrides::default())?;
                    let manifest = manifest_of(&config, file_store);
                    match format {
                        ManifestFormat::Nats => serde_json::to_value(&manifest)?,
                        ManifestFormat::Nack => manifest.to_nack(),
                    }
                }
                MqCommand::Permissions { config } => {
                    let config = Config::load(&config, &Overrides::default())?;
                    let manifest = manifest_of(&config, None);
                    serde_json::to_value(Permissions::for_host(&router_of(&config), &manifest))?
                }
            };
            println!("{}", serde_json::to_string_pretty(&output)?);
            Ok(())
        }
        Command::Check { config } => {
            let config = Config::load(&config, &Overrides::default())?;
            // What `weir run` does before it connects: compile, link against
            // the world and `init` each plugin; every failure is reported.
            let sandbox = weir::sandbox::Sandbox::new(weir::telemetry::Metrics::default())?;
            let mut failures = Vec::new();
            for plugin in config.plugins.values() {
                if let Err(err) = sandbox.load(plugin).await {
                    failures.push(err.to_string());
                }
            }
            if !failures.is_empty() {
                for failure in &failures {
                    eprintln!("{}: {failure}", config.source.display());
                }
                anyhow::bail!(
                    "{} of {} plugins cannot run",
                    failures.len(),
                    config.plugins.len()
                );
            }
            println!(
                "{}: ok ({} plugins, {} pipelines, {} tenants)",
                config.source.display(),
                config.plugins.len(),
                config.pipelines.len(),
                config.tenants.len()
            );
            Ok(())
        }
    }
}

fn router_of(config: &Config) -> Router {
    Router::new(
        &config.stream.prefix,
        config.stream.partitions,
        config.stream.shards,
    )
}

fn manifest_of(config: &Config, file_store: Option<i64>) -> Manifest {
    Manifest::new(
        &router_of(config),
        &config.stream,
        &config.delivery,
        file_store,
    )
}

/// Ctrl-C or SIGTERM.
async fn wait_for_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("cannot listen for Ctrl-C")?,
        _ = terminate.recv() => {}
    }
    Ok(())
}
