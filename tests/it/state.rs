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
