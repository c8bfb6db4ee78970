//! The `weir` binary: thin glue over the library (`cli/`, one file per
//! subcommand). Errors are printed once, each cause once, and turn into
//! the exit code docs/cli.md lists.

mod cli;

use std::process::ExitCode;

use clap::Parser as _;
use weir::config::ConfigError;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    weir::telemetry::init_logging_at(cli.log_level());
    // reqwest is built without a TLS provider of its own: every client in
    // this process (the OTLP exporter's too) uses ring, as the rest does.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if !matches!(cli.command, cli::Command::Run(_)) {
        // A command piped into `head` ends quietly, as Unix tools do, instead
        // of panicking on a closed stdout. (`weir run` keeps SIGPIPE ignored:
        // a client hanging up must not stop the host.)
        // SAFETY: no other thread exists yet; SIG_DFL is a valid disposition.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
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
                eprintln!("weir: error: {}", cli::describe(&err));
            }
            ExitCode::from(cli::exit_code(&err))
        }
    }
}
