//! Benchmark: what a host costs in resident memory, by the number of
//! plugins it runs and their language.
//!
//! Each case starts one `weir run` process (this build's binary) on one
//! nats-server, with N pipelines of one table each, every pipeline one
//! transform of the language (a plugin of its own name, so an instance
//! pool of its own) into the null sink; posts `ROWS` rows to every table,
//! waits until the fleet's status counts them delivered (so every plugin
//! has a warm instance), lets the host settle and reads `VmRSS` from
//! `/proc/<pid>/status` (the median of 5 reads, 200 ms apart). Rust is the
//! repository's pass-through plugin (`tests/artifacts`); Python and
//! JavaScript are the projects `weir plugin new --lang` writes, built as
//! the authors bench builds them (into `target/authors/bench/`, reused
//! while newer than the `weir` binary; needs `. .ci/setup`).
//!
//! Each case runs twice on one compiled cache: a first start (the host
//! compiles the plugins itself) and a restart (it maps what the cache kept).
//! Prints `rss_mib_<lang>_<n>_plugins`, `..._plugins_restarted` and, per
//! language, the cost of each plugin past the first at a first start
//! (`rss_mib_per_<lang>_plugin`).
//! `cargo bench -p weir --bench memory`; `WEIR_BENCH_PLUGINS` (default
//! "1,4") sets the plugin counts, `WEIR_BENCH_LANGS` (default
//! "rust,python,js") the languages.

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{API_KEY, TENANT, Table, print_figure};

const BENCH: &str = "memory";
const ROWS: usize = 200;
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const MIB: f64 = 1024.0;

fn list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(|item| item.trim().to_string())
        .filter(|item| !item.is_empty())
        .collect()
}

/// The `.wasm` of a transform in `lang`: Rust's pass-through, else the
/// project `weir plugin new --lang LANG` writes, built (as the authors bench).
fn plugin(lang: &str) -> PathBuf {
    if lang == "rust" {
        return PathBuf::from(weir_test_artifacts::PASSTHROUGH);
    }
    support::authored_plugin(lang)
}

fn config(
    nats_url: &str,
    dir: &Path,
    cache: &Path,
    port: u16,
    wasm: &Path,
    plugins: usize,
) -> String {
    let mut text = format!(
        r#"
listen = "127.0.0.1:{port}"
data_dir = {data:?}
compile_cache_dir = {cache:?}

[nats]
url = "{nats_url}"

[stream]
create = true

[[tenants]]
name = "{TENANT}"
api_keys = ["{API_KEY}"]

[plugins.sink]
wasm = {sink:?}
world = "sink"
"#,
        data = dir.join("data").display().to_string(),
        cache = cache.display().to_string(),
        sink = weir_test_artifacts::NULL_SINK,
    );
    for plugin in 0..plugins {
        text.push_str(&format!(
            "\n[plugins.p{plugin}]\nwasm = {wasm:?}\nworld = \"transform\"\n\n[[pipelines]]\ntables = [\"t{plugin}\"]\ntransforms = [\"p{plugin}\"]\nsink = \"sink\"\n",
            wasm = wasm.display().to_string(),
        ));
    }
    text
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the host runs");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One host with `plugins` transforms of `wasm`, its compiled components
/// kept in `cache`: its settled RSS in KiB.
async fn measure(
    nats_url: &str,
    cache: &Path,
    wasm: &Path,
    plugins: usize,
    accepted_before: &mut u64,
) -> u64 {
    let dir = tempfile::tempdir().expect("a temp dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let path = dir.path().join("weir.toml");
    let text = config(nats_url, dir.path(), cache, port, wasm, plugins);
    std::fs::write(&path, text).expect("config");
    let host = Killed(
        Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["run", "--config"])
            .arg(&path)
            .env("WEIR_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("weir runs"),
    );
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let started = Instant::now();
    while !http
        .get(format!("{url}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(
            started.elapsed() < READY_TIMEOUT,
            "the host never got ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body: String = (0..ROWS)
        .map(|id| String::from_utf8(support::row(id as u64)).expect("UTF-8") + "\n")
        .collect();
    for plugin in 0..plugins {
        let response = http
            .post(format!("{url}/v1/ingest/t{plugin}"))
            .bearer_auth(API_KEY)
            .body(body.clone())
            .send()
            .await
            .expect("the front door answers");
        assert_eq!(response.status(), 202, "rows accepted");
    }
    let expected = *accepted_before + (ROWS * plugins) as u64;
    loop {
        let report = weir::client::fetch_status(&url, None).await.ok();
        let delivered = report.and_then(|r| r.totals.settled).unwrap_or(0);
        if delivered >= expected {
            break;
        }
        assert!(
            started.elapsed() < READY_TIMEOUT,
            "{delivered} of {expected} rows delivered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    *accepted_before = expected;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut reads = Vec::new();
    for _ in 0..5 {
        reads.push(rss_kib(host.0.id()));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    reads.sort_unstable();
    reads[reads.len() / 2]
}

#[tokio::main]
async fn main() {
    let counts: Vec<usize> = list("WEIR_BENCH_PLUGINS", "1,4")
        .iter()
        .map(|n| n.parse().expect("WEIR_BENCH_PLUGINS: numbers"))
        .collect();
    let langs = list("WEIR_BENCH_LANGS", "rust,python,js");
    support::install_tls_provider();
    let dir = tempfile::tempdir().expect("a temp dir");
    let server = support::start_nats(&dir.path().join("nats")).await;
    let mut settled = 0;
    let mut table = Table::new(&[
        "language",
        "plugins",
        "RSS per host",
        "restarted (compiled cache)",
        "per plugin past the first",
    ]);
    for lang in &langs {
        let wasm = plugin(lang);
        let mut rows = Vec::new();
        for &count in &counts {
            // A first start compiles in the process; a restart maps what the
            // compiled cache kept.
            let cache = tempfile::tempdir().expect("a temp dir");
            let kib = measure(server.url(), cache.path(), &wasm, count, &mut settled).await;
            let restarted = measure(server.url(), cache.path(), &wasm, count, &mut settled).await;
            print_figure(
                BENCH,
                &format!("rss_mib_{lang}_{count}_plugins"),
                kib as f64 / MIB,
            );
            print_figure(
                BENCH,
                &format!("rss_mib_{lang}_{count}_plugins_restarted"),
                restarted as f64 / MIB,
            );
            rows.push((count, kib, restarted));
        }
        let per_plugin = match (rows.first(), rows.last()) {
            (Some(&(n1, k1, _)), Some(&(n2, k2, _))) if n2 > n1 => {
                Some((k2 as f64 - k1 as f64) / (n2 - n1) as f64 / MIB)
            }
            _ => None,
        };
        if let Some(per) = per_plugin {
            print_figure(BENCH, &format!("rss_mib_per_{lang}_plugin"), per);
        }
        for (count, kib, restarted) in rows {
            table.push(vec![
                lang.clone(),
                count.to_string(),
                format!("{:.1} MiB", kib as f64 / MIB),
                format!("{:.1} MiB", restarted as f64 / MIB),
                per_plugin.map_or("-".into(), |p| format!("{p:.1} MiB")),
            ]);
        }
    }
    table.print();
}
