//! A weir sink that publishes each row to a NATS subject made from its
//! tenant, table and payload fields, through the host's own connection
//! (`grants.nats`). The host sends a row's message once the row is
//! delivered, waits for its PubAck before acking the row, and gives it a
//! `Nats-Msg-Id` from the row's partition stream and sequence: a JetStream
//! stream whose `duplicate_window` covers an outage stores each row once.
//!
//! Settings (unknown keys are refused):
//!
//! | key            | type    | default | meaning                                                         |
//! |----------------|---------|---------|-----------------------------------------------------------------|
//! | `subject`      | string  | —       | subject template: `audit.{tenant}.{table}`, `orders.{customer.id}` |
//! | `headers`      | table   | none    | headers added to every message, name → value                    |
//! | `keep_headers` | bool    | `true`  | send the row's own headers with its message (not `Nats-…`: the host's) |
//! | `payload`      | string  | none    | send this field of the payload instead of the whole row          |
//!
//! In `subject`, `{tenant}` and `{table}` are the row's; any other
//! `{field}` is a field of its JSON payload: dotted keys (`customer.id`,
//! `items.0`) or a JSON pointer (`/a.b/c`). A string field gives its text,
//! a number or a boolean its JSON; a payload that is not a JSON object, or
//! lacks a field, or whose field is null, an object or an array, is
//! dead-lettered naming the field. So is a row whose subject comes out
//! invalid (a value holding a space, `*` or `>`, or empty; one holding
//! `.` spans several tokens), and one the host
//! refuses (a subject outside `grants.nats.publish`, a message larger
//! than the server takes), with the host's reason.
//!
//! `payload`: a string field is sent as its text, any other value as its
//! JSON; without it, the row's payload is sent as it is.
//!
//! Counter: `messages_published` (messages handed to the host; it sends
//! them once their rows are delivered).

use std::collections::BTreeMap;

use serde::Deserialize;
use weir_plugin::{Deliveries, Delivery, Row, Rows, Sink};

use weir_json::fields::{Field, Payload as Object};
use weir_json::template::Template;

/// The names a subject fills itself: `{tenant}` and `{table}`.
const NAMES: &[&str] = &["tenant", "table"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    subject: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default = "yes")]
    keep_headers: bool,
    #[serde(default)]
    payload: Option<String>,
}

fn yes() -> bool {
    true
}

/// The settings made into what each row needs.
#[derive(Debug)]
struct Plan {
    subject: Template,
    headers: Vec<(String, String)>,
    keep_headers: bool,
    payload: Option<(String, Field)>,
    /// Whether a row's payload must be read as JSON.
    reads_payload: bool,
}

/// One row's message.
#[derive(Debug, PartialEq, Eq)]
struct Message {
    subject: String,
    headers: Vec<(String, String)>,
    payload: Vec<u8>,
}

impl Plan {
    fn new(settings: Settings) -> Result<Plan, String> {
        let subject = Template::parse(&settings.subject, "nats sink: subject", NAMES)?;
        let payload = match settings.payload {
            Some(spec) => {
                let field = Field::parse(&spec).map_err(|e| format!("nats sink: payload: {e}"))?;
                Some((spec, field))
            }
            None => None,
        };
        for name in settings.headers.keys() {
            if name.is_empty() || name.contains(':') || !name.chars().all(|c| c.is_ascii_graphic())
            {
                return Err(format!(
                    "nats sink: headers: `{name}` is not a header name (printable ASCII without `:`)"
                ));
            }
        }
        let reads_payload = payload.is_some() || subject.reads_payload();
        Ok(Plan {
            subject,
            headers: settings.headers.into_iter().collect(),
            keep_headers: settings.keep_headers,
            payload,
            reads_payload,
        })
    }

    /// The message of `row`, or why it has none (its dead letter's reason).
    fn message(&self, row: &Row) -> Result<Message, String> {
        let object = if self.reads_payload {
            Some(Object::parse(row.payload).map_err(|e| format!("nats sink: {e}"))?)
        } else {
            None
        };
        let named = |index: usize| if index == 0 { row.tenant } else { row.table };
        let subject = self
            .subject
            .render(named, object.as_ref())
            .map_err(|e| format!("nats sink: {e}"))?;
        if let Some(problem) = subject_problem(&subject) {
            return Err(format!("nats sink: the subject `{subject}` {problem}"));
        }
        let mut headers = Vec::new();
        if self.keep_headers {
            headers.extend(row.headers().map(|(n, v)| (n.to_string(), v.to_string())));
        }
        headers.extend(self.headers.iter().cloned());
        let payload = match (&self.payload, &object) {
            (Some((spec, field)), Some(object)) => {
                let value = field
                    .get(object)
                    .ok_or_else(|| format!("nats sink: the payload has no field `{spec}`"))?;
                match serde_json::from_str::<String>(value.get()) {
                    Ok(text) => text.into_bytes(),
                    Err(_) => value.get().as_bytes().to_vec(),
                }
            }
            _ => row.payload.to_vec(),
        };
        Ok(Message {
            subject,
            headers,
            payload,
        })
    }
}

/// Why `subject` is not one to publish to.
fn subject_problem(subject: &str) -> Option<&'static str> {
    if subject.is_empty() {
        return Some("is empty");
    }
    for token in subject.split('.') {
        if token.is_empty() {
            return Some("has an empty token (a leading, trailing or doubled `.`)");
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Some("holds whitespace");
        }
        if token.contains('*') || token.contains('>') {
            return Some("holds a wildcard (`*` or `>`)");
        }
    }
    None
}

struct NatsSink {
    plan: Plan,
}

impl Sink for NatsSink {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Settings = weir_plugin::settings(&settings)?;
        Ok(NatsSink {
            plan: Plan::new(settings)?,
        })
    }

    fn deliver(&mut self, rows: &Rows, out: &mut Deliveries) {
        out.extend(publish(&self.plan, rows));
    }
}

weir_plugin::export_sink!(NatsSink);

/// Publishes each row's message; what became of each row, in order.
fn publish(plan: &Plan, rows: &Rows) -> Vec<Delivery> {
    let mut published = 0;
    let outcomes = rows
        .iter()
        .enumerate()
        .map(|(index, row)| {
            let sent = plan.message(&row).and_then(|message| {
                weir_plugin::nats::publish(
                    index,
                    &message.subject,
                    &message.headers,
                    &message.payload,
                )
                .map_err(|reason| format!("nats sink: {reason}"))
            });
            match sent {
                Ok(()) => {
                    published += 1;
                    Delivery::Ok
                }
                Err(reason) => Delivery::DeadLetter(reason),
            }
        })
        .collect();
    if published > 0 {
        weir_plugin::counter("messages_published", published);
    }
    outcomes
}

#[cfg(test)]
mod tests;
