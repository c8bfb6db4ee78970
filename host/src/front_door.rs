//! The front door: `POST /v1/ingest/{table}` with NDJSON, plus the health,
//! status and metrics endpoints. The tenant comes from the API key, never
//! from anything else the client sends; a 202 means JetStream stored every row.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router as HttpRouter;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use serde_json::json;

use crate::config::Config;
use crate::publish::{PublishError, Publisher};
use crate::status::StatusSource;
use crate::telemetry::Metrics;

/// Seconds a client is told to wait when NATS is unavailable or full.
const RETRY_AFTER_SECS: u64 = 1;

/// What the HTTP handlers share.
pub struct FrontDoor {
    tenants_by_key: HashMap<String, String>,
    config: Arc<Config>,
    publisher: Publisher,
    metrics: Metrics,
    status: StatusSource,
}

impl FrontDoor {
    pub fn new(
        config: Arc<Config>,
        publisher: Publisher,
        metrics: Metrics,
        status: StatusSource,
    ) -> FrontDoor {
        let tenants_by_key = config
            .tenants
            .iter()
            .flat_map(|tenant| {
                tenant
                    .api_keys
                    .iter()
                    .map(|key| (key.clone(), tenant.name.clone()))
            })
            .collect();
        FrontDoor {
            tenants_by_key,
            config,
            publisher,
            metrics,
            status,
        }
    }

    /// The HTTP routes, ready to serve.
    pub fn router(self) -> HttpRouter {
        let max_body = self.config.max_body_bytes;
        HttpRouter::new()
            .route(
                "/v1/ingest/{table}",
                post(ingest).layer(DefaultBodyLimit::max(max_body)),
            )
            .route("/v1/status", get(status))
            .route("/livez", get(|| async { "ok" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(Arc::new(self))
    }
}

/// An error answer: a status and a JSON body `{"error": ..., "line": ...}`.
#[derive(Debug, Serialize)]
struct Refusal {
    #[serde(skip)]
    status: StatusCode,
    error: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<usize>,
    #[serde(skip)]
    retry_after: bool,
}

impl Refusal {
    fn new(status: StatusCode, error: impl Into<String>) -> Refusal {
        Refusal {
            status,
            error: error.into(),
            line: None,
            retry_after: false,
        }
    }

    fn retry_later(status: StatusCode, error: impl Into<String>) -> Refusal {
        Refusal {
            retry_after: true,
            ..Refusal::new(status, error)
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(&self)).into_response();
        if self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        response
    }
}

async fn ingest(
    State(door): State<Arc<FrontDoor>>,
    Path(table): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    match accept(&door, &table, &headers, body).await {
        Ok(count) => (
            StatusCode::ACCEPTED,
            axum::Json(json!({ "accepted": count })),
        )
            .into_response(),
        Err(refusal) => {
            door.metrics.requests_refused.inc();
            refusal.into_response()
        }
    }
}

async fn accept(
    door: &FrontDoor,
    table: &str,
    headers: &HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<usize, Refusal> {
    let tenant = authenticate(door, headers)?;
    if door.config.pipeline_for(table).is_none() {
        return Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("no pipeline takes table `{table}`"),
        ));
    }
    let body = body.map_err(|rejection| {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            Refusal::new(
                status,
                format!(
                    "body is larger than the limit of {} bytes; send it in smaller requests",
                    door.config.max_body_bytes
                ),
            )
        } else {
            Refusal::new(status, rejection.body_text())
        }
    })?;
    let rows = split_rows(&body)?;
    if rows.is_empty() {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "the body holds no rows",
        ));
    }
    let lines: Vec<usize> = rows.iter().map(|(line, _)| *line).collect();
    let count = door
        .publisher
        .publish(tenant, table, rows.into_iter().map(|(_, row)| row))
        .await
        .map_err(|err| match err {
            PublishError::Unavailable(_) | PublishError::StreamFull(_) => {
                Refusal::retry_later(StatusCode::SERVICE_UNAVAILABLE, err.to_string())
            }
            PublishError::TooLarge { index } => Refusal {
                line: lines.get(index).copied(),
                ..Refusal::new(StatusCode::PAYLOAD_TOO_LARGE, err.to_string())
            },
            PublishError::Other(_) => {
                Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string())
            }
        })?;
    door.metrics.rows_accepted.inc_by(count as u64);
    Ok(count)
}

/// The tenant of a `Authorization: Bearer <key>` header.
fn authenticate<'a>(door: &'a FrontDoor, headers: &HeaderMap) -> Result<&'a str, Refusal> {
    let key = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .ok_or_else(|| {
            Refusal::new(
                StatusCode::UNAUTHORIZED,
                "missing `Authorization: Bearer <api key>` header",
            )
        })?;
    door.tenants_by_key
        .get(key.trim())
        .map(String::as_str)
        .ok_or_else(|| Refusal::new(StatusCode::UNAUTHORIZED, "unknown api key"))
}

/// Splits an NDJSON body into (line number, row) pairs, sharing the body's
/// buffer. Blank lines are skipped; the first line that is not a JSON object
/// refuses the whole request, so nothing of a bad request is stored.
fn split_rows(body: &Bytes) -> Result<Vec<(usize, Bytes)>, Refusal> {
    let mut rows = Vec::new();
    let mut start = 0;
    for (index, line) in body.split(|b| *b == b'\n').enumerate() {
        let end = start + line.len();
        let trimmed = line.strip_suffix(b"\r").unwrap_or(line);
        let line_number = index + 1;
        if !trimmed.iter().all(u8::is_ascii_whitespace) {
            check_json_object(trimmed).map_err(|error| Refusal {
                line: Some(line_number),
                ..Refusal::new(
                    StatusCode::BAD_REQUEST,
                    format!("line {line_number}: {error}"),
                )
            })?;
            rows.push((line_number, body.slice(start..start + trimmed.len())));
        }
        start = end + 1;
    }
    Ok(rows)
}

fn check_json_object(line: &[u8]) -> Result<(), String> {
    let first = line.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err("a row must be a JSON object".into());
    }
    serde_json::from_slice::<serde::de::IgnoredAny>(line)
        .map(|_| ())
        .map_err(|err| format!("invalid JSON: {err}"))
}

async fn readyz(State(door): State<Arc<FrontDoor>>) -> Response {
    if door.publisher.connected() {
        (StatusCode::OK, "ready").into_response()
    } else {
        Refusal::retry_later(StatusCode::SERVICE_UNAVAILABLE, "NATS is not connected")
            .into_response()
    }
}

async fn status(State(door): State<Arc<FrontDoor>>) -> Response {
    axum::Json(door.status.report().await).into_response()
}

async fn metrics(State(door): State<Arc<FrontDoor>>) -> Response {
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &door.status.registry()).is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_keep_their_line_numbers_and_skip_blanks() {
        let body = Bytes::from_static(b"{\"a\":1}\r\n\n  \n{\"b\":2}");
        let rows = split_rows(&body).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0], (1, Bytes::from_static(b"{\"a\":1}")));
        assert_eq!(rows[1], (4, Bytes::from_static(b"{\"b\":2}")));
    }

    #[test]
    fn the_first_bad_line_is_named() {
        let body = Bytes::from_static(b"{\"a\":1}\n{\"b\":\n[1]\n");
        let refusal = split_rows(&body).unwrap_err();
        assert_eq!(refusal.status, StatusCode::BAD_REQUEST);
        assert_eq!(refusal.line, Some(2));
        assert!(
            refusal.error.starts_with("line 2: invalid JSON"),
            "{}",
            refusal.error
        );
        let refusal = split_rows(&Bytes::from_static(b"[1]")).unwrap_err();
        assert_eq!(refusal.error, "line 1: a row must be a JSON object");
    }
}
