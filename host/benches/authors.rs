//! Benchmark: what the same transform costs per row written in Rust, Python
//! and JavaScript with weir's SDKs.
//!
//! Each is the project `weir plugin new enrich --lang LANG` writes (parse a
//! row as JSON, dead-letter it without `id`, drop `kind == "noise"`, emit it
//! with a field added), built with its own `build.sh` into
//! `target/authors/bench/` (again only when the `weir` binary is newer than
//! the `.wasm`), loaded through weir's sandbox and called as delivery calls
//! it (`PluginInstance::transform`, one reused instance) on the benches'
//! 256-byte rows. Each figure is the median of `WEIR_BENCH_SAMPLES` samples
//! of `WEIR_BENCH_ROWS` rows, the languages taking turns. Also printed: each
//! `.wasm`'s size and how long the sandbox took to load (compile) it.
//!
//! Needs componentize-py and componentize-js: `. .ci/setup`, then
//! `cargo bench -p weir --bench authors`.

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use weir::config::{Config, Overrides};
use weir::sandbox::Sandbox;
use weir::telemetry::Metrics;

use support::{Table, env_count, median, print_figure, time_plugin};

const BENCH: &str = "authors";
const LANGS: [&str; 3] = ["rust", "python", "js"];
const BATCH_SIZES: [usize; 2] = [10, 100];
const DEFAULT_ROWS_PER_SAMPLE: usize = 2_000;
const DEFAULT_SAMPLES: usize = 7;

/// The project of `lang` under `target/authors/bench/`, built: its `.wasm`.
fn built(lang: &str) -> PathBuf {
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/authors");
    let dir = target.join("bench").join(lang);
    let name = format!("enrich-{lang}");
    let wasm = dir.join(format!("{name}.wasm"));
    let weir = Path::new(env!("CARGO_BIN_EXE_weir"));
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
    eprintln!("authors bench: building {name}");
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
    eprintln!(
        "authors bench: built {name} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    wasm
}

fn main() {
    let rows_per_sample = env_count("WEIR_BENCH_ROWS", DEFAULT_ROWS_PER_SAMPLE)
        .next_multiple_of(BATCH_SIZES[BATCH_SIZES.len() - 1]);
    let samples = env_count("WEIR_BENCH_SAMPLES", DEFAULT_SAMPLES);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");

    let wasms: Vec<PathBuf> = LANGS.iter().map(|lang| built(lang)).collect();
    let toml: String = LANGS
        .iter()
        .zip(&wasms)
        .map(|(lang, wasm)| format!("[plugins.{lang}]\nwasm = {wasm:?}\nworld = \"transform\"\n"))
        .collect();
    let config = Config::parse(Path::new("authors.toml"), &toml, &Overrides::default())
        .unwrap_or_else(|err| panic!("the bench's config is valid: {err}"));
    let sandbox = Sandbox::new(Metrics::default()).expect("wasm engine");
    let mut instances = Vec::new();
    let mut table = Table::new(&[
        "language",
        ".wasm",
        "load",
        "µs/row, batch 10",
        "µs/row, batch 100",
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
        instances.push(
            runtime
                .block_on(plugin.instantiate())
                .expect("a fresh instance"),
        );
    }
    eprintln!("authors bench: {rows_per_sample} rows per sample, {samples} samples per figure");
    for batch in BATCH_SIZES {
        let batches = support::plugin_batches(BATCH_SIZES[BATCH_SIZES.len() - 1], batch);
        let calls = rows_per_sample / batch;
        let mut per_row: Vec<Vec<f64>> = vec![Vec::new(); LANGS.len()];
        // One unmeasured turn warms each guest, then the languages take turns.
        for turn in 0..=samples {
            for (index, instance) in instances.iter_mut().enumerate() {
                let elapsed = time_plugin(&runtime, instance, &batches, calls);
                if turn > 0 {
                    per_row[index].push(elapsed.as_nanos() as f64 / rows_per_sample as f64);
                }
            }
        }
        for (index, lang) in LANGS.iter().enumerate() {
            let ns = median(&per_row[index]);
            print_figure(BENCH, &format!("{lang}_ns_per_row_batch_{batch}"), ns);
            cells[index].push(format!("{:.1}", ns / 1000.0));
        }
    }
    for row in cells {
        table.push(row);
    }
    table.print();
}
