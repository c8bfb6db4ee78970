//! Benchmark: what replication costs. The same rows are published
//! (pipelined) and consumed (a pull consumer acking each row) on one
//! nats-server with an R1 stream and on a three-node cluster on loopback
//! with an R3 stream — the raw JetStream figures — and then drained by
//! weir's delivery path (one unit, pass-through transform, null sink) with
//! `[stream] replicas` 1 and 3, all in one run so the ratios compare like
//! with like. The three nodes share this machine's cores with the bench,
//! so R3 here pays for replication in CPU as well as in round trips.
//!
//! `cargo bench -p weir --bench replication`; `WEIR_BENCH_ROWS` (default
//! 100000) and `WEIR_BENCH_ROUNDS` (default 2).

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use futures::StreamExt;
use weir::config::{Config, Overrides, SyncPolicy};
use weir::host::RunningHost;
use weir::nats::{EmbeddedNats, EmbeddedOptions};
use weir::topology::{Manifest, Names};

use support::{TENANT, Table, drain_rate, env_count, median, print_figure, publish_pipelined};

const BENCH: &str = "replication";
const DEFAULT_ROWS: usize = 100_000;
const DEFAULT_ROUNDS: usize = 2;
/// A scenario that takes longer than this is broken, not slow.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a fresh cluster may take to elect its meta leader.
const CLUSTER_READY: Duration = Duration::from_secs(60);
const STATUS_POLL: Duration = Duration::from_millis(10);
/// Pause between phases, so a stream's deletion does not land in the next.
const SETTLE: Duration = Duration::from_millis(300);

/// One NATS setup: its servers (kept running) and a client of it.
struct Nats {
    replicas: usize,
    seeds: String,
    client: async_nats::Client,
    _servers: Vec<EmbeddedNats>,
}

/// A free loopback port (the server binds it just after).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free loopback port")
}

/// One server (`replicas` 1) or a cluster of three, ready for JetStream.
async fn start(replicas: usize, dir: &Path) -> Nats {
    let ports: Vec<(u16, u16)> = (0..replicas).map(|_| (free_port(), free_port())).collect();
    let mut starts = Vec::new();
    for (index, (port, route)) in ports.iter().enumerate() {
        let mut extra = format!("server_name: n{index}\n");
        if replicas > 1 {
            let routes: Vec<String> = ports
                .iter()
                .filter(|(_, other)| other != route)
                .map(|(_, other)| format!("\"nats-route://127.0.0.1:{other}\""))
                .collect();
            extra.push_str(&format!(
                "cluster {{\n  name: bench\n  listen: \"127.0.0.1:{route}\"\n  routes: [{}]\n}}\n",
                routes.join(", ")
            ));
        }
        let options = EmbeddedOptions {
            binary: None,
            data_dir: dir.join(format!("r{replicas}-n{index}")),
            sync: SyncPolicy::Periodic,
            port: Some(*port),
            extra_config: extra,
            password: None,
        };
        // Started together: a clustered node waits for its peers.
        starts.push(tokio::task::spawn_blocking(move || {
            EmbeddedNats::start(&options)
        }));
    }
    let mut servers = Vec::new();
    for start in starts {
        servers.push(
            start
                .await
                .expect("start task")
                .expect("nats-server >= 2.14 on PATH (bash .ci/setup installs it)"),
        );
    }
    let seeds: Vec<String> = ports
        .iter()
        .map(|(port, _)| format!("nats://127.0.0.1:{port}"))
        .collect();
    let addrs: Vec<async_nats::ServerAddr> = seeds
        .iter()
        .map(|url| url.parse().expect("a server address"))
        .collect();
    let client = async_nats::ConnectOptions::new()
        .connect(addrs)
        .await
        .expect("connect to the bench's nats");
    Nats {
        replicas,
        seeds: seeds.join(","),
        client,
        _servers: servers,
    }
}

/// What one scenario measured.
#[derive(Clone, Copy)]
struct Measured {
    publish_rows_per_sec: f64,
    deliver_rows_per_sec: f64,
}

fn main() {
    let rows = env_count("WEIR_BENCH_ROWS", DEFAULT_ROWS);
    let rounds = env_count("WEIR_BENCH_ROUNDS", DEFAULT_ROUNDS);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(rows, rounds));
}

async fn run(rows: usize, rounds: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    let payloads: Vec<Bytes> = (0..rows as u64)
        .map(|id| Bytes::from(support::row(id)))
        .collect();
    let setups = [start(1, dir.path()).await, start(3, dir.path()).await];
    eprintln!(
        "replication bench: {rows} rows of {} bytes, {rounds} rounds, R1 on one server, R3 on three",
        support::ROW_BYTES
    );
    // [setup][raw, weir] → one figure per round.
    let mut measured: [[Vec<Measured>; 2]; 2] = Default::default();
    for round in 1..=rounds {
        for (nats, figures) in setups.iter().zip(measured.iter_mut()) {
            let raw = measure_raw(nats, &payloads).await;
            let weir = measure_weir(nats, dir.path(), &payloads).await;
            eprintln!(
                "round {round}, R{}: raw {:.0} published/s, {:.0} consumed/s; weir {:.0} delivered/s",
                nats.replicas,
                raw.publish_rows_per_sec,
                raw.deliver_rows_per_sec,
                weir.deliver_rows_per_sec
            );
            figures[0].push(raw);
            figures[1].push(weir);
        }
    }
    report(&setups, &measured);
}

/// A plain work-queue stream with `replicas` copies, one durable pull
/// consumer, a loop acking every row.
async fn measure_raw(nats: &Nats, payloads: &[Bytes]) -> Measured {
    let js = jetstream::new(nats.client.clone());
    let consumer = support::raw_consumer(&js, nats.replicas).await;
    let subjects = vec![async_nats::Subject::from("raw.acme.events")];
    let publish_rows_per_sec = publish_pipelined(&js, &subjects, payloads).await;
    tokio::time::sleep(SETTLE).await;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(support::RAW_PULL_BATCH)
        .messages()
        .await
        .expect("pull from the raw consumer");
    let deliver = async {
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
        nats.client.flush().await.expect("flush the acks");
        let first = first.expect("at least one row");
        (payloads.len() - 1) as f64 / first.elapsed().as_secs_f64()
    };
    let deliver_rows_per_sec = tokio::time::timeout(SCENARIO_TIMEOUT, deliver)
        .await
        .expect("the raw consumer drains the stream in time");
    drop(messages);
    js.delete_stream("raw")
        .await
        .expect("delete the raw stream");
    tokio::time::sleep(SETTLE).await;
    Measured {
        publish_rows_per_sec,
        deliver_rows_per_sec,
    }
}

/// weir with `[stream] replicas` as the setup's: its topology created, the
/// rows published to one table's unit, then a host in-process drains them.
async fn measure_weir(nats: &Nats, dir: &Path, payloads: &[Bytes]) -> Measured {
    let js = jetstream::new(nats.client.clone());
    let tables = ["events".to_string()];
    let replicas = nats.replicas;
    let text = support::pass_through_config(
        &nats.seeds,
        &dir.join(format!("weir-r{replicas}")),
        (1, 1),
        &tables,
    )
    .replace(
        "shards = 1\n",
        &format!("shards = 1\nreplicas = {replicas}\n"),
    );
    let config_path = dir.join(format!("weir-r{replicas}.toml"));
    let config = Config::parse(&config_path, &text, &Overrides::default())
        .unwrap_or_else(|err| panic!("the bench's config is valid: {err}"));
    let router = Names::new(&config.stream.prefix, 1, 1);
    let deadline = Instant::now() + CLUSTER_READY;
    loop {
        let manifest = Manifest::new(&router, &config.stream, &config.delivery, None);
        match manifest.create(&js).await {
            Ok(_) => break,
            Err(err) if Instant::now() < deadline => {
                eprintln!("waiting for the cluster: {err}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(err) => panic!("cannot create weir's topology: {err}"),
        }
    }
    let subject = async_nats::Subject::from(router.subject(
        router.route(TENANT, &tables[0]),
        TENANT,
        &tables[0],
    ));
    let publish_rows_per_sec = publish_pipelined(&js, &[subject], payloads).await;
    tokio::time::sleep(SETTLE).await;

    let host = RunningHost::start(config).await.expect("weir host starts");
    let expected = payloads.len() as u64;
    let (deliver_rows_per_sec, _) =
        drain_rate(&host, expected, STATUS_POLL, SCENARIO_TIMEOUT).await;
    host.shutdown().await;
    for stream in [router.partition_stream(0), router.dead_letter_stream()] {
        js.delete_stream(&stream)
            .await
            .expect("delete weir's streams");
    }
    tokio::time::sleep(SETTLE).await;
    Measured {
        publish_rows_per_sec,
        deliver_rows_per_sec,
    }
}

fn report(setups: &[Nats; 2], measured: &[[Vec<Measured>; 2]; 2]) {
    let of = |runs: &[Measured], figure: fn(&Measured) -> f64| {
        median(&runs.iter().map(figure).collect::<Vec<_>>())
    };
    let mut table = Table::new(&[
        "setup",
        "raw published/s",
        "raw consumed/s",
        "weir delivered/s",
        "weir / raw",
    ]);
    let r1_weir = of(&measured[0][1], |m| m.deliver_rows_per_sec);
    for (nats, [raw, weir]) in setups.iter().zip(measured) {
        let r = nats.replicas;
        let published = of(raw, |m| m.publish_rows_per_sec);
        let consumed = of(raw, |m| m.deliver_rows_per_sec);
        let delivered = of(weir, |m| m.deliver_rows_per_sec);
        print_figure(
            BENCH,
            &format!("r{r}_raw_published_rows_per_sec"),
            published,
        );
        print_figure(BENCH, &format!("r{r}_raw_consumed_rows_per_sec"), consumed);
        print_figure(
            BENCH,
            &format!("r{r}_weir_delivered_rows_per_sec"),
            delivered,
        );
        print_figure(BENCH, &format!("r{r}_weir_to_raw"), delivered / consumed);
        table.push(vec![
            format!("R{r}"),
            format!("{published:.0}"),
            format!("{consumed:.0}"),
            format!("{delivered:.0}"),
            format!("{:.2}", delivered / consumed),
        ]);
    }
    let r3_weir = of(&measured[1][1], |m| m.deliver_rows_per_sec);
    print_figure(BENCH, "weir_r3_to_r1", r3_weir / r1_weir);
    println!();
    table.print();
    println!("weir at R3 delivers {:.2} × its R1 rate", r3_weir / r1_weir);
}
