//! `weir send`: NDJSON from a file or stdin to a front door.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;

use clap::builder::RangedU64ValueParser;
use weir::client::{
    DEFAULT_CHUNK_BYTES, DEFAULT_CHUNK_ROWS, DEFAULT_CONCURRENCY, Input, SendOptions, send,
};

use super::target::HostTarget;

/// The rows of a file or stdin, in chunks, several requests at once.
// The subcommand's one-line about is in cli/mod.rs; how retries and
// refusals behave is worth the longer text below.
#[derive(clap::Args)]
#[command(after_help = "\
Each chunk carries an Idempotency-Key made of its bytes: a retried chunk is \
stored once, and the same input sent again within the stream's duplicate \
window (with the same --chunk-rows) comes back as duplicates. 429 and 503 \
answers are waited out as Retry-After says. On a refused chunk nothing more \
is sent: the error names the input's line and how many rows were accepted \
before it.")]
pub struct SendArgs {
    /// The table the rows go to.
    #[arg(short, long)]
    table: String,
    /// The tenant's API key (sent as `Authorization: Bearer <key>`).
    #[arg(short, long, env = "WEIR_API_KEY", hide_env_values = true)]
    key: String,
    #[command(flatten)]
    host: HostTarget,
    /// Lines per request, at most (a request also closes at 4 MiB).
    #[arg(long, default_value_t = DEFAULT_CHUNK_ROWS,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    chunk_rows: usize,
    /// Requests in flight at once.
    #[arg(short = 'j', long, default_value_t = DEFAULT_CONCURRENCY,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=256))]
    concurrency: usize,
    /// No progress bar (there is none anyway when stderr is not a
    /// terminal); the summary line is still printed.
    #[arg(short, long)]
    quiet: bool,
    /// The NDJSON file; `-` or none reads standard input.
    file: Option<PathBuf>,
}

impl SendArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let options = SendOptions {
            url: self.host.url()?,
            table: self.table,
            api_key: self.key,
            input: Input::from_arg(self.file),
            chunk_rows: self.chunk_rows,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            concurrency: self.concurrency,
            progress: !self.quiet && std::io::stderr().is_terminal(),
        };
        let summary = send(&options).await?;
        // The rows are in: a reader of stdout that went away (`| head -0`)
        // is no reason to fail, nor to panic as println! would.
        match writeln!(std::io::stdout(), "{summary}") {
            Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => Err(err.into()),
            _ => Ok(()),
        }
    }
}
