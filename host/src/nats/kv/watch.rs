//! The NATS side of a watch: ONE push consumer with a filter subject per
//! prefix, replaced — after the last revision it delivered — whenever it is
//! lost; and the decoding of the KV messages it delivers.
//!
//! The consumer acks nothing and stores nothing (an ordered consumer, built
//! here rather than with async-nats's `Ordered` so that weir knows every
//! consumer's name: it deletes each one it replaces, and the last one when
//! the watch stops). A consumer counts as lost when the connection to NATS
//! came back after a drop (a restarted server forgot it), when the server is
//! silent for [`SILENCE_LIMIT`] (no message, no idle heartbeat — a deleted
//! consumer: the server does not tell a push consumer's subscriber), when a
//! consumer sequence number is skipped (messages dropped on the way), or
//! when the server sends a status it should not.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, ReplayPolicy, push};
use async_nats::jetstream::{self, ErrorCode};
use async_nats::{HeaderMap, StatusCode};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Entry, KvError, Operation, WATCH_BUFFER, Watch, WatchEvent, WatchStart};

/// Idle heartbeat the server sends when it has nothing to deliver.
const HEARTBEAT: Duration = Duration::from_secs(2);
/// Silence after which the consumer counts as lost and is replaced.
const SILENCE_LIMIT: Duration = Duration::from_secs(6);
/// How often the connection state is looked at: a watch that saw it drop
/// replaces its consumer as soon as it is back, without waiting for silence.
const CONNECTION_CHECK: Duration = Duration::from_millis(250);
/// A consumer whose deliver subject has had no subscriber this long is
/// deleted by the server: bounds what a process that died leaves behind.
const INACTIVE_THRESHOLD: Duration = Duration::from_secs(10);
/// Pauses between attempts to replace a lost consumer.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// How long deleting a consumer may take before it is left to the server.
const DELETE_TIMEOUT: Duration = Duration::from_secs(5);

const KV_OPERATION: &str = "KV-Operation";
const MARKER_REASON: &str = "Nats-Marker-Reason";
const LAST_CONSUMER: &str = "Nats-Last-Consumer";
const CONSUMER_STALLED: &str = "Nats-Consumer-Stalled";

/// What a watch needs to (re)create its consumer.
pub(super) struct WatchTarget {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub bucket: String,
    pub stream: String,
    /// `$KV.<bucket>.`, stripped from subjects to get keys.
    pub key_prefix: String,
    /// One per folded prefix; never empty.
    pub filters: Vec<String>,
}

/// Starts a watch: creates its first consumer before returning (so a bad
/// bucket fails here, and the consumer exists once the call returns), then
/// follows it in a task.
pub(super) async fn start(
    target: WatchTarget,
    start: WatchStart,
    stream_last_revision: impl Future<Output = Result<u64, KvError>>,
) -> Result<Watch, KvError> {
    let cursor = match start {
        WatchStart::CurrentValues => Cursor::last_values(),
        WatchStart::NewChanges => Cursor::after(stream_last_revision.await?),
        WatchStart::AfterRevision(revision) => Cursor::after(revision),
    };
    let (events, receiver) = mpsc::channel(WATCH_BUFFER);
    let mut task = WatchTask {
        target,
        cursor,
        events,
        consumer: None,
    };
    let consumer = task
        .open()
        .await
        .map_err(|failure| failure.into_error(&task.target))?;
    let stop = CancellationToken::new();
    let handle = tokio::spawn(task.run(consumer, stop.clone()));
    Ok(Watch::running(receiver, stop, handle))
}

/// Where the watch stands: what was delivered, and so where a replacement
/// consumer starts. Pure, so the resume rules are unit-tested.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cursor {
    /// The last revision delivered, or the one the watch starts after.
    delivered: u64,
    /// The watch began with the last value of every key and is not yet
    /// caught up: a replacement replays last values again (skipping what was
    /// delivered) instead of every revision after `delivered`.
    replaying_last_values: bool,
    caught_up: bool,
}

impl Cursor {
    fn last_values() -> Cursor {
        Cursor {
            delivered: 0,
            replaying_last_values: true,
            caught_up: false,
        }
    }

    fn after(revision: u64) -> Cursor {
        Cursor {
            delivered: revision,
            replaying_last_values: false,
            caught_up: false,
        }
    }

    /// Where a new consumer starts so that nothing is missed.
    fn deliver_policy(&self) -> DeliverPolicy {
        if self.replaying_last_values && !self.caught_up {
            // Last values come in revision order: every key whose last value
            // is at or before `delivered` was already delivered; the rest
            // come again and are delivered now.
            DeliverPolicy::LastPerSubject
        } else {
            DeliverPolicy::ByStartSequence {
                start_sequence: self.delivered + 1,
            }
        }
    }

    /// Whether a message at `revision` is new; a replacement consumer may
    /// deliver again what an earlier one did, and that is dropped here.
    fn accept(&mut self, revision: u64) -> bool {
        if revision <= self.delivered {
            return false;
        }
        self.delivered = revision;
        true
    }

    /// Whether `pending` (messages left for the consumer) reaching zero
    /// means the watch just caught up — true once per watch.
    fn reach(&mut self, pending: u64) -> bool {
        if self.caught_up || pending > 0 {
            return false;
        }
        self.caught_up = true;
        true
    }
}

/// One consumer of the watch, with the subscription it delivers to.
struct Consumer {
    name: String,
    messages: async_nats::Subscriber,
    /// The consumer sequence the next message must carry; any other means
    /// messages were lost on the way.
    next_sequence: u64,
    /// Messages it had to deliver when created.
    pending: u64,
}

/// Why a consumer could not be made.
enum OpenFailure {
    /// The bucket's stream is gone: the watch ends.
    BucketGone,
    /// Anything else (no connection, timeouts): try again.
    Transient(String),
}

impl OpenFailure {
    fn into_error(self, target: &WatchTarget) -> KvError {
        match self {
            OpenFailure::BucketGone => KvError::BucketNotFound {
                bucket: target.bucket.clone(),
            },
            OpenFailure::Transient(reason) => KvError::Watch {
                bucket: target.bucket.clone(),
                filters: target.filters.clone(),
                reason,
            },
        }
    }
}

/// What the loop does after a message.
enum Next {
    Continue,
    Replace(String),
    Stop,
}

struct WatchTask {
    target: WatchTarget,
    cursor: Cursor,
    events: mpsc::Sender<Result<WatchEvent, KvError>>,
    /// Name of the live consumer, deleted when the task ends.
    consumer: Option<String>,
}

impl WatchTask {
    async fn run(mut self, mut consumer: Consumer, stop: CancellationToken) {
        if consumer.pending == 0
            && self.cursor.reach(0)
            && !self.send(Ok(WatchEvent::CaughtUp)).await
        {
            return self.finish().await;
        }
        let mut silence_deadline = Instant::now() + SILENCE_LIMIT;
        let mut connection_checks = tokio::time::interval(CONNECTION_CHECK);
        connection_checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut saw_disconnect = false;
        loop {
            let next = tokio::select! {
                // Messages first: after a stall, what waits in the buffer
                // counts before the silence timer does.
                biased;
                _ = stop.cancelled() => Next::Stop,
                message = consumer.messages.next() => match message {
                    Some(message) => {
                        silence_deadline = Instant::now() + SILENCE_LIMIT;
                        self.handle(&mut consumer, message).await
                    }
                    None => {
                        let error = KvError::Watch {
                            bucket: self.target.bucket.clone(),
                            filters: self.target.filters.clone(),
                            reason: "the NATS connection was closed".into(),
                        };
                        self.send(Err(error)).await;
                        Next::Stop
                    }
                },
                _ = tokio::time::sleep_until(silence_deadline) => {
                    Next::Replace(format!("no message nor heartbeat for {SILENCE_LIMIT:?}"))
                }
                _ = connection_checks.tick() => {
                    let connected = crate::nats::connection::connected(&self.target.client);
                    if !connected {
                        saw_disconnect = true;
                        Next::Continue
                    } else if std::mem::take(&mut saw_disconnect) {
                        // A restarted server has forgotten the consumer; a
                        // live one has sent messages into the gap. Either
                        // way a fresh consumer is quicker than waiting for
                        // the silence limit.
                        Next::Replace("the connection to NATS came back".into())
                    } else {
                        Next::Continue
                    }
                }
            };
            match next {
                Next::Continue => {}
                Next::Stop => break,
                Next::Replace(reason) => {
                    tracing::warn!(
                        bucket = %self.target.bucket,
                        consumer = %consumer.name,
                        after_revision = self.cursor.delivered,
                        "kv watch replaces its consumer: {reason}"
                    );
                    match self.replace(&stop).await {
                        Some(replacement) => {
                            consumer = replacement;
                            silence_deadline = Instant::now() + SILENCE_LIMIT;
                            // The replacement was made on the connection as
                            // it is now: a drop before it is dealt with.
                            saw_disconnect = false;
                            if consumer.pending == 0
                                && self.cursor.reach(0)
                                && !self.send(Ok(WatchEvent::CaughtUp)).await
                            {
                                break;
                            }
                        }
                        None => break,
                    }
                }
            }
        }
        self.finish().await;
    }

    async fn handle(&mut self, consumer: &mut Consumer, message: async_nats::Message) -> Next {
        tracing::trace!(
            bucket = %self.target.bucket,
            subject = %message.subject,
            reply = ?message.reply,
            status = ?message.status,
            description = ?message.description,
            headers = ?message.headers,
            "kv watch message"
        );
        match message.status {
            None => {}
            Some(StatusCode::IDLE_HEARTBEAT) => {
                // A flow control request carries a reply subject; a
                // heartbeat may name one in a stall header. Both want an
                // empty answer, or the server stops sending.
                let reply = message
                    .reply
                    .clone()
                    .map(|subject| subject.to_string())
                    .or_else(|| {
                        header(message.headers.as_ref(), CONSUMER_STALLED).map(str::to_string)
                    });
                if let Some(reply) = reply
                    && let Err(err) = self.target.client.publish(reply, bytes::Bytes::new()).await
                {
                    tracing::debug!(bucket = %self.target.bucket, "kv watch cannot answer flow control: {err}");
                }
                let last_sent = header(message.headers.as_ref(), LAST_CONSUMER)
                    .and_then(|value| value.parse::<u64>().ok());
                if let Some(last_sent) = last_sent
                    && last_sent >= consumer.next_sequence
                {
                    return Next::Replace(format!(
                        "the server sent up to consumer sequence {last_sent}, only {} arrived",
                        consumer.next_sequence - 1
                    ));
                }
                return Next::Continue;
            }
            Some(status) => {
                return Next::Replace(format!(
                    "the server sent status {status} ({})",
                    message.description.as_deref().unwrap_or("no description")
                ));
            }
        }
        let Some(delivery) = crate::nats::ack::info(&message) else {
            return Next::Replace(format!(
                "a message on `{}` without a JetStream reply subject",
                message.subject
            ));
        };
        if delivery.consumer_sequence != consumer.next_sequence {
            return Next::Replace(format!(
                "consumer sequence {} arrived where {} was due",
                delivery.consumer_sequence, consumer.next_sequence
            ));
        }
        consumer.next_sequence += 1;
        if self.cursor.accept(delivery.stream_sequence) {
            match message
                .subject
                .strip_prefix(self.target.key_prefix.as_str())
            {
                Some(key) => {
                    let entry = Entry {
                        key: key.to_string(),
                        value: message.payload.clone(),
                        revision: delivery.stream_sequence,
                        operation: operation(message.headers.as_ref()),
                        created: delivery.created,
                    };
                    if !self.send(Ok(WatchEvent::Update(entry))).await {
                        return Next::Stop;
                    }
                }
                // The filters only match the bucket's subjects; anything else
                // is not a key and is not delivered.
                None => tracing::warn!(
                    bucket = %self.target.bucket,
                    subject = %message.subject,
                    "kv watch got a message outside the bucket"
                ),
            }
        }
        if self.cursor.reach(delivery.pending) && !self.send(Ok(WatchEvent::CaughtUp)).await {
            return Next::Stop;
        }
        Next::Continue
    }

    /// Replaces the lost consumer, retrying until it works, the bucket is
    /// gone, or the watch is stopped.
    async fn replace(&mut self, stop: &CancellationToken) -> Option<Consumer> {
        let lost = self.consumer.take();
        let replacement = self.open_until_done(stop).await;
        // The lost one may still exist (a server that kept it, a consumer
        // that only fell behind, a watch stopped while replacing): delete it
        // rather than leave it to the inactivity reaper.
        if let Some(lost) = lost {
            let js = self.target.js.clone();
            let stream = self.target.stream.clone();
            tokio::spawn(async move { delete_consumer(&js, &stream, &lost).await });
        }
        replacement
    }

    async fn open_until_done(&mut self, stop: &CancellationToken) -> Option<Consumer> {
        let mut pause = RETRY_FIRST;
        loop {
            let attempt = tokio::select! {
                _ = stop.cancelled() => return None,
                attempt = self.open() => attempt,
            };
            match attempt {
                Ok(consumer) => return Some(consumer),
                Err(OpenFailure::BucketGone) => {
                    let error = OpenFailure::BucketGone.into_error(&self.target);
                    self.send(Err(error)).await;
                    return None;
                }
                Err(OpenFailure::Transient(reason)) => {
                    tracing::debug!(bucket = %self.target.bucket, "kv watch cannot replace its consumer yet: {reason}");
                    tokio::select! {
                        _ = stop.cancelled() => return None,
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// Subscribes a fresh inbox and creates a consumer delivering to it from
    /// where the cursor stands. A fresh inbox per consumer: a lost consumer
    /// that still pushes can never interleave with its replacement.
    async fn open(&mut self) -> Result<Consumer, OpenFailure> {
        let inbox = self.target.client.new_inbox();
        let messages = self
            .target
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|err| OpenFailure::Transient(format!("cannot subscribe: {err}")))?;
        let config = push::Config {
            deliver_subject: inbox,
            description: Some(format!(
                "weir kv watch of {} prefix(es)",
                self.target.filters.len()
            )),
            filter_subjects: self.target.filters.clone(),
            deliver_policy: self.cursor.deliver_policy(),
            ack_policy: AckPolicy::None,
            replay_policy: ReplayPolicy::Instant,
            flow_control: true,
            idle_heartbeat: HEARTBEAT,
            inactive_threshold: INACTIVE_THRESHOLD,
            memory_storage: true,
            num_replicas: 1,
            ..Default::default()
        };
        let created = self
            .target
            .js
            .create_consumer_on_stream(config, self.target.stream.as_str())
            .await
            .map_err(|err| match err.kind() {
                jetstream::stream::ConsumerErrorKind::JetStream(error)
                    if error.error_code() == ErrorCode::STREAM_NOT_FOUND =>
                {
                    OpenFailure::BucketGone
                }
                _ => OpenFailure::Transient(format!("cannot create consumer: {err}")),
            })?;
        let info = created.cached_info();
        self.consumer = Some(info.name.clone());
        tracing::debug!(
            bucket = %self.target.bucket,
            consumer = %info.name,
            filters = ?self.target.filters,
            pending = info.num_pending,
            "kv watch consumer created"
        );
        Ok(Consumer {
            name: info.name.clone(),
            messages,
            next_sequence: 1,
            pending: info.num_pending,
        })
    }

    /// Hands an event to the watcher; false once nobody reads any more.
    async fn send(&self, event: Result<WatchEvent, KvError>) -> bool {
        self.events.send(event).await.is_ok()
    }

    /// Deletes the live consumer, so a stopped watch leaves nothing behind.
    /// Cut off from the server, the delete would only wait out its timeout
    /// (holding a stop): the server reaps the consumer on its own.
    async fn finish(mut self) {
        if let Some(name) = self.consumer.take()
            && crate::nats::connection::connected(&self.target.client)
        {
            delete_consumer(&self.target.js, &self.target.stream, &name).await;
        }
    }
}

/// Best effort: a consumer that cannot be deleted now is reaped by the
/// server after [`INACTIVE_THRESHOLD`].
async fn delete_consumer(js: &jetstream::Context, stream: &str, name: &str) {
    match tokio::time::timeout(DELETE_TIMEOUT, js.delete_consumer_from_stream(name, stream)).await {
        Ok(Ok(_)) => tracing::debug!(stream, consumer = name, "kv watch consumer deleted"),
        Ok(Err(err)) => {
            tracing::debug!(
                stream,
                consumer = name,
                "kv watch consumer not deleted: {err}"
            )
        }
        Err(_) => tracing::debug!(
            stream,
            consumer = name,
            "kv watch consumer delete timed out"
        ),
    }
}

/// The operation of a KV message: its `KV-Operation` header, else the reason
/// of a server-placed delete marker, else a put.
pub(super) fn operation(headers: Option<&HeaderMap>) -> Operation {
    match header(headers, KV_OPERATION) {
        Some("DEL") => return Operation::Delete,
        Some("PURGE") => return Operation::Purge,
        Some(_) => return Operation::Put,
        None => {}
    }
    match header(headers, MARKER_REASON) {
        // TTLs and the bucket's max age both remove by age.
        Some("MaxAge") => Operation::Expired,
        Some("Purge") => Operation::Purge,
        // `Remove`, and any reason a newer server adds: the value is gone.
        Some(_) => Operation::Delete,
        None => Operation::Put,
    }
}

fn header<'a>(headers: Option<&'a HeaderMap>, name: &str) -> Option<&'a str> {
    headers?.get(name).map(|value| value.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_come_from_headers_and_markers() {
        let with = |name: &str, value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(name, value);
            operation(Some(&headers))
        };
        assert_eq!(operation(None), Operation::Put);
        assert_eq!(with(KV_OPERATION, "DEL"), Operation::Delete);
        assert_eq!(with(KV_OPERATION, "PURGE"), Operation::Purge);
        assert_eq!(with(KV_OPERATION, "PUT"), Operation::Put);
        assert_eq!(with(MARKER_REASON, "MaxAge"), Operation::Expired);
        assert_eq!(with(MARKER_REASON, "Purge"), Operation::Purge);
        assert_eq!(with(MARKER_REASON, "Remove"), Operation::Delete);
        assert_eq!(with("Other", "x"), Operation::Put);
    }

    #[test]
    fn a_replacement_starts_after_the_last_revision_delivered() {
        let mut cursor = Cursor::after(10);
        assert_eq!(
            cursor.deliver_policy(),
            DeliverPolicy::ByStartSequence { start_sequence: 11 }
        );
        assert!(cursor.accept(11));
        assert!(cursor.accept(15));
        assert_eq!(
            cursor.deliver_policy(),
            DeliverPolicy::ByStartSequence { start_sequence: 16 }
        );
        // What a replacement sends again is dropped, once.
        assert!(!cursor.accept(15));
        assert!(!cursor.accept(3));
        assert!(cursor.accept(16));
    }

    #[test]
    fn last_values_replay_again_until_caught_up_then_follow_revisions() {
        let mut cursor = Cursor::last_values();
        assert_eq!(cursor.deliver_policy(), DeliverPolicy::LastPerSubject);
        assert!(cursor.accept(4));
        assert!(!cursor.reach(2));
        // Lost mid-replay: replay last values again, skip revisions <= 4.
        assert_eq!(cursor.deliver_policy(), DeliverPolicy::LastPerSubject);
        assert!(!cursor.accept(4));
        assert!(cursor.accept(9));
        assert!(cursor.reach(0));
        assert_eq!(
            cursor.deliver_policy(),
            DeliverPolicy::ByStartSequence { start_sequence: 10 }
        );
    }

    #[test]
    fn caught_up_is_reported_once() {
        let mut cursor = Cursor::after(0);
        assert!(!cursor.reach(1));
        assert!(cursor.reach(0));
        assert!(!cursor.reach(0));
    }
}
