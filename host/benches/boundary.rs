//! Benchmark: what crossing weir's plugin boundary costs — one masking transform as native Rust and as a weir WASM plugin, and a no-op plugin for the boundary alone.
//!
//! The transform parses a 256-byte JSON row (`weir_json`: keys borrowed,
//! values raw), replaces `email` and `card` with `"***"` and writes it
//! again. As a plugin it is the validator (`{ mask = ["email","card"] }`)
//! called through weir's sandbox exactly as delivery calls it
//! (`PluginInstance::transform`, one reused instance); natively it is the
//! same code in this process, and the two are checked to produce the same
//! bytes. Batch sizes 1, 10, 100 and
//! 1000; each figure is the median of `WEIR_BENCH_SAMPLES` samples of
//! `WEIR_BENCH_ROWS` rows, the variants taking turns so the machine's noise
//! hits them alike, and each ratio the median of per-sample ratios. The
//! plugin's cost includes what the validator does beyond masking: two
//! counter calls to the host per batch. The no-op plugin (`ok` for every
//! row, no host call) gives the boundary's own cost, per call and per row.
//! The naive reference (`plugins/bench/naive-mask`: the same masking behind
//! a `list<list<u8>>` interface, the kind the issue's reference figures were
//! measured with) runs beside them on an engine configured like weir's, so
//! the packed batch is compared with the interface it replaces; and once
//! more compiled without epoch interruption, to show what weir's per-call
//! deadlines cost the guest's code. The validator as built for the
//! previous world version, 0.2.0 (`tests/artifacts/served/0.2.0/`: the
//! same code, its SDK reading `list<u32>` numbers, which the host converts
//! at each call), gives what running a plugin built before an upgrade costs.
//!
//! `cargo bench -p weir --bench boundary`.

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

use std::hint::black_box;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use weir::config::{Config, Overrides};
use weir::delivery::Batch;
use weir::sandbox::{Plugin, PluginInstance, Sandbox};
use weir::telemetry::Metrics;
use weir_json::{Object, RawValue};

use support::{Table, env_count, median, print_figure, time_plugin};

const BENCH: &str = "boundary";
const BATCH_SIZES: [usize; 4] = [1, 10, 100, 1000];
/// Distinct rows the batches are cut from; every batch size divides it.
const DISTINCT_ROWS: usize = 1000;
const DEFAULT_ROWS_PER_SAMPLE: usize = 20_000;
const DEFAULT_SAMPLES: usize = 15;
/// Fresh instances created to time instantiation.
const INSTANTIATIONS: usize = 300;
/// The fields masked, and with what: the validator's settings below.
const MASKED_FIELDS: [&str; 2] = ["email", "card"];
const MASK_WITH: &str = "***";

/// Both plugins, configured as an operator would.
fn plugins_toml() -> String {
    format!(
        r#"
[plugins.mask]
wasm = {validator:?}
world = "transform"
settings = {{ mask = ["email", "card"] }}

[plugins.mask_v0_2_0]
wasm = {validator_v0_2_0:?}
world = "transform"
settings = {{ mask = ["email", "card"] }}

[plugins.noop]
wasm = {passthrough:?}
world = "transform"
"#,
        validator = weir_test_artifacts::VALIDATOR,
        validator_v0_2_0 = validator_v0_2_0().display().to_string(),
        passthrough = weir_test_artifacts::PASSTHROUGH,
    )
}

/// The validator as built for `weir:plugin@0.2.0`, unpacked from the tests'
/// artifacts into a file of the run.
fn validator_v0_2_0() -> &'static Path {
    static UNPACKED: OnceLock<(tempfile::TempDir, std::path::PathBuf)> = OnceLock::new();
    let (_, path) = UNPACKED.get_or_init(|| {
        let packed = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/artifacts/served/0.2.0/validator-rust.wasm.zst");
        let file = std::fs::File::open(&packed)
            .unwrap_or_else(|err| panic!("{}: {err}", packed.display()));
        let bytes = zstd::decode_all(file).expect("a zstd stream");
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("validator-0.2.0.wasm");
        std::fs::write(&path, bytes).expect("write the component");
        (dir, path)
    });
    path
}

/// The ways a batch is transformed.
#[derive(Clone, Copy)]
enum Variant {
    Native,
    Plugin,
    /// The same plugin as built for the previous world version (0.2.0).
    PluginV0_2_0,
    NoOp,
    Naive,
    /// The naive reference without epoch interruption (no deadlines).
    NaiveNoDeadline,
}

/// The naive `list<list<u8>>` reference, on its own engine (epoch
/// interruption and async calls, as weir's), with an empty WASI context.
mod naive {
    wasmtime::component::bindgen!({
        path: "../plugins/bench/naive-mask/wit",
        world: "naive",
        exports: { default: async },
    });

    use wasmtime::component::{Component, Linker, ResourceTable};
    use wasmtime::{Engine, Store};
    use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

    pub struct State {
        wasi: WasiCtx,
        table: ResourceTable,
    }

    impl WasiView for State {
        fn ctx(&mut self) -> WasiCtxView<'_> {
            WasiCtxView {
                ctx: &mut self.wasi,
                table: &mut self.table,
            }
        }
    }

    pub struct Instance {
        store: Store<State>,
        naive: Naive,
    }

    impl Instance {
        /// `deadlines`: compile with epoch interruption, as weir does (a check
        /// at every function entry and loop back-edge), or without.
        pub async fn load(wasm: &str, deadlines: bool) -> Instance {
            let mut config = wasmtime::Config::new();
            config
                .wasm_component_model(true)
                .epoch_interruption(deadlines);
            if std::env::var("WEIR_WASM_PROFILER").is_ok_and(|value| value == "perfmap") {
                config.profiler(wasmtime::ProfilingStrategy::PerfMap);
            }
            let engine = Engine::new(&config).expect("wasm engine");
            let component = Component::from_file(&engine, wasm).expect("the naive plugin compiles");
            let mut linker = Linker::new(&engine);
            wasmtime_wasi::p2::add_to_linker_async(&mut linker).expect("WASI links");
            let state = State {
                wasi: WasiCtx::builder().build(),
                table: ResourceTable::new(),
            };
            let mut store = Store::new(&engine, state);
            if deadlines {
                // The epoch never advances here: the checks run, as in weir, and never fire.
                store.set_epoch_deadline(u64::MAX);
            }
            let naive = Naive::instantiate_async(&mut store, &component, &linker)
                .await
                .expect("the naive plugin instantiates");
            Instance { store, naive }
        }

        pub async fn mask(&mut self, rows: &[Vec<u8>]) -> Vec<Vec<u8>> {
            self.naive
                .call_mask(&mut self.store, rows)
                .await
                .expect("the naive plugin runs")
        }
    }
}

/// Nanoseconds per row of each variant at one batch size.
struct AtBatch {
    batch: usize,
    native: f64,
    plugin: f64,
    noop: f64,
    /// plugin / native, taken sample by sample (neighbours in time see the
    /// same load), then the median.
    ratio: f64,
    /// The naive `list<list<u8>>` reference doing the masking.
    naive: f64,
    /// naive / native, the same way.
    naive_ratio: f64,
    /// The naive reference compiled without epoch interruption, / native:
    /// what weir's per-call deadlines cost the guest's code.
    unbounded_ratio: f64,
    /// The plugin as built for 0.2.0.
    v0_2_0: f64,
    /// v0_2_0 / plugin, sample by sample: what a previous version's build
    /// costs against its rebuild.
    v0_2_0_ratio: f64,
}

fn main() {
    let rows_per_sample =
        env_count("WEIR_BENCH_ROWS", DEFAULT_ROWS_PER_SAMPLE).next_multiple_of(DISTINCT_ROWS);
    let samples = env_count("WEIR_BENCH_SAMPLES", DEFAULT_SAMPLES);
    // One thread, like one delivery worker: every call is awaited in turn.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");

    let config = Config::parse(
        Path::new("boundary.toml"),
        &plugins_toml(),
        &Overrides::default(),
    )
    .unwrap_or_else(|err| panic!("the bench's config is valid: {err}"));
    let sandbox = Sandbox::new(Metrics::default()).expect("wasm engine");
    let load = |name: &str| -> Arc<Plugin> {
        runtime
            .block_on(sandbox.load(&config.plugins[name]))
            .unwrap_or_else(|err| panic!("load plugin `{name}`: {err}"))
    };
    let (mask, mask_v0_2_0, noop) = (load("mask"), load("mask_v0_2_0"), load("noop"));
    let instantiate = |plugin: &Arc<Plugin>| {
        runtime
            .block_on(plugin.instantiate())
            .expect("a fresh instance")
    };
    let mut mask_instance = instantiate(&mask);
    let mut v0_2_0_instance = instantiate(&mask_v0_2_0);
    let mut noop_instance = instantiate(&noop);
    let mut naive_instance =
        runtime.block_on(naive::Instance::load(weir_test_artifacts::NAIVE_MASK, true));
    let mut unbounded_instance = runtime.block_on(naive::Instance::load(
        weir_test_artifacts::NAIVE_MASK,
        false,
    ));

    check_same_work(
        &runtime,
        &mut mask_instance,
        &mut v0_2_0_instance,
        &mut naive_instance,
        &support::plugin_batches(10, 10)[0],
    );
    eprintln!(
        "boundary bench: {rows_per_sample} rows per sample, {samples} samples per figure, batches {BATCH_SIZES:?}"
    );

    let mut results = Vec::new();
    for batch in BATCH_SIZES {
        let batches = support::plugin_batches(DISTINCT_ROWS, batch);
        let naive_batches: Vec<Vec<Vec<u8>>> = batches.iter().map(payloads).collect();
        let calls = rows_per_sample / batch;
        let mut per_row = |variant: Variant| {
            let elapsed = match variant {
                Variant::Native => time_native(&batches, calls),
                Variant::Plugin => time_plugin(&runtime, &mut mask_instance, &batches, calls),
                Variant::PluginV0_2_0 => {
                    time_plugin(&runtime, &mut v0_2_0_instance, &batches, calls)
                }
                Variant::NoOp => time_plugin(&runtime, &mut noop_instance, &batches, calls),
                Variant::Naive => time_naive(&runtime, &mut naive_instance, &naive_batches, calls),
                Variant::NaiveNoDeadline => {
                    time_naive(&runtime, &mut unbounded_instance, &naive_batches, calls)
                }
            };
            elapsed.as_nanos() as f64 / rows_per_sample as f64
        };
        // One unmeasured turn warms caches and the guests' allocators.
        for variant in [
            Variant::Native,
            Variant::Plugin,
            Variant::PluginV0_2_0,
            Variant::NoOp,
            Variant::Naive,
            Variant::NaiveNoDeadline,
        ] {
            per_row(variant);
        }
        let (mut native, mut plugin, mut noop, mut naive, mut unbounded) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut v0_2_0 = Vec::new();
        for _ in 0..samples {
            native.push(per_row(Variant::Native));
            plugin.push(per_row(Variant::Plugin));
            v0_2_0.push(per_row(Variant::PluginV0_2_0));
            noop.push(per_row(Variant::NoOp));
            naive.push(per_row(Variant::Naive));
            unbounded.push(per_row(Variant::NaiveNoDeadline));
        }
        let ratios: Vec<f64> = plugin.iter().zip(&native).map(|(p, n)| p / n).collect();
        let naive_ratios: Vec<f64> = naive.iter().zip(&native).map(|(p, n)| p / n).collect();
        let unbounded_ratios: Vec<f64> =
            unbounded.iter().zip(&native).map(|(p, n)| p / n).collect();
        let v0_2_0_ratios: Vec<f64> = v0_2_0.iter().zip(&plugin).map(|(o, p)| o / p).collect();
        let measured = AtBatch {
            batch,
            native: median(&native),
            plugin: median(&plugin),
            noop: median(&noop),
            ratio: median(&ratios),
            naive: median(&naive),
            naive_ratio: median(&naive_ratios),
            unbounded_ratio: median(&unbounded_ratios),
            v0_2_0: median(&v0_2_0),
            v0_2_0_ratio: median(&v0_2_0_ratios),
        };
        eprintln!(
            "batch {batch}: native {:.0}, plugin {:.0} (0.2.0 build {:.0}), no-op {:.0}, naive {:.0} ns/row",
            measured.native, measured.plugin, measured.v0_2_0, measured.noop, measured.naive
        );
        results.push(measured);
    }

    let started = Instant::now();
    for _ in 0..INSTANTIATIONS {
        drop(instantiate(&noop));
    }
    let fresh_instance_us = started.elapsed().as_secs_f64() * 1e6 / INSTANTIATIONS as f64;

    report(&results, fresh_instance_us, rows_per_sample, samples);
}

/// Fails the bench unless the plugin and the native transform produce the
/// same bytes: the comparison is only fair if they do the same work.
fn check_same_work(
    runtime: &tokio::runtime::Runtime,
    instance: &mut PluginInstance,
    v0_2_0: &mut PluginInstance,
    naive: &mut naive::Instance,
    rows: &Batch,
) {
    let from_plugin = support::masked_by_plugin(runtime, instance, rows);
    assert_eq!(
        support::masked_by_plugin(runtime, v0_2_0, rows),
        from_plugin,
        "the 0.2.0 build and its rebuild mask differently"
    );
    let from_naive = runtime.block_on(naive.mask(&payloads(rows)));
    let native = mask_native(rows);
    assert_eq!(from_plugin.len(), native.payloads.len());
    assert_eq!(from_naive.len(), native.payloads.len());
    for (index, ((plugin, naive), native)) in from_plugin
        .iter()
        .zip(&from_naive)
        .zip(native.payloads())
        .enumerate()
    {
        assert_eq!(
            String::from_utf8_lossy(plugin),
            String::from_utf8_lossy(native),
            "row {index}: plugin and native masking differ"
        );
        assert_eq!(
            String::from_utf8_lossy(naive),
            String::from_utf8_lossy(native),
            "row {index}: the naive reference and native masking differ"
        );
    }
}

/// A batch's payloads as the naive interface takes them: one list each.
fn payloads(rows: &Batch) -> Vec<Vec<u8>> {
    (0..rows.len()).map(|i| rows.payload(i).to_vec()).collect()
}

/// Time to run `calls` batches through the naive reference, one call each.
fn time_naive(
    runtime: &tokio::runtime::Runtime,
    instance: &mut naive::Instance,
    batches: &[Vec<Vec<u8>>],
    calls: usize,
) -> Duration {
    runtime.block_on(async {
        let started = Instant::now();
        for call in 0..calls {
            black_box(instance.mask(&batches[call % batches.len()]).await);
        }
        started.elapsed()
    })
}

/// What the native transform makes of a batch, packed as a plugin packs it:
/// every masked payload in one buffer.
struct Masked {
    data: Vec<u8>,
    payloads: Vec<std::ops::Range<usize>>,
}

impl Masked {
    fn payloads(&self) -> impl Iterator<Item = &[u8]> {
        self.payloads.iter().map(|range| &self.data[range.clone()])
    }
}

/// The validator's masking, natively: the same `weir_json` code, each row
/// parsed (keys borrowed, values raw), the masked fields replaced, and
/// written into one output buffer.
fn mask_native(rows: &Batch) -> Masked {
    static MASK: OnceLock<Box<RawValue>> = OnceLock::new();
    let mask = MASK.get_or_init(|| weir_json::raw(MASK_WITH));
    let mut masked = Masked {
        data: Vec::with_capacity(rows.data_len()),
        payloads: Vec::with_capacity(rows.len()),
    };
    for index in 0..rows.len() {
        let start = masked.data.len();
        let Ok(mut object) = Object::parse(rows.payload(index)) else {
            continue;
        };
        for field in MASKED_FIELDS {
            object.replace(field, mask);
        }
        object.write(&mut masked.data);
        masked.payloads.push(start..masked.data.len());
    }
    masked
}

/// Time to run `calls` batches through the native transform.
fn time_native(batches: &[Batch], calls: usize) -> Duration {
    let started = Instant::now();
    for call in 0..calls {
        black_box(mask_native(black_box(&batches[call % batches.len()])));
    }
    started.elapsed()
}

fn report(results: &[AtBatch], fresh_instance_us: f64, rows_per_sample: usize, samples: usize) {
    for at in results {
        let batch = at.batch;
        print_figure(
            BENCH,
            &format!("native_ns_per_row_batch_{batch}"),
            at.native,
        );
        print_figure(
            BENCH,
            &format!("plugin_ns_per_row_batch_{batch}"),
            at.plugin,
        );
        print_figure(
            BENCH,
            &format!("ratio_plugin_to_native_batch_{batch}"),
            at.ratio,
        );
        print_figure(
            BENCH,
            &format!("plugin_v0_2_0_ns_per_row_batch_{batch}"),
            at.v0_2_0,
        );
        print_figure(
            BENCH,
            &format!("ratio_plugin_v0_2_0_to_plugin_batch_{batch}"),
            at.v0_2_0_ratio,
        );
        print_figure(BENCH, &format!("noop_ns_per_row_batch_{batch}"), at.noop);
        print_figure(BENCH, &format!("naive_ns_per_row_batch_{batch}"), at.naive);
        print_figure(
            BENCH,
            &format!("ratio_naive_to_native_batch_{batch}"),
            at.naive_ratio,
        );
        print_figure(
            BENCH,
            &format!("ratio_naive_without_deadlines_to_native_batch_{batch}"),
            at.unbounded_ratio,
        );
    }
    // A call of n rows costs per_call + n × per_row. The slope comes from the
    // two largest batches (where per-call cost hardly matters), the
    // intercept from the single-row call.
    let call_ns = |at: &AtBatch| at.noop * at.batch as f64;
    let (first, large, largest) = (&results[0], &results[2], &results[3]);
    let boundary_per_row =
        (call_ns(largest) - call_ns(large)) / (largest.batch - large.batch) as f64;
    let boundary_per_call = call_ns(first) - boundary_per_row * first.batch as f64;
    print_figure(BENCH, "noop_ns_per_call", boundary_per_call);
    print_figure(BENCH, "noop_ns_per_row", boundary_per_row);
    print_figure(BENCH, "fresh_instance_us", fresh_instance_us);

    println!();
    println!(
        "boundary: 256-byte JSON rows, mask two fields; ns/row, median of {samples} samples of {rows_per_sample} rows"
    );
    let mut table = Table::new(&[
        "batch",
        "native",
        "plugin",
        "x native",
        "0.2.0 build x plugin",
        "no-op plugin",
        "plugin - no-op",
        "naive list<list<u8>>",
        "naive x native",
        "naive, no deadlines, x native",
    ]);
    for at in results {
        table.push(vec![
            at.batch.to_string(),
            format!("{:.0}", at.native),
            format!("{:.0}", at.plugin),
            format!("{:.2}", at.ratio),
            format!("{:.2}", at.v0_2_0_ratio),
            format!("{:.0}", at.noop),
            format!("{:.0}", at.plugin - at.noop),
            format!("{:.0}", at.naive),
            format!("{:.2}", at.naive_ratio),
            format!("{:.2}", at.unbounded_ratio),
        ]);
    }
    table.print();
    println!(
        "boundary alone (no-op plugin): {boundary_per_call:.0} ns per call + {boundary_per_row:.0} ns per row; fresh instance (with init): {fresh_instance_us:.1} µs"
    );
}
