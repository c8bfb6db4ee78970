//! How a request's body is written (`Content-Encoding`, `Content-Type`)
//! and its decompression, never past the body limit.

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};

use crate::ingest::answer::Refusal;
use crate::ingest::ndjson;

/// `Content-Encoding` values a body may be sent in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Encoding {
    Identity,
    Gzip,
    Zstd,
}

/// How a request's body is written, from its headers: its encoding and
/// whether it is NDJSON or a JSON array.
#[derive(Debug, Clone, Copy)]
pub(super) struct BodyKind {
    pub(super) encoding: Encoding,
    pub(super) format: ndjson::Format,
}

impl BodyKind {
    pub(super) fn of(headers: &HeaderMap) -> Result<BodyKind, Refusal> {
        let encoding = match headers.get(header::CONTENT_ENCODING).map(|v| v.to_str()) {
            None => Encoding::Identity,
            Some(Ok(value)) => match value.trim().to_ascii_lowercase().as_str() {
                "" | "identity" => Encoding::Identity,
                "gzip" | "x-gzip" => Encoding::Gzip,
                "zstd" => Encoding::Zstd,
                _ => return Err(unsupported_encoding(value)),
            },
            Some(Err(_)) => return Err(unsupported_encoding("(not text)")),
        };
        // `application/json` is an array of objects; anything else (none,
        // `application/x-ndjson`, `text/plain`) is NDJSON, as before.
        let format = match headers.get(header::CONTENT_TYPE).map(|v| v.to_str()) {
            Some(Ok(value))
                if value
                    .split(';')
                    .next()
                    .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json")) =>
            {
                ndjson::Format::JsonArray
            }
            _ => ndjson::Format::Ndjson,
        };
        Ok(BodyKind { encoding, format })
    }
}

fn unsupported_encoding(value: &str) -> Refusal {
    Refusal::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        format!(
            "Content-Encoding `{value}` is not supported: send gzip, zstd or none; nothing was stored"
        ),
    )
}

/// The largest zstd window a body may ask for (32 MiB): the memory one
/// decompression holds, whatever the frame announces.
const ZSTD_WINDOW_LOG_MAX: u32 = 25;

/// The body decompressed, never past `limit` bytes: a body that would grow
/// larger (a decompression bomb) is a 413 once `limit + 1` bytes came out.
pub(super) async fn decode(
    encoding: Encoding,
    body: Bytes,
    limit: usize,
) -> Result<Bytes, Refusal> {
    if encoding == Encoding::Identity {
        return Ok(body);
    }
    // CPU-bound: off the runtime's threads.
    tokio::task::spawn_blocking(move || decode_blocking(encoding, &body, limit))
        .await
        .map_err(|err| {
            Refusal::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("decompression failed: {err}"),
            )
        })?
}

fn decode_blocking(encoding: Encoding, body: &[u8], limit: usize) -> Result<Bytes, Refusal> {
    use std::io::Read as _;
    let (name, reader): (&str, Box<dyn std::io::Read>) = match encoding {
        Encoding::Identity => return Ok(Bytes::copy_from_slice(body)),
        Encoding::Gzip => ("gzip", Box::new(flate2::read::MultiGzDecoder::new(body))),
        Encoding::Zstd => {
            let mut decoder = zstd::stream::read::Decoder::with_buffer(body)
                .map_err(|err| bad_encoding("zstd", &err))?;
            decoder
                .window_log_max(ZSTD_WINDOW_LOG_MAX)
                .map_err(|err| bad_encoding("zstd", &err))?;
            ("zstd", Box::new(decoder))
        }
    };
    let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(limit));
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|err| bad_encoding(name, &err))?;
    if out.len() > limit {
        return Err(Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the {name} body decompresses to more than the limit of {limit} bytes; send it in smaller requests; nothing was stored"
            ),
        ));
    }
    Ok(Bytes::from(out))
}

fn bad_encoding(name: &str, err: &std::io::Error) -> Refusal {
    Refusal::new(
        StatusCode::BAD_REQUEST,
        format!("the body is not valid {name}: {err}; nothing was stored"),
    )
}
