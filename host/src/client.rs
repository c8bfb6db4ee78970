//! `weir send`: posts an NDJSON file to a front door in chunks, with a
//! progress bar, waiting out 429/503 answers as `Retry-After` says.

use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use reqwest::StatusCode;

/// How many times one chunk is offered while the server says "later".
const MAX_ATTEMPTS: u32 = 30;

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot reach {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The server refused a chunk; `line` is a line of the file.
    #[error("{path}:{line}: refused ({status}): {message} ({accepted} rows were accepted before it)", path = .path.display(), line = .line.map_or("?".to_string(), |l| l.to_string()))]
    Refused {
        path: PathBuf,
        line: Option<usize>,
        status: u16,
        message: String,
        accepted: u64,
    },
}

/// What to send, and where.
#[derive(Debug, Clone)]
pub struct SendOptions {
    pub url: String,
    pub table: String,
    pub api_key: String,
    pub file: PathBuf,
    pub chunk_rows: usize,
    pub progress: bool,
}

/// Sends the file; returns the number of rows accepted.
pub async fn send(options: &SendOptions) -> Result<u64, SendError> {
    let text = tokio::fs::read(&options.file)
        .await
        .map_err(|source| SendError::Read {
            path: options.file.clone(),
            source,
        })?;
    let endpoint = format!(
        "{}/v1/ingest/{}",
        options.url.trim_end_matches('/'),
        options.table
    );
    let client = reqwest::Client::new();
    let bar = if options.progress {
        ProgressBar::new(text.len() as u64).with_style(
            ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        )
    } else {
        ProgressBar::hidden()
    };

    let mut accepted = 0u64;
    for chunk in chunks(&text, options.chunk_rows.max(1)) {
        let refused = |status: u16, message: String, line: Option<usize>| SendError::Refused {
            path: options.file.clone(),
            line: line.map(|l| chunk.first_line + l - 1),
            status,
            message,
            accepted,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let response = client
                .post(&endpoint)
                .bearer_auth(&options.api_key)
                .header("content-type", "application/x-ndjson")
                .body(chunk.bytes.to_vec())
                .send()
                .await
                .map_err(|err| SendError::Unreachable {
                    url: endpoint.clone(),
                    reason: err.to_string(),
                })?;
            let status = response.status();
            if status.is_success() {
                let body: serde_json::Value = response.json().await.unwrap_or_default();
                accepted += body["accepted"].as_u64().unwrap_or(0);
                break;
            }
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            let message = body["error"].as_str().unwrap_or("").to_string();
            let line = body["line"].as_u64().map(|l| l as usize);
            let later = status == StatusCode::TOO_MANY_REQUESTS
                || status == StatusCode::SERVICE_UNAVAILABLE;
            if later && attempt < MAX_ATTEMPTS {
                bar.set_message(format!("server busy ({status}), waiting"));
                tokio::time::sleep(Duration::from_secs(retry_after.unwrap_or(1))).await;
                continue;
            }
            bar.abandon();
            return Err(refused(status.as_u16(), message, line));
        }
        bar.inc(chunk.bytes.len() as u64);
        bar.set_message(format!("{accepted} rows"));
    }
    bar.finish_with_message(format!("{accepted} rows accepted"));
    Ok(accepted)
}

/// A run of whole lines of the file and the number of its first line.
struct Chunk<'a> {
    first_line: usize,
    bytes: &'a [u8],
}

fn chunks(text: &[u8], rows_per_chunk: usize) -> Vec<Chunk<'_>> {
    let mut chunks = Vec::new();
    let (mut start, mut lines_in_chunk, mut first_line) = (0, 0, 1);
    for (index, byte) in text.iter().enumerate() {
        if *byte == b'\n' {
            lines_in_chunk += 1;
            if lines_in_chunk == rows_per_chunk {
                chunks.push(Chunk {
                    first_line,
                    bytes: &text[start..=index],
                });
                start = index + 1;
                first_line += lines_in_chunk;
                lines_in_chunk = 0;
            }
        }
    }
    if text[start..].iter().any(|b| !b.is_ascii_whitespace()) {
        chunks.push(Chunk {
            first_line,
            bytes: &text[start..],
        });
    }
    chunks
}

/// Default front door URL for the client commands.
pub fn default_url() -> String {
    format!("http://{}", crate::config::DEFAULT_LISTEN)
}

/// Reads a host's status report; with an admin key (all tenants, where
/// NATS is) or a tenant's key (its own usage), or without (neither).
pub async fn fetch_status(
    url: &str,
    key: Option<&str>,
) -> Result<crate::ops::status::StatusReport, SendError> {
    let endpoint = format!("{}/v1/status", url.trim_end_matches('/'));
    let unreachable = |reason: String| SendError::Unreachable {
        url: endpoint.clone(),
        reason,
    };
    let mut request = reqwest::Client::new().get(&endpoint);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request
        .send()
        .await
        .map_err(|err| unreachable(err.to_string()))?
        .json()
        .await
        .map_err(|err| unreachable(err.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_keep_whole_lines_and_their_numbers() {
        let text = b"a\nb\nc\nd\ne";
        let parts = chunks(text, 2);
        let seen: Vec<(usize, &[u8])> = parts.iter().map(|c| (c.first_line, c.bytes)).collect();
        assert_eq!(
            seen,
            vec![(1, &b"a\nb\n"[..]), (3, &b"c\nd\n"[..]), (5, &b"e"[..])]
        );
        assert!(chunks(b"a\n\n", 1).len() == 2);
    }
}
