//! JetStream API requests async-nats does not offer (starting a unit
//! consumer afresh, a consumer's ack floor), reading any API reply's error,
//! and which headers are the server's own.

use async_nats::Client;
use async_nats::jetstream::consumer::IntoConsumerConfig;
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

/// Whether header `name` is one the server adds as it delivers a message
/// (the pin of a priority group, which unit consumers made before weir
/// dropped pins still stamp), not part of the stored row: plugins, dead
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

/// JetStream's error code for a consumer that does not exist.
const CONSUMER_NOT_FOUND: u64 = 10014;

/// Deletes a unit consumer and creates it again with `config`: every pull
/// request waiting on the old one ends (nothing more reaches it), and the
/// new one hands out every row not acked yet, oldest first (partitions are
/// work-queue streams: an acked row is gone, an unacked one stays). A
/// consumer already gone is created (a claimer that died between the two).
pub async fn start_afresh(
    client: &Client,
    stream: &str,
    config: &async_nats::jetstream::consumer::pull::Config,
) -> Result<(), NatsError> {
    let name = config.durable_name.clone().unwrap_or_default();
    let delete = format!("$JS.API.CONSUMER.DELETE.{stream}.{name}");
    match request(client, delete, Bytes::new()).await {
        Ok(_) => {}
        Err(NatsError::Api { err_code, .. }) if err_code == CONSUMER_NOT_FOUND => {}
        Err(err) => return Err(err),
    }
    let create = match config.filter_subject.as_str() {
        "" => format!("$JS.API.CONSUMER.CREATE.{stream}.{name}"),
        filter => format!("$JS.API.CONSUMER.CREATE.{stream}.{name}.{filter}"),
    };
    let body = serde_json::json!({
        "stream_name": stream,
        "config": config.clone().into_consumer_config(),
        "action": "create",
    });
    request(client, create, body.to_string().into())
        .await
        .map(drop)
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
