//! Dead letters: rows no pipeline could deliver, kept in their own stream
//! with the original payload and headers plus why, where and how often.
//! This file writes them (settlement, before a row is acked); [`read`] is
//! the operator's side: listing them, replaying them after a fix, and
//! purging them (`weir dlq`, the status page).

use std::borrow::Cow;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use futures::future::join_all;

use crate::nats::NatsError;
use crate::nats::jetstream::is_nats_header;
use crate::topology::route::Names;

/// Header names a dead letter carries (shared with the front door, which
/// dead-letters bad lines).
pub use crate::topology::route::letter_headers as headers;
use crate::topology::route::letter_headers::{header_safe, redacted};

mod read;

pub use read::{LetterError, LetterFilter, Replayed, SinceError, StoredLetter, parse_since};

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
    router: Names,
}

impl DeadLetters {
    pub fn new(js: jetstream::Context, router: Names) -> DeadLetters {
        DeadLetters { js, router }
    }

    /// Publishes every letter (pipelined); one result per letter, in order.
    /// A row may be acked only if its letter's result is `Ok`.
    /// The values of `redact`'s top-level fields are replaced in each
    /// letter's payload (`[dead_letters] redact`).
    pub async fn publish_all(
        &self,
        letters: Vec<DeadLetter<'_>>,
        redact: &[String],
    ) -> Vec<Result<(), NatsError>> {
        let sends = letters.into_iter().map(|letter| async move {
            let subject = self
                .router
                .dead_letter_subject(&letter.tenant, &letter.table);
            // One id per row: a letter stored before a crash, whose row then
            // comes back with one more delivery, is not stored twice.
            let message_id = format!("{}:{}", letter.stream, letter.sequence);
            let message = PublishMessage::build()
                .payload(redacted(&letter.payload, redact))
                .headers(letter_headers(&letter))
                .message_id(message_id);
            let ack = self.js.send_publish(subject, message).await?;
            ack.await?;
            Ok(())
        });
        join_all(sends).await
    }
}

fn letter_headers(letter: &DeadLetter<'_>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    // The row's own headers, not those NATS acted on as it was stored and
    // delivered (the letter has its own message id).
    for (name, values) in letter.original_headers.iter().flat_map(|h| h.iter()) {
        if !is_nats_header(name.as_ref()) {
            for value in values {
                headers.append(name.clone(), value.as_str());
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_letter_keeps_the_rows_headers_but_not_those_nats_stored_it_with() {
        let mut original = HeaderMap::new();
        original.insert("trace", "t-1");
        original.insert("Nats-Msg-Id", "acme:7");
        original.insert("Nats-Batch-Id", "b-1");
        original.insert("Nats-Batch-Sequence", "3");
        original.insert("Nats-Expected-Stream", "weir_in_0");
        original.insert("Nats-Pin-Id", "pin");
        let letter = DeadLetter {
            tenant: "acme".into(),
            table: "orders".into(),
            reason: "no",
            plugin: None,
            deliveries: 1,
            stream: "weir_in_0",
            sequence: 7,
            payload: Bytes::new(),
            original_headers: Some(&original),
        };
        let headers = letter_headers(&letter);
        let names: Vec<String> = headers.iter().map(|(name, _)| name.to_string()).collect();
        assert_eq!(headers.get("trace").map(|v| v.as_str()), Some("t-1"));
        assert!(
            names
                .iter()
                .all(|name| !name.to_ascii_lowercase().starts_with("nats-")),
            "{names:?}"
        );
        assert_eq!(
            headers.get(headers::TENANT).map(|v| v.as_str()),
            Some("acme")
        );
    }

    #[test]
    fn reasons_become_one_bounded_line() {
        assert_eq!(header_safe("a\r\nb"), "a  b");
        assert_eq!(
            header_safe(&"é".repeat(5000)).len(),
            crate::topology::route::letter_headers::MAX_REASON_BYTES
        );
    }
}
