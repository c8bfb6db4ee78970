//! JetStream API requests async-nats does not offer (unpinning a priority
//! group, a consumer's last delivery), reading any API reply's error, and the names the server adds to
//! every unit: its priority group and the header it stamps on deliveries.

use async_nats::Client;

/// The priority group every unit consumer has.
pub const PIN_GROUP: &str = "weir";

/// Whether header `name` is one the server adds as it delivers a message
/// (the pin of a priority group), not part of the stored row: plugins, dead
/// letters and replays never see it.
pub fn is_delivery_header(name: &str) -> bool {
    name.eq_ignore_ascii_case(async_nats::header::NATS_PIN_ID.as_ref())
}

/// Releases a unit consumer's pin: a waiting pull of another client is
/// served at once.
pub async fn unpin(client: &Client, stream: &str, consumer: &str) -> Result<(), String> {
    let subject = format!("$JS.API.CONSUMER.UNPIN.{stream}.{consumer}");
    let body = serde_json::json!({ "group": PIN_GROUP }).to_string();
    let reply = client
        .request(subject, body.into())
        .await
        .map_err(|err| err.to_string())?;
    api_error(&reply.payload).map_or(Ok(()), Err)
}

/// The consumer sequence of a consumer's last delivery (0: none yet), as
/// the ack subject of each delivered row carries it.
pub async fn last_delivery(client: &Client, stream: &str, consumer: &str) -> Result<u64, String> {
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
    let info: Info = serde_json::from_slice(&payload)
        .map_err(|err| format!("unreadable consumer info: {err}"))?;
    Ok(info.delivered.map_or(0, |d| d.consumer_seq))
}

/// A consumer's info reply, an API error as the error: callers read only
/// the fields they need from it.
pub async fn consumer_info(
    client: &Client,
    stream: &str,
    consumer: &str,
) -> Result<bytes::Bytes, String> {
    let subject = format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}");
    let reply = client
        .request(subject, "".into())
        .await
        .map_err(|err| err.to_string())?;
    match api_error(&reply.payload) {
        Some(error) => Err(error),
        None => Ok(reply.payload),
    }
}

/// The error of a JetStream API reply, if it is one.
pub fn api_error(payload: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Reply {
        error: Option<ApiError>,
    }
    #[derive(serde::Deserialize)]
    struct ApiError {
        #[serde(default)]
        err_code: u64,
        #[serde(default)]
        description: String,
    }
    match serde_json::from_slice::<Reply>(payload) {
        Ok(Reply { error: Some(error) }) => {
            Some(format!("{} (error {})", error.description, error.err_code))
        }
        Ok(_) => None,
        Err(err) => Some(format!("unreadable reply: {err}")),
    }
}
