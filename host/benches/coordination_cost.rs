//! What coordination costs NATS with 64 and 256 members sharing 512 units
//! (8 partitions × 64 shards): KV operations each host sends per second at
//! steady state, the watch messages each host receives, and the NATS
//! requests it takes to know the unowned units and every unit's lag —
//! weir's way next to the reference design's (poll every membership slot's
//! lease every 2 s; one ConsumerInfo per unit), measured in the same run.
//! Prints one JSON line per figure and a table; fails when the fleet does
//! not settle (every unit with its assigned member) in time.
//! Run: `cargo bench -p weir --bench coordination_cost`; `WEIR_BENCH_LOG`
//! (a tracing filter, e.g. `weir::coordination=warn`) logs to stderr.
//!
//! Every member is a real `Coordination` with its own NATS connection for
//! its KV traffic (so its counters are its own), pulling its units on a
//! shared connection; there are no rows, so what is counted is
//! coordination alone.

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use futures::future::join_all;
use support::{Table, env_count, print_figure};
use weir::config::{Config, Overrides};
use weir::coordination::{Coordination, Membership, UnitRunner, assign};
use weir::delivery::Workers;
use weir::host::DeliveryUnits;
use weir::ingest::Ledger;
use weir::nats::kv::NatsKv;
use weir::ops::unit_backlogs;
use weir::reload::Generation;
use weir::reload::releases::ReleaseFollower;
use weir::telemetry::Metrics;
use weir::topology::{Manifest, Names};

const BENCH: &str = "coordination_cost";
const PARTITIONS: u32 = 8;
const SHARDS: u32 = 64;
/// The default member TTL; `WEIR_BENCH_MEMBER_TTL_SECS` changes it.
const DEFAULT_MEMBER_TTL_SECS: usize = 5;
/// The reference design reads every membership slot's lease this often.
const REFERENCE_POLL: Duration = Duration::from_secs(2);
/// ... and has this many slots (its member cap).
const REFERENCE_SLOTS: usize = 64;
/// Members joining at once.
const JOIN_CONCURRENCY: usize = 8;
/// Tries of a member to join before the bench gives up.
const JOIN_ATTEMPTS: usize = 30;
/// How long the fleet may take to assign every unit.
const FORM_TIMEOUT: Duration = Duration::from_secs(900);

struct Figure {
    members: usize,
    formed_in: Duration,
    kv_ops_per_host: f64,
    watch_messages_per_host: f64,
    lag_requests: u64,
    lag_time: Duration,
    naive_lag_requests: u64,
    naive_lag_time: Duration,
}

fn main() -> anyhow::Result<()> {
    // `WEIR_BENCH_LOG=weir::coordination=warn` shows why members step down.
    if let Ok(filter) = std::env::var("WEIR_BENCH_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let window = Duration::from_secs(env_count("WEIR_BENCH_WINDOW_SECS", 15) as u64);
    let ttl = Duration::from_secs(
        env_count("WEIR_BENCH_MEMBER_TTL_SECS", DEFAULT_MEMBER_TTL_SECS) as u64,
    );
    // `WEIR_BENCH_MEMBERS=256` runs one fleet size only.
    let sizes = match std::env::var("WEIR_BENCH_MEMBERS") {
        Ok(_) => vec![env_count("WEIR_BENCH_MEMBERS", 64)],
        Err(_) => vec![64, 256],
    };
    println!("member TTL {ttl:?}");
    let mut figures = Vec::new();
    for members in sizes {
        let figure = runtime.block_on(measure(members, window, ttl))?;
        let prefix = format!("members_{members}");
        print_figure(
            BENCH,
            &format!("{prefix}_kv_ops_per_host_per_sec"),
            figure.kv_ops_per_host,
        );
        print_figure(
            BENCH,
            &format!("{prefix}_watch_messages_per_host_per_sec"),
            figure.watch_messages_per_host,
        );
        print_figure(
            BENCH,
            &format!("{prefix}_lag_requests_512_units"),
            figure.lag_requests as f64,
        );
        print_figure(
            BENCH,
            &format!("{prefix}_naive_lag_requests_512_units"),
            figure.naive_lag_requests as f64,
        );
        figures.push(figure);
    }

    let reference_reads = REFERENCE_SLOTS as f64 / REFERENCE_POLL.as_secs_f64();
    let mut table = Table::new(&[
        "members",
        "formed in",
        "KV ops/s/host (weir)",
        "KV reads/s/host (reference)",
        "watch msgs/s/host",
        "unowned: requests",
        "lag: requests (weir)",
        "lag: requests (per unit)",
    ]);
    for f in &figures {
        table.push(vec![
            f.members.to_string(),
            format!("{:.1} s", f.formed_in.as_secs_f64()),
            format!("{:.2}", f.kv_ops_per_host),
            if f.members <= REFERENCE_SLOTS {
                format!("{reference_reads:.0}")
            } else {
                format!("{reference_reads:.0} (cannot exceed {REFERENCE_SLOTS} members)")
            },
            format!("{:.0}", f.watch_messages_per_host),
            "0 (from the watch)".to_string(),
            format!("{} in {:.1} ms", f.lag_requests, ms(f.lag_time)),
            format!("{} in {:.1} ms", f.naive_lag_requests, ms(f.naive_lag_time)),
        ]);
    }
    table.print();
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn measure(members: usize, window: Duration, ttl: Duration) -> anyhow::Result<Figure> {
    let dir = tempfile::tempdir()?;
    let server = support::start_nats(dir.path()).await;
    let url = server.url().to_string();
    let config = Config::parse(
        Path::new("bench.toml"),
        &format!("[stream]\npartitions = {PARTITIONS}\nshards = {SHARDS}\n"),
        &Overrides::default(),
    )?;
    let router = Names::new("weir", PARTITIONS, SHARDS);
    let admin = async_nats::connect(&url).await?;
    Manifest::new(&router, &config.stream, &config.delivery, None)
        .create(&async_nats::jetstream::new(admin.clone()))
        .await?;

    // No pipelines: there are no rows, only coordination and idle pulls.
    let generation = Generation::new(Arc::new(config), HashMap::new());
    let (generations, _) = tokio::sync::watch::channel(Arc::new(generation));
    let pulls = async_nats::connect(&url).await?;
    let workers: Arc<dyn UnitRunner> = Arc::new(DeliveryUnits(Workers {
        js: async_nats::jetstream::new(pulls.clone()),
        router: router.clone(),
        generations,
        metrics: Metrics::default(),
        state: None,
        settled: None,
        behind: Arc::new(|| None),
        traces: Default::default(),
        shadows: Default::default(),
    }));

    // Members join 8 at a time, as a fleet rolling out would.
    let started = Instant::now();
    // Shared by every member: how often one had to step down.
    let metrics = Metrics::default();
    let joins = futures::stream::iter(0..members).map(|member| {
        let metrics = metrics.clone();
        let (url, router, pulls, workers) =
            (url.clone(), router.clone(), pulls.clone(), workers.clone());
        async move {
            let kv_client = async_nats::connect(&url).await?;
            // One process plays every member: under the joins' burst a
            // request may time out; a member retries as a host would.
            let mut attempt = 0;
            loop {
                attempt += 1;
                let joined = async {
                    let kv = NatsKv::open(&kv_client, &router.coordination_bucket()).await?;
                    Coordination::join(Membership {
                        kv,
                        client: pulls.clone(),
                        router: router.clone(),
                        me: format!("member-{member:03}"),
                        http: String::new(),
                        ttl,
                        units: workers.clone(),
                        metrics: metrics.clone(),
                        plugins: Arc::new(Default::default),
                        plugins_changed: Default::default(),
                        // Followed as a host follows them: the same watch.
                        followers: vec![
                            Arc::new(Ledger::new(&format!("member-{member:03}"))),
                            ReleaseFollower::new().0,
                        ],
                        drain_timeout: Duration::from_secs(30),
                        ack_wait: Duration::from_secs(30),
                        gate: weir::coordination::ClaimGate::open(),
                    })
                    .await
                }
                .await;
                match joined {
                    Ok(coordination) => return anyhow::Ok((kv_client, coordination)),
                    // A debug build playing 256 members starves its own
                    // client tasks while the fleet forms: patience.
                    Err(err) if attempt < JOIN_ATTEMPTS => {
                        eprintln!("member {member} retries joining: {err}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(err) => return Err(err).with_context(|| format!("member {member} joins")),
                }
            }
        }
    });
    let joined: Vec<_> = joins.buffer_unordered(JOIN_CONCURRENCY).collect().await;
    let mut fleet = Vec::new();
    let mut kv_clients = Vec::new();
    for member in joined {
        let (kv_client, coordination) = member?;
        kv_clients.push(kv_client);
        fleet.push(coordination);
    }
    let units = router.units();
    let names: Vec<String> = (0..members).map(|m| format!("member-{m:03}")).collect();
    let assigned = assign(&units, &names);
    let observer = fleet[0].view();
    loop {
        // Steady: every unit held by the member the assignment gives it.
        let view = observer.borrow().clone();
        if view.live_members().len() == members
            && units
                .iter()
                .all(|unit| view.owner(*unit) == assigned.get(unit).map(String::as_str))
        {
            break;
        }
        if started.elapsed() > FORM_TIMEOUT {
            let misplaced = units
                .iter()
                .filter(|unit| view.owner(**unit) != assigned.get(unit).map(String::as_str))
                .count();
            bail!(
                "{members} members did not settle within {FORM_TIMEOUT:?}: {} live, {} unowned, \
                 {misplaced} units not with their assigned member, {} step-downs",
                view.live_members().len(),
                view.unowned(&units).len(),
                metrics.coordination_step_downs.get()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let formed_in = started.elapsed();

    let counters = |clients: &[async_nats::Client]| -> (u64, u64) {
        clients.iter().fold((0, 0), |(out, inbound), client| {
            let stats = client.statistics();
            (
                out + stats.out_messages.load(Ordering::Relaxed),
                inbound + stats.in_messages.load(Ordering::Relaxed),
            )
        })
    };
    let (out_before, in_before) = counters(&kv_clients);
    tokio::time::sleep(window).await;
    let (out_after, in_after) = counters(&kv_clients);
    let per_host_per_sec = |delta: u64| delta as f64 / members as f64 / window.as_secs_f64();

    // Unowned units come from the watch; lag from the paged listing...
    let probe = async_nats::connect(&url).await?;
    let sent = || probe.statistics().out_messages.load(Ordering::Relaxed);
    let before = sent();
    let lag_started = Instant::now();
    let backlogs = unit_backlogs(&probe, &router).await;
    let lag_time = lag_started.elapsed();
    let lag_requests = sent() - before;
    if backlogs.len() != units.len() {
        bail!(
            "the listing found {} of {} units",
            backlogs.len(),
            units.len()
        );
    }
    // ... against one ConsumerInfo per unit.
    let js = async_nats::jetstream::new(probe.clone());
    let before = sent();
    let naive_started = Instant::now();
    let infos = join_all(units.iter().map(|unit| {
        let js = js.clone();
        let (stream, consumer) = (
            router.partition_stream(unit.partition),
            router.unit_consumer(*unit),
        );
        async move {
            js.get_stream_no_info(stream)
                .await
                .ok()?
                .consumer_info(consumer)
                .await
                .ok()
        }
    }))
    .await;
    let naive_lag_time = naive_started.elapsed();
    let naive_lag_requests = sent() - before;
    if infos.iter().any(Option::is_none) {
        bail!("a ConsumerInfo request failed");
    }

    join_all(fleet.into_iter().map(Coordination::leave)).await;
    drop(server);
    Ok(Figure {
        members,
        formed_in,
        kv_ops_per_host: per_host_per_sec(out_after - out_before),
        watch_messages_per_host: per_host_per_sec(in_after - in_before),
        lag_requests,
        lag_time,
        naive_lag_requests,
        naive_lag_time,
    })
}
