//! What a door answers: a refusal (a status, a JSON error naming what and
//! where, maybe a `Retry-After`) or a 202's body. The same for the HTTP
//! and the NATS door (`FrontDoor::process`).

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::config::BadLines;
use crate::ingest::policy::PolicyError;
use crate::ingest::publish::BadRow;

/// Seconds a client is told to wait when NATS is unavailable or full.
const RETRY_AFTER_SECS: u64 = 1;
/// Bad lines an answer lists at most (it counts them all).
const MAX_LISTED_BAD_LINES: usize = 1000;

/// An error answer: a status and a JSON body `{"error": ..., "line": ...}`.
#[derive(Debug, Serialize)]
pub(crate) struct Refusal {
    #[serde(skip)]
    pub(crate) status: StatusCode,
    pub(crate) error: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) line: Option<usize>,
    /// Seconds in `Retry-After`.
    #[serde(skip)]
    pub(crate) retry_after: Option<u64>,
    /// The wait the budget asked for, to the millisecond.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) retry_after_ms: Option<u64>,
}

impl Refusal {
    pub(crate) fn new(status: StatusCode, error: impl Into<String>) -> Refusal {
        Refusal {
            status,
            error: error.into(),
            line: None,
            retry_after: None,
            retry_after_ms: None,
        }
    }

    pub(crate) fn retry_later(status: StatusCode, error: impl Into<String>) -> Refusal {
        Refusal {
            retry_after: Some(RETRY_AFTER_SECS),
            ..Refusal::new(status, error)
        }
    }

    /// Seconds the client is told to wait before trying again, if any.
    pub(crate) fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }

    /// 429: the tenant's budget says not now.
    pub(crate) fn throttled(tenant: &str, wait: Duration) -> Refusal {
        Refusal {
            // The header counts whole seconds: round up, so a client that
            // honours it is not throttled again.
            retry_after: Some(wait.as_millis().div_ceil(1000).max(1) as u64),
            retry_after_ms: Some(wait.as_millis() as u64),
            ..Refusal::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("tenant `{tenant}` is over its budget; retry later"),
            )
        }
    }

    /// 503: a policy could not answer; nothing was stored.
    pub(crate) fn policy_failed(err: PolicyError) -> Refusal {
        tracing::error!(error = %err, "a policy failed; the request is refused");
        Refusal::retry_later(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("a policy failed: {err}"),
        )
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(&self)).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// A 202's body: rows stored (`duplicates` of them stored before), and
/// with `bad_lines = "dead-letter"` how many lines went to the dead-letter
/// stream and which (the first `MAX_LISTED_BAD_LINES`).
#[derive(Debug, Default, Serialize)]
pub(crate) struct Answer {
    pub accepted: usize,
    pub duplicates: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_lettered: Option<usize>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bad_lines: Vec<BadLineAnswer>,
}

/// One dead-lettered line, as the answer names it.
#[derive(Debug, Serialize)]
pub(crate) struct BadLineAnswer {
    pub line: usize,
    pub error: String,
}

impl Answer {
    pub(crate) fn new(
        accepted: usize,
        duplicates: usize,
        mode: BadLines,
        bad: &[BadRow],
    ) -> Answer {
        Answer {
            accepted,
            duplicates,
            dead_lettered: (mode == BadLines::DeadLetter).then_some(bad.len()),
            bad_lines: bad
                .iter()
                .take(MAX_LISTED_BAD_LINES)
                .map(|row| BadLineAnswer {
                    line: row.line,
                    error: row.reason.clone(),
                })
                .collect(),
        }
    }
}
