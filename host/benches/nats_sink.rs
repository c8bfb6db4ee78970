//! Benchmark: rows into a JetStream stream through weir (pull → pass-through
//! transform → the shipped nats-sink, its publishes sent by the host with a
//! `Nats-Msg-Id` each and their PubAcks awaited before the rows are acked)
//! against a raw async-nats publisher sending the same rows to the same
//! subjects with the same message ids, its PubAcks pipelined, side by side
//! in one run on one nats-server.
//!
//! weir's rows are published to its default topology before its host
//! starts, and the clock runs from the first delivery to the last, as in
//! the delivery bench. The raw publisher takes each row's id from the PubAck
//! that stored it in weir's partition stream (`{stream}:{sequence}:0`, the
//! id weir gives a row's first output), so both write the same messages; its
//! clock runs from its first publish to its last PubAck. The target stream
//! (`audit.>`, file storage, a two-minute duplicate window) is made anew for
//! each, and must hold every row once after each. `cargo bench -p weir
//! --bench nats_sink`; `WEIR_BENCH_ROWS` (default 200000) and
//! `WEIR_BENCH_ROUNDS` (default 3); medians are reported.

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use weir::config::{Config, Overrides};
use weir::host::RunningHost;
use weir::topology::{Manifest, Names};

use support::{
    DEFAULT_LAYOUT, PUBLISH_WINDOW, TENANT, Table, drain_rate, env_count, median, print_figure,
    row, subjects, tables_covering,
};

const BENCH: &str = "nats_sink";
const DEFAULT_ROWS: usize = 200_000;
const DEFAULT_ROUNDS: usize = 3;
const TARGET: &str = "AUDIT";
/// The sink's subject template, and what it gives a bench row.
const SINK_SETTINGS: &str = r#"{ subject = "audit.{tenant}.{table}" }"#;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run());
}

async fn run() {
    let rows = env_count("WEIR_BENCH_ROWS", DEFAULT_ROWS);
    let rounds = env_count("WEIR_BENCH_ROUNDS", DEFAULT_ROUNDS);
    let dir = tempfile::tempdir().expect("temp dir");
    let server = support::start_nats(dir.path()).await;
    let payloads: Vec<Bytes> = (0..rows as u64).map(|id| Bytes::from(row(id))).collect();
    let nats = async_nats::connect(server.url()).await.expect("connect");
    let js = jetstream::new(nats);

    let (mut raw, mut weir, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (weir_rate, ids) = measure_weir(&js, server.url(), dir.path(), round, &payloads).await;
        let raw_rate = measure_raw(&js, &ids, &payloads).await;
        weir.push(weir_rate);
        raw.push(raw_rate);
        ratios.push(weir_rate / raw_rate);
        println!(
            "round {}: raw publisher {raw_rate:.0} rows/s, weir {weir_rate:.0} rows/s",
            round + 1
        );
    }
    let (raw, weir, ratio) = (median(&raw), median(&weir), median(&ratios));
    let units = (DEFAULT_LAYOUT.0 * DEFAULT_LAYOUT.1) as usize;
    let mut table = Table::new(&["into a JetStream stream", "rows/s", "× raw"]);
    table.push(vec![
        format!("raw async-nats publisher, {PUBLISH_WINDOW} PubAcks in flight"),
        format!("{raw:.0}"),
        "1.00".into(),
    ]);
    table.push(vec![
        format!("weir, {units} units, nats-sink"),
        format!("{weir:.0}"),
        format!("{ratio:.2}"),
    ]);
    println!(
        "{rows} rows of {} bytes, the same Nats-Msg-Id each, median of {rounds}:",
        support::ROW_BYTES
    );
    table.print();
    print_figure(BENCH, "raw_rows_per_sec", raw);
    print_figure(BENCH, "weir_rows_per_sec", weir);
    print_figure(BENCH, "weir_over_raw", ratio);
}

/// The target stream, made anew (empty, its duplicate window fresh).
async fn fresh_target(js: &jetstream::Context) {
    let _ = js.delete_stream(TARGET).await;
    js.create_stream(stream::Config {
        name: TARGET.into(),
        subjects: vec!["audit.>".into()],
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .expect("create the target stream");
}

/// Fails the bench unless the target holds exactly `count` messages.
async fn assert_target_holds(js: &jetstream::Context, count: usize, who: &str) {
    let mut target = js.get_stream(TARGET).await.expect("the target stream");
    let held = target.info().await.expect("target info").state.messages;
    assert_eq!(held as usize, count, "{who} stored every row once");
}

/// weir: its topology, the rows published to it (each row's message id
/// kept from its PubAck), then a host started in-process drains them into
/// the target. Rows per second, and the ids in row order.
async fn measure_weir(
    js: &jetstream::Context,
    nats_url: &str,
    dir: &Path,
    round: usize,
    payloads: &[Bytes],
) -> (f64, Vec<String>) {
    fresh_target(js).await;
    let router = Names::new("weir", DEFAULT_LAYOUT.0, DEFAULT_LAYOUT.1);
    let tables = &tables_covering(&router);
    let sink = format!(
        "wasm = {:?}\nworld = \"sink\"\nsettings = {SINK_SETTINGS}\ngrants.nats = {{ publish = [\"audit.>\"] }}\n",
        weir_test_artifacts::NATS_SINK,
    );
    let text = support::pass_through_config_into(
        nats_url,
        &dir.join(format!("data-{round}")),
        DEFAULT_LAYOUT,
        tables,
        &sink,
    );
    let config = Config::parse(&dir.join("weir.toml"), &text, &Overrides::default())
        .unwrap_or_else(|err| panic!("the bench's config is valid: {err}"));
    Manifest::new(&router, &config.stream, &config.delivery, None)
        .create(js)
        .await
        .expect("create weir's topology");
    let subjects = subjects(&router, tables, |table| router.route(TENANT, table));
    let ids = publish_keeping_ids(js, &subjects, payloads).await;
    let host = RunningHost::start(config).await.expect("weir host starts");
    let (rate, counts) = drain_rate(
        &host,
        payloads.len() as u64,
        Duration::from_millis(10),
        DRAIN_TIMEOUT,
    )
    .await;
    assert_eq!(
        (counts.dead_lettered, counts.retried),
        (0, 0),
        "every row is delivered once"
    );
    host.shutdown().await;
    assert_target_holds(js, payloads.len(), "weir").await;
    (rate, ids)
}

/// Publishes every payload (tables taking turns, a window of PubAcks in
/// flight) and returns each row's first output id as weir's nats-sink
/// gives it: its partition stream, its sequence there, and 0.
async fn publish_keeping_ids(
    js: &jetstream::Context,
    subjects: &[async_nats::Subject],
    payloads: &[Bytes],
) -> Vec<String> {
    let mut ids = vec![String::new(); payloads.len()];
    let mut in_flight = FuturesUnordered::new();
    for (index, payload) in payloads.iter().enumerate() {
        if in_flight.len() >= PUBLISH_WINDOW
            && let Some((done, ack)) = in_flight.next().await
        {
            ids[done] = id_of(ack);
        }
        let subject = subjects[index % subjects.len()].clone();
        let ack = js
            .publish(subject, payload.clone())
            .await
            .expect("publish a row");
        in_flight.push(async move { (index, ack.await) });
    }
    while let Some((done, ack)) = in_flight.next().await {
        ids[done] = id_of(ack);
    }
    ids
}

fn id_of(ack: Result<jetstream::publish::PublishAck, jetstream::context::PublishError>) -> String {
    let ack = ack.expect("row stored");
    format!("{}:{}:0", ack.stream, ack.sequence)
}

/// The raw publisher: each row to its table's target subject with weir's
/// id for it, pipelined; rows per second until the last PubAck.
async fn measure_raw(js: &jetstream::Context, ids: &[String], payloads: &[Bytes]) -> f64 {
    fresh_target(js).await;
    let router = Names::new("weir", DEFAULT_LAYOUT.0, DEFAULT_LAYOUT.1);
    let subjects: Vec<async_nats::Subject> = tables_covering(&router)
        .iter()
        .map(|table| format!("audit.{TENANT}.{table}").into())
        .collect();
    let started = Instant::now();
    let mut in_flight = FuturesUnordered::new();
    for (index, payload) in payloads.iter().enumerate() {
        if in_flight.len() >= PUBLISH_WINDOW {
            let acked: Option<Result<_, _>> = in_flight.next().await;
            acked.expect("a PubAck in flight").expect("row stored");
        }
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, ids[index].as_str());
        let ack = js
            .publish_with_headers(
                subjects[index % subjects.len()].clone(),
                headers,
                payload.clone(),
            )
            .await
            .expect("publish a row");
        in_flight.push(ack.into_future());
    }
    while let Some(acked) = in_flight.next().await {
        acked.expect("row stored");
    }
    let rate = payloads.len() as f64 / started.elapsed().as_secs_f64();
    assert_target_holds(js, payloads.len(), "the raw publisher").await;
    rate
}
