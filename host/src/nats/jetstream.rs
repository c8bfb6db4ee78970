//! JetStream API requests async-nats does not offer (unpinning a priority
//! group, a consumer's last delivery), reading any API reply's error, and the names the server adds to
//! every unit: its priority group and the header it stamps on deliveries.

use async_nats::Client;
use bytes::Bytes;

use super::error::{NatsError, reply_error};

/// How long each attempt to create a stream or bucket waits for the server,
/// when hosts of a fleet started together race to create the same
/// replicated streams: a clustered server answers only some of several
/// concurrent creates of one stream, and the others time out while it is
/// being made (two of three hosts started at once on an empty 3-node
/// cluster failed to boot; `tests/it/cluster.rs`). Looking again finds it,
/// so the first wait is short; the later ones give a slow server time.
pub const CREATE_TIMEOUTS: [std::time::Duration; 3] = [
    std::time::Duration::from_secs(3),
    std::time::Duration::from_secs(10),
    std::time::Duration::from_secs(10),
];

/// The priority group every unit consumer has.
pub const PIN_GROUP: &str = "weir";

/// Whether header `name` is one the server adds as it delivers a message
/// (the pin of a priority group), not part of the stored row: plugins, dead
/// letters and replays never see it.
pub fn is_delivery_header(name: &str) -> bool {
    name.eq_ignore_ascii_case(async_nats::header::NATS_PIN_ID.as_ref())
}

/// Whether header `name` is NATS's own (`Nats-Msg-Id`, `Nats-Batch-…`,
/// `Nats-Expected-…`, the pin): JetStream acts on it when a message is
/// published, so a stored row's copy says how weir stored the row and must
/// not go along when the row is published elsewhere (an atomic batch's
/// headers make a publish to a stream without atomic publish fail).
pub fn is_nats_header(name: &str) -> bool {
    name.get(..5)
        .is_some_and(|start| start.eq_ignore_ascii_case("nats-"))
}

/// Releases a unit consumer's pin: a waiting pull of another client is
/// served at once.
pub async fn unpin(client: &Client, stream: &str, consumer: &str) -> Result<(), NatsError> {
    let subject = format!("$JS.API.CONSUMER.UNPIN.{stream}.{consumer}");
    let body = serde_json::json!({ "group": PIN_GROUP }).to_string();
    request(client, subject, body.into()).await.map(drop)
}

/// The consumer sequence of a consumer's last delivery (0: none yet), as
/// the ack subject of each delivered row carries it.
pub async fn last_delivery(
    client: &Client,
    stream: &str,
    consumer: &str,
) -> Result<u64, NatsError> {
    #[derive(serde::Deserialize)]
    struct Info {
        delivered: Option<Delivered>,
    }
    #[derive(serde::Deserialize)]
    struct Delivered {
        #[serde(default)]
        consumer_seq: u64,
    }
    let payload = consumer_info(client, stream, consumer).await?;
    let info: Info = decode("consumer info", &payload)?;
    Ok(info.delivered.map_or(0, |d| d.consumer_seq))
}

/// The stream sequence at and below which a consumer has every row acked
/// (0: none yet): rows there are never delivered again.
pub async fn ack_floor(client: &Client, stream: &str, consumer: &str) -> Result<u64, NatsError> {
    #[derive(serde::Deserialize)]
    struct Info {
        ack_floor: Option<Floor>,
    }
    #[derive(serde::Deserialize)]
    struct Floor {
        #[serde(default)]
        stream_seq: u64,
    }
    let payload = consumer_info(client, stream, consumer).await?;
    let info: Info = decode("consumer info", &payload)?;
    Ok(info.ack_floor.map_or(0, |f| f.stream_seq))
}

/// A consumer's info reply, an API error as the error: callers read only
/// the fields they need from it.
pub async fn consumer_info(
    client: &Client,
    stream: &str,
    consumer: &str,
) -> Result<Bytes, NatsError> {
    let subject = format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}");
    request(client, subject, Bytes::new()).await
}

/// One JetStream API request: its reply's payload, or why there is none
/// (timed out, no responders, the API's error).
pub async fn request(client: &Client, subject: String, body: Bytes) -> Result<Bytes, NatsError> {
    let reply = client.request(subject, body).await?;
    match reply_error(&reply.payload) {
        Some(error) => Err(error),
        None => Ok(reply.payload),
    }
}

/// A reply's payload read as `T`; `what` names it in the error.
pub fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    payload: &[u8],
) -> Result<T, NatsError> {
    serde_json::from_slice(payload).map_err(|source| NatsError::Decode { what, source })
}

/// The error of a JetStream API reply, if it is one, as text (for callers
/// that keep a reason as text; [`reply_error`] keeps its cause).
pub fn api_error(payload: &[u8]) -> Option<String> {
    reply_error(payload).map(|error| error.to_string())
}
