//! The NATS door: a producer sends rows as a NATS request to
//! `<prefix>.ingest.<tenant>.<table>`, with the HTTP door's body and
//! headers (`Content-Type`, `Content-Encoding`, `Idempotency-Key`,
//! `Weir-Bad-Lines`, …), and gets the HTTP door's answer: the same JSON
//! body, its status code in `Weir-Status`. The tenant is the subject's:
//! the operator's NATS permissions (`weir mq permissions --producer`) are
//! what keep a producer to its own. Hosts serve the subjects as one queue
//! group, and every request goes through [`FrontDoor::process`], so every
//! rule is the HTTP door's; an answer is sent only once the rows are
//! stored.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::ingest::front_door::{Answer, FrontDoor, NATS_DOOR, Refusal};
use crate::nats::connection::{close, connected};
use crate::topology::route::Names;

/// The answer's header with its status code, as the HTTP door's.
pub const STATUS_HEADER: &str = "Weir-Status";
/// Requests one host answers at once; past it, it takes no more from the
/// subscription until one is answered (the client buffers them).
const MAX_IN_FLIGHT: usize = 1024;
/// How long a stop waits for the requests taken to be answered, as the
/// HTTP listener's grace.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long the door's connection may take to flush its last answers.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the NATS door could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve the NATS door on `{subject}`: {reason}")]
pub struct NatsDoorError {
    subject: String,
    reason: String,
}

/// What answering a request needs.
struct Door {
    client: async_nats::Client,
    names: Names,
    front_door: Arc<FrontDoor>,
}

/// Subscribes to the ingest subjects (as the hosts' queue group) on
/// `client`, a connection of the door's own, and serves them until `stop`;
/// then drains the subscription (the server sends no more, and what it
/// sent is answered) and closes the connection.
pub async fn start(
    client: async_nats::Client,
    names: Names,
    front_door: Arc<FrontDoor>,
    stop: CancellationToken,
) -> Result<JoinHandle<()>, NatsDoorError> {
    let subject = names.ingest_subjects();
    let failed = |reason: String| NatsDoorError {
        subject: subject.clone(),
        reason,
    };
    let requests = client
        .queue_subscribe(subject.clone(), names.ingest_queue())
        .await
        .map_err(|err| failed(err.to_string()))?;
    // The subscription is in place on the server before the host says it runs.
    client
        .flush()
        .await
        .map_err(|err| failed(err.to_string()))?;
    tracing::debug!(%subject, "serving the NATS door");
    let door = Arc::new(Door {
        client,
        names,
        front_door,
    });
    Ok(tokio::spawn(serve(requests, door, stop)))
}

async fn serve(mut requests: async_nats::Subscriber, door: Arc<Door>, stop: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut answering = JoinSet::new();
    loop {
        let message = tokio::select! {
            () = stop.cancelled() => break,
            message = requests.next() => match message {
                Some(message) => message,
                // The connection was closed.
                None => break,
            },
        };
        take(&mut answering, &slots, &door, message).await;
    }
    if let Err(err) = requests.drain().await {
        tracing::warn!(error = %err, "cannot drain the NATS door's subscription");
    }
    let drained = tokio::time::timeout(STOP_GRACE, async {
        // Cut off from the server, the subscription never ends: only the
        // requests taken are answered (or fail at once).
        if connected(&door.client) {
            while let Some(message) = requests.next().await {
                take(&mut answering, &slots, &door, message).await;
            }
        }
        while answering.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            "NATS ingest requests still unanswered after the stop grace period: their producers get no answer and retry"
        );
    }
    // The connection is the door's alone: its last answers flushed, closed.
    if connected(&door.client)
        && let Err(err) = close(&door.client, CLOSE_TIMEOUT).await
    {
        tracing::warn!(error = %err, "cannot close the NATS door's connection cleanly");
    }
}

/// Answers `message` on a task of its own, once a slot is free.
async fn take(
    answering: &mut JoinSet<()>,
    slots: &Arc<Semaphore>,
    door: &Arc<Door>,
    message: async_nats::Message,
) {
    let Ok(slot) = slots.clone().acquire_owned().await else {
        return;
    };
    while answering.try_join_next().is_some() {}
    let door = door.clone();
    answering.spawn(async move {
        door.answer(message).await;
        drop(slot);
    });
}

impl Door {
    async fn answer(&self, message: async_nats::Message) {
        let began = Instant::now();
        let span = tracing::info_span!(
            "ingest",
            door = NATS_DOOR,
            table = tracing::field::Empty,
            tenant = tracing::field::Empty,
            unit = tracing::field::Empty
        );
        let result = match &message.reply {
            Some(_) => self.handle(&message).instrument(span.clone()).await,
            // A publish has no one to answer: its rows are not stored, since
            // the producer could never learn whether they were.
            None => Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "a publish without a reply subject: send rows as a request; nothing was stored",
            )),
        };
        let status = self.front_door.record(NATS_DOOR, began, &span, &result);
        let Some(reply) = message.reply else { return };
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(STATUS_HEADER, status.as_u16().to_string());
        headers.insert("Content-Type", "application/json");
        let body = match &result {
            Ok(answer) => serde_json::to_vec(answer),
            Err(refusal) => {
                if let Some(seconds) = refusal.retry_after() {
                    headers.insert("Retry-After", seconds.to_string());
                }
                serde_json::to_vec(refusal)
            }
        }
        .unwrap_or_else(|err| {
            serde_json::json!({ "error": err.to_string() })
                .to_string()
                .into_bytes()
        });
        if let Err(err) = self
            .client
            .publish_with_headers(reply, headers, body.into())
            .await
        {
            span.in_scope(|| tracing::warn!(error = %err, "cannot send a NATS ingest answer"));
        }
    }

    async fn handle(&self, message: &async_nats::Message) -> Result<Answer, Refusal> {
        let Some((tenant, table)) = self.names.parse_ingest(&message.subject) else {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                format!(
                    "`{}` is not an ingest subject: send to {}.ingest.<tenant>.<table>; nothing was stored",
                    message.subject,
                    self.names.prefix()
                ),
            ));
        };
        let span = tracing::Span::current();
        span.record("tenant", &*tenant);
        span.record("table", &*table);
        let gate = self.front_door.gate();
        if !gate.has_tenant(&tenant) {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                format!("no tenant `{tenant}` in the config; nothing was stored"),
            ));
        }
        let headers = http_headers(message.headers.as_ref())?;
        let _held = self
            .front_door
            .hold_received(&gate, &headers, message.payload.len())?;
        self.front_door
            .process(&gate, &tenant, &table, &headers, message.payload.clone())
            .await
    }
}

/// A request's NATS headers as the HTTP door reads them (names without
/// case).
fn http_headers(nats: Option<&async_nats::HeaderMap>) -> Result<HeaderMap, Refusal> {
    let mut headers = HeaderMap::new();
    for (name, values) in nats.into_iter().flat_map(async_nats::HeaderMap::iter) {
        let text: &str = name.as_ref();
        let invalid = || {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("header `{text}` is not a valid HTTP header; nothing was stored"),
            )
        };
        let name = HeaderName::from_bytes(text.as_bytes()).map_err(|_| invalid())?;
        for value in values {
            let value = HeaderValue::from_str(value.as_str()).map_err(|_| invalid())?;
            headers.append(name.clone(), value);
        }
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nats_headers_read_as_the_http_door_reads_them() {
        let mut nats = async_nats::HeaderMap::new();
        nats.insert("Idempotency-Key", "batch-1");
        nats.insert("content-encoding", "gzip");
        let headers = http_headers(Some(&nats)).unwrap();
        assert_eq!(headers["idempotency-key"], "batch-1");
        assert_eq!(headers["Content-Encoding"], "gzip");
        assert!(http_headers(None).unwrap().is_empty());
    }
}
