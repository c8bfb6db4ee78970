//! Benchmark: weir's plugin boundary against a peer plugin runtime, Extism
//! (1.30, the newest whose wasmtime builds on Rust 1.95; its Rust host SDK), doing the same transform in the same run.
//!
//! The transform is the boundary bench's: parse a 256-byte JSON row, mask
//! `email` and `card`, serialize. In weir it is the validator plugin called
//! as delivery calls it (`PluginInstance::transform` over a batch of rows);
//! in Extism it is `plugins/bench/extism-mask` (bytes in, bytes out), called
//! once per row (Extism's usual way) and once per batch of NDJSON rows (its
//! best). Both are checked to produce the same bytes first. Inputs are built
//! before the clock starts, for both. Each figure is the median of
//! `WEIR_BENCH_SAMPLES` samples of `WEIR_BENCH_ROWS` rows, the variants
//! taking turns so the machine's noise hits them alike.
//!
//! `cargo bench -p weir-peer-bench` (a crate of its own, outside the
//! workspace's default members, so weir's tests never build Extism).

// The helpers weir's other benches share, compiled in from there.
#[allow(dead_code)] // each bench uses part of the helpers
#[path = "../support/mod.rs"]
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use weir::config::{Config, Overrides};
use weir::delivery::Batch;
use weir::sandbox::{PluginInstance, Sandbox};
use weir::telemetry::Metrics;

use support::{Table, env_count, median, print_figure};

// `EXTISM_MASK`: the Extism guest, built by this crate's `build.rs`.
include!(concat!(env!("OUT_DIR"), "/peer_plugins.rs"));

const BENCH: &str = "peer";
const BATCH_SIZES: [usize; 4] = [1, 10, 100, 1000];
const DISTINCT_ROWS: usize = 1000;
const DEFAULT_ROWS_PER_SAMPLE: usize = 10_000;
const DEFAULT_SAMPLES: usize = 9;
/// The targets of issue #9 against Extism.
const TARGET_VS_BATCHED: f64 = 1.7;
const TARGET_VS_PER_ROW: f64 = 4.0;

fn main() {
    let rows_per_sample =
        env_count("WEIR_BENCH_ROWS", DEFAULT_ROWS_PER_SAMPLE).next_multiple_of(DISTINCT_ROWS);
    let samples = env_count("WEIR_BENCH_SAMPLES", DEFAULT_SAMPLES);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");

    let toml = format!(
        "[plugins.mask]\nwasm = {:?}\nworld = \"transform\"\nsettings = {{ mask = [\"email\", \"card\"] }}\n",
        weir_test_artifacts::VALIDATOR
    );
    let config = Config::parse(Path::new("peer.toml"), &toml, &Overrides::default())
        .unwrap_or_else(|err| panic!("the bench's config is valid: {err}"));
    let sandbox = Sandbox::new(Metrics::default()).expect("wasm engine");
    let mask = runtime
        .block_on(sandbox.load(&config.plugins["mask"]))
        .unwrap_or_else(|err| panic!("load the validator: {err}"));
    let mut weir = runtime
        .block_on(mask.instantiate())
        .expect("a weir instance");
    let wasm = std::fs::read(EXTISM_MASK).expect("the Extism plugin");
    let mut extism =
        extism::Plugin::new(wasm, [], false).unwrap_or_else(|err| panic!("Extism loads: {err}"));

    check_same_work(
        &runtime,
        &mut weir,
        &mut extism,
        &support::plugin_batches(10, 10)[0],
    );

    let mut table = Table::new(&["batch", "weir ns/row", "Extism ns/row", "Extism / weir"]);
    let mut weir_at_100 = None;
    let mut extism_best = f64::MAX;
    for batch in BATCH_SIZES {
        let batches = support::plugin_batches(DISTINCT_ROWS, batch);
        let ndjson: Vec<Vec<u8>> = batches.iter().map(ndjson_of).collect();
        let mut time_weir = || {
            per_row(rows_per_sample, batch, |index| {
                let outcomes = runtime
                    .block_on(weir.transform(batches[index % batches.len()].packed()))
                    .expect("the validator runs");
                std::hint::black_box(outcomes);
            })
        };
        let mut time_extism = |ndjson: &[Vec<u8>]| {
            per_row(rows_per_sample, batch, |index| {
                let out: &[u8] = extism
                    .call("mask", ndjson[index % ndjson.len()].as_slice())
                    .expect("the Extism plugin runs");
                std::hint::black_box(out);
            })
        };
        time_weir();
        time_extism(&ndjson);
        let (mut weir_ns, mut extism_ns, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..samples {
            let (w, e) = (time_weir(), time_extism(&ndjson));
            weir_ns.push(w);
            extism_ns.push(e);
            ratios.push(e / w);
        }
        let (w, e, ratio) = (median(&weir_ns), median(&extism_ns), median(&ratios));
        print_figure(BENCH, &format!("weir_ns_per_row_batch_{batch}"), w);
        print_figure(BENCH, &format!("extism_ns_per_row_batch_{batch}"), e);
        print_figure(BENCH, &format!("ratio_extism_to_weir_batch_{batch}"), ratio);
        table.push(vec![
            batch.to_string(),
            format!("{w:.0}"),
            format!("{e:.0}"),
            format!("{ratio:.2}"),
        ]);
        if batch == 100 {
            weir_at_100 = Some(w);
        }
        if batch > 1 {
            extism_best = extism_best.min(e);
        }
    }
    // Extism's usual way: one call per row, against weir at batch 100.
    let singles: Vec<Vec<u8>> = support::plugin_batches(DISTINCT_ROWS, 1)
        .iter()
        .map(ndjson_of)
        .collect();
    let per_call: Vec<f64> = (0..samples)
        .map(|_| {
            per_row(rows_per_sample, 1, |index| {
                let out: &[u8] = extism
                    .call("mask", singles[index % singles.len()].as_slice())
                    .expect("the Extism plugin runs");
                std::hint::black_box(out);
            })
        })
        .collect();
    let per_call = median(&per_call);
    let weir_at_100 = weir_at_100.expect("batch 100 was measured");
    print_figure(BENCH, "extism_ns_per_row_one_call_per_row", per_call);
    print_figure(
        BENCH,
        "ratio_extism_per_row_calls_to_weir_batch_100",
        per_call / weir_at_100,
    );
    print_figure(
        BENCH,
        "ratio_extism_best_batched_to_weir_batch_100",
        extism_best / weir_at_100,
    );

    println!();
    println!(
        "peer: the masking transform, {rows_per_sample} rows per sample, median of {samples} samples"
    );
    table.print();
    println!(
        "Extism one call per row: {per_call:.0} ns/row = {:.2} × weir at batch 100 (target ≥ {TARGET_VS_PER_ROW}); Extism's best batched: {extism_best:.0} ns/row = {:.2} × (target ≥ {TARGET_VS_BATCHED})",
        per_call / weir_at_100,
        extism_best / weir_at_100
    );
}

/// Nanoseconds per row of `rows` rows run `batch` at a time by `call`
/// (given the batch's index).
fn per_row(rows: usize, batch: usize, mut call: impl FnMut(usize)) -> f64 {
    let calls = rows / batch;
    let started = Instant::now();
    for index in 0..calls {
        call(index);
    }
    let elapsed: Duration = started.elapsed();
    elapsed.as_nanos() as f64 / (calls * batch) as f64
}

fn ndjson_of(rows: &Batch) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.len() * (support::ROW_BYTES + 1));
    for index in 0..rows.len() {
        out.extend_from_slice(rows.payload(index));
        out.push(b'\n');
    }
    out
}

/// Fails the bench unless both runtimes produce the same bytes for a batch.
fn check_same_work(
    runtime: &tokio::runtime::Runtime,
    weir: &mut PluginInstance,
    extism: &mut extism::Plugin,
    rows: &Batch,
) {
    let mut from_weir = Vec::new();
    for payload in support::masked_by_plugin(runtime, weir, rows) {
        from_weir.extend_from_slice(&payload);
        from_weir.push(b'\n');
    }
    let from_extism: &[u8] = extism
        .call("mask", ndjson_of(rows).as_slice())
        .expect("the Extism plugin runs");
    assert_eq!(
        String::from_utf8_lossy(from_extism),
        String::from_utf8_lossy(&from_weir),
        "Extism and weir masking differ"
    );
}
