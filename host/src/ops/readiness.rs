//! Whether this host can store a row now, as `/readyz` answers it: NATS
//! connected, the server answering within a bound (a frozen server keeps
//! the client "connected" for as long as its pings allow), JetStream
//! answering, and the topology as the config requires it.
//!
//! Two probes, so that readiness costs no JetStream request per second: an
//! echo (a request to a subject nobody serves, answered by the server) every
//! `PROBE_EVERY`, which a frozen or dead server fails within
//! `ANSWER_BOUND`; and the first partition stream's info every
//! `JETSTREAM_PROBE_EVERY`, which says JetStream is there and serves the
//! stream (a refusal shows at once; silence within that period plus the
//! bound).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::RequestErrorKind;
use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::delivery::worker::Behind;
use crate::topology::route::Names;

/// How often the echo probe goes through the server.
pub const PROBE_EVERY: Duration = Duration::from_millis(200);
/// How long since the server last answered before the host is not ready: a
/// frozen or partitioned server shows up within this bound plus one probe.
pub const ANSWER_BOUND: Duration = Duration::from_secs(1);
/// How often JetStream itself is asked (one stream info): 0.2 requests/s
/// per host, where one every `PROBE_EVERY` was 5/s.
pub const JETSTREAM_PROBE_EVERY: Duration = Duration::from_secs(5);

/// How long a host may be behind the fleet's plugin versions before it is
/// not ready: a push switches every host within moments, which should not
/// take a host out of a load balancer.
pub const BEHIND_GRACE: Duration = Duration::from_secs(2);

/// What the probe and the topology checks saw last; shared with `/readyz`.
#[derive(Clone)]
pub struct Readiness {
    client: async_nats::Client,
    seen: Arc<Mutex<Seen>>,
    /// Why this host's plugin versions are not the fleet's, if they are not
    /// (its budget and router policies answer the front door).
    behind: Arc<Mutex<Option<Behind>>>,
}

struct Seen {
    /// When the server last answered the echo probe.
    answered: Instant,
    /// When JetStream last answered its probe (with anything).
    jetstream_answered: Instant,
    /// Why its last answer was a refusal (no JetStream, no stream…).
    refused: Option<String>,
    /// Required topology differences found by the last verification.
    topology: Vec<String>,
    /// Since when this host has been behind the fleet's plugin versions.
    behind_since: Option<Instant>,
}

impl Readiness {
    /// Ready as of now: the host has just connected and verified NATS.
    pub fn new(client: async_nats::Client) -> Readiness {
        Readiness {
            client,
            seen: Arc::new(Mutex::new(Seen {
                answered: Instant::now(),
                jetstream_answered: Instant::now(),
                refused: None,
                topology: Vec::new(),
                behind_since: None,
            })),
            behind: Arc::default(),
        }
    }

    /// Not ready while this host has run other plugin versions than the
    /// fleet's for longer than [`BEHIND_GRACE`].
    pub fn follow_fleet(&self, behind: Behind) {
        if let Ok(mut slot) = self.behind.lock() {
            *slot = Some(behind);
        }
    }

    /// Why this host cannot store a row now; `None`: it can.
    pub fn not_ready_because(&self) -> Option<String> {
        let connected = self.client.connection_state() == async_nats::connection::State::Connected;
        let behind = self
            .behind
            .lock()
            .ok()
            .and_then(|behind| behind.as_ref().and_then(|behind| behind()));
        let Ok(mut seen) = self.seen.lock() else {
            return Some("readiness state unavailable".to_string());
        };
        let now = Instant::now();
        seen.behind_since = behind.as_ref().map(|_| seen.behind_since.unwrap_or(now));
        judge(connected, now, &seen).or_else(|| {
            let since = seen.behind_since?;
            (now.saturating_duration_since(since) > BEHIND_GRACE).then(|| {
                format!(
                    "behind the fleet's plugin versions for {} ms: {}",
                    now.saturating_duration_since(since).as_millis(),
                    behind.unwrap_or_default()
                )
            })
        })
    }

    /// Records the required topology differences of the last verification
    /// (empty: none).
    pub fn set_topology(&self, required: Vec<String>) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.topology = required;
        }
    }

    /// Runs both probes until `stop`: the echo every `PROBE_EVERY`, the
    /// stream info at once and then every `JETSTREAM_PROBE_EVERY`.
    pub async fn probe(self, router: Names, stop: CancellationToken) {
        tokio::join!(
            self.clone().echo(router.readiness_subject(), stop.clone()),
            self.jetstream(router, stop)
        );
    }

    /// The echo probe: a request to a subject nobody serves, which the
    /// server answers itself ("no responders") on this host's inbox, every
    /// `PROBE_EVERY` — a round trip through the server that asks JetStream
    /// nothing and needs only a publish to that subject. (A message to the
    /// host's own inbox needed a publish to `_INBOX`, which the printed
    /// permissions rightly do not give: a host on them was not ready.)
    async fn echo(self, subject: String, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(PROBE_EVERY) => {}
            }
            if self.client.connection_state() != async_nats::connection::State::Connected {
                continue;
            }
            let request = self.client.request(subject.clone(), Bytes::new());
            let answer = tokio::select! {
                _ = stop.cancelled() => return,
                answer = tokio::time::timeout(ANSWER_BOUND, request) => answer,
            };
            let answered = match answer {
                // Served after all: still a round trip.
                Ok(Ok(_)) => true,
                Ok(Err(err)) => err.kind() == RequestErrorKind::NoResponders,
                // No answer: `answered` grows old, which is the verdict.
                Err(_) => false,
            };
            if answered && let Ok(mut seen) = self.seen.lock() {
                seen.answered = Instant::now();
            }
        }
    }

    /// Asks JetStream for the first partition stream's info at once, then
    /// every `JETSTREAM_PROBE_EVERY` while it answers well, every
    /// `PROBE_EVERY` while it does not (so a host is ready again soon).
    async fn jetstream(self, router: Names, stop: CancellationToken) {
        let subject = format!("$JS.API.STREAM.INFO.{}", router.partition_stream(0));
        let mut pause = None;
        loop {
            if let Some(pause) = pause {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
            pause = Some(PROBE_EVERY);
            if self.client.connection_state() != async_nats::connection::State::Connected {
                continue;
            }
            let request = self.client.request(subject.clone(), Bytes::new());
            let answer = tokio::select! {
                _ = stop.cancelled() => return,
                answer = tokio::time::timeout(ANSWER_BOUND, request) => answer,
            };
            let refused = match answer {
                // No answer: `jetstream_answered` grows old, which is the verdict.
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
            if refused.is_none() {
                pause = Some(JETSTREAM_PROBE_EVERY);
            }
            if let Ok(mut seen) = self.seen.lock() {
                seen.jetstream_answered = Instant::now();
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
            "NATS has not answered a JetStream request nor an echo for {} ms (bound {} ms)",
            silent.as_millis(),
            ANSWER_BOUND.as_millis()
        ));
    }
    let jetstream_silent = now.saturating_duration_since(seen.jetstream_answered);
    if jetstream_silent > JETSTREAM_PROBE_EVERY + ANSWER_BOUND {
        return Some(format!(
            "NATS has not answered a JetStream request for {} ms (bound {} ms)",
            jetstream_silent.as_millis(),
            (JETSTREAM_PROBE_EVERY + ANSWER_BOUND).as_millis()
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
            jetstream_answered: answered,
            refused: None,
            topology: Vec::new(),
            behind_since: None,
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
        // The server echoes, JetStream has been silent past its probe's period.
        let mut stalled = seen(late);
        stalled.jetstream_answered = now;
        let later = now + JETSTREAM_PROBE_EVERY + ANSWER_BOUND + Duration::from_millis(1);
        stalled.answered = later;
        let reason = judge(true, later, &stalled).unwrap_or_default();
        assert!(
            reason.contains("has not answered a JetStream request for 6001 ms"),
            "{reason}"
        );
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
