//! Benchmark: how long a row takes from its 202 to its sink, the figure a
//! user of an ingest host compares first, with the raw JetStream path
//! (PubAck → a pull consumer) as the limit, side by side in one run.
//!
//! 1. The maximum: `CLIENTS` producers post 100-row requests back to back;
//!    rows per second from the first post until the sink has every row.
//! 2. At 10 % and 50 % of that rate, requests are offered open-loop (on a
//!    clock, whatever the answers' pace) for `WEIR_BENCH_SECONDS` (default
//!    5). Each row is stamped when its request is answered 202, and again
//!    when weir's HTTP sink plugin POSTs it to this bench's endpoint: p50,
//!    p99 and max of the difference. A row can reach the sink before its
//!    202 reaches the producer; it counts as 0.
//! 3. The raw path at the same offered rates: each 100-row request is
//!    published pipelined and stamped at its last PubAck; a pull consumer
//!    stamps each row as it receives it (and acks it).
//!
//! 4. Pooling: the same as 2, at the same offered rates, through a second
//!    host whose HTTP sink has `http_keep_alive = false` (a fresh TCP
//!    connection per request, as before outbound HTTP was pooled). For
//!    both hosts, the TCP connections the endpoint accepted per 1,000
//!    batches (POSTs) it received during each phase.
//!
//! The host runs the default topology (4 partitions of one shard), a
//! pass-through transform and the HTTP sink (`plugins/http-sink`). Every
//! row must arrive, or the bench fails. `cargo bench -p weir --bench
//! latency`; `WEIR_BENCH_ROWS` (default 100000) sizes the maximum's run.

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use weir::config::{Config, Overrides};
use weir::host::RunningHost;

use support::{Table, env_count, post, print_figure};

const BENCH: &str = "latency";
const ROWS_PER_REQUEST: usize = 100;
const CLIENTS: usize = 4;
const TABLE: &str = "events";
/// The offered loads, as shares of the measured maximum.
const LOADS: &[(f64, &str)] = &[(0.1, "10pct"), (0.5, "50pct")];
/// Longest wait for every row of a phase to reach its sink.
const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(120);
/// What the issues ask (#35: with the defaults, early-closing batches on):
/// p99 at 10 % and 50 % load, and against the raw p99.
const TARGET_P99_MS: &[(&str, f64)] = &[("10pct", 3.0), ("50pct", 15.0)];
const TARGET_RATIO_TO_RAW: f64 = 5.0;

fn main() {
    support::install_tls_provider();
    let rows = env_count("WEIR_BENCH_ROWS", 100_000);
    let seconds = env_count("WEIR_BENCH_SECONDS", 5) as u64;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(rows, Duration::from_secs(seconds)));
}

/// When each row was accepted and when it first arrived, by row id.
struct Stamps {
    accepted: Mutex<HashMap<u64, Instant>>,
    arrived: Mutex<HashMap<u64, Instant>>,
}

impl Stamps {
    fn new() -> Arc<Stamps> {
        Arc::new(Stamps {
            accepted: Mutex::new(HashMap::new()),
            arrived: Mutex::new(HashMap::new()),
        })
    }

    fn accept(&self, ids: std::ops::Range<u64>) {
        let now = Instant::now();
        let mut accepted = self.accepted.lock().expect("stamps");
        accepted.extend(ids.map(|id| (id, now)));
    }

    /// Rows that reached the sink together; a redelivered row counts once,
    /// at its first arrival.
    fn arrive(&self, ids: impl IntoIterator<Item = u64>) {
        let now = Instant::now();
        let mut arrived = self.arrived.lock().expect("stamps");
        for id in ids {
            arrived.entry(id).or_insert(now);
        }
    }

    /// Waits until `count` rows have arrived; fails the bench if they never do.
    async fn all_arrived(&self, count: usize, what: &str) {
        let deadline = Instant::now() + ARRIVAL_TIMEOUT;
        loop {
            let arrived = self.arrived.lock().expect("stamps").len();
            if arrived >= count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {arrived} of {count} rows arrived in {ARRIVAL_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Accept-to-arrival of rows `ids`, in milliseconds, sorted.
    fn latencies_ms(&self, ids: std::ops::Range<u64>) -> Vec<f64> {
        let accepted = self.accepted.lock().expect("stamps");
        let arrived = self.arrived.lock().expect("stamps");
        let mut latencies: Vec<f64> = ids
            .map(|id| {
                let (Some(accepted), Some(arrived)) = (accepted.get(&id), arrived.get(&id)) else {
                    panic!("row {id} was not stamped at both ends");
                };
                arrived.saturating_duration_since(*accepted).as_secs_f64() * 1e3
            })
            .collect();
        latencies.sort_by(f64::total_cmp);
        latencies
    }
}

/// The `q` quantile of sorted values.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let index = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index]
}

/// The body of rows `ids`, one NDJSON line each.
fn body(ids: std::ops::Range<u64>) -> Bytes {
    let mut body = Vec::with_capacity(ids.clone().count() * (support::ROW_BYTES + 1));
    for id in ids {
        body.extend_from_slice(&support::row(id));
        body.push(b'\n');
    }
    Bytes::from(body)
}

/// The `id` of a row of [`support::row`].
fn row_id(line: &[u8]) -> Option<u64> {
    let rest = line.strip_prefix(br#"{"id":"#)?;
    let end = rest.iter().position(|b| !b.is_ascii_digit())?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// What the endpoint counted: POSTs (batches) and TCP connections accepted.
#[derive(Default)]
struct Counts {
    requests: AtomicUsize,
    connections: AtomicUsize,
}

impl Counts {
    fn now(&self) -> (usize, usize) {
        (
            self.requests.load(Ordering::SeqCst),
            self.connections.load(Ordering::SeqCst),
        )
    }

    /// Connections accepted per 1,000 batches since `before` (a [`Counts::now`]).
    fn sockets_per_1000_batches_since(&self, before: (usize, usize)) -> f64 {
        let (requests, connections) = self.now();
        let batches = requests.saturating_sub(before.0).max(1);
        connections.saturating_sub(before.1) as f64 * 1000.0 / batches as f64
    }
}

/// A listener that counts the connections it accepts.
struct Counting {
    inner: tokio::net::TcpListener,
    counts: Arc<Counts>,
}

impl axum::serve::Listener for Counting {
    type Io = tokio::net::TcpStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let accepted = axum::serve::Listener::accept(&mut self.inner).await;
        self.counts.connections.fetch_add(1, Ordering::SeqCst);
        accepted
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// The endpoint weir's HTTP sink posts to: stamps every row as it arrives,
/// and counts requests and connections.
async fn start_endpoint(stamps: Arc<Stamps>, counts: Arc<Counts>) -> std::net::SocketAddr {
    let requests = counts.clone();
    let app = axum::Router::new().route(
        "/rows",
        axum::routing::post(move |body: Bytes| {
            let stamps = stamps.clone();
            requests.requests.fetch_add(1, Ordering::SeqCst);
            async move {
                let ids = body
                    .split(|b| *b == b'\n')
                    .filter(|l| !l.is_empty())
                    .map(|line| {
                        row_id(line).unwrap_or_else(|| {
                            panic!("the sink posted a line that is no bench row: {line:?}")
                        })
                    });
                stamps.arrive(ids);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the endpoint");
    let addr = listener.local_addr().expect("endpoint address");
    let listener = Counting {
        inner: listener,
        counts,
    };
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A host of the default topology on `nats_url` into weir's HTTP sink
/// posting to `endpoint`, with `plugin_extra` in the sink's table, its
/// units claimed.
async fn start_host(
    nats_url: &str,
    dir: &std::path::Path,
    name: &str,
    endpoint: std::net::SocketAddr,
    plugin_extra: &str,
) -> RunningHost {
    let sink = format!(
        "wasm = {:?}\nworld = \"sink\"\nsettings = {{ url = \"http://{endpoint}/rows\" }}\ngrants.http = [\"{endpoint}\"]\n{plugin_extra}",
        weir_test_artifacts::HTTP_SINK
    );
    let text = support::pass_through_config_into(
        nats_url,
        &dir.join(name),
        support::DEFAULT_LAYOUT,
        &[TABLE.into()],
        &sink,
    );
    let config = Config::parse(
        &dir.join(format!("{name}.toml")),
        &text,
        &Overrides::default(),
    )
    .unwrap_or_else(|err| panic!("the bench's config is valid: {err}"));
    let units = (support::DEFAULT_LAYOUT.0 * support::DEFAULT_LAYOUT.1) as usize;
    let host = RunningHost::start(config).await.expect("weir host starts");
    support::wait_claimed(&host, units).await;
    host
}

/// Offers requests of rows from `first` at `rows_per_sec` for `window`,
/// each sent on its tick whatever the previous ones' pace; `send` stamps
/// its rows once they are accepted. Returns the ids offered.
async fn offer<F, Fut>(
    first: u64,
    rows_per_sec: f64,
    window: Duration,
    send: F,
) -> std::ops::Range<u64>
where
    F: Fn(std::ops::Range<u64>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let period = Duration::from_secs_f64(ROWS_PER_REQUEST as f64 / rows_per_sec);
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let requests = (window.as_secs_f64() / period.as_secs_f64()).ceil() as u64;
    let mut sent = Vec::new();
    for request in 0..requests {
        ticks.tick().await;
        let start = first + request * ROWS_PER_REQUEST as u64;
        sent.push(tokio::spawn(send(start..start + ROWS_PER_REQUEST as u64)));
    }
    for request in sent {
        request.await.expect("a request task");
    }
    first..first + requests * ROWS_PER_REQUEST as u64
}

/// p50, p99 and max of one path at one load.
struct Measured {
    p50: f64,
    p99: f64,
    max: f64,
}

fn measure(stamps: &Stamps, ids: std::ops::Range<u64>) -> Measured {
    let sorted = stamps.latencies_ms(ids);
    Measured {
        p50: quantile(&sorted, 0.50),
        p99: quantile(&sorted, 0.99),
        max: *sorted.last().expect("rows were offered"),
    }
}

async fn run(rows: usize, window: Duration) {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = support::start_nats(&dir.path().join("nats")).await;
    let client = async_nats::connect(server.url())
        .await
        .expect("connect to the bench's nats-server");
    let js = jetstream::new(client.clone());

    let stamps = Stamps::new();
    let counts = Arc::new(Counts::default());
    let endpoint = start_endpoint(stamps.clone(), counts.clone()).await;
    let host = start_host(server.url(), dir.path(), "pooled", endpoint, "").await;
    let url = format!("http://{}/v1/ingest/{TABLE}", host.http_addr());
    let http = reqwest::Client::new();

    // 1. The maximum, 202 to sink.
    let rows = rows - rows % ROWS_PER_REQUEST;
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (http, url, next, stamps) =
                (http.clone(), url.clone(), next.clone(), stamps.clone());
            tokio::spawn(async move {
                loop {
                    let start = next.fetch_add(ROWS_PER_REQUEST, Ordering::Relaxed) as u64;
                    if start >= rows as u64 {
                        return;
                    }
                    let ids = start..start + ROWS_PER_REQUEST as u64;
                    post(&http, &url, body(ids.clone())).await;
                    stamps.accept(ids);
                }
            })
        })
        .collect();
    for client in clients {
        client.await.expect("a producer");
    }
    stamps.all_arrived(rows, "the maximum").await;
    let max_rows_per_sec = rows as f64 / started.elapsed().as_secs_f64();
    print_figure(BENCH, "max_rows_per_sec", max_rows_per_sec);

    // The raw path: a stream and consumer like a partition's, read by a
    // task that stamps and acks each row.
    let consumer = support::raw_consumer(&js, 1).await;
    let reader_stamps = stamps.clone();
    let reader = tokio::spawn(async move {
        let mut messages = consumer
            .stream()
            .max_messages_per_batch(support::RAW_PULL_BATCH)
            .messages()
            .await
            .expect("the raw consumer's messages");
        while let Some(message) = messages.next().await {
            let message = message.expect("a raw row");
            let id = row_id(&message.payload).expect("a bench row");
            reader_stamps.arrive([id]);
            message.ack().await.expect("ack a raw row");
        }
    });

    let mut table = Table::new(&[
        "load",
        "offered rows/s",
        "path",
        "p50 ms",
        "p99 ms",
        "max ms",
        "sockets / 1,000 batches",
    ]);
    let mut first = rows as u64;
    let mut arrived = rows;
    let mut pooled = Vec::new();
    for (share, label) in LOADS {
        let rate = share * max_rows_per_sec;
        let before = counts.now();
        let weir_ids = offer_weir(&http, &url, &stamps, first, rate, window).await;
        arrived += weir_ids.clone().count();
        stamps.all_arrived(arrived, "weir").await;
        let sockets = counts.sockets_per_1000_batches_since(before);
        first = weir_ids.end;

        let raw_ids = offer(first, rate, window, |ids| {
            let (js, stamps) = (js.clone(), stamps.clone());
            async move {
                let mut acks = FuturesUnordered::new();
                for id in ids.clone() {
                    let ack = js
                        .publish("raw.acme.events", Bytes::from(support::row(id)))
                        .await
                        .expect("publish a raw row");
                    acks.push(ack.into_future());
                }
                while let Some(ack) = acks.next().await {
                    ack.expect("raw row stored");
                }
                stamps.accept(ids);
            }
        })
        .await;
        arrived += raw_ids.clone().count();
        stamps.all_arrived(arrived, "raw").await;
        first = raw_ids.end;

        let weir = measure(&stamps, weir_ids);
        let raw = measure(&stamps, raw_ids);
        print_figure(BENCH, &format!("p50_ms_at_{label}"), weir.p50);
        print_figure(BENCH, &format!("p99_ms_at_{label}"), weir.p99);
        print_figure(BENCH, &format!("max_ms_at_{label}"), weir.max);
        print_figure(BENCH, &format!("raw_p50_ms_at_{label}"), raw.p50);
        print_figure(BENCH, &format!("raw_p99_ms_at_{label}"), raw.p99);
        print_figure(BENCH, &format!("raw_max_ms_at_{label}"), raw.max);
        print_figure(
            BENCH,
            &format!("ratio_p99_to_raw_at_{label}"),
            weir.p99 / raw.p99.max(f64::MIN_POSITIVE),
        );
        print_figure(
            BENCH,
            &format!("sockets_per_1000_batches_at_{label}"),
            sockets,
        );
        pooled.push((rate, weir, sockets, raw));
    }
    reader.abort();
    host.shutdown().await;

    // 4. The same loads through a host whose sink connects for every request.
    let host = start_host(
        server.url(),
        dir.path(),
        "no-keep-alive",
        endpoint,
        "http_keep_alive = false\n",
    )
    .await;
    let url = format!("http://{}/v1/ingest/{TABLE}", host.http_addr());
    for ((_, label), (rate, pooled_weir, pooled_sockets, raw)) in LOADS.iter().zip(&pooled) {
        let rate = *rate;
        let before = counts.now();
        let ids = offer_weir(&http, &url, &stamps, first, rate, window).await;
        arrived += ids.clone().count();
        stamps.all_arrived(arrived, "weir without keep-alive").await;
        let sockets = counts.sockets_per_1000_batches_since(before);
        first = ids.end;
        let unpooled = measure(&stamps, ids);
        print_figure(
            BENCH,
            &format!("no_keep_alive_p50_ms_at_{label}"),
            unpooled.p50,
        );
        print_figure(
            BENCH,
            &format!("no_keep_alive_p99_ms_at_{label}"),
            unpooled.p99,
        );
        print_figure(
            BENCH,
            &format!("no_keep_alive_max_ms_at_{label}"),
            unpooled.max,
        );
        print_figure(
            BENCH,
            &format!("no_keep_alive_sockets_per_1000_batches_at_{label}"),
            sockets,
        );
        let load = label.replace("pct", " %");
        for (path, m, sockets) in [
            (
                "weir 202 → sink, pooled",
                pooled_weir,
                format!("{pooled_sockets:.1}"),
            ),
            (
                "weir 202 → sink, http_keep_alive = false",
                &unpooled,
                format!("{sockets:.1}"),
            ),
            ("raw PubAck → consumer", raw, "—".to_string()),
        ] {
            table.push(vec![
                load.clone(),
                format!("{rate:.0}"),
                path.to_string(),
                format!("{:.2}", m.p50),
                format!("{:.2}", m.p99),
                format!("{:.2}", m.max),
                sockets,
            ]);
        }
    }
    table.print();
    let targets: Vec<String> = TARGET_P99_MS
        .iter()
        .map(|(label, ms)| format!("p99 ≤ {ms} ms at {}", label.replace("pct", " %")))
        .collect();
    println!(
        "targets: {}; p99 within {TARGET_RATIO_TO_RAW} × the raw path's",
        targets.join(", ")
    );
    host.shutdown().await;
}

/// Offers weir's front door requests at `rate` for `window` from row `first`.
async fn offer_weir(
    http: &reqwest::Client,
    url: &str,
    stamps: &Arc<Stamps>,
    first: u64,
    rate: f64,
    window: Duration,
) -> std::ops::Range<u64> {
    offer(first, rate, window, |ids| {
        let (http, url, stamps) = (http.clone(), url.to_string(), stamps.clone());
        async move {
            post(&http, &url, body(ids.clone())).await;
            stamps.accept(ids);
        }
    })
    .await
}
