//! Benchmark: the window plugin (`plugins/window`) keeping its tallies in
//! durable state (`grants.state`: the `<prefix>_state` KV bucket, written
//! by compare-and-set with each batch before its acks) against the same
//! plugin keeping them in instance memory (`keep = "memory"`: lost on a
//! restart and counted again on a redelivery, as a stream processor
//! without durable state keeps them), in one run on one nats-server.
//!
//! Each scenario publishes the same rows to one unit before a host starts
//! in-process, and times delivery from the first row acked to the last,
//! through the window into a null sink. Rows carry `WEIR_BENCH_KEYS`
//! keys (a list, default "100": e.g. "100,5000"; figures of a count other
//! than 100 end in `_<keys>_keys`) and close a window every 10,000 rows, so
//! summaries flow too. Scenarios alternate for `WEIR_BENCH_ROUNDS` (default 3)
//! rounds; medians are reported. `WEIR_BENCH_ROWS` (default 100000).
//!
//! `cargo bench -p weir --bench state`.

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

use std::path::Path;
use std::time::Duration;

use async_nats::Subject;
use async_nats::jetstream;
use bytes::Bytes;
use weir::config::{Config, Overrides};
use weir::host::RunningHost;
use weir::nats::EmbeddedNats;
use weir::nats::kv::{KvError, NatsKv};
use weir::state::StateStore;
use weir::topology::{Manifest, Names};

use support::{
    API_KEY, TENANT, Table, drain_rate, env_count, median, print_figure, publish_pipelined,
};

const BENCH: &str = "state";
const DEFAULT_ROWS: usize = 100_000;
const DEFAULT_ROUNDS: usize = 3;
const DEFAULT_KEYS: usize = 100;
/// Rows per window: `ts` grows by 1 ms every 10 rows, windows are 1 s.
const ROWS_PER_MS: usize = 10;
const TABLE: &str = "events";
/// A scenario that takes longer than this is broken, not slow.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(300);
const STATUS_POLL: Duration = Duration::from_millis(10);

#[derive(Clone, Copy, PartialEq)]
enum Keep {
    State,
    Memory,
}

impl Keep {
    fn name(self) -> &'static str {
        match self {
            Keep::State => "state",
            Keep::Memory => "memory",
        }
    }

    /// The plugin table's lines beyond `wasm` and `world`.
    fn plugin_lines(self) -> &'static str {
        match self {
            Keep::State => "settings = { width_ms = 1000 }\ngrants.state = {}\n",
            Keep::Memory => "settings = { width_ms = 1000, keep = \"memory\" }\n",
        }
    }
}

fn config_text(nats_url: &str, data_dir: &Path, keep: Keep) -> String {
    format!(
        r#"
listen = "127.0.0.1:0"
data_dir = {data_dir:?}

[nats]
url = "{nats_url}"

[stream]
create = true
partitions = 1
shards = 1

[[tenants]]
name = "{TENANT}"
api_keys = ["{API_KEY}"]

[plugins.window]
wasm = {window:?}
world = "transform"
{plugin}
[plugins.sink]
wasm = {sink:?}
world = "sink"

[[pipelines]]
tables = ["{TABLE}"]
transforms = ["window"]
sink = "sink"
"#,
        data_dir = data_dir.display().to_string(),
        window = weir_test_artifacts::WINDOW,
        sink = weir_test_artifacts::NULL_SINK,
        plugin = keep.plugin_lines(),
    )
}

/// Rows of one key each (`keys` of them, in turn) and a time that closes
/// a window every `1000 × ROWS_PER_MS` rows.
fn payloads(rows: usize, keys: usize) -> Vec<Bytes> {
    (0..rows)
        .map(|i| {
            let ts = i / ROWS_PER_MS;
            Bytes::from(format!(
                "{{\"key\":\"k{}\",\"value\":{},\"ts\":{ts},\"id\":{i}}}",
                i % keys,
                i % 7
            ))
        })
        .collect()
}

/// Rows per second through the window kept in `keep`: published first,
/// then a host started, timed from its first delivery to its last.
async fn measure(
    js: &jetstream::Context,
    server: &EmbeddedNats,
    dir: &Path,
    keep: Keep,
    scenario: usize,
    payloads: &[Bytes],
) -> f64 {
    let name = format!("{}-{scenario}", keep.name());
    let text = config_text(server.url(), &dir.join(format!("data-{name}")), keep);
    let config = Config::parse(
        &dir.join(format!("{name}.toml")),
        &text,
        &Overrides::default(),
    )
    .unwrap_or_else(|err| panic!("the bench's config is valid: {err}"));
    let router = Names::new("weir", 1, 1);
    Manifest::new(&router, &config.stream, &config.delivery, None)
        .create(js)
        .await
        .expect("create weir's topology");
    // Every round starts from no state, as the memory runs do: the rows'
    // times start again at 0, which a kept window would call late.
    match NatsKv::open(&js.client(), &router.state_bucket()).await {
        Ok(kv) => {
            StateStore::new(kv)
                .purge_tenant(TENANT)
                .await
                .expect("purge the last round's state");
        }
        Err(KvError::BucketNotFound { .. }) => {}
        Err(err) => panic!("cannot open the state bucket: {err}"),
    }
    let unit = router.route(TENANT, TABLE);
    let subjects = [Subject::from(router.subject(unit, TENANT, TABLE))];
    publish_pipelined(js, &subjects, payloads).await;

    let host = RunningHost::start(config).await.expect("weir host starts");
    let expected = payloads.len() as u64;
    let (rate, rows) = drain_rate(&host, expected, STATUS_POLL, SCENARIO_TIMEOUT).await;
    assert_eq!(
        (rows.dead_lettered, rows.retried),
        (0, 0),
        "every row is counted once, none late or refused"
    );
    host.shutdown().await;
    rate
}

#[tokio::main]
async fn main() {
    let rows = env_count("WEIR_BENCH_ROWS", DEFAULT_ROWS);
    let rounds = env_count("WEIR_BENCH_ROUNDS", DEFAULT_ROUNDS);
    let key_counts: Vec<usize> = std::env::var("WEIR_BENCH_KEYS")
        .unwrap_or_else(|_| DEFAULT_KEYS.to_string())
        .split(',')
        .map(|keys| keys.trim().parse().expect("WEIR_BENCH_KEYS: numbers"))
        .collect();
    let dir = tempfile::tempdir().expect("a temp dir");
    let server = support::start_nats(&dir.path().join("nats")).await;
    let client = async_nats::connect(server.url())
        .await
        .expect("connect to the bench's nats-server");
    let js = jetstream::new(client);

    let mut table = Table::new(&["keys", "window tallies kept in", "rows/s", "vs memory"]);
    let mut scenario = 0;
    for keys in key_counts {
        let payloads = payloads(rows, keys);
        let (mut durable, mut memory) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            // Each measurement's host and stream are new: numbered apart.
            durable.push(measure(&js, &server, dir.path(), Keep::State, scenario, &payloads).await);
            memory.push(measure(&js, &server, dir.path(), Keep::Memory, scenario, &payloads).await);
            scenario += 1;
            eprintln!(
                "{keys} keys, round {round}: state {:.0} rows/s, memory {:.0} rows/s",
                durable[round], memory[round]
            );
        }
        let (durable, memory) = (median(&durable), median(&memory));
        // The default's figures keep their names; other key counts say theirs.
        let suffix = match keys {
            DEFAULT_KEYS => String::new(),
            keys => format!("_{keys}_keys"),
        };
        print_figure(
            BENCH,
            &format!("window_state_rows_per_sec{suffix}"),
            durable,
        );
        print_figure(
            BENCH,
            &format!("window_memory_rows_per_sec{suffix}"),
            memory,
        );
        print_figure(
            BENCH,
            &format!("ratio_state_to_memory{suffix}"),
            durable / memory,
        );
        table.push(vec![
            keys.to_string(),
            "grants.state (durable, exact across crashes)".into(),
            format!("{durable:.0}"),
            format!("{:.2}x", durable / memory),
        ]);
        table.push(vec![
            keys.to_string(),
            "instance memory (lost on restart)".into(),
            format!("{memory:.0}"),
            "1.00x".into(),
        ]);
    }

    println!();
    println!(
        "{rows} rows, a window closed every {} rows, one unit; median of {rounds} rounds",
        1000 * ROWS_PER_MS
    );
    table.print();
}
