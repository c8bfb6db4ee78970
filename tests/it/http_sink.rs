//! The HTTP sink against a local endpoint: batches arrive as NDJSON, 5xx
//! answers are retried (each row under the same key, to drop a replay), 4xx
//! dead-lettered, ungranted hosts denied, and a
//! `wasi:http` plugin without `grants.http` loaded, its every request denied;
//! batches share a few keep-alive connections rather than one each, unless
//! `http_keep_alive = false` gives each request a connection of its own.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};

use crate::support::{
    Nats, TestHost, backlog, base_config, dead_letter_reasons, eventually, orders,
};

/// One request the endpoint received, and the status it answered.
#[derive(Debug, Clone)]
struct Received {
    content_type: String,
    idempotency_key: String,
    body: String,
    status: u16,
}

#[derive(Default)]
struct Script {
    /// Statuses for the next requests, in order...
    next: VecDeque<u16>,
    /// ... and the one answered once they run out.
    then: u16,
    received: Vec<Received>,
}

/// A local HTTP server on 127.0.0.1 answering a scripted sequence of statuses.
struct Endpoint {
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    /// TCP connections accepted so far.
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Endpoint {
    async fn start(next: &[u16], then: u16) -> Endpoint {
        Endpoint::serve(next, then, None).await
    }

    /// The same endpoint over HTTPS, with a certificate of a test-made CA.
    async fn start_tls(then: u16, files: &crate::nats_auth::tls::TlsFiles) -> Endpoint {
        let server = weir::config::TlsFiles {
            cert: files.server_cert.clone(),
            key: files.server_key.clone(),
        }
        .server_config()
        .expect("a TLS server config");
        Endpoint::serve(
            &[],
            then,
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(server))),
        )
        .await
    }

    /// Answers `next`, then `then`; over TLS with `tls`.
    async fn serve(next: &[u16], then: u16, tls: Option<tokio_rustls::TlsAcceptor>) -> Endpoint {
        let script = Arc::new(Mutex::new(Script {
            next: next.iter().copied().collect(),
            then,
            received: Vec::new(),
        }));
        let app = axum::Router::new()
            .route("/ingest", axum::routing::post(answer))
            .with_state(script.clone());
        let inner = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the test endpoint");
        let addr = inner.local_addr().expect("endpoint address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        let task = tokio::spawn(async move {
            let served = match tls {
                None => {
                    axum::serve(
                        Counting {
                            inner,
                            accepted: counted,
                        },
                        app,
                    )
                    .await
                }
                Some(acceptor) => {
                    let listener = TlsCounting {
                        inner,
                        acceptor,
                        accepted: counted,
                    };
                    axum::serve(listener, app).await
                }
            };
            served.expect("test endpoint serves");
        });
        Endpoint {
            addr,
            script,
            accepted,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/ingest", self.addr)
    }

    fn received(&self) -> Vec<Received> {
        self.script.lock().unwrap().received.clone()
    }

    /// How many times each line arrived in a body answered 2xx.
    fn delivered_lines(&self) -> BTreeMap<String, usize> {
        let mut lines = BTreeMap::new();
        for received in self.received() {
            if (200..300).contains(&received.status) {
                for line in received.body.lines() {
                    *lines.entry(line.to_string()).or_default() += 1;
                }
            }
        }
        lines
    }
}

/// A listener that counts the connections it accepts.
struct Counting {
    inner: tokio::net::TcpListener,
    accepted: Arc<AtomicUsize>,
}

impl axum::serve::Listener for Counting {
    type Io = tokio::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let accepted = axum::serve::Listener::accept(&mut self.inner).await;
        self.accepted.fetch_add(1, Ordering::SeqCst);
        accepted
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A listener that counts the TCP connections it accepts and speaks TLS on
/// them (a connection whose handshake fails is counted and dropped).
struct TlsCounting {
    inner: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    accepted: Arc<AtomicUsize>,
}

impl axum::serve::Listener for TlsCounting {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (tcp, addr) = axum::serve::Listener::accept(&mut self.inner).await;
            self.accepted.fetch_add(1, Ordering::SeqCst);
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    State(script): State<Arc<Mutex<Script>>>,
    request_headers: HeaderMap,
    body: axum::body::Bytes,
) -> (StatusCode, String) {
    let mut script = script.lock().unwrap();
    let status = script.next.pop_front().unwrap_or(script.then);
    script.received.push(Received {
        content_type: request_headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string(),
        idempotency_key: request_headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string(),
        body: String::from_utf8_lossy(&body).into_owned(),
        status,
    });
    let text = if status < 300 {
        "ok".to_string()
    } else {
        format!("scripted {status}")
    };
    (StatusCode::from_u16(status).unwrap(), text)
}

/// The HTTP sink as plugin `hooks` for table `events`, POSTing to `url`,
/// granted `grants` (a TOML array, or nothing when empty).
fn http_pipeline(url: &str, grants: &str) -> String {
    http_pipeline_with(&format!("url = \"{url}\""), grants)
}

/// The same with the sink's `settings` as given (inline TOML table body).
fn http_pipeline_with(settings: &str, grants: &str) -> String {
    let grants = if grants.is_empty() {
        String::new()
    } else {
        format!("grants.http = {grants}\n")
    };
    format!(
        r#"
[plugins.hooks]
wasm = "weir_http_sink.wasm"
world = "sink"
settings = {{ {settings} }}
{grants}
[[pipelines]]
tables = ["events"]
sink = "hooks"
"#
    )
}

/// The lines of `orders(start, count)`, one per row.
fn order_lines(start: usize, count: usize) -> Vec<String> {
    orders(start, count).lines().map(str::to_string).collect()
}

/// Waits until every row is settled (nothing pending, unacked or stored).
async fn settled(nats: &Nats) {
    let client = nats.client().await;
    eventually(Duration::from_secs(30), "every row settled", || async {
        (backlog(&client).await == (0, 0, 0)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_arrive_at_the_endpoint_as_ndjson_exactly_once() {
    let nats = Nats::start();
    let endpoint = Endpoint::start(&[], 200).await;
    let grant = format!("[\"{}\"]", endpoint.addr);
    let extra = http_pipeline(&endpoint.url(), &grant);
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;

    let expected = order_lines(0, 50);
    let response = host.ingest("events", orders(0, 50)).await;
    assert_eq!(response.status(), 202);
    eventually(Duration::from_secs(30), "all rows posted", || async {
        (endpoint.delivered_lines().len() == expected.len()).then_some(())
    })
    .await;
    settled(&nats).await;

    let lines = endpoint.delivered_lines();
    for line in &expected {
        assert_eq!(lines.get(line), Some(&1), "{line} arrived {lines:?}");
    }
    assert_eq!(lines.len(), expected.len(), "{lines:?}");
    for received in endpoint.received() {
        assert_eq!(received.content_type, "application/x-ndjson");
        assert!(received.body.ends_with('\n'), "{:?}", received.body);
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_5xx_answer_makes_the_rows_come_again_until_they_are_delivered() {
    let nats = Nats::start();
    let endpoint = Endpoint::start(&[500], 200).await;
    let grant = format!("[\"{}\"]", endpoint.addr);
    let extra = http_pipeline(&endpoint.url(), &grant);
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;

    let expected = order_lines(0, 5);
    let response = host.ingest("events", orders(0, 5)).await;
    assert_eq!(response.status(), 202);
    eventually(Duration::from_secs(30), "all rows delivered", || async {
        (endpoint.delivered_lines().len() == expected.len()).then_some(())
    })
    .await;
    settled(&nats).await;

    let received = endpoint.received();
    assert_eq!(received[0].status, 500, "{received:?}");
    let refused: Vec<&str> = received[0].body.lines().collect();
    assert!(!refused.is_empty());
    let lines = endpoint.delivered_lines();
    for line in &expected {
        assert_eq!(lines.get(line), Some(&1), "{line}: {lines:?}");
    }
    for line in refused {
        assert!(lines.contains_key(line), "{line} was not retried");
    }
    host.shutdown().await;
}

/// A row sent again after its POST failed (as after a lost answer, a
/// crash or a takeover) carries the same key, so the endpoint can drop
/// what it already has: `key_field` puts `<tenant>/<table>/<sequence>` in
/// each line, and every POST names its batch in `idempotency-key`.
#[tokio::test(flavor = "multi_thread")]
async fn a_row_sent_again_carries_the_same_key_for_the_endpoint_to_drop_it() {
    let nats = Nats::start();
    let endpoint = Endpoint::start(&[500], 200).await;
    let grant = format!("[\"{}\"]", endpoint.addr);
    let settings = format!("url = \"{}\", key_field = \"weir_key\"", endpoint.url());
    let extra = http_pipeline_with(&settings, &grant);
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;

    let response = host.ingest("events", orders(0, 5)).await;
    assert_eq!(response.status(), 202);
    eventually(Duration::from_secs(30), "all rows delivered", || async {
        (endpoint.delivered_lines().len() == 5).then_some(())
    })
    .await;
    settled(&nats).await;

    let key_of = |line: &str| -> String {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        row["weir_key"].as_str().unwrap().to_string()
    };
    let received = endpoint.received();
    let refused = &received[0];
    assert_eq!(refused.status, 500, "{received:?}");
    let delivered: Vec<String> = endpoint
        .delivered_lines()
        .keys()
        .map(|l| key_of(l))
        .collect();
    let unique: std::collections::BTreeSet<&String> = delivered.iter().collect();
    assert_eq!(unique.len(), 5, "one key per row: {delivered:?}");
    for key in &delivered {
        let (table, sequence) = key.rsplit_once('/').unwrap();
        assert_eq!(table, "acme/events", "{key}");
        assert!(sequence.parse::<u64>().is_ok(), "{key}");
    }
    // Every refused row came again under its key; the line is the payload
    // with the key first, the rest as the producer sent it.
    for line in refused.body.lines() {
        assert!(line.starts_with("{\"weir_key\":\"acme/events/"), "{line}");
        assert!(
            delivered.contains(&key_of(line)),
            "{line} came again under another key"
        );
    }
    for request in &received {
        assert_eq!(request.idempotency_key.len(), 32, "{request:?}");
        assert!(
            request
                .idempotency_key
                .chars()
                .all(|c| c.is_ascii_hexdigit())
        );
    }
    // The same rows in the same batch: the same request key.
    if let Some(again) = received[1..].iter().find(|r| r.body == refused.body) {
        assert_eq!(again.idempotency_key, refused.idempotency_key);
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_4xx_answer_dead_letters_the_rows_with_the_status() {
    let nats = Nats::start();
    let endpoint = Endpoint::start(&[], 400).await;
    let grant = format!("[\"{}\"]", endpoint.addr);
    let extra = http_pipeline(&endpoint.url(), &grant);
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;

    let response = host.ingest("events", orders(0, 3)).await;
    assert_eq!(response.status(), 202);
    let reasons = dead_letter_reasons(&nats, 3).await;
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    let expected = format!("http sink: 400 from {}: scripted 400", endpoint.url());
    for reason in &reasons {
        assert!(reason.contains(&expected), "{reason}");
    }
    assert!(endpoint.delivered_lines().is_empty());
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_to_a_host_not_in_grants_http_is_denied_and_dead_lettered() {
    let nats = Nats::start();
    let granted = Endpoint::start(&[], 200).await;
    let other = Endpoint::start(&[], 200).await;
    let grant = format!("[\"{}\"]", granted.addr);
    let extra = http_pipeline(&other.url(), &grant);
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;

    let response = host.ingest("events", orders(0, 1)).await;
    assert_eq!(response.status(), 202);
    let reasons = dead_letter_reasons(&nats, 1).await;
    assert!(
        reasons[0].contains(&format!(
            "http sink: request to {} denied: not in grants.http",
            other.addr
        )),
        "{reasons:?}"
    );
    assert!(other.received().is_empty(), "{:?}", other.received());
    assert!(granted.received().is_empty(), "{:?}", granted.received());
    host.shutdown().await;
}

/// componentize-js imports wasi:http by default: such a plugin loads, and
/// each request it makes is refused at call time (`HttpRequestDenied`).
#[tokio::test(flavor = "multi_thread")]
async fn a_wasi_http_plugin_without_grants_http_loads_and_every_request_is_denied() {
    let nats = Nats::start();
    let endpoint = Endpoint::start(&[], 200).await;
    let extra = http_pipeline(&endpoint.url(), "");
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;

    let response = host.ingest("events", orders(0, 2)).await;
    assert_eq!(response.status(), 202);
    let reasons = dead_letter_reasons(&nats, 2).await;
    for reason in &reasons {
        assert!(
            reason.contains(&format!(
                "http sink: request to {} denied: not in grants.http",
                endpoint.addr
            )),
            "{reasons:?}"
        );
    }
    assert!(endpoint.received().is_empty(), "{:?}", endpoint.received());
    host.shutdown().await;
}

/// Posts `batches` rows one at a time, each posted before the next is
/// ingested (each a batch of its own), through the HTTP sink with
/// `plugin_extra` in its plugin table: (requests, TCP connections accepted).
async fn connections_for_batches(batches: usize, plugin_extra: &str) -> (usize, usize) {
    let nats = Nats::start();
    let endpoint = Endpoint::start(&[], 200).await;
    let grant = format!("[\"{}\"]\n{plugin_extra}", endpoint.addr);
    let extra = http_pipeline(&endpoint.url(), &grant);
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;
    for id in 0..batches {
        let response = host.ingest("events", orders(id, 1)).await;
        assert_eq!(response.status(), 202);
        eventually(Duration::from_secs(30), "the row posted", || async {
            (endpoint.delivered_lines().len() == id + 1).then_some(())
        })
        .await;
    }
    settled(&nats).await;
    let requests = endpoint.received().len();
    let accepted = endpoint.accepted.load(Ordering::SeqCst);
    assert!(requests >= batches, "{requests} requests");
    println!(
        "http sink ({}): {requests} batches over {accepted} TCP connections ({:.1} per 1,000 batches)",
        if plugin_extra.is_empty() {
            "pooled"
        } else {
            plugin_extra
        },
        accepted as f64 * 1000.0 / requests as f64
    );
    host.shutdown().await;
    (requests, accepted)
}

/// Batches one after another reuse the plugin's keep-alive connections: the
/// endpoint accepts a few (at most one per instance that ran), not one per
/// batch as before pooling.
#[tokio::test(flavor = "multi_thread")]
async fn batches_reuse_a_few_keep_alive_connections_instead_of_one_each() {
    let (requests, accepted) = connections_for_batches(120, "").await;
    assert!(
        accepted <= 8,
        "{accepted} connections for {requests} batches: not kept alive"
    );
}

/// `http_keep_alive = false` turns the pool off: every request comes over
/// a connection of its own.
#[tokio::test(flavor = "multi_thread")]
async fn without_keep_alive_every_batch_opens_a_connection_of_its_own() {
    let (requests, accepted) = connections_for_batches(40, "http_keep_alive = false").await;
    assert_eq!(
        accepted, requests,
        "{accepted} connections for {requests} requests: some were reused"
    );
}

/// An HTTPS endpoint whose certificate a private CA signed: with `http_ca`
/// naming that CA the sink's requests trust it and batches share a few
/// pooled TLS connections; without it no request gets through (the rows
/// stay queued, retried) and nothing reaches the endpoint.
#[tokio::test(flavor = "multi_thread")]
async fn an_https_endpoint_of_a_private_ca_is_trusted_through_http_ca_and_pooled() {
    let dir = tempfile::tempdir().unwrap();
    let files = crate::nats_auth::tls::tls_files(dir.path());
    let endpoint = Endpoint::start_tls(200, &files).await;
    let url = format!("https://localhost:{}/ingest", endpoint.addr.port());
    let grant = format!("[\"localhost:{}\"]", endpoint.addr.port());

    // Without the CA: the handshake fails, nothing is delivered.
    let nats = Nats::start();
    let untrusted = TestHost::start(&base_config(nats.url(), &http_pipeline(&url, &grant))).await;
    assert_eq!(untrusted.ingest("events", orders(0, 1)).await.status(), 202);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        endpoint.received().is_empty(),
        "a certificate of an untrusted CA was accepted"
    );
    assert!(
        endpoint.accepted.load(Ordering::SeqCst) > 0,
        "no attempt made"
    );
    untrusted.shutdown().await;
    drop(nats);

    // With it: every batch delivered, over a few kept-alive connections.
    let nats = Nats::start();
    let before = endpoint.accepted.load(Ordering::SeqCst);
    let grant = format!("{grant}\nhttp_ca = \"{}\"", files.ca.display());
    let host = TestHost::start(&base_config(nats.url(), &http_pipeline(&url, &grant))).await;
    const BATCHES: usize = 30;
    for id in 0..BATCHES {
        assert_eq!(host.ingest("events", orders(id, 1)).await.status(), 202);
        eventually(
            Duration::from_secs(30),
            "the row posted over HTTPS",
            || async { (endpoint.delivered_lines().len() == id + 1).then_some(()) },
        )
        .await;
    }
    settled(&nats).await;
    let connections = endpoint.accepted.load(Ordering::SeqCst) - before;
    println!("https sink with http_ca: {BATCHES} batches over {connections} TLS connections");
    assert!(
        connections <= 8,
        "{connections} TLS connections for {BATCHES} batches: not kept alive"
    );
    host.shutdown().await;
}
