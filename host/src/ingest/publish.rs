//! Publishing accepted rows to their partition stream. Publishes are
//! pipelined (many PubAcks in flight) and a call returns only once JetStream
//! has acknowledged every row, so a 2xx always means "durable".

use async_nats::jetstream::{
    self, context::PublishErrorKind, message::PublishMessage, publish::PublishAck,
};
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};

use crate::ingest::policy::Placement;
use crate::ingest::usage::Accept;
use crate::topology::route::{Router, Unit};

/// Room left in a message for its headers (the message id) under the
/// server's `max_payload`.
const HEADER_ROOM: usize = 1024;

/// PubAcks awaited at once per request; bounds memory on a huge body while
/// keeping the connection busy.
const PUBLISH_WINDOW: usize = 1024;

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
    #[error("publish failed: {0}")]
    Other(String),
}

/// Publishes rows for the front door (and, later, other ingest paths).
#[derive(Clone)]
pub struct Publisher {
    client: async_nats::Client,
    js: jetstream::Context,
    router: Router,
    /// Read once at start: every server of a cluster has the same limit.
    max_row_bytes: usize,
}

impl Publisher {
    pub fn new(client: async_nats::Client, router: Router) -> Publisher {
        let js = jetstream::new(client.clone());
        let max_row_bytes = client.server_info().max_payload.saturating_sub(HEADER_ROOM);
        Publisher {
            client,
            js,
            router,
            max_row_bytes,
        }
    }

    /// The largest row the server stores (its `max_payload`, less room for
    /// headers): checked for every row of a request before the first is
    /// published, so a refused request stores nothing.
    /// The name a unit goes by in logs and metrics (its consumer's).
    pub fn unit_name(&self, unit: crate::topology::route::Unit) -> String {
        self.router.unit_consumer(unit)
    }

    pub fn max_row_bytes(&self) -> usize {
        self.max_row_bytes
    }

    /// True while the NATS connection is up; a request that arrives while it
    /// is down is refused at once instead of waiting out a timeout.
    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Publishes `rows` of `tenant`/`table` in order, each to the unit
    /// `placement` gives it, and waits for every PubAck. A row with a
    /// message id is stored once within the stream's duplicate window,
    /// however often it is sent. On error, rows before the failing one may
    /// already be stored; sending them again with the same ids stores
    /// nothing twice.
    pub async fn publish(
        &self,
        tenant: &str,
        table: &str,
        placement: &Placement,
        rows: impl IntoIterator<Item = (Bytes, Option<String>)>,
    ) -> Result<Published, PublishError> {
        if !self.connected() {
            return Err(PublishError::Unavailable("not connected".into()));
        }
        // A request's rows go to one unit, or (routed by key) to a few.
        let mut subjects: Vec<(Unit, async_nats::Subject)> = Vec::new();
        let mut in_flight = FuturesUnordered::new();
        let mut published = Published::default();
        let mut settle = |ack: PublishAck, partition: u32, bytes: u64| {
            published.stored += 1;
            if ack.duplicate {
                published.duplicates += 1;
                return;
            }
            match published
                .accepts
                .iter_mut()
                .find(|a| a.partition == partition)
            {
                Some(accept) => {
                    accept.last_seq = accept.last_seq.max(ack.sequence);
                    accept.rows += 1;
                    accept.bytes += bytes;
                }
                None => published.accepts.push(Accept {
                    tenant: tenant.to_string(),
                    partition,
                    last_seq: ack.sequence,
                    rows: 1,
                    bytes,
                }),
            }
        };
        for (index, (payload, message_id)) in rows.into_iter().enumerate() {
            let unit = placement
                .unit(index)
                .ok_or_else(|| PublishError::Other(format!("row {index} has no route")))?;
            let subject = match subjects.iter().find(|(u, _)| *u == unit) {
                Some((_, subject)) => subject.clone(),
                None => {
                    let subject =
                        async_nats::Subject::from(self.router.subject(unit, tenant, table));
                    subjects.push((unit, subject.clone()));
                    subject
                }
            };
            let bytes = payload.len() as u64;
            let mut message = PublishMessage::build().payload(payload);
            if let Some(id) = message_id {
                message = message.message_id(id);
            }
            // Waiting for room to publish (async-nats bounds PubAcks in
            // flight per connection), this request keeps settling its own
            // acks: a permit comes back only when its ack is read, so
            // requests that all waited with unread acks would wait forever.
            // The send is polled to its end, never dropped half-way.
            let send = self.js.send_publish(subject, message);
            tokio::pin!(send);
            let ack = loop {
                tokio::select! {
                    biased;
                    sent = &mut send => break sent,
                    Some((result, partition, bytes)) = in_flight.next() => {
                        let ack = acked(result, index)?;
                        settle(ack, partition, bytes);
                    }
                }
            }
            .map_err(|err| classify(err.kind(), err.to_string(), index))?;
            let ack = ack.into_future();
            in_flight.push(async move { (ack.await, unit.partition, bytes) });
            if in_flight.len() >= PUBLISH_WINDOW
                && let Some((result, partition, bytes)) = in_flight.next().await
            {
                settle(acked(result, index)?, partition, bytes);
            }
        }
        while let Some((result, partition, bytes)) = in_flight.next().await {
            settle(acked(result, 0)?, partition, bytes);
        }
        Ok(published)
    }
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

/// A PubAck, or why the row (at `index`) was not stored.
fn acked(
    result: Result<PublishAck, jetstream::context::PublishError>,
    index: usize,
) -> Result<PublishAck, PublishError> {
    result.map_err(|err| classify(err.kind(), err.to_string(), index))
}

fn classify(kind: PublishErrorKind, message: String, index: usize) -> PublishError {
    match kind {
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::StreamNotFound
        | PublishErrorKind::MaxAckPending => PublishError::Unavailable(message),
        PublishErrorKind::MaxPayloadExceeded => PublishError::TooLarge { index },
        _ if message.contains("maximum") || message.contains("resource limits") => {
            PublishError::StreamFull(message)
        }
        _ => PublishError::Other(message),
    }
}
