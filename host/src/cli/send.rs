//! `weir send`: NDJSON from a file or stdin to a front door, HTTP or NATS.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;

use clap::builder::RangedU64ValueParser;
use std::sync::Arc;

use weir::client::{
    DEFAULT_CHUNK_BYTES, DEFAULT_CHUNK_ROWS, DEFAULT_CHUNK_TIMEOUT, DEFAULT_CONCURRENCY,
    DEFAULT_MAX_ATTEMPTS, Door, Input, NatsDoor, SendError, SendOptions, send,
};
use weir::config::{Config, DEFAULT_PARTITIONS, DEFAULT_PREFIX, DEFAULT_SHARDS, Overrides};
use weir::nats::{ConnectError, Refusals, connect_producer, redact};
use weir::topology::Names;

use super::target::{HostTarget, NatsLogin, router_of};

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
    #[arg(
        short,
        long,
        env = "WEIR_API_KEY",
        hide_env_values = true,
        required_unless_present = "nats"
    )]
    key: Option<String>,
    #[command(flatten)]
    host: HostTarget,
    /// Send over the NATS door instead: the NATS server's URL (or a
    /// comma-separated seed list). Rows go as requests to
    /// `<prefix>.ingest.<tenant>.<table>` (the prefix of --config, else
    /// `weir`), logged in as the tenant's producer (--nats-creds,
    /// --nats-user/--nats-password, --nats-token …); --url and --key
    /// (or WEIR_URL, WEIR_API_KEY) are not used then.
    #[arg(long, value_name = "URL", requires = "tenant")]
    nats: Option<String>,
    /// The tenant the rows are for (with --nats: its subject names it).
    #[arg(long, requires = "nats")]
    tenant: Option<String>,
    #[command(flatten)]
    login: NatsLogin,
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
    /// The NATS door of `tenant` at `url`, logged in as its producer, with
    /// answers on its inbox prefix; a server that does not answer within
    /// `timeout` is a failed send.
    async fn nats_door(
        &self,
        url: &str,
        tenant: &str,
        timeout: std::time::Duration,
    ) -> anyhow::Result<NatsDoor> {
        let names = match &self.host.config {
            Some(path) => router_of(&Config::load(path, &Overrides::default())?),
            None => Names::new(DEFAULT_PREFIX, DEFAULT_PARTITIONS, DEFAULT_SHARDS),
        };
        let refusals = Refusals::default();
        let (auth, inbox) = (self.login.auth(), names.tenant_inbox(tenant));
        let connect = connect_producer(url, &auth, &refusals, &inbox);
        let client = tokio::time::timeout(timeout, connect).await.map_err(|_| {
            ConnectError::Unreachable {
                url: redact(url),
                reason: format!("no answer in {} s (--timeout)", timeout.as_secs()),
            }
        })??;
        Ok(NatsDoor {
            client,
            subject: names.ingest_subject(tenant, &self.table),
            refused: Arc::new(move || refusals.list()),
        })
    }

    pub async fn run(self) -> anyhow::Result<()> {
        let timeout = std::time::Duration::from_secs(self.timeout);
        let door = match (&self.nats, &self.tenant) {
            (Some(url), Some(tenant)) => Door::Nats(self.nats_door(url, tenant, timeout).await?),
            _ => Door::Http {
                url: self.host.url()?,
                api_key: self.key.clone().unwrap_or_default(),
                ca: self.host.ca.clone(),
            },
        };
        let options = SendOptions {
            door,
            table: self.table,
            input: Input::from_arg(self.file),
            chunk_rows: self.chunk_rows,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            concurrency: self.concurrency,
            progress: !self.quiet && std::io::stderr().is_terminal(),
            fail_fast: self.fail_fast,
            timeout,
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
