//! The `weir` command: thin glue over the library. Errors are printed once,
//! as a chain, and turn into a non-zero exit code.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use weir::config::{Config, ConfigError, Overrides};
use weir::host::RunningHost;
use weir::send::{SendOptions, default_url, fetch_status, send};

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
    },
    /// Check a config file and report every problem in it.
    Check {
        #[arg(long, env = "WEIR_CONFIG")]
        config: PathBuf,
    },
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
        } => {
            let overrides = Overrides {
                listen,
                nats_url,
                data_dir,
            };
            let config = Config::load(&config, &overrides)?;
            let host = RunningHost::start(config).await?;
            wait_for_signal().await?;
            tracing::info!("shutting down");
            host.shutdown().await;
            Ok(())
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
        } => {
            let mut report = fetch_status(&url).await?;
            if let Some(seconds) = wait_drained {
                let deadline = Instant::now() + Duration::from_secs(seconds);
                while !report.drained() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    report = fetch_status(&url).await?;
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
                for plugin in &report.plugins {
                    println!(
                        "  plugin {} ({}) version {}",
                        plugin.name, plugin.world, plugin.version
                    );
                }
            }
            Ok(())
        }
        Command::Check { config } => {
            let config = Config::load(&config, &Overrides::default())?;
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
