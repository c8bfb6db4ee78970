//! Benchmark: rows into PostgreSQL through weir (pull → pass-through
//! transform → the shipped postgres-sink in the host's transaction, with
//! weir's ledger, → ack) against two native references doing the same bulk
//! statement (`INSERT … SELECT … FROM json_populate_recordset`, one per
//! batch of `batch_rows` rows, each in its own transaction) over the same
//! number of connections, side by side in one run, against one PostgreSQL
//! of the bench's own and one nats-server:
//!
//! - the native insert: a tokio-postgres client sending the statements
//!   alone, its batches already in memory (the database's limit);
//! - the native consumer, what a team would write instead of weir: per
//!   partition of weir's default topology a work-queue stream and a durable
//!   pull consumer, one worker each pulling up to `batch_rows` rows,
//!   inserting them over its own connection and acking them after COMMIT
//!   (at least once: no ledger, no plugin).
//!
//! The rows of weir and of the native consumer are published before they
//! start; weir's clock runs from its first delivery to the last, as in the
//! delivery bench, the native consumer's from its workers' start to the
//! last ack, the native insert's over its inserts alone. `cargo bench -p
//! weir --bench postgres`; `WEIR_BENCH_ROWS` (default 200000) and
//! `WEIR_BENCH_ROUNDS` (default 3); medians are reported.

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

#[allow(dead_code)] // the bench starts and reads the server only
#[path = "../../tests/it/postgres_support.rs"]
mod postgres_support;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use weir::config::{Config, Overrides};
use weir::host::RunningHost;
use weir::topology::{Manifest, Names};

use postgres_support::PgServer;
use support::{
    DEFAULT_LAYOUT, TENANT, Table, drain_rate, env_count, median, print_figure, publish_pipelined,
    row, subjects, tables_covering,
};

const BENCH: &str = "postgres";
const DEFAULT_ROWS: usize = 200_000;
const DEFAULT_ROUNDS: usize = 3;
/// Rows per statement: weir's `batch_rows` default.
const BATCH: usize = 256;
/// Connections of every side: one per unit of weir's default topology.
const CONNECTIONS: usize = (DEFAULT_LAYOUT.0 * DEFAULT_LAYOUT.1) as usize;
const SCHEMA: &str =
    r#"CREATE TABLE rows (id bigint NOT NULL, "user" text, amount bigint, note text)"#;
/// What postgres-sink sends for the table (its statement for these settings).
const INSERT: &str = r#"INSERT INTO "rows" ("amount", "id", "note", "user") SELECT "amount", "id", "note", "user" FROM json_populate_recordset(NULL::"rows", $1::json)"#;
const SINK_SETTINGS: &str = r#"{ table = "rows", columns = { id = "id", user = "user", amount = "amount", note = "note" } }"#;
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
    let pg = tokio::task::block_in_place(PgServer::start);
    let db = pg.client().await;
    db.batch_execute(SCHEMA).await.expect("create the table");
    let payloads: Vec<Bytes> = (0..rows as u64).map(|id| Bytes::from(row(id))).collect();
    let nats = async_nats::connect(server.url()).await.expect("connect");
    let js = async_nats::jetstream::new(nats);

    let (mut insert, mut consumer, mut weir) = (Vec::new(), Vec::new(), Vec::new());
    let (mut over_insert, mut over_consumer) = (Vec::new(), Vec::new());
    let mut rows_per_statement = Vec::new();
    for round in 0..rounds {
        insert.push(measure_native(&pg, &db, &payloads).await);
        let (rate, per_statement) = measure_native_consumer(&js, &pg, &db, &payloads).await;
        consumer.push(rate);
        rows_per_statement.push(per_statement);
        weir.push(measure_weir(&js, server.url(), &pg, &db, dir.path(), round, &payloads).await);
        // Ratios round by round (side by side, same noise), then the median.
        over_insert.push(weir[round] / insert[round]);
        over_consumer.push(weir[round] / consumer[round]);
        println!(
            "round {}: native insert {:.0} rows/s, native consumer {:.0} rows/s ({per_statement:.0} rows per statement), weir {:.0} rows/s",
            round + 1,
            insert[round],
            consumer[round],
            weir[round]
        );
    }
    let (insert, consumer, weir) = (median(&insert), median(&consumer), median(&weir));
    let (over_insert, over_consumer) = (median(&over_insert), median(&over_consumer));
    let mut table = Table::new(&["into PostgreSQL", "rows/s", "weir × this"]);
    table.push(vec![
        format!("native insert: tokio-postgres alone, {CONNECTIONS} connections"),
        format!("{insert:.0}"),
        format!("{over_insert:.2}"),
    ]);
    table.push(vec![
        format!("native consumer: {CONNECTIONS} pull consumers → tokio-postgres → ack"),
        format!("{consumer:.0}"),
        format!("{over_consumer:.2}"),
    ]);
    table.push(vec![
        format!("weir, {CONNECTIONS} units, postgres-sink, ledger"),
        format!("{weir:.0}"),
        "1.00".into(),
    ]);
    println!(
        "{rows} rows of {} bytes, batches of {BATCH}, median of {rounds}:",
        support::ROW_BYTES
    );
    table.print();
    println!("target: weir ≥ 0.8 × the native consumer");
    print_figure(BENCH, "native_insert_rows_per_sec", insert);
    print_figure(BENCH, "native_consumer_rows_per_sec", consumer);
    print_figure(BENCH, "weir_rows_per_sec", weir);
    print_figure(BENCH, "weir_over_native_insert", over_insert);
    print_figure(BENCH, "weir_over_native_consumer", over_consumer);
    print_figure(
        BENCH,
        "native_consumer_rows_per_statement",
        median(&rows_per_statement),
    );
}

/// The native client: batches taken in turn by `CONNECTIONS` connections,
/// each batch one statement in one transaction, as weir's sink does.
async fn measure_native(pg: &PgServer, db: &tokio_postgres::Client, payloads: &[Bytes]) -> f64 {
    db.batch_execute("TRUNCATE rows").await.expect("truncate");
    let batches: Vec<String> = payloads
        .chunks(BATCH)
        .map(|chunk| {
            let mut body = String::from("[");
            for (index, row) in chunk.iter().enumerate() {
                if index > 0 {
                    body.push(',');
                }
                body.push_str(std::str::from_utf8(row).expect("JSON rows"));
            }
            body.push(']');
            body
        })
        .collect();
    let queue = Arc::new(Mutex::new(batches.into_iter()));
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(pg.client().await);
    }
    let started = Instant::now();
    let workers = clients.into_iter().map(|client| {
        let queue = queue.clone();
        tokio::spawn(async move {
            let statement = client
                .prepare_typed(INSERT, &[tokio_postgres::types::Type::TEXT])
                .await
                .expect("prepare");
            loop {
                let Some(body) = queue.lock().expect("queue").next() else {
                    return;
                };
                client.batch_execute("BEGIN").await.expect("begin");
                client.execute(&statement, &[&body]).await.expect("insert");
                client.batch_execute("COMMIT").await.expect("commit");
            }
        })
    });
    for worker in futures::future::join_all(workers).await {
        worker.expect("native worker");
    }
    let rate = payloads.len() as f64 / started.elapsed().as_secs_f64();
    let written = postgres_support::count(db, "rows").await;
    assert_eq!(
        written as usize,
        payloads.len(),
        "the native client wrote every row"
    );
    rate
}

/// The native consumer (see the module): its rows published to its own
/// streams first; rows per second from its workers' start to the last ack,
/// and the mean rows per statement.
async fn measure_native_consumer(
    js: &async_nats::jetstream::Context,
    pg: &PgServer,
    db: &tokio_postgres::Client,
    payloads: &[Bytes],
) -> (f64, f64) {
    use async_nats::jetstream::{consumer, stream};
    db.batch_execute("TRUNCATE rows").await.expect("truncate");
    let mut consumers = Vec::new();
    let mut subjects = Vec::new();
    for partition in 0..CONNECTIONS {
        let name = format!("native{partition}");
        let created = js
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{name}.>")],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                discard: stream::DiscardPolicy::New,
                ..Default::default()
            })
            .await
            .expect("create a native stream");
        consumers.push(
            created
                .create_consumer(consumer::pull::Config {
                    durable_name: Some(name.clone()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    max_ack_pending: support::RAW_MAX_ACK_PENDING,
                    ..Default::default()
                })
                .await
                .expect("create a native consumer"),
        );
        subjects.push(async_nats::Subject::from(format!("{name}.{TENANT}.rows")));
    }
    publish_pipelined(js, &subjects, payloads).await;
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(pg.client().await);
    }
    // Rows take turns over the subjects: partition p has every
    // CONNECTIONS-th row from p.
    let expected = |partition: usize| (payloads.len() + CONNECTIONS - 1 - partition) / CONNECTIONS;
    let started = Instant::now();
    let workers =
        consumers
            .into_iter()
            .zip(clients)
            .enumerate()
            .map(|(partition, (consumer, client))| {
                let expected = expected(partition);
                tokio::spawn(async move {
                    let statement = client
                        .prepare_typed(INSERT, &[tokio_postgres::types::Type::TEXT])
                        .await
                        .expect("prepare");
                    // Whatever has arrived, up to a batch, once at least one row has.
                    let mut batches = consumer
                        .stream()
                        .max_messages_per_batch(BATCH)
                        .messages()
                        .await
                        .expect("pull from a native consumer")
                        .ready_chunks(BATCH);
                    let (mut done, mut statements) = (0, 0);
                    let mut body = String::new();
                    while done < expected {
                        let batch = batches.next().await.expect("the pull stream goes on");
                        let messages: Vec<_> = batch
                            .into_iter()
                            .map(|message| message.expect("a pulled row"))
                            .collect();
                        body.clear();
                        body.push('[');
                        for (index, message) in messages.iter().enumerate() {
                            if index > 0 {
                                body.push(',');
                            }
                            body.push_str(
                                std::str::from_utf8(&message.payload).expect("JSON rows"),
                            );
                        }
                        body.push(']');
                        client.batch_execute("BEGIN").await.expect("begin");
                        client.execute(&statement, &[&body]).await.expect("insert");
                        client.batch_execute("COMMIT").await.expect("commit");
                        for message in &messages {
                            message.ack().await.expect("ack");
                        }
                        done += messages.len();
                        statements += 1;
                    }
                    statements
                })
            });
    let mut statements = 0;
    for worker in futures::future::join_all(workers).await {
        statements += worker.expect("native consumer worker");
    }
    js.client().flush().await.expect("flush the acks");
    let rate = payloads.len() as f64 / started.elapsed().as_secs_f64();
    let written = postgres_support::count(db, "rows").await;
    assert_eq!(
        written as usize,
        payloads.len(),
        "the native consumer wrote every row"
    );
    for partition in 0..CONNECTIONS {
        js.delete_stream(format!("native{partition}"))
            .await
            .expect("delete a native stream");
    }
    (rate, payloads.len() as f64 / statements as f64)
}

/// weir: its topology, the rows published to it, then a host started
/// in-process drains them into the table.
async fn measure_weir(
    js: &async_nats::jetstream::Context,
    nats_url: &str,
    pg: &PgServer,
    db: &tokio_postgres::Client,
    dir: &Path,
    round: usize,
    payloads: &[Bytes],
) -> f64 {
    db.batch_execute("TRUNCATE rows").await.expect("truncate");
    let (partitions, shards) = DEFAULT_LAYOUT;
    let router = Names::new("weir", partitions, shards);
    let tables = &tables_covering(&router);
    let sink = format!(
        "wasm = {:?}\nworld = \"sink\"\nsettings = {SINK_SETTINGS}\ngrants.postgres = {{ url = \"{}\", max_connections = {CONNECTIONS} }}\n",
        weir_test_artifacts::POSTGRES_SINK,
        pg.url()
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
    publish_pipelined(js, &subjects, payloads).await;
    let host = RunningHost::start(config).await.expect("weir host starts");
    let expected = payloads.len() as u64;
    let (rate, counts) =
        drain_rate(&host, expected, Duration::from_millis(10), DRAIN_TIMEOUT).await;
    assert_eq!(
        (counts.dead_lettered, counts.retried),
        (0, 0),
        "every row is delivered once"
    );
    host.shutdown().await;
    let written = postgres_support::count(db, "rows").await;
    assert_eq!(
        written as usize,
        payloads.len(),
        "weir wrote every row once"
    );
    rate
}
