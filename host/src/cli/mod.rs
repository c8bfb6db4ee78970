//! The `weir` command line: one file per subcommand, each a clap `Args`
//! with its own `run`. Errors come back as `anyhow` chains and become a
//! documented exit code in `main.rs`.

mod check;
mod dlq;
mod mq;
mod plugin;
mod run;
mod send;
mod status;
mod target;
mod tenant;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "A WebAssembly-plugin ingest host on NATS JetStream"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run a host: front door, delivery and plugins (starts its own
    /// nats-server when no NATS URL is configured).
    Run(run::RunArgs),
    /// Look at dead letters, and re-inject them after a fix.
    Dlq {
        #[command(subcommand)]
        what: dlq::DlqCommand,
    },
    /// Per-tenant settings the budget policy reads, fleet-wide.
    Tenant {
        #[command(subcommand)]
        what: tenant::TenantCommand,
    },
    /// Roll a plugin out to every host of the fleet, or back.
    Plugin {
        #[command(subcommand)]
        what: plugin::PluginCommand,
    },
    /// What an operator applies to NATS for this config.
    Mq {
        #[command(subcommand)]
        what: mq::MqCommand,
    },
    /// Post an NDJSON file to a front door, in chunks, with a progress bar.
    Send(send::SendArgs),
    /// Print a host's status: rows accepted, delivered, dead-lettered, backlog.
    Status(status::StatusArgs),
    /// Check a config file and report every problem in it.
    Check(check::CheckArgs),
}

pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => args.run().await,
        Command::Dlq { what } => what.run().await,
        Command::Tenant { what } => what.run().await,
        Command::Plugin { what } => what.run().await,
        Command::Mq { what } => what.run().await,
        Command::Send(args) => args.run().await,
        Command::Status(args) => args.run().await,
        Command::Check(args) => args.run().await,
    }
}
