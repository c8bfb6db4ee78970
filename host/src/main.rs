//! The `weir` binary: thin glue over the library (`cli/`, one file per
//! subcommand). Errors are printed once, as a chain, and turn into a
//! non-zero exit code.

mod cli;

use std::process::ExitCode;

use clap::Parser as _;
use weir::config::ConfigError;

fn main() -> ExitCode {
    weir::telemetry::init_logging();
    let cli = cli::Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("weir: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli.command)) {
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
