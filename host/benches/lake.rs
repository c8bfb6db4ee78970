//! Benchmark: rows into Parquet objects of an S3 bucket through weir
//! (pull → pass-through transform → the shipped lake-sink, the host
//! filling one object per table and committing each through the unit's
//! log before the rows are acked) against the raw JetStream consumer limit
//! (one durable pull consumer acking every row, as in the delivery bench),
//! side by side in one run on one nats-server and one SeaweedFS; and the
//! bytes a row takes in Parquet and in NDJSON objects against the raw row,
//! and the host's resident memory while objects fill.
//!
//! weir's rows are published to its default topology before its host
//! starts; the clock runs from the first row acked to the last, and a row
//! is acked only once its object stands. `cargo bench -p weir --bench
//! lake`; `WEIR_BENCH_ROWS` (default 200000).

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

#[allow(dead_code)] // the tests' store harness; the bench starts and reads it
#[path = "../../tests/it/seaweed_support.rs"]
mod seaweed_support;

use std::path::Path;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use futures::TryStreamExt;
use futures::stream::StreamExt;
use weir::config::{Config, Overrides};
use weir::host::RunningHost;
use weir::topology::{Manifest, Names, Unit};

use seaweed_support::{ACCESS_KEY, BUCKET, SECRET_KEY, Seaweed};
use support::{
    DEFAULT_LAYOUT, TENANT, Table, drain_rate, env_count, print_figure, publish_pipelined, row,
    subjects, tables_covering,
};

const BENCH: &str = "lake";
const DEFAULT_ROWS: usize = 200_000;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);
/// The bench row's fields as Parquet columns.
const PARQUET: &str = r#"format = "parquet"
columns = [
  { name = "id", type = "int64", required = true },
  { name = "ts", type = "timestamp" },
  { name = "user", type = "string" },
  { name = "email", type = "string" },
  { name = "card", type = "string" },
  { name = "amount", type = "int64" },
  { name = "currency", type = "string" },
  { name = "country", type = "string" },
  { name = "note", type = "string" },
]"#;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run());
}

/// One weir run into objects: its rate, the bytes its objects hold, and
/// the host's largest resident memory while it ran.
struct Into {
    rows_per_sec: f64,
    object_bytes: u64,
    objects: usize,
    peak_rss_mb: f64,
}

async fn run() {
    let rows = env_count("WEIR_BENCH_ROWS", DEFAULT_ROWS);
    let dir = tempfile::tempdir().expect("temp dir");
    let server = support::start_nats(dir.path()).await;
    let seaweed = Seaweed::start().await;
    let payloads: Vec<Bytes> = (0..rows as u64).map(|id| Bytes::from(row(id))).collect();
    let nats = async_nats::connect(server.url()).await.expect("connect");
    let js = jetstream::new(nats.clone());

    let raw = raw_limit(&nats, &js, &payloads).await;
    let parquet = measure_weir(
        &js,
        server.url(),
        dir.path(),
        &seaweed,
        "parquet",
        PARQUET,
        &payloads,
    )
    .await;
    let ndjson = measure_weir(
        &js,
        server.url(),
        dir.path(),
        &seaweed,
        "ndjson",
        "format = \"ndjson\"",
        &payloads,
    )
    .await;

    let units = (DEFAULT_LAYOUT.0 * DEFAULT_LAYOUT.1) as usize;
    let per_row = |into: &Into| into.object_bytes as f64 / rows as f64;
    let mut table = Table::new(&["", "rows/s", "× raw", "bytes/row", "objects", "peak RSS MB"]);
    table.push(vec![
        "raw consumer limit (pull, ack each)".into(),
        format!("{raw:.0}"),
        "1.00".into(),
        format!("{}", support::ROW_BYTES),
        "—".into(),
        "—".into(),
    ]);
    for (name, into) in [("Parquet (zstd)", &parquet), ("NDJSON", &ndjson)] {
        table.push(vec![
            format!("weir, {units} units, lake-sink, {name}"),
            format!("{:.0}", into.rows_per_sec),
            format!("{:.2}", into.rows_per_sec / raw),
            format!("{:.1}", per_row(into)),
            format!("{}", into.objects),
            format!("{:.0}", into.peak_rss_mb),
        ]);
    }
    println!(
        "{rows} rows of {} bytes into objects of at most 10,000 rows or 1 s:",
        support::ROW_BYTES
    );
    table.print();
    print_figure(BENCH, "raw_rows_per_sec", raw);
    print_figure(BENCH, "parquet_rows_per_sec", parquet.rows_per_sec);
    print_figure(BENCH, "parquet_over_raw", parquet.rows_per_sec / raw);
    print_figure(BENCH, "ndjson_rows_per_sec", ndjson.rows_per_sec);
    print_figure(BENCH, "parquet_bytes_per_row", per_row(&parquet));
    print_figure(BENCH, "ndjson_bytes_per_row", per_row(&ndjson));
    print_figure(BENCH, "parquet_peak_rss_mb", parquet.peak_rss_mb);
}

/// The raw limit: every row published to stream `raw`, then drained by
/// one pull consumer acking each; rows per second from the first row.
async fn raw_limit(
    client: &async_nats::Client,
    js: &jetstream::Context,
    payloads: &[Bytes],
) -> f64 {
    let router = Names::new("raw", 1, 1);
    let tables = tables_covering(&Names::new("weir", DEFAULT_LAYOUT.0, DEFAULT_LAYOUT.1));
    let consumer = support::raw_consumer(js, 1).await;
    let subjects = subjects(&router, &tables, |_| Unit {
        partition: 0,
        shard: 0,
    });
    publish_pipelined(js, &subjects, payloads).await;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(support::RAW_PULL_BATCH)
        .messages()
        .await
        .expect("pull from the raw consumer");
    let mut first = None;
    for _ in 0..payloads.len() {
        let message = messages
            .next()
            .await
            .expect("the pull stream goes on")
            .expect("a pulled row");
        first.get_or_insert_with(Instant::now);
        message.ack().await.expect("ack");
    }
    client.flush().await.expect("flush the acks");
    let rate = (payloads.len() - 1) as f64 / first.expect("a row").elapsed().as_secs_f64();
    drop(messages);
    js.delete_stream("raw")
        .await
        .expect("delete the raw stream");
    rate
}

/// weir into objects of `format` under prefix `name`: its topology, the
/// rows published to it, then a host started in-process drains them.
async fn measure_weir(
    js: &jetstream::Context,
    nats_url: &str,
    dir: &Path,
    seaweed: &Seaweed,
    name: &str,
    format: &str,
    payloads: &[Bytes],
) -> Into {
    let router = Names::new("weir", DEFAULT_LAYOUT.0, DEFAULT_LAYOUT.1);
    let tables = &tables_covering(&router);
    let keys = dir.join("lake-keys.toml");
    std::fs::write(
        &keys,
        format!("access_key_id = \"{ACCESS_KEY}\"\nsecret_access_key = \"{SECRET_KEY}\"\n"),
    )
    .expect("write the keys");
    let sink = format!(
        "wasm = {:?}\nworld = \"sink\"\n\n[plugins.sink.grants.objects]\nbucket = \"{BUCKET}\"\n\
         endpoint = \"{}\"\nprefix = \"{name}\"\ncredentials_file = {:?}\nmax_rows = 10000\n\
         max_age = \"1s\"\n{format}\n",
        weir_test_artifacts::LAKE_SINK,
        seaweed.endpoint(),
        keys.display().to_string(),
    );
    let text = support::pass_through_config_into(
        nats_url,
        &dir.join(format!("data-{name}")),
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
    publish_pipelined(js, &subjects, payloads).await;
    reset_peak_rss();
    let host = RunningHost::start(config).await.expect("weir host starts");
    let (rate, counts) = drain_rate(
        &host,
        payloads.len() as u64,
        Duration::from_millis(10),
        DRAIN_TIMEOUT,
    )
    .await;
    let peak_rss_mb = peak_rss_mb();
    assert_eq!(
        (counts.dead_lettered, counts.retried),
        (0, 0),
        "every row is delivered once"
    );
    host.shutdown().await;
    let (object_bytes, objects) = objects_under(&seaweed.store(), name).await;
    Into {
        rows_per_sec: rate,
        object_bytes,
        objects,
        peak_rss_mb,
    }
}

/// The bytes and the number of the objects under `prefix` (not the log).
async fn objects_under(store: &weir::destination::Store, prefix: &str) -> (u64, usize) {
    let listed: Vec<_> = store
        .raw()
        .list(Some(&object_store::path::Path::from(prefix)))
        .try_collect()
        .await
        .expect("list the objects");
    let data: Vec<_> = listed
        .iter()
        .filter(|meta| !meta.location.as_ref().contains("/_weir/"))
        .collect();
    (data.iter().map(|meta| meta.size).sum(), data.len())
}

/// Starts this process's resident-memory high-water mark afresh (Linux:
/// `5` into `clear_refs`), so the next reading is the next run's.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// This process's largest resident memory since the last reset, MB (the
/// host runs in it): `VmHWM`.
fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}
