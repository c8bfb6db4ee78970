//! The front door: `POST /v1/ingest/{table}` with NDJSON. The tenant comes
//! from the API key, never from anything else the client sends; a 202 means
//! JetStream stored every row.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Extension;
use axum::Router as HttpRouter;
use axum::body::Body;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Serialize;
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::config::Config;
use crate::ingest::idempotency::{Claim, ClaimError, RequestKeys};
use crate::ingest::ndjson;
use crate::ingest::policy::{Admit, Placement, Policies, PolicyError};
use crate::ingest::publish::{Ids, PublishError, Published, Publisher};
use crate::ingest::usage::{Ledger, Queued};
use crate::sandbox::Plugin;
use crate::telemetry::{CodeLabels, Metrics};
use crate::topology::route::encode_token;

/// The request header that makes a retried request store its rows once.
const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Longest idempotency key, from the header or a row's field.
const MAX_KEY_BYTES: usize = 200;
/// Seconds a client is told to wait when NATS is unavailable or full.
const RETRY_AFTER_SECS: u64 = 1;
/// Body bytes read at once across requests: at least this, and at least
/// two of the largest bodies.
const MIN_BODY_BYTES_IN_FLIGHT: usize = 64 << 20;
/// A body must arrive within this long plus one second per `MIN_BODY_RATE`
/// bytes it announces (or may have): a slow client is cut off, a large
/// body on a slow link is not.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
const MIN_BODY_RATE: usize = 256 << 10;
/// What a refused request's body is read (and dropped) up to, so that the
/// client gets its answer rather than a reset connection.
const DISCARD_BYTES: usize = 4 << 20;
const DISCARD_TIME: Duration = Duration::from_secs(2);
/// Unknown keys one address may present within `FAILED_KEYS_WINDOW`;
/// past that it is answered 429 without its key being looked at until the
/// window ends: guessing keys is slowed to a crawl.
const MAX_FAILED_KEYS: u32 = 20;
const FAILED_KEYS_WINDOW: Duration = Duration::from_secs(60);
/// Addresses remembered at once; past it the expired ones are forgotten.
const MAX_TRACKED_ADDRESSES: usize = 65_536;

/// What a request is checked against (tenants, tables, limits, the budget
/// and router policies): replaced as a whole by a hot reload; a request
/// reads one snapshot from start to end.
pub struct Gate {
    /// Tenants by the SHA-256 of each of their keys: a lookup compares
    /// digests, so its timing says nothing about how much of a key matched.
    tenants_by_key: HashMap<[u8; 32], String>,
    config: Arc<Config>,
    policies: Policies,
}

impl Gate {
    /// The gate of one generation: its config and its policy plugins (found
    /// by name in the generation's loaded plugins).
    pub fn new(config: Arc<Config>, plugin: impl Fn(&str) -> Option<Arc<Plugin>>) -> Gate {
        let policies = Policies::new(&config, plugin);
        let tenants_by_key = config
            .tenants
            .iter()
            .flat_map(|tenant| {
                tenant
                    .api_keys
                    .iter()
                    .map(|key| (key_digest(key), tenant.name.clone()))
            })
            .collect();
        Gate {
            tenants_by_key,
            config,
            policies,
        }
    }
}

/// What the HTTP handlers share.
pub struct FrontDoor {
    gates: watch::Receiver<Arc<Gate>>,
    publisher: Publisher,
    metrics: Metrics,
    ledger: Ledger,
    /// Body bytes being read, across requests.
    body_bytes: Arc<Semaphore>,
    request_keys: RequestKeys,
    failed_keys: FailedKeys,
}

impl FrontDoor {
    pub fn new(
        gates: watch::Receiver<Arc<Gate>>,
        publisher: Publisher,
        metrics: Metrics,
        ledger: Ledger,
        request_keys: RequestKeys,
    ) -> FrontDoor {
        let max_body = gates.borrow().config.max_body_bytes;
        let in_flight = MIN_BODY_BYTES_IN_FLIGHT.max(max_body.saturating_mul(2));
        FrontDoor {
            gates,
            publisher,
            metrics,
            ledger,
            body_bytes: Arc::new(Semaphore::new(in_flight.min(Semaphore::MAX_PERMITS))),
            request_keys,
            failed_keys: FailedKeys::default(),
        }
    }

    /// The HTTP routes, ready to serve. The body is read by the handler,
    /// after the key and the table were checked.
    pub fn router(self) -> HttpRouter {
        HttpRouter::new()
            .route("/v1/ingest/{table}", post(ingest))
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
    /// Seconds in `Retry-After`.
    #[serde(skip)]
    retry_after: Option<u64>,
    /// The wait the budget asked for, to the millisecond.
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
}

impl Refusal {
    fn new(status: StatusCode, error: impl Into<String>) -> Refusal {
        Refusal {
            status,
            error: error.into(),
            line: None,
            retry_after: None,
            retry_after_ms: None,
        }
    }

    fn retry_later(status: StatusCode, error: impl Into<String>) -> Refusal {
        Refusal {
            retry_after: Some(RETRY_AFTER_SECS),
            ..Refusal::new(status, error)
        }
    }

    /// 429: the tenant's budget says not now.
    fn throttled(tenant: &str, wait: Duration) -> Refusal {
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
    fn policy_failed(err: PolicyError) -> Refusal {
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

async fn ingest(
    State(door): State<Arc<FrontDoor>>,
    Path(table): Path<String>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    use tracing::Instrument;
    let began = Instant::now();
    // Tenant and unit are recorded once known (after the key, after routing).
    let span = tracing::info_span!(
        "ingest",
        %table,
        tenant = tracing::field::Empty,
        unit = tracing::field::Empty
    );
    let answer = async {
        let gate = door.gates.borrow().clone();
        let peer = peer.map(|Extension(ConnectInfo(address))| address.ip());
        match before_the_body(&door, &gate, &table, &headers, peer) {
            Ok(admitted) => accept(&door, &gate, &table, &headers, admitted, body).await,
            Err(refusal) => {
                discard(body).await;
                Err(refusal)
            }
        }
    }
    .instrument(span.clone())
    .await;
    let response = match answer {
        Ok(published) => (
            StatusCode::ACCEPTED,
            axum::Json(json!({
                "accepted": published.stored,
                "duplicates": published.duplicates,
            })),
        )
            .into_response(),
        Err(refusal) => {
            let code = refusal.status.as_u16();
            door.metrics
                .requests_refused
                .get_or_create(&CodeLabels { code })
                .inc();
            // The reason names no key: a refusal's text never quotes one.
            span.in_scope(|| {
                tracing::info!(code, reason = %refusal.error, line = refusal.line, "ingest request refused")
            });
            refusal.into_response()
        }
    };
    door.metrics
        .request_duration
        .get_or_create(&CodeLabels {
            code: response.status().as_u16(),
        })
        .observe(began.elapsed().as_secs_f64());
    response
}

/// A request whose key, table and announced size passed, with its share of
/// the body bytes in flight.
struct Admitted<'g> {
    tenant: &'g str,
    /// The body's size as announced, or the most it may be.
    expected: usize,
    reading: OwnedSemaphorePermit,
}

/// Everything checked before a byte of the body is read: the key, the
/// table, the announced size, and room among the bodies in flight.
fn before_the_body<'g>(
    door: &FrontDoor,
    gate: &'g Gate,
    table: &str,
    headers: &HeaderMap,
    peer: Option<IpAddr>,
) -> Result<Admitted<'g>, Refusal> {
    if let Some(wait) = peer.and_then(|address| door.failed_keys.blocked(address)) {
        return Err(Refusal {
            retry_after: Some(wait.as_secs().max(1)),
            ..Refusal::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too many unknown api keys from this address; retry later",
            )
        });
    }
    let tenant = authenticate(gate, headers).inspect_err(|refusal| {
        if refusal.error == UNKNOWN_KEY
            && let Some(address) = peer
        {
            door.failed_keys.failed(address);
        }
    })?;
    tracing::Span::current().record("tenant", tenant);
    if gate.config.pipeline_for(table).is_none() {
        return Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("no pipeline takes table `{table}`"),
        ));
    }
    let limit = gate.config.max_body_bytes;
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    if announced.is_some_and(|length| length > limit) {
        return Err(body_too_large(limit));
    }
    let expected = announced.unwrap_or(limit);
    let permits = u32::try_from(expected.max(1)).unwrap_or(u32::MAX);
    let reading = door
        .body_bytes
        .clone()
        .try_acquire_many_owned(permits)
        .map_err(|_| {
            Refusal::retry_later(
                StatusCode::SERVICE_UNAVAILABLE,
                "the host is reading too many bodies at once; retry in a second",
            )
        })?;
    Ok(Admitted {
        tenant,
        expected,
        reading,
    })
}

fn body_too_large(limit: usize) -> Refusal {
    Refusal::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "body is larger than the limit of {limit} bytes; send it in smaller requests; nothing was stored"
        ),
    )
}

/// Reads and drops what a refused client is still sending (a little, for a
/// short while), so it reads its answer instead of a reset connection;
/// nothing of it is kept.
async fn discard(body: Body) {
    let mut body = Limited::new(body, DISCARD_BYTES);
    let _ = tokio::time::timeout(DISCARD_TIME, async {
        while let Some(Ok(_)) = body.frame().await {}
    })
    .await;
}

async fn accept(
    door: &FrontDoor,
    gate: &Gate,
    table: &str,
    headers: &HeaderMap,
    admitted: Admitted<'_>,
    body: Body,
) -> Result<Published, Refusal> {
    let tenant = admitted.tenant;
    let (body, _reading) = read_body(gate, admitted, body).await?;
    let rows = split_rows(door, gate, &body)?;
    let request_key = idempotency_key(headers)?;
    // Rows with their own keys may be stored already whatever the request.
    let mut fresh = rows.iter().all(|row| row.key.is_none());
    if let Some(key) = request_key {
        let claim = claim_key(door, tenant, table, key, &body).await?;
        fresh &= claim == Claim::First;
        // A retry after a lost answer: every row is stored already.
        if claim == Claim::Stored {
            return Ok(Published {
                stored: rows.len(),
                duplicates: rows.len(),
                accepts: Vec::new(),
            });
        }
    }
    let outgoing = Outgoing::new(&MessageIds::new(tenant, table, request_key), rows)?;
    let amount = Queued {
        rows: outgoing.rows.len() as u64,
        bytes: outgoing.rows.iter().map(|(p, _)| p.len() as u64).sum(),
    };
    let _reservation = admit(door, gate, tenant, table, amount).await?;
    let placement = gate
        .policies
        .place(tenant, table, || outgoing.route_keys)
        .await
        .map_err(Refusal::policy_failed)?;
    // A router may spread a request's rows over many units: named only
    // when they all go to one.
    if let Placement::Table(unit) = &placement {
        tracing::Span::current().record("unit", door.publisher.unit_name(*unit));
    }
    let numbers = outgoing.numbers;
    let mut published = door
        .publisher
        .publish(
            tenant,
            table,
            &placement,
            outgoing.rows,
            if fresh { Ids::Fresh } else { Ids::MaybeStored },
        )
        .await
        .map_err(|err| publish_refusal(err, &numbers))?;
    door.metrics
        .rows_accepted
        .inc_by((published.stored - published.duplicates) as u64);
    door.ledger.accepted(std::mem::take(&mut published.accepts));
    if let Some(key) = request_key {
        // Off the answer's path: without the record a retry publishes again.
        let keys = door.request_keys.clone();
        let (tenant, table, key) = (tenant.to_string(), table.to_string(), key.to_string());
        tokio::spawn(async move { keys.stored(&tenant, &table, &key, &body).await });
    }
    Ok(published)
}

/// The body's rows, each checked before the first is published (all or
/// nothing): NDJSON objects, at least one, none past `max_payload`.
fn split_rows(door: &FrontDoor, gate: &Gate, body: &Bytes) -> Result<Vec<ndjson::Line>, Refusal> {
    let fields = ndjson::Fields {
        key: gate.config.idempotency_field.as_deref(),
        route: gate.config.policies.routing_field.as_deref(),
    };
    let rows = ndjson::split(body, fields).map_err(|bad| Refusal {
        line: Some(bad.line),
        ..Refusal::new(StatusCode::BAD_REQUEST, bad.to_string())
    })?;
    if rows.is_empty() {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "the body holds no rows",
        ));
    }
    // A row past `max_payload` would fail mid-request.
    let max_row = door.publisher.max_row_bytes();
    if let Some(row) = rows.iter().find(|row| row.payload.len() > max_row) {
        return Err(Refusal {
            line: Some(row.number),
            ..Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "line {}: the row is {} bytes, larger than the {max_row} bytes NATS stores; nothing was stored",
                    row.number,
                    row.payload.len()
                ),
            )
        });
    }
    Ok(rows)
}

/// Binds the request's `Idempotency-Key` to its body, fleet-wide.
async fn claim_key(
    door: &FrontDoor,
    tenant: &str,
    table: &str,
    key: &str,
    body: &Bytes,
) -> Result<Claim, Refusal> {
    door.request_keys
        .claim(tenant, table, key, body)
        .await
        .map_err(|err| match err {
            ClaimError::Reused { .. } => Refusal::new(StatusCode::CONFLICT, err.to_string()),
            ClaimError::Unavailable(_) => {
                Refusal::retry_later(StatusCode::SERVICE_UNAVAILABLE, err.to_string())
            }
        })
}

/// A request's rows as they are published: payloads with message ids, line
/// numbers (to name a refused row) and routing keys, in body order.
struct Outgoing {
    numbers: Vec<usize>,
    rows: Vec<(Bytes, Option<String>)>,
    route_keys: Vec<Option<String>>,
}

impl Outgoing {
    fn new(ids: &MessageIds<'_>, lines: Vec<ndjson::Line>) -> Result<Outgoing, Refusal> {
        let mut outgoing = Outgoing {
            numbers: Vec::with_capacity(lines.len()),
            rows: Vec::with_capacity(lines.len()),
            route_keys: Vec::with_capacity(lines.len()),
        };
        for (index, row) in lines.into_iter().enumerate() {
            let id = ids
                .for_row(index, row.key.as_deref())
                .map_err(|reason| Refusal {
                    line: Some(row.number),
                    ..Refusal::new(
                        StatusCode::BAD_REQUEST,
                        format!("line {}: {reason}", row.number),
                    )
                })?;
            outgoing.numbers.push(row.number);
            outgoing.route_keys.push(row.route_key);
            outgoing.rows.push((row.payload, id));
        }
        Ok(outgoing)
    }
}

/// The answer to a failed publish; `numbers` maps a row's index to its line.
fn publish_refusal(err: PublishError, numbers: &[usize]) -> Refusal {
    match err {
        PublishError::Unavailable(_) | PublishError::StreamFull(_) => {
            Refusal::retry_later(StatusCode::SERVICE_UNAVAILABLE, err.to_string())
        }
        PublishError::TooLarge { index } => Refusal {
            line: numbers.get(index).copied(),
            ..Refusal::new(StatusCode::PAYLOAD_TOO_LARGE, err.to_string())
        },
        PublishError::LargerThanPartition {
            first,
            last,
            partition,
            bytes,
            max_bytes,
        } => {
            let line = |index: usize| numbers.get(index).copied().unwrap_or(index + 1);
            Refusal {
                line: Some(line(first)),
                ..Refusal::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "lines {}..={} go to partition {partition} as one atomic batch of about {bytes} bytes, more than it holds (max_bytes {max_bytes}); nothing was stored: send smaller requests",
                        line(first),
                        line(last)
                    ),
                )
            }
        }
        PublishError::Other(_) => Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
    }
}

/// Reads an admitted request's body: at most `max_body_bytes`, within a
/// deadline that grows with its size. It counts as in flight until the
/// returned permit is dropped.
async fn read_body(
    gate: &Gate,
    admitted: Admitted<'_>,
    body: Body,
) -> Result<(Bytes, OwnedSemaphorePermit), Refusal> {
    let limit = gate.config.max_body_bytes;
    let deadline = BODY_TIMEOUT + Duration::from_secs((admitted.expected / MIN_BODY_RATE) as u64);
    let read = tokio::time::timeout(deadline, Limited::new(body, limit).collect()).await;
    match read {
        Err(_) => Err(Refusal::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the body did not arrive within {deadline:?}; nothing was stored"),
        )),
        Ok(Err(err)) if err.downcast_ref::<LengthLimitError>().is_some() => {
            Err(body_too_large(limit))
        }
        Ok(Err(err)) => Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("cannot read the body: {err}"),
        )),
        Ok(Ok(collected)) => Ok((collected.to_bytes(), admitted.reading)),
    }
}

/// Asks the tenant's budget about a request; an admitted request counts as
/// queued on this host (the reservation) until its rows are published.
async fn admit(
    door: &FrontDoor,
    gate: &Gate,
    tenant: &str,
    table: &str,
    amount: Queued,
) -> Result<Option<crate::ingest::usage::Reservation>, Refusal> {
    if !gate.policies.has_budget() {
        return Ok(None);
    }
    let decision = gate
        .policies
        .admit(
            tenant,
            table,
            amount.rows as usize,
            amount.bytes,
            door.ledger.usage(tenant),
            door.ledger.tenant_settings(tenant),
        )
        .await
        .map_err(Refusal::policy_failed)?;
    match decision {
        Admit::Yes => Ok(Some(door.ledger.reserve(tenant, amount))),
        Admit::Throttle(wait) => {
            door.metrics.requests_throttled.inc();
            Err(Refusal::throttled(tenant, wait))
        }
        Admit::Reject(reason) => {
            door.metrics.requests_rejected.inc();
            Err(Refusal::new(StatusCode::FORBIDDEN, reason))
        }
    }
}

/// The request's `Idempotency-Key`, if it sent one.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, Refusal> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(key) if (1..=MAX_KEY_BYTES).contains(&key.len()) => Ok(Some(key)),
        _ => Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("{IDEMPOTENCY_KEY} must be 1 to {MAX_KEY_BYTES} printable ASCII characters"),
        )),
    }
}

/// Message ids that make retries harmless: a row's own key when it has
/// one, else the request's key and the row's place in the request. Ids
/// name tenant and table, so two tenants' keys never collide.
struct MessageIds<'a> {
    scope: String,
    request_key: Option<&'a str>,
}

impl<'a> MessageIds<'a> {
    fn new(tenant: &str, table: &str, request_key: Option<&'a str>) -> Self {
        MessageIds {
            scope: format!("{}.{}", encode_token(tenant), encode_token(table)),
            request_key,
        }
    }

    fn for_row(&self, index: usize, row_key: Option<&str>) -> Result<Option<String>, String> {
        match (row_key, self.request_key) {
            (Some(key), _) => {
                if key.is_empty() || key.len() > MAX_KEY_BYTES || key.chars().any(char::is_control)
                {
                    return Err(format!(
                        "the row's idempotency key must be 1 to {MAX_KEY_BYTES} bytes without control characters"
                    ));
                }
                Ok(Some(format!("{}.k.{key}", self.scope)))
            }
            (None, Some(request)) => Ok(Some(format!("{}.r.{request}.{index}", self.scope))),
            (None, None) => Ok(None),
        }
    }
}

const UNKNOWN_KEY: &str = "unknown api key";

/// Unknown keys presented, by address, within the current window.
#[derive(Default)]
struct FailedKeys {
    by_address: std::sync::Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

impl FailedKeys {
    /// How long `address` still has to wait, if it presented too many
    /// unknown keys lately.
    fn blocked(&self, address: IpAddr) -> Option<Duration> {
        let by_address = self.by_address.lock().ok()?;
        let (count, since) = by_address.get(&address)?;
        let left = FAILED_KEYS_WINDOW.checked_sub(since.elapsed())?;
        (*count >= MAX_FAILED_KEYS).then_some(left)
    }

    fn failed(&self, address: IpAddr) {
        let Ok(mut by_address) = self.by_address.lock() else {
            return;
        };
        if by_address.len() >= MAX_TRACKED_ADDRESSES {
            by_address.retain(|_, (_, since)| since.elapsed() < FAILED_KEYS_WINDOW);
            if by_address.len() >= MAX_TRACKED_ADDRESSES {
                by_address.clear();
            }
        }
        let entry = by_address.entry(address).or_insert((0, Instant::now()));
        if entry.1.elapsed() >= FAILED_KEYS_WINDOW {
            *entry = (0, Instant::now());
        }
        entry.0 += 1;
    }
}

fn key_digest(key: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(key.as_bytes()).into()
}

/// The tenant of a `Authorization: Bearer <key>` header.
fn authenticate<'a>(gate: &'a Gate, headers: &HeaderMap) -> Result<&'a str, Refusal> {
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
    gate.tenants_by_key
        .get(&key_digest(key.trim()))
        .map(String::as_str)
        .ok_or_else(|| Refusal::new(StatusCode::UNAUTHORIZED, UNKNOWN_KEY))
}
