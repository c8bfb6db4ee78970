//! NATS subjects a sink publishes to through the host's own connection
//! (`grants.nats`). During a `deliver` call the sink's publishes are only
//! checked and buffered ([`PublishCall`]); once every input row has its
//! verdict, [`PublishStep::finish`] sends those of the rows delivered,
//! each with a `Nats-Msg-Id` from its row's partition stream, sequence and
//! index among the row's publishes, and waits for their PubAcks (or, on
//! core NATS, a flush) before the rows are acked. A publish that fails
//! makes the batch run again: the ids make a JetStream target drop the
//! copies of what it already stored.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::message::PublishMessage;
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;

use crate::config::{NatsGrant, subject_problem};
use crate::coordination::Lease;

use super::step::{Fenced, Finished};

/// How long the PubAcks (or the flush) of one batch may take before the
/// batch runs again.
const PUBLISH_WAIT: Duration = Duration::from_secs(10);
/// Publishes awaited at once: within the connection's in-flight limit.
const WINDOW: usize = 256;
/// What one call may buffer, payloads and headers together.
const MAX_CALL_BYTES: usize = 64 << 20;
/// A message's largest size when no server said (NATS's default).
const DEFAULT_MAX_PAYLOAD: usize = 1 << 20;

/// The host's connection, and the partition stream a unit's rows come
/// from (the first part of every message id).
#[derive(Clone)]
pub struct Publisher {
    js: jetstream::Context,
    stream: String,
}

impl Publisher {
    pub fn new(js: jetstream::Context, stream: String) -> Publisher {
        Publisher { js, stream }
    }
}

/// One message a call published, not sent yet.
#[derive(Debug)]
struct Output {
    /// The input row (index into the pipeline's batch) it belongs to.
    input: usize,
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
}

/// What one `deliver` call published (see the module).
pub struct PublishCall {
    grant: Arc<NatsGrant>,
    sink: String,
    /// Per row given to the call, its input row.
    origins: Vec<usize>,
    max_payload: usize,
    bytes: usize,
    outputs: Vec<Output>,
}

impl PublishCall {
    /// Checks one publish against the grant and buffers it.
    pub fn publish(
        &mut self,
        row: u32,
        subject: String,
        headers: Vec<(String, String)>,
        payload: Vec<u8>,
    ) -> Result<(), String> {
        let sink = &self.sink;
        let input = usize::try_from(row)
            .ok()
            .and_then(|row| self.origins.get(row).copied())
            .ok_or_else(|| {
                format!(
                    "sink `{sink}`: nats publish names row {row}, and the batch has {} rows",
                    self.origins.len()
                )
            })?;
        if let Some(problem) = subject_problem(&subject, false) {
            return Err(format!(
                "sink `{sink}`: `{subject}` is not a subject to publish to: it {problem}"
            ));
        }
        if !self.grant.allows(&subject) {
            return Err(format!(
                "sink `{sink}`: subject `{subject}` is not in its grants.nats.publish ({})",
                self.grant.publish.join(", ")
            ));
        }
        let mut map = HeaderMap::new();
        let mut size = subject.len() + payload.len();
        for (name, value) in &headers {
            let parsed: Result<HeaderName, _> = name.parse();
            let (Ok(parsed), Ok(value)) = (parsed, value.parse::<HeaderValue>()) else {
                return Err(format!(
                    "sink `{sink}`: the header `{}` is not a NATS header (a name of printable \
                     ASCII without `:`, a value without line breaks)",
                    name.escape_debug()
                ));
            };
            // NATS's own headers are the host's: a sink's message id would
            // defeat the host's, and a row's atomic-batch or expectation
            // headers (how weir stored it) would make every publish fail.
            if is_nats_header(name) {
                continue;
            }
            size += name.len() + value.as_str().len() + 4;
            map.append(parsed, value);
        }
        if size > self.max_payload {
            return Err(format!(
                "sink `{sink}`: a message of {size} bytes to `{subject}` is larger than the \
                 server takes ({} bytes)",
                self.max_payload
            ));
        }
        if self.bytes + size > MAX_CALL_BYTES {
            return Err(format!(
                "sink `{sink}`: one call publishes at most {MAX_CALL_BYTES} bytes"
            ));
        }
        self.bytes += size;
        self.outputs.push(Output {
            input,
            subject,
            headers: map,
            payload: Bytes::from(payload),
        });
        Ok(())
    }
}

/// `Nats-Msg-Id`, `Nats-Batch-Id`, `Nats-Expected-…`: headers JetStream acts on.
fn is_nats_header(name: &str) -> bool {
    name.get(..5)
        .is_some_and(|start| start.eq_ignore_ascii_case("nats-"))
}

/// A sink's publishes on one unit (see the module).
pub struct PublishStep {
    sink: String,
    grant: Arc<NatsGrant>,
    /// False for `weir plugin test`: publishes are checked, never sent.
    commits: bool,
    publisher: Option<Publisher>,
    /// This batch: each input row's sequence.
    sequences: Vec<u64>,
    call: Option<PublishCall>,
}

impl PublishStep {
    pub fn new(sink: &str, grant: NatsGrant, commits: bool) -> PublishStep {
        PublishStep {
            sink: sink.to_string(),
            grant: Arc::new(grant),
            commits,
            publisher: None,
            sequences: Vec::new(),
            call: None,
        }
    }

    /// Where the publishes go, and the stream their ids name.
    pub fn set_publisher(&mut self, publisher: Publisher) {
        self.publisher = Some(publisher);
    }

    /// For the sink's call on rows whose (input row, sequence) are `rows`,
    /// of a batch of `inputs` rows: the buffer its publishes go to.
    pub fn give(&mut self, inputs: usize, rows: impl Iterator<Item = (usize, u64)>) -> PublishCall {
        self.sequences.clear();
        self.sequences.resize(inputs, 0);
        let mut origins = Vec::new();
        for (input, sequence) in rows {
            if let Some(slot) = self.sequences.get_mut(input) {
                *slot = sequence;
            }
            origins.push(input);
        }
        let max_payload = self.publisher.as_ref().map_or(DEFAULT_MAX_PAYLOAD, |p| {
            p.js.client().server_info().max_payload
        });
        PublishCall {
            grant: self.grant.clone(),
            sink: self.sink.clone(),
            origins,
            max_payload: if max_payload == 0 {
                DEFAULT_MAX_PAYLOAD
            } else {
                max_payload
            },
            bytes: 0,
            outputs: Vec::new(),
        }
    }

    /// After the call: what it published, for [`PublishStep::finish`].
    pub fn took(&mut self, call: Option<PublishCall>) {
        self.call = call;
    }

    /// The call failed: nothing of it is sent.
    pub fn abandon(&mut self) {
        self.call = None;
    }

    /// Once the call's rows have their verdicts: sends the publishes of
    /// the input rows `delivered` (while `lease` holds) and waits for them.
    pub async fn finish(
        &mut self,
        delivered: impl Fn(usize) -> bool,
        lease: &Lease,
    ) -> Result<Finished, Fenced> {
        let Some(mut call) = self.call.take() else {
            return Ok(Finished::Committed);
        };
        let messages = ids(&call.outputs, &self.sequences, &delivered);
        if messages.is_empty() || !self.commits {
            return Ok(Finished::Committed);
        }
        let Some(publisher) = &self.publisher else {
            return Ok(Finished::Again(format!(
                "sink `{}`: no NATS connection to publish on",
                self.sink
            )));
        };
        if !lease.held() {
            return Err(Fenced(format!(
                "sink `{}`: the lease ran out before its publishes",
                self.sink
            )));
        }
        let sent = if self.grant.jetstream {
            send_jetstream(publisher, &mut call.outputs, messages).await
        } else {
            send_core(publisher, &mut call.outputs, messages).await
        };
        Ok(match sent {
            Ok(()) => Finished::Committed,
            Err(reason) => Finished::Again(format!("sink `{}`: {reason}", self.sink)),
        })
    }
}

/// The outputs of the rows `delivered`, each with its message id: the
/// partition stream (added when sent), the row's sequence and the
/// output's index among that row's publishes.
fn ids(
    outputs: &[Output],
    sequences: &[u64],
    delivered: &impl Fn(usize) -> bool,
) -> Vec<(usize, String)> {
    let mut counts: std::collections::HashMap<usize, u32> = Default::default();
    let mut messages = Vec::new();
    for (index, output) in outputs.iter().enumerate() {
        let count = counts.entry(output.input).or_insert(0);
        let nth = *count;
        *count += 1;
        if delivered(output.input) {
            let sequence = sequences.get(output.input).copied().unwrap_or(0);
            messages.push((index, format!("{sequence}:{nth}")));
        }
    }
    messages
}

fn message_id(publisher: &Publisher, id: &str) -> Option<HeaderValue> {
    format!("{}:{id}", publisher.stream).parse().ok()
}

/// Publishes each message to JetStream and waits for every PubAck.
async fn send_jetstream(
    publisher: &Publisher,
    outputs: &mut [Output],
    messages: Vec<(usize, String)>,
) -> Result<(), String> {
    for window in messages.chunks(WINDOW) {
        let mut acks = Vec::with_capacity(window.len());
        for (index, id) in window {
            let Some(output) = outputs.get_mut(*index) else {
                continue;
            };
            let mut headers = std::mem::take(&mut output.headers);
            if let Some(id) = message_id(publisher, id) {
                headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
            }
            let publish = PublishMessage::build()
                .headers(headers)
                .payload(std::mem::take(&mut output.payload));
            let ack = publisher
                .js
                .send_publish(output.subject.clone(), publish)
                .await
                .map_err(|err| format!("cannot publish to `{}`: {err}", output.subject))?;
            acks.push((output.subject.clone(), ack));
        }
        let waited = tokio::time::timeout(
            PUBLISH_WAIT,
            futures::future::join_all(acks.into_iter().map(|(subject, ack)| async move {
                ack.await
                    .map_err(|err| format!("no PubAck from `{subject}`: {err}"))
            })),
        )
        .await
        .map_err(|_| format!("no PubAck within {PUBLISH_WAIT:?}"))?;
        for ack in waited {
            ack?;
        }
    }
    Ok(())
}

/// Publishes each message on core NATS, then flushes the connection.
async fn send_core(
    publisher: &Publisher,
    outputs: &mut [Output],
    messages: Vec<(usize, String)>,
) -> Result<(), String> {
    let client = publisher.js.client();
    for (index, id) in &messages {
        let Some(output) = outputs.get_mut(*index) else {
            continue;
        };
        let mut headers = std::mem::take(&mut output.headers);
        if let Some(id) = message_id(publisher, id) {
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
        }
        client
            .publish_with_headers(
                output.subject.clone(),
                headers,
                std::mem::take(&mut output.payload),
            )
            .await
            .map_err(|err| format!("cannot publish to `{}`: {err}", output.subject))?;
    }
    tokio::time::timeout(PUBLISH_WAIT, client.flush())
        .await
        .map_err(|_| format!("the publishes were not flushed within {PUBLISH_WAIT:?}"))?
        .map_err(|err| format!("the publishes were not flushed: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> NatsGrant {
        NatsGrant {
            publish: vec!["audit.>".into(), "one.*.x".into()],
            jetstream: true,
        }
    }

    fn call() -> PublishCall {
        let mut step = PublishStep::new("s", grant(), false);
        step.give(4, [(1, 11), (3, 33), (3, 33)].into_iter())
    }

    #[test]
    fn publishes_are_checked_against_the_grant() {
        let mut call = call();
        assert_eq!(
            call.publish(0, "audit.a.b".into(), vec![], b"x".to_vec()),
            Ok(())
        );
        assert_eq!(call.publish(2, "one.t.x".into(), vec![], vec![]), Ok(()));
        let refused = call
            .publish(0, "other.a".into(), vec![], vec![])
            .unwrap_err();
        assert!(
            refused.contains("not in its grants.nats.publish (audit.>, one.*.x)"),
            "{refused}"
        );
        for bad in ["audit.*", "audit.>", "audit..a", "audit. a", ""] {
            assert!(
                call.publish(0, bad.into(), vec![], vec![]).is_err(),
                "{bad:?}"
            );
        }
        assert!(
            call.publish(3, "audit.a".into(), vec![], vec![])
                .unwrap_err()
                .contains("row 3")
        );
        let header = call
            .publish(
                0,
                "audit.a".into(),
                vec![("a:b".into(), "v".into())],
                vec![],
            )
            .unwrap_err();
        assert!(header.contains("not a NATS header"), "{header}");
        assert!(
            call.publish(
                0,
                "audit.a".into(),
                vec![("k".into(), "a\r\nb".into())],
                vec![]
            )
            .is_err()
        );
        let big = call
            .publish(0, "audit.a".into(), vec![], vec![0; DEFAULT_MAX_PAYLOAD])
            .unwrap_err();
        assert!(big.contains("larger than the server takes"), "{big}");
        assert_eq!(call.outputs.len(), 2);
    }

    #[test]
    fn ids_count_each_input_rows_publishes_and_skip_rows_not_delivered() {
        let mut step = PublishStep::new("s", grant(), false);
        // Sink rows 1 and 2 are two rows a transform made of input row 3.
        let mut call = step.give(4, [(1, 11), (3, 33), (3, 33)].into_iter());
        for row in [0, 1, 2, 1, 0] {
            call.publish(
                row,
                "audit.x".into(),
                vec![
                    ("Nats-Msg-Id".into(), "mine".into()),
                    ("nats-batch-id".into(), "b".into()),
                    ("trace".into(), "t".into()),
                ],
                vec![],
            )
            .unwrap();
        }
        for output in &call.outputs {
            let names: Vec<&str> = output.headers.iter().map(|(n, _)| n.as_ref()).collect();
            assert_eq!(names, ["trace"], "NATS's own headers are the host's");
        }
        let all = ids(&call.outputs, &step.sequences, &|_| true);
        let ids_only: Vec<&str> = all.iter().map(|(_, id)| id.as_str()).collect();
        assert_eq!(ids_only, ["11:0", "33:0", "33:1", "33:2", "11:1"]);
        let some = ids(&call.outputs, &step.sequences, &|input| input == 3);
        assert_eq!(
            some.iter().map(|(index, _)| *index).collect::<Vec<_>>(),
            [1, 2, 3]
        );
    }
}
