//! A sink's publishes on one unit (`grants.nats`): once every input row
//! has its verdict, [`PublishStep::finish`] sends those of the rows
//! delivered, each with a `Nats-Msg-Id` from its row's partition stream,
//! sequence and index among the row's publishes, and waits for their
//! PubAcks (or, on core NATS, a flush) before the rows are acked. A publish
//! that fails makes the batch run again: the ids make a JetStream target
//! drop the copies of what it already stored.

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderValue;
use async_nats::jetstream::message::PublishMessage;

use crate::config::NatsGrant;
use crate::destination::outcome::{Fenced, Finished};
use crate::fence::Fence;

use super::publisher::{DEFAULT_MAX_PAYLOAD, Output, PublishCall, Publisher};

/// How long the PubAcks (or the flush) of one batch may take before the
/// batch runs again.
const PUBLISH_WAIT: Duration = Duration::from_secs(10);
/// Publishes awaited at once: within the connection's in-flight limit.
const WINDOW: usize = 256;

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
        let origins = crate::destination::call_rows(inputs, rows, &mut self.sequences);
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
        lease: &dyn Fence,
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
