//! Benchmark: how long a rollout takes and what a shadow costs.
//!
//! - **Push to serving**: a fleet of three hosts (in this process, each
//!   with its own data dir and compiled cache, as three machines would
//!   have) on one nats-server; `weir plugin push pass FILE --wait` timed
//!   from its start until it prints that every live member runs the
//!   version: first a Python transform (`weir plugin new --lang python`,
//!   about 20 MB) no host has compiled, then the small Rust pass-through
//!   back (compiled by every host at start), then the Python one again
//!   (now in every cache, and in the CLI's: it checks without compiling).
//! - **A shadow's cost**: one host on weir's default topology draining
//!   `WEIR_BENCH_ROWS` rows (default 100,000) already in its partition,
//!   pass-through into a null sink, without and then with a shadow of
//!   another transform running on copies of every batch (same run, same
//!   rows): the ratio of the two drain rates.
//!
//! `. .ci/setup`, then `cargo bench -p weir --bench rollout`.

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use weir::config::{Config, Overrides};
use weir::host::RunningHost;
use weir::topology::{Manifest, Names};

use support::{
    DEFAULT_LAYOUT, TENANT, Table, authored_plugin, drain_rate, env_count, print_figure,
    publish_pipelined, start_nats, subjects, tables_covering, wait_claimed,
};

const BENCH: &str = "rollout";
const FLEET: usize = 3;
const DEFAULT_ROWS: usize = 100_000;
/// The longest a push may take before the bench fails.
const PUSH_WAIT_SECS: &str = "300";
const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);
const STATUS_POLL: Duration = Duration::from_millis(20);

fn main() {
    support::install_tls_provider();
    let rows = env_count("WEIR_BENCH_ROWS", DEFAULT_ROWS);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(run(rows));
}

async fn run(rows: usize) {
    let python = authored_plugin("python");
    let dir = tempfile::tempdir().expect("a temp dir");
    // A server per part: the fleet's releases are not the shadow host's.
    let fleet_server = start_nats(&dir.path().join("nats-fleet")).await;
    let pushes = push_to_serving(fleet_server.url(), dir.path(), &python).await;
    drop(fleet_server);
    let mut table = Table::new(&["push", "component", "compiled before", "to serving (s)"]);
    for (what, size, cached, seconds) in &pushes {
        table.push(vec![
            what.to_string(),
            format!("{:.1} MB", *size as f64 / 1e6),
            cached.to_string(),
            format!("{seconds:.2}"),
        ]);
    }

    let server = start_nats(&dir.path().join("nats-shadow")).await;
    let js = async_nats::jetstream::new(
        async_nats::connect(server.url())
            .await
            .expect("connect to the bench's nats-server"),
    );
    let (without, with) = shadow_cost(&js, server.url(), dir.path(), rows).await;
    print_figure(BENCH, "push_uncached_python_seconds", pushes[0].3);
    print_figure(BENCH, "push_cached_rust_seconds", pushes[1].3);
    print_figure(BENCH, "push_cached_python_seconds", pushes[2].3);
    print_figure(BENCH, "rows_per_sec_without_shadow", without);
    print_figure(BENCH, "rows_per_sec_with_shadow", with);
    print_figure(BENCH, "ratio_with_shadow_to_without", with / without);
    println!("\nPush to serving on a fleet of {FLEET} hosts:");
    table.print();
    println!(
        "\nA shadow's cost, one host, {rows} rows: {without:.0} rows/s without, {with:.0} with ({:.2}×)",
        with / without
    );
}

/// A host's config: pass-through into a null sink, with its own cache.
fn host_config(nats_url: &str, dir: &Path, id: &str, tables: &[String]) -> (PathBuf, Config) {
    let data = dir.join(id);
    let text = format!(
        "compile_cache_dir = {:?}\n{}\n[coordination]\nhost_id = \"{id}\"\n",
        data.join("compiled").display().to_string(),
        support::pass_through_config(nats_url, &data, DEFAULT_LAYOUT, tables),
    );
    std::fs::create_dir_all(&data).expect("the host's data dir");
    let path = data.join("weir.toml");
    std::fs::write(&path, &text).expect("write the host's config");
    let config = Config::parse(&path, &text, &Overrides::default())
        .unwrap_or_else(|err| panic!("the bench's config is valid: {err}"));
    (path, config)
}

/// `weir plugin push pass FILE --wait …` with `config`; its wall time.
fn push(config: &Path, wasm: &str, extra: &[&str]) -> f64 {
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["plugin", "push", "--config"])
        .arg(config)
        .args(["pass", wasm, "--wait", PUSH_WAIT_SECS])
        .args(extra)
        .output()
        .expect("weir runs");
    let seconds = started.elapsed().as_secs_f64();
    assert!(
        output.status.success(),
        "push of {wasm} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!(
        "rollout bench: {}",
        String::from_utf8_lossy(&output.stdout).trim()
    );
    seconds
}

/// The three pushes on a fleet of `FLEET`: (what, bytes, compiled before,
/// seconds).
async fn push_to_serving(
    nats_url: &str,
    dir: &Path,
    python: &Path,
) -> Vec<(&'static str, u64, bool, f64)> {
    let router = Names::new("weir", DEFAULT_LAYOUT.0, DEFAULT_LAYOUT.1);
    let tables = tables_covering(&router);
    let mut hosts = Vec::new();
    let mut first_config = None;
    for index in 0..FLEET {
        let (path, config) = host_config(
            nats_url,
            &dir.join("fleet"),
            &format!("host-{index}"),
            &tables,
        );
        first_config.get_or_insert(path);
        hosts.push(
            RunningHost::start(config)
                .await
                .expect("a fleet host starts"),
        );
    }
    let units = router.units().len();
    for host in &hosts {
        while host.status().fleet().live_members().len() < FLEET {
            tokio::time::sleep(STATUS_POLL).await;
        }
    }
    wait_claimed(&hosts[0], units).await;
    let config = first_config.expect("a fleet of hosts");
    let size = |path: &Path| path.metadata().map_or(0, |m| m.len());
    let python_path = python.to_string_lossy().into_owned();
    let rust = weir_test_artifacts::PASSTHROUGH;
    let pushes = vec![
        (
            "Python transform, new",
            size(python),
            false,
            push(&config, &python_path, &[]),
        ),
        (
            "Rust pass-through back",
            size(Path::new(rust)),
            true,
            push(&config, rust, &[]),
        ),
        (
            "Python transform again",
            size(python),
            true,
            push(&config, &python_path, &[]),
        ),
    ];
    for host in hosts {
        host.shutdown().await;
    }
    pushes
}

/// Rows/s of one host draining `rows` rows, without and then with a
/// shadow of another transform beside its pass-through.
async fn shadow_cost(
    js: &async_nats::jetstream::Context,
    nats_url: &str,
    dir: &Path,
    rows: usize,
) -> (f64, f64) {
    let router = Names::new("weir", DEFAULT_LAYOUT.0, DEFAULT_LAYOUT.1);
    let tables = tables_covering(&router);
    let payloads: Vec<Bytes> = (0..rows as u64)
        .map(|id| Bytes::from(support::row(id)))
        .collect();
    let subjects = subjects(&router, &tables, |table| router.route(TENANT, table));
    let dir = dir.join("shadow");
    let mut rates = Vec::new();
    for round in ["without", "with"] {
        let (path, config) = host_config(nats_url, &dir, &format!("shadow-{round}"), &tables);
        Manifest::new(&router, &config.stream, &config.delivery, None)
            .create(js)
            .await
            .expect("create weir's topology");
        if round == "with" {
            // A push needs a live member: one runs on the empty stream
            // meanwhile; the next host learns the shadow before it claims.
            let host = RunningHost::start(config.clone())
                .await
                .expect("the host starts");
            wait_claimed(&host, router.units().len()).await;
            push(&path, weir_test_artifacts::VALIDATOR, &["--shadow"]);
            host.shutdown().await;
        }
        publish_pipelined(js, &subjects, &payloads).await;
        let before = Instant::now();
        let host = RunningHost::start(config).await.expect("the host starts");
        let (rate, counts) = drain_rate(&host, rows as u64, STATUS_POLL, DRAIN_TIMEOUT).await;
        eprintln!(
            "rollout bench: {round} a shadow: {rate:.0} rows/s ({} delivered) after {:?}",
            counts.delivered,
            before.elapsed()
        );
        rates.push(rate);
        host.shutdown().await;
        let streams = (0..router.partitions()).map(|p| router.partition_stream(p));
        for stream in streams.chain([router.dead_letter_stream()]) {
            js.delete_stream(&stream)
                .await
                .expect("delete weir's streams");
        }
    }
    (rates[0], rates[1])
}
