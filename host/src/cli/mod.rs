//! The `weir` command line: one file per subcommand, each a clap `Args`
//! with its own `run`. Errors come back as `anyhow` chains and become a
//! documented exit code in `main.rs`.

mod check;
mod dlq;
mod mq;
mod plugin;
mod plugin_new;
mod run;
mod send;
mod state;
mod status;
mod target;
mod tenant;

// `weir plugin test` and `weir plugin check`, beside `plugin.rs`.
mod plugin_check;
mod plugin_expect;
mod plugin_test;

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
    /// Log more: -v info, -vv debug (operator commands log only warnings
    /// by default; `weir run` logs info; WEIR_LOG overrides both).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

impl Cli {
    /// The level of weir's own log lines for this command line.
    pub fn log_level(&self) -> &'static str {
        const LEVELS: [&str; 4] = ["warn", "info", "debug", "trace"];
        if self.verbose == 0
            && matches!(
                &self.command,
                Command::Plugin {
                    what: plugin::PluginCommand::Test(_) | plugin::PluginCommand::Check(_)
                }
            )
        {
            // Warnings, and the compile lines (`sandbox::COMPILE_LOG`).
            return "warn,weir::compile=info";
        }
        let host = usize::from(matches!(self.command, Command::Run(_)));
        LEVELS[(host + usize::from(self.verbose)).min(LEVELS.len() - 1)]
    }
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
    /// The durable state plugins keep (`grants.state`).
    State {
        #[command(subcommand)]
        what: state::StateCommand,
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
    /// Print a shell completion script (e.g. `weir completions bash >
    /// /etc/bash_completion.d/weir`).
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => args.run().await,
        Command::Dlq { what } => what.run().await,
        Command::Tenant { what } => what.run().await,
        Command::State { what } => what.run().await,
        Command::Plugin { what } => what.run().await,
        Command::Mq { what } => what.run().await,
        Command::Send(args) => args.run().await,
        Command::Status(args) => args.run().await,
        Command::Check(args) => args.run().await,
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "weir", &mut std::io::stdout());
            Ok(())
        }
    }
}

/// A refusal that is not a crash: the server or the plugin said no.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// The exit code for an error (docs/cli.md): 3 invalid config, 4 cannot
/// connect, 5 refused (by the server, the front door or a plugin's world),
/// 6 a plugin call failed in `weir plugin test`, 7 its outcomes are not
/// the expected ones, 1 anything else. Clap exits with 2 on a usage error itself.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    use weir::client::SendError;
    use weir::host::StartError;
    for cause in error.chain() {
        if cause.is::<weir::config::ConfigError>() {
            return 3;
        }
        if cause.is::<plugin_test::PluginFailed>() {
            return 6;
        }
        if cause.is::<plugin_expect::NotAsExpected>() {
            return 7;
        }
        if cause.is::<weir::nats::ConnectError>() {
            return 4;
        }
        if cause.is::<weir::topology::TopologyError>()
            || cause.is::<weir::sandbox::LoadError>()
            || cause.is::<Refused>()
        {
            return 5;
        }
        match cause.downcast_ref::<SendError>() {
            Some(SendError::Unreachable { .. } | SendError::NoDoor { .. }) => return 4,
            Some(SendError::Refused { .. } | SendError::PartlyRefused { .. }) => return 5,
            _ => {}
        }
        match cause.downcast_ref::<StartError>() {
            Some(StartError::Connect(_)) => return 4,
            Some(StartError::Topology(_) | StartError::Plugin(_)) => return 5,
            _ => {}
        }
    }
    1
}

/// An error and its causes, each said once.
pub fn describe(error: &anyhow::Error) -> String {
    weir::telemetry::each_cause_once(error.as_ref())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::Cli;

    /// `weir <command> --help` explains every argument it lists.
    #[test]
    fn every_argument_of_every_command_has_help() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                if help.trim().is_empty() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in command.get_subcommands() {
                if sub.get_about().is_none() && sub.get_name() != "help" {
                    missing.push(format!("{path} {} (no about)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let command = Cli::command();
        command.clone().debug_assert();
        let mut missing = Vec::new();
        walk(&command, "weir", &mut missing);
        assert!(missing.is_empty(), "arguments without help: {missing:#?}");
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let error = anyhow::Error::new(weir::config::ConfigError::Read {
            path: "nope.toml".into(),
            source: io,
        });
        assert_eq!(
            super::describe(&error),
            "cannot read config file nope.toml: No such file"
        );
    }
}
