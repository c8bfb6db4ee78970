//! Plugin state (#23, in progress): the window plugin's counts through a
//! real pipeline runner and a real NATS KV bucket, without a host yet.

use weir::config::{Config, Overrides};
use weir::coordination::Lease;
use weir::delivery::batch::{Batch, Position};
use weir::delivery::pipeline::{PipelineRunner, RunError, Verdict};
use weir::nats::kv::{BucketOptions, NatsKv};
use weir::sandbox::Sandbox;
use weir::state::store::{StateStore, scope_key};

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::{ACME_KEY, Host, Nats, balanced, base_config, eventually};

const WINDOW: &str = r#"
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

#[tokio::test(flavor = "multi_thread")]
async fn window_counts_survive_replays_and_a_second_writer_is_fenced() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, base_config(nats.url(), WINDOW)).unwrap();
    let config = Config::load(&path, &Overrides::default()).unwrap();
    let sandbox = Sandbox::new(weir::telemetry::Metrics::default()).unwrap();
    let plugin = sandbox.load(&config.plugins["window"]).await.unwrap();
    let pipeline = weir::config::Pipeline {
        sink: None,
        ..config.pipeline_for("events").unwrap().clone()
    };
    let client = nats.client().await;
    let kv = NatsKv::open_or_create(&client, &BucketOptions::new("weir_state"))
        .await
        .unwrap();
    let store = StateStore::new(kv);
    let runner = || PipelineRunner::new(&pipeline, |_| Some(plugin.clone()), Some(&store)).unwrap();
    let lease = Lease::until(tokio::time::Instant::now() + Duration::from_secs(600));
    let tally = |tenant: &'static str, key: &'static str| {
        let store = store.clone();
        async move {
            let stored = store
                .load(&scope_key(tenant, "window", "events"))
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
    let verdicts = first.run(batch.clone(), &lease).await.unwrap();
    assert!(
        verdicts.iter().all(|v| matches!(v, Verdict::Done)),
        "{verdicts:?}"
    );
    assert_eq!(tally("acme", "a").await.as_deref(), Some("2,3"));

    // The same rows again (their acks were lost): acked, not counted twice,
    // by this runner and by a new owner that reads the state afresh.
    first.run(batch.clone(), &lease).await.unwrap();
    let mut second = runner();
    second.run(batch, &lease).await.unwrap();
    assert_eq!(tally("acme", "a").await.as_deref(), Some("2,3"));
    assert_eq!(tally("acme", "b").await.as_deref(), Some("1,5"));

    // Another tenant's rows of the same table see none of it.
    second
        .run(rows("globex", &[(4, "a", 7, 30)]), &lease)
        .await
        .unwrap();
    assert_eq!(tally("globex", "a").await.as_deref(), Some("1,7"));
    assert_eq!(tally("acme", "a").await.as_deref(), Some("2,3"));

    // The second owner wrote acme's scope after the first read it: the
    // first is fenced, and its write is not stored.
    second
        .run(rows("acme", &[(5, "a", 10, 40)]), &lease)
        .await
        .unwrap();
    let fenced = first.run(rows("acme", &[(6, "a", 100, 50)]), &lease).await;
    assert!(matches!(fenced, Err(RunError::Fenced)), "{fenced:?}");
    assert_eq!(tally("acme", "a").await.as_deref(), Some("3,13"));

    // A row of the next window closes this one: its tallies start again.
    second
        .run(rows("acme", &[(7, "a", 4, 1500)]), &lease)
        .await
        .unwrap();
    assert_eq!(tally("acme", "a").await.as_deref(), Some("1,4"));
    assert_eq!(tally("acme", "b").await, None);
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
    let post = |url: String, key: String, body: String| {
        let http = http.clone();
        async move {
            // Until stored: the host may be restarting or handing over.
            loop {
                let sent = http
                    .post(format!("{url}/v1/ingest/events"))
                    .bearer_auth(ACME_KEY)
                    .header("Idempotency-Key", key.as_str())
                    .body(body.clone())
                    .send()
                    .await;
                match sent.map(|r| r.status().as_u16()) {
                    Ok(202) => return,
                    Ok(status @ 400..500) => panic!("the request was refused: {status}"),
                    _ => {}
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let client = nats.client().await;
    let store = StateStore::new(
        NatsKv::open_or_create(&client, &BucketOptions::new("weir_state"))
            .await
            .unwrap(),
    );
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
        let live = hosts.last().unwrap().url.clone();
        post(live, format!("r{request}"), body).await;
        if request == 4 {
            // Once some of the window's rows are counted, some maybe not yet.
            eventually(Duration::from_secs(30), "rows counted", || async {
                let stored = store.load(&scope_key("acme", "window", "events")).await;
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
    let live = hosts.last().unwrap().url.clone();
    let close = "{\"key\":\"a\",\"value\":0,\"ts\":1500,\"n\":\"close\"}\n";
    post(live, "close".to_string(), close.to_string()).await;
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
}
