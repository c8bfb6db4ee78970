//! The live page at `/`: the fleet for anyone who can reach the host (what
//! `/v1/status` shows without a key), tenants' usage and dead letters for
//! an operator logged in with an admin key.
//!
//! The page is three files compiled into the binary (no CDN: it works
//! offline and on an air-gapped wall screen) that poll `GET /v1/page`
//! every second. The admin key is given once, to `POST /v1/login`; what
//! the browser keeps is a random session token in an HttpOnly,
//! SameSite=Strict cookie, never the key: a leaked cookie expires, and the
//! key never sits in a URL, a history or a script's reach. Sessions live in
//! this host's memory only (a page talks to the host that served it).
//! Every state-changing request (login, logout, replay) must come from the
//! page itself: its `Origin` must be this host, on top of SameSite=Strict.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::Router as HttpRouter;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::delivery::dlq::{DeadLetters, LetterError, LetterFilter, StoredLetter};
use crate::ops::history::Sample;
use crate::ops::status::{
    FleetStatus, FleetTotals, RowCounts, StatusReport, StatusSource, TenantUsage,
};
use crate::reload::generation::{Generation, PluginStatus};

const INDEX_HTML: &str = include_str!("page/index.html");
const APP_JS: &str = include_str!("page/app.js");
const STYLE_CSS: &str = include_str!("page/style.css");

/// The cookie holding a session token.
pub const SESSION_COOKIE: &str = "weir_session";
/// How long a session lasts from its login: a wall screen left logged in
/// loses admin rights by the next morning at the latest.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Sessions held at once; past it (expired ones forgotten first) a login
/// is refused rather than memory grown by whoever has an admin key.
const MAX_SESSIONS: usize = 1024;
/// Wrong keys one address may present to the login within
/// `FAILED_LOGINS_WINDOW`; past it, 429 without the key being looked at
/// (as the front door does for API keys).
const MAX_FAILED_LOGINS: u32 = 20;
const FAILED_LOGINS_WINDOW: Duration = Duration::from_secs(60);
/// Addresses remembered at once by the failed-login count.
const MAX_TRACKED_ADDRESSES: usize = 65_536;
/// Bodies of the page's POSTs are a key or a sequence number.
const MAX_BODY_BYTES: usize = 4096;
/// Dead letters shown: the newest of those stored in the last hour.
const LETTERS_SHOWN: usize = 50;
const LETTERS_WINDOW: time::Duration = time::Duration::hours(1);
/// At most this many letters are read for one listing (oldest first within
/// the window), so a flood of letters cannot make the page's poll slow.
const LETTERS_READ: usize = 1000;
/// A listing is reused this long: several open pages cost one read.
const LETTERS_FRESH: Duration = Duration::from_secs(2);
/// A status report is reused this long: every open page polls each
/// second, and a report lists every partition's consumers.
const REPORT_FRESH: Duration = Duration::from_millis(500);
/// Security headers of every page answer: only the page's own files run,
/// nothing is framed (no clickjacking of the replay button).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   img-src 'self' data:; connect-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

/// The live page's routes and state.
pub struct Page {
    status: StatusSource,
    generations: watch::Receiver<Arc<Generation>>,
    letters: DeadLetters,
    sessions: Mutex<Sessions>,
    failed_logins: Mutex<HashMap<IpAddr, (Instant, u32)>>,
    /// The last dead-letter listing and when it was read.
    letters_cache: tokio::sync::Mutex<Option<(Instant, Vec<StoredLetter>)>>,
    /// The last status report and when it was made.
    report_cache: tokio::sync::Mutex<Option<(Instant, StatusReport)>>,
}

/// Logged-in sessions by the SHA-256 of their token: the map holds no
/// token a memory dump could replay, and a lookup's timing says nothing
/// about a near miss.
#[derive(Default)]
struct Sessions {
    by_digest: HashMap<[u8; 32], Session>,
}

struct Session {
    expires: Instant,
    /// The digest of the admin key logged in with: when a reload removes
    /// the key, its sessions end with it.
    key: [u8; 32],
}

/// Why a page request is refused.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error("a wrong key")]
    WrongKey,
    #[error("the admin API is off: set `admin_api_keys` in the config")]
    AdminOff,
    #[error("too many wrong keys from this address; wait a minute")]
    Guessing,
    #[error("not logged in as an admin (or the session expired)")]
    NoSession,
    #[error("a request from another origin than this page")]
    CrossOrigin,
    #[error("a bad request: {0}")]
    BadRequest(String),
    #[error("too many sessions; try again later")]
    TooManySessions,
    #[error("cannot make a session token: {0}")]
    Random(std::io::Error),
    #[error(transparent)]
    Letters(#[from] LetterError),
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let status = match &self {
            PageError::WrongKey | PageError::NoSession => StatusCode::UNAUTHORIZED,
            PageError::AdminOff => StatusCode::NOT_FOUND,
            PageError::Guessing => StatusCode::TOO_MANY_REQUESTS,
            PageError::CrossOrigin => StatusCode::FORBIDDEN,
            PageError::BadRequest(_) => StatusCode::BAD_REQUEST,
            PageError::TooManySessions => StatusCode::SERVICE_UNAVAILABLE,
            PageError::Random(_) => StatusCode::INTERNAL_SERVER_ERROR,
            PageError::Letters(LetterError::NotFound { .. }) => StatusCode::NOT_FOUND,
            PageError::Letters(_) => StatusCode::BAD_GATEWAY,
        };
        let mut response =
            (status, axum::Json(json!({ "error": self.to_string() }))).into_response();
        if matches!(self, PageError::Guessing) {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(FAILED_LOGINS_WINDOW.as_secs()),
            );
        }
        response
    }
}

/// What the page polls: the public fleet view, plus tenants' usage for an
/// admin session. Tenant names never appear without one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PageState {
    /// Whether the request came with a live admin session.
    pub admin: bool,
    /// This host's own counters.
    pub rows: RowCounts,
    /// The fleet's, from the streams (`None`: NATS did not answer).
    #[serde(default)]
    pub totals: FleetTotals,
    pub fleet: FleetStatus,
    pub partitions: u32,
    pub shards: u32,
    pub units: Vec<PageUnit>,
    pub plugins: Vec<PluginStatus>,
    pub nats_connected: bool,
    /// Whether NATS answered the report's reads in time.
    #[serde(default)]
    pub nats_answered: bool,
    /// Present only for an admin session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<Vec<TenantUsage>>,
    /// The fleet's queued rows over the last five minutes, oldest first,
    /// kept by the host (a page opened now shows the past).
    #[serde(default)]
    pub queued_history: Vec<Sample>,
}

/// One unit as the page draws it: a cell of the partition × shard grid.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PageUnit {
    pub partition: u32,
    pub shard: u32,
    pub consumer: String,
    pub owner: Option<String>,
    pub pending: Option<u64>,
    pub ack_pending: Option<u64>,
}

#[derive(Deserialize)]
struct Login {
    key: String,
}

#[derive(Deserialize)]
struct Replay {
    sequence: u64,
}

impl Page {
    pub fn new(status: StatusSource, generations: watch::Receiver<Arc<Generation>>) -> Page {
        let letters = DeadLetters::new(
            async_nats::jetstream::new(status.client.clone()),
            status.router.clone(),
        );
        Page {
            status,
            generations,
            letters,
            sessions: Mutex::new(Sessions::default()),
            failed_logins: Mutex::new(HashMap::new()),
            letters_cache: tokio::sync::Mutex::new(None),
            report_cache: tokio::sync::Mutex::new(None),
        }
    }

    /// The page's routes, to be merged with the front door's.
    pub fn router(self) -> HttpRouter {
        HttpRouter::new()
            .route(
                "/",
                get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }),
            )
            .route(
                "/page/app.js",
                get(|| async { asset(APP_JS, "text/javascript; charset=utf-8") }),
            )
            .route(
                "/page/style.css",
                get(|| async { asset(STYLE_CSS, "text/css; charset=utf-8") }),
            )
            .route("/v1/page", get(state))
            .route("/v1/page/dead-letters", get(dead_letters))
            .route("/v1/page/replay", post(replay))
            .route("/v1/login", post(login))
            .route("/v1/logout", post(logout))
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
            .with_state(Arc::new(self))
    }

    /// The admin session a request carries, if it is live and its key is
    /// still an admin key of the running generation.
    fn session(&self, headers: &HeaderMap) -> Option<()> {
        let token = cookie(headers, SESSION_COOKIE)?;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let admin_keys = self.admin_key_digests();
        let mut sessions = self.sessions.lock().ok()?;
        let session = sessions.by_digest.get(&digest)?;
        if session.expires <= Instant::now() || !admin_keys.contains(&session.key) {
            sessions.by_digest.remove(&digest);
            return None;
        }
        Some(())
    }

    fn admin_key_digests(&self) -> Vec<[u8; 32]> {
        self.generations
            .borrow()
            .config()
            .admin_api_keys
            .iter()
            .map(|key| Sha256::digest(key.as_bytes()).into())
            .collect()
    }

    /// Whether `address` presented too many wrong keys lately.
    fn guessing(&self, address: Option<IpAddr>) -> bool {
        let (Some(address), Ok(failed)) = (address, self.failed_logins.lock()) else {
            return false;
        };
        failed.get(&address).is_some_and(|(since, count)| {
            since.elapsed() < FAILED_LOGINS_WINDOW && *count >= MAX_FAILED_LOGINS
        })
    }

    fn count_failed_login(&self, address: Option<IpAddr>) {
        let (Some(address), Ok(mut failed)) = (address, self.failed_logins.lock()) else {
            return;
        };
        if failed.len() >= MAX_TRACKED_ADDRESSES {
            failed.retain(|_, (since, _)| since.elapsed() < FAILED_LOGINS_WINDOW);
            if failed.len() >= MAX_TRACKED_ADDRESSES {
                return;
            }
        }
        let entry = failed.entry(address).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= FAILED_LOGINS_WINDOW {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
    }

    /// A new session for the admin key `key`; its token, to put in the cookie.
    fn open_session(&self, key: [u8; 32]) -> Result<String, PageError> {
        let token = random_token().map_err(PageError::Random)?;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut sessions = self
            .sessions
            .lock()
            .map_err(|_| PageError::TooManySessions)?;
        if sessions.by_digest.len() >= MAX_SESSIONS {
            let now = Instant::now();
            sessions
                .by_digest
                .retain(|_, session| session.expires > now);
            if sessions.by_digest.len() >= MAX_SESSIONS {
                return Err(PageError::TooManySessions);
            }
        }
        sessions.by_digest.insert(
            digest,
            Session {
                expires: Instant::now() + SESSION_TTL,
                key,
            },
        );
        Ok(token)
    }

    /// The status report, made at most every `REPORT_FRESH` however many
    /// pages poll (requests at once wait for one report).
    async fn report(&self) -> StatusReport {
        let mut cache = self.report_cache.lock().await;
        if let Some((made_at, report)) = cache.as_ref()
            && made_at.elapsed() < REPORT_FRESH
        {
            return report.clone();
        }
        let report = self.status.report().await;
        *cache = Some((Instant::now(), report.clone()));
        report
    }

    /// The newest dead letters of the last hour, newest first; read at most
    /// every `LETTERS_FRESH`.
    async fn recent_letters(&self) -> Result<Vec<StoredLetter>, PageError> {
        let mut cache = self.letters_cache.lock().await;
        if let Some((read_at, letters)) = cache.as_ref()
            && read_at.elapsed() < LETTERS_FRESH
        {
            return Ok(letters.clone());
        }
        let filter = LetterFilter {
            since: Some(time::OffsetDateTime::now_utc() - LETTERS_WINDOW),
            limit: Some(LETTERS_READ),
            ..LetterFilter::default()
        };
        let mut letters = self.letters.list(&filter).await?;
        letters.reverse();
        letters.truncate(LETTERS_SHOWN);
        *cache = Some((Instant::now(), letters.clone()));
        Ok(letters)
    }
}

/// One embedded file, with the headers every page answer carries.
fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    protect(headers);
    response
}

/// Headers that keep the page's answers out of caches and frames.
fn protect(headers: &mut HeaderMap) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

/// 32 random bytes from the kernel, hex: 256 bits no one can guess.
fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The value of cookie `name` in a request's `Cookie` headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim())
}

/// Refuses a state-changing request that did not come from a page this
/// host served: its `Origin` must name this host, as the `Host` header or,
/// behind a proxy that rewrites `Host`, `X-Forwarded-Host` says. (A page
/// of another origin cannot set `X-Forwarded-Host` on its request without
/// a CORS preflight, which this host never grants.) Browsers always send
/// `Origin` on a POST from a script, so a missing one is refused too (a
/// curl user has the admin API with a bearer key instead).
fn same_origin(headers: &HeaderMap) -> Result<(), PageError> {
    let text = |name| headers.get(name).and_then(|value| value.to_str().ok());
    let origin = text(header::ORIGIN).ok_or(PageError::CrossOrigin)?;
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .ok_or(PageError::CrossOrigin)?;
    let forwarded = text(header::HeaderName::from_static("x-forwarded-host"))
        .and_then(|hosts| hosts.split(',').next())
        .map(str::trim);
    if [text(header::HOST), forwarded]
        .into_iter()
        .flatten()
        .any(|host| origin_host.eq_ignore_ascii_case(host))
    {
        Ok(())
    } else {
        Err(PageError::CrossOrigin)
    }
}

fn json_body<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, PageError> {
    serde_json::from_slice(body).map_err(|err| PageError::BadRequest(err.to_string()))
}

/// The cookie that holds `token` (or, empty with no age, removes it).
/// `Secure` when a TLS proxy in front says the page is served over HTTPS;
/// without it the cookie would never be sent back over plain HTTP.
fn session_cookie(token: &str, max_age: u64, headers: &HeaderMap) -> HeaderValue {
    let https = headers
        .get("x-forwarded-proto")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|proto| proto.eq_ignore_ascii_case("https"));
    let text = format!(
        "{SESSION_COOKIE}={token}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{}",
        if https { "; Secure" } else { "" }
    );
    // A token is hex: the value is always a valid header.
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

async fn state(State(page): State<Arc<Page>>, headers: HeaderMap) -> Response {
    let admin = page.session(&headers).is_some();
    let report = page.report().await;
    let router = &page.status.router;
    // `report.units` lists `router.units()` in the same order.
    let units = router
        .units()
        .into_iter()
        .zip(report.units)
        .map(|(unit, status)| PageUnit {
            partition: unit.partition,
            shard: unit.shard,
            consumer: status.consumer,
            owner: status.owner,
            pending: status.pending,
            ack_pending: status.ack_pending,
        })
        .collect::<Vec<_>>();
    let shards = units.iter().map(|unit| unit.shard + 1).max().unwrap_or(0);
    let state = PageState {
        admin,
        rows: report.rows,
        totals: report.totals,
        fleet: report.fleet,
        partitions: router.partitions(),
        shards,
        units,
        plugins: report.plugins,
        nats_connected: report.nats.connected,
        nats_answered: report.nats.answered,
        tenants: admin.then_some(report.tenants),
        queued_history: page.status.queued_history.samples(),
    };
    let mut response = axum::Json(state).into_response();
    protect(response.headers_mut());
    response
}

async fn dead_letters(
    State(page): State<Arc<Page>>,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    page.session(&headers).ok_or(PageError::NoSession)?;
    let letters = page.recent_letters().await?;
    let mut response = axum::Json(json!({ "letters": letters })).into_response();
    protect(response.headers_mut());
    Ok(response)
}

async fn replay(
    State(page): State<Arc<Page>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, PageError> {
    same_origin(&headers)?;
    page.session(&headers).ok_or(PageError::NoSession)?;
    let Replay { sequence } = json_body(&body)?;
    let filter = LetterFilter {
        sequences: vec![sequence],
        ..LetterFilter::default()
    };
    let replayed = page.letters.replay(&filter).await?;
    // The next poll must not show the letter just replayed.
    *page.letters_cache.lock().await = None;
    tracing::info!(sequence, "dead letter replayed from the live page");
    Ok(axum::Json(json!({
        "replayed": replayed.rows.len(),
        "bad_lines_left": replayed.bad_lines.len(),
    }))
    .into_response())
}

async fn login(
    State(page): State<Arc<Page>>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, PageError> {
    same_origin(&headers)?;
    let address = peer.map(|Extension(ConnectInfo(address))| address.ip());
    if page.guessing(address) {
        return Err(PageError::Guessing);
    }
    let Login { key } = json_body(&body)?;
    let admin_keys = page.admin_key_digests();
    if admin_keys.is_empty() {
        return Err(PageError::AdminOff);
    }
    let digest: [u8; 32] = Sha256::digest(key.trim().as_bytes()).into();
    if !admin_keys.contains(&digest) {
        page.count_failed_login(address);
        return Err(PageError::WrongKey);
    }
    let token = page.open_session(digest)?;
    let mut response = axum::Json(json!({ "admin": true })).into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        session_cookie(&token, SESSION_TTL.as_secs(), &headers),
    );
    protect(response.headers_mut());
    Ok(response)
}

async fn logout(State(page): State<Arc<Page>>, headers: HeaderMap) -> Result<Response, PageError> {
    same_origin(&headers)?;
    if let Some(token) = cookie(&headers, SESSION_COOKIE) {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Ok(mut sessions) = page.sessions.lock() {
            sessions.by_digest.remove(&digest);
        }
    }
    let mut response = axum::Json(json!({ "admin": false })).into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session_cookie("", 0, &headers));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn a_cookie_is_found_among_others_and_only_by_its_whole_name() {
        let h = headers(&[("cookie", "a=1; weir_session=abc ; x_weir_session=no")]);
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("abc"));
        let h = headers(&[("cookie", "x_weir_session=no")]);
        assert_eq!(cookie(&h, SESSION_COOKIE), None);
    }

    #[test]
    fn only_a_request_from_this_hosts_origin_may_change_anything() {
        let ok = headers(&[
            ("origin", "http://127.0.0.1:8080"),
            ("host", "127.0.0.1:8080"),
        ]);
        assert!(same_origin(&ok).is_ok());
        let proxied = headers(&[
            ("origin", "https://weir.example"),
            ("host", "10.0.0.7:8080"),
            ("x-forwarded-host", "weir.example"),
        ]);
        assert!(same_origin(&proxied).is_ok());
        for bad in [
            headers(&[("host", "127.0.0.1:8080")]),
            headers(&[("origin", "null"), ("host", "127.0.0.1:8080")]),
            headers(&[
                ("origin", "http://evil.example"),
                ("host", "127.0.0.1:8080"),
            ]),
            headers(&[
                ("origin", "http://127.0.0.1:8080.evil"),
                ("host", "127.0.0.1:8080"),
            ]),
        ] {
            assert!(matches!(same_origin(&bad), Err(PageError::CrossOrigin)));
        }
    }

    #[test]
    fn the_session_cookie_is_http_only_and_same_site_strict() {
        let value = session_cookie("00ff", 60, &HeaderMap::new());
        let text = value.to_str().unwrap();
        assert!(
            text.contains("HttpOnly") && text.contains("SameSite=Strict"),
            "{text}"
        );
        assert!(!text.contains("Secure"));
        let https = headers(&[("x-forwarded-proto", "https")]);
        assert!(
            session_cookie("00ff", 60, &https)
                .to_str()
                .unwrap()
                .ends_with("; Secure")
        );
    }
}
