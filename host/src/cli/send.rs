//! `weir send`: NDJSON from a file or stdin to a front door.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;

use clap::builder::RangedU64ValueParser;
use weir::client::{
    DEFAULT_CHUNK_BYTES, DEFAULT_CHUNK_ROWS, DEFAULT_CHUNK_TIMEOUT, DEFAULT_CONCURRENCY,
    DEFAULT_MAX_ATTEMPTS, Input, SendError, SendOptions, send,
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
answers are waited out as Retry-After says, for at most --timeout per chunk \
and --retries requests. A refused chunk (a bad line, with the table's \
bad_lines = \"refuse\") is said on stderr as file:line and the rest of the \
input is still sent; the summary counts what was refused and the exit code \
is 5. With --fail-fast nothing more is sent after the first refused chunk. \
Lines the host dead-lettered (bad_lines = \"dead-letter\", or --bad-lines) \
are named by file:line.")]
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
    /// Stop at the first refused chunk instead of sending the rest.
    #[arg(long)]
    fail_fast: bool,
    /// Seconds one chunk may take, its retries and waits included; past
    /// it the send stops, saying what the host last answered.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_CHUNK_TIMEOUT.as_secs(),
          value_parser = RangedU64ValueParser::<u64>::new().range(1..=86_400))]
    timeout: u64,
    /// Retries of one chunk at most (after 429, 503, 5xx or a lost
    /// connection).
    #[arg(long, default_value_t = DEFAULT_MAX_ATTEMPTS - 1,
          value_parser = RangedU64ValueParser::<u32>::new().range(0..=1000))]
    retries: u32,
    /// What the host does with bad lines, overriding the table's
    /// `bad_lines`: refuse their chunk, or store the good rows and
    /// dead-letter the bad ones.
    #[arg(long, value_parser = ["refuse", "dead-letter"])]
    bad_lines: Option<String>,
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
            fail_fast: self.fail_fast,
            timeout: std::time::Duration::from_secs(self.timeout),
            max_attempts: self.retries.saturating_add(1),
            bad_lines: self.bad_lines,
        };
        let summary = send(&options).await?;
        for line in &summary.dead_lettered_lines {
            eprintln!("{line}: dead-lettered");
        }
        if summary.dead_lettered > summary.dead_lettered_lines.len() as u64 {
            eprintln!(
                "… and {} more dead-lettered lines (weir dlq list)",
                summary.dead_lettered - summary.dead_lettered_lines.len() as u64
            );
        }
        // The rows are in: a reader of stdout that went away (`| head -0`)
        // is no reason to fail, nor to panic as println! would.
        match writeln!(std::io::stdout(), "{summary}") {
            Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => return Err(err.into()),
            _ => {}
        }
        if !summary.refused.is_empty() {
            let places = summary
                .refused
                .iter()
                .map(|said| said.split(": refused").next().unwrap_or(said).to_string())
                .collect();
            return Err(SendError::PartlyRefused {
                count: summary.refused.len(),
                rows: summary.refused_rows,
                places,
            }
            .into());
        }
        Ok(())
    }
}
