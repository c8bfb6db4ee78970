//! A weir transform that looks each row's key up against an HTTP service
//! and adds the answer to the row: the lookups of a batch are sent at
//! once ([`weir_plugin::http::fetch_all`]), so a batch waits for about
//! the slowest of them, not for their sum.
//!
//! Settings (unknown keys are refused):
//!
//! | key          | type    | default | meaning                                                          |
//! |--------------|---------|---------|------------------------------------------------------------------|
//! | `url`        | string  | —       | the lookup URL; `{key}` is replaced by the row's key, URL-encoded |
//! | `key_field`  | string  | —       | the top-level field holding the key (a string or a number)        |
//! | `into`       | string  | —       | the field the answer is written to (replaced if present)          |
//! | `timeout_ms` | integer | `1000`  | each lookup's bound (never past the call's deadline)              |
//! | `dedupe`     | bool    | `true`  | rows of a batch with the same key share one lookup                |
//!
//! The URL's `host:port` must be in the plugin's `grants.http`. A `200`
//! answer is added as JSON (a body that is not JSON as a string), a `404`
//! as `null`; a `429` or `5xx` retries the row after a second; any other
//! status, a refused request (the reason names `grants.http`), a timeout
//! or a failed connection dead-letters that row alone. A row that is not
//! a JSON object is dead-lettered; one without the key passes unchanged.
//! Counters: `lookups`, `rows_enriched`.

use serde::Deserialize;
use serde_json::{Map, Value};
use weir_plugin::http::{self, FetchError, FetchOptions, Request, Response};
use weir_plugin::{Outcomes, Row, Rows, Transform};

/// How long a row waits before a lookup the service could not answer now.
const RETRY_MS: u32 = 1_000;
/// How much of an unexpected answer's body is quoted in a dead letter.
const QUOTED_BODY_BYTES: usize = 200;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    url: String,
    key_field: String,
    into: String,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u32,
    #[serde(default = "default_dedupe")]
    dedupe: bool,
}

fn default_timeout_ms() -> u32 {
    1_000
}

fn default_dedupe() -> bool {
    true
}

struct Enrich {
    settings: Settings,
}

/// What became of a row before its lookup.
enum Prepared {
    /// Its object, and the index of its lookup among the batch's requests.
    Lookup(Map<String, Value>, usize),
    Unchanged,
    Invalid(String),
}

impl Enrich {
    fn prepare(&self, row: &Row<'_>, requests: &mut Vec<Request>) -> Prepared {
        let object: Map<String, Value> = match serde_json::from_slice(row.payload) {
            Ok(object) => object,
            Err(err) => return Prepared::Invalid(format!("enrich: not a JSON object: {err}")),
        };
        let key = match object.get(&self.settings.key_field) {
            Some(Value::String(key)) => key.clone(),
            Some(Value::Number(key)) => key.to_string(),
            None | Some(Value::Null) => return Prepared::Unchanged,
            Some(_) => {
                return Prepared::Invalid(format!(
                    "enrich: `{}` is neither a string nor a number",
                    self.settings.key_field
                ));
            }
        };
        let url = self.settings.url.replace("{key}", &encode(&key));
        requests.push(http::get(&url));
        Prepared::Lookup(object, requests.len() - 1)
    }

    /// Writes the row with its answer, or decides what else becomes of it.
    fn answer(
        &self,
        row: &Row<'_>,
        mut object: Map<String, Value>,
        request: &Request,
        result: Result<Response, FetchError>,
        out: &mut Outcomes,
    ) {
        let response = match result {
            Ok(response) => response,
            Err(err) => {
                out.dead_letter(format!(
                    "enrich: lookup of {} {}",
                    request.url,
                    http::reason(&err)
                ));
                return;
            }
        };
        let value = match response.status {
            200 => serde_json::from_slice(&response.body).unwrap_or_else(|_| {
                Value::String(String::from_utf8_lossy(&response.body).into_owned())
            }),
            404 => Value::Null,
            429 | 500..=599 => {
                out.retry(RETRY_MS);
                return;
            }
            status => {
                let body = String::from_utf8_lossy(&response.body);
                let quoted: String = body.chars().take(QUOTED_BODY_BYTES).collect();
                out.dead_letter(format!(
                    "enrich: {status} from {}: {}",
                    request.url,
                    quoted.trim()
                ));
                return;
            }
        };
        object.insert(self.settings.into.clone(), value);
        weir_plugin::counter("rows_enriched", 1);
        out.replace_with(row, |payload| {
            // A map of JSON values always serializes.
            let _ = serde_json::to_writer(payload, &object);
        });
    }
}

impl Transform for Enrich {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Settings = weir_plugin::settings(&settings)?;
        if !settings.url.starts_with("http://") && !settings.url.starts_with("https://") {
            return Err(format!(
                "url `{}` is not an http:// or https:// URL",
                settings.url
            ));
        }
        Ok(Enrich { settings })
    }

    fn transform(&mut self, rows: &Rows, out: &mut Outcomes) {
        let mut requests = Vec::new();
        let prepared: Vec<Prepared> = rows
            .iter()
            .map(|row| self.prepare(&row, &mut requests))
            .collect();
        let options = FetchOptions {
            timeout_ms: self.settings.timeout_ms,
            dedupe: self.settings.dedupe,
        };
        weir_plugin::counter("lookups", requests.len() as u64);
        let mut results: Vec<Option<Result<Response, FetchError>>> =
            http::fetch_all(&requests, options)
                .into_iter()
                .map(Some)
                .collect();
        for (row, prepared) in rows.iter().zip(prepared) {
            match prepared {
                Prepared::Unchanged => out.ok(),
                Prepared::Invalid(reason) => out.dead_letter(reason),
                Prepared::Lookup(object, index) => {
                    let result = results
                        .get_mut(index)
                        .and_then(Option::take)
                        .unwrap_or_else(|| Err(FetchError::Failed("no answer".into())));
                    self.answer(&row, object, &requests[index], result, out);
                }
            }
        }
    }
}

/// `key` with everything but URL-unreserved characters percent-encoded.
fn encode(key: &str) -> String {
    let mut encoded = String::with_capacity(key.len());
    for byte in key.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

weir_plugin::export_transform!(Enrich);

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin::RowData;
    use weir_plugin::transform::Outcome;

    fn enrich() -> Enrich {
        Enrich::init(
            r#"{"url":"http://lookup:8080/k/{key}","key_field":"id","into":"info"}"#.into(),
        )
        .expect("valid settings")
    }

    fn respond(status: u16, body: &str) -> Result<Response, FetchError> {
        Ok(Response {
            status,
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
        })
    }

    #[test]
    fn each_row_gets_its_own_answer_and_a_failure_stays_with_its_row() {
        http::respond_with(|request| match request.url.as_str() {
            "http://lookup:8080/k/1" => respond(200, r#"{"tier":"gold"}"#),
            "http://lookup:8080/k/a%20b" => respond(404, ""),
            "http://lookup:8080/k/3" => Err(FetchError::Timeout),
            "http://lookup:8080/k/4" => respond(503, "busy"),
            other => panic!("unexpected lookup {other}"),
        });
        let rows = [
            r#"{"id":1,"n":1}"#,
            r#"{"id":"a b"}"#,
            r#"{"id":3}"#,
            r#"{"id":4}"#,
            r#"{"other":5}"#,
            "not json",
        ]
        .map(RowData::new);
        let rows = Rows::pack(&rows);
        let mut out = Outcomes::with_capacity(rows.len());
        enrich().transform(&rows, &mut out);
        let decided = out.decided();
        let emitted = |index: usize| match &decided[index] {
            Outcome::Emit(rows) => String::from_utf8(rows[0].payload.clone()).unwrap(),
            other => panic!("row {index}: {other:?}"),
        };
        assert_eq!(emitted(0), r#"{"id":1,"n":1,"info":{"tier":"gold"}}"#);
        assert_eq!(emitted(1), r#"{"id":"a b","info":null}"#);
        assert_eq!(
            decided[2],
            Outcome::DeadLetter("enrich: lookup of http://lookup:8080/k/3 timed out".into())
        );
        assert_eq!(decided[3], Outcome::Retry(RETRY_MS));
        assert_eq!(decided[4], Outcome::Ok);
        assert!(
            matches!(&decided[5], Outcome::DeadLetter(reason) if reason.starts_with("enrich: not a JSON object")),
            "{:?}",
            decided[5]
        );
    }
}
