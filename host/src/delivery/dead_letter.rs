//! Dead letters: rows no pipeline could deliver, kept in their own stream
//! with the original payload and headers plus why, where and how often —
//! and the operator's side: listing them and replaying them after a fix.

use std::borrow::Cow;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use futures::future::join_all;

use crate::nats::jetstream::is_delivery_header;
use crate::topology::route::Router;

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
    let mut headers = HeaderMap::new();
    for (name, values) in letter.original_headers.iter().flat_map(|h| h.iter()) {
        if !is_delivery_header(name.as_ref()) {
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

/// Which dead letters `weir dlq list|replay` acts on.
#[derive(Debug, Clone, Default)]
pub struct LetterFilter {
    pub tenant: Option<String>,
    pub table: Option<String>,
    /// Dead-letter stream sequences; empty means all.
    pub sequences: Vec<u64>,
}

impl LetterFilter {
    fn matches(&self, letter: &StoredLetter) -> bool {
        self.tenant.as_ref().is_none_or(|t| *t == letter.tenant)
            && self.table.as_ref().is_none_or(|t| *t == letter.table)
            && (self.sequences.is_empty() || self.sequences.contains(&letter.sequence))
    }
}

/// A dead letter as stored, for an operator to look at.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StoredLetter {
    /// Its sequence in the dead-letter stream.
    pub sequence: u64,
    pub tenant: String,
    pub table: String,
    pub reason: String,
    pub plugin: Option<String>,
    pub plugin_version: Option<String>,
    pub deliveries: u64,
    /// The row's sequence in its partition stream when it died.
    pub row_sequence: u64,
    /// The original row (lossy UTF-8 for display).
    pub payload: String,
}

/// Why an operator command on dead letters failed.
#[derive(Debug, thiserror::Error)]
pub enum LetterError {
    #[error("cannot read the dead-letter stream `{stream}`: {reason}")]
    Read { stream: String, reason: String },
    #[error("cannot re-publish dead letter {sequence}: {reason}")]
    Replay { sequence: u64, reason: String },
    #[error("re-published dead letter {sequence} but cannot remove it: {reason}")]
    Remove { sequence: u64, reason: String },
}

/// How many dead letters one pull asks for while listing.
const LIST_BATCH: usize = 500;

impl DeadLetters {
    /// Every stored dead letter that passes `filter`, oldest first, with the
    /// message it was read from.
    pub async fn list(
        &self,
        filter: &LetterFilter,
    ) -> Result<Vec<(StoredLetter, jetstream::Message)>, LetterError> {
        use futures::StreamExt;
        let name = self.router.dead_letter_stream();
        let read_error = |reason: String| LetterError::Read {
            stream: name.clone(),
            reason,
        };
        let mut stream = self
            .js
            .get_stream(&name)
            .await
            .map_err(|e| read_error(e.to_string()))?;
        let total = stream
            .info()
            .await
            .map_err(|e| read_error(e.to_string()))?
            .state
            .messages;
        let reader = stream
            .create_consumer(jetstream::consumer::pull::Config {
                ack_policy: jetstream::consumer::AckPolicy::None,
                inactive_threshold: std::time::Duration::from_secs(30),
                ..Default::default()
            })
            .await
            .map_err(|e| read_error(e.to_string()))?;
        let mut found = Vec::new();
        let mut seen = 0u64;
        while seen < total {
            let mut batch = reader
                .fetch()
                .max_messages(LIST_BATCH)
                .expires(std::time::Duration::from_secs(1))
                .messages()
                .await
                .map_err(|e| read_error(e.to_string()))?;
            let mut got = 0;
            while let Some(message) = batch.next().await {
                let message = message.map_err(|e| read_error(e.to_string()))?;
                got += 1;
                let letter = stored_letter(&message);
                if filter.matches(&letter) {
                    found.push((letter, message));
                }
            }
            if got == 0 {
                break;
            }
            seen += got;
        }
        Ok(found)
    }

    /// Re-publishes each matching dead letter to its table's unit (with its
    /// original headers), then removes it from the dead-letter stream. A
    /// replay is idempotent within the duplicate window.
    pub async fn replay(&self, filter: &LetterFilter) -> Result<Vec<StoredLetter>, LetterError> {
        let letters = self.list(filter).await?;
        let dead_letter_stream = self
            .js
            .get_stream(self.router.dead_letter_stream())
            .await
            .map_err(|e| LetterError::Read {
                stream: self.router.dead_letter_stream(),
                reason: e.to_string(),
            })?;
        let mut replayed = Vec::with_capacity(letters.len());
        for (letter, message) in letters {
            let sequence = letter.sequence;
            let replay_error = |reason: String| LetterError::Replay { sequence, reason };
            let mut original = HeaderMap::new();
            if let Some(stored) = &message.headers {
                for (name, values) in stored.iter() {
                    if !name.to_string().starts_with("Weir-") && !is_delivery_header(name.as_ref())
                    {
                        for value in values {
                            original.append(name.to_string(), value.as_str());
                        }
                    }
                }
            }
            let unit = self.router.route(&letter.tenant, &letter.table);
            let publish = PublishMessage::build()
                .payload(message.payload.clone())
                .headers(original)
                .message_id(format!("weir-replay:{sequence}"));
            let ack = self
                .js
                .send_publish(
                    self.router.subject(unit, &letter.tenant, &letter.table),
                    publish,
                )
                .await
                .map_err(|e| replay_error(e.to_string()))?;
            ack.await.map_err(|e| replay_error(e.to_string()))?;
            dead_letter_stream
                .delete_message(sequence)
                .await
                .map_err(|e| LetterError::Remove {
                    sequence,
                    reason: e.to_string(),
                })?;
            replayed.push(letter);
        }
        Ok(replayed)
    }
}

fn stored_letter(message: &jetstream::Message) -> StoredLetter {
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.to_string())
    };
    let number = |name: &str| header(name).and_then(|v| v.parse().ok()).unwrap_or(0);
    StoredLetter {
        sequence: message.info().map_or(0, |info| info.stream_sequence),
        tenant: header(headers::TENANT).unwrap_or_default(),
        table: header(headers::TABLE).unwrap_or_default(),
        reason: header(headers::REASON).unwrap_or_default(),
        plugin: header(headers::PLUGIN),
        plugin_version: header(headers::PLUGIN_VERSION),
        deliveries: number(headers::DELIVERIES),
        row_sequence: number(headers::SEQUENCE),
        payload: String::from_utf8_lossy(&message.payload).into_owned(),
    }
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
