//! Dead letters: rows no pipeline could deliver, kept in their own stream
//! with the original payload and headers plus why, where and how often.

use std::borrow::Cow;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use futures::future::join_all;

use crate::route::Router;

/// Header names a dead letter carries. The original row's headers are kept
/// beside them unchanged.
pub mod headers {
    pub const TENANT: &str = "Weir-Tenant";
    pub const TABLE: &str = "Weir-Table";
    pub const REASON: &str = "Weir-Reason";
    pub const PLUGIN: &str = "Weir-Plugin";
    pub const PLUGIN_VERSION: &str = "Weir-Plugin-Version";
    pub const DELIVERIES: &str = "Weir-Deliveries";
    pub const SEQUENCE: &str = "Weir-Sequence";
}

/// Longest reason kept: a plugin's reason is its own text, so bound it.
const MAX_REASON_BYTES: usize = 1024;

/// One row on its way to the dead-letter stream.
#[derive(Debug)]
pub struct DeadLetter<'a> {
    pub tenant: Cow<'a, str>,
    pub table: Cow<'a, str>,
    pub reason: &'a str,
    /// Name and version of the plugin that gave up on the row, if one did.
    pub plugin: Option<(&'a str, &'a str)>,
    pub deliveries: i64,
    /// The row's sequence in its partition stream.
    pub stream: &'a str,
    pub sequence: u64,
    pub payload: Bytes,
    pub original_headers: Option<&'a HeaderMap>,
}

/// Writes dead letters and waits for JetStream to store them.
#[derive(Clone)]
pub struct DeadLetters {
    js: jetstream::Context,
    router: Router,
}

impl DeadLetters {
    pub fn new(js: jetstream::Context, router: Router) -> DeadLetters {
        DeadLetters { js, router }
    }

    /// Publishes every letter (pipelined); one result per letter, in order.
    /// A row may be acked only if its letter's result is `Ok`.
    pub async fn publish_all(&self, letters: Vec<DeadLetter<'_>>) -> Vec<Result<(), String>> {
        let sends = letters.into_iter().map(|letter| async move {
            let subject = self
                .router
                .dead_letter_subject(&letter.tenant, &letter.table);
            // Same id for the same row and delivery: a retried publish after a
            // lost PubAck is stored once.
            let message_id = format!(
                "{}:{}:{}",
                letter.stream, letter.sequence, letter.deliveries
            );
            let message = PublishMessage::build()
                .payload(letter.payload.clone())
                .headers(letter_headers(&letter))
                .message_id(message_id);
            let ack = self
                .js
                .send_publish(subject, message)
                .await
                .map_err(|err| err.to_string())?;
            ack.await.map(|_| ()).map_err(|err| err.to_string())
        });
        join_all(sends).await
    }
}

fn letter_headers(letter: &DeadLetter<'_>) -> HeaderMap {
    let mut headers = letter.original_headers.cloned().unwrap_or_default();
    headers.insert(headers::TENANT, letter.tenant.as_ref());
    headers.insert(headers::TABLE, letter.table.as_ref());
    headers.insert(headers::REASON, header_safe(letter.reason).as_str());
    if let Some((plugin, version)) = letter.plugin {
        headers.insert(headers::PLUGIN, plugin);
        headers.insert(headers::PLUGIN_VERSION, version);
    }
    headers.insert(headers::DELIVERIES, letter.deliveries.to_string().as_str());
    headers.insert(headers::SEQUENCE, letter.sequence.to_string().as_str());
    headers
}

/// A header value is one line: fold line breaks and bound its length.
fn header_safe(text: &str) -> String {
    let mut folded: String = text
        .chars()
        .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
        .collect();
    if folded.len() > MAX_REASON_BYTES {
        let mut cut = MAX_REASON_BYTES;
        while !folded.is_char_boundary(cut) {
            cut -= 1;
        }
        folded.truncate(cut);
    }
    folded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_become_one_bounded_line() {
        assert_eq!(header_safe("a\r\nb"), "a  b");
        assert_eq!(header_safe(&"é".repeat(1000)).len(), 1024);
    }
}
