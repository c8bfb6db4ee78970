//! Plugin state (#23, in progress): the window plugin's counts through a
//! real pipeline runner and a real NATS KV bucket, without a host yet.

use weir::config::{Config, Overrides};
use weir::coordination::Lease;
use weir::delivery::batch::{Batch, Position};
use weir::delivery::pipeline::{PipelineRunner, RunError, Verdict};
use weir::nats::kv::{BucketOptions, NatsKv};
use weir::sandbox::Sandbox;
use weir::state::store::{StateStore, scope_key};

use crate::support::{Nats, base_config};

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
    let lease = Lease::until(tokio::time::Instant::now() + std::time::Duration::from_secs(600));
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

/// The window plugin in a `weir run` process, SIGKILLed mid-window and
/// restarted: the window's summary still counts every row exactly once.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "WIP #23: does not finish yet (window 0's summaries never reach the sink); not investigated"]
async fn window_counts_are_exact_across_a_sigkill_mid_window() {
    use crate::support::{ACME_KEY, Host, eventually};
    use std::time::Duration;

    let nats = Nats::start();
    let mut host = Host::spawn_with("h1", base_config(nats.url(), WINDOW));
    let http = reqwest::Client::new();
    let post = |url: String, key: String, body: String| {
        let http = http.clone();
        async move {
            // Until stored: the host may be restarting.
            loop {
                let sent = http
                    .post(format!("{url}/v1/ingest/events"))
                    .bearer_auth(ACME_KEY)
                    .header("Idempotency-Key", key.as_str())
                    .body(body.clone())
                    .send()
                    .await;
                if sent.is_ok_and(|r| r.status() == 202) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let (mut expected_a, mut expected_b) = ((0u64, 0u64), (0u64, 0u64));
    for request in 0..10u64 {
        let mut body = String::new();
        for i in 0..20u64 {
            let (key, value) = if i % 3 == 0 { ("b", 2) } else { ("a", 1) };
            let tally = if key == "a" {
                &mut expected_a
            } else {
                &mut expected_b
            };
            tally.0 += 1;
            tally.1 += value;
            let ts = request * 50 + i;
            body.push_str(&format!(
                "{{\"key\":\"{key}\",\"value\":{value},\"ts\":{ts},\"n\":{request}{i}}}\n"
            ));
        }
        post(host.url.clone(), format!("r{request}"), body).await;
        if request == 4 {
            // Some rows delivered and counted, some not yet.
            tokio::time::sleep(Duration::from_millis(30)).await;
            host.crash_and_restart();
        }
    }
    // A row of the next window closes window 0.
    post(
        host.url.clone(),
        "close".to_string(),
        "{\"key\":\"a\",\"value\":0,\"ts\":1500,\"n\":-1}\n".to_string(),
    )
    .await;
    let output = host.output("windows");
    let summaries = eventually(Duration::from_secs(60), "window 0's summaries", || {
        let output = output.clone();
        async move {
            let text = std::fs::read_to_string(&output).unwrap_or_default();
            let rows: Vec<serde_json::Value> = text
                .lines()
                .filter_map(|line| serde_json::from_str(line).ok())
                .collect();
            let keys: std::collections::BTreeSet<String> = rows
                .iter()
                .filter_map(|r| r["key"].as_str().map(String::from))
                .collect();
            (keys.len() >= 2).then_some(rows)
        }
    })
    .await;
    for summary in &summaries {
        let expected = if summary["key"] == "a" {
            expected_a
        } else {
            expected_b
        };
        assert_eq!(summary["window"], 0, "{summary}");
        assert_eq!(
            (summary["count"].as_u64(), summary["sum"].as_f64()),
            (Some(expected.0), Some(expected.1 as f64)),
            "{summary}; log:\n{}",
            host.log()
        );
    }
}
