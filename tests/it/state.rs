//! Plugin state (#23): the window plugin's counts through a real pipeline
//! runner and a real NATS KV bucket, through hosts across faults and
//! reloads, and in `weir plugin test`.

use weir::config::{Config, Overrides};
use weir::coordination::Lease;
use weir::delivery::{Batch, PipelineRunner, Position, RunError, Verdict};
use weir::nats::kv::{BucketOptions, NatsKv};
use weir::sandbox::Sandbox;
use weir::state::{StateStore, UnitState, scope_key};
use weir::topology::{Names, Unit};

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::{ACME_KEY, Host, Nats, TestHost, balanced, base_config, eventually};

/// The window plugin with `grants.state` in a pipeline of table `events`.
pub(crate) const WINDOW: &str = r#"
[plugins.window]
wasm = "weir_window.wasm"
world = "transform"
settings = { width_ms = 1000 }
grants.state = { max_keys = 100 }

[[pipelines]]
tables = ["events"]
transforms = ["window"]
sink = "files"
"#;

fn rows(tenant: &str, rows: &[(u64, &str, u64, u64)]) -> Batch {
    let mut batch = Batch::default();
    for &(sequence, key, value, ts) in rows {
        let payload = format!("{{\"key\":\"{key}\",\"value\":{value},\"ts\":{ts}}}");
        batch.push(
            tenant,
            "events",
            payload.as_bytes(),
            [],
            Position {
                sequence,
                attempt: 1,
            },
        );
    }
    batch
}

/// The window plugin of `window` (a config's plugin and pipeline) loaded
/// for a runner on the tests' [`UNIT`], its pipeline without a sink, and
/// the state bucket.
struct Rig {
    config: Config,
    sandbox: Sandbox,
    plugin: std::sync::Arc<weir::sandbox::Plugin>,
    pipeline: weir::config::Pipeline,
    store: StateStore<NatsKv>,
    state: Option<UnitState>,
    lease: Lease,
}

impl Rig {
    async fn new(nats: &Nats, window: &str) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weir.toml");
        std::fs::write(&path, base_config(nats.url(), window)).unwrap();
        let config = Config::load(&path, &Overrides::default()).unwrap();
        let sandbox = Sandbox::new(weir::telemetry::Metrics::default()).unwrap();
        let plugin = sandbox.load(&config.plugins["window"]).await.unwrap();
        let pipeline = weir::config::Pipeline {
            sink: None,
            ..config.pipeline_for("events").unwrap().clone()
        };
        let store = state_store(nats).await;
        let state = Some(UnitState {
            store: store.clone().into(),
            unit: UNIT,
            metrics: weir::telemetry::Metrics::default(),
        });
        let lease = Lease::until(tokio::time::Instant::now() + Duration::from_secs(600));
        Rig {
            config,
            sandbox,
            plugin,
            pipeline,
            store,
            state,
            lease,
        }
    }

    fn runner(&self) -> PipelineRunner {
        let plugin = self.plugin.clone();
        PipelineRunner::new(&self.pipeline, |_| Some(plugin.clone()), self.state.clone()).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn window_counts_survive_replays_and_a_second_writer_is_fenced() {
    let nats = Nats::start();
    let rig = Rig::new(&nats, WINDOW).await;
    let Rig {
        config,
        sandbox,
        pipeline,
        store,
        state,
        lease,
        ..
    } = &rig;
    let runner = || rig.runner();
    let tally = |tenant: &'static str, key: &'static str| {
        let store = store.clone();
        async move {
            let stored = store
                .load(&scope_key(tenant, "window", "events", UNIT))
                .await
                .unwrap();
            stored
                .scope
                .get(format!("k.{key}").as_bytes())
                .map(|v| String::from_utf8_lossy(v).to_string())
        }
    };

    let mut first = runner();
    let batch = rows("acme", &[(1, "a", 1, 0), (2, "a", 2, 10), (3, "b", 5, 20)]);
    let verdicts = first.run(batch.clone(), lease).await.unwrap();
    assert!(
        verdicts
            .iter()
            .all(|v| matches!(v, Verdict::Done | Verdict::Dropped)),
        "{verdicts:?}"
    );
    assert_eq!(tally("acme", "a").await.as_deref(), Some("2,3"));

    // The same rows again (their acks were lost): acked, not counted twice,
    // by this runner and by a new owner that reads the state afresh.
    first.run(batch.clone(), lease).await.unwrap();
    let mut second = runner();
    second.run(batch, lease).await.unwrap();
    assert_eq!(tally("acme", "a").await.as_deref(), Some("2,3"));
    assert_eq!(tally("acme", "b").await.as_deref(), Some("1,5"));

    // Another tenant's rows of the same table see none of it.
    second
        .run(rows("globex", &[(4, "a", 7, 30)]), lease)
        .await
        .unwrap();
    assert_eq!(tally("globex", "a").await.as_deref(), Some("1,7"));
    assert_eq!(tally("acme", "a").await.as_deref(), Some("2,3"));

    // Another plugin (the same code, named apart) on the same rows has a
    // scope of its own: the window's tallies are not its to see.
    let mut other_config = config.plugins["window"].clone();
    other_config.name = "other".into();
    let other = sandbox.load(&other_config).await.unwrap();
    let other_pipeline = weir::config::Pipeline {
        transforms: vec!["other".into()],
        ..pipeline.clone()
    };
    PipelineRunner::new(&other_pipeline, |_| Some(other.clone()), state.clone())
        .unwrap()
        .run(rows("acme", &[(1, "a", 1, 0)]), lease)
        .await
        .unwrap();
    let other_tally = store
        .load(&scope_key("acme", "other", "events", UNIT))
        .await
        .unwrap();
    assert_eq!(other_tally.scope.get(b"k.a"), Some(&b"1,1"[..]));
    assert_eq!(tally("acme", "a").await.as_deref(), Some("2,3"));

    // The second runner wrote acme's scope after the first read it. The
    // first, its lease gone, writes nothing: fenced.
    second
        .run(rows("acme", &[(5, "a", 10, 40)]), lease)
        .await
        .unwrap();
    let expired = Lease::until(tokio::time::Instant::now());
    let fenced = first
        .run(rows("acme", &[(6, "a", 100, 50)]), &expired)
        .await;
    assert!(matches!(fenced, Err(RunError::Fenced(_))), "{fenced:?}");
    assert_eq!(tally("acme", "a").await.as_deref(), Some("3,13"));
    // With its lease (it is the owner now, the other one woke up late) its
    // write is refused, the rows come back, and run again on what is
    // stored: row 5 counted once, row 6 added.
    let refused = first
        .run(rows("acme", &[(5, "a", 10, 40), (6, "a", 100, 50)]), lease)
        .await
        .unwrap();
    assert!(
        refused.iter().all(|v| matches!(v, Verdict::Retry { .. })),
        "{refused:?}"
    );
    assert_eq!(tally("acme", "a").await.as_deref(), Some("3,13"));
    first
        .run(rows("acme", &[(5, "a", 10, 40), (6, "a", 100, 50)]), lease)
        .await
        .unwrap();
    assert_eq!(tally("acme", "a").await.as_deref(), Some("4,113"));

    // A row the window dead-letters (late) comes back after its letter was
    // not stored: dead-lettered again without a call.
    let late = rows("acme", &[(7, "a", 1, 999_000), (8, "a", 1, 10)]);
    let verdicts = first.run(late.clone(), lease).await.unwrap();
    assert!(
        matches!(verdicts[1], Verdict::DeadLetter { ref reason, .. } if reason.starts_with("late")),
        "{verdicts:?}"
    );
    let again = runner().run(late, lease).await.unwrap();
    assert!(
        matches!(again[0], Verdict::Done | Verdict::Dropped),
        "{again:?}"
    );
    match &again[1] {
        Verdict::DeadLetter { reason, .. } => assert!(
            reason.starts_with("dead-lettered before by this pipeline"),
            "{reason}"
        ),
        other => panic!("the late row is dead-lettered again, not {other:?}"),
    }

    // Row 7 was of a later window: it closed this one, the tallies
    // started again with it.
    assert_eq!(tally("acme", "a").await.as_deref(), Some("1,1"));
    assert_eq!(tally("acme", "b").await, None);
}

/// The unit the runner tests' rows come from.
const UNIT: Unit = Unit {
    partition: 0,
    shard: 0,
};

/// The unit a tenant's `events` live in under the tests' default topology.
fn events_unit(tenant: &str) -> Unit {
    Names::new(
        "weir",
        weir::config::DEFAULT_PARTITIONS,
        weir::config::DEFAULT_SHARDS,
    )
    .route(tenant, "events")
}

/// The state bucket, as hosts of the tests' configs open it: with the
/// history a chain of changes needs (a bucket of history 1 would get whole
/// scopes, and opening it so beside a host would lower its history).
async fn state_store(nats: &Nats) -> StateStore<NatsKv> {
    StateStore::new(state_kv(nats).await)
}

async fn state_kv(nats: &Nats) -> NatsKv {
    let client = nats.client().await;
    let options = BucketOptions {
        history: weir::topology::STATE_HISTORY,
        ..BucketOptions::new("weir_state")
    };
    NatsKv::open_or_create(&client, &options).await.unwrap()
}

/// Rows already stored when a host starts, as the state bench has them:
/// the host drains them all, each closed window's summaries count every
/// row once, the scope is stored as a chain of changes a fresh read
/// replays, and the rows the window consumed count as dropped (the bench
/// waits for delivered and dropped rows together).
#[tokio::test(flavor = "multi_thread")]
async fn a_host_starting_on_stored_rows_counts_each_once_through_a_chain_of_changes() {
    const KEYS: u64 = 50;
    /// Rows per 1 s window: `ts` grows 1 ms every 2 rows.
    const PER_WINDOW: u64 = 2000;
    const WINDOWS: u64 = 3;
    let nats = Nats::start();
    let text = base_config(nats.url(), WINDOW);
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(&dir.path().join("weir.toml"), &text, &Overrides::default())
        .expect("the test's config is valid");
    let router = Names::new(
        "weir",
        weir::config::DEFAULT_PARTITIONS,
        weir::config::DEFAULT_SHARDS,
    );
    let js = async_nats::jetstream::new(nats.client().await);
    weir::topology::Manifest::new(&router, &config.stream, &config.delivery, None)
        .create(&js)
        .await
        .unwrap();
    let unit = events_unit("acme");
    let subject = router.subject(unit, "acme", "events");
    // The windows' rows, then one of the next window that closes the last.
    let total = WINDOWS * PER_WINDOW + 1;
    let mut expected: BTreeMap<(u64, String), (u64, f64)> = BTreeMap::new();
    let mut acks = Vec::new();
    for i in 0..total {
        let (key, value, ts) = (format!("k{}", i % KEYS), i % 7, i * 1000 / PER_WINDOW);
        if i < WINDOWS * PER_WINDOW {
            let tally = expected.entry((ts - ts % 1000, key.clone())).or_default();
            tally.0 += 1;
            tally.1 += value as f64;
        }
        let payload = format!("{{\"key\":\"{key}\",\"value\":{value},\"ts\":{ts}}}");
        acks.push(js.publish(subject.clone(), payload.into()).await.unwrap());
        // Acks awaited as they go: the client holds only so many pending.
        if acks.len() == 256 || i + 1 == total {
            for ack in acks.drain(..) {
                ack.await.unwrap();
            }
        }
    }

    let host = TestHost::start(&text).await;
    let rows = eventually(Duration::from_secs(120), "every stored row through", || {
        let rows = host.host.status().rows();
        async move { (rows.delivered + rows.dropped >= total).then_some(rows) }
    })
    .await;
    // The rows that closed a window became its summaries; the rest were
    // consumed.
    assert_eq!(
        (
            rows.delivered,
            rows.dropped,
            rows.dead_lettered,
            rows.retried
        ),
        (WINDOWS, total - WINDOWS, 0, 0),
        "{rows:?}"
    );
    let summaries = eventually(Duration::from_secs(30), "every window's summaries", || {
        let lines = host.sink_lines("windows");
        async move { (lines.len() as u64 >= WINDOWS * KEYS).then_some(lines) }
    })
    .await;
    let counted: BTreeMap<(u64, String), (u64, f64)> = summaries
        .iter()
        .map(|line| {
            let summary: serde_json::Value = serde_json::from_str(line).unwrap();
            let key = summary["key"].as_str().unwrap_or_default().to_string();
            let tally = (
                summary["count"].as_u64().unwrap_or(0),
                summary["sum"].as_f64().unwrap_or(-1.0),
            );
            let window = summary["window"].as_u64().unwrap_or(u64::MAX);
            ((window, key), tally)
        })
        .collect();
    assert_eq!(
        summaries.len() as u64,
        WINDOWS * KEYS,
        "one summary per key and window"
    );
    assert_eq!(counted, expected);

    // What a new owner would read: the chain replayed from its base holds
    // the open window's one row.
    let key = scope_key("acme", "window", "events", unit);
    let kv = state_kv(&nats).await;
    let kept = weir::nats::kv::KvWrite::revisions(&kv, &key, 0)
        .await
        .unwrap();
    assert!(
        kept.len() > 1,
        "the scope's writes are kept as revisions: {}",
        kept.len()
    );
    let stored = StateStore::new(kv).load(&key).await.unwrap();
    let last = format!("k{}", (total - 1) % KEYS);
    assert_eq!(
        stored.scope.get(format!("k.{last}").as_bytes()),
        Some(format!("1,{}", (total - 1) % 7).as_bytes())
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_past_the_grants_limits_is_refused_with_the_documented_error() {
    let nats = Nats::start();
    let rig = Rig::new(&nats, &WINDOW.replace("max_keys = 100", "max_keys = 3")).await;
    let (store, lease) = (&rig.store, &rig.lease);
    let mut runner = rig.runner();

    // The open window's start, then a tally per key: the third key is one
    // too many, the rows of keys already there still count.
    let batch = rows(
        "acme",
        &[
            (1, "a", 1, 0),
            (2, "b", 1, 1),
            (3, "c", 1, 2),
            (4, "a", 1, 3),
        ],
    );
    let verdicts = runner.run(batch, lease).await.unwrap();
    assert!(
        matches!(verdicts[0], Verdict::Done | Verdict::Dropped),
        "{verdicts:?}"
    );
    assert!(
        matches!(verdicts[1], Verdict::Done | Verdict::Dropped),
        "{verdicts:?}"
    );
    match &verdicts[2] {
        Verdict::DeadLetter { reason, .. } => assert_eq!(
            reason,
            "state: the state is full: grants.state.max_keys is 3 keys"
        ),
        other => panic!("the third key is refused, not {other:?}"),
    }
    assert!(
        matches!(verdicts[3], Verdict::Done | Verdict::Dropped),
        "{verdicts:?}"
    );
    let stored = store
        .load(&scope_key("acme", "window", "events", UNIT))
        .await
        .unwrap();
    assert_eq!(stored.scope.keys(), 3);
    assert_eq!(stored.scope.get(b"k.a"), Some(&b"2,2"[..]));
    assert_eq!(stored.scope.get(b"k.c"), None);
}

/// Posts `body` to table `events` until it is stored: the host may be
/// restarting or handing over. A 4xx fails the test.
async fn post(http: &reqwest::Client, url: &str, api_key: &str, idempotency: &str, body: &str) {
    loop {
        let sent = http
            .post(format!("{url}/v1/ingest/events"))
            .bearer_auth(api_key)
            .header("Idempotency-Key", idempotency)
            .body(body.to_string())
            .send()
            .await;
        match sent.map(|r| r.status().as_u16()) {
            Ok(202) => return,
            Ok(status @ 400..500) => panic!("the request was refused: {status}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

const GLOBEX_KEY: &str = "globex-key-456";

#[tokio::test(flavor = "multi_thread")]
async fn weir_state_purge_removes_one_tenants_state_and_a_running_host_starts_it_afresh() {
    let nats = Nats::start();
    let tenants = format!("\n[[tenants]]\nname = \"globex\"\napi_keys = [\"{GLOBEX_KEY}\"]\n");
    let host = Host::spawn_with("h1", base_config(nats.url(), &format!("{WINDOW}{tenants}")));
    let http = reqwest::Client::new();
    let store = state_store(&nats).await;
    let row = |value: u64| format!("{{\"key\":\"a\",\"value\":{value},\"ts\":0}}\n");
    post(&http, &host.url, ACME_KEY, "acme-1", &row(1)).await;
    post(&http, &host.url, GLOBEX_KEY, "globex-1", &row(5)).await;
    let tally = |tenant: &'static str| {
        let store = store.clone();
        async move {
            let stored = store
                .load(&scope_key(tenant, "window", "events", events_unit(tenant)))
                .await;
            stored
                .ok()?
                .scope
                .get(b"k.a")
                .map(|v| String::from_utf8_lossy(v).to_string())
        }
    };
    for tenant in ["acme", "globex"] {
        eventually(
            Duration::from_secs(30),
            "both tenants' rows counted",
            || tally(tenant),
        )
        .await;
    }

    let purge = std::process::Command::new(crate::support::WEIR)
        .args(["state", "purge", "--tenant", "acme", "--config"])
        .arg(host.dir.path().join("weir.toml"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&purge.stdout);
    assert!(
        purge.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&purge.stderr)
    );
    assert!(
        said.starts_with(
            "tenant acme: purged 1 state scope from bucket weir_state\n  acme.window.events"
        ),
        "{said}"
    );
    assert_eq!(tally("acme").await, None);
    assert_eq!(tally("globex").await.as_deref(), Some("1,5"));

    // The host had acme's scope in hand: its next row counts from nothing.
    post(&http, &host.url, ACME_KEY, "acme-2", &row(2)).await;
    let counted = eventually(Duration::from_secs(30), "acme's next row counted", || {
        tally("acme")
    })
    .await;
    assert_eq!(counted, "1,2", "log:\n{}", host.log());
}

/// How the host counting the window stops mid-window.
enum Stop {
    /// SIGKILL, restarted at once: rows in flight come back.
    Kill,
    /// A second host joins, then the first leaves on SIGTERM: the unit is
    /// handed over.
    Handover,
}

#[tokio::test(flavor = "multi_thread")]
async fn window_counts_are_exact_across_a_sigkill_mid_window() {
    window_counts_are_exact_across(Stop::Kill).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn window_counts_are_exact_across_a_planned_handover_mid_window() {
    window_counts_are_exact_across(Stop::Handover).await;
}

/// The window plugin in `weir run` processes, stopped once some of the
/// window's rows are counted: its summaries still count every row once.
async fn window_counts_are_exact_across(stop: Stop) {
    let nats = Nats::start();
    let config = |id: &str| {
        base_config(
            nats.url(),
            &format!("{WINDOW}\n[coordination]\nhost_id = \"{id}\"\nmember_ttl_secs = 5\n"),
        )
    };
    let mut hosts = vec![Host::spawn_with("h1", config("h1"))];
    let http = reqwest::Client::new();
    let store = state_store(&nats).await;
    let mut expected: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for request in 0..10u64 {
        let mut body = String::new();
        for i in 0..20u64 {
            let (key, value) = if i % 3 == 0 { ("b", 2) } else { ("a", 1) };
            let tally = expected.entry(key).or_default();
            tally.0 += 1;
            tally.1 += value;
            let ts = request * 50 + i;
            body.push_str(&format!(
                "{{\"key\":\"{key}\",\"value\":{value},\"ts\":{ts},\"n\":\"{request}.{i}\"}}\n"
            ));
        }
        let live = &hosts.last().unwrap().url;
        post(&http, live, ACME_KEY, &format!("r{request}"), &body).await;
        if request == 4 {
            // Once some of the window's rows are counted, some maybe not yet.
            eventually(Duration::from_secs(30), "rows counted", || async {
                let stored = store
                    .load(&scope_key("acme", "window", "events", events_unit("acme")))
                    .await;
                stored.ok().filter(|s| s.scope.get(b"k.a").is_some())
            })
            .await;
            match stop {
                Stop::Kill => hosts[0].crash_and_restart(),
                Stop::Handover => {
                    hosts.push(Host::spawn_with("h2", config("h2")));
                    balanced(&hosts[0], &["h1", "h2"]).await;
                    hosts[0].terminate();
                }
            }
        }
    }
    // A row of the next window closes window 0.
    let live = &hosts.last().unwrap().url;
    let close = "{\"key\":\"a\",\"value\":0,\"ts\":1500,\"n\":\"close\"}\n";
    post(&http, live, ACME_KEY, "close", close).await;
    let outputs: Vec<_> = hosts.iter().map(|host| host.output("windows")).collect();
    let keys = expected.len();
    let summaries = eventually(Duration::from_secs(60), "window 0's summaries", || {
        let outputs = outputs.clone();
        async move {
            let rows: Vec<serde_json::Value> = outputs
                .iter()
                .flat_map(|output| {
                    let text = std::fs::read_to_string(output).unwrap_or_default();
                    text.lines()
                        .filter_map(|line| serde_json::from_str(line).ok())
                        .collect::<Vec<_>>()
                })
                .collect();
            (rows.len() >= keys).then_some(rows)
        }
    })
    .await;
    let logs = || hosts.iter().map(Host::log).collect::<Vec<_>>().join("\n");
    let counted: BTreeMap<String, (u64, u64)> = summaries
        .iter()
        .map(|summary| {
            assert_eq!(summary["window"], 0, "{summary}");
            let key = summary["key"].as_str().unwrap_or_default().to_string();
            let sum = summary["sum"].as_f64().unwrap_or(-1.0) as u64;
            (key, (summary["count"].as_u64().unwrap_or(0), sum))
        })
        .collect();
    let expected: BTreeMap<String, (u64, u64)> = expected
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(summaries.len(), 2, "one summary per key: {summaries:?}");
    assert_eq!(counted, expected, "logs:\n{}", logs());

    // The scope forgets the rows the consumer's ack floor has passed: it
    // keeps the sequences of rows that could still come back, not 200.
    let mut more = 0;
    eventually(Duration::from_secs(30), "applied sequences pruned", || {
        more += 1;
        let (http, live, store) = (&http, &live, &store);
        async move {
            let row = format!("{{\"key\":\"a\",\"value\":0,\"ts\":1600,\"n\":\"more{more}\"}}\n");
            post(http, live, ACME_KEY, &format!("more{more}"), &row).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let stored = store
                .load(&scope_key("acme", "window", "events", events_unit("acme")))
                .await;
            stored.ok().filter(|s| s.scope.settled_count() < 10)
        }
    })
    .await;
}

/// `weir plugin test` with the config's `grants.state`: the file's rows
/// share one scope, empty at first, so the window closes as in a host.
#[test]
fn plugin_test_gives_a_stateful_plugin_state_for_the_files_rows() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("weir.toml");
    std::fs::write(&config, base_config("nats://127.0.0.1:1", WINDOW)).unwrap();
    let rows = dir.path().join("rows.ndjson");
    std::fs::write(
        &rows,
        "{\"key\":\"a\",\"value\":1,\"ts\":0}\n{\"key\":\"a\",\"value\":2,\"ts\":5}\n\
         {\"key\":\"b\",\"value\":4,\"ts\":9}\n{\"key\":\"a\",\"value\":1,\"ts\":1200}\n",
    )
    .unwrap();
    let output = std::process::Command::new(crate::support::WEIR)
        .args(["plugin", "test", weir_test_artifacts::WINDOW, "--rows"])
        .arg(&rows)
        .arg("--config")
        .arg(&config)
        .args(["--plugin", "window", "--json"])
        .env("WEIR_CACHE_DIR", crate::support::compile_cache_dir())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&said).unwrap();
    let outcomes: Vec<&str> = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["outcome"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(outcomes, ["drop", "drop", "drop", "emit"], "{report}");
    let summaries: Vec<&serde_json::Value> = report["rows"][3]["emitted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| &row["payload"])
        .collect();
    assert_eq!(
        summaries,
        [
            &serde_json::json!({"window": 0, "key": "a", "count": 2, "sum": 3.0}),
            &serde_json::json!({"window": 0, "key": "b", "count": 1, "sum": 4.0}),
        ],
        "{report}"
    );
}

/// A reload that grants a plugin state gives it state from its next batch:
/// the bucket is open from boot, whatever the plugins then.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_that_grants_state_gives_the_plugin_its_state() {
    let nats = Nats::start();
    let ungranted = WINDOW.replace("grants.state = { max_keys = 100 }\n", "");
    let config = format!(
        "admin_api_keys = [\"admin-secret\"]\n{}",
        base_config(nats.url(), &ungranted)
    );
    let host = crate::support::TestHost::start(&config).await;
    let store = state_store(&nats).await;
    let scope = scope_key("acme", "window", "events", events_unit("acme"));
    let row = "{\"key\":\"a\",\"value\":1,\"ts\":0}\n";
    assert_eq!(host.ingest("events", row).await.status(), 202);
    // Without the grant the plugin's state calls fail, and it says so.
    let reasons = crate::support::dead_letter_reasons(&nats, 1).await;
    assert!(
        reasons[0].starts_with("state: plugin `window` has no state"),
        "{reasons:?}"
    );

    let path = host.config_path();
    let text = std::fs::read_to_string(&path).unwrap();
    let granted = text.replace(
        "settings = { width_ms = 1000 }\n",
        "settings = { width_ms = 1000 }\ngrants.state = { max_keys = 100 }\n",
    );
    assert_ne!(text, granted);
    std::fs::write(&path, granted).unwrap();
    let reload = host
        .http
        .post(host.url("/v1/admin/reload"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status(), 200);

    assert_eq!(host.ingest("events", row).await.status(), 202);
    let tally = eventually(
        Duration::from_secs(30),
        "the row counted in state",
        || async {
            let stored = store.load(&scope).await.ok()?;
            stored.scope.get(b"k.a").map(<[u8]>::to_vec)
        },
    )
    .await;
    // Only the row after the reload counted.
    assert_eq!(tally, b"1,1");
    let metrics = host.get_text("/metrics").await;
    assert!(
        metrics.contains("weir_state_writes_total{plugin=\"window\",result=\"stored\"} 1"),
        "{metrics}"
    );
}

/// A batch of a stateful pipeline that runs into a deadline is isolated
/// one row at a time on the unit's own runner: the rows that are fine are
/// counted once each, the one that spins is dead-lettered, uncounted.
#[tokio::test(flavor = "multi_thread")]
async fn a_deadline_in_a_stateful_pipeline_isolates_rows_and_counts_the_others_once() {
    let nats = Nats::start();
    let extra = WINDOW
        .replace(
            "transforms = [\"window\"]",
            "transforms = [\"chaos\", \"window\"]",
        )
        .replace(
            "[[pipelines]]",
            "[plugins.chaos]\nwasm = \"weir_chaos.wasm\"\nworld = \"transform\"\n\
             settings = { mode = \"spin\", trigger = \"spin\" }\ndeadline_ms = 200\n\n[[pipelines]]",
        );
    let host = crate::support::TestHost::start(&base_config(nats.url(), &extra)).await;
    let mut body = String::new();
    for i in 0..6 {
        let note = if i == 3 { ",\"note\":\"spin\"" } else { "" };
        body.push_str(&format!("{{\"key\":\"a\",\"value\":1,\"ts\":{i}{note}}}\n"));
    }
    assert_eq!(host.ingest("events", body).await.status(), 202);
    let reasons = crate::support::dead_letter_reasons(&nats, 1).await;
    assert!(
        reasons[0].contains("plugin `chaos` ran past its deadline"),
        "{reasons:?}"
    );
    let close = "{\"key\":\"a\",\"value\":0,\"ts\":1500}\n";
    assert_eq!(host.ingest("events", close).await.status(), 202);
    let summaries = eventually(Duration::from_secs(30), "window 0's summary", || async {
        let lines = host.sink_lines("windows");
        (!lines.is_empty()).then_some(lines)
    })
    .await;
    let summary: serde_json::Value = serde_json::from_str(&summaries[0]).unwrap();
    assert_eq!(
        (summary["count"].as_u64(), summary["sum"].as_f64()),
        (Some(5), Some(5.0)),
        "{summaries:?}"
    );
    host.shutdown().await;
}
