//! Against an operator's NATS, weir creates nothing: it boots on the
//! manifests it prints, names every required difference, and runs with
//! exactly the permissions it prints.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use futures::StreamExt;

use weir::config::Config;
use weir::host::StartError;
use weir::ops::{ANSWER_BOUND, PROBE_EVERY};
use weir::topology::{Manifest, Names, TopologyError};

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

/// What an operator does with `weir mq manifests --out DIR`: each file,
/// as it is, to the JetStream API (`nats stream add --config FILE`,
/// `nats consumer add STREAM --config FILE` send the same requests).
async fn apply_manifests(client: &async_nats::Client, config_text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("weir.toml");
    std::fs::write(&config_path, config_text).unwrap();
    let out = dir.path().join("manifests");
    let output = Command::new(WEIR)
        .args(["mq", "manifests", "--config"])
        .arg(&config_path)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut files: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    // Streams before the consumers on them.
    files.sort_by_key(|path| {
        !path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("stream-")
    });
    let mut kinds = (0, 0);
    for path in files {
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read(&path).unwrap();
        let config: serde_json::Value = serde_json::from_slice(&text).unwrap();
        let name = config["name"].as_str().unwrap().to_string();
        let (subject, body) = if file.starts_with("stream-") {
            kinds.0 += 1;
            (format!("$JS.API.STREAM.CREATE.{name}"), text)
        } else {
            kinds.1 += 1;
            let stream = file
                .strip_prefix("consumer-")
                .and_then(|rest| rest.strip_suffix(&format!("-{name}.json")))
                .expect("consumer-STREAM-NAME.json");
            let request = serde_json::json!({ "stream_name": stream, "config": config });
            (
                format!("$JS.API.CONSUMER.CREATE.{stream}.{name}"),
                serde_json::to_vec(&request).unwrap(),
            )
        };
        let reply = client.request(subject, body.into()).await.unwrap();
        let reply: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
        assert!(reply.get("error").is_none(), "{file}: {reply}");
    }
    assert_eq!(
        kinds,
        (9, 4),
        "4 partitions, dead letters, coordination and state buckets, plugin and compiled stores; a consumer per unit"
    );
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
        message.contains("consumer weir_in_3/weir_in_3_0: existence expected present"),
        "{message}"
    );

    let client = nats.client().await;
    apply_manifests(&client, &config).await;
    // Not even a recommended difference between the files and the config.
    let loaded = Config::parse(Path::new("weir.toml"), &config, &Default::default()).unwrap();
    let router = Names::new(
        &loaded.stream.prefix,
        loaded.stream.partitions,
        loaded.stream.shards,
    );
    let manifest = Manifest::new(&router, &loaded.stream, &loaded.delivery, None);
    let differences = manifest.verify(&jetstream::new(client.clone())).await;
    assert!(differences.is_empty(), "{differences:#?}");
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

/// A server holding weir's old default topology (1 partition × 4 shards),
/// with rows in it: weir on the new default (4 × 1) refuses to start,
/// names the other topology's units and the setting that keeps it, and
/// changes nothing; with that setting it delivers the rows.
#[tokio::test(flavor = "multi_thread")]
async fn a_topology_of_the_old_default_is_refused_by_name_and_its_rows_kept() {
    let nats = Nats::start();
    let client = nats.client().await;
    let js = jetstream::new(client.clone());
    let new_default = base_config(nats.url(), "");
    let old_default = new_default.replace("[stream]\n", "[stream]\npartitions = 1\nshards = 4\n");
    let old = Config::parse(Path::new("weir.toml"), &old_default, &Default::default()).unwrap();
    let router = Names::new(&old.stream.prefix, 1, 4);
    Manifest::new(&router, &old.stream, &old.delivery, None)
        .create(&js)
        .await
        .unwrap();
    let unit = router.route("acme", "orders");
    store_orders(&js, &router, unit, 10).await;

    let err = start_error(&new_default).await;
    let message = err.to_string();
    assert!(
        matches!(
            err,
            StartError::Topology(TopologyError::OtherTopology(ref found)) if found.len() == 3
        ),
        "shards 1 to 3 of partition 0 are not units of 4 × 1: {err}"
    );
    for expected in [
        "consumer weir_in_0/weir_in_0_3: existence expected absent",
        "set `[stream] partitions = 1` and `shards = 4`",
    ] {
        assert!(message.contains(expected), "no `{expected}` in: {message}");
    }
    assert!(
        js.get_stream("weir_in_1").await.is_err(),
        "a refused start creates nothing"
    );

    let host = TestHost::start(&old_default).await;
    eventually(
        Duration::from_secs(20),
        "the 10 stored rows delivered",
        || async { (host.sink_lines("orders").len() == 10).then_some(()) },
    )
    .await;
    host.shutdown().await;
}

/// An operator's topology from a release whose unit consumers were pinned
/// (a pinned-client priority group), with rows stored and a pin held by a
/// host of that release that took three rows and stopped answering: the
/// upgraded host boots on it, and its first claim creates each unit's
/// consumer afresh, unpinned, so every row is delivered at once, the
/// three held ones first.
#[tokio::test(flavor = "multi_thread")]
async fn units_pinned_by_an_older_release_are_taken_unpinned_with_every_row() {
    use async_nats::jetstream::consumer;
    let nats = Nats::start();
    let client = nats.client().await;
    let js = jetstream::new(client.clone());
    let config = operator_config(nats.url());
    let loaded = Config::parse(Path::new("weir.toml"), &config, &Default::default()).unwrap();
    let router = Names::new(
        &loaded.stream.prefix,
        loaded.stream.partitions,
        loaded.stream.shards,
    );
    let mut old = Manifest::new(&router, &loaded.stream, &loaded.delivery, None);
    for unit in &mut old.consumers {
        unit.config.priority_policy = consumer::PriorityPolicy::PinnedClient;
        unit.config.priority_groups = vec!["weir".into()];
        unit.config.priority_timeout = Duration::from_secs(15);
    }
    old.create(&js).await.unwrap();
    let unit = router.route("acme", "orders");
    store_orders(&js, &router, unit, 10).await;
    // The old host: pinned, three rows taken, never answered.
    let inbox = client.new_inbox();
    let mut old_host = client.subscribe(inbox.clone()).await.unwrap();
    let (stream, name) = (
        router.partition_stream(unit.partition),
        router.unit_consumer(unit),
    );
    client
        .publish_with_reply(
            format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}"),
            inbox,
            r#"{"batch":3,"expires":30000000000,"group":"weir"}"#.into(),
        )
        .await
        .unwrap();
    for _ in 0..3 {
        let row = old_host.next().await.unwrap();
        assert!(row.headers.is_some_and(|h| h.get("Nats-Pin-Id").is_some()));
    }

    let host = TestHost::start(&config).await;
    let ids = eventually(
        Duration::from_secs(15),
        "the 10 stored rows delivered (under the old pin's 15 s and the 30 s ack wait)",
        || async {
            let ids = host.sink_ids("orders");
            (ids.len() == 10).then_some(ids)
        },
    )
    .await;
    assert_eq!(ids, (0..10).collect::<Vec<_>>(), "in stream order");
    for unit in router.units() {
        let info = js
            .get_stream(router.partition_stream(unit.partition))
            .await
            .unwrap()
            .consumer_info(router.unit_consumer(unit))
            .await
            .unwrap();
        assert_eq!(
            info.config.priority_policy,
            consumer::PriorityPolicy::None,
            "{}",
            info.name
        );
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_runs_with_exactly_the_printed_permissions_which_cannot_delete_a_stream() {
    // With a sink granted a JetStream publish: its subjects and PubAcks too.
    let config_for = |url: &str| format!("{}{AUDIT_SINK}", operator_config(url));
    let permissions = weir_mq("permissions", &config_for("nats://127.0.0.1:1"), &[]);
    let without = |missing: &str| {
        let mut partial = permissions.clone();
        partial["publish"]["allow"]
            .as_array_mut()
            .unwrap()
            .retain(|subject| subject != missing);
        partial
    };
    // A second user lacks one subject weir needs; a third has the
    // permissions an earlier weir printed, without the readiness probe's.
    let partial = without("$JS.API.STREAM.INFO.weir_in_0");
    let earlier = without("weir.readyz");
    let server_config = format!(
        "accounts {{\n  APP {{\n    jetstream: enabled\n    users: [\n      {{ user: admin, password: admin-secret }}\n      {{ user: weir, password: weir-secret, permissions: {permissions} }}\n      {{ user: partial, password: partial-secret, permissions: {partial} }}\n      {{ user: earlier, password: earlier-secret, permissions: {earlier} }}\n    ]\n  }}\n}}\n"
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
    apply_manifests(&admin, &config).await;

    // The target stream is the operator's (the manifests only note it).
    jetstream::new(admin.clone())
        .create_stream(jetstream::stream::Config {
            name: "AUDIT".into(),
            subjects: vec!["audit.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();

    let host = TestHost::start(&config).await;
    deliver_one_request(&host).await;
    // Ready past its probes' bound: their round trips are allowed too.
    tokio::time::sleep(ANSWER_BOUND + 2 * PROBE_EVERY).await;
    let ready = host.http.get(host.url("/readyz")).send().await.unwrap();
    let status = ready.status();
    assert_eq!(status, 200, "{}", ready.text().await.unwrap_or_default());
    let response = host.ingest("events", "{\"id\":1}\n").await;
    assert_eq!(response.status(), 202);
    eventually(
        Duration::from_secs(20),
        "a row published to AUDIT",
        || async {
            let js = jetstream::new(admin.clone());
            let mut audit = js.get_stream("AUDIT").await.ok()?;
            (audit.info().await.ok()?.state.messages == 1).then_some(())
        },
    )
    .await;
    let letters = host.ingest("orders", "{\"no_id\":true}\n").await;
    assert_eq!(letters.status(), 202);
    eventually(Duration::from_secs(20), "a dead letter stored", || async {
        let js = jetstream::new(admin.clone());
        let mut dlq = js.get_stream("weir_dlq").await.ok()?;
        (dlq.info().await.ok()?.state.messages == 1).then_some(())
    })
    .await;
    // Its status reads the streams and the dead letters' reasons with
    // these permissions too.
    let report = eventually(
        Duration::from_secs(20),
        "a status that counts it",
        || async {
            let report = host.host.status().report().await;
            (report.totals.dead_lettered == Some(1)).then_some(report)
        },
    )
    .await;
    assert!(report.nats.answered, "{:?}", report.nats);
    assert_eq!(report.dead_letters.scanned, Some(1));
    assert_eq!(report.dead_letters.by_reason[0].count, 1);
    host.shutdown().await;

    // A user without one permission is refused at boot, naming it, as
    // soon as the server says so: not after the refused requests' timeouts
    // (30 s before).
    let booting = Instant::now();
    let message = start_error(&config_for(&format!(
        "nats://partial:partial-secret@127.0.0.1:{port}"
    )))
    .await
    .to_string();
    let refused_after = booting.elapsed();
    assert!(
        refused_after < Duration::from_secs(15),
        "refused after {refused_after:?}"
    );
    assert!(
        message.contains("Permissions Violation for Publish to \"$JS.API.STREAM.INFO.weir_in_0\""),
        "{message}"
    );
    // Without the readiness subject it would boot and never be ready: the
    // boot names it instead.
    let message = start_error(&config_for(&format!(
        "nats://earlier:earlier-secret@127.0.0.1:{port}"
    )))
    .await
    .to_string();
    assert!(
        message.contains("Permissions Violation for Publish to \"weir.readyz\""),
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

/// The NATS sink publishing table `events` to `audit.<table>`.
const AUDIT_SINK: &str = r#"
[plugins.bus]
wasm = "weir_nats_sink.wasm"
world = "sink"
settings = { subject = "audit.{table}" }
grants.nats = { publish = ["audit.>"] }

[[pipelines]]
tables = ["events"]
sink = "bus"
"#;

#[test]
fn manifests_note_the_stream_a_granted_jetstream_publish_needs_and_create_none() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    let core = AUDIT_SINK
        .replace("[plugins.bus]", "[plugins.wire]")
        .replace("audit.>\"] }", "wire.>\"], jetstream = false }")
        .replace("audit.{table}", "wire.{table}")
        .replace(
            "tables = [\"events\"]\nsink = \"bus\"",
            "tables = [\"wires\"]\nsink = \"wire\"",
        );
    let config = format!(
        "{}{AUDIT_SINK}{core}",
        operator_config("nats://127.0.0.1:1")
    );
    std::fs::write(&path, config).unwrap();
    let output = Command::new(WEIR)
        .args(["mq", "manifests", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "note: plugin `bus` publishes to audit.> through JetStream (grants.nats): \
             a stream of yours, not in these manifests, must take these subjects"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("note: plugin `wire` publishes to wire.> on core NATS"),
        "{stderr}"
    );
    let manifests: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("stdout is the manifests' JSON");
    let subjects: Vec<&str> = manifests["streams"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|stream| stream["subjects"].as_array().unwrap())
        .filter_map(|subject| subject.as_str())
        .collect();
    assert!(
        subjects
            .iter()
            .all(|s| !s.starts_with("audit") && !s.starts_with("wire")),
        "{subjects:?}"
    );
}

#[test]
fn manifests_for_nack_are_kubernetes_resources_and_a_file_store_budget_adds_up() {
    let nack = weir_mq(
        "manifests",
        "[stream]\npartitions = 2\nshards = 3\n",
        &["--format", "nack", "--file-store", "10GB"],
    );
    let items = nack["items"].as_array().unwrap();
    assert_eq!(
        items.len(),
        3 + 6 + 2 + 2,
        "3 streams, 6 consumers, the coordination and state buckets, the plugin and compiled stores"
    );
    assert_eq!(items[9]["kind"], "KeyValue");
    assert_eq!(items[9]["spec"]["bucket"], "weir_coord");
    assert_eq!(items[10]["kind"], "KeyValue");
    assert_eq!(items[10]["spec"]["bucket"], "weir_state");
    assert_eq!(items[11]["kind"], "ObjectStore");
    assert_eq!(items[11]["spec"]["bucket"], "weir_plugins");
    assert_eq!(items[12]["kind"], "ObjectStore");
    assert_eq!(items[12]["spec"]["bucket"], "weir_compiled");
    assert_eq!(items[12]["spec"]["ttl"], "2592000s", "30 days");
    // Unit consumers are durable pull consumers of every row, unpinned:
    // each claim creates its unit's afresh.
    for consumer in &items[3..9] {
        assert_eq!(consumer["spec"]["deliverPolicy"], "all", "{consumer}");
        assert_eq!(consumer["spec"]["maxDeliver"], -1, "{consumer}");
        assert!(
            consumer["spec"].get("priorityPolicy").is_none(),
            "{consumer}"
        );
    }
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

/// Stores `count` acme orders rows (ids 0..count) straight in `unit`'s
/// partition, as a host of an earlier release left them.
async fn store_orders(
    js: &jetstream::Context,
    router: &Names,
    unit: weir::topology::Unit,
    count: u64,
) {
    for id in 0..count {
        js.publish(
            router.subject(unit, "acme", "orders"),
            format!("{{\"id\":{id}}}").into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
}
