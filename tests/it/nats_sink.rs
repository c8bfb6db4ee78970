//! The NATS sink end to end (issue #34): rows posted to the front door are
//! published by the shipped `nats-sink`, through the host's own connection
//! and the sink's `grants.nats`, into a JetStream stream of the test's on
//! the same nats-server. Counted at the destination by the rows' ids:
//! every accepted row exactly once, its headers kept, a subject outside
//! the grant refused, across host crashes, stops and freezes and a NATS
//! restart under load (the message ids make the target drop the copies a
//! redelivery publishes again).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt;
use weir::topology::{Names, Unit};

use crate::destination_faults::{LoadedFleet, assert_exactly_once, sink_fleet_config};
use crate::support::{
    Nats, TestHost, backlog, base_config, dead_letter_reasons, eventually, orders,
};

/// The target: stream `AUDIT` on `audit.>`, dropping a message id seen
/// within the last two minutes (longer than every fault below).
async fn audit_stream(client: &async_nats::Client) {
    jetstream::new(client.clone())
        .create_stream(stream::Config {
            name: "AUDIT".into(),
            subjects: vec!["audit.>".into()],
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .expect("create the target stream");
}

/// Every message of stream `name`, read in pages.
async fn read_all(client: &async_nats::Client, name: &str) -> Vec<jetstream::Message> {
    let js = jetstream::new(client.clone());
    let mut stream = js.get_stream(name).await.expect("target stream");
    let count = stream.info().await.expect("stream info").state.messages as usize;
    let reader = stream
        .create_consumer(consumer::pull::Config {
            ack_policy: consumer::AckPolicy::None,
            deliver_policy: consumer::DeliverPolicy::All,
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .expect("reader consumer");
    let mut found = Vec::with_capacity(count);
    while found.len() < count {
        let mut page = reader
            .fetch()
            .max_messages((count - found.len()).min(10_000))
            .expires(Duration::from_secs(5))
            .messages()
            .await
            .expect("fetch");
        let before = found.len();
        while let Some(message) = page.next().await {
            found.push(message.expect("message"));
        }
        assert!(
            found.len() > before,
            "stream {name}: a page came back empty"
        );
    }
    found
}

/// A message's row id (the `id` field of its JSON payload) and its `Nats-Msg-Id`.
fn id_of(message: &jetstream::Message) -> (u64, String) {
    let row: serde_json::Value = serde_json::from_slice(&message.payload).expect("a JSON row");
    let id = row["id"].as_u64().expect("an id");
    let msg_id = message
        .headers
        .as_ref()
        .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
        .map(|v| v.to_string())
        .unwrap_or_default();
    (id, msg_id)
}

/// Waits until every row is settled (nothing pending, unacked or stored).
async fn settled(nats: &Nats) {
    let client = nats.client().await;
    eventually(Duration::from_secs(60), "every row settled", || async {
        (backlog(&client).await == (0, 0, 0)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_are_published_once_with_their_headers_and_a_subject_outside_the_grant_is_refused() {
    let nats = Nats::start();
    let client = nats.client().await;
    audit_stream(&client).await;
    let extra = r#"
[plugins.bus]
wasm = "weir_nats_sink.wasm"
world = "sink"
settings = { subject = "audit.{tenant}.{table}.{id}", headers = { source = "weir" } }
grants.nats = { publish = ["audit.>"] }

[plugins.leak]
wasm = "weir_nats_sink.wasm"
world = "sink"
settings = { subject = "other.{table}" }
grants.nats = { publish = ["audit.>"] }

[[pipelines]]
tables = ["events"]
sink = "bus"

[[pipelines]]
tables = ["leaks"]
sink = "leak"
"#;
    let config = base_config(nats.url(), extra).replace(
        "[stream]\ncreate = true",
        "[stream]\ncreate = true\npartitions = 1",
    );
    let host = TestHost::start(&config).await;

    let response = host.ingest("events", orders(0, 200)).await;
    assert_eq!(response.status(), 202);
    // A row with a header of its own, stored as the front door would.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("trace", "t-1");
    let subject = Names::new("weir", 1, 1).subject(
        Unit {
            partition: 0,
            shard: 0,
        },
        "acme",
        "events",
    );
    jetstream::new(client.clone())
        .publish_with_headers(subject, headers, r#"{"id":1000}"#.into())
        .await
        .expect("publish a row")
        .await
        .expect("stored");
    let response = host.ingest("leaks", orders(0, 2)).await;
    assert_eq!(response.status(), 202);
    settled(&nats).await;

    let messages = read_all(&client, "AUDIT").await;
    let mut by_id: BTreeMap<u64, usize> = BTreeMap::new();
    let mut msg_ids = BTreeSet::new();
    for message in &messages {
        let (id, msg_id) = id_of(message);
        *by_id.entry(id).or_default() += 1;
        assert!(msg_id.starts_with("weir_in_0:"), "{msg_id}");
        msg_ids.insert(msg_id);
        assert_eq!(message.subject.as_str(), format!("audit.acme.events.{id}"));
        let headers = message.headers.as_ref().expect("headers");
        assert_eq!(headers.get("source").map(|v| v.as_str()), Some("weir"));
    }
    let expected: BTreeSet<u64> = (0..200).chain([1000]).collect();
    assert_eq!(by_id.keys().copied().collect::<BTreeSet<_>>(), expected);
    assert!(by_id.values().all(|&n| n == 1), "a row published twice");
    assert_eq!(msg_ids.len(), messages.len());
    let traced = messages
        .iter()
        .find(|m| id_of(m).0 == 1000)
        .and_then(|m| m.headers.as_ref())
        .and_then(|h| h.get("trace"))
        .map(|v| v.to_string());
    assert_eq!(
        traced.as_deref(),
        Some("t-1"),
        "the row's header was not kept"
    );

    let reasons = dead_letter_reasons(&nats, 2).await;
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    for reason in &reasons {
        assert!(
            reason.contains("subject `other.leaks` is not in its grants.nats.publish (audit.>)"),
            "{reason}"
        );
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_core_nats_rows_reach_a_subscriber_listening_and_a_subject_outside_the_grant_is_refused()
{
    let nats = Nats::start();
    let client = nats.client().await;
    // No stream takes `audit.>`: a JetStream publish would get no PubAck
    // and its rows would never be acked.
    let extra = r#"
[plugins.bus]
wasm = "weir_nats_sink.wasm"
world = "sink"
settings = { subject = "audit.{tenant}.{table}.{id}" }
grants.nats = { publish = ["audit.>"], jetstream = false }

[plugins.leak]
wasm = "weir_nats_sink.wasm"
world = "sink"
settings = { subject = "other.{table}" }
grants.nats = { publish = ["audit.>"], jetstream = false }

[[pipelines]]
tables = ["events"]
sink = "bus"

[[pipelines]]
tables = ["leaks"]
sink = "leak"
"#;
    let config = base_config(nats.url(), extra).replace(
        "[stream]\ncreate = true",
        "[stream]\ncreate = true\npartitions = 1",
    );
    let host = TestHost::start(&config).await;

    // Nobody listens yet: the rows are published, acked, and gone.
    let response = host.ingest("events", orders(1000, 10)).await;
    assert_eq!(response.status(), 202);
    settled(&nats).await;

    let mut subscriber = client.subscribe("audit.>").await.expect("subscribe");
    client.flush().await.expect("flush the subscription");
    let response = host.ingest("events", orders(0, 200)).await;
    assert_eq!(response.status(), 202);
    settled(&nats).await;
    let mut by_id: BTreeMap<u64, usize> = BTreeMap::new();
    let mut msg_ids = BTreeSet::new();
    // Every row was flushed before its ack: all are at the server by now,
    // and anything more than the 200 would come within the grace second.
    while let Ok(Some(message)) =
        tokio::time::timeout(Duration::from_secs(1), subscriber.next()).await
    {
        let row: serde_json::Value = serde_json::from_slice(&message.payload).expect("a JSON row");
        let id = row["id"].as_u64().expect("an id");
        assert_eq!(message.subject.as_str(), format!("audit.acme.events.{id}"));
        let msg_id = message
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.to_string())
            .unwrap_or_default();
        assert!(msg_id.starts_with("weir_in_0:"), "{msg_id}");
        msg_ids.insert(msg_id);
        *by_id.entry(id).or_default() += 1;
    }
    let expected: BTreeSet<u64> = (0..200).collect();
    assert_eq!(
        by_id.keys().copied().collect::<BTreeSet<_>>(),
        expected,
        "the subscriber got other rows than those posted while it listened"
    );
    assert!(
        by_id.values().all(|&n| n == 1),
        "a row arrived twice without a fault"
    );
    assert_eq!(msg_ids.len(), 200);

    let response = host.ingest("leaks", orders(0, 2)).await;
    assert_eq!(response.status(), 202);
    let reasons = dead_letter_reasons(&nats, 2).await;
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    for reason in &reasons {
        assert!(
            reason.contains("subject `other.leaks` is not in its grants.nats.publish (audit.>)"),
            "{reason}"
        );
    }
    host.shutdown().await;
}

/// A fleet host whose sink is the NATS sink publishing every row to
/// `audit.<tenant>.<table>`.
fn fleet_host_config(nats_url: &str, id: &str) -> String {
    let plugin = r#"
[plugins.bus]
wasm = "weir_nats_sink.wasm"
world = "sink"
settings = { subject = "audit.{tenant}.{table}" }
grants.nats = { publish = ["audit.>"] }
"#;
    sink_fleet_config(nats_url, id, "bus", plugin)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_accepted_row_is_in_the_target_stream_exactly_once_across_host_and_nats_faults() {
    let mut nats = Nats::start();
    audit_stream(&nats.client().await).await;
    let mut fleet = LoadedFleet::start(|id| fleet_host_config(nats.url(), id)).await;
    fleet.host_faults().await;
    tokio::task::block_in_place(|| nats.restart(Duration::from_secs(2)));
    fleet.after("nats-server restarted after 2 s").await;

    // The load goes on until the target holds 100k rows, however fast
    // this machine takes them.
    let client = nats.client().await;
    let js = jetstream::new(client.clone());
    eventually(Duration::from_secs(300), "100k rows published", || async {
        let mut audit = js.get_stream("AUDIT").await.ok()?;
        let stored = audit.info().await.ok()?.state.messages;
        (stored >= 100_000).then_some(())
    })
    .await;
    let (accepted, load) = fleet.stop_load().await;
    fleet.settled(&client).await;

    let messages = read_all(&client, "AUDIT").await;
    // (tenant, id) → how many messages, the tenant from the subject.
    let mut found: BTreeMap<(String, u64), usize> = BTreeMap::new();
    let mut msg_ids = BTreeSet::new();
    for message in &messages {
        let (id, msg_id) = id_of(message);
        let tenant = message
            .subject
            .split('.')
            .nth(1)
            .unwrap_or_default()
            .to_string();
        *found.entry((tenant, id)).or_default() += 1;
        msg_ids.insert(msg_id);
    }
    let total: usize = accepted.values().map(BTreeSet::len).sum();
    let dead_letters = crate::support::read_stream(&client, "weir_dlq").await.len();
    println!(
        "nats fleet: {total} rows accepted in {:.1} s, {} messages in the target, \
         {} distinct tenant+id, {} distinct message ids, {} dead letters; faults: {}",
        load.as_secs_f64(),
        messages.len(),
        found.len(),
        msg_ids.len(),
        dead_letters,
        fleet.faults.join("; ")
    );
    assert_exactly_once("published", total, &accepted, &found, &fleet.hosts);
    assert_eq!(msg_ids.len(), messages.len());
    assert_eq!(dead_letters, 0);
}
