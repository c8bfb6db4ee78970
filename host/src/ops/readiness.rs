//! Whether this host can store a row now, as `/readyz` answers it: NATS
//! connected, JetStream answering a cheap request within a bound (a frozen
//! server keeps the client "connected" for as long as its pings allow), and
//! the topology as the config requires it.
//!
//! A probe asks for the first partition stream's info every
//! `PROBE_EVERY`; the host is ready only while the last answer came within
//! `ANSWER_BOUND` and said the stream is there.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::RequestErrorKind;
use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::topology::route::Names;

/// How often the probe asks JetStream.
pub const PROBE_EVERY: Duration = Duration::from_millis(200);
/// How long since JetStream last answered before the host is not ready: a
/// frozen or partitioned server shows up within this bound plus one probe.
pub const ANSWER_BOUND: Duration = Duration::from_secs(1);

/// What the probe and the topology checks saw last; shared with `/readyz`.
#[derive(Clone)]
pub struct Readiness {
    client: async_nats::Client,
    seen: Arc<Mutex<Seen>>,
}

struct Seen {
    /// When JetStream last answered the probe (with anything).
    answered: Instant,
    /// Why its last answer was a refusal (no JetStream, no stream…).
    refused: Option<String>,
    /// Required topology differences found by the last verification.
    topology: Vec<String>,
}

impl Readiness {
    /// Ready as of now: the host has just connected and verified NATS.
    pub fn new(client: async_nats::Client) -> Readiness {
        Readiness {
            client,
            seen: Arc::new(Mutex::new(Seen {
                answered: Instant::now(),
                refused: None,
                topology: Vec::new(),
            })),
        }
    }

    /// Why this host cannot store a row now; `None`: it can.
    pub fn not_ready_because(&self) -> Option<String> {
        let connected = self.client.connection_state() == async_nats::connection::State::Connected;
        let Ok(seen) = self.seen.lock() else {
            return Some("readiness state unavailable".to_string());
        };
        judge(connected, Instant::now(), &seen)
    }

    /// Records the required topology differences of the last verification
    /// (empty: none).
    pub fn set_topology(&self, required: Vec<String>) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.topology = required;
        }
    }

    /// Asks JetStream for the first partition stream's info at once, then
    /// every `PROBE_EVERY` until `stop`.
    pub async fn probe(self, router: Names, stop: CancellationToken) {
        let subject = format!("$JS.API.STREAM.INFO.{}", router.partition_stream(0));
        let mut first = true;
        loop {
            if !std::mem::take(&mut first) {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(PROBE_EVERY) => {}
                }
            }
            if self.client.connection_state() != async_nats::connection::State::Connected {
                continue;
            }
            let request = self.client.request(subject.clone(), Bytes::new());
            let answer = tokio::select! {
                _ = stop.cancelled() => return,
                answer = tokio::time::timeout(ANSWER_BOUND, request) => answer,
            };
            let refused = match answer {
                // No answer: `answered` grows old, which is the verdict.
                Err(_) => continue,
                Ok(Ok(reply)) => refusal(&subject, &reply.payload),
                Ok(Err(err)) => match err.kind() {
                    RequestErrorKind::NoResponders => {
                        Some("JetStream is unavailable: no responders".to_string())
                    }
                    // Lost on the way (the connection), not an answer.
                    _ => continue,
                },
            };
            if let Ok(mut seen) = self.seen.lock() {
                seen.answered = Instant::now();
                seen.refused = refused;
            }
        }
    }
}

/// The JetStream API's error in a reply, if it is one.
fn refusal(subject: &str, payload: &[u8]) -> Option<String> {
    let reply: serde_json::Value = match serde_json::from_slice(payload) {
        Ok(reply) => reply,
        Err(err) => return Some(format!("JetStream answered something unreadable: {err}")),
    };
    let error = reply.get("error")?;
    let description = error
        .get("description")
        .and_then(|d| d.as_str())
        .unwrap_or("an error");
    Some(format!("JetStream refused `{subject}`: {description}"))
}

/// The verdict from what was seen, at `now`.
fn judge(connected: bool, now: Instant, seen: &Seen) -> Option<String> {
    if !connected {
        return Some("NATS is not connected".to_string());
    }
    let silent = now.saturating_duration_since(seen.answered);
    if silent > ANSWER_BOUND {
        return Some(format!(
            "NATS has not answered a JetStream request for {} ms (bound {} ms)",
            silent.as_millis(),
            ANSWER_BOUND.as_millis()
        ));
    }
    if let Some(refused) = &seen.refused {
        return Some(refused.clone());
    }
    if !seen.topology.is_empty() {
        return Some(format!("topology mismatch: {}", seen.topology.join("; ")));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(answered: Instant) -> Seen {
        Seen {
            answered,
            refused: None,
            topology: Vec::new(),
        }
    }

    #[test]
    fn a_jetstream_error_reply_is_a_refusal() {
        assert_eq!(
            refusal(
                "S",
                br#"{"type":"io.nats.jetstream.api.v1.stream_info_response","config":{}}"#
            ),
            None
        );
        assert_eq!(
            refusal(
                "S",
                br#"{"error":{"code":404,"err_code":10059,"description":"stream not found"}}"#
            )
            .as_deref(),
            Some("JetStream refused `S`: stream not found")
        );
        assert!(refusal("S", b"not json").is_some());
    }

    #[test]
    fn ready_only_while_connected_answering_and_matching() {
        let now = Instant::now();
        assert_eq!(judge(true, now, &seen(now)), None);
        assert_eq!(
            judge(false, now, &seen(now)).as_deref(),
            Some("NATS is not connected")
        );
        let late = now + ANSWER_BOUND + Duration::from_millis(300);
        let silent = judge(true, late, &seen(now)).unwrap_or_default();
        assert!(silent.contains("has not answered"), "{silent}");
        assert!(silent.contains("1300 ms"), "{silent}");
        let mut refused = seen(now);
        refused.refused = Some("JetStream is unavailable: stream weir_p0: no responders".into());
        assert!(
            judge(true, now, &refused)
                .unwrap_or_default()
                .contains("no responders")
        );
        let mut mismatch = seen(now);
        mismatch.topology = vec!["stream weir_p1: existence expected present, found absent".into()];
        let reason = judge(true, now, &mismatch).unwrap_or_default();
        assert!(
            reason.starts_with("topology mismatch: stream weir_p1"),
            "{reason}"
        );
    }
}
