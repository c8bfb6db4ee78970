//! Against an operator's NATS, weir creates nothing: it boots on the
//! manifests it prints, names every required difference, and runs with
//! exactly the permissions it prints.

use std::process::Command;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use weir::host::StartError;
use weir::topology::manifest::TopologyError;

use crate::support::{Nats, TestHost, base_config, eventually, orders, start_error};

const WEIR: &str = env!("CARGO_BIN_EXE_weir");

/// The base config without `create = true`: weir only verifies.
fn operator_config(nats_url: &str) -> String {
    base_config(nats_url, "").replace("[stream]\ncreate = true\n", "")
}

/// Runs `weir mq WHAT --config FILE [ARGS]` and parses its JSON.
fn weir_mq(what: &str, config_text: &str, args: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, config_text).unwrap();
    let output = Command::new(WEIR)
        .args(["mq", what, "--config"])
        .arg(&path)
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("weir mq prints JSON")
}

/// What an operator does with `weir mq manifests`: create each object.
async fn apply_manifests(client: &async_nats::Client, manifests: &serde_json::Value) {
    let js = jetstream::new(client.clone());
    for config in manifests["streams"].as_array().unwrap() {
        let config: stream::Config = serde_json::from_value(config.clone()).unwrap();
        js.create_stream(config)
            .await
            .expect("operator creates the stream");
    }
    for entry in manifests["consumers"].as_array().unwrap() {
        let config: consumer::pull::Config =
            serde_json::from_value(entry["config"].clone()).unwrap();
        let stream = js
            .get_stream(entry["stream"].as_str().unwrap())
            .await
            .unwrap();
        stream
            .create_consumer(config)
            .await
            .expect("operator creates the consumer");
    }
    for bucket in manifests["buckets"].as_array().unwrap() {
        let markers = &bucket["limit_markers"];
        js.create_key_value(async_nats::jetstream::kv::Config {
            bucket: bucket["bucket"].as_str().unwrap().to_string(),
            history: bucket["history"].as_i64().unwrap(),
            limit_markers: Some(Duration::from_secs(markers["secs"].as_u64().unwrap())),
            ..Default::default()
        })
        .await
        .expect("operator creates the coordination bucket");
    }
}

async fn deliver_one_request(host: &TestHost) {
    assert_eq!(host.ingest("orders", orders(0, 10)).await.status(), 202);
    eventually(Duration::from_secs(20), "10 rows delivered", || async {
        (host.sink_lines("orders").len() == 10).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn weir_boots_on_the_printed_manifests_and_refuses_a_changed_required_field() {
    let nats = Nats::start();
    let config = operator_config(nats.url());

    // Nothing applied yet: every object is named as missing.
    let err = start_error(&config).await;
    let message = err.to_string();
    assert!(
        matches!(err, StartError::Topology(TopologyError::Mismatch(_))),
        "{err}"
    );
    assert!(
        message.contains("stream weir_in_0: existence expected present"),
        "{message}"
    );
    assert!(
        message.contains("consumer weir_in_0/weir_in_0_3: existence expected present"),
        "{message}"
    );

    let client = nats.client().await;
    apply_manifests(&client, &weir_mq("manifests", &config, &[])).await;
    let host = TestHost::start(&config).await;
    deliver_one_request(&host).await;
    host.shutdown().await;

    // The operator recreates the partition with the wrong retention.
    let js = jetstream::new(client.clone());
    let mut wrong: stream::Config = js
        .get_stream("weir_in_0")
        .await
        .unwrap()
        .cached_info()
        .config
        .clone();
    js.delete_stream("weir_in_0").await.unwrap();
    wrong.retention = stream::RetentionPolicy::Limits;
    js.create_stream(wrong).await.unwrap();
    let message = start_error(&config).await.to_string();
    assert!(
        message.contains("stream weir_in_0: retention expected WorkQueue, found Limits (required)"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_runs_with_exactly_the_printed_permissions_which_cannot_delete_a_stream() {
    let config_for = |url: &str| operator_config(url);
    let permissions = weir_mq("permissions", &config_for("nats://127.0.0.1:1"), &[]);
    // A second user lacks one subject weir needs.
    let mut partial = permissions.clone();
    partial["publish"]["allow"]
        .as_array_mut()
        .unwrap()
        .retain(|subject| subject != "$JS.API.STREAM.INFO.weir_in_0");
    let server_config = format!(
        "accounts {{\n  APP {{\n    jetstream: enabled\n    users: [\n      {{ user: admin, password: admin-secret }}\n      {{ user: weir, password: weir-secret, permissions: {permissions} }}\n      {{ user: partial, password: partial-secret, permissions: {partial} }}\n    ]\n  }}\n}}\n"
    );
    let nats = Nats::start_with(&server_config);
    let port = nats.server.port();
    let admin =
        async_nats::ConnectOptions::with_user_and_password("admin".into(), "admin-secret".into())
            .connect(format!("nats://127.0.0.1:{port}"))
            .await
            .unwrap();
    let weir_url = format!("nats://weir:weir-secret@127.0.0.1:{port}");
    let config = config_for(&weir_url);
    apply_manifests(&admin, &weir_mq("manifests", &config, &[])).await;

    let host = TestHost::start(&config).await;
    deliver_one_request(&host).await;
    let letters = host.ingest("orders", "{\"no_id\":true}\n").await;
    assert_eq!(letters.status(), 202);
    eventually(Duration::from_secs(20), "a dead letter stored", || async {
        let js = jetstream::new(admin.clone());
        let mut dlq = js.get_stream("weir_dlq").await.ok()?;
        (dlq.info().await.ok()?.state.messages == 1).then_some(())
    })
    .await;
    host.shutdown().await;

    // A user without one permission is refused at boot, naming it.
    let message = start_error(&config_for(&format!(
        "nats://partial:partial-secret@127.0.0.1:{port}"
    )))
    .await
    .to_string();
    assert!(
        message.contains("Permissions Violation for Publish to \"$JS.API.STREAM.INFO.weir_in_0\""),
        "{message}"
    );

    let as_weir =
        async_nats::ConnectOptions::with_user_and_password("weir".into(), "weir-secret".into())
            .request_timeout(Some(Duration::from_secs(2)))
            .connect(format!("nats://127.0.0.1:{port}"))
            .await
            .unwrap();
    let deleted = jetstream::new(as_weir).delete_stream("weir_in_0").await;
    assert!(deleted.is_err(), "weir's user must not delete a stream");
    let js = jetstream::new(admin);
    assert!(
        js.get_stream("weir_in_0").await.is_ok(),
        "the stream is still there"
    );
}

#[test]
fn manifests_for_nack_are_kubernetes_resources_and_a_file_store_budget_adds_up() {
    let nack = weir_mq(
        "manifests",
        "[stream]\npartitions = 2\nshards = 3\n",
        &["--format", "nack", "--file-store", "10G"],
    );
    let items = nack["items"].as_array().unwrap();
    assert_eq!(
        items.len(),
        3 + 6 + 1,
        "3 streams, 6 consumers and the coordination bucket"
    );
    assert_eq!(items[9]["kind"], "KeyValue");
    assert_eq!(items[9]["spec"]["bucket"], "weir_coord");
    assert_eq!(items[1]["kind"], "Stream");
    assert_eq!(items[1]["metadata"]["name"], "weir-in-0");
    assert_eq!(items[1]["spec"]["retention"], "workqueue");
    let total: i64 = items
        .iter()
        .filter_map(|i| i["spec"]["maxBytes"].as_i64())
        .sum();
    assert_eq!(total, 10 << 30);
    assert_eq!(items[8]["spec"]["filterSubject"], "weir.in.1.2.>");
}
