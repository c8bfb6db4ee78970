//! Pulling one unit's rows.
//!
//! Each claim creates the unit's consumer afresh (`coordination::takeover`),
//! which ends every request a previous puller left: the server serves one
//! puller per unit at a time. A [`Puller`] keeps at most one pull request
//! outstanding on one inbox. A planned handover returns the rows already
//! here for the caller to finish ([`Puller::release`]); rows still on their
//! way are not acked, and come back to the next owner, oldest first, when
//! its claim creates the consumer again.

use std::collections::VecDeque;
use std::time::Duration;

use async_nats::jetstream::AckKind;

use async_nats::Message;
use async_nats::jetstream;
use async_nats::{Client, StatusCode, Subscriber};
use futures::{FutureExt, StreamExt};
use serde::Serialize;
use tokio::time::Instant;

use crate::config::DeliveryConfig;
use crate::fence::Fence;

/// How long the server keeps one pull request waiting for rows while rows
/// come.
pub const PULL_EXPIRES: Duration = Duration::from_secs(5);
/// Idle heartbeat of a waiting pull request.
const PULL_HEARTBEAT: Duration = Duration::from_secs(2);
/// How long a request waits when the unit is idle: the last request
/// brought no row, or none came yet. An idle unit thus costs one request
/// per 12 s, not one per second.
pub const IDLE_PULL_EXPIRES: Duration = Duration::from_secs(12);
/// Idle heartbeat of such a request: a request lost (a server restart, a
/// reconnect) shows as silence within two of them.
const IDLE_PULL_HEARTBEAT: Duration = Duration::from_secs(4);
/// A request the server has not ended this long after its expiry was lost
/// (a server restart, a reconnect): pull again.
const LOST_REQUEST_GRACE: Duration = Duration::from_secs(2);
/// An idle request with neither row nor heartbeat for this long was lost.
const IDLE_SILENCE_LIMIT: Duration = Duration::from_secs(9);
/// Pause before pulling again after the server refused a request.
const REFUSED_PAUSE: Duration = Duration::from_millis(250);
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("consumer {consumer}: cannot subscribe to its inbox: {source}")]
    Subscribe {
        consumer: String,
        source: async_nats::SubscribeError,
    },
}

/// The body of a `CONSUMER.MSG.NEXT` request.
#[derive(Serialize)]
struct PullRequest {
    batch: usize,
    #[serde(with = "serde_nanos_u64")]
    expires: Duration,
    #[serde(with = "serde_nanos_u64")]
    idle_heartbeat: Duration,
}

mod serde_nanos_u64 {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// The request in flight: how many rows it may still bring, and when it is
/// given up for lost.
struct Outstanding {
    remaining: usize,
    lost_after: Instant,
    /// An idle request: its heartbeats say it is alive, so silence, not
    /// its long expiry, says it was lost.
    idle: bool,
    /// Whether it brought a row.
    brought: bool,
}

/// How much one pull request asks for: up to `max_rows` rows, but no more
/// than about `bytes` of them at the rows' mean size so far, and at least
/// `min_rows` (a batch). Large rows thus get a batch per request, as before
/// requests grew, and small rows a larger request.
#[derive(Debug, Clone, Copy)]
pub struct PullSize {
    pub min_rows: usize,
    pub max_rows: usize,
    pub bytes: usize,
}

impl PullSize {
    /// The rows to ask for, given the mean row size seen (0: none seen yet).
    pub fn rows_for(&self, mean_row_bytes: f64) -> usize {
        let min = self.min_rows.max(1);
        let max = self.max_rows.max(min);
        if mean_row_bytes <= 0.0 {
            return min;
        }
        let by_bytes = (self.bytes as f64 / mean_row_bytes) as usize;
        by_bytes.clamp(min, max)
    }
}

/// Weight of the newest row in the running mean of row sizes.
const MEAN_WEIGHT: f64 = 0.01;

/// Pulls one unit consumer, one request at a time.
pub struct Puller {
    client: Client,
    stream: String,
    consumer: String,
    inbox: async_nats::Subject,
    subscriber: Subscriber,
    size: PullSize,
    /// Running mean of the payload sizes received, 0 until the first row.
    mean_row_bytes: f64,
    outstanding: Option<Outstanding>,
    /// Rows received while a batch ran ([`Puller::keep_received_alive`]),
    /// handed out before any newer one.
    received: VecDeque<Message>,
    /// When rows received were last kept alive.
    kept_alive: Instant,
    /// No request is sent once it no longer holds: a request from a host
    /// past its lease would be served rows of the unit's next owner.
    lease: Box<dyn Fence>,
    /// The last request ended without a row: the next one waits long.
    idle: bool,
    /// Rows settled before the unit was taken (`coordination::takeover`):
    /// acked again if they come, not handed out.
    settled: SettledThrough,
    /// Such rows received, until their ack is sent: kept here, not in a
    /// future, so a call cancelled meanwhile loses none.
    settled_again: Vec<Message>,
    /// The server refused the last request: pause before the next one.
    refused: bool,
}

/// Rows at or below a stream sequence, settled before the unit was taken.
/// A fresh consumer hands rows out oldest first, so the first newer row
/// ends the check (and its cost on every later row).
#[derive(Debug, Clone, Copy)]
struct SettledThrough(u64);

impl SettledThrough {
    fn active(self) -> bool {
        self.0 > 0
    }

    /// Whether the row at stream sequence `sequence` was settled already.
    fn covers(&mut self, sequence: u64) -> bool {
        if sequence <= self.0 {
            return true;
        }
        self.0 = 0;
        false
    }
}

impl Puller {
    /// Subscribes the inbox; no request is sent before [`Puller::next_until`].
    pub async fn open(
        js: jetstream::Context,
        stream: String,
        consumer: String,
        size: PullSize,
        lease: Box<dyn Fence>,
        settled_through: u64,
    ) -> Result<Puller, PullError> {
        let client = js.client();
        let inbox = async_nats::Subject::from(client.new_inbox());
        let subscriber =
            client
                .subscribe(inbox.clone())
                .await
                .map_err(|source| PullError::Subscribe {
                    consumer: consumer.clone(),
                    source,
                })?;
        Ok(Puller {
            client,
            stream,
            consumer,
            inbox,
            subscriber,
            size,
            mean_row_bytes: 0.0,
            outstanding: None,
            received: VecDeque::new(),
            kept_alive: Instant::now(),
            lease,
            idle: false,
            settled: SettledThrough(settled_through),
            settled_again: Vec::new(),
            refused: false,
        })
    }

    /// The next row if one arrives before `deadline` (`None`: whenever; a
    /// deadline passed: only a row already here).
    /// Cancel-safe: a request is either not sent or sent and recorded
    /// (sending to the client's queue is the only await before recording),
    /// and a message taken from the inbox is handled before the next await
    /// (a pause after a refusal is only shortened).
    pub async fn next_until(&mut self, deadline: Option<Instant>) -> Option<Message> {
        if let Some(row) = self.received.pop_front() {
            return Some(row);
        }
        loop {
            self.ack_settled_again().await;
            if self.outstanding.is_none() {
                self.pause_if_refused().await;
                self.request().await;
            }
            // No timer for "only what is here": tokio rounds a deadline up
            // to its next millisecond, so a batch meant to close when no row
            // waits would wait for rows up to a millisecond (measured: a
            // request's 100 rows trickling in made one 1.2 ms batch).
            if deadline.is_some_and(|d| d <= Instant::now()) {
                match self.subscriber.next().now_or_never() {
                    Some(Some(message)) => match self.receive(message) {
                        Some(row) => return Some(row),
                        None => continue,
                    },
                    Some(None) | None => return None,
                }
            }
            let lost_after = self
                .outstanding
                .as_ref()
                .map_or_else(|| Instant::now() + REFUSED_PAUSE, |o| o.lost_after);
            let until = deadline.map_or(lost_after, |d| d.min(lost_after));
            match tokio::time::timeout_at(until, self.subscriber.next()).await {
                Ok(Some(message)) => {
                    if let Some(row) = self.receive(message) {
                        return Some(row);
                    }
                }
                // The subscription ends only when the client is closed.
                Ok(None) => tokio::time::sleep(REFUSED_PAUSE).await,
                Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => return None,
                Err(_) => {
                    tracing::debug!(consumer = %self.consumer, "pull request lost; pulling again");
                    self.outstanding = None;
                }
            }
        }
    }

    /// Gives the unit up: returns the rows already here, in order, for the
    /// caller to finish, and drops the inbox's interest (the server ends a
    /// request whose reply subject has none). Rows still on their way are
    /// never acked here: the next owner's claim creates the consumer
    /// afresh, and they come back to it ahead of newer ones.
    pub async fn release(mut self) -> Vec<Message> {
        let mut rows: Vec<Message> = self.received.drain(..).collect();
        while let Some(Some(message)) = self.subscriber.next().now_or_never() {
            rows.extend(self.receive(message));
        }
        self.ack_settled_again().await;
        if let Err(err) = self.subscriber.unsubscribe().await {
            tracing::debug!(consumer = %self.consumer, error = %err, "cannot unsubscribe the inbox");
        }
        tracing::debug!(consumer = %self.consumer, rows = rows.len(), "unit released");
        rows
    }

    /// A request asks for more rows than a batch takes, so the server sends
    /// the next batches' rows while one runs. Their ack wait runs too: this
    /// takes in what has arrived and tells the server every such row is
    /// still being worked on. Called as a running batch is kept alive.
    pub async fn keep_received_alive(&mut self) {
        while let Some(Some(message)) = self.subscriber.next().now_or_never() {
            if let Some(row) = self.receive(message) {
                self.received.push_back(row);
            }
        }
        self.ack_settled_again().await;
        for row in &self.received {
            if let Err(err) = crate::nats::ack::reply(&self.client, row, AckKind::Progress).await {
                tracing::debug!(error = %err, "cannot extend a received row's ack wait");
            }
        }
        self.kept_alive = Instant::now();
    }

    /// Keeps received rows alive unless that was done within `period`.
    /// Called as each batch starts, so rows that wait through several short
    /// batches (none long enough for a tick of its own) are answered too.
    pub async fn keep_received_alive_within(&mut self, period: Duration) {
        if self.kept_alive.elapsed() >= period {
            self.keep_received_alive().await;
        }
    }

    /// Sends one pull request and records it as outstanding.
    async fn request(&mut self) {
        if !self.lease.held() {
            tokio::time::sleep(REFUSED_PAUSE).await;
            return;
        }
        let batch = self.size.rows_for(self.mean_row_bytes);
        // No row yet, or the last request brought none: wait long.
        let idle = self.idle || self.mean_row_bytes == 0.0;
        let (expires, idle_heartbeat) = match idle {
            true => (IDLE_PULL_EXPIRES, IDLE_PULL_HEARTBEAT),
            false => (PULL_EXPIRES, PULL_HEARTBEAT),
        };
        let body = PullRequest {
            batch,
            expires,
            idle_heartbeat,
        };
        let Ok(body) = serde_json::to_vec(&body) else {
            return;
        };
        let subject = format!(
            "$JS.API.CONSUMER.MSG.NEXT.{}.{}",
            self.stream, self.consumer
        );
        match self
            .client
            .publish_with_reply(subject, self.inbox.clone(), body.into())
            .await
        {
            Ok(()) => {
                tracing::trace!(consumer = %self.consumer, batch, "pull request sent");
                let lost_after = if idle {
                    IDLE_SILENCE_LIMIT
                } else {
                    expires + LOST_REQUEST_GRACE
                };
                self.outstanding = Some(Outstanding {
                    remaining: batch,
                    lost_after: Instant::now() + lost_after,
                    idle,
                    brought: false,
                })
            }
            Err(err) => {
                tracing::warn!(consumer = %self.consumer, error = %err, "cannot send a pull request");
                tokio::time::sleep(REFUSED_PAUSE).await;
            }
        }
    }

    /// The row, unless it was settled before the unit was taken: then it is
    /// kept to be acked again (which removes it, if the stream has not yet)
    /// and not handed out.
    fn unless_settled(&mut self, row: Message) -> Option<Message> {
        let sequence = crate::nats::ack::info(&row).map_or(u64::MAX, |info| info.stream_sequence);
        if !self.settled.covers(sequence) {
            return Some(row);
        }
        tracing::debug!(consumer = %self.consumer, sequence, "a row settled before the takeover came again; acked, not run");
        self.settled_again.push(row);
        None
    }

    /// Acks the rows settled before the takeover that came again, each
    /// dropped only once its ack is sent.
    async fn ack_settled_again(&mut self) {
        while let Some(row) = self.settled_again.last() {
            if let Err(err) = crate::nats::ack::reply(&self.client, row, AckKind::Ack).await {
                tracing::debug!(error = %err, "cannot ack a row settled before the takeover");
            }
            self.settled_again.pop();
        }
    }

    /// After a request the server refused, a pause before the next.
    async fn pause_if_refused(&mut self) {
        if std::mem::take(&mut self.refused) {
            tokio::time::sleep(REFUSED_PAUSE).await;
        }
    }

    /// A row, or `None` for a status the server sent about the request.
    /// Never awaits, so a message taken from the inbox is never lost to a
    /// cancelled call.
    fn receive(&mut self, message: Message) -> Option<Message> {
        match message.status {
            None | Some(StatusCode::OK) => {
                self.mean_row_bytes = if self.mean_row_bytes == 0.0 {
                    message.payload.len() as f64
                } else {
                    self.mean_row_bytes * (1.0 - MEAN_WEIGHT)
                        + message.payload.len() as f64 * MEAN_WEIGHT
                };
                self.idle = false;
                if let Some(outstanding) = &mut self.outstanding {
                    outstanding.brought = true;
                    // Rows come: it is not lost, and ends at its expiry
                    // (no later than the heartbeat bound would).
                    outstanding.remaining = outstanding.remaining.saturating_sub(1);
                    if outstanding.idle {
                        outstanding.lost_after = Instant::now() + IDLE_SILENCE_LIMIT;
                    }
                    if outstanding.remaining == 0 {
                        self.outstanding = None;
                    }
                }
                if self.settled.active() {
                    return self.unless_settled(message);
                }
                Some(message)
            }
            Some(StatusCode::IDLE_HEARTBEAT) => {
                if let Some(outstanding) = &mut self.outstanding
                    && outstanding.idle
                {
                    outstanding.lost_after = Instant::now() + IDLE_SILENCE_LIMIT;
                }
                None
            }
            Some(StatusCode::TIMEOUT) | Some(StatusCode::NOT_FOUND) => {
                // Expired with nothing to bring: the unit is idle.
                if let Some(outstanding) = self.outstanding.take() {
                    self.idle = !outstanding.brought;
                }
                None
            }
            Some(status) => {
                tracing::debug!(consumer = %self.consumer, %status, description = ?message.description, "pull request ended");
                self.outstanding = None;
                self.refused = true;
                None
            }
        }
    }
}

/// A unit's pull requests, sized for its batches.
pub(super) fn pull_size(settings: &DeliveryConfig) -> PullSize {
    PullSize {
        min_rows: settings.batch_rows,
        max_rows: settings.pull_rows,
        // As many bytes as the batches the largest request makes.
        bytes: settings
            .batch_bytes
            .saturating_mul(settings.pull_rows.div_ceil(settings.batch_rows)),
    }
}

/// Adds rows to a batch until it is full, `batch_wait` has passed, or no
/// row came for `batch_idle` (zero: none is waiting). `batch` is empty.
pub(super) async fn fill_batch(
    settings: &DeliveryConfig,
    first: Message,
    puller: &mut Puller,
    lease: &dyn Fence,
    batch: &mut Vec<Message>,
) {
    let mut bytes = first.payload.len();
    batch.push(first);
    let deadline = Instant::now() + settings.batch_wait;
    // Only an idle gap shorter than the wait can close a batch first;
    // with a gap of the whole wait no clock is read per row.
    let closes_when_idle = settings.batch_idle < settings.batch_wait;
    // Past the lease, no further pull request (see `UnitWorker::run`).
    while batch.len() < settings.batch_rows && bytes < settings.batch_bytes && lease.held() {
        // A batch at low load goes when its rows stop coming, not after the
        // whole wait: that wait was most of a row's way to its sink.
        let until = if closes_when_idle {
            deadline.min(Instant::now() + settings.batch_idle)
        } else {
            deadline
        };
        match puller.next_until(Some(until)).await {
            Some(message) => {
                bytes += message.payload.len();
                batch.push(message);
            }
            // Out of tokio's cooperative budget a waiting row looks absent,
            // which would close a batch at ~128 rows under load: yield (the
            // thread's other tasks run, the budget is renewed) and look again.
            None if !tokio::task::coop::has_budget_remaining() && Instant::now() < deadline => {
                tokio::task::yield_now().await;
            }
            None => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_settled_before_the_take_are_dropped_until_the_first_newer_one() {
        let mut settled = SettledThrough(4);
        assert!(settled.active());
        assert!((1..=4).all(|sequence| settled.covers(sequence)));
        assert!(!settled.covers(5));
        assert!(!settled.active(), "the first newer row ends the check");
        assert!(!settled.covers(3));
        assert!(!SettledThrough(0).active());
    }

    #[test]
    fn a_request_holds_many_small_rows_but_only_a_batch_of_large_ones() {
        let size = PullSize {
            min_rows: 256,
            max_rows: 1000,
            bytes: 4 << 20,
        };
        assert_eq!(size.rows_for(0.0), 256, "no row seen yet: one batch");
        assert_eq!(size.rows_for(256.0), 1000);
        assert_eq!(size.rows_for(8192.0), 512);
        assert_eq!(size.rows_for(1_000_000.0), 256);
    }
}
