//! Benchmark: the front door (HTTP NDJSON → parse → route → pipelined
//! JetStream publish → 202) against raw pipelined JetStream publish of the
//! same rows from the same process, on one nats-server, in one run.
//!
//! 1. Throughput: `CLIENTS` HTTP clients post 1000-row requests back to
//!    back; rows/s next to the raw publish rate (the limit), measured twice:
//!    to a plain stream with no consumer, and to the table's unit while the
//!    host delivers it, which is the server load the front door runs under
//!    (one publisher with a window of 1024 PubAcks, where the front door's
//!    4 requests keep 4 such windows in flight).
//! 2. Latency: requests offered open-loop at half that throughput for
//!    `WEIR_BENCH_SECONDS` (default 5); p50 and p99 from send to 202, and
//!    of the rows' accept-to-ack latency (stored in the stream → acked
//!    after delivery), read from the host's `weir_accept_to_ack_seconds`
//!    histogram on `/metrics` as Prometheus' `histogram_quantile` would
//!    (the buckets' growth between a scrape before and one after, with
//!    every offered row delivered; the throughput run's backlog is
//!    delivered before the first scrape).
//!
//! 3. Keyed requests: `KEYED_REQUESTS` requests with new `Idempotency-Key`s
//!    (rows/s), then the same again with every row stored already, as a
//!    retry after a lost answer is (rows/s; each duplicate counted).
//!    Then retries of partly stored requests, through the publisher the
//!    front door uses: `KEYED_REQUESTS` requests, the first half of each
//!    stored before (as a request cut short leaves them), sent again as a
//!    retry is (`Ids::Retry`: one fast batch that skips the stored rows,
//!    then every row again, many in flight, whose duplicate acks'
//!    sequences say which were stored before), beside the same
//!    requests with new ids (`Ids::Fresh`); rows/s of each and
//!    `ratio_retry_to_fresh` (each retry's rows all counted).
//! 4. The NATS door beside the HTTP door: the same bodies sent as NATS
//!    requests to `weir.ingest.acme.events` by `CLIENTS` requesters back to
//!    back, in rounds alternating with the HTTP run (medians), each on a connection of its own as each HTTP client has (rows/s,
//!    its ratio to HTTP and to raw publish; a request's mean time at the
//!    client and in the door, from `weir_ingest_request_duration_seconds`,
//!    for both doors: the difference is the way there and back), and
//!    offered open-loop at the HTTP run's offered rate (p50, p99 from send
//!    to the answer), each answer a `Weir-Status: 202`.
//!
//! The producers (HTTP clients and NATS requesters) run on a tokio runtime
//! of their own, as producers in processes of their own would; the host
//! runs on the bench's main runtime. Each round also reports nats-server's
//! CPU per row and this process's (host and producers): on a machine whose
//! cores the three share, throughput follows their sum.
//!
//! The host delivers while it ingests (pass-through transform, null sink),
//! as in production. Every request must be answered 202 and the host must
//! count every row accepted, or the bench fails: a fast wrong answer is not
//! a result. `cargo bench -p weir --bench front_door`; `WEIR_BENCH_ROWS`
//! (default 200000) sets the throughput run's size, `WEIR_BENCH_ROUNDS`
//! (default 5) how many rounds of each door alternate.

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use weir::config::{Config, Overrides};
use weir::host::RunningHost;
use weir::topology::Names;

use support::{
    TENANT, Table, env_count, median, median_of, post, print_figure, publish_pipelined,
    wait_claimed,
};

const BENCH: &str = "front_door";
/// The producers' runtime: clients run on workers of their own, as
/// producers in processes of their own would, not queued behind the host's
/// tasks on its workers (which delayed every wakeup of a client, and a
/// NATS request has more of them than an HTTP one).
static PRODUCERS: std::sync::OnceLock<tokio::runtime::Handle> = std::sync::OnceLock::new();

fn producers() -> &'static tokio::runtime::Handle {
    PRODUCERS.get().expect("main starts the producers' runtime")
}
const ROWS_PER_REQUEST: usize = 1000;
const CLIENTS: usize = 4;
/// Requests of the keyed runs (new keys, then the same again).
const KEYED_REQUESTS: usize = 40;
const TABLE: &str = "events";
/// Longest wait for the host to claim its units, or to drain the raw rows
/// before the front door runs.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
/// What the issue asks of the front door.
const TARGET_ROWS_PER_SEC: f64 = 100_000.0;
const TARGET_P99_MS: f64 = 50.0;

fn main() {
    support::install_tls_provider();
    let rows = env_count("WEIR_BENCH_ROWS", 200_000);
    let seconds = env_count("WEIR_BENCH_SECONDS", 5) as u64;
    let rounds = env_count("WEIR_BENCH_ROUNDS", 5).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let producers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("producer")
        .enable_all()
        .build()
        .expect("the producers' runtime");
    PRODUCERS.set(producers.handle().clone()).expect("set once");
    runtime.block_on(run(rows, rounds, Duration::from_secs(seconds)));
    producers.shutdown_background();
}

async fn run(rows: usize, rounds: usize, latency_window: Duration) {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = support::start_nats(&dir.path().join("nats")).await;
    let client = async_nats::connect(server.url())
        .await
        .expect("connect to the bench's nats-server");
    let js = jetstream::new(client.clone());
    let payloads: Vec<Bytes> = (0..rows as u64)
        .map(|id| Bytes::from(support::row(id)))
        .collect();

    // The limit: the same rows published straight to a plain stream.
    js.create_stream(stream::Config {
        name: "raw".into(),
        subjects: vec!["raw.>".into()],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .expect("create the raw stream");
    let subjects = vec![async_nats::Subject::from("raw.acme.events")];
    let raw_rows_per_sec = publish_pipelined(&js, &subjects, &payloads).await;
    js.delete_stream("raw")
        .await
        .expect("delete the raw stream");

    let config_path = dir.path().join("weir.toml");
    let text = support::pass_through_config(
        server.url(),
        &dir.path().join("data"),
        support::DEFAULT_LAYOUT,
        &[TABLE.into()],
    );
    let config = Config::parse(&config_path, &text, &Overrides::default())
        .unwrap_or_else(|err| panic!("the bench's config is valid: {err}"));
    let router = Names::new(
        &config.stream.prefix,
        config.stream.partitions,
        config.stream.shards,
    );
    let host = RunningHost::start(config).await.expect("weir host starts");
    wait_claimed(&host, router.units().len()).await;

    // The limit under the front door's load: the same rows published raw to
    // the table's unit while this host delivers them, as it delivers what
    // the front door stores. The server then does the same work per row in
    // both runs; the plain-stream figure above has no consumer at all.
    let unit = router.route(TENANT, TABLE);
    let subjects = vec![async_nats::Subject::from(
        router.subject(unit, TENANT, TABLE),
    )];
    let raw_delivering_rows_per_sec = publish_pipelined(&js, &subjects, &payloads).await;
    wait_delivered(&host, rows as u64).await;
    let url = format!("http://{}/v1/ingest/{TABLE}", host.http_addr());
    let bodies: Arc<Vec<Bytes>> = Arc::new(
        payloads
            .chunks(ROWS_PER_REQUEST)
            .map(|chunk| {
                let mut body = Vec::with_capacity(chunk.len() * (support::ROW_BYTES + 1));
                for row in chunk {
                    body.extend_from_slice(row);
                    body.push(b'\n');
                }
                Bytes::from(body)
            })
            .collect(),
    );
    let http = reqwest::Client::new();
    let producer_http = reqwest::Client::new();

    let metrics_url = format!("http://{}/metrics", host.http_addr());
    // The NATS door's requesters: one connection each, as each HTTP client
    // has its own.
    let subject = async_nats::Subject::from(router.ingest_subject(TENANT, TABLE));
    let mut requesters = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        requesters.push(
            producers()
                .spawn(async_nats::connect(server.url().to_string()))
                .await
                .expect("joined")
                .expect("a requester connects"),
        );
    }
    let requesters = Arc::new(requesters);
    // Throughput: clients take the next body until none is left, through
    // each door in turn, `rounds` times, so that noise on the shared
    // machine hits both doors alike; medians are reported.
    let (mut http_rounds, mut nats_rounds) = (Vec::new(), Vec::new());
    let mut sent = 0u64;
    let server_cpu = || support::stat_cpu(&format!("/proc/{}/stat", server.pid()));
    let own_cpu = || support::stat_cpu("/proc/self/stat");
    for _ in 0..rounds {
        for door in ["http", "nats"] {
            let (before, cpu_before) =
                (door_seconds(&http, &metrics_url, door).await, server_cpu());
            let process_before = own_cpu();
            let took = if door == "http" {
                run_clients(bodies.clone(), {
                    let (http, url) = (producer_http.clone(), url.clone());
                    move |_, _, body| {
                        let (http, url) = (http.clone(), url.clone());
                        async move { post(&http, &url, body).await }
                    }
                })
                .await
            } else {
                run_clients(bodies.clone(), {
                    let (requesters, subject) = (requesters.clone(), subject.clone());
                    move |requester, _, body| {
                        let (client, subject) = (requesters[requester].clone(), subject.clone());
                        async move { request(&client, subject, body).await }
                    }
                })
                .await
            };
            let in_door = door_seconds(&http, &metrics_url, door).await - before;
            let server = server_cpu().saturating_sub(cpu_before);
            let process = own_cpu().saturating_sub(process_before);
            let round = DoorRound::new(rows, bodies.len(), took, in_door, server, process);
            match door {
                "http" => http_rounds.push(round),
                _ => nats_rounds.push(round),
            }
            sent += rows as u64;
            assert_eq!(
                host.status().rows().accepted,
                sent,
                "the host accepted every row sent through the {door} door"
            );
            // A round's rows delivered before the next: their backlog would
            // slow it, and their acks would count in the latency run's histogram.
            wait_delivered(&host, rows as u64 + sent).await;
        }
    }
    let weir_rows_per_sec = median_of(&http_rounds, |r| r.rows_per_sec);
    let nats_rows_per_sec = median_of(&nats_rounds, |r| r.rows_per_sec);
    let nats_to_http = median(
        &http_rounds
            .iter()
            .zip(&nats_rounds)
            .map(|(http, nats)| nats.rows_per_sec / http.rows_per_sec)
            .collect::<Vec<_>>(),
    );
    let http_client_ms = median_of(&http_rounds, |r| r.client_ms);
    let http_door_ms = median_of(&http_rounds, |r| r.door_ms);
    let nats_client_ms = median_of(&nats_rounds, |r| r.client_ms);
    let nats_door_ms = median_of(&nats_rounds, |r| r.door_ms);
    let http_server_us = median_of(&http_rounds, |r| r.server_us_per_row);
    let nats_server_us = median_of(&nats_rounds, |r| r.server_us_per_row);
    let http_process_us = median_of(&http_rounds, |r| r.process_us_per_row);
    let nats_process_us = median_of(&nats_rounds, |r| r.process_us_per_row);
    let before = accept_to_ack_buckets(&http, &metrics_url).await;

    // Latency at half the measured throughput, offered open-loop.
    let offered = weir_rows_per_sec / 2.0;
    let latencies = open_loop(offered, latency_window, bodies.clone(), {
        let (http, url) = (producer_http.clone(), url.clone());
        move |body| {
            let (http, url) = (http.clone(), url.clone());
            async move { post(&http, &url, body).await }
        }
    })
    .await;
    let index = latencies.len();
    let (p50, p99) = (percentile(&latencies, 0.50), percentile(&latencies, 0.99));
    let expected = sent + (index * ROWS_PER_REQUEST) as u64;
    assert_eq!(
        host.status().rows().accepted,
        expected,
        "every offered row accepted"
    );
    wait_delivered(&host, rows as u64 + expected).await;
    let after = accept_to_ack_buckets(&http, &metrics_url).await;
    let acked = after.last().map_or(0.0, |b| b.1) - before.last().map_or(0.0, |b| b.1);
    assert_eq!(
        acked as usize,
        index * ROWS_PER_REQUEST,
        "the histogram counted every offered row once"
    );
    let ack_p50 = bucket_quantile(&before, &after, 0.50) * 1000.0;
    let ack_p99 = bucket_quantile(&before, &after, 0.99) * 1000.0;

    // The NATS door at the same offered load.
    let nats_latencies = open_loop(offered, latency_window, bodies.clone(), {
        let (client, subject) = (requesters[0].clone(), subject.clone());
        move |body| {
            let (client, subject) = (client.clone(), subject.clone());
            async move { request(&client, subject, body).await }
        }
    })
    .await;
    let (nats_p50, nats_p99) = (
        percentile(&nats_latencies, 0.50),
        percentile(&nats_latencies, 0.99),
    );
    let expected = expected + (nats_latencies.len() * ROWS_PER_REQUEST) as u64;
    assert_eq!(
        host.status().rows().accepted,
        expected,
        "every row offered over NATS accepted"
    );
    wait_delivered(&host, rows as u64 + expected).await;

    // Requests with an Idempotency-Key: new keys (a fast batch, as above),
    // then the same requests again, every row stored already (a retry after
    // a lost answer, answered from the key's record).
    let keyed = &bodies[..bodies.len().min(KEYED_REQUESTS)];
    let keyed_rows = keyed.len() * ROWS_PER_REQUEST;
    let new_keys_rows_per_sec =
        keyed_rows as f64 / post_keyed_all(&http, &url, keyed, 0).await.as_secs_f64();
    let retried_rows_per_sec = keyed_rows as f64
        / post_keyed_all(&http, &url, keyed, ROWS_PER_REQUEST)
            .await
            .as_secs_f64();
    let (fresh_rows_per_sec, partly_stored_rows_per_sec) =
        retry_rates(&client, &router, &bodies[..keyed.len()]).await;
    host.shutdown().await;
    drop(server);

    print_figure(BENCH, "raw_publish_rows_per_sec", raw_rows_per_sec);
    print_figure(
        BENCH,
        "raw_publish_while_delivering_rows_per_sec",
        raw_delivering_rows_per_sec,
    );
    print_figure(BENCH, "weir_rows_per_sec", weir_rows_per_sec);
    print_figure(
        BENCH,
        "ratio_weir_to_raw_publish",
        weir_rows_per_sec / raw_rows_per_sec,
    );
    print_figure(
        BENCH,
        "ratio_weir_to_raw_publish_while_delivering",
        weir_rows_per_sec / raw_delivering_rows_per_sec,
    );
    print_figure(BENCH, "offered_rows_per_sec", offered);
    print_figure(BENCH, "latency_p50_ms", p50);
    print_figure(BENCH, "latency_p99_ms", p99);
    print_figure(BENCH, "accept_to_ack_p50_ms", ack_p50);
    print_figure(BENCH, "accept_to_ack_p99_ms", ack_p99);
    print_figure(BENCH, "nats_door_rows_per_sec", nats_rows_per_sec);
    print_figure(BENCH, "ratio_nats_door_to_http", nats_to_http);
    print_figure(
        BENCH,
        "ratio_nats_door_to_raw_publish",
        nats_rows_per_sec / raw_rows_per_sec,
    );
    print_figure(BENCH, "http_request_ms", http_client_ms);
    print_figure(BENCH, "http_request_in_door_ms", http_door_ms);
    print_figure(BENCH, "nats_request_ms", nats_client_ms);
    print_figure(BENCH, "nats_request_in_door_ms", nats_door_ms);
    print_figure(BENCH, "http_server_cpu_us_per_row", http_server_us);
    print_figure(BENCH, "nats_server_cpu_us_per_row", nats_server_us);
    print_figure(BENCH, "http_process_cpu_us_per_row", http_process_us);
    print_figure(BENCH, "nats_process_cpu_us_per_row", nats_process_us);
    print_figure(BENCH, "nats_door_latency_p50_ms", nats_p50);
    print_figure(BENCH, "nats_door_latency_p99_ms", nats_p99);
    print_figure(BENCH, "weir_new_keys_rows_per_sec", new_keys_rows_per_sec);
    print_figure(
        BENCH,
        "weir_retry_of_stored_rows_per_sec",
        retried_rows_per_sec,
    );
    print_figure(BENCH, "publisher_fresh_rows_per_sec", fresh_rows_per_sec);
    print_figure(
        BENCH,
        "publisher_retry_partly_stored_rows_per_sec",
        partly_stored_rows_per_sec,
    );
    print_figure(
        BENCH,
        "ratio_retry_to_fresh",
        partly_stored_rows_per_sec / fresh_rows_per_sec,
    );
    let mut table = Table::new(&["figure", "measured", "target"]);
    table.push(vec![
        "raw pipelined publish, no consumer".into(),
        format!("{raw_rows_per_sec:.0} rows/s"),
        "(the limit)".into(),
    ]);
    table.push(vec![
        "raw pipelined publish, weir delivering".into(),
        format!("{raw_delivering_rows_per_sec:.0} rows/s"),
        "(same server load, one publisher)".into(),
    ]);
    table.push(vec![
        format!("front door, {CLIENTS} clients × {ROWS_PER_REQUEST}-row requests"),
        format!(
            "{weir_rows_per_sec:.0} rows/s ({:.2}× raw, {:.2}× raw delivering)",
            weir_rows_per_sec / raw_rows_per_sec,
            weir_rows_per_sec / raw_delivering_rows_per_sec
        ),
        format!("≥ {TARGET_ROWS_PER_SEC:.0} rows/s"),
    ]);
    table.push(vec![
        format!(
            "latency at {offered:.0} rows/s offered ({} requests)",
            latencies.len()
        ),
        format!("p50 {p50:.1} ms, p99 {p99:.1} ms"),
        format!("p99 ≤ {TARGET_P99_MS:.0} ms"),
    ]);
    table.push(vec![
        format!("NATS door, {CLIENTS} requesters × {ROWS_PER_REQUEST}-row requests"),
        format!(
            "{nats_rows_per_sec:.0} rows/s ({nats_to_http:.2}× HTTP, {:.2}× raw)",
            nats_rows_per_sec / raw_rows_per_sec
        ),
        "≥ 1.0× HTTP".into(),
    ]);
    table.push(vec![
        "one request in the throughput runs: at the client (in the door)".into(),
        format!("NATS {nats_client_ms:.1} ms ({nats_door_ms:.1} ms)"),
        format!("HTTP {http_client_ms:.1} ms ({http_door_ms:.1} ms)"),
    ]);
    table.push(vec![
        "nats-server CPU per row in the throughput runs".into(),
        format!("NATS {nats_server_us:.2} µs"),
        format!("HTTP {http_server_us:.2} µs"),
    ]);
    table.push(vec![
        "this process's CPU per row (host and producers)".into(),
        format!("NATS {nats_process_us:.2} µs"),
        format!("HTTP {http_process_us:.2} µs"),
    ]);
    table.push(vec![
        format!(
            "NATS door latency at {offered:.0} rows/s offered ({} requests)",
            nats_latencies.len()
        ),
        format!("p50 {nats_p50:.1} ms, p99 {nats_p99:.1} ms"),
        format!("HTTP: p50 {p50:.1} ms, p99 {p99:.1} ms"),
    ]);
    table.push(vec![
        "accept-to-ack at the same load (histogram)".into(),
        format!("p50 {ack_p50:.1} ms, p99 {ack_p99:.1} ms"),
        "(stored → delivered and acked)".into(),
    ]);
    table.push(vec![
        format!("{} requests with new Idempotency-Keys", keyed.len()),
        format!("{new_keys_rows_per_sec:.0} rows/s"),
        "(a fast batch per request)".into(),
    ]);
    table.push(vec![
        "the same requests again (all stored)".into(),
        format!("{retried_rows_per_sec:.0} rows/s"),
        "(answered from the key's record)".into(),
    ]);
    table.push(vec![
        "retry of half-stored requests (publisher)".into(),
        format!(
            "{partly_stored_rows_per_sec:.0} rows/s ({:.2}× fresh, {fresh_rows_per_sec:.0})",
            partly_stored_rows_per_sec / fresh_rows_per_sec
        ),
        "≥ 0.5× fresh".into(),
    ]);
    table.print();
}

/// Rows/s of `bodies` published with new ids, and of the same sent again
/// as retries after their first half was stored, by `CLIENTS` at a time.
async fn retry_rates(client: &async_nats::Client, router: &Names, bodies: &[Bytes]) -> (f64, f64) {
    use futures::StreamExt;
    use weir::ingest::{Ids, Placement, Publisher};

    let publisher = Publisher::new(client.clone(), router.clone(), -1);
    let placement = Placement::Table(router.route(TENANT, TABLE));
    let rows =
        |run: &str, request: usize, body: &Bytes, take: usize| -> Vec<(Bytes, Option<String>)> {
            body.split(|&b| b == b'\n')
                .filter(|line| !line.is_empty())
                .take(take)
                .enumerate()
                .map(|(i, line)| (body.slice_ref(line), Some(format!("{run}-{request}-{i}"))))
                .collect()
        };
    let run = |requests: Vec<Vec<(Bytes, Option<String>)>>, ids: Ids, duplicates: usize| {
        let publisher = publisher.clone();
        let placement = placement.clone();
        async move {
            let total: usize = requests.iter().map(Vec::len).sum();
            let started = Instant::now();
            futures::stream::iter(requests)
                .map(|rows| {
                    let (publisher, placement) = (publisher.clone(), placement.clone());
                    async move {
                        let published = publisher
                            .publish(TENANT, TABLE, &placement, rows, ids, None)
                            .await
                            .expect("the rows are stored");
                        assert_eq!(published.duplicates, duplicates, "{published:?}");
                    }
                })
                .buffer_unordered(CLIENTS)
                .collect::<Vec<()>>()
                .await;
            total as f64 / started.elapsed().as_secs_f64()
        }
    };
    let all = |name: &str, take: usize| -> Vec<_> {
        bodies
            .iter()
            .enumerate()
            .map(|(request, body)| rows(name, request, body, take))
            .collect()
    };
    let fresh = run(all("fresh", usize::MAX), Ids::Fresh, 0).await;
    let half = ROWS_PER_REQUEST / 2;
    run(all("retry", half), Ids::Fresh, 0).await;
    let retried = run(all("retry", usize::MAX), Ids::Retry, half).await;
    (fresh, retried)
}

/// Sends `body` to the NATS door; the answer must be a 202.
async fn request(client: &async_nats::Client, subject: async_nats::Subject, body: Bytes) {
    let reply = client
        .request(subject, body)
        .await
        .expect("the NATS door answers");
    let status = reply
        .headers
        .as_ref()
        .and_then(|headers| headers.get(weir::ingest::STATUS_HEADER))
        .map(|value| value.to_string());
    assert_eq!(
        status.as_deref(),
        Some("202"),
        "the NATS door answered {}",
        String::from_utf8_lossy(&reply.payload)
    );
}

/// Requests offered open-loop at `offered` rows/s for `window`, each sent
/// by `send`; every request's time from send to answer, sorted.
async fn open_loop<F, Fut>(
    offered: f64,
    window: Duration,
    bodies: Arc<Vec<Bytes>>,
    send: F,
) -> Vec<Duration>
where
    F: Fn(Bytes) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let interval = Duration::from_secs_f64(ROWS_PER_REQUEST as f64 / offered);
    let mut schedule = tokio::time::interval(interval);
    schedule.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let began = Instant::now();
    let mut requests = Vec::new();
    let mut index = 0;
    while began.elapsed() < window {
        schedule.tick().await;
        let answered = send(bodies[index % bodies.len()].clone());
        index += 1;
        requests.push(producers().spawn(async move {
            let sent = Instant::now();
            answered.await;
            sent.elapsed()
        }));
    }
    let mut latencies = Vec::with_capacity(requests.len());
    for request in requests {
        latencies.push(request.await.expect("a request finished"));
    }
    latencies.sort();
    latencies
}

/// The `p` percentile of sorted `latencies`, in milliseconds.
fn percentile(latencies: &[Duration], p: f64) -> f64 {
    let rank = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len());
    latencies[rank - 1].as_secs_f64() * 1000.0
}

/// Posts `bodies` with keys `bench-<index>`; every answer must be a 202
/// with `duplicates` rows already stored. How long it took.
async fn post_keyed_all(
    http: &reqwest::Client,
    url: &str,
    bodies: &[Bytes],
    duplicates: usize,
) -> Duration {
    let (http, url) = (http.clone(), url.to_string());
    run_clients(Arc::new(bodies.to_vec()), move |_, index, body| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let response = http
                .post(&url)
                .bearer_auth(support::API_KEY)
                .header("Idempotency-Key", format!("bench-{index}"))
                .body(body)
                .send()
                .await
                .expect("the front door answers");
            assert_eq!(response.status(), 202, "a keyed request is accepted");
            let answer: serde_json::Value = response.json().await.expect("a JSON answer");
            assert_eq!(
                answer["duplicates"].as_u64(),
                Some(duplicates as u64),
                "{answer}"
            );
        }
    })
    .await
}

/// One door's throughput round.
struct DoorRound {
    rows_per_sec: f64,
    /// A request's mean time at the client, and in the door.
    client_ms: f64,
    door_ms: f64,
    /// nats-server's CPU per row over the round (storing, and delivering
    /// what the host delivers meanwhile, for both doors alike).
    server_us_per_row: f64,
    /// This process's CPU per row: the host and the producers.
    process_us_per_row: f64,
}

impl DoorRound {
    fn new(
        rows: usize,
        requests: usize,
        took: Duration,
        in_door_seconds: f64,
        server_cpu: Duration,
        process_cpu: Duration,
    ) -> DoorRound {
        DoorRound {
            rows_per_sec: rows as f64 / took.as_secs_f64(),
            client_ms: took.as_secs_f64() * 1000.0 * CLIENTS as f64 / requests as f64,
            door_ms: in_door_seconds * 1000.0 / requests as f64,
            server_us_per_row: server_cpu.as_secs_f64() * 1e6 / rows as f64,
            process_us_per_row: process_cpu.as_secs_f64() * 1e6 / rows as f64,
        }
    }
}

/// `CLIENTS` clients, each taking the next of `bodies` (with the client's
/// number and the body's index) until none is left; how long they took.
async fn run_clients<F, Fut>(bodies: Arc<Vec<Bytes>>, send: F) -> Duration
where
    F: Fn(usize, usize, Bytes) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (bodies, next, send) = (bodies.clone(), next.clone(), send.clone());
            producers().spawn(async move {
                loop {
                    let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(body) = bodies.get(index) else {
                        return;
                    };
                    send(client, index, body.clone()).await;
                }
            })
        })
        .collect();
    for client in clients {
        client.await.expect("a client finished");
    }
    started.elapsed()
}

/// Seconds the host spent answering 202s through `door`, in all (the sum
/// of `weir_ingest_request_duration_seconds`).
async fn door_seconds(http: &reqwest::Client, url: &str, door: &str) -> f64 {
    let text = http
        .get(url)
        .send()
        .await
        .expect("/metrics answers")
        .text()
        .await
        .expect("/metrics is text");
    let prefix =
        format!("weir_ingest_request_duration_seconds_sum{{door=\"{door}\",code=\"202\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The cumulative buckets `(le, count)` of `weir_accept_to_ack_seconds`,
/// in order, `+Inf` last.
async fn accept_to_ack_buckets(http: &reqwest::Client, url: &str) -> Vec<(f64, f64)> {
    let text = http
        .get(url)
        .send()
        .await
        .expect("/metrics answers")
        .text()
        .await
        .expect("/metrics is text");
    let buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|line| line.strip_prefix("weir_accept_to_ack_seconds_bucket{le=\""))
        .filter_map(|rest| {
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    assert!(
        !buckets.is_empty(),
        "no weir_accept_to_ack_seconds on {url}"
    );
    buckets
}

/// The `q` quantile of what the histogram gained from `before` to `after`,
/// interpolated linearly within its bucket (as `histogram_quantile` does).
fn bucket_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> f64 {
    let gained: Vec<(f64, f64)> = after
        .iter()
        .zip(before)
        .map(|(&(le, a), &(_, b))| (le, a - b))
        .collect();
    let total = gained.last().map_or(0.0, |b| b.1);
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, count) in &gained {
        if count >= rank {
            if le.is_infinite() {
                return lower.0;
            }
            let within = count - lower.1;
            let share = if within > 0.0 {
                (rank - lower.1) / within
            } else {
                1.0
            };
            return lower.0 + (le - lower.0) * share;
        }
        lower = (le, count);
    }
    lower.0
}

/// Waits until the host has delivered `rows` rows in all, so the next run
/// does not compete with a backlog; fails the bench if it never does.
async fn wait_delivered(host: &RunningHost, rows: u64) {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while host.status().rows().delivered < rows {
        assert!(
            Instant::now() < deadline,
            "the host delivered {} of {rows} raw rows in {DRAIN_TIMEOUT:?}",
            host.status().rows().delivered
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
