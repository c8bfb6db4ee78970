//! A weir sink that POSTs each batch as one NDJSON body to an HTTP endpoint through `wasi:http`.
//!
//! Settings (unknown keys are refused):
//!
//! | key       | type   | default | meaning                                             |
//! |-----------|--------|---------|-----------------------------------------------------|
//! | `url`     | string | —       | `http://` or `https://` URL the batches are POSTed to |
//! | `headers` | table  | `{}`    | extra request headers, name → value                 |
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

use std::collections::BTreeMap;

use serde::Deserialize;
use wasi::http::outgoing_handler;
use wasi::http::types::{
    ErrorCode, Fields, IncomingResponse, Method, OutgoingBody, OutgoingRequest, Scheme,
};
use wasi::io::streams::StreamError;
use weir_plugin::{Deliveries, Delivery, Rows, Sink};

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
}

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
        })
    }

    fn deliver(&mut self, rows: &Rows, out: &mut Deliveries) {
        // A payload with a newline would break the NDJSON framing: that row
        // alone is dead-lettered, the others share the endpoint's answer.
        let framed: Vec<bool> = rows
            .iter()
            .map(|row| !row.payload.contains(&b'\n'))
            .collect();
        let mut body = Vec::new();
        let mut posted = 0u64;
        for (row, framed) in rows.iter().zip(&framed) {
            if *framed {
                body.extend_from_slice(row.payload);
                body.push(b'\n');
                posted += 1;
            }
        }
        // With nothing to post, no row takes this outcome.
        let outcome = if posted == 0 {
            Delivery::Ok
        } else {
            post(&self.target, &body)
        };
        if posted > 0 && outcome == Delivery::Ok {
            weir_plugin::counter("rows_posted", posted);
        }
        for framed in framed {
            if framed {
                out.push(outcome.clone());
            } else {
                out.dead_letter("http sink: payload contains a newline; not one NDJSON line");
            }
        }
    }
}

weir_plugin::export_sink!(HttpSink);

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
fn post(target: &Target, body: &[u8]) -> Delivery {
    match send(target, body) {
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
fn send(target: &Target, body: &[u8]) -> Result<IncomingResponse, ErrorCode> {
    let mut headers = target.headers.clone();
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
}
