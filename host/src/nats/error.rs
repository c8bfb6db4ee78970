//! Why a call to NATS failed, by cause: a caller can tell a server that did
//! not answer in time from one that refused, and either from a reply it
//! could not read.

use std::time::Duration;

use async_nats::jetstream::context::{PublishError as JsPublishError, PublishErrorKind};
use async_nats::jetstream::stream::{DeleteMessageError, DeleteMessageErrorKind};
use async_nats::{PublishError, RequestError, RequestErrorKind};

/// A failed JetStream API request, answer to a delivery, or close.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// Nobody answered within the client's request timeout (or the publish
    /// was not acknowledged in time).
    #[error("request timed out")]
    TimedOut,
    /// Nothing listens on the subject: no JetStream (or no stream) there.
    #[error("no responders")]
    NoResponders,
    /// The JetStream API answered with an error.
    #[error("{description} (error {err_code})")]
    Api {
        /// The HTTP-like status (404, 503, …).
        code: u16,
        /// JetStream's own error code (10014: consumer not found, …).
        err_code: u64,
        description: String,
    },
    /// The reply came but is not what the API sends.
    #[error("unreadable {what}: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The request could not be sent or its reply was lost (the connection).
    #[error(transparent)]
    Request(RequestError),
    /// A core publish could not be handed to the connection.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// A JetStream publish failed for another reason than the ones above.
    #[error(transparent)]
    JetStreamPublish(JsPublishError),
    /// Deleting a stored message failed on the way (the connection).
    #[error(transparent)]
    Delete(DeleteMessageError),
    /// The server answered but did not do it.
    #[error("the server did not {what}")]
    NotDone { what: &'static str },
    /// An answer was asked for a message that is no JetStream delivery.
    #[error("no reply subject: not a JetStream delivery")]
    NotADelivery,
    /// The connection could not start draining.
    #[error(transparent)]
    Drain(#[from] async_nats::client::DrainError),
    /// The connection drained but did not close in time.
    #[error("not closed within {within:?}")]
    NotClosed { within: Duration },
}

impl NatsError {
    /// Whether the server (or the connection to it) did not answer in time:
    /// worth trying again, unlike a refusal.
    pub fn is_timeout(&self) -> bool {
        matches!(self, NatsError::TimedOut)
    }
}

impl From<RequestError> for NatsError {
    fn from(err: RequestError) -> NatsError {
        match err.kind() {
            RequestErrorKind::TimedOut => NatsError::TimedOut,
            RequestErrorKind::NoResponders => NatsError::NoResponders,
            _ => NatsError::Request(err),
        }
    }
}

impl From<JsPublishError> for NatsError {
    fn from(err: JsPublishError) -> NatsError {
        let api = std::error::Error::source(&err)
            .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>());
        match (err.kind(), api) {
            (PublishErrorKind::TimedOut, _) => NatsError::TimedOut,
            // The server answered "no responders": no stream takes the subject.
            (PublishErrorKind::StreamNotFound, _) => NatsError::NoResponders,
            (_, Some(api)) => api_refusal(api),
            _ => NatsError::JetStreamPublish(err),
        }
    }
}

impl From<DeleteMessageError> for NatsError {
    fn from(err: DeleteMessageError) -> NatsError {
        match err.kind() {
            DeleteMessageErrorKind::TimedOut => NatsError::TimedOut,
            DeleteMessageErrorKind::JetStream(api) => api_refusal(&api),
            DeleteMessageErrorKind::Request => NatsError::Delete(err),
        }
    }
}

/// async-nats's form of the API's error, as ours.
fn api_refusal(api: &async_nats::jetstream::Error) -> NatsError {
    NatsError::Api {
        code: u16::try_from(api.code()).unwrap_or(u16::MAX),
        err_code: api.error_code().0,
        // async-nats keeps the description private; it serializes it.
        description: serde_json::to_value(api)
            .ok()
            .and_then(|value| Some(value.get("description")?.as_str()?.to_string()))
            .unwrap_or_default(),
    }
}

/// The error of a JetStream API reply, if it is one; a reply that is not
/// JSON is [`NatsError::Decode`].
pub fn reply_error(payload: &[u8]) -> Option<NatsError> {
    #[derive(serde::Deserialize)]
    struct Reply {
        error: Option<ApiError>,
    }
    #[derive(serde::Deserialize)]
    struct ApiError {
        #[serde(default)]
        code: u16,
        #[serde(default)]
        err_code: u64,
        #[serde(default)]
        description: String,
    }
    match serde_json::from_slice::<Reply>(payload) {
        Ok(Reply { error: Some(error) }) => Some(NatsError::Api {
            code: error.code,
            err_code: error.err_code,
            description: error.description,
        }),
        Ok(_) => None,
        Err(source) => Some(NatsError::Decode {
            what: "reply",
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_refusal_keeps_its_codes_and_text() {
        let reply = br#"{"type":"x","error":{"code":404,"err_code":10014,"description":"consumer not found"}}"#;
        match reply_error(reply) {
            Some(NatsError::Api {
                code: 404,
                err_code: 10014,
                ref description,
            }) if description == "consumer not found" => {}
            other => panic!("not the API's error: {other:?}"),
        }
        assert_eq!(
            reply_error(reply).map(|e| e.to_string()).as_deref(),
            Some("consumer not found (error 10014)")
        );
        assert!(reply_error(br#"{"type":"x"}"#).is_none());
        let unreadable = reply_error(b"nope").map(|e| e.to_string());
        assert!(unreadable.is_some_and(|e| e.starts_with("unreadable reply: ")));
    }
}
