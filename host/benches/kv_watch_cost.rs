//! What KV watches cost the server: nats-server's resident memory and
//! consumer count when H hosts each follow K = 50 key prefixes — through
//! weir's watcher (one multi-filter consumer per host) or the naive way (one
//! consumer per prefix). Prints one JSON line per figure and a table; fails
//! when a watch does not catch up or the consumer count is not what the mode
//! makes. Run: `cargo bench -p weir --bench kv_watch_cost`.
//!
//! Every figure gets a fresh server, so memory from one run never counts in
//! the next. Each host is its own NATS connection, as in production.

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use weir::config::SyncPolicy;
use weir::nats::kv::{BucketOptions, KvWatch, KvWrite, NatsKv, Watch, WatchEvent, WatchStart};
use weir::nats::{EmbeddedNats, EmbeddedOptions};

use support::print_figure;

const BENCH: &str = "kv_watch_cost";

/// Prefixes every host follows.
const PREFIXES: usize = 50;
/// Keys stored under each prefix before the hosts start watching.
const KEYS_PER_PREFIX: usize = 4;
const HOST_COUNTS: [usize; 3] = [1, 10, 40];
/// Lets the server settle (and its GC run) before its memory is read.
const SETTLE: Duration = Duration::from_secs(2);
/// How long one watch may take to catch up before the run is abandoned.
const CATCH_UP: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// One watch — one consumer — per host over all prefixes.
    Weir,
    /// One watch — one consumer — per prefix per host.
    Naive,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Weir => "weir",
            Mode::Naive => "naive",
        }
    }
}

struct Figure {
    mode: Mode,
    hosts: usize,
    consumers: usize,
    rss_before_kib: u64,
    rss_after_kib: u64,
    setup: Duration,
    /// One put under a watched prefix until every host saw it.
    fan_out: Option<Duration>,
    /// Why the run stopped short, if it did.
    refused: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let started = Instant::now();
    let mut figures = Vec::new();
    for hosts in HOST_COUNTS {
        for mode in [Mode::Weir, Mode::Naive] {
            let figure = measure(&runtime, mode, hosts)?;
            print_json(&figure);
            figures.push(figure);
        }
    }
    print_table(&figures);
    println!("kv_watch_cost finished in {:.1?}", started.elapsed());
    Ok(())
}

fn measure(runtime: &tokio::runtime::Runtime, mode: Mode, hosts: usize) -> anyhow::Result<Figure> {
    let dir = tempfile::tempdir().context("temp dir")?;
    let server = EmbeddedNats::start(&EmbeddedOptions {
        binary: None,
        data_dir: dir.path().to_path_buf(),
        sync: SyncPolicy::Periodic,
        port: None,
        extra_config: String::new(),
        password: None,
    })
    .context("nats-server >= 2.14 on PATH (bash .ci/setup installs it)")?;
    let figure = runtime.block_on(run(&server, mode, hosts));
    drop(server);
    figure
}

async fn run(server: &EmbeddedNats, mode: Mode, hosts: usize) -> anyhow::Result<Figure> {
    let prefixes: Vec<String> = (0..PREFIXES).map(|index| format!("p{index:02}.")).collect();
    let mut stores = Vec::with_capacity(hosts);
    for _ in 0..hosts {
        let client = async_nats::connect(server.url()).await.context("connect")?;
        let kv = NatsKv::open_or_create(&client, &BucketOptions::new("bench"))
            .await
            .context("bucket")?;
        stores.push((client, kv));
    }
    let (first_client, writer) = stores.first().context("at least one host")?.clone();
    for prefix in &prefixes {
        for key in 0..KEYS_PER_PREFIX {
            writer
                .put(&format!("{prefix}k{key}"), "value".into())
                .await
                .context("seed")?;
        }
    }
    tokio::time::sleep(SETTLE).await;
    let rss_before_kib = rss_kib(server.pid())?;

    let setup_started = Instant::now();
    let mut watches: Vec<Vec<Watch>> = Vec::with_capacity(hosts);
    let mut refused = None;
    'hosts: for (_, kv) in &stores {
        let mut host_watches = Vec::new();
        let sets: Vec<Vec<String>> = match mode {
            Mode::Weir => vec![prefixes.clone()],
            Mode::Naive => prefixes.iter().map(|prefix| vec![prefix.clone()]).collect(),
        };
        for set in sets {
            match kv.watch_prefixes(&set, WatchStart::CurrentValues).await {
                Ok(mut watch) => {
                    caught_up(&mut watch).await?;
                    host_watches.push(watch);
                }
                Err(err) => {
                    refused = Some(err.to_string());
                    watches.push(host_watches);
                    break 'hosts;
                }
            }
        }
        watches.push(host_watches);
    }
    let setup = setup_started.elapsed();
    tokio::time::sleep(SETTLE).await;
    let rss_after_kib = rss_kib(server.pid())?;
    let js = async_nats::jetstream::new(first_client);
    let consumers = js
        .get_stream(writer.stream_name())
        .await
        .context("bucket stream")?
        .get_info()
        .await
        .context("stream info")?
        .state
        .consumer_count;
    // A wrong count is a broken watcher, not a figure.
    let expected = match mode {
        Mode::Weir => hosts,
        Mode::Naive => hosts * PREFIXES,
    };
    if refused.is_none() && consumers != expected {
        bail!(
            "{} watches of {hosts} hosts left {consumers} consumers on the server, not {expected}",
            mode.name()
        );
    }

    // One put under p00.: every host's watch of it must see it.
    let fan_out = if refused.is_none() {
        let put_at = Instant::now();
        let revision = writer.put("p00.fan-out", "x".into()).await.context("put")?;
        for host_watches in &mut watches {
            let watch = host_watches.first_mut().context("a watch of p00.")?;
            await_revision(watch, revision).await?;
        }
        Some(put_at.elapsed())
    } else {
        None
    };

    for watch in watches.into_iter().flatten() {
        watch.close().await;
    }
    Ok(Figure {
        mode,
        hosts,
        consumers,
        rss_before_kib,
        rss_after_kib,
        setup,
        fan_out,
        refused,
    })
}

async fn caught_up(watch: &mut Watch) -> anyhow::Result<()> {
    loop {
        match tokio::time::timeout(CATCH_UP, watch.next()).await {
            Ok(Some(Ok(WatchEvent::CaughtUp))) => return Ok(()),
            Ok(Some(Ok(WatchEvent::Update(_)))) => {}
            Ok(Some(Err(err))) => bail!("watch failed: {err}"),
            Ok(None) => bail!("watch ended"),
            Err(_) => bail!("watch not caught up within {CATCH_UP:?}"),
        }
    }
}

async fn await_revision(watch: &mut Watch, revision: u64) -> anyhow::Result<()> {
    loop {
        match tokio::time::timeout(CATCH_UP, watch.next()).await {
            Ok(Some(Ok(WatchEvent::Update(entry)))) if entry.revision >= revision => return Ok(()),
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(err))) => bail!("watch failed: {err}"),
            Ok(None) => bail!("watch ended"),
            Err(_) => bail!("revision {revision} did not arrive within {CATCH_UP:?}"),
        }
    }
}

/// The server's resident memory (VmRSS) in KiB.
fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmRSS in {path}"))
}

/// One JSON line per figure, named by mode and host count.
fn print_json(figure: &Figure) {
    let name = |what: &str| format!("{}_{}_hosts_{what}", figure.mode.name(), figure.hosts);
    print_figure(BENCH, &name("consumers"), figure.consumers as f64);
    print_figure(
        BENCH,
        &name("server_rss_delta_kib"),
        figure.rss_after_kib as f64 - figure.rss_before_kib as f64,
    );
    print_figure(
        BENCH,
        &name("setup_ms"),
        figure.setup.as_secs_f64() * 1000.0,
    );
    if let Some(delay) = figure.fan_out {
        print_figure(BENCH, &name("fan_out_ms"), delay.as_secs_f64() * 1000.0);
    }
}

fn print_table(figures: &[Figure]) {
    println!();
    println!("K = {PREFIXES} prefixes per host; server RSS in MiB (fresh server per row)");
    println!(
        "{:>5} {:>6} {:>9} {:>10} {:>10} {:>10} {:>9} {:>10}  note",
        "hosts", "mode", "consumers", "rss before", "rss after", "delta", "setup", "fan-out"
    );
    for figure in figures {
        let mib = |kib: u64| kib as f64 / 1024.0;
        println!(
            "{:>5} {:>6} {:>9} {:>10.1} {:>10.1} {:>10.1} {:>8.0?} {:>10}  {}",
            figure.hosts,
            figure.mode.name(),
            figure.consumers,
            mib(figure.rss_before_kib),
            mib(figure.rss_after_kib),
            mib(figure.rss_after_kib) - mib(figure.rss_before_kib),
            figure.setup,
            figure
                .fan_out
                .map_or_else(|| "-".to_string(), |delay| format!("{delay:.1?}")),
            figure.refused.as_deref().unwrap_or(""),
        );
    }
}
