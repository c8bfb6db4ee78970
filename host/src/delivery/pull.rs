//! Pulling one unit's rows under its pin.
//!
//! Unit consumers use a pinned-client priority group: the server serves one
//! puller per unit at a time, which fences a host that still pulls a unit it
//! lost. A [`Puller`] keeps at most one pull request outstanding on one
//! inbox, so at any moment it knows exactly which rows the server may still
//! send it. That is what makes a planned handover exact: [`Puller::release`]
//! unpins the unit (the server sends the outstanding request nothing more)
//! and returns the rows that were already on their way, up to the
//! consumer's last delivery, for the caller to finish before the next owner
//! starts.

use std::collections::VecDeque;
use std::time::Duration;

use async_nats::jetstream::AckKind;

use async_nats::Message;
use async_nats::jetstream;
use async_nats::{Client, StatusCode, Subscriber};
use futures::{FutureExt, StreamExt};
use serde::Serialize;
use tokio::time::Instant;

use crate::coordination::{Lease, reclaim_from_stale_request};
use crate::nats::connection::connected;
use crate::nats::jetstream::{PIN_GROUP, last_delivery, unpin};

/// How long the server keeps one pull request waiting for rows while rows
/// come.
pub const PULL_EXPIRES: Duration = Duration::from_secs(5);
/// Idle heartbeat of a waiting pull request.
const PULL_HEARTBEAT: Duration = Duration::from_secs(2);
/// How long a request waits when the unit is idle: the last request
/// brought no row, or none came yet (no pin). An idle unit thus costs one
/// request per 12 s, not one per second. Below the pin's TTL
/// (`topology::PIN_TIMEOUT`, 15 s), which only a request renews: an idle
/// holder keeps its pin.
pub const IDLE_PULL_EXPIRES: Duration = Duration::from_secs(12);
/// Idle heartbeat of such a request: a request lost (a server restart, a
/// reconnect) shows as silence within two of them.
const IDLE_PULL_HEARTBEAT: Duration = Duration::from_secs(4);
/// A request the server has not ended this long after its expiry was lost
/// (a server restart, a reconnect): pull again.
const LOST_REQUEST_GRACE: Duration = Duration::from_secs(2);
/// An idle request with neither row nor heartbeat for this long was lost.
const IDLE_SILENCE_LIMIT: Duration = Duration::from_secs(9);
/// After a takeover, how long a pull request the old owner left may still
/// wait on the server: it was sent while that owner's lease held, so
/// before this claim, and the server ends it at its expiry. Waiting there
/// without a pin, it would get the unit's next row (and the pin) ahead of
/// the new owner's request, and those rows would come back only after the
/// pin's timeout and the ack wait, behind newer ones.
const STALE_REQUEST_WINDOW: Duration =
    Duration::from_secs(IDLE_PULL_EXPIRES.as_secs() + LOST_REQUEST_GRACE.as_secs());
/// Expiry of a new owner's requests without a pin within that window: each
/// that ends empty looks whether the old owner's request took the unit.
const STALE_CHECK_EXPIRES: Duration = Duration::from_secs(1);
const STALE_CHECK_HEARTBEAT: Duration = Duration::from_millis(500);
/// Pause before pulling again after the server refused a request.
const REFUSED_PAUSE: Duration = Duration::from_millis(250);
/// How long a release whose unpin failed waits for rows still on their way.
const RELEASE_WAIT: Duration = Duration::from_millis(500);
/// How long a release waits for the rows the server sent before its unpin.
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(2);

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
struct PullRequest<'a> {
    batch: usize,
    #[serde(with = "serde_nanos_u64")]
    expires: Duration,
    #[serde(with = "serde_nanos_u64")]
    idle_heartbeat: Duration,
    group: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
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
    /// Sent without a pin id: an unpin does not end it.
    without_pin: bool,
    /// An idle request: its heartbeats say it is alive, so silence, not
    /// its long expiry, says it was lost.
    idle: bool,
    /// Whether it brought a row.
    brought: bool,
    /// Sent within [`STALE_REQUEST_WINDOW`]: ending empty, it looks for a
    /// request the old owner left.
    checks_stale: bool,
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
    pin: Option<String>,
    outstanding: Option<Outstanding>,
    /// Rows received while a batch ran ([`Puller::keep_received_alive`]),
    /// handed out before any newer one.
    received: VecDeque<Message>,
    /// When rows received were last kept alive.
    kept_alive: Instant,
    /// No request is sent once it no longer holds: a request from a host
    /// past its lease could take the pin from the unit's next owner.
    lease: Lease,
    /// The consumer's last delivery when this puller opened: later ones
    /// are this puller's (it holds the unit).
    delivered_at_open: u64,
    /// The ack subject of the last row received (empty: none yet), copied
    /// into one buffer: a clone of each row's subject would allocate.
    last_reply: String,
    /// The last request ended without a row: the next one waits long.
    idle: bool,
    /// Until when a request the unit's old owner left may still wait on
    /// the server (`None`: the unit was handed over, or never owned).
    stale_requests_until: Option<Instant>,
}

impl Puller {
    /// Subscribes the inbox; no request is sent before [`Puller::next_until`].
    pub async fn open(
        js: jetstream::Context,
        stream: String,
        consumer: String,
        size: PullSize,
        lease: Lease,
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
        let delivered_at_open = match last_delivery(&client, &stream, &consumer).await {
            Ok(last) => last,
            Err(err) => {
                // Only a release's wait for rows on their way reads it: it
                // may then wait its bound for rows someone else got.
                tracing::debug!(%consumer, error = %err, "cannot read the unit's last delivery");
                0
            }
        };
        let stale_requests_until = lease
            .taken_over()
            .then(|| Instant::now() + STALE_REQUEST_WINDOW);
        Ok(Puller {
            client,
            stream,
            consumer,
            inbox,
            subscriber,
            size,
            mean_row_bytes: 0.0,
            pin: None,
            outstanding: None,
            received: VecDeque::new(),
            kept_alive: Instant::now(),
            lease,
            delivered_at_open,
            last_reply: String::new(),
            idle: false,
            stale_requests_until,
        })
    }

    /// The next row if one arrives before `deadline` (`None`: whenever; a
    /// deadline passed: only a row already here).
    /// Cancel-safe: a request is either not sent or sent and recorded
    /// (sending to the client's queue is the only await before recording).
    pub async fn next_until(&mut self, deadline: Option<Instant>) -> Option<Message> {
        if let Some(row) = self.received.pop_front() {
            return Some(row);
        }
        loop {
            if self.outstanding.is_none() {
                self.request().await;
            }
            // No timer for "only what is here": tokio rounds a deadline up
            // to its next millisecond, so a batch meant to close when no row
            // waits would wait for rows up to a millisecond (measured: a
            // request's 100 rows trickling in made one 1.2 ms batch).
            if deadline.is_some_and(|d| d <= Instant::now()) {
                match self.subscriber.next().now_or_never() {
                    Some(Some(message)) => match self.receive(message).await {
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
                    if let Some(row) = self.receive(message).await {
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

    /// Gives the unit up: unpins it, which ends the outstanding request at
    /// once, and returns the rows that were already sent. Nothing else
    /// reaches this puller afterwards; the caller finishes these rows and
    /// the next owner can start.
    pub async fn release(mut self) -> Vec<Message> {
        let mut rows: Vec<Message> = self.received.drain(..).collect();
        // Unpinned even if no row came yet: one may be on the wire, and the
        // server pins the receiver of the first row.
        let pin = self.pin.take();
        let started = Instant::now();
        if !connected(&self.client) {
            // Nothing more can arrive, and the unpin would wait out its
            // timeout: the pin times out on its own.
            tracing::warn!(consumer = %self.consumer, "NATS is unreachable: the unit's pin is not released; the next owner waits for it to time out");
            let _ = self.subscriber.unsubscribe().await;
            return rows;
        }
        match unpin(&self.client, &self.stream, &self.consumer).await {
            // Once the unpin is answered the server sends a request with
            // the old pin id nothing more (a new row gets it a 423), and
            // every row it sent before is ahead of the answer on the
            // connection: a flush round trip puts them all in the
            // subscription.
            Ok(()) => {
                self.drain_into(&mut rows).await;
                // A request sent without a pin id that brought no row yet
                // is not ended by the unpin (the server pins it anew on its
                // next row), and it waits long: end it by dropping the
                // inbox's interest. One that brought rows was pinned with
                // them, and the unpin ended it like any pinned request.
                if self
                    .outstanding
                    .as_ref()
                    .is_some_and(|o| o.without_pin && !o.brought)
                {
                    self.end_unpinned(&mut rows).await;
                } else {
                    self.await_in_flight(&mut rows).await;
                }
            }
            Err(err) => {
                tracing::warn!(consumer = %self.consumer, error = %err, "cannot release the unit's pin; the next owner waits for it to time out");
                let deadline = started + RELEASE_WAIT;
                while self.outstanding.is_some() {
                    match tokio::time::timeout_at(deadline, self.subscriber.next()).await {
                        Ok(Some(message)) => rows.extend(self.receive(message).await),
                        Ok(None) | Err(_) => break,
                    }
                }
            }
        }
        tracing::debug!(consumer = %self.consumer, ?pin, rows = rows.len(), waited = ?started.elapsed(), "pin released");
        let _ = self.subscriber.unsubscribe().await;
        rows
    }

    /// Takes the rows the server sent this puller before the unpin that
    /// are still on their way: the server's answer to the unpin and its
    /// deliveries travel separate queues, so the answer can overtake them.
    /// Its deliveries come in order, so once the consumer's last delivery
    /// (read after the unpin, when nothing more is sent here) has arrived,
    /// every one has. Missed, they would come back to the next owner after
    /// the ack wait, behind newer rows.
    async fn await_in_flight(&mut self, rows: &mut Vec<Message>) {
        let last = match last_delivery(&self.client, &self.stream, &self.consumer).await {
            Ok(last) => last,
            Err(err) => {
                tracing::warn!(consumer = %self.consumer, error = %err, "cannot read the unit's last delivery; rows still on their way come back after the ack wait");
                return;
            }
        };
        if last <= self.delivered_at_open.max(self.highest_delivery()) {
            return;
        }
        let deadline = Instant::now() + IN_FLIGHT_WAIT;
        while self.highest_delivery() < last {
            match tokio::time::timeout_at(deadline, self.subscriber.next()).await {
                Ok(Some(message)) => rows.extend(self.receive(message).await),
                Ok(None) => return,
                Err(_) => {
                    tracing::warn!(
                        consumer = %self.consumer,
                        last,
                        received = self.highest_delivery(),
                        "rows sent before the release did not arrive in time; they come back after the ack wait"
                    );
                    return;
                }
            }
        }
        tracing::debug!(consumer = %self.consumer, last, "rows on their way at the release arrived");
    }

    /// Ends a request sent without a pin id that brought no row: takes the
    /// rows sent to it since all the same, then unsubscribes the inbox, so
    /// the server sends it nothing more (a request whose reply subject has
    /// no interest is dropped), after taking what the inbox holds. The
    /// consumer info asked next is answered after the server handled the
    /// unsubscription (one connection, in order): a row it delivered in
    /// between went to no one. That takes a row arriving within that round
    /// trip; the row comes back after the ack wait, and the pin its
    /// delivery gave the ended request is released again here.
    async fn end_unpinned(&mut self, rows: &mut Vec<Message>) {
        // Rows sent to it before or since the unpin (the server pinned it
        // on the first): take them, then unpin again, which ends it now
        // that it carries the pin's id.
        if let Ok(last) = last_delivery(&self.client, &self.stream, &self.consumer).await
            && last > self.delivered_at_open.max(self.highest_delivery())
        {
            self.await_in_flight(rows).await;
            if let Err(err) = unpin(&self.client, &self.stream, &self.consumer).await {
                tracing::debug!(consumer = %self.consumer, error = %err, "second unpin failed");
            }
            self.drain_into(rows).await;
        }
        while let Some(Some(message)) = self.subscriber.next().now_or_never() {
            rows.extend(self.receive(message).await);
        }
        if let Err(err) = self.subscriber.unsubscribe().await {
            tracing::debug!(consumer = %self.consumer, error = %err, "cannot unsubscribe the inbox");
        }
        self.outstanding = None;
        match last_delivery(&self.client, &self.stream, &self.consumer).await {
            Ok(last) if last > self.delivered_at_open.max(self.highest_delivery()) => {
                tracing::warn!(
                    consumer = %self.consumer,
                    last,
                    received = self.highest_delivery(),
                    "rows reached the unit as its release ended its request; they come back after the ack wait"
                );
                if let Err(err) = unpin(&self.client, &self.stream, &self.consumer).await {
                    tracing::warn!(consumer = %self.consumer, error = %err, "cannot release the pin of the ended request; the next owner waits for it to time out");
                }
            }
            Ok(_) => {}
            Err(err) => {
                tracing::debug!(consumer = %self.consumer, error = %err, "cannot read the unit's last delivery after ending its request")
            }
        }
    }

    /// The consumer sequence of the last row received (0: none yet).
    fn highest_delivery(&self) -> u64 {
        crate::nats::ack::parse(&self.last_reply).map_or(0, |info| info.consumer_sequence)
    }

    /// Flushes, then takes every row already in the subscription.
    async fn drain_into(&mut self, rows: &mut Vec<Message>) {
        if let Err(err) = self.client.flush().await {
            tracing::debug!(error = %err, "flush after unpin failed");
        }
        while let Some(Some(message)) = self.subscriber.next().now_or_never() {
            rows.extend(self.receive(message).await);
        }
    }

    /// A request asks for more rows than a batch takes, so the server sends
    /// the next batches' rows while one runs. Their ack wait runs too: this
    /// takes in what has arrived and tells the server every such row is
    /// still being worked on. Called as a running batch is kept alive.
    pub async fn keep_received_alive(&mut self) {
        while let Some(Some(message)) = self.subscriber.next().now_or_never() {
            if let Some(row) = self.receive(message).await {
                self.received.push_back(row);
            }
        }
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
        let without_pin = self.pin.is_none();
        let checks_stale = without_pin
            && self.last_reply.is_empty()
            && self
                .stale_requests_until
                .is_some_and(|until| Instant::now() < until);
        let idle = !checks_stale && (without_pin || self.idle);
        let (expires, idle_heartbeat) = if checks_stale {
            (STALE_CHECK_EXPIRES, STALE_CHECK_HEARTBEAT)
        } else if idle {
            (IDLE_PULL_EXPIRES, IDLE_PULL_HEARTBEAT)
        } else {
            (PULL_EXPIRES, PULL_HEARTBEAT)
        };
        let body = PullRequest {
            batch,
            expires,
            idle_heartbeat,
            group: PIN_GROUP,
            id: self.pin.as_deref(),
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
                tracing::trace!(consumer = %self.consumer, pin = ?self.pin, batch, "pull request sent");
                let lost_after = if idle {
                    IDLE_SILENCE_LIMIT
                } else {
                    expires + LOST_REQUEST_GRACE
                };
                self.outstanding = Some(Outstanding {
                    remaining: batch,
                    lost_after: Instant::now() + lost_after,
                    without_pin,
                    idle,
                    brought: false,
                    checks_stale,
                })
            }
            Err(err) => {
                tracing::warn!(consumer = %self.consumer, error = %err, "cannot send a pull request");
                tokio::time::sleep(REFUSED_PAUSE).await;
            }
        }
    }

    /// Within [`STALE_REQUEST_WINDOW`] of a takeover, with no pin and no
    /// row yet: a pin now belongs to a request the old owner left, which
    /// is ended and its rows sent back ahead of newer ones.
    async fn reclaim_from_stale_request(&mut self) {
        if self.pin.is_some() || !self.last_reply.is_empty() || !self.lease.held() {
            return;
        }
        match reclaim_from_stale_request(&self.client, &self.stream, &self.consumer).await {
            Ok(None) => {}
            Ok(Some(rows)) => tracing::warn!(
                consumer = %self.consumer,
                rows,
                "a pull request left by the unit's old owner took it after the takeover; took it back"
            ),
            Err(err) => {
                tracing::warn!(consumer = %self.consumer, error = %err, "cannot read whether the unit's old owner still pulls it")
            }
        }
    }

    /// A row, or `None` for a status the server sent about the request.
    async fn receive(&mut self, message: Message) -> Option<Message> {
        match message.status {
            None | Some(StatusCode::OK) => {
                // Read only at a release: deliveries come in order, so the
                // last one's sequence is the highest.
                self.last_reply.clear();
                if let Some(reply) = &message.reply {
                    self.last_reply.push_str(reply);
                }
                if let Some(pin) = message
                    .headers
                    .as_ref()
                    // Stamped on every row delivered to the pinned client; the
                    // constant name skips parsing a header name per row.
                    .and_then(|headers| headers.get(async_nats::header::NATS_PIN_ID))
                    && self.pin.as_deref() != Some(pin.as_str())
                {
                    self.pin = Some(pin.to_string());
                }
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
                    if outstanding.checks_stale && !outstanding.brought {
                        self.reclaim_from_stale_request().await;
                    }
                }
                None
            }
            Some(StatusCode::PIN_ID_MISMATCH) => {
                // Another puller holds the pin, or it was released: pull
                // again without one (served once the pin is free).
                if self.pin.take().is_some() {
                    tracing::info!(consumer = %self.consumer, "the unit's pin moved away");
                }
                self.outstanding = None;
                None
            }
            Some(status) => {
                tracing::debug!(consumer = %self.consumer, %status, description = ?message.description, "pull request ended");
                self.outstanding = None;
                tokio::time::sleep(REFUSED_PAUSE).await;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
