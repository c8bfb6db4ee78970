//! The front door: `POST /v1/ingest/{table}` with NDJSON or a JSON array,
//! plain, gzip or zstd. The tenant comes from the API key, never from
//! anything else the client sends; a 202 means JetStream stored every row.
//! [`FrontDoor::process`] is the one path every door (this one, and the
//! NATS door in `nats_door.rs`) takes from a request to its answer.

use opentelemetry::KeyValue;

use crate::telemetry::traces::{TRACEPARENT, Traces};
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Extension;
use axum::Router as HttpRouter;
use axum::body::Body;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::config::Config;
use crate::config::{BadLines, Pipeline};
pub(crate) use crate::ingest::answer::{Answer, Refusal};
use crate::ingest::encoding::{BodyKind, Encoding, decode};
use crate::ingest::idempotency::{Claim, ClaimError, RequestKeys};
use crate::ingest::ndjson;
use crate::ingest::policy::{Admit, Placement, Policies};
use crate::ingest::publish::{BadRow, Ids, PublishError, Published, Publisher};
use crate::ingest::usage::{Ledger, Queued};
use crate::sandbox::Plugin;
use crate::telemetry::{DoorLabels, Metrics};
use crate::topology::route::encode_token;

/// The request header that makes a retried request store its rows once.
const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Longest idempotency key, from the header or a row's field.
const MAX_KEY_BYTES: usize = 200;
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
/// The same for a body over the limit: a client that sends it all before
/// reading (Python's `http.client`) would otherwise see a broken pipe
/// instead of its 413. Past this, the connection is closed unread.
const DISCARD_OVERSIZED_BYTES: usize = 64 << 20;
const DISCARD_OVERSIZED_TIME: Duration = Duration::from_secs(10);
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
    /// Every tenant's name: the NATS door takes the tenant from the subject.
    tenants: HashSet<String>,
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
        let tenants = config
            .tenants
            .iter()
            .map(|tenant| tenant.name.clone())
            .collect();
        Gate {
            tenants_by_key,
            tenants,
            config,
            policies,
        }
    }

    /// Whether `tenant` is one of the config's tenants.
    pub(crate) fn has_tenant(&self, tenant: &str) -> bool {
        self.tenants.contains(tenant)
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
    /// A span per traced request; its rows carry its context.
    traces: Traces,
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
            traces: Traces::default(),
        }
    }

    /// Traces requests (`[traces]`): a span each, context in every row.
    pub fn with_traces(mut self, traces: Traces) -> FrontDoor {
        self.traces = traces;
        self
    }

    /// The HTTP routes, ready to serve. The body is read by the handler,
    /// after the key and the table were checked.
    pub fn router(self: Arc<Self>) -> HttpRouter {
        HttpRouter::new()
            .route("/v1/ingest/{table}", post(ingest))
            .with_state(self)
    }

    /// The gate of the running generation, for one request.
    pub(crate) fn gate(&self) -> Arc<Gate> {
        self.gates.borrow().clone()
    }

    /// Room among the bodies in flight for one of `expected` bytes (as
    /// sent) in `encoding`: held until the permit is dropped.
    fn hold_body(
        &self,
        encoding: Encoding,
        expected: usize,
        limit: usize,
    ) -> Result<OwnedSemaphorePermit, Refusal> {
        // A compressed body is held twice: as sent, and decompressed (at most
        // the limit).
        let held = match encoding {
            Encoding::Identity => expected,
            _ => expected.saturating_add(limit),
        };
        let permits = u32::try_from(held.max(1)).unwrap_or(u32::MAX);
        self.body_bytes
            .clone()
            .try_acquire_many_owned(permits)
            .map_err(|_| {
                Refusal::retry_later(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the host is reading too many bodies at once; retry in a second",
                )
            })
    }

    /// Room for a body received whole (the NATS door): its headers say how
    /// it is encoded.
    pub(crate) fn hold_received(
        &self,
        gate: &Gate,
        headers: &HeaderMap,
        length: usize,
    ) -> Result<OwnedSemaphorePermit, Refusal> {
        let kind = BodyKind::of(headers)?;
        let limit = gate.config.max_body_bytes;
        if length > limit {
            return Err(body_too_large(limit));
        }
        self.hold_body(kind.encoding, length, limit)
    }

    /// Counts and logs a request's answer, by door; its status code.
    pub(crate) fn record(
        &self,
        door: &'static str,
        began: Instant,
        span: &tracing::Span,
        answer: &Result<Answer, Refusal>,
    ) -> StatusCode {
        let status = match answer {
            Ok(_) => StatusCode::ACCEPTED,
            Err(refusal) => {
                let code = refusal.status.as_u16();
                self.metrics
                    .requests_refused
                    .get_or_create(&DoorLabels { door, code })
                    .inc();
                // The reason names no key: a refusal's text never quotes one.
                span.in_scope(|| {
                    tracing::info!(code, reason = %refusal.error, line = refusal.line, "ingest request refused")
                });
                refusal.status
            }
        };
        self.metrics
            .request_duration
            .get_or_create(&DoorLabels {
                door,
                code: status.as_u16(),
            })
            .observe(began.elapsed().as_secs_f64());
        status
    }
}

/// The doors, as metrics and spans name them.
pub(crate) const HTTP_DOOR: &str = "http";
pub(crate) const NATS_DOOR: &str = "nats";

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
        door = HTTP_DOOR,
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
                // A client that waits for `100 Continue` sends no body:
                // reading it would ask for one.
                if !expects_continue(&headers) {
                    let mut body = body;
                    discard(&mut body, refusal.status).await;
                }
                Err(refusal)
            }
        }
    }
    .instrument(span.clone())
    .await;
    door.record(HTTP_DOOR, began, &span, &answer);
    match answer {
        Ok(answer) => (StatusCode::ACCEPTED, axum::Json(answer)).into_response(),
        Err(refusal) => refusal.into_response(),
    }
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
    check_table(gate, table)?;
    let kind = BodyKind::of(headers)?;
    let limit = gate.config.max_body_bytes;
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    if announced.is_some_and(|length| length > limit) {
        return Err(body_too_large(limit));
    }
    let expected = announced.unwrap_or(limit);
    let reading = door.hold_body(kind.encoding, expected, limit)?;
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
async fn discard(body: &mut Body, status: StatusCode) {
    let (bound, time) = if status == StatusCode::PAYLOAD_TOO_LARGE {
        (DISCARD_OVERSIZED_BYTES, DISCARD_OVERSIZED_TIME)
    } else {
        (DISCARD_BYTES, DISCARD_TIME)
    };
    let mut read = 0;
    let _ = tokio::time::timeout(time, async {
        while read < bound
            && let Some(Ok(frame)) = body.frame().await
        {
            read += frame.data_ref().map_or(0, Bytes::len);
        }
    })
    .await;
}

fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get(header::EXPECT)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

async fn accept(
    door: &FrontDoor,
    gate: &Gate,
    table: &str,
    headers: &HeaderMap,
    admitted: Admitted<'_>,
    body: Body,
) -> Result<Answer, Refusal> {
    let tenant = admitted.tenant;
    let (body, _reading) = read_body(gate, admitted, body).await?;
    door.process(gate, tenant, table, headers, body).await
}

impl FrontDoor {
    /// One request, from its tenant (already authenticated), table, headers
    /// and body as received to its answer: decoded, split, checked, admitted,
    /// routed and stored. Every door (HTTP, NATS) goes through here, so the
    /// rules are the same whichever way rows come in.
    pub(crate) async fn process(
        &self,
        gate: &Gate,
        tenant: &str,
        table: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Answer, Refusal> {
        let producer = headers
            .get(TRACEPARENT)
            .and_then(|value| value.to_str().ok());
        let span = self.traces.request(
            producer,
            vec![
                KeyValue::new("weir.tenant", tenant.to_string()),
                KeyValue::new("weir.table", table.to_string()),
                KeyValue::new("weir.body_bytes", body.len() as i64),
            ],
        );
        let traceparent = span.as_ref().map(|span| span.traceparent.as_str());
        let answer = self
            .process_rows(gate, tenant, table, headers, body, traceparent)
            .await;
        if let Some(span) = span {
            let (status, stored) = match &answer {
                Ok(answer) => (202, answer.accepted as i64),
                Err(refusal) => (refusal.status.as_u16(), 0),
            };
            span.answered(status, vec![KeyValue::new("weir.rows_stored", stored)]);
        }
        answer
    }

    /// [`FrontDoor::process`] under the request's span, if traced: its
    /// rows carry `traceparent`.
    async fn process_rows(
        &self,
        gate: &Gate,
        tenant: &str,
        table: &str,
        headers: &HeaderMap,
        body: Bytes,
        traceparent: Option<&str>,
    ) -> Result<Answer, Refusal> {
        let door = self;
        let pipeline = check_table(gate, table)?;
        let kind = BodyKind::of(headers)?;
        // The HTTP door stops reading at the limit; a body received whole
        // (NATS) is checked here.
        let limit = gate.config.max_body_bytes;
        if body.len() > limit {
            return Err(body_too_large(limit));
        }
        let bad_lines = bad_lines_mode(headers, pipeline.bad_lines)?;
        let first_line = first_line(headers)?;
        let body = decode(kind.encoding, body, gate.config.max_body_bytes).await?;
        let split = split_rows(door, gate, kind.format, &body, bad_lines, first_line)?;
        let request_key = idempotency_key(headers)?;
        // Not connected: say so now rather than wait out the key's claim
        // (a KV request) or a publish timeout.
        if !door.publisher.connected() {
            return Err(publish_refusal(
                PublishError::Unavailable("not connected".into()),
                &[],
            ));
        }
        let ids = MessageIds::new(tenant, table, request_key);
        let (outgoing, mut bad) = Outgoing::new(&ids, split, bad_lines)?;
        bad.sort_by_key(|row| row.line);
        // Rows with their own keys may be stored already whatever the request.
        let mut ids = if outgoing.keyed == 0 {
            Ids::Fresh
        } else {
            Ids::MaybeStored
        };
        if let Some(key) = request_key {
            let claim = claim_key(door, tenant, table, key, &body).await?;
            if claim == Claim::Again {
                ids = Ids::Retry;
            }
            // A retry after a lost answer: every row (and letter) is stored
            // already.
            if claim == Claim::Stored {
                let rows = outgoing.rows.len();
                return Ok(Answer::new(rows, rows, bad_lines, &bad));
            }
        }
        let mut published = Published::default();
        if !outgoing.rows.is_empty() {
            published = door
                .store_rows(gate, tenant, table, outgoing, (ids, traceparent))
                .await?;
        }
        if !bad.is_empty() {
            door.publisher
                .publish_letters(tenant, table, &bad, &gate.config.dead_letters.redact)
                .await
                .map_err(|err| publish_refusal(err, &[]))?;
            door.metrics
                .rows_dead_lettered_at_ingest
                .inc_by(bad.len() as u64);
        }
        if let Some(key) = request_key {
            // Off the answer's path: without the record a retry publishes again.
            let keys = door.request_keys.clone();
            let (tenant, table, key) = (tenant.to_string(), table.to_string(), key.to_string());
            tokio::spawn(async move { keys.stored(&tenant, &table, &key, &body).await });
        }
        Ok(Answer::new(
            published.stored,
            published.duplicates,
            bad_lines,
            &bad,
        ))
    }

    /// Admits, routes and stores a request's good rows.
    async fn store_rows(
        &self,
        gate: &Gate,
        tenant: &str,
        table: &str,
        outgoing: Outgoing,
        (ids, traceparent): (Ids, Option<&str>),
    ) -> Result<Published, Refusal> {
        let door = self;
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
            .publish(tenant, table, &placement, outgoing.rows, ids, traceparent)
            .await
            .map_err(|err| publish_refusal(err, &numbers))?;
        door.metrics
            .rows_accepted
            .inc_by((published.stored - published.duplicates) as u64);
        door.ledger.accepted(std::mem::take(&mut published.accepts));
        Ok(published)
    }
}

/// The request header that chooses, for this request, what bad lines do.
const BAD_LINES_HEADER: &str = "weir-bad-lines";
/// The request header that numbers the body's first line (default 1), so
/// that a client sending a file in pieces (`weir send`) gets answers and
/// dead letters that name the file's lines.
const FIRST_LINE_HEADER: &str = "weir-first-line";

/// The table's `bad_lines`, unless the request's header says otherwise.
fn bad_lines_mode(headers: &HeaderMap, table: BadLines) -> Result<BadLines, Refusal> {
    let Some(value) = headers.get(BAD_LINES_HEADER) else {
        return Ok(table);
    };
    value
        .to_str()
        .ok()
        .and_then(BadLines::parse)
        .ok_or_else(|| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                "Weir-Bad-Lines must be `refuse` or `dead-letter`; nothing was stored",
            )
        })
}

fn first_line(headers: &HeaderMap) -> Result<usize, Refusal> {
    let Some(value) = headers.get(FIRST_LINE_HEADER) else {
        return Ok(1);
    };
    value
        .to_str()
        .ok()
        .and_then(|text| text.trim().parse::<usize>().ok())
        .filter(|line| (1..=usize::MAX / 2).contains(line))
        .ok_or_else(|| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                "Weir-First-Line must be a line number from 1; nothing was stored",
            )
        })
}

/// 404 unless a pipeline takes `table`.
fn check_table<'g>(gate: &'g Gate, table: &str) -> Result<&'g Pipeline, Refusal> {
    match gate.config.pipeline_for(table) {
        Some(pipeline) => Ok(pipeline),
        None => Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("no pipeline takes table `{table}`"),
        )),
    }
}

/// The body's rows, each checked before the first is published (all or
/// nothing): NDJSON objects, at least one, none past `max_payload`.
fn split_rows(
    door: &FrontDoor,
    gate: &Gate,
    format: ndjson::Format,
    body: &Bytes,
    mode: BadLines,
    first_line: usize,
) -> Result<ndjson::Split, Refusal> {
    let fields = ndjson::Fields {
        key: gate.config.idempotency_field.as_deref(),
        route: gate.config.policies.routing_field.as_deref(),
    };
    let bad_line = |bad: ndjson::BadLine| Refusal {
        line: Some(bad.line),
        ..Refusal::new(StatusCode::BAD_REQUEST, bad.to_string())
    };
    let refuse = mode == BadLines::Refuse;
    let mut split = ndjson::split_body(body, format, fields, refuse).map_err(bad_line)?;
    // Only an NDJSON body's lines are numbered from the header's line.
    if format == ndjson::Format::Ndjson && first_line > 1 {
        let offset = first_line - 1;
        split.rows.iter_mut().for_each(|row| row.number += offset);
        split.bad.iter_mut().for_each(|bad| bad.line += offset);
    }
    if refuse && let Some(bad) = split.bad.first() {
        return Err(bad_line(bad.clone()));
    }
    if split.rows.is_empty() && split.bad.is_empty() {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "the body holds no rows",
        ));
    }
    // A row past `max_payload` would fail mid-request (a bad one too: its
    // letter could not be stored either).
    let max_row = door.publisher.max_row_bytes();
    let too_large = split
        .rows
        .iter()
        .map(|row| (row.number, row.payload.len()))
        .chain(split.bad.iter().map(|bad| (bad.line, bad.payload.len())))
        .find(|(_, length)| *length > max_row);
    if let Some((line, length)) = too_large {
        return Err(Refusal {
            line: Some(line),
            ..Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "line {line}: the row is {length} bytes, larger than the {max_row} bytes NATS stores; nothing was stored"
                ),
            )
        });
    }
    Ok(split)
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
    /// Rows with their own idempotency key.
    keyed: usize,
}

impl Outgoing {
    /// The rows with their message ids, and the bad lines on their way to
    /// the dead-letter stream (with `mode` dead-letter; else the first bad
    /// line refuses the request).
    fn new(
        ids: &MessageIds<'_>,
        split: ndjson::Split,
        mode: BadLines,
    ) -> Result<(Outgoing, Vec<BadRow>), Refusal> {
        let lines = split.rows;
        let mut outgoing = Outgoing {
            numbers: Vec::with_capacity(lines.len()),
            rows: Vec::with_capacity(lines.len()),
            route_keys: Vec::with_capacity(lines.len()),
            keyed: 0,
        };
        let mut bad: Vec<BadRow> = split
            .bad
            .into_iter()
            .map(|line| BadRow {
                message_id: ids.for_bad_line(line.line),
                line: line.line,
                reason: line.to_string(),
                payload: line.payload,
            })
            .collect();
        for row in lines {
            let index = outgoing.rows.len();
            let reason = match ids.for_row(index, row.key.as_deref()) {
                Ok(id) => {
                    outgoing.keyed += usize::from(row.key.is_some());
                    outgoing.numbers.push(row.number);
                    outgoing.route_keys.push(row.route_key);
                    outgoing.rows.push((row.payload, id));
                    continue;
                }
                Err(reason) => format!("line {}: {reason}", row.number),
            };
            if mode == BadLines::Refuse {
                return Err(Refusal {
                    line: Some(row.number),
                    ..Refusal::new(StatusCode::BAD_REQUEST, reason)
                });
            }
            bad.push(BadRow {
                message_id: ids.for_bad_line(row.number),
                line: row.number,
                reason,
                payload: row.payload,
            });
        }
        Ok((outgoing, bad))
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
    mut body: Body,
) -> Result<(Bytes, OwnedSemaphorePermit), Refusal> {
    let limit = gate.config.max_body_bytes;
    let deadline = BODY_TIMEOUT + Duration::from_secs((admitted.expected / MIN_BODY_RATE) as u64);
    let mut collected = Vec::with_capacity(admitted.expected.min(limit));
    let read = tokio::time::timeout(deadline, async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|err| {
                Refusal::new(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the body: {err}"),
                )
            })?;
            if let Some(data) = frame.data_ref() {
                if collected.len() + data.len() > limit {
                    return Err(body_too_large(limit));
                }
                collected.extend_from_slice(data);
            }
        }
        Ok(())
    })
    .await;
    match read {
        Err(_) => Err(Refusal::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the body did not arrive within {deadline:?}; nothing was stored"),
        )),
        Ok(Err(refusal)) => {
            drop(collected);
            discard(&mut body, refusal.status).await;
            Err(refusal)
        }
        Ok(Ok(())) => Ok((Bytes::from(collected), admitted.reading)),
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

    /// A bad line's letter is stored once per request key and line.
    fn for_bad_line(&self, line: usize) -> Option<String> {
        self.request_key
            .map(|request| format!("{}.r.{request}.bad.{line}", self.scope))
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
