//! The operator endpoints served beside the front door: `/v1/status`,
//! `/metrics`, `/livez`, `/readyz` and `POST /v1/admin/reload`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router as HttpRouter;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use tokio::sync::{oneshot, watch};

use crate::ops::readiness::Readiness;
use crate::ops::status::StatusSource;
use crate::ops::status::TenantUsage;
use crate::reload::ReloadRequests;
use crate::reload::generation::Generation;

/// How long `POST /v1/admin/reload` waits for the reload to finish.
const ADMIN_RELOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// Seconds a client is told to wait when the host cannot answer now.
const RETRY_AFTER_SECS: u64 = 1;

/// What the operator endpoints share.
pub struct Ops {
    pub status: StatusSource,
    /// The running generation: its `admin_api_keys` guard the admin API.
    pub generations: watch::Receiver<Arc<Generation>>,
    pub reloads: ReloadRequests,
    pub readiness: Readiness,
}

impl Ops {
    /// The operator routes, to be merged with the front door's.
    pub fn router(self) -> HttpRouter {
        HttpRouter::new()
            .route("/v1/status", get(status))
            .route("/v1/admin/reload", post(admin_reload))
            .route("/livez", get(|| async { "ok" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(Arc::new(self))
    }
}

/// An error answer `{"error": ...}`, with `Retry-After` when it passes.
fn refusal(status: StatusCode, error: &str, retry: bool) -> Response {
    let mut response = (status, axum::Json(json!({ "error": error }))).into_response();
    if retry {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    }
    response
}

/// Forces a reload of the config and plugins, as SIGHUP does, and answers
/// with its outcome: 200 applied, 422 refused (the running versions keep
/// serving). Needs one of the config's `admin_api_keys`.
async fn admin_reload(State(ops): State<Arc<Ops>>, headers: HeaderMap) -> Response {
    let admin_keys = ops.generations.borrow().config().admin_api_keys.clone();
    if admin_keys.is_empty() {
        return refusal(
            StatusCode::NOT_FOUND,
            "the admin API is off: set `admin_api_keys` in the config",
            false,
        );
    }
    let key = bearer(&headers);
    if !key.is_some_and(|key| admin_keys.iter().any(|k| same_key(key, k))) {
        return refusal(
            StatusCode::UNAUTHORIZED,
            "an admin api key is required",
            false,
        );
    }
    let (reply, answer) = oneshot::channel();
    if ops.reloads.send(reply).await.is_err() {
        return refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the host is stopping",
            true,
        );
    }
    match tokio::time::timeout(ADMIN_RELOAD_TIMEOUT, answer).await {
        Ok(Ok(Ok(restart_needed))) => {
            axum::Json(json!({ "result": "applied", "restart_needed": restart_needed }))
                .into_response()
        }
        Ok(Ok(Err(reason))) => refusal(StatusCode::UNPROCESSABLE_ENTITY, &reason, false),
        Ok(Err(_)) | Err(_) => refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the reload did not finish",
            true,
        ),
    }
}

/// 200 while this host can store a row; 503 with the reason otherwise.
async fn readyz(State(ops): State<Arc<Ops>>) -> Response {
    match ops.readiness.not_ready_because() {
        None => (StatusCode::OK, "ready").into_response(),
        Some(reason) => refusal(StatusCode::SERVICE_UNAVAILABLE, &reason, true),
    }
}

/// Who is asking for the status, by the bearer key it sent.
#[derive(Debug, PartialEq, Eq)]
enum Viewer {
    Admin,
    Tenant(String),
    Anyone,
}

/// The bearer key of a request, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
}

/// Compares keys by digest: the time taken says nothing about a near miss.
fn same_key(presented: &str, known: &str) -> bool {
    use sha2::Digest;
    sha2::Sha256::digest(presented.as_bytes()) == sha2::Sha256::digest(known.as_bytes())
}

fn viewer(generation: &Generation, headers: &HeaderMap) -> Viewer {
    let Some(key) = bearer(headers) else {
        return Viewer::Anyone;
    };
    let config = generation.config();
    if config
        .admin_api_keys
        .iter()
        .any(|admin| same_key(key, admin))
    {
        return Viewer::Admin;
    }
    config
        .tenants
        .iter()
        .find(|tenant| tenant.api_keys.iter().any(|known| same_key(key, known)))
        .map_or(Viewer::Anyone, |tenant| Viewer::Tenant(tenant.name.clone()))
}

/// The host's status. Tenants' usage is shown to an admin key (all) or a
/// tenant key (its own), never to anyone else; where NATS is, only to an
/// admin key.
async fn status(State(ops): State<Arc<Ops>>, headers: HeaderMap) -> Response {
    let generation = ops.generations.borrow().clone();
    let viewer = viewer(&generation, &headers);
    let mut report = ops.status.report().await;
    let shown: Vec<&str> = match &viewer {
        Viewer::Admin => generation
            .config()
            .tenants
            .iter()
            .map(|t| t.name.as_str())
            .collect(),
        Viewer::Tenant(name) => vec![name.as_str()],
        Viewer::Anyone => Vec::new(),
    };
    show_tenants(&mut report.tenants, &shown, viewer == Viewer::Admin);
    if viewer != Viewer::Admin {
        report.nats.url.clear();
    }
    axum::Json(report).into_response()
}

/// Keeps the usage of the tenants in `shown` (every tenant with usage for
/// an admin) and adds the idle ones at zero: an empty table would read as
/// "not shown", in tenant order.
fn show_tenants(tenants: &mut Vec<TenantUsage>, shown: &[&str], admin: bool) {
    tenants.retain(|usage| admin || shown.contains(&usage.tenant.as_str()));
    for name in shown {
        if !tenants.iter().any(|usage| usage.tenant == *name) {
            tenants.push(TenantUsage {
                tenant: (*name).to_string(),
                queued_rows: 0,
                queued_bytes: 0,
                recent_rows: 0,
                recent_bytes: 0,
            });
        }
    }
    tenants.sort_by(|a, b| a.tenant.cmp(&b.tenant));
}

async fn metrics(State(ops): State<Arc<Ops>>) -> Response {
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &ops.status.registry()).is_err() {
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
