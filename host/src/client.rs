//! `weir send`: streams NDJSON (a file or stdin) to a front door (HTTP, or
//! the NATS door) in chunks, several requests at once. Each chunk carries an `Idempotency-Key` made
//! of its own bytes, so a retry (or the same input sent again) stores no
//! row twice; 429/503 answers are waited out as the server says.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use indicatif::ProgressBar;

use crate::telemetry::plural;
use reqwest::StatusCode;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

mod chunker;
mod place;
mod progress;
mod transport;

use chunker::{Chunk, Chunker, MAX_LINE_BYTES, ReadCause, ReadError};
use progress::{Progress, rate};
use transport::{
    Answered, HEADER_ROOM, Offer, Transport, Unanswered, cause_of, http_client, snippet,
};

pub use place::{Place, Sent};

/// Lines per request unless told otherwise.
pub const DEFAULT_CHUNK_ROWS: usize = 1000;
/// A request also closes at this many bytes: well below the front door's
/// default 16 MiB body limit, so a chunk of long rows is not refused (413).
pub const DEFAULT_CHUNK_BYTES: usize = 4 << 20;
/// Requests in flight at once unless told otherwise.
pub const DEFAULT_CONCURRENCY: usize = 4;
/// Requests one chunk gets in all (waits for 429/503 included), unless
/// told otherwise (`--retries`).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 30;
/// How long one chunk may take, retries and waits included, unless told
/// otherwise (`--timeout`).
pub const DEFAULT_CHUNK_TIMEOUT: Duration = Duration::from_secs(300);
/// Dead-lettered lines a summary names at most (it counts them all).
const MAX_NAMED_LINES: usize = 100;
/// Connection errors, 408 and 5xx answers (other than 503) one chunk may meet
/// before it gives up: these are not the server saying "later".
const MAX_TRANSIENT_FAILURES: u32 = 5;
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The longest single wait a `Retry-After` is honoured for, and the
/// shortest (a "wait 0 ms" would spend the attempts at once).
const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);
const MIN_RETRY_WAIT: Duration = Duration::from_millis(100);
/// How much of an answer's body is read (they are small JSON objects).
const MAX_ANSWER_BYTES: usize = 64 << 10;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `fetch_status` waits for a whole answer.
const STATUS_TIMEOUT: Duration = Duration::from_secs(10);
/// A request without an answer by then is retried (its key makes that safe).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How `<stdin>` is named in errors.
const STDIN_NAME: &str = "<stdin>";

/// Why a send stopped. Each says where: the input's line (or lines), or
/// the URL; those about a chunk say how many rows were accepted before it.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("cannot open {input}: {cause}")]
    Open {
        input: String,
        cause: std::io::Error,
    },
    #[error("{input}:{line}: cannot read: {cause}{sent}")]
    Read {
        input: String,
        line: usize,
        cause: std::io::Error,
        sent: Sent,
    },
    #[error(
        "{input}:{line}: the line is longer than {max} bytes, more than NATS stores in a message{sent}"
    )]
    LineTooLong {
        input: String,
        line: usize,
        max: usize,
        sent: Sent,
    },
    #[error("{url} is not a URL weir can post to: {cause}")]
    BadUrl { url: String, cause: String },
    #[error(
        "cannot reach {url}: {cause} (is weir running? start it with `weir run --config <file>`, or point --url at it){sent}"
    )]
    Unreachable {
        url: String,
        cause: String,
        sent: Sent,
    },
    #[error(
        "no weir host answers on {subject}: {cause} (is weir running with `[nats] ingest` on, on this NATS?){sent}"
    )]
    NoDoor {
        subject: String,
        cause: String,
        sent: Sent,
    },
    /// The server refused a chunk (4xx other than 429).
    #[error("{place}: refused ({status}): {message}{sent}")]
    Refused {
        place: Place,
        status: u16,
        message: String,
        sent: Sent,
    },
    /// The server kept saying "later" (or failing) past the attempts or
    /// the time allowed.
    #[error(
        "{place}: gave up after {} in {seconds:.1} s, the last answered {last}{sent}",
        plural(*attempts, "attempt", "attempts")
    )]
    GaveUp {
        place: Place,
        attempts: u32,
        seconds: f32,
        /// Boxed: keeps the error small (clippy's `result_large_err`).
        last: Box<str>,
        sent: Sent,
    },
    /// Every chunk was offered, and the server refused some (4xx): the rest
    /// were stored.
    #[error("{} refused ({} not stored): {}", plural(*count, "chunk", "chunks"), plural(*rows, "row", "rows"), .places.join(", "))]
    PartlyRefused {
        count: usize,
        rows: u64,
        places: Vec<String>,
    },
    #[error("unexpected answer from {url} ({status}): {detail}{sent}")]
    BadReply {
        url: String,
        status: u16,
        detail: String,
        sent: Sent,
    },
    #[error("cannot start weir send: {0}")]
    Setup(String),
    #[error("cannot trust --ca {path}: {reason}")]
    Ca { path: String, reason: String },
}

/// Where the rows come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Stdin,
    File(PathBuf),
}

impl Input {
    /// A command-line file argument: none or `-` is standard input.
    pub fn from_arg(file: Option<PathBuf>) -> Input {
        match file {
            Some(path) if path.as_os_str() != "-" => Input::File(path),
            _ => Input::Stdin,
        }
    }

    fn name(&self) -> String {
        match self {
            Input::Stdin => STDIN_NAME.to_string(),
            Input::File(path) => path.display().to_string(),
        }
    }
}

/// Which door a send goes through.
#[derive(Debug, Clone)]
pub enum Door {
    /// `POST <url>/v1/ingest/<table>`, the tenant named by its API key.
    Http {
        /// The host's base URL, e.g. `http://127.0.0.1:8080` (or `https://`).
        url: String,
        api_key: String,
        /// A PEM file of certificates to trust besides the system's (a
        /// private CA that signed the host's `[tls]` certificate).
        ca: Option<PathBuf>,
    },
    /// NATS requests to the table's ingest subject, the tenant named by it.
    Nats(NatsDoor),
}

/// The NATS door as a producer reaches it: a connection logged in as the
/// tenant's producer (answers on its own inbox prefix) and the subject.
#[derive(Clone)]
pub struct NatsDoor {
    pub client: async_nats::Client,
    /// `<prefix>.ingest.<tenant>.<table>`.
    pub subject: String,
    /// What the server refused this connection so far (permission
    /// violations): a request it refused gets no answer, this says why.
    pub refused: Arc<dyn Fn() -> Vec<String> + Send + Sync>,
}

impl fmt::Debug for NatsDoor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsDoor")
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

/// What to send, and where.
#[derive(Debug, Clone)]
pub struct SendOptions {
    pub door: Door,
    pub table: String,
    pub input: Input,
    /// Lines per request, at most.
    pub chunk_rows: usize,
    /// Bytes per request, at most (unless one line is longer); over NATS
    /// also below the server's `max_payload`.
    pub chunk_bytes: usize,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Stop at the first refused chunk instead of sending the rest.
    pub fail_fast: bool,
    /// How long one chunk may take, retries and waits included.
    pub timeout: Duration,
    /// Requests one chunk gets in all.
    pub max_attempts: u32,
    /// Sent as `Weir-Bad-Lines` (`refuse` or `dead-letter`): what the
    /// front door does with bad lines; none: the table's setting.
    pub bad_lines: Option<String>,
}

/// What a finished send did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Summary {
    /// Rows the server acknowledged, the duplicates among them.
    pub accepted: u64,
    /// Rows it already had (from an earlier send of the same chunk).
    pub duplicates: u64,
    /// Lines the front door wrote to the dead-letter stream.
    pub dead_lettered: u64,
    /// The first of them: `file:line: reason`.
    pub dead_lettered_lines: Vec<String>,
    /// Chunks refused (4xx) and not stored: `file:line: refused (400): …`.
    pub refused: Vec<String>,
    /// Rows of the refused chunks.
    pub refused_rows: u64,
    pub elapsed: Duration,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seconds = self.elapsed.as_secs_f64();
        write!(
            f,
            "{} accepted, {}, ",
            plural(self.accepted, "row", "rows"),
            plural(self.duplicates, "duplicate", "duplicates")
        )?;
        if self.dead_lettered > 0 {
            write!(
                f,
                "{} dead-lettered, ",
                plural(self.dead_lettered, "line", "lines")
            )?;
        }
        if !self.refused.is_empty() {
            write!(
                f,
                "{} refused ({} not stored), ",
                plural(self.refused.len(), "chunk", "chunks"),
                plural(self.refused_rows, "row", "rows")
            )?;
        }
        write!(
            f,
            "in {seconds:.1} s ({} rows/s)",
            rate(self.accepted, self.elapsed)
        )
    }
}

/// Sends the input, `concurrency` chunks at a time. On the first chunk
/// that fails for good, sends nothing more, waits for those in flight and
/// reports the earliest failure.
pub async fn send(options: &SendOptions) -> Result<Summary, SendError> {
    let started = Instant::now();
    let input = options.input.name();
    let (reader, size) = open(&options.input).map_err(|cause| SendError::Open {
        input: input.clone(),
        cause,
    })?;
    let (transport, chunk_bytes) = match &options.door {
        Door::Http { url, api_key, ca } => {
            let endpoint = ingest_url(url, &options.table)?;
            let client = http_client(ca.as_deref())?
                .connect_timeout(CONNECT_TIMEOUT.min(options.timeout))
                .timeout(REQUEST_TIMEOUT.min(options.timeout))
                .build()
                .map_err(|err| SendError::Setup(format!("no HTTP client: {}", cause_of(&err))))?;
            let transport = Transport::Http {
                client,
                endpoint,
                api_key: api_key.clone(),
            };
            (transport, options.chunk_bytes)
        }
        Door::Nats(door) => {
            // The server refuses a message past its `max_payload`, headers
            // included: chunks stay below it.
            let max_payload = door.client.server_info().max_payload;
            let room = max_payload.saturating_sub(HEADER_ROOM).max(1);
            (Transport::Nats(door.clone()), options.chunk_bytes.min(room))
        }
    };
    let chunks = spawn_reader(reader, options.chunk_rows, chunk_bytes)?;
    let progress = Progress::new(options.progress, size);
    let context = Context {
        transport,
        table: &options.table,
        bar: &progress.bar,
        reached: AtomicBool::new(false),
        input: &input,
        timeout: options.timeout,
        max_attempts: options.max_attempts.max(1),
        bad_lines: options.bad_lines.as_deref(),
        fail_fast: options.fail_fast,
        told_waiting: AtomicBool::new(false),
    };
    let outcome = drive(&context, chunks, options.concurrency.max(1), &progress).await;
    let tally = match outcome {
        Ok(tally) => tally,
        Err(failure) => {
            progress.bar.finish_and_clear();
            return Err(failure.into_error(&input, &context.transport));
        }
    };
    // The summary line takes the bar's place.
    progress.bar.finish_and_clear();
    Ok(Summary {
        accepted: tally.accepted,
        duplicates: tally.duplicates,
        dead_lettered: tally.dead_lettered,
        dead_lettered_lines: tally.dead_lettered_lines,
        refused: tally.refused,
        refused_rows: tally.refused_rows,
        elapsed: started.elapsed(),
    })
}

/// `<url>/v1/ingest/<table>`, the table percent-encoded as a path segment.
fn ingest_url(base: &str, table: &str) -> Result<String, SendError> {
    let bad = |cause: String| SendError::BadUrl {
        url: base.to_string(),
        cause,
    };
    let mut url = reqwest::Url::parse(base).map_err(|err| bad(err.to_string()))?;
    // Said before the first request rather than as a connection failure.
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad(format!(
            "weir send speaks http:// and https://, not {}://",
            url.scheme()
        )));
    }
    url.path_segments_mut()
        .map_err(|()| bad("it cannot have a path".to_string()))?
        .pop_if_empty()
        .extend(["v1", "ingest", table]);
    Ok(url.to_string())
}

fn open(input: &Input) -> std::io::Result<(Box<dyn Read + Send>, Option<u64>)> {
    match input {
        Input::Stdin => Ok((Box::new(std::io::stdin()), None)),
        Input::File(path) => {
            let file = std::fs::File::open(path)?;
            let metadata = file.metadata()?;
            if metadata.is_dir() {
                return Err(std::io::Error::other("it is a directory"));
            }
            // A pipe or a device has no size to make an ETA from.
            let size = (metadata.is_file() && metadata.len() > 0).then_some(metadata.len());
            Ok((Box::new(file), size))
        }
    }
}

/// Reads chunks on a thread of its own, one chunk ahead of the senders
/// (memory stays near `(concurrency + 2) * chunk_bytes`). A plain thread,
/// not a blocking task: a read of a terminal's stdin cannot be cancelled,
/// and the runtime would wait for it at exit.
fn spawn_reader(
    reader: Box<dyn Read + Send>,
    chunk_rows: usize,
    chunk_bytes: usize,
) -> Result<mpsc::Receiver<Result<Chunk, ReadError>>, SendError> {
    let (sender, receiver) = mpsc::channel(1);
    let mut chunker = Chunker::new(
        BufReader::with_capacity(256 << 10, reader),
        chunk_rows,
        chunk_bytes,
    );
    std::thread::Builder::new()
        .name("weir-send-reader".into())
        .spawn(move || {
            loop {
                let (item, last) = match chunker.next_chunk() {
                    Ok(None) => break,
                    Ok(Some(chunk)) => (Ok(chunk), false),
                    Err(err) => (Err(err), true),
                };
                // A failed send means nobody listens any more (a chunk
                // was refused): stop reading.
                if sender.blocking_send(item).is_err() || last {
                    break;
                }
            }
        })
        .map_err(|err| SendError::Setup(format!("no reader thread: {err}")))?;
    Ok(receiver)
}

/// What every chunk's requests share.
struct Context<'a> {
    transport: Transport,
    table: &'a str,
    bar: &'a ProgressBar,
    /// Set by the first answer: until then a refused connection means a
    /// wrong URL or no host, not worth retrying.
    reached: AtomicBool,
    /// The input's name, for `file:line` places.
    input: &'a str,
    timeout: Duration,
    max_attempts: u32,
    bad_lines: Option<&'a str>,
    fail_fast: bool,
    /// Set once a wait was said on stderr (without a progress bar).
    told_waiting: AtomicBool,
}

/// Rows the server answered for, in all.
#[derive(Default)]
struct Tally {
    accepted: u64,
    duplicates: u64,
    dead_lettered: u64,
    dead_lettered_lines: Vec<String>,
    refused: Vec<String>,
    refused_rows: u64,
}

/// The earliest chunk that failed, with what was accepted around it.
struct Failure {
    sequence: u64,
    lines: (usize, usize),
    error: ChunkError,
    sent: Sent,
}

impl Failure {
    fn into_error(self, input: &str, transport: &Transport) -> SendError {
        let url = transport.target();
        let (first_line, last_line) = self.lines;
        let place = |line: Option<usize>| Place {
            input: input.to_string(),
            line,
            first_line,
            last_line,
        };
        let sent = self.sent;
        let input = input.to_string();
        let url = url.to_string();
        match self.error {
            ChunkError::Read { line, cause } => SendError::Read {
                input,
                line,
                cause,
                sent,
            },
            ChunkError::LineTooLong { line } => SendError::LineTooLong {
                input,
                line,
                max: MAX_LINE_BYTES,
                sent,
            },
            ChunkError::BadUrl { cause } => SendError::BadUrl { url, cause },
            ChunkError::Unreachable { cause } => match transport {
                Transport::Http { .. } => SendError::Unreachable { url, cause, sent },
                Transport::Nats(_) => SendError::NoDoor {
                    subject: url,
                    cause,
                    sent,
                },
            },
            ChunkError::Refused {
                status,
                message,
                line,
            } => SendError::Refused {
                place: place(line),
                status,
                message,
                sent,
            },
            ChunkError::GaveUp {
                attempts,
                seconds,
                last,
            } => SendError::GaveUp {
                place: place(None),
                attempts,
                seconds,
                last: last.into_boxed_str(),
                sent,
            },
            ChunkError::BadReply { status, detail } => SendError::BadReply {
                url,
                status,
                detail,
                sent,
            },
        }
    }
}

/// Sends every chunk `receiver` yields, `concurrency` at once, until the
/// input ends or a chunk fails.
async fn drive(
    context: &Context<'_>,
    mut chunks: mpsc::Receiver<Result<Chunk, ReadError>>,
    concurrency: usize,
    progress: &Progress,
) -> Result<Tally, Failure> {
    let mut in_flight = FuturesUnordered::new();
    let mut tally = Tally::default();
    // Rows accepted by chunk, kept only past the first chunk still
    // unfinished (`settled`): enough to tell what came before a failure.
    let mut accepted_by_chunk = BTreeMap::<u64, u64>::new();
    let (mut settled, mut settled_rows) = (0u64, 0u64);
    let mut next_sequence = 0u64;
    let mut input_done = false;
    let mut failure: Option<Failure> = None;
    loop {
        let more = failure.is_none() && !input_done && in_flight.len() < concurrency;
        if !more && in_flight.is_empty() {
            break;
        }
        tokio::select! {
            next = chunks.recv(), if more => match next {
                None => input_done = true,
                Some(Ok(chunk)) => {
                    let sequence = next_sequence;
                    next_sequence += 1;
                    in_flight.push(async move {
                        let lines = (chunk.first_line, chunk.last_line);
                        let (rows, bytes) = (chunk.rows, chunk.bytes.len());
                        let answer = send_chunk(context, chunk).await;
                        (sequence, lines, rows, bytes, answer)
                    });
                }
                Some(Err(error)) => {
                    input_done = true;
                    let lines = (error.first_line, error.line);
                    keep_earliest(&mut failure, Failure {
                        sequence: next_sequence,
                        lines,
                        error: error.into(),
                        sent: Sent::default(),
                    });
                }
            },
            Some((sequence, lines, rows, bytes, answer)) = in_flight.next(), if !in_flight.is_empty() => {
                let accepted = match answer {
                    Ok(reply) => {
                        tally.accepted += reply.accepted;
                        tally.duplicates += reply.duplicates;
                        tally.dead_lettered += reply.dead_lettered.unwrap_or(0);
                        for bad in reply.bad_lines {
                            if tally.dead_lettered_lines.len() < MAX_NAMED_LINES {
                                tally.dead_lettered_lines.push(format!("{}:{}: {}", context.input, bad.line, strip_line(&bad.error, bad.line)));
                            }
                        }
                        progress.chunk_done(tally.accepted, rows as u64, bytes as u64);
                        reply.accepted
                    }
                    // The data's fault, not the host's: said, and the rest
                    // of the input still goes (unless told to stop).
                    Err(ChunkError::Refused { status, message, line }) if !context.fail_fast => {
                        let place = Place { input: context.input.to_string(), line, first_line: lines.0, last_line: lines.1 };
                        let said = format!("{place}: refused ({status}): {message}");
                        progress.bar.suspend(|| eprintln!("{said}; lines {}-{} not stored", lines.0, lines.1));
                        tally.refused.push(said);
                        tally.refused_rows += rows as u64;
                        progress.chunk_done(tally.accepted, rows as u64, bytes as u64);
                        0
                    }
                    Err(error) => {
                        keep_earliest(&mut failure, Failure { sequence, lines, error, sent: Sent::default() });
                        0
                    }
                };
                accepted_by_chunk.insert(sequence, accepted);
                while let Some(rows) = accepted_by_chunk.remove(&settled) {
                    // A failed chunk stays in the map: it marks where
                    // "before" ends, and nothing settles past it.
                    if failure.as_ref().is_some_and(|f| f.sequence == settled) {
                        accepted_by_chunk.insert(settled, rows);
                        break;
                    }
                    settled_rows += rows;
                    settled += 1;
                }
            }
        }
    }
    match failure {
        None => Ok(tally),
        Some(mut failure) => {
            let before: u64 = accepted_by_chunk
                .range(..failure.sequence)
                .map(|(_, rows)| rows)
                .sum();
            let after = accepted_by_chunk
                .range(failure.sequence + 1..)
                .map(|(_, rows)| rows)
                .sum();
            failure.sent = Sent {
                lines: Some(failure.lines),
                before: settled_rows + before,
                after,
            };
            Err(failure)
        }
    }
}

fn keep_earliest(failure: &mut Option<Failure>, new: Failure) {
    if failure
        .as_ref()
        .is_none_or(|old| new.sequence < old.sequence)
    {
        *failure = Some(new);
    }
}

/// Why one chunk failed for good.
#[derive(Debug)]
enum ChunkError {
    Read {
        line: usize,
        cause: std::io::Error,
    },
    LineTooLong {
        line: usize,
    },
    BadUrl {
        cause: String,
    },
    Unreachable {
        cause: String,
    },
    /// `line` is a line of the input.
    Refused {
        status: u16,
        message: String,
        line: Option<usize>,
    },
    GaveUp {
        attempts: u32,
        seconds: f32,
        last: String,
    },
    BadReply {
        status: u16,
        detail: String,
    },
}

impl From<ReadError> for ChunkError {
    fn from(error: ReadError) -> ChunkError {
        let line = error.line;
        match error.cause {
            ReadCause::Io(cause) => ChunkError::Read { line, cause },
            ReadCause::LineTooLong => ChunkError::LineTooLong { line },
        }
    }
}

/// A 202's body.
#[derive(Debug, Default, serde::Deserialize)]
struct Reply {
    accepted: u64,
    #[serde(default)]
    duplicates: u64,
    /// With `bad_lines = "dead-letter"`: lines gone to the dead-letter
    /// stream, and the first of them.
    #[serde(default)]
    dead_lettered: Option<u64>,
    #[serde(default)]
    bad_lines: Vec<BadLineReply>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct BadLineReply {
    line: usize,
    error: String,
}

/// A reason without its leading `line N: `, which the place says already.
fn strip_line(reason: &str, line: usize) -> &str {
    reason
        .strip_prefix(&format!("line {line}: "))
        .unwrap_or(reason)
}

/// An error answer's body; any field may be missing (a proxy's answer).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct Refusal {
    error: Option<String>,
    line: Option<usize>,
    retry_after_ms: Option<u64>,
}

/// Offers one chunk until it is accepted, refused, or the attempts run out.
async fn send_chunk(context: &Context<'_>, chunk: Chunk) -> Result<Reply, ChunkError> {
    let key = idempotency_key(context.table, chunk.first_line, &chunk.bytes);
    let first_line = chunk.first_line;
    let body = Bytes::from(chunk.bytes);
    let mut transient = 0u32;
    let mut last = String::new();
    let started = Instant::now();
    let max_attempts = context.max_attempts;
    // Gives up once the next wait would end past the chunk's time.
    let gave_up = |attempts: u32, last: String| ChunkError::GaveUp {
        attempts,
        seconds: started.elapsed().as_secs_f32(),
        last,
    };
    let out_of_time = |wait: Duration| started.elapsed() + wait > context.timeout;
    for attempt in 1..=max_attempts {
        let offer = Offer {
            key: &key,
            first_line,
            bad_lines: context.bad_lines,
            body: body.clone(),
            timeout: context
                .timeout
                .saturating_sub(started.elapsed())
                .clamp(MIN_RETRY_WAIT, REQUEST_TIMEOUT),
        };
        let answered = match context.transport.offer(offer).await {
            Ok(answered) => answered,
            Err(Unanswered::BadUrl(cause)) => return Err(ChunkError::BadUrl { cause }),
            Err(Unanswered::Refused { status, message }) => {
                return Err(ChunkError::Refused {
                    status,
                    message,
                    line: None,
                });
            }
            Err(Unanswered::BadReply(detail)) => {
                return Err(ChunkError::BadReply { status: 0, detail });
            }
            Err(Unanswered::NoAnswer { cause, connect }) => {
                transient += 1;
                let never_reached = connect && !context.reached.load(Ordering::Relaxed);
                if never_reached || transient > MAX_TRANSIENT_FAILURES {
                    return Err(ChunkError::Unreachable { cause });
                }
                if attempt == max_attempts || out_of_time(backoff(transient)) {
                    return Err(gave_up(attempt, cause));
                }
                note(context, first_line, &cause, backoff(transient));
                tokio::time::sleep(backoff(transient)).await;
                last = cause;
                continue;
            }
            Err(Unanswered::Broken(cause)) => {
                // The connection broke mid-answer: the rows may be stored,
                // which the key makes harmless to retry.
                transient += 1;
                if transient > MAX_TRANSIENT_FAILURES {
                    return Err(ChunkError::Unreachable { cause });
                }
                if attempt == max_attempts || out_of_time(backoff(transient)) {
                    return Err(gave_up(attempt, cause));
                }
                tokio::time::sleep(backoff(transient)).await;
                last = cause;
                continue;
            }
        };
        context.reached.store(true, Ordering::Relaxed);
        match judge(answered) {
            Ok(reply) => return Ok(reply),
            Err(Next::Stop(err)) => return Err(err),
            Err(Next::Wait { why, wait }) => {
                last = why;
                if attempt == max_attempts || out_of_time(wait) {
                    return Err(gave_up(attempt, last));
                }
                note(context, first_line, &last, wait);
                tokio::time::sleep(wait).await;
            }
            Err(Next::Transient(why)) => {
                transient += 1;
                last = why;
                if transient > MAX_TRANSIENT_FAILURES
                    || attempt == max_attempts
                    || out_of_time(backoff(transient))
                {
                    return Err(gave_up(attempt, last));
                }
                note(context, first_line, &last, backoff(transient));
                tokio::time::sleep(backoff(transient)).await;
            }
        }
    }
    Err(gave_up(max_attempts, last))
}

/// What a door's answer means for its chunk, short of its rows accepted.
enum Next {
    /// Try again after `wait` (429, 503: the door said how long).
    Wait { why: String, wait: Duration },
    /// Try again after a backoff (5xx, 408).
    Transient(String),
    /// Stop: refused, or an answer that is not the door's.
    Stop(ChunkError),
}

/// Reads a door's answer to a chunk.
fn judge(answered: Answered) -> Result<Reply, Next> {
    let Answered {
        status,
        retry_after,
        body: answer,
    } = answered;
    if status.is_success() {
        return serde_json::from_slice::<Reply>(&answer).map_err(|err| {
            Next::Stop(ChunkError::BadReply {
                status: status.as_u16(),
                detail: format!("{err} in {}", snippet(&answer)),
            })
        });
    }
    let refusal = serde_json::from_slice::<Refusal>(&answer).unwrap_or_default();
    let message = refusal.error.clone().unwrap_or_else(|| snippet(&answer));
    if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
        // The body's milliseconds are more precise than the header's
        // seconds (rounded up).
        let wait = refusal
            .retry_after_ms
            .map(Duration::from_millis)
            .or(retry_after)
            .unwrap_or(Duration::from_secs(1))
            .clamp(MIN_RETRY_WAIT, MAX_RETRY_WAIT);
        let why = format!("{} ({message})", status.as_u16());
        return Err(Next::Wait { why, wait });
    }
    // A 408 means the body came too slowly: the link, not the rows.
    if status.is_server_error() || status == StatusCode::REQUEST_TIMEOUT {
        return Err(Next::Transient(format!("{} ({message})", status.as_u16())));
    }
    // The server numbers lines as the input does (`Weir-First-Line`);
    // its "line N: " prefix repeats what the place says.
    let line = refusal.line;
    let message = match line {
        Some(line) => strip_line(&message, line).to_string(),
        None => message,
    };
    Err(Next::Stop(ChunkError::Refused {
        status: status.as_u16(),
        message,
        line,
    }))
}

/// Says on the progress bar why a chunk waits; without a bar, says the
/// first wait on stderr, so a send that waits is never silent.
fn note(context: &Context<'_>, first_line: usize, why: &str, wait: Duration) {
    let said = format!(
        "line {first_line}: {why}; retrying in {:.1} s",
        wait.as_secs_f64()
    );
    if context.bar.is_hidden() {
        if !context.told_waiting.swap(true, Ordering::Relaxed) {
            eprintln!(
                "weir send: {}:{said} (giving up on a chunk after {} s, --timeout)",
                context.input,
                context.timeout.as_secs()
            );
        }
    } else {
        context.bar.set_message(said);
    }
}

/// 200 ms, doubling, at most `MAX_BACKOFF`.
fn backoff(failures: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1 << failures.saturating_sub(1).min(10))
        .min(MAX_BACKOFF)
}

/// `send-` and 32 hex digits of the SHA-256 of the table, the chunk's first
/// line number and its bytes: the same chunk of the same input gets the
/// same key (a retry is stored once), while equal rows elsewhere in the
/// input (another first line) are not taken for a retry.
fn idempotency_key(table: &str, first_line: usize, bytes: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(table.as_bytes());
    hasher.update([0]);
    hasher.update(first_line.to_string().as_bytes());
    hasher.update([0]);
    hasher.update(bytes);
    let digest = hasher.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("send-{hex}")
}

/// Default front door URL for the client commands.
pub fn default_url() -> String {
    format!("http://{}", crate::config::DEFAULT_LISTEN)
}

/// Reads a host's status report; with an admin key (all tenants, where
/// NATS is) or a tenant's key (its own usage), or without (neither).
pub async fn fetch_status(
    url: &str,
    key: Option<&str>,
) -> Result<crate::ops::status::StatusReport, SendError> {
    fetch_status_trusting(url, key, None).await
}

/// The same, over HTTPS trusting the certificates in `ca` too (a PEM file).
pub async fn fetch_status_trusting(
    url: &str,
    key: Option<&str>,
    ca: Option<&Path>,
) -> Result<crate::ops::status::StatusReport, SendError> {
    let endpoint = format!("{}/v1/status", url.trim_end_matches('/'));
    let client = http_client(ca)?
        .build()
        .map_err(|err| SendError::Setup(format!("no HTTP client: {}", cause_of(&err))))?;
    // A host answers within its NATS read bound; a frozen host must not
    // hang `weir status` (or `--wait-drained`) for ever.
    let mut request = client.get(&endpoint).timeout(STATUS_TIMEOUT);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|err| SendError::Unreachable {
        url: endpoint.clone(),
        cause: cause_of(&err),
        sent: Sent::default(),
    })?;
    let status = response.status().as_u16();
    let body = response
        .bytes()
        .await
        .map_err(|err| SendError::Unreachable {
            url: endpoint.clone(),
            cause: cause_of(&err),
            sent: Sent::default(),
        })?;
    serde_json::from_slice(&body).map_err(|err| SendError::BadReply {
        url: endpoint.clone(),
        status,
        detail: format!("{err} in {}", snippet(&body)),
        sent: Sent::default(),
    })
}

#[cfg(test)]
mod tests;
