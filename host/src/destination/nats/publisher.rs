//! What a sink publishes during one `deliver` call (`grants.nats`): each
//! publish is checked against the grant and the server's size limit when
//! the sink makes it, so a refusal reaches the plugin, and only buffered
//! ([`PublishCall`]); the step (`nats::publish`) sends them once the rows have
//! their verdicts, through the host's connection ([`Publisher`]).

use std::sync::Arc;

use async_nats::jetstream;
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;

use crate::config::{NatsGrant, subject_problem};

/// What one call may buffer, payloads and headers together.
const MAX_CALL_BYTES: usize = 64 << 20;
/// A message's largest size when no server said (NATS's default).
pub(super) const DEFAULT_MAX_PAYLOAD: usize = 1 << 20;

/// The host's connection, and the partition stream a unit's rows come
/// from (the first part of every message id).
#[derive(Clone)]
pub struct Publisher {
    pub(super) js: jetstream::Context,
    pub(super) stream: String,
}

impl Publisher {
    pub fn new(js: jetstream::Context, stream: String) -> Publisher {
        Publisher { js, stream }
    }
}

/// One message a call published, not sent yet (its fields are the step's
/// to send).
#[derive(Debug)]
pub(super) struct Output {
    /// The input row (index into the pipeline's batch) it belongs to.
    pub(super) input: usize,
    pub(super) subject: String,
    pub(super) headers: HeaderMap,
    pub(super) payload: Bytes,
}

/// What one `deliver` call published (see the module). The step beside it
/// makes one per call and sends what it holds.
pub struct PublishCall {
    pub(super) grant: Arc<NatsGrant>,
    pub(super) sink: String,
    /// Per row given to the call, its input row.
    pub(super) origins: Vec<usize>,
    pub(super) max_payload: usize,
    pub(super) bytes: usize,
    pub(super) outputs: Vec<Output>,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> NatsGrant {
        NatsGrant {
            publish: vec!["audit.>".into(), "one.*.x".into()],
            jetstream: true,
        }
    }

    /// What `PublishStep::give` hands a call on input rows 1, 3 and 3 with
    /// no server to say its limit.
    fn call() -> PublishCall {
        PublishCall {
            grant: Arc::new(grant()),
            sink: "s".into(),
            origins: vec![1, 3, 3],
            max_payload: DEFAULT_MAX_PAYLOAD,
            bytes: 0,
            outputs: Vec::new(),
        }
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
}
