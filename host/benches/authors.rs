//! Benchmark: what the same transform costs per row written in Rust, Python
//! and JavaScript with weir's SDKs.
//!
//! Each is the project `weir plugin new enrich --lang LANG` writes (parse a
//! row as JSON, dead-letter it without `id`, drop `kind == "noise"`, emit it
//! with a field added), built with its own `build.sh` into
//! `target/authors/bench/` (again only when the `weir` binary is newer than
//! the `.wasm`), loaded through weir's sandbox and called as delivery calls
//! it (`PluginInstance::transform` on a warm instance, replaced once
//! `worn_out` as `weir run` replaces it, and after a failed call) on the
//! benches' 256-byte rows. Each figure is the median of
//! `WEIR_BENCH_SAMPLES` samples of `WEIR_BENCH_ROWS` rows, the languages
//! taking turns. Also printed: each `.wasm`'s size and how long the sandbox
//! took to load (compile) it.
//!
//! Then each language's memory: `WEIR_BENCH_MEMORY_CALLS` calls (10,000) at
//! batch 100 on one instance, its linear memory read at checkpoints. There
//! it is recycled only by growth (`recycle_after_growth`, default 16 MiB),
//! not after 1,000 batches, so a flat line is one instance over every
//! call; a recycle is counted and the line goes on with the fresh instance.
//!
//! Needs componentize-py and componentize-js: `. .ci/setup`, then
//! `cargo bench -p weir --bench authors`.

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir::config::{Config, Overrides};
use weir::delivery::Batch;
use weir::sandbox::{Plugin, PluginInstance, Sandbox};
use weir::telemetry::Metrics;

use support::{Table, authored_plugin, env_count, median, print_figure};

const BENCH: &str = "authors";
const LANGS: [&str; 3] = ["rust", "python", "js"];
const BATCH_SIZES: [usize; 2] = [10, 100];
const DEFAULT_ROWS_PER_SAMPLE: usize = 2_000;
const DEFAULT_SAMPLES: usize = 7;
const DEFAULT_MEMORY_CALLS: usize = 10_000;
const MEMORY_BATCH: usize = 100;
/// The memory run's `recycle_after_batches`: never reached, growth decides.
const MEMORY_RUN_RECYCLE_AFTER_BATCHES: u64 = 1 << 40;
const MIB: f64 = 1024.0 * 1024.0;

/// A plugin's warm instance as `weir run`'s pipeline keeps it: replaced
/// once `worn_out`, dropped after a failed call.
struct Warm {
    plugin: Arc<Plugin>,
    instance: Option<PluginInstance>,
    /// Instances made after the first.
    recycled: usize,
    failures: usize,
}

impl Warm {
    fn new(plugin: Arc<Plugin>) -> Warm {
        Warm {
            plugin,
            instance: None,
            recycled: 0,
            failures: 0,
        }
    }

    /// One call on the warm instance, a fresh one first if there is none
    /// or it is worn out. A failure is counted and reported, not a panic:
    /// the instance is dropped and the next call gets a fresh one.
    async fn call(&mut self, batch: &Batch) {
        if self.instance.as_ref().is_some_and(PluginInstance::worn_out) {
            self.instance = None;
            self.recycled += 1;
        }
        let instance = match &mut self.instance {
            Some(instance) => instance,
            None => match self.plugin.instantiate().await {
                Ok(fresh) => self.instance.insert(fresh),
                Err(err) => return self.failed(&err.to_string()),
            },
        };
        match instance.transform(batch.packed()).await {
            Ok(transformed) => {
                std::hint::black_box(transformed);
            }
            Err(err) => {
                self.instance = None;
                self.failed(&err.to_string());
            }
        }
    }

    fn failed(&mut self, error: &str) {
        self.failures += 1;
        if self.failures <= 3 {
            eprintln!(
                "authors bench: plugin `{}` failed: {error}",
                self.plugin.name()
            );
        }
    }

    /// The warm instance's linear memory, MiB (0 without one).
    fn memory_mib(&self) -> f64 {
        self.instance
            .as_ref()
            .map_or(0.0, |instance| instance.memory_bytes() as f64 / MIB)
    }

    /// `calls` calls cycling through `batches`, timed.
    fn time(
        &mut self,
        runtime: &tokio::runtime::Runtime,
        batches: &[Batch],
        calls: usize,
    ) -> Duration {
        runtime.block_on(async {
            let started = Instant::now();
            for call in 0..calls {
                self.call(&batches[call % batches.len()]).await;
            }
            started.elapsed()
        })
    }
}

fn main() {
    let rows_per_sample = env_count("WEIR_BENCH_ROWS", DEFAULT_ROWS_PER_SAMPLE)
        .next_multiple_of(BATCH_SIZES[BATCH_SIZES.len() - 1]);
    let samples = env_count("WEIR_BENCH_SAMPLES", DEFAULT_SAMPLES);
    let memory_calls = env_count("WEIR_BENCH_MEMORY_CALLS", DEFAULT_MEMORY_CALLS);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");

    let wasms: Vec<PathBuf> = LANGS.iter().map(|lang| authored_plugin(lang)).collect();
    let toml: String = LANGS
        .iter()
        .zip(&wasms)
        .map(|(lang, wasm)| format!("[plugins.{lang}]\nwasm = {wasm:?}\nworld = \"transform\"\n"))
        .collect();
    let config = Config::parse(Path::new("authors.toml"), &toml, &Overrides::default())
        .unwrap_or_else(|err| panic!("the bench's config is valid: {err}"));
    // A cache of its own, emptied first: the memory run loads each plugin
    // again (another config) without compiling it twice, and `load` below
    // is always a compile.
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/authors/compiled");
    if cache.exists() {
        std::fs::remove_dir_all(&cache).expect("empty the bench's compile cache");
    }
    let sandbox = Sandbox::new(Metrics::default())
        .expect("wasm engine")
        .with_cache(cache, 1 << 30);
    let mut warm = Vec::new();
    let mut table = Table::new(&[
        "language",
        ".wasm",
        "load",
        "µs/row, batch 10",
        "µs/row, batch 100",
        "× rust, batch 10",
        "× rust, batch 100",
    ]);
    let mut cells = Vec::new();
    for (lang, wasm) in LANGS.iter().zip(&wasms) {
        let started = Instant::now();
        let plugin = runtime
            .block_on(sandbox.load(&config.plugins[*lang]))
            .unwrap_or_else(|err| panic!("load plugin `{lang}`: {err}"));
        let load_s = started.elapsed().as_secs_f64();
        let size_mb = std::fs::metadata(wasm).map_or(0, |m| m.len()) as f64 / 1e6;
        print_figure(BENCH, &format!("{lang}_wasm_mb"), size_mb);
        print_figure(BENCH, &format!("{lang}_load_s"), load_s);
        cells.push(vec![
            lang.to_string(),
            format!("{size_mb:.1} MB"),
            format!("{load_s:.1} s"),
        ]);
        warm.push(Warm::new(plugin));
    }
    eprintln!("authors bench: {rows_per_sample} rows per sample, {samples} samples per figure");
    let mut ratios: Vec<Vec<String>> = vec![Vec::new(); LANGS.len()];
    for batch in BATCH_SIZES {
        let batches = support::plugin_batches(BATCH_SIZES[BATCH_SIZES.len() - 1], batch);
        let calls = rows_per_sample / batch;
        let mut per_row: Vec<Vec<f64>> = vec![Vec::new(); LANGS.len()];
        // One unmeasured turn warms each guest, then the languages take turns.
        for turn in 0..=samples {
            for (index, plugin) in warm.iter_mut().enumerate() {
                let elapsed = plugin.time(&runtime, &batches, calls);
                if turn > 0 {
                    per_row[index].push(elapsed.as_nanos() as f64 / rows_per_sample as f64);
                }
            }
        }
        let rust_ns = median(&per_row[0]);
        for (index, lang) in LANGS.iter().enumerate() {
            let ns = median(&per_row[index]);
            print_figure(BENCH, &format!("{lang}_ns_per_row_batch_{batch}"), ns);
            print_figure(BENCH, &format!("{lang}_x_rust_batch_{batch}"), ns / rust_ns);
            cells[index].push(format!("{:.1}", ns / 1000.0));
            ratios[index].push(format!("{:.1} ×", ns / rust_ns));
        }
    }
    for (mut row, ratio) in cells.into_iter().zip(ratios) {
        row.extend(ratio);
        table.push(row);
    }
    table.print();
    memory(&runtime, &sandbox, &config, &warm, memory_calls);
    for plugin in &warm {
        if plugin.failures > 0 {
            eprintln!(
                "authors bench: plugin `{}` failed {} calls: its figures include them",
                plugin.plugin.name(),
                plugin.failures
            );
        }
    }
}

/// Each language's instance over `calls` calls at batch 100, recycled by
/// growth only: its linear memory at checkpoints.
fn memory(
    runtime: &tokio::runtime::Runtime,
    sandbox: &Sandbox,
    config: &Config,
    timed: &[Warm],
    calls: usize,
) {
    let checkpoints: Vec<usize> = [1, 10, 100, 1_000, 2_000, 5_000, 10_000]
        .into_iter()
        .filter(|&at| at < calls)
        .chain([calls])
        .collect();
    let mut header = vec!["language".to_string()];
    header.extend(checkpoints.iter().map(|at| format!("MiB at {at}")));
    header.extend(["recycled".to_string(), "failed".to_string()]);
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut table = Table::new(&header);
    let batches = support::plugin_batches(MEMORY_BATCH, MEMORY_BATCH);
    eprintln!("authors bench: memory over {calls} calls at batch {MEMORY_BATCH}");
    for (lang, timed) in LANGS.iter().zip(timed) {
        let mut plugin_config = config.plugins[*lang].clone();
        plugin_config.recycle_after_batches = MEMORY_RUN_RECYCLE_AFTER_BATCHES;
        let plugin = runtime
            .block_on(sandbox.load(&plugin_config))
            .unwrap_or_else(|err| panic!("load plugin `{lang}` again: {err}"));
        let mut warm = Warm::new(plugin);
        let mut row = vec![lang.to_string()];
        let mut done = 0;
        for &at in &checkpoints {
            warm.time(runtime, &batches, at - done);
            done = at;
            let mib = warm.memory_mib();
            print_figure(BENCH, &format!("{lang}_memory_mib_after_{at}_calls"), mib);
            row.push(format!("{mib:.1}"));
        }
        print_figure(
            BENCH,
            &format!("{lang}_memory_recycled"),
            warm.recycled as f64,
        );
        print_figure(
            BENCH,
            &format!("{lang}_memory_failures"),
            warm.failures as f64,
        );
        row.extend([warm.recycled.to_string(), warm.failures.to_string()]);
        table.push(row);
        // The timed run's instance too, recycled as `weir run` recycles.
        eprintln!(
            "authors bench: {lang}: timed run recycled {} instances, {} failed calls",
            timed.recycled, timed.failures
        );
    }
    table.print();
}
