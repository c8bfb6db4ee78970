//! What the benches share: the 256-byte JSON row they all move, knobs read from the environment, medians, and the one-JSON-line-per-figure output.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};

/// Size of every benchmark row: the row size the README's figures are quoted for.
pub const ROW_BYTES: usize = 256;

/// A flat JSON object of exactly [`ROW_BYTES`] bytes with an `email` and a
/// `card` to mask; `id` makes every row different.
pub fn row(id: u64) -> Vec<u8> {
    let mut text = format!(
        r#"{{"id":{id},"ts":"2026-01-01T12:00:00.000Z","user":"user{id}","email":"user{id}@example.com","card":"4111-1111-1111-{card:04}","amount":{amount},"currency":"EUR","country":"DE","note":""#,
        card = id % 10_000,
        amount = id % 100_000,
    );
    let closing = "\"}";
    let padding = ROW_BYTES
        .checked_sub(text.len() + closing.len())
        .expect("the row's fields fit in ROW_BYTES");
    text.extend(std::iter::repeat_n('x', padding));
    text.push_str(closing);
    debug_assert_eq!(text.len(), ROW_BYTES);
    text.into_bytes()
}

/// Rows `0..count` as delivery hands them to a plugin, packed `batch` rows
/// at a time: tenant `acme`, table `orders`, the payload of [`row`], first
/// delivery.
pub fn plugin_batches(count: usize, batch: usize) -> Vec<weir::delivery::Batch> {
    let ids: Vec<u64> = (0..count as u64).collect();
    ids.chunks(batch)
        .map(|ids| {
            let mut packed = weir::delivery::Batch::with_capacity(ids.len(), ids.len() * ROW_BYTES);
            for &id in ids {
                packed.push(
                    TENANT,
                    "orders",
                    &row(id),
                    [],
                    weir::delivery::Position {
                        sequence: id + 1,
                        attempt: 1,
                    },
                );
            }
            packed
        })
        .collect()
}

/// Runs `input` through a masking plugin and returns the payloads it
/// emitted, one per row; panics unless it replaced every row by exactly one
/// row (what the masking benches expect).
pub fn masked_by_plugin(
    runtime: &tokio::runtime::Runtime,
    instance: &mut weir::sandbox::PluginInstance,
    input: &weir::delivery::Batch,
) -> Vec<Vec<u8>> {
    use weir::delivery::{Answer, Batch, Outcome};
    let transformed = runtime
        .block_on(instance.transform(input.packed()))
        .expect("the masking plugin runs");
    let mut answer = Answer::new(&transformed, input.len()).expect("a well-formed answer");
    let mut next = Batch::default();
    for index in 0..input.len() {
        match answer.outcome(index).expect("a well-formed outcome") {
            Outcome::Emit(emitted) if emitted.len() == 1 => answer
                .push_emitted(&mut next, input, index, emitted.start)
                .expect("a well-formed emitted row"),
            other => panic!("row {index}: expected one replaced row, got {other:?}"),
        }
    }
    (0..next.len()).map(|i| next.payload(i).to_vec()).collect()
}

/// A count from the environment (`WEIR_BENCH_ROWS=50000`), else `default`.
pub fn env_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(text) => text
            .trim()
            .replace('_', "")
            .parse()
            .ok()
            .filter(|count| *count > 0)
            .unwrap_or_else(|| panic!("{name}={text:?} is not a positive count")),
        Err(_) => default,
    }
}

/// The median of some measurements (the mean of the middle two when even).
pub fn median(values: &[f64]) -> f64 {
    assert!(!values.is_empty(), "a median needs at least one value");
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    }
}

/// The median of `figure` over `items`.
pub fn median_of<T>(items: &[T], figure: impl Fn(&T) -> f64) -> f64 {
    median(&items.iter().map(figure).collect::<Vec<_>>())
}

/// Prints one figure as the JSON line tools read:
/// `{"bench":"delivery","figure":"weir_rows_per_sec","value":123456.0}`.
pub fn print_figure(bench: &str, figure: &str, value: f64) {
    let line = serde_json::json!({ "bench": bench, "figure": figure, "value": value });
    println!("{line}");
}

/// A small table for people, printed after the JSON lines; columns are as
/// wide as their widest cell.
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        Table {
            rows: vec![headers.iter().map(|h| h.to_string()).collect()],
        }
    }

    pub fn push(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn print(&self) {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|column| {
                let cells = self.rows.iter().filter_map(|row| row.get(column));
                cells.map(|cell| cell.chars().count()).max().unwrap_or(0)
            })
            .collect();
        let mut text = String::new();
        for (index, row) in self.rows.iter().enumerate() {
            for (column, cell) in row.iter().enumerate() {
                let width = widths[column];
                // Names left, numbers right.
                let _ = match column {
                    0 => write!(text, "{cell:<width$}"),
                    _ => write!(text, "  {cell:>width$}"),
                };
            }
            text.push('\n');
            if index == 0 {
                let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
                text.push_str(&rule.join("  "));
                text.push('\n');
            }
        }
        print!("{text}");
    }
}

/// PubAcks in flight at once while publishing, as weir's front door does.
pub const PUBLISH_WINDOW: usize = 1024;

/// Publishes every payload, the tables taking turns, with a window of
/// PubAcks in flight; returns rows per second until the last PubAck.
pub async fn publish_pipelined(
    js: &async_nats::jetstream::Context,
    subjects: &[async_nats::Subject],
    payloads: &[bytes::Bytes],
) -> f64 {
    let started = Instant::now();
    let mut in_flight = FuturesUnordered::new();
    for (index, payload) in payloads.iter().enumerate() {
        if in_flight.len() >= PUBLISH_WINDOW {
            let acked: Option<Result<_, _>> = in_flight.next().await;
            acked.expect("a PubAck in flight").expect("row stored");
        }
        let subject = subjects[index % subjects.len()].clone();
        let ack = js
            .publish(subject, payload.clone())
            .await
            .expect("publish a row");
        in_flight.push(ack.into_future());
    }
    while let Some(acked) = in_flight.next().await {
        acked.expect("row stored");
    }
    payloads.len() as f64 / started.elapsed().as_secs_f64()
}

/// Rows per pull request of a raw consumer: the best of 100, 256, 1000,
/// 2500 and 5000 tried here (256 was ~15% slower, above 1000 no better).
/// weir pulls its `batch_rows` (256 by default) with the same API.
pub const RAW_PULL_BATCH: usize = 1000;
/// Unacked rows a raw consumer may hold: the value weir's topology sets.
pub const RAW_MAX_ACK_PENDING: i64 = 20_000;

/// The raw limit's stream `raw` (subjects `raw.>`), like a weir partition
/// (file storage, work queue, `replicas` copies), and its one durable pull
/// consumer acking explicitly. A cluster still electing its meta leader
/// (a minute at most) is waited for.
pub async fn raw_consumer(
    js: &async_nats::jetstream::Context,
    replicas: usize,
) -> async_nats::jetstream::consumer::PullConsumer {
    use async_nats::jetstream::{consumer, stream};
    let config = stream::Config {
        name: "raw".into(),
        subjects: vec!["raw.>".into()],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        discard: stream::DiscardPolicy::New,
        num_replicas: replicas,
        ..Default::default()
    };
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    let stream = loop {
        match js.create_stream(config.clone()).await {
            Ok(stream) => break stream,
            Err(err) if Instant::now() < deadline => {
                eprintln!("waiting for NATS to create the raw stream: {err}");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(err) => panic!("cannot create the raw stream: {err}"),
        }
    };
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("raw".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            max_ack_pending: RAW_MAX_ACK_PENDING,
            ..Default::default()
        })
        .await
        .expect("create the raw consumer")
}

/// A nats-server of the bench's own, storing in `dir`, with nats-server's
/// default durability (`sync = "always"` is ~30x slower: docs/deployment.md, "Durability").
pub async fn start_nats(dir: &std::path::Path) -> weir::nats::EmbeddedNats {
    let options = weir::nats::EmbeddedOptions {
        binary: None,
        data_dir: dir.to_path_buf(),
        sync: weir::config::SyncPolicy::Periodic,
        port: None,
        extra_config: String::new(),
        password: None,
    };
    tokio::task::spawn_blocking(move || weir::nats::EmbeddedNats::start(&options))
        .await
        .expect("start task")
        .expect("nats-server >= 2.14 on PATH (bash .ci/setup installs it)")
}

/// The tenant of every bench row, and its API key.
pub const TENANT: &str = "acme";
/// weir's default topology, (partitions, shards) as `[stream]` has them.
pub const DEFAULT_LAYOUT: (u32, u32) = (
    weir::config::DEFAULT_PARTITIONS,
    weir::config::DEFAULT_SHARDS,
);
pub const API_KEY: &str = "bench-key-0001";

/// A host on a bench's server: one partition of `shards` units, every
/// table through a pass-through transform into a null sink.
pub fn pass_through_config(
    nats_url: &str,
    data_dir: &std::path::Path,
    layout: (u32, u32),
    tables: &[String],
) -> String {
    let null = format!(
        "wasm = {:?}\nworld = \"sink\"\n",
        weir_test_artifacts::NULL_SINK
    );
    pass_through_config_into(nats_url, data_dir, layout, tables, &null)
}

/// The same into the sink plugin `sink` (the body of its `[plugins.sink]`
/// table).
pub fn pass_through_config_into(
    nats_url: &str,
    data_dir: &std::path::Path,
    (partitions, shards): (u32, u32),
    tables: &[String],
    sink: &str,
) -> String {
    let tables = serde_json::to_string(tables).expect("table names serialize");
    format!(
        r#"
listen = "127.0.0.1:0"
data_dir = {data_dir:?}
max_body_bytes = 4194304

[nats]
url = "{nats_url}"

[stream]
create = true
partitions = {partitions}
shards = {shards}

[[tenants]]
name = "{TENANT}"
api_keys = ["{API_KEY}"]

[plugins.pass]
wasm = {pass:?}
world = "transform"

[plugins.sink]
{sink}
[[pipelines]]
tables = {tables}
transforms = ["pass"]
sink = "sink"
"#,
        data_dir = data_dir.display().to_string(),
        pass = weir_test_artifacts::PASSTHROUGH,
    )
}

/// Longest wait for a bench's host to claim its units.
pub const CLAIM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Waits until the host has claimed all `units`, so a run starts with
/// every unit being pulled; fails the bench if it never does.
pub async fn wait_claimed(host: &weir::host::RunningHost, units: usize) {
    let deadline = Instant::now() + CLAIM_TIMEOUT;
    while host.status().fleet().owners.len() < units {
        assert!(
            Instant::now() < deadline,
            "the host claimed {} of {units} units in {CLAIM_TIMEOUT:?}",
            host.status().fleet().owners.len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Posts one body to the front door as the bench's tenant; anything but
/// 202 fails the bench.
pub async fn post(http: &reqwest::Client, url: &str, body: bytes::Bytes) {
    let response = http
        .post(url)
        .bearer_auth(API_KEY)
        .body(body)
        .send()
        .await
        .expect("the front door answers");
    let status = response.status();
    if status != 202 {
        let text = response.text().await.unwrap_or_default();
        panic!("the front door answered {status}: {text}");
    }
}

/// A global allocator that counts allocations (and reallocations) and
/// their bytes, for a bench that declares it `#[global_allocator]`:
/// allocations per row on a path are a steadier figure than time.
pub struct CountingAllocator;

static ALLOCATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static ALLOCATED_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Upper bounds (bytes) of the allocation size classes [`CountingAllocator`]
/// counts bytes by; the last class takes every larger one. Where a row's
/// bytes go shows in the class: subjects, header values and small boxes;
/// one row's copy, a header map, a per-row vector of a small batch; a
/// batch's buffers and vectors; a connection's read buffer growing.
pub const ALLOC_CLASSES: [(usize, &str); 4] = [
    (128, "≤ 128 B"),
    (2048, "129 B – 2 KiB"),
    (64 << 10, "2 – 64 KiB"),
    (usize::MAX, "> 64 KiB"),
];
static CLASS_BYTES: [std::sync::atomic::AtomicU64; 4] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 4];

impl CountingAllocator {
    fn count(bytes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        ALLOCATIONS.fetch_add(1, Relaxed);
        ALLOCATED_BYTES.fetch_add(bytes as u64, Relaxed);
        let class = ALLOC_CLASSES
            .iter()
            .position(|(bound, _)| bytes <= *bound)
            .unwrap_or(ALLOC_CLASSES.len() - 1);
        CLASS_BYTES[class].fetch_add(bytes as u64, Relaxed);
    }

    /// Bytes allocated so far in each of [`ALLOC_CLASSES`].
    pub fn by_class() -> [u64; 4] {
        use std::sync::atomic::Ordering::Relaxed;
        std::array::from_fn(|class| CLASS_BYTES[class].load(Relaxed))
    }

    /// (allocations, bytes) since the process started.
    pub fn so_far() -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (ALLOCATIONS.load(Relaxed), ALLOCATED_BYTES.load(Relaxed))
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counters are plain atomics that never allocate.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        Self::count(layout.size());
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        Self::count(layout.size());
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        Self::count(new_size);
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

/// Time to run `calls` batches through a plugin instance, one call each.
pub fn time_plugin(
    runtime: &tokio::runtime::Runtime,
    instance: &mut weir::sandbox::PluginInstance,
    batches: &[weir::delivery::Batch],
    calls: usize,
) -> std::time::Duration {
    runtime.block_on(async {
        let started = Instant::now();
        for call in 0..calls {
            let transformed = instance
                .transform(batches[call % batches.len()].packed())
                .await
                .expect("the plugin call succeeds");
            std::hint::black_box(transformed);
        }
        started.elapsed()
    })
}

/// How `host` drains `expected` rows: rows per second from the first
/// row seen through to the last (taken halfway between the last status
/// read below `expected` and the first at it; reads every `poll`), and its
/// row counts then. A row is through once delivered or dropped (a
/// transform that consumes rows, as the window does, drops them: counted
/// apart since #36). Fails the bench past `timeout`, saying how far it got.
pub async fn drain_rate(
    host: &weir::host::RunningHost,
    expected: u64,
    poll: std::time::Duration,
    timeout: std::time::Duration,
) -> (f64, weir::ops::RowCounts) {
    let through = |rows: &weir::ops::RowCounts| rows.delivered + rows.dropped;
    let drain = async {
        // The host's workers start pulling before `start` returns; the rate
        // counts only rows through after the first one was seen.
        let (first_at, first_count) = loop {
            let done = through(&host.status().rows());
            if done > 0 {
                break (Instant::now(), done);
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        };
        let mut below_at = first_at;
        loop {
            let rows = host.status().rows();
            let read_at = Instant::now();
            if through(&rows) >= expected {
                let last_at = below_at + (read_at - below_at) / 2;
                let rate = (expected - first_count) as f64 / (last_at - first_at).as_secs_f64();
                return (rate, rows);
            }
            below_at = read_at;
            tokio::time::sleep(poll).await;
        }
    };
    match tokio::time::timeout(timeout, drain).await {
        Ok(drained) => drained,
        Err(_) => panic!(
            "the host did not drain {expected} rows within {timeout:?}: {:?}",
            host.status().rows()
        ),
    }
}

/// One table per unit of `router`'s topology, each routed to its own unit.
pub fn tables_covering(router: &weir::topology::Names) -> Vec<String> {
    let units = router.units();
    let mut by_shard: Vec<Option<String>> = vec![None; units.len()];
    for index in 0.. {
        let table = format!("events_{index}");
        let unit = router.route(TENANT, &table);
        let shard = units
            .iter()
            .position(|u| *u == unit)
            .expect("a routed unit exists");
        by_shard[shard].get_or_insert(table);
        if by_shard.iter().all(Option::is_some) {
            break;
        }
    }
    by_shard.into_iter().flatten().collect()
}

/// Each table's row subject, its shard picked by `shard_of`.
pub fn subjects(
    router: &weir::topology::Names,
    tables: &[String],
    unit_of: impl Fn(&str) -> weir::topology::Unit,
) -> Vec<async_nats::Subject> {
    tables
        .iter()
        .map(|table| {
            let unit = unit_of(table);
            async_nats::Subject::from(router.subject(unit, TENANT, table))
        })
        .collect()
}

/// A free loopback port (the PostgreSQL harness shared with the tests asks
/// for one as `crate::support::free_port`).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

/// reqwest's TLS has no crypto provider of its own (weir's clients bring
/// ring's): a bench's own `reqwest::Client`s take the process-wide one.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The project of `lang` under `target/authors/bench/`, built: its `.wasm`.
/// `WEIR_AUTHORS_WASM_RUST` (`_PYTHON`, `_JS`) names another `.wasm` to
/// time instead: a variant of the project (a built option, a stripped-down
/// transform) to see where the time goes.
pub fn authored_plugin(lang: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(format!("WEIR_AUTHORS_WASM_{}", lang.to_uppercase())) {
        return PathBuf::from(path);
    }
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/authors");
    let dir = target.join("bench").join(lang);
    let name = format!("enrich-{lang}");
    let wasm = dir.join(format!("{name}.wasm"));
    // Set for weir's own benches; the peer bench's crate (which compiles
    // this module too) has no weir binary and never builds a plugin.
    let Some(weir) = option_env!("CARGO_BIN_EXE_weir") else {
        panic!("only weir's own benches build plugins");
    };
    let weir = Path::new(weir);
    let modified = |path: &Path| path.metadata().and_then(|m| m.modified()).ok();
    if wasm.is_file() && modified(&wasm) > modified(weir) {
        return wasm;
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("remove the old project");
    }
    // Their chatter goes to stderr: stdout is the bench's figures.
    let status = Command::new(weir)
        .args(["plugin", "new", &name, "--lang", lang, "--dir"])
        .arg(&dir)
        .stdout(std::io::stderr())
        .status()
        .expect("weir runs");
    assert!(status.success(), "weir plugin new {name}");
    eprintln!("building {name}");
    let started = Instant::now();
    let status = Command::new(dir.join("build.sh"))
        .env("CARGO_TARGET_DIR", &target)
        .stdout(std::io::stderr())
        .status()
        .expect("build.sh runs");
    assert!(
        status.success(),
        "{name}'s build.sh failed: did `. .ci/setup` run?"
    );
    eprintln!("built {name} in {:.1} s", started.elapsed().as_secs_f64());
    wasm
}

/// Clock ticks per second of the CPU times in `/proc/<pid>/stat` (USER_HZ,
/// fixed at 100 by the Linux ABI).
const USER_HZ: f64 = 100.0;

/// User plus system CPU time in a `/proc/…/stat` file (a process's, all its
/// threads, or one thread's).
pub fn stat_cpu(path: &str) -> Duration {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let Some((_, after_name)) = stat.rsplit_once(')') else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are the file's fields 14 and 15: the 12th and 13th here.
    let ticks: u64 = fields
        .get(11..=12)
        .map(|f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    Duration::from_secs_f64(ticks as f64 / USER_HZ)
}
