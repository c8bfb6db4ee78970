//! A weir sink that POSTs each batch as one NDJSON body to an HTTP endpoint through `wasi:http`.
//!
//! Settings (unknown keys are refused):
//!
//! | key         | type   | default | meaning                                                     |
//! |-------------|--------|---------|-------------------------------------------------------------|
//! | `url`       | string | —       | `http://` or `https://` URL the batches are POSTed to       |
//! | `headers`   | table  | `{}`    | extra request headers, name → value (not `idempotency-key`) |
//! | `key_field` | string | none    | field inserted first in each row's object: the row's key    |
//!
//! The host must grant the URL's `host:port` in the plugin's `grants.http`,
//! or the request is denied and the rows are dead-lettered.
//!
//! Every row of a batch shares the answer: 2xx delivers them; 5xx, 429 or a
//! transport error retries them (after `retry-after` seconds when the server
//! says so); any other status dead-letters them with the status and the
//! start of the response body. A payload containing a newline would break
//! the NDJSON framing, so that row alone is dead-lettered. Counter:
//! `rows_posted`.
//!
//! Replays: weir delivers a row again after a crash, a lost ack or a
//! takeover, so the endpoint may get it twice. A row's key,
//! `<tenant>/<table>/<sequence>`, is the same every time (the sequence is
//! the row's in its partition stream). With `key_field` set, each line is
//! the payload with `"<key_field>":"<key>"` inserted as its object's first
//! member (textually: the rest of the payload is sent as it came), so the
//! endpoint can drop a replayed row; a payload that is not a JSON object is
//! then dead-lettered. Every POST also carries `idempotency-key`: 32 hex
//! digits, the FNV-1a 64 ([`weir_plugin::stable_hash64`]) of its rows'
//! keys (each followed by `\n`), then that of its body, so an endpoint that
//! dedupes requests drops a retried identical batch (a retry may group rows
//! otherwise: then only the row keys tell). The body is in it because row
//! keys alone can meet again with other rows: a table a router moved to
//! another partition stream, or a stream made anew, numbers rows from
//! sequences already used.

use std::collections::BTreeMap;

use serde::Deserialize;
use wasi::http::outgoing_handler;
use wasi::http::types::{
    ErrorCode, Fields, IncomingResponse, Method, OutgoingBody, OutgoingRequest, Scheme,
};
use wasi::io::streams::StreamError;
use weir_plugin::{Deliveries, Delivery, Row, Rows, Sink};

/// How long the host waits before retrying rows the endpoint could not take.
const RETRY_MS: u32 = 500;
/// Longest `retry-after` honoured: a server cannot park rows for longer.
const MAX_RETRY_AFTER_MS: u32 = 300_000;
/// Largest write the `wasi:io` output stream is asked to take at once.
const CHUNK_BYTES: usize = 4096;
/// How much of an error response's body is quoted in a dead letter.
const QUOTED_BODY_BYTES: usize = 200;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    url: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    key_field: Option<String>,
}

/// The request header naming a batch; set by the sink, never by `headers`.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The settings, with the URL split into the parts a request is built from.
struct Target {
    url: String,
    scheme: Scheme,
    authority: String,
    path: String,
    headers: Vec<(String, Vec<u8>)>,
}

struct HttpSink {
    target: Target,
    /// `key_field` as a JSON string followed by `:`, if set.
    key_member: Option<String>,
}

impl Sink for HttpSink {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Settings = weir_plugin::settings(&settings)?;
        let (scheme, authority, path) = split_url(&settings.url)?;
        let headers = settings
            .headers
            .into_iter()
            .map(|(name, value)| (name.to_ascii_lowercase(), value.into_bytes()))
            .collect::<Vec<_>>();
        if headers.iter().any(|(name, _)| name == IDEMPOTENCY_KEY) {
            return Err(format!(
                "http-sink: `headers` cannot set `{IDEMPOTENCY_KEY}`: the sink sets it per batch"
            ));
        }
        let key_member = match settings.key_field.as_deref() {
            None => None,
            Some("") => return Err("http-sink: `key_field` must not be empty".to_string()),
            Some(field) => Some(key_member(field)),
        };
        // Refuse a bad header now, not on every batch.
        Fields::from_list(&headers)
            .map_err(|e| format!("http-sink: bad `headers` setting: {e:?}"))?;
        Ok(HttpSink {
            target: Target {
                url: settings.url,
                scheme,
                authority,
                path,
                headers,
            },
            key_member,
        })
    }

    fn deliver(&mut self, rows: &Rows, out: &mut Deliveries) {
        let batch = frame(rows, self.key_member.as_deref());
        // With nothing to post, no row takes this outcome.
        let outcome = if batch.posted == 0 {
            Delivery::Ok
        } else {
            post(&self.target, &batch.body, &batch.idempotency_key)
        };
        if batch.posted > 0 && outcome == Delivery::Ok {
            weir_plugin::counter("rows_posted", batch.posted);
        }
        for refusal in batch.refusals {
            match refusal {
                None => out.push(outcome.clone()),
                Some(reason) => out.dead_letter(reason),
            }
        }
    }
}

weir_plugin::export_sink!(HttpSink);

/// A batch's NDJSON body, and why each row was left out of it, if it was.
struct Framed {
    body: Vec<u8>,
    /// Per row, in order: `None` if it is in the body.
    refusals: Vec<Option<&'static str>>,
    posted: u64,
    /// The hex digests of the posted rows' keys and of the body.
    idempotency_key: String,
}

/// Frames the rows that can be sent as NDJSON lines, keyed if `key_member`
/// (`"field":`) is set. A payload with a newline would break the framing:
/// that row alone is dead-lettered, the others share the endpoint's answer.
fn frame(rows: &Rows, key_member: Option<&str>) -> Framed {
    let mut body = Vec::new();
    let mut refusals = Vec::with_capacity(rows.len());
    let mut keys = Vec::new();
    let mut posted = 0;
    for row in rows.iter() {
        let key = row_key(&row);
        let refusal = if row.payload.contains(&b'\n') {
            Some("http sink: payload contains a newline; not one NDJSON line")
        } else if let Some(member) = key_member {
            (!push_keyed(&mut body, row.payload, member, &key)).then_some(
                "http sink: payload is not a JSON object, so `key_field` cannot be added",
            )
        } else {
            body.extend_from_slice(row.payload);
            None
        };
        if refusal.is_none() {
            body.push(b'\n');
            keys.extend_from_slice(key.as_bytes());
            keys.push(b'\n');
            posted += 1;
        }
        refusals.push(refusal);
    }
    let idempotency_key = format!(
        "{:016x}{:016x}",
        weir_plugin::stable_hash64(&keys),
        weir_plugin::stable_hash64(&body)
    );
    Framed {
        body,
        refusals,
        posted,
        idempotency_key,
    }
}

/// `"field":`, escaped, to insert before a row's key.
fn key_member(field: &str) -> String {
    let mut member = Vec::new();
    push_json_string(&mut member, field);
    member.push(b':');
    String::from_utf8_lossy(&member).into_owned()
}

/// The row's key: the same on every delivery of it.
fn row_key(row: &Row<'_>) -> String {
    format!("{}/{}/{}", row.tenant, row.table, row.sequence)
}

/// Appends `payload` to `body` with `member` (`"field":`) and `key` (as a
/// JSON string) inserted as the first member of its object, without
/// parsing the rest; false, appending nothing, if the payload is not an
/// object (its first non-whitespace byte is not `{`).
fn push_keyed(body: &mut Vec<u8>, payload: &[u8], member: &str, key: &str) -> bool {
    let Some(open) = payload.iter().position(|b| !is_json_space(*b)) else {
        return false;
    };
    if payload[open] != b'{' {
        return false;
    }
    let rest = &payload[open + 1..];
    let empty = rest.iter().find(|b| !is_json_space(**b)) == Some(&b'}');
    body.extend_from_slice(&payload[..=open]);
    body.extend_from_slice(member.as_bytes());
    push_json_string(body, key);
    if !empty {
        body.push(b',');
    }
    body.extend_from_slice(rest);
    true
}

fn is_json_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// Appends `text` as a JSON string, quoted and escaped.
fn push_json_string(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    for c in text.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            c if u32::from(c) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", u32::from(c)).as_bytes());
            }
            c => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out.push(b'"');
}

/// `scheme://authority/path` → its parts; only http and https are accepted.
fn split_url(url: &str) -> Result<(Scheme, String, String), String> {
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("http://") {
        (Scheme::Http, rest)
    } else if let Some(rest) = url.strip_prefix("https://") {
        (Scheme::Https, rest)
    } else {
        return Err(format!(
            "http-sink: `url` {url:?} must start with http:// or https://"
        ));
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(at) if rest[at..].starts_with('/') => (&rest[..at], rest[at..].to_string()),
        Some(at) => (&rest[..at], format!("/{}", &rest[at..])),
        None => (rest, "/".to_string()),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(format!(
            "http-sink: `url` {url:?} needs a host (and no user info)"
        ));
    }
    Ok((scheme, authority.to_string(), path))
}

/// POSTs one NDJSON body and turns the answer into the batch's outcome.
fn post(target: &Target, body: &[u8], idempotency_key: &str) -> Delivery {
    match send(target, body, idempotency_key) {
        Ok(response) => judge(target, &response),
        Err(ErrorCode::HttpRequestDenied) => Delivery::DeadLetter(format!(
            "http sink: request to {} denied: not in grants.http",
            target.authority
        )),
        Err(error) => {
            weir_plugin::log::warn(&format!(
                "http-sink: POST {} failed: {error:?}; retrying in {RETRY_MS} ms",
                target.url
            ));
            Delivery::Retry(RETRY_MS)
        }
    }
}

/// Sends the request and waits for the response head.
fn send(
    target: &Target,
    body: &[u8],
    idempotency_key: &str,
) -> Result<IncomingResponse, ErrorCode> {
    let mut headers = target.headers.clone();
    headers.push((
        IDEMPOTENCY_KEY.to_string(),
        idempotency_key.as_bytes().to_vec(),
    ));
    headers.push(("content-type".to_string(), b"application/x-ndjson".to_vec()));
    headers.push((
        "content-length".to_string(),
        body.len().to_string().into_bytes(),
    ));
    let fields = Fields::from_list(&headers)
        .map_err(|e| ErrorCode::InternalError(Some(format!("headers: {e:?}"))))?;
    let request = OutgoingRequest::new(fields);
    let refused = |what: &str| ErrorCode::InternalError(Some(format!("cannot set the {what}")));
    request
        .set_method(&Method::Post)
        .map_err(|()| refused("method"))?;
    request
        .set_scheme(Some(&target.scheme))
        .map_err(|()| refused("scheme"))?;
    request
        .set_authority(Some(&target.authority))
        .map_err(|()| refused("authority"))?;
    request
        .set_path_with_query(Some(&target.path))
        .map_err(|()| refused("path"))?;
    let outgoing = request.body().map_err(|()| refused("body"))?;
    // The request goes out first: the host streams the body as it is written.
    let future = outgoing_handler::handle(request, None)?;

    let written = write_body(outgoing, body);
    future.subscribe().block();
    let response = match future.get() {
        Some(Ok(result)) => result?,
        Some(Err(())) => {
            return Err(ErrorCode::InternalError(Some(
                "response taken twice".into(),
            )));
        }
        None => return Err(ErrorCode::InternalError(Some("response not ready".into()))),
    };
    // A response that came although the body could not be sent is still the
    // server's answer (e.g. a 413 before reading it all).
    if let Err(error) = written {
        weir_plugin::log::debug(&format!("http-sink: body not fully sent: {error}"));
    }
    Ok(response)
}

/// Writes the whole body in chunks the stream accepts, then finishes it.
fn write_body(outgoing: OutgoingBody, body: &[u8]) -> Result<(), String> {
    {
        let stream = outgoing
            .write()
            .map_err(|()| "body stream taken twice".to_string())?;
        for chunk in body.chunks(CHUNK_BYTES) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| match e {
                    StreamError::Closed => "stream closed".to_string(),
                    StreamError::LastOperationFailed(e) => e.to_debug_string(),
                })?;
        }
        // The stream must be dropped before the body is finished.
    }
    OutgoingBody::finish(outgoing, None).map_err(|e| format!("{e:?}"))
}

/// The outcome of a batch given the endpoint's answer.
fn judge(target: &Target, response: &IncomingResponse) -> Delivery {
    let status = response.status();
    match status {
        200..=299 => Delivery::Ok,
        429 | 500..=599 => {
            let delay = retry_after_ms(response).unwrap_or(RETRY_MS);
            weir_plugin::log::info(&format!(
                "http-sink: {status} from {}; retrying in {delay} ms",
                target.url
            ));
            Delivery::Retry(delay)
        }
        _ => Delivery::DeadLetter(format!(
            "http sink: {status} from {}: {}",
            target.url,
            body_start(response)
        )),
    }
}

/// A `retry-after` given in seconds, in milliseconds (capped).
fn retry_after_ms(response: &IncomingResponse) -> Option<u32> {
    let values = response.headers().get("retry-after");
    let seconds: u64 = std::str::from_utf8(values.first()?)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(seconds.saturating_mul(1000).min(MAX_RETRY_AFTER_MS as u64) as u32)
}

/// The first bytes of the response body, as text, for a dead-letter reason.
fn body_start(response: &IncomingResponse) -> String {
    let Ok(body) = response.consume() else {
        return String::new();
    };
    let mut bytes = Vec::new();
    if let Ok(stream) = body.stream() {
        while bytes.len() < QUOTED_BODY_BYTES {
            match stream.blocking_read((QUOTED_BODY_BYTES - bytes.len()) as u64) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(_) => break,
            }
        }
    }
    bytes.truncate(QUOTED_BODY_BYTES);
    String::from_utf8_lossy(&bytes).trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin::RowData;

    #[test]
    fn splits_urls() {
        let (scheme, authority, path) = split_url("http://127.0.0.1:8123/ingest?x=1").unwrap();
        assert!(matches!(scheme, Scheme::Http));
        assert_eq!(authority, "127.0.0.1:8123");
        assert_eq!(path, "/ingest?x=1");
        let (_, authority, path) = split_url("https://api.example.com").unwrap();
        assert_eq!(
            (authority.as_str(), path.as_str()),
            ("api.example.com", "/")
        );
        assert!(split_url("ftp://x/").is_err());
        assert!(split_url("http:///x").is_err());
    }

    /// `payload` keyed `"id":"t/events/7"`, or None if refused.
    fn keyed(payload: &str) -> Option<String> {
        let mut body = Vec::new();
        push_keyed(
            &mut body,
            payload.as_bytes(),
            &key_member("id"),
            "t/events/7",
        )
        .then(|| String::from_utf8(body).unwrap())
    }

    #[test]
    fn inserts_the_key_first_in_the_object() {
        assert_eq!(keyed(r#"{"a":1}"#).unwrap(), r#"{"id":"t/events/7","a":1}"#);
        // The rest is sent as it came, spaces and all.
        assert_eq!(
            keyed(r#"{ "a" : [1, {"b":2}] }"#).unwrap(),
            r#"{"id":"t/events/7", "a" : [1, {"b":2}] }"#
        );
        // A field already named so is left alone: the endpoint sees both.
        assert_eq!(
            keyed(r#"{"id":3}"#).unwrap(),
            r#"{"id":"t/events/7","id":3}"#
        );
    }

    #[test]
    fn an_empty_object_gets_no_comma() {
        assert_eq!(keyed("{}").unwrap(), r#"{"id":"t/events/7"}"#);
        assert_eq!(keyed("{ \t }").unwrap(), "{\"id\":\"t/events/7\" \t }");
    }

    #[test]
    fn leading_whitespace_is_kept_before_the_object() {
        assert_eq!(
            keyed(" \t\r{\"a\":1}").unwrap(),
            " \t\r{\"id\":\"t/events/7\",\"a\":1}"
        );
        assert_eq!(keyed("  { }").unwrap(), r#"  {"id":"t/events/7" }"#);
    }

    #[test]
    fn refuses_what_is_not_an_object() {
        for payload in ["", "   ", "[1]", "\"x\"", "1", "null", " [{}]", "x{}"] {
            assert_eq!(keyed(payload), None, "{payload:?}");
        }
    }

    #[test]
    fn escapes_the_key_and_the_field() {
        let mut out = Vec::new();
        push_json_string(&mut out, "a\"b\\c/d\u{1}é");
        assert_eq!(String::from_utf8(out).unwrap(), r#""a\"b\\c/d\u0001é""#);
        assert_eq!(key_member(r#"my "id""#), r#""my \"id\"":"#);
        let row = RowData {
            tenant: r#"ac"me"#.into(),
            table: r"ev\ents".into(),
            sequence: 42,
            ..RowData::new("{}")
        };
        let rows = Rows::pack([&row]);
        let key = row_key(&rows.get(0).unwrap());
        assert_eq!(key, r#"ac"me/ev\ents/42"#);
        let mut body = Vec::new();
        assert!(push_keyed(&mut body, b"{}", &key_member("k"), &key));
        let body = String::from_utf8(body).unwrap();
        assert_eq!(body, r#"{"k":"ac\"me/ev\\ents/42"}"#);
    }

    #[test]
    fn frames_keyed_rows_and_names_the_batch_by_their_keys() {
        let pack = |rows: &[(u64, &str)]| {
            let rows: Vec<RowData> = rows
                .iter()
                .map(|&(sequence, payload)| RowData {
                    sequence,
                    ..RowData::new(payload)
                })
                .collect();
            Rows::pack(&rows)
        };
        let member = key_member("_key");
        let rows = pack(&[(1, r#"{"a":1}"#), (2, "[2]"), (3, "{}\n{}"), (4, "{}")]);
        let framed = frame(&rows, Some(&member));
        assert_eq!(
            String::from_utf8(framed.body.clone()).unwrap(),
            "{\"_key\":\"t/events/1\",\"a\":1}\n{\"_key\":\"t/events/4\"}\n"
        );
        assert_eq!(framed.posted, 2);
        assert_eq!(framed.refusals[0], None);
        assert!(framed.refusals[1].unwrap().contains("not a JSON object"));
        assert!(framed.refusals[2].unwrap().contains("newline"));
        assert_eq!(framed.refusals[3], None);
        let keys = format!(
            "{:016x}",
            weir_plugin::stable_hash64(b"t/events/1\nt/events/4\n")
        );
        let name = format!("{keys}{:016x}", weir_plugin::stable_hash64(&framed.body));
        assert_eq!(framed.idempotency_key, name);
        // Without `key_field` the payloads go as they are, any JSON or none.
        let framed = frame(&pack(&[(1, "[1]"), (4, "x")]), None);
        assert_eq!(framed.body, b"[1]\nx\n");
        assert_eq!(&framed.idempotency_key[..16], keys);
        // The same rows again, the same name; other rows with the same
        // keys (a moved table, a new stream), or fewer rows, another.
        let again = frame(&pack(&[(1, "[1]"), (4, "x")]), None);
        assert_eq!(again.idempotency_key, framed.idempotency_key);
        let moved = frame(&pack(&[(1, "[1]"), (4, "y")]), None);
        assert_eq!(&moved.idempotency_key[..16], keys);
        assert_ne!(moved.idempotency_key, framed.idempotency_key);
        assert_ne!(
            frame(&pack(&[(1, "[1]")]), None).idempotency_key[..16],
            keys
        );
    }
}
