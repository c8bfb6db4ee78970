//! Benchmark: weir's delivery path (pull → pass-through transform → null sink → ack) against the raw JetStream limit, in one run on one nats-server.
//!
//! The same rows are published, pipelined, into (a) a plain work-queue stream
//! with one durable pull consumer, drained by a hand-written async-nats
//! consumer that acks each row — the limit — and (b) weir's own topology,
//! drained by a `RunningHost` started in-process: one unit (one consumer,
//! comparable with the limit), the default topology (4 partitions × 1
//! shard), and 4 shards of one partition, whose four filtered consumers
//! share one stream. Rows are published before anyone
//! consumes and the clock runs from the first delivery to the last, so the
//! figures are delivery only: no HTTP, no publish overlapping the consume.
//! Besides rows/s, each scenario reports the CPU time per row spent in this
//! process (the raw consumer, or the weir host) and in nats-server over the
//! same window: where the time goes, and steadier than a rate when other
//! work shares the machine. Scenarios alternate for `WEIR_BENCH_ROUNDS`
//! rounds so that noise hits them alike; medians are reported.
//!
//! `cargo bench -p weir --bench delivery`; `WEIR_BENCH_ROWS` (default
//! 200000) and `WEIR_BENCH_ROUNDS` (default 3) make it shorter or longer;
//! `WEIR_BENCH_ONLY=raw` or `=4x1` (partitions × shards) runs that scenario
//! alone, to profile the server (`perf record -g -p PID`, the pid printed).

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use futures::stream::StreamExt;
use weir::config::{Config, Overrides};
use weir::host::RunningHost;
use weir::nats::EmbeddedNats;
use weir::topology::{Manifest, Names, Unit};

use support::{
    ALLOC_CLASSES, CountingAllocator, DEFAULT_LAYOUT, TENANT, Table, env_count, median, median_of,
    print_figure, publish_pipelined, subjects, tables_covering,
};

/// Counts every allocation of this process: the delivery path's
/// allocations per row are read around the measured window.
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// The target of allocations per row on the delivery path (outside the plugin).
const TARGET_ALLOCS_PER_ROW: f64 = 2.0;
/// The target of allocated bytes per row against the raw consumer's (#35).
const TARGET_ALLOC_BYTES_OVER_LIMIT: f64 = 1.5;

const BENCH: &str = "delivery";
const DEFAULT_ROWS: usize = 200_000;
const DEFAULT_ROUNDS: usize = 3;
/// How often weir's status is read while it delivers. The end is taken
/// halfway between the last read below the count and the first at it, so
/// it is within half of this; each read costs two JetStream API requests
/// per unit, which a shorter period would add to the server's load.
const STATUS_POLL: Duration = Duration::from_millis(10);
/// A scenario that takes longer than this is broken, not slow.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(300);
/// Pause between phases so the server's background work (removing acked
/// rows, deleting streams) does not land in the next measurement.
const SETTLE: Duration = Duration::from_millis(300);
/// (partitions, shards) of weir's runs: one unit, comparable with the
/// limit; the default topology; and as many units as shards of one stream
/// (the default before it was measured here: ARCHITECTURE.md, "Topology").
const ONE_UNIT: (u32, u32) = (1, 1);
const ONE_STREAM_MANY_SHARDS: (u32, u32) = (1, 4);
/// Units of the scale runs (after the 1-unit runs of every round).
const SCALE_UNITS: [u32; 2] = [8, 32];

/// What one scenario measured. CPU time per row is the steadier figure on
/// a shared machine: other work slows the rate, not the work per row.
struct Measured {
    publish_rows_per_sec: f64,
    deliver_rows_per_sec: f64,
    /// CPU of this process while delivering: the raw consumer, or the weir
    /// host.
    client_cpu_us_per_row: f64,
    server_cpu_us_per_row: f64,
    /// Resident memory of this process with the weir host started and
    /// idle (0 for the raw consumer).
    host_rss_kib: u64,
    /// Allocations (and their bytes) this process made per row while
    /// delivering: the host's side only; a plugin allocates in its own
    /// linear memory, which this does not see.
    allocs_per_row: f64,
    alloc_bytes_per_row: f64,
    /// The same bytes by allocation size class ([`ALLOC_CLASSES`]).
    alloc_class_bytes_per_row: [f64; 4],
}

/// CPU time used so far by this process and by the nats-server.
#[derive(Clone, Copy)]
struct CpuUsed {
    client: Duration,
    server: Duration,
    /// Allocations and bytes of this process so far.
    allocations: (u64, u64),
    /// Bytes by size class so far.
    classes: [u64; 4],
}

impl CpuUsed {
    fn now(server_pid: u32) -> CpuUsed {
        CpuUsed {
            client: process_cpu("self"),
            server: process_cpu(&server_pid.to_string()),
            allocations: CountingAllocator::so_far(),
            classes: CountingAllocator::by_class(),
        }
    }

    /// Allocations, bytes and bytes by size class per row since `self`.
    fn allocations_per_row_since(self, rows: u64) -> (f64, f64, [f64; 4]) {
        let (count, bytes) = CountingAllocator::so_far();
        let classes = CountingAllocator::by_class();
        let rows = rows.max(1) as f64;
        (
            count.saturating_sub(self.allocations.0) as f64 / rows,
            bytes.saturating_sub(self.allocations.1) as f64 / rows,
            std::array::from_fn(|c| classes[c].saturating_sub(self.classes[c]) as f64 / rows),
        )
    }

    /// Microseconds of (client, server) CPU per row since `self`.
    fn per_row_since(self, server_pid: u32, rows: u64) -> (f64, f64) {
        let now = CpuUsed::now(server_pid);
        let per_row = |spent: Duration| spent.as_secs_f64() * 1e6 / rows as f64;
        (
            per_row(now.client.saturating_sub(self.client)),
            per_row(now.server.saturating_sub(self.server)),
        )
    }
}

/// User plus system CPU time of a process, all its threads.
fn process_cpu(pid: &str) -> Duration {
    support::stat_cpu(&format!("/proc/{pid}/stat"))
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
    let server = support::start_nats(&dir.path().join("nats")).await;
    let client = async_nats::connect(server.url())
        .await
        .expect("connect to the bench's nats-server");
    let js = jetstream::new(client.clone());

    let payloads: Vec<Bytes> = (0..rows as u64)
        .map(|id| Bytes::from(support::row(id)))
        .collect();
    eprintln!(
        "delivery bench: {rows} rows of {} bytes, {rounds} rounds",
        support::ROW_BYTES
    );
    if let Ok(only) = std::env::var("WEIR_BENCH_ONLY") {
        return run_only(&only, rounds, &client, &js, &server, dir.path(), &payloads).await;
    }

    let mut limit = Vec::new();
    let mut weir_one = Vec::new();
    let mut weir_default = Vec::new();
    let mut weir_many = Vec::new();
    for round in 1..=rounds {
        let raw = measure_limit(&client, &js, server.pid(), &payloads).await;
        eprintln!(
            "round {round}: limit {:.0} rows/s",
            raw.deliver_rows_per_sec
        );
        limit.push(raw);
        for (layout, results) in [
            (ONE_UNIT, &mut weir_one),
            (DEFAULT_LAYOUT, &mut weir_default),
            (ONE_STREAM_MANY_SHARDS, &mut weir_many),
        ] {
            let measured = measure_weir(&js, &server, dir.path(), layout, &payloads).await;
            eprintln!(
                "round {round}: weir, {} × {} {:.0} rows/s",
                layout.0, layout.1, measured.deliver_rows_per_sec
            );
            results.push(measured);
        }
    }
    // The rounds' figures first: a scale run short of disk (each unit's
    // stream reserves its `max_bytes`) leaves them printed.
    report(rows, &limit, &weir_one, &weir_default, &weir_many);
    // Scale: more units on one host (a partition each, as the default
    // grows), once each after the rounds.
    let mut scale = Vec::new();
    for units in SCALE_UNITS {
        let measured = measure_weir(&js, &server, dir.path(), (units, 1), &payloads).await;
        eprintln!(
            "scale: weir, {units} units {:.0} rows/s",
            measured.deliver_rows_per_sec
        );
        scale.push((units, measured));
    }
    drop(client);
    report_scale(&weir_one, &scale);
    drop(server);
}

/// `WEIR_BENCH_ONLY=raw` or `=PxS` (partitions × shards): that scenario
/// alone, `rounds` times, after printing the server's pid, so that its
/// profile can be taken (`perf record -g -p PID`).
async fn run_only(
    only: &str,
    rounds: usize,
    client: &async_nats::Client,
    js: &jetstream::Context,
    server: &EmbeddedNats,
    dir: &Path,
    payloads: &[Bytes],
) {
    let layout = only
        .split_once('x')
        .and_then(|(p, s)| Some((p.parse().ok()?, s.parse().ok()?)));
    if only != "raw" && layout.is_none() {
        panic!("WEIR_BENCH_ONLY is `raw` or PARTITIONSxSHARDS, not {only:?}");
    }
    eprintln!("nats-server pid {}; starting in 3 s", server.pid());
    tokio::time::sleep(Duration::from_secs(3)).await;
    for round in 1..=rounds {
        let measured = match layout {
            Some(layout) => measure_weir(js, server, dir, layout, payloads).await,
            None => measure_limit(client, js, server.pid(), payloads).await,
        };
        eprintln!(
            "round {round}, {only}: {:.0} rows/s, server {:.1} µs/row, client {:.1} µs/row",
            measured.deliver_rows_per_sec,
            measured.server_cpu_us_per_row,
            measured.client_cpu_us_per_row
        );
    }
}

/// The limit: a plain stream like a weir partition (file storage, work
/// queue), one durable pull consumer, a loop that acks every row.
async fn measure_limit(
    client: &async_nats::Client,
    js: &jetstream::Context,
    server_pid: u32,
    payloads: &[Bytes],
) -> Measured {
    // Subjects of the same shape and length as weir's, under another prefix.
    let router = Names::new("raw", 1, 1);
    let tables = tables_covering(&Names::new("weir", DEFAULT_LAYOUT.0, DEFAULT_LAYOUT.1));
    let tables = &tables;
    let consumer = support::raw_consumer(js, 1).await;
    let subjects = subjects(&router, tables, |_| Unit {
        partition: 0,
        shard: 0,
    });
    let publish_rows_per_sec = publish_pipelined(js, &subjects, payloads).await;
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
            first.get_or_insert_with(|| (Instant::now(), CpuUsed::now(server_pid)));
            message.ack().await.expect("ack");
        }
        client.flush().await.expect("flush the acks");
        let (first_at, first_cpu) = first.expect("at least one row");
        // The first row's arrival starts the clocks: it is not counted.
        let rows = payloads.len() as u64 - 1;
        let rate = rows as f64 / first_at.elapsed().as_secs_f64();
        let allocations = first_cpu.allocations_per_row_since(rows);
        (rate, first_cpu.per_row_since(server_pid, rows), allocations)
    };
    let (
        deliver_rows_per_sec,
        (client_cpu_us_per_row, server_cpu_us_per_row),
        (allocs_per_row, alloc_bytes_per_row, alloc_class_bytes_per_row),
    ) = tokio::time::timeout(SCENARIO_TIMEOUT, deliver)
        .await
        .expect("the raw consumer drains the stream in time");
    drop(messages);
    wait_empty(js, "raw").await;
    js.delete_stream("raw")
        .await
        .expect("delete the raw stream");
    tokio::time::sleep(SETTLE).await;
    Measured {
        publish_rows_per_sec,
        deliver_rows_per_sec,
        client_cpu_us_per_row,
        server_cpu_us_per_row,
        host_rss_kib: 0,
        allocs_per_row,
        alloc_bytes_per_row,
        alloc_class_bytes_per_row,
    }
}

/// weir: its topology created from its own config, the rows published to
/// their routed subjects, then a host started in-process drains them
/// through a pass-through transform into a null sink.
async fn measure_weir(
    js: &jetstream::Context,
    server: &EmbeddedNats,
    dir: &Path,
    (partitions, shards): (u32, u32),
    payloads: &[Bytes],
) -> Measured {
    let router = Names::new("weir", partitions, shards);
    // A table per unit, so that each unit gets its share of the rows.
    let tables = &tables_covering(&router);
    let config_path = dir.join(format!("weir-{partitions}x{shards}.toml"));
    let text = support::pass_through_config(
        server.url(),
        &dir.join(format!("data-{partitions}x{shards}")),
        (partitions, shards),
        tables,
    );
    let config = Config::parse(&config_path, &text, &Overrides::default())
        .unwrap_or_else(|err| panic!("the bench's config is valid: {err}"));
    Manifest::new(&router, &config.stream, &config.delivery, None)
        .create(js)
        .await
        .expect("create weir's topology");
    let subjects = subjects(&router, tables, |table| router.route(TENANT, table));
    let publish_rows_per_sec = publish_pipelined(js, &subjects, payloads).await;
    tokio::time::sleep(SETTLE).await;

    let host = RunningHost::start(config).await.expect("weir host starts");
    let host_rss_kib = rss_kib();
    let expected = payloads.len() as u64;
    let deliver = async {
        // The host's workers start pulling before `start` returns; the rate
        // counts only rows delivered after the first delivery was seen.
        let (first_at, first_cpu, first_count) = loop {
            let delivered = host.status().rows().delivered;
            if delivered > 0 {
                break (Instant::now(), CpuUsed::now(server.pid()), delivered);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let mut below_at = first_at;
        loop {
            let rows = host.status().rows();
            let read_at = Instant::now();
            if rows.delivered >= expected {
                assert_eq!(
                    (rows.dead_lettered, rows.retried),
                    (0, 0),
                    "every row is delivered once"
                );
                let last_at = below_at + (read_at - below_at) / 2;
                let rows = expected - first_count;
                let rate = rows as f64 / (last_at - first_at).as_secs_f64();
                let allocations = first_cpu.allocations_per_row_since(rows);
                break (
                    rate,
                    first_cpu.per_row_since(server.pid(), rows),
                    allocations,
                );
            }
            below_at = read_at;
            tokio::time::sleep(STATUS_POLL).await;
        }
    };
    let (
        deliver_rows_per_sec,
        (client_cpu_us_per_row, server_cpu_us_per_row),
        (allocs_per_row, alloc_bytes_per_row, alloc_class_bytes_per_row),
    ) = tokio::time::timeout(SCENARIO_TIMEOUT, deliver)
        .await
        .expect("weir drains its stream in time");
    host.shutdown().await;
    wait_empty(js, &router.partition_stream(0)).await;
    for stream in [router.partition_stream(0), router.dead_letter_stream()] {
        js.delete_stream(&stream)
            .await
            .expect("delete weir's streams");
    }
    tokio::time::sleep(SETTLE).await;
    Measured {
        publish_rows_per_sec,
        deliver_rows_per_sec,
        client_cpu_us_per_row,
        server_cpu_us_per_row,
        host_rss_kib,
        allocs_per_row,
        alloc_bytes_per_row,
        alloc_class_bytes_per_row,
    }
}

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Waits until every acked row has left a work-queue stream, so the next
/// scenario does not pay for this one's clean-up.
async fn wait_empty(js: &jetstream::Context, name: &str) {
    let deadline = Instant::now() + SCENARIO_TIMEOUT;
    loop {
        let mut stream = js.get_stream(name).await.expect("stream exists");
        let left = stream.info().await.expect("stream info").state.messages;
        if left == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "stream {name} still holds {left} rows"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn report(
    rows: usize,
    limit: &[Measured],
    weir_one: &[Measured],
    weir_default: &[Measured],
    weir_many: &[Measured],
) {
    let delivered = |runs: &[Measured]| median_of(runs, |m| m.deliver_rows_per_sec);
    let published = |runs: &[Measured]| median_of(runs, |m| m.publish_rows_per_sec);
    let client_cpu = |runs: &[Measured]| median_of(runs, |m| m.client_cpu_us_per_row);
    let server_cpu = |runs: &[Measured]| median_of(runs, |m| m.server_cpu_us_per_row);
    // Ratios are taken round by round (side by side, same noise), then the median.
    let ratio = |runs: &[Measured]| {
        median(
            &runs
                .iter()
                .zip(limit)
                .map(|(weir, raw)| weir.deliver_rows_per_sec / raw.deliver_rows_per_sec)
                .collect::<Vec<_>>(),
        )
    };

    print_figure(BENCH, "limit_rows_per_sec", delivered(limit));
    print_figure(BENCH, "weir_rows_per_sec", delivered(weir_one));
    print_figure(BENCH, "weir_default_rows_per_sec", delivered(weir_default));
    print_figure(BENCH, "weir_4_shards_rows_per_sec", delivered(weir_many));
    print_figure(BENCH, "ratio_weir_to_limit", ratio(weir_one));
    print_figure(BENCH, "ratio_weir_default_to_limit", ratio(weir_default));
    print_figure(BENCH, "ratio_weir_4_shards_to_limit", ratio(weir_many));
    print_figure(BENCH, "limit_publish_rows_per_sec", published(limit));
    print_figure(BENCH, "weir_publish_rows_per_sec", published(weir_one));
    print_figure(
        BENCH,
        "weir_default_publish_rows_per_sec",
        published(weir_default),
    );
    print_figure(
        BENCH,
        "weir_4_shards_publish_rows_per_sec",
        published(weir_many),
    );
    let allocs = |runs: &[Measured]| median_of(runs, |m| m.allocs_per_row);
    let alloc_bytes = |runs: &[Measured]| median_of(runs, |m| m.alloc_bytes_per_row);
    for (scenario, runs) in [
        ("limit", limit),
        ("weir", weir_one),
        ("weir_default", weir_default),
        ("weir_4_shards", weir_many),
    ] {
        let client = format!("{scenario}_client_cpu_us_per_row");
        print_figure(BENCH, &client, client_cpu(runs));
        let server = format!("{scenario}_server_cpu_us_per_row");
        print_figure(BENCH, &server, server_cpu(runs));
        print_figure(BENCH, &format!("{scenario}_allocs_per_row"), allocs(runs));
        print_figure(
            BENCH,
            &format!("{scenario}_alloc_bytes_per_row"),
            alloc_bytes(runs),
        );
    }
    // The host's allocated bytes against the raw consumer's, round by round.
    let bytes_over = |runs: &[Measured], reference: &[Measured]| {
        median(
            &runs
                .iter()
                .zip(reference)
                .map(|(weir, raw)| weir.alloc_bytes_per_row / raw.alloc_bytes_per_row.max(1.0))
                .collect::<Vec<_>>(),
        )
    };
    for (figure, value) in [
        ("weir_alloc_bytes_over_limit", bytes_over(weir_one, limit)),
        (
            "weir_default_alloc_bytes_over_limit",
            bytes_over(weir_default, limit),
        ),
    ] {
        print_figure(BENCH, figure, value);
    }

    println!();
    println!(
        "delivery: {rows} rows of {} bytes, median of {} rounds",
        support::ROW_BYTES,
        limit.len()
    );
    let mut table = Table::new(&[
        "consumer",
        "rows/s",
        "x limit",
        "client CPU µs/row",
        "server CPU µs/row",
        "allocs/row",
        "alloc bytes/row",
        "publish rows/s",
        "each round",
    ]);
    for (name, runs) in [
        ("raw pull consumer (limit)", limit),
        ("weir, 1 unit", weir_one),
        ("weir, default: 4 partitions × 1 shard", weir_default),
        ("weir, 1 partition × 4 shards", weir_many),
    ] {
        let rounds: Vec<String> = runs
            .iter()
            .map(|m| format!("{:.0}", m.deliver_rows_per_sec))
            .collect();
        table.push(vec![
            name.to_string(),
            format!("{:.0}", delivered(runs)),
            format!("{:.2}", ratio(runs)),
            format!("{:.2}", client_cpu(runs)),
            format!("{:.2}", server_cpu(runs)),
            format!("{:.1}", allocs(runs)),
            format!("{:.0}", alloc_bytes(runs)),
            format!("{:.0}", published(runs)),
            rounds.join(" "),
        ]);
    }
    table.print();
    println!(
        "target: weir ≥ 0.95 × the limit with 1 unit and with the default topology; allocated bytes per row ≤ {TARGET_ALLOC_BYTES_OVER_LIMIT} × the raw consumer's; ≤ {TARGET_ALLOCS_PER_ROW} allocations per row outside the plugin (host side, this process)"
    );
    report_alloc_split(&[
        ("raw pull consumer (limit)", limit),
        ("weir, 1 unit", weir_one),
        ("weir, default: 4 partitions × 1 shard", weir_default),
    ]);
}

/// Where the allocated bytes per row go, by allocation size: the split the
/// counting allocator can see (median of the rounds per class).
fn report_alloc_split(scenarios: &[(&str, &[Measured])]) {
    let mut headers = vec!["alloc bytes / row by size".to_string()];
    headers.extend(ALLOC_CLASSES.iter().map(|(_, name)| name.to_string()));
    headers.push("all".into());
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut table = Table::new(&headers);
    for (name, runs) in scenarios {
        let mut cells = vec![name.to_string()];
        for class in 0..ALLOC_CLASSES.len() {
            let per_row = median(
                &runs
                    .iter()
                    .map(|m| m.alloc_class_bytes_per_row[class])
                    .collect::<Vec<_>>(),
            );
            cells.push(format!("{per_row:.0}"));
        }
        let all = median(
            &runs
                .iter()
                .map(|m| m.alloc_bytes_per_row)
                .collect::<Vec<_>>(),
        );
        cells.push(format!("{all:.0}"));
        table.push(cells);
    }
    println!();
    table.print();
    println!(
        "(≤ 128 B: subjects, header values, small boxes; 129 B – 2 KiB: a header map, per-row vectors of small batches; 2 – 64 KiB: a batch's vectors and packed rows; > 64 KiB: read buffers growing)"
    );
}

/// Throughput as units grow on one host, and the memory each unit adds.
fn report_scale(weir_one: &[Measured], scale: &[(u32, Measured)]) {
    let one_rss = median(
        &weir_one
            .iter()
            .map(|m| m.host_rss_kib as f64)
            .collect::<Vec<_>>(),
    );
    let one_rate = median(
        &weir_one
            .iter()
            .map(|m| m.deliver_rows_per_sec)
            .collect::<Vec<_>>(),
    );
    let mut table = Table::new(&["units", "rows/s", "host RSS (MiB)", "KiB per added unit"]);
    table.push(vec![
        "1".into(),
        format!("{one_rate:.0}"),
        format!("{:.1}", one_rss / 1024.0),
        "-".into(),
    ]);
    for (units, measured) in scale {
        let per_unit = (measured.host_rss_kib as f64 - one_rss) / f64::from(units - 1);
        print_figure(
            BENCH,
            &format!("weir_{units}_units_rows_per_sec"),
            measured.deliver_rows_per_sec,
        );
        print_figure(BENCH, &format!("weir_{units}_units_kib_per_unit"), per_unit);
        table.push(vec![
            units.to_string(),
            format!("{:.0}", measured.deliver_rows_per_sec),
            format!("{:.1}", measured.host_rss_kib as f64 / 1024.0),
            format!("{per_unit:.0}"),
        ]);
    }
    println!();
    println!("scale: one host, more units (pass-through transform, null sink)");
    table.print();
}
