//! `weir run`: a host until Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use weir::config::{Config, Overrides};
use weir::host::{RunningHost, StartError};

use super::target::NatsArgs;

#[derive(clap::Args)]
pub struct RunArgs {
    /// The TOML config file.
    #[arg(short, long, env = "WEIR_CONFIG")]
    config: PathBuf,
    /// HTTP listen address of the front door (overrides the file).
    #[arg(short, long, env = "WEIR_LISTEN")]
    listen: Option<SocketAddr>,
    #[command(flatten)]
    nats: NatsArgs,
    /// Where weir keeps its data (overrides the file).
    #[arg(long, env = "WEIR_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Create (or update) streams and consumers on the configured NATS
    /// instead of only verifying them.
    #[arg(long, env = "WEIR_CREATE_TOPOLOGY")]
    create_topology: bool,
}

impl RunArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let overrides = Overrides {
            listen: self.listen,
            data_dir: self.data_dir,
            create_topology: self.create_topology,
            ..self.nats.overrides()
        };
        let config = Config::load(&self.config, &overrides)?;
        // Listening before the host starts: a signal while it starts (its
        // front door may already answer) stops it cleanly once it is up,
        // instead of killing the process.
        let mut signals = Signals::listen()?;
        let host = match RunningHost::start(config.clone()).await {
            Ok(host) => host,
            // Every plugin that cannot run, each at its line, as `weir
            // check` says them; the first failure alone if they all load now.
            Err(StartError::Plugin(first)) => {
                super::check::refuse_failing_plugins(&config).await?;
                return Err(StartError::Plugin(first).into());
            }
            Err(other) => return Err(other.into()),
        };
        signals.next().await;
        tracing::info!("shutting down: finishing the rows in hand (a second signal stops at once)");
        tokio::select! {
            () = host.shutdown() => Ok(()),
            () = signals.next() => {
                tracing::warn!("stopping at once: rows not acked yet will be redelivered");
                std::process::exit(130);
            }
        }
    }
}

/// Ctrl-C (SIGINT) and SIGTERM, listened for from creation on.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn listen() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt()).context("cannot listen for Ctrl-C")?,
            terminate: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
        })
    }

    /// The next Ctrl-C or SIGTERM.
    async fn next(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}
