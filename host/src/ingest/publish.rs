//! Publishing accepted rows to their partition stream. A call returns only
//! once JetStream has stored every row, so a 2xx always means "durable".
//!
//! A request's rows for one unit are stored as a prefix: if row k is
//! refused, no row after it is stored. Pipelined single publishes could not
//! promise that: a full partition refuses row k, acks free room, rows k+1…
//! are stored, and the producer's retry stores row k behind them. Rows with
//! fresh ids go as one fast batch (nats-server 2.14+, stored as they
//! arrive, ended at the first refusal); rows that may be stored already (a
//! retry, per-row keys) go as atomic batches, stored whole or not at all,
//! so each row's "already stored" is known. A retry under the same request
//! key, or a batch the server refuses for holding a stored row and the
//! rows after it, go as one fast batch (which skips stored rows), then are
//! sent again to learn which were stored before (`publish_partly_stored`).

use crate::telemetry::traces::TRACEPARENT;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::header::{NATS_BATCH_COMMIT, NATS_BATCH_ID, NATS_BATCH_SEQUENCE, NATS_MESSAGE_ID};
use async_nats::jetstream::{
    self, ErrorCode, context::PublishErrorKind, message::PublishMessage, publish::PublishAck,
};
use bytes::Bytes;
use futures::StreamExt;
use serde::Deserialize;
use tokio::sync::{Semaphore, mpsc};

use crate::ingest::policy::Placement;
use crate::ingest::usage::Accept;
use crate::topology::route::{Names, Unit};

/// Room left in a message for its headers (message id, batch headers)
/// under the server's `max_payload`.
const HEADER_ROOM: usize = 1024;

/// Rows per atomic batch: the server's default `max_batch_size`. A server
/// configured lower says so when a batch is refused, and batches shrink.
const MAX_BATCH_ROWS: usize = 1000;

/// Batches this host keeps open at once per partition stream. The server
/// allows 50 per stream (1000 per server); this leaves room for a few
/// hosts, and a host that still finds none free waits and tries again.
const BATCHES_PER_STREAM: usize = 16;

/// How often, and how far apart, a batch the server dropped unstored
/// (too many open, or lost with a leader change) is sent again.
const BATCH_ATTEMPTS: u32 = 6;
const BATCH_BACKOFF: Duration = Duration::from_millis(20);

/// Rows of a fast batch sent ahead of the server's flow acks; and how many
/// rows the server may let pass between acks (it starts lower when other
/// batches share the stream, and ramps up).
const FAST_WINDOW: u64 = 1024;
const FAST_FLOW: u64 = 256;
/// Longest silence from the stream while a fast batch is open: it acks
/// every few rows, so this long means it is not there.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Rows of a partly stored request sent again at once after its fast
/// batch, to learn which were stored before (each is a duplicate then).
const LOOKUPS_IN_FLIGHT: usize = 1024;

/// What a stored row costs its stream beyond the payload: subject, headers
/// and the store's framing, roughly (for the partition-size check).
const ROW_OVERHEAD: u64 = 256;

/// Why rows were not all stored.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// NATS is unreachable or did not answer in time: try again later.
    #[error("NATS is unavailable: {0}")]
    Unavailable(String),
    /// The partition stream refused the row because it is full.
    #[error("the partition stream is full: {0}")]
    StreamFull(String),
    /// One row is larger than the server accepts.
    #[error("row {index} is larger than the NATS server's max_payload")]
    TooLarge { index: usize },
    /// An atomic batch outgrows its partition stream even when empty: it
    /// could never be stored, so retrying is no use.
    #[error(
        "rows {first}..={last} go to partition {partition} as one atomic batch of about {bytes} bytes, more than the partition holds (max_bytes {max_bytes}); send smaller requests"
    )]
    LargerThanPartition {
        first: usize,
        last: usize,
        partition: u32,
        bytes: u64,
        max_bytes: u64,
    },
    #[error("publish failed: {0}")]
    Other(String),
}

/// Whether some of a request's rows may be stored already: then each row's
/// "already stored" must be learnt, which a fast batch does not report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ids {
    /// No id, or ids no earlier request used (a new `Idempotency-Key`).
    Fresh,
    /// Rows with their own keys: most are usually new, so they go as
    /// atomic batches, stored in one pass unless the server finds one stored.
    MaybeStored,
    /// A retry under the same `Idempotency-Key` whose record does not say
    /// stored: likely cut short, some rows stored. An atomic batch would be
    /// refused, so they go straight to the partly stored publish.
    Retry,
}

/// Publishes rows for the front door (and, later, other ingest paths).
#[derive(Clone)]
pub struct Publisher {
    client: async_nats::Client,
    js: jetstream::Context,
    router: Names,
    /// Read once at start: every server of a cluster has the same limit.
    max_row_bytes: usize,
    /// A partition stream's `max_bytes`, if limited.
    partition_max_bytes: Option<u64>,
    batches: Arc<Batches>,
}

/// What atomic batches need across requests.
struct Batches {
    /// Unique per process (a NUID), so batch ids never collide between hosts.
    id_prefix: String,
    next_id: AtomicU64,
    /// Lowered once if the server's `max_batch_size` is smaller.
    max_rows: AtomicUsize,
    /// Open atomic batches per partition stream, by partition.
    open: Vec<Semaphore>,
    /// Where the server's fast-batch replies arrive, set up on first use.
    fast_replies: tokio::sync::Mutex<Option<Arc<FastReplies>>>,
}

impl Publisher {
    /// `partition_max_bytes` is `[stream] max_bytes` (negative: unlimited).
    pub fn new(client: async_nats::Client, router: Names, partition_max_bytes: i64) -> Publisher {
        let js = jetstream::new(client.clone());
        let max_row_bytes = client.server_info().max_payload.saturating_sub(HEADER_ROOM);
        let inbox = client.new_inbox();
        let batches = Arc::new(Batches {
            id_prefix: inbox.rsplit('.').next().unwrap_or(&inbox).to_string(),
            next_id: AtomicU64::new(0),
            max_rows: AtomicUsize::new(MAX_BATCH_ROWS),
            open: (0..router.partitions())
                .map(|_| Semaphore::new(BATCHES_PER_STREAM))
                .collect(),
            fast_replies: tokio::sync::Mutex::new(None),
        });
        Publisher {
            client,
            js,
            router,
            max_row_bytes,
            partition_max_bytes: u64::try_from(partition_max_bytes).ok().filter(|&b| b > 0),
            batches,
        }
    }

    /// The name a unit goes by in logs and metrics (its consumer's).
    pub fn unit_name(&self, unit: crate::topology::route::Unit) -> String {
        self.router.unit_consumer(unit)
    }

    /// The largest row the server stores (its `max_payload`, less room for
    /// headers): checked for every row of a request before the first is
    /// published, so a refused request stores nothing.
    pub fn max_row_bytes(&self) -> usize {
        self.max_row_bytes
    }

    /// True while the NATS connection is up; a request that arrives while it
    /// is down is refused at once instead of waiting out a timeout.
    pub fn connected(&self) -> bool {
        crate::nats::connection::connected(&self.client)
    }

    /// Publishes `rows` of `tenant`/`table` in order, each to the unit
    /// `placement` gives it, and waits until all are stored. Each unit's
    /// rows are stored as a prefix (see the module); units are written
    /// concurrently. A row with a message id is stored once within the
    /// stream's duplicate window, however often it is sent. On error, the
    /// rows before the refused one may be stored; sending the request again
    /// with the same ids stores nothing twice and nothing out of order.
    pub async fn publish(
        &self,
        tenant: &str,
        table: &str,
        placement: &Placement,
        rows: impl IntoIterator<Item = (Bytes, Option<String>)>,
        ids: Ids,
        traceparent: Option<&str>,
    ) -> Result<Published, PublishError> {
        if !self.connected() {
            return Err(PublishError::Unavailable("not connected".into()));
        }
        // A request's rows go to one unit, or (routed by key) to a few.
        let mut units: Vec<UnitRows> = Vec::new();
        // One copy of the request's context, shared by its rows.
        let traceparent: Option<Arc<str>> = traceparent.map(Arc::from);
        for (index, (payload, message_id)) in rows.into_iter().enumerate() {
            let unit = placement
                .unit(index)
                .ok_or_else(|| PublishError::Other(format!("row {index} has no route")))?;
            let row = Row {
                index,
                payload,
                message_id,
                traceparent: traceparent.clone(),
            };
            match units.iter_mut().find(|u| u.unit == unit) {
                Some(unit_rows) => unit_rows.rows.push(row),
                None => units.push(UnitRows {
                    unit,
                    subject: self.router.subject(unit, tenant, table).into(),
                    rows: vec![row],
                }),
            }
        }
        // All or nothing: a batch that can never fit refuses the request
        // before its first row is sent.
        for unit_rows in &units {
            self.check_fits(unit_rows)?;
        }
        let mut published = Published::default();
        let stored =
            futures::future::join_all(units.iter().map(|u| self.publish_unit(u, ids))).await;
        for (unit_rows, result) in units.iter().zip(stored) {
            let stored = result?;
            published.stored += unit_rows.rows.len();
            published.duplicates += stored.duplicates;
            if stored.new_rows > 0 {
                let partition = unit_rows.unit.partition;
                match published
                    .accepts
                    .iter_mut()
                    .find(|a| a.partition == partition)
                {
                    Some(accept) => {
                        accept.last_seq = accept.last_seq.max(stored.last_seq);
                        accept.rows += stored.new_rows;
                        accept.bytes += stored.new_bytes;
                    }
                    None => published.accepts.push(Accept {
                        tenant: tenant.to_string(),
                        partition,
                        last_seq: stored.last_seq,
                        rows: stored.new_rows,
                        bytes: stored.new_bytes,
                    }),
                }
            }
        }
        Ok(published)
    }

    fn check_fits(&self, unit_rows: &UnitRows) -> Result<(), PublishError> {
        let Some(max_bytes) = self.partition_max_bytes else {
            return Ok(());
        };
        let max_rows = self.batches.max_rows.load(Ordering::Relaxed).max(1);
        for batch in unit_rows.rows.chunks(max_rows) {
            let bytes: u64 = batch
                .iter()
                .map(|row| row.payload.len() as u64 + unit_rows.subject.len() as u64 + ROW_OVERHEAD)
                .sum();
            if let ([first, ..], [.., last]) = (batch, batch)
                && bytes > max_bytes
            {
                return Err(PublishError::LargerThanPartition {
                    first: first.index,
                    last: last.index,
                    partition: unit_rows.unit.partition,
                    bytes,
                    max_bytes,
                });
            }
        }
        Ok(())
    }

    /// One unit's rows, batch after batch: the next is sent only once the
    /// one before it is stored.
    async fn publish_unit(
        &self,
        unit_rows: &UnitRows,
        ids: Ids,
    ) -> Result<UnitStored, PublishError> {
        let mut stored = UnitStored::default();
        if ids == Ids::Fresh && unit_rows.rows.len() > 1 {
            let last_seq = self
                .publish_fast(&unit_rows.subject, &unit_rows.rows)
                .await?;
            stored.add_new(&unit_rows.rows, last_seq);
            return Ok(stored);
        }
        if ids == Ids::Retry {
            self.publish_partly_stored(unit_rows, &unit_rows.rows, &mut stored)
                .await?;
            return Ok(stored);
        }
        let mut rest = unit_rows.rows.as_slice();
        while !rest.is_empty() {
            let take = rest
                .len()
                .min(self.batches.max_rows.load(Ordering::Relaxed));
            let (batch, after) = rest.split_at(take);
            if batch.len() == 1 {
                self.publish_in_turn(&unit_rows.subject, batch, &mut stored)
                    .await?;
            } else {
                match self.publish_batch(unit_rows, batch).await? {
                    BatchOutcome::Stored(ack) => stored.add_new(batch, ack.sequence),
                    // Some rows are stored already (a retry): the rest goes
                    // as one fast batch, which skips them.
                    BatchOutcome::HoldsDuplicates => {
                        self.publish_partly_stored(unit_rows, rest, &mut stored)
                            .await?;
                        return Ok(stored);
                    }
                    BatchOutcome::Smaller(limit) => {
                        tracing::warn!(limit, "the NATS server takes smaller atomic batches");
                        self.batches.max_rows.store(limit.max(1), Ordering::Relaxed);
                        continue;
                    }
                }
            }
            rest = after;
        }
        Ok(stored)
    }

    /// Rows of which some are stored already. A fast batch stores the
    /// others in order, as a prefix if one is refused, and skips the stored
    /// ones without saying which; so the stream's last sequence is read
    /// first, and once the batch is stored every row is sent again, many in
    /// flight: each is a duplicate now, and its ack names the sequence it is
    /// stored at, at or below that mark if it was stored before. Sent again
    /// before the batch, a row not stored yet would be stored out of turn
    /// if one before it failed; after it, none is left to store.
    async fn publish_partly_stored(
        &self,
        unit_rows: &UnitRows,
        rows: &[Row],
        stored: &mut UnitStored,
    ) -> Result<(), PublishError> {
        let subject = &unit_rows.subject;
        if rows.len() < 2 {
            return self.publish_in_turn(subject, rows, stored).await;
        }
        let stream = self.router.partition_stream(unit_rows.unit.partition);
        let before = self
            .js
            .get_stream(&stream)
            .await
            .map_err(|err| PublishError::Unavailable(format!("stream {stream}: {err}")))?
            .cached_info()
            .state
            .last_sequence;
        let last_seq = self.publish_fast(subject, rows).await?;
        if last_seq <= before {
            // Nothing new: a row without an id, or not stored yet, would be.
            stored.duplicates += rows.len();
            return Ok(());
        }
        // Rows with the same id twice in a request: the first is stored.
        let mut seen = std::collections::HashSet::new();
        let mut classify_ack = |row: &Row, ack: Option<PublishAck>| {
            let (new, sequence) = match ack {
                Some(ack) if ack.duplicate => (
                    ack.sequence > before && seen.insert(ack.sequence),
                    ack.sequence,
                ),
                // Its id left the duplicate window just now: stored again.
                Some(ack) => (true, ack.sequence),
                // No id, so never a duplicate: the batch stored it.
                None => (true, last_seq),
            };
            if new {
                stored.add_new(std::slice::from_ref(row), sequence);
            } else {
                stored.duplicates += 1;
            }
        };
        let mut in_flight = std::collections::VecDeque::new();
        for row in rows {
            if row.message_id.is_none() {
                classify_ack(row, None);
                continue;
            }
            let ack = self
                .js
                .send_publish(subject.clone(), single_message(row))
                .await
                .map_err(|err| classify(&err, row.index))?;
            in_flight.push_back((row, ack));
            if in_flight.len() >= LOOKUPS_IN_FLIGHT
                && let Some((row, ack)) = in_flight.pop_front()
            {
                let ack = ack.await.map_err(|err| classify(&err, row.index))?;
                classify_ack(row, Some(ack));
            }
        }
        while let Some((row, ack)) = in_flight.pop_front() {
            let ack = ack.await.map_err(|err| classify(&err, row.index))?;
            classify_ack(row, Some(ack));
        }
        Ok(())
    }

    /// Rows one at a time, each waiting for the one before it to be stored:
    /// a single publish is atomic already.
    async fn publish_in_turn(
        &self,
        subject: &async_nats::Subject,
        rows: &[Row],
        stored: &mut UnitStored,
    ) -> Result<(), PublishError> {
        for row in rows {
            let ack = self
                .js
                .send_publish(subject.clone(), single_message(row))
                .await
                .map_err(|err| classify(&err, row.index))?
                .await
                .map_err(|err| classify(&err, row.index))?;
            if ack.duplicate {
                stored.duplicates += 1;
            } else {
                stored.add_new(std::slice::from_ref(row), ack.sequence);
            }
        }
        Ok(())
    }

    /// An atomic batch: every row but the last is sent without a reply
    /// (the server stages it), the last commits, and its ack or error
    /// speaks for all of them.
    async fn publish_batch(
        &self,
        unit_rows: &UnitRows,
        batch: &[Row],
    ) -> Result<BatchOutcome, PublishError> {
        let Some(last) = batch.last() else {
            return Err(PublishError::Other("an empty batch".into()));
        };
        let open = self
            .batches
            .open
            .get(unit_rows.unit.partition as usize)
            .ok_or_else(|| PublishError::Other("a partition past the topology".into()))?;
        let _open = open
            .acquire()
            .await
            .map_err(|err| PublishError::Other(err.to_string()))?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let id = format!(
                "{}-{}",
                self.batches.id_prefix,
                self.batches.next_id.fetch_add(1, Ordering::Relaxed)
            );
            for (sequence, row) in batch[..batch.len() - 1].iter().enumerate() {
                let headers = batch_headers(&id, sequence + 1, row);
                self.client
                    .publish_with_headers(unit_rows.subject.clone(), headers, row.payload.clone())
                    .await
                    .map_err(|err| PublishError::Unavailable(err.to_string()))?;
            }
            let mut commit = batch_headers(&id, batch.len(), last);
            commit.insert(NATS_BATCH_COMMIT, "1");
            let message = PublishMessage::build()
                .payload(last.payload.clone())
                .headers(commit);
            let result = match self
                .js
                .send_publish(unit_rows.subject.clone(), message)
                .await
            {
                Ok(ack) => ack.await,
                Err(err) => Err(err),
            };
            let err = match result {
                Ok(ack) => return Ok(BatchOutcome::Stored(ack)),
                Err(err) => err,
            };
            match server_code(&err) {
                Some(ErrorCode::ATOMIC_PUBLISH_CONTAINS_DUPLICATE_MESSAGE) => {
                    return Ok(BatchOutcome::HoldsDuplicates);
                }
                Some(ErrorCode::ATOMIC_PUBLISH_TOO_LARGE_BATCH) => {
                    if let Some(limit) = batch_limit(&err.to_string())
                        && limit < batch.len()
                    {
                        return Ok(BatchOutcome::Smaller(limit));
                    }
                    return Err(PublishError::Other(err.to_string()));
                }
                // Nothing of the batch was stored: too many batches were
                // open on the stream, or its leader changed mid-batch.
                Some(
                    ErrorCode::ATOMIC_PUBLISH_INCOMPLETE_BATCH
                    | ErrorCode::ATOMIC_PUBLISH_TOO_MANY_INFLIGHT,
                ) if attempt < BATCH_ATTEMPTS => {
                    tokio::time::sleep(BATCH_BACKOFF * attempt).await;
                }
                Some(ErrorCode::ATOMIC_PUBLISH_DISABLED) => {
                    return Err(PublishError::Other(format!(
                        "stream {} does not allow atomic publish (`allow_atomic`): run `weir mq apply` (nats-server 2.12 or newer)",
                        self.router.partition_stream(unit_rows.unit.partition)
                    )));
                }
                _ => return Err(classify(&err, last.index)),
            }
        }
    }
}

/// A bad line on its way to the dead-letter stream.
#[derive(Debug, Clone)]
pub struct BadRow {
    /// Its number in the request (line, or position in an array).
    pub line: usize,
    /// Why it was not stored, naming its line.
    pub reason: String,
    pub payload: Bytes,
    /// Makes a retried request's letter stored once.
    pub message_id: Option<String>,
}

/// Letters written at once.
const LETTERS_IN_FLIGHT: usize = 256;

async fn store_letter(
    js: jetstream::Context,
    subject: async_nats::Subject,
    line: usize,
    message: PublishMessage,
) -> Result<(), PublishError> {
    let failed = |err: String| {
        PublishError::Unavailable(format!(
            "cannot store the dead letter of line {line}: {err}"
        ))
    };
    js.send_publish(subject, message)
        .await
        .map_err(|err| failed(err.to_string()))?
        .await
        .map_err(|err| failed(err.to_string()))?;
    Ok(())
}

impl Publisher {
    /// Writes each bad line to the dead-letter stream (tenant, table,
    /// reason and line number in its headers, the line as sent as its
    /// payload, `redact`'s fields replaced) and waits until all are stored.
    pub async fn publish_letters(
        &self,
        tenant: &str,
        table: &str,
        rows: &[BadRow],
        redact: &[String],
    ) -> Result<(), PublishError> {
        use crate::topology::route::letter_headers as names;
        if !self.connected() {
            return Err(PublishError::Unavailable("not connected".into()));
        }
        let subject = async_nats::Subject::from(self.router.dead_letter_subject(tenant, table));
        // Owned messages and futures: a stream of futures borrowing the rows
        // would not be `Send` for every lifetime (rustc's higher-ranked
        // limitation), and the front door's handler must be.
        let messages: Vec<(usize, PublishMessage)> = rows
            .iter()
            .map(|row| {
                let mut headers = HeaderMap::new();
                headers.insert(names::TENANT, tenant);
                headers.insert(names::TABLE, table);
                headers.insert(names::REASON, names::header_safe(&row.reason).as_str());
                headers.insert(names::LINE, row.line.to_string().as_str());
                let mut message = PublishMessage::build()
                    .payload(names::redacted(&row.payload, redact))
                    .headers(headers);
                if let Some(id) = &row.message_id {
                    message = message.message_id(id);
                }
                (row.line, message)
            })
            .collect();
        let sends = messages.into_iter().map(|(line, message)| {
            let (js, subject) = (self.js.clone(), subject.clone());
            async move { store_letter(js, subject, line, message).await }
        });
        let mut stored = futures::stream::iter(sends).buffer_unordered(LETTERS_IN_FLIGHT);
        while let Some(result) = stored.next().await {
            result?;
        }
        Ok(())
    }
}

impl Publisher {
    /// A fast batch of all the unit's rows: stored as they arrive, each row
    /// sent with a reply subject that names the batch, its sequence and
    /// step. The server acks every few rows, reports the first refused one,
    /// and ends the batch there, so what it stored is a prefix. Returns the
    /// stream sequence of the last row.
    async fn publish_fast(
        &self,
        subject: &async_nats::Subject,
        rows: &[Row],
    ) -> Result<u64, PublishError> {
        let replies = self.fast_replies().await?;
        let id = format!(
            "{}x{}",
            self.batches.id_prefix,
            self.batches.next_id.fetch_add(1, Ordering::Relaxed)
        );
        let (mut waiting, mut inbox) = replies.register(&id);
        let total = rows.len() as u64;
        let mut progress = FastProgress::default();
        for (row, sequence) in rows.iter().zip(1u64..) {
            while sequence > progress.acked + FAST_WINDOW && progress.end.is_none() {
                progress.read(&mut inbox).await?;
            }
            if progress.end.is_some() {
                // Refused already: the server would drop the rest anyway.
                break;
            }
            let step = match sequence {
                1 => 0,
                s if s == total => 2,
                _ => 1,
            };
            let reply = format!(
                "{}.{id}.{FAST_FLOW}.fail.{sequence}.{step}.$FI",
                replies.prefix
            );
            let mut headers = HeaderMap::new();
            if let Some(message_id) = &row.message_id {
                headers.insert(NATS_MESSAGE_ID, message_id.as_str());
            }
            if let Some(traceparent) = &row.traceparent {
                headers.insert(TRACEPARENT, &**traceparent);
            }
            self.client
                .publish_with_reply_and_headers(
                    subject.clone(),
                    reply,
                    headers,
                    row.payload.clone(),
                )
                .await
                .map_err(|err| PublishError::Unavailable(err.to_string()))?;
        }
        while progress.end.is_none() {
            progress.read(&mut inbox).await?;
        }
        waiting.done();
        let end = progress.end.unwrap_or_default();
        let stored = end.count.unwrap_or(0);
        if end.error.is_none() && stored == total {
            return Ok(end.seq);
        }
        // Rows 1..=stored are in the stream, in order; the row after them
        // was refused, and why is in its error.
        let reason = end
            .error
            .map(|err| err.to_string())
            .or(progress.refused)
            .unwrap_or_else(|| format!("the stream stored {stored} of {total} rows"));
        Err(classify_reason(&reason))
    }

    /// The reply subscription, made on first use and again if it ended.
    async fn fast_replies(&self) -> Result<Arc<FastReplies>, PublishError> {
        let mut current = self.batches.fast_replies.lock().await;
        if let Some(replies) = current.as_ref()
            && replies.routing.load(Ordering::Relaxed)
        {
            return Ok(replies.clone());
        }
        let replies = FastReplies::subscribe(&self.client).await?;
        *current = Some(replies.clone());
        Ok(replies)
    }
}

/// Replies to this host's fast batches: one subscription for all of them,
/// handed to each batch by the id in the reply subject.
struct FastReplies {
    prefix: String,
    waiting: Mutex<HashMap<String, mpsc::UnboundedSender<async_nats::Message>>>,
    /// False once the subscription ended (the client closed it).
    routing: AtomicBool,
}

impl FastReplies {
    async fn subscribe(client: &async_nats::Client) -> Result<Arc<FastReplies>, PublishError> {
        let prefix = client.new_inbox();
        let mut subscription = client
            .subscribe(format!("{prefix}.>"))
            .await
            .map_err(|err| PublishError::Unavailable(err.to_string()))?;
        let replies = Arc::new(FastReplies {
            prefix,
            waiting: Mutex::new(HashMap::new()),
            routing: AtomicBool::new(true),
        });
        let routed = replies.clone();
        tokio::spawn(async move {
            let skip = routed.prefix.len() + 1;
            while let Some(message) = subscription.next().await {
                let Some(id) = message
                    .subject
                    .get(skip..)
                    .and_then(|s| s.split('.').next())
                else {
                    continue;
                };
                let waiting = routed.waiting.lock().unwrap_or_else(|e| e.into_inner());
                // A batch that has its answer no longer listens.
                if let Some(batch) = waiting.get(id) {
                    let _ = batch.send(message);
                }
            }
            routed.routing.store(false, Ordering::Relaxed);
            // Batches still waiting hear that their replies will not come.
            routed
                .waiting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
        });
        Ok(replies)
    }

    fn register(&self, id: &str) -> (Waiting<'_>, mpsc::UnboundedReceiver<async_nats::Message>) {
        let (sender, inbox) = mpsc::unbounded_channel();
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), sender);
        (
            Waiting {
                replies: self,
                id: id.to_string(),
            },
            inbox,
        )
    }
}

/// A batch's place in the reply table, given up when it is dropped.
struct Waiting<'a> {
    replies: &'a FastReplies,
    id: String,
}

impl Waiting<'_> {
    fn done(&mut self) {
        self.replies
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.done();
    }
}

/// One reply to a fast batch: a flow ack (`type` "ack"), a refused row
/// ("err"), a lost row ("gap"), or the end: the batch's PubAck, or an error
/// for the whole batch.
#[derive(Debug, Default, Deserialize)]
struct FastReply {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    seq: u64,
    /// Rows of the batch stored, in the PubAck.
    count: Option<u64>,
    error: Option<jetstream::Error>,
    #[serde(rename = "last_seq")]
    expected: Option<u64>,
}

#[derive(Default)]
struct FastProgress {
    acked: u64,
    refused: Option<String>,
    end: Option<FastReply>,
}

impl FastProgress {
    async fn read(
        &mut self,
        inbox: &mut mpsc::UnboundedReceiver<async_nats::Message>,
    ) -> Result<(), PublishError> {
        let message = match tokio::time::timeout(REPLY_TIMEOUT, inbox.recv()).await {
            Ok(Some(message)) => message,
            Ok(None) => {
                return Err(PublishError::Unavailable(
                    "the reply subscription ended".into(),
                ));
            }
            Err(_) => {
                return Err(PublishError::Unavailable(format!(
                    "the stream did not answer a batch within {REPLY_TIMEOUT:?}"
                )));
            }
        };
        // No stream took the row (one is electing a leader, or is gone).
        if message.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            return Err(PublishError::Unavailable(
                "no stream found for the partition".into(),
            ));
        }
        let reply: FastReply = serde_json::from_slice(&message.payload)
            .map_err(|err| PublishError::Other(format!("an unreadable batch reply: {err}")))?;
        match reply.kind.as_deref() {
            Some("ack") => self.acked = self.acked.max(reply.seq),
            Some("err") => {
                if self.refused.is_none() {
                    self.refused = reply.error.map(|err| err.to_string());
                }
            }
            Some("gap") => {
                if self.refused.is_none() {
                    self.refused = Some(format!(
                        "rows {}..{} of a batch were lost on the way",
                        reply.expected.unwrap_or_default(),
                        reply.seq
                    ));
                }
            }
            _ => self.end = Some(reply),
        }
        Ok(())
    }
}

/// A row on its way, with its place in the request (for error messages).
struct Row {
    index: usize,
    payload: Bytes,
    message_id: Option<String>,
    /// The traced request's context (`[traces]`).
    traceparent: Option<Arc<str>>,
}

/// A request's rows for one unit, in request order.
struct UnitRows {
    unit: Unit,
    subject: async_nats::Subject,
    rows: Vec<Row>,
}

/// What one unit's publish stored.
#[derive(Default)]
struct UnitStored {
    new_rows: u64,
    new_bytes: u64,
    duplicates: usize,
    last_seq: u64,
}

impl UnitStored {
    fn add_new(&mut self, rows: &[Row], last_seq: u64) {
        self.new_rows += rows.len() as u64;
        self.new_bytes += rows.iter().map(|r| r.payload.len() as u64).sum::<u64>();
        self.last_seq = self.last_seq.max(last_seq);
    }
}

enum BatchOutcome {
    /// Every row is stored; the ack is the last row's.
    Stored(PublishAck),
    /// Nothing was stored: some row's message id is stored already.
    HoldsDuplicates,
    /// Nothing was stored: the server takes at most this many rows a batch.
    Smaller(usize),
}

/// A row as a single publish.
fn single_message(row: &Row) -> PublishMessage {
    let mut message = PublishMessage::build().payload(row.payload.clone());
    if let Some(id) = &row.message_id {
        message = message.message_id(id);
    }
    if let Some(traceparent) = &row.traceparent {
        message = message.header(TRACEPARENT, &**traceparent);
    }
    message
}

fn batch_headers(id: &str, sequence: usize, row: &Row) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(NATS_BATCH_ID, id);
    headers.insert(NATS_BATCH_SEQUENCE, sequence.to_string().as_str());
    if let Some(message_id) = &row.message_id {
        headers.insert(NATS_MESSAGE_ID, message_id.as_str());
    }
    if let Some(traceparent) = &row.traceparent {
        headers.insert(TRACEPARENT, &**traceparent);
    }
    headers
}

/// What one publish call stored.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Published {
    /// Rows JetStream acknowledged (new or already stored).
    pub stored: usize,
    /// Of those, rows it already had under the same message id.
    pub duplicates: usize,
    /// The new rows, by partition, with their highest stream sequence: what
    /// fleet-wide usage counts until a snapshot covers them.
    pub accepts: Vec<Accept>,
}

/// The JetStream error code behind a refused publish, if the server sent one.
fn server_code(err: &jetstream::context::PublishError) -> Option<ErrorCode> {
    std::error::Error::source(err)
        .and_then(|source| source.downcast_ref::<jetstream::Error>())
        .map(jetstream::Error::error_code)
}

/// The size in "atomic publish batch is too large: 100 (code 400, …)".
fn batch_limit(message: &str) -> Option<usize> {
    let (_, after) = message.split_once("too large: ")?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn classify(err: &jetstream::context::PublishError, index: usize) -> PublishError {
    let message = err.to_string();
    match err.kind() {
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::StreamNotFound
        | PublishErrorKind::MaxAckPending => PublishError::Unavailable(message),
        PublishErrorKind::MaxPayloadExceeded => PublishError::TooLarge { index },
        _ => classify_reason(&message),
    }
}

/// A refusal the server explained in words.
fn classify_reason(message: &str) -> PublishError {
    if message.contains("maximum") || message.contains("resource limits") {
        PublishError::StreamFull(message.to_string())
    } else if message.contains("no responders") || message.contains("not leader") {
        PublishError::Unavailable(message.to_string())
    } else {
        PublishError::Other(message.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::batch_limit;

    #[test]
    fn reads_the_servers_batch_limit_from_its_error() {
        assert_eq!(
            batch_limit("atomic publish batch is too large: 100 (code 400, error code 10199)"),
            Some(100)
        );
        assert_eq!(batch_limit("maximum bytes exceeded"), None);
    }
}
