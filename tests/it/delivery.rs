//! Rows posted at the front door go through JetStream into the plugins and
//! are acked: exactly once to the sink, or into the dead-letter stream.

use std::collections::BTreeSet;
use std::time::Duration;

use weir::delivery::headers;

use crate::support::{Nats, TestHost, backlog, base_config, eventually, orders, read_stream};

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_rows_reach_the_sink_exactly_once_and_the_stream_drains() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;

    for chunk in 0..10 {
        let response = host.ingest("orders", orders(chunk * 1000, 1000)).await;
        assert_eq!(response.status(), 202, "{:?}", response.text().await);
    }

    let lines = eventually(
        Duration::from_secs(60),
        "10,000 rows in the sink",
        || async {
            let lines = host.sink_lines("orders");
            (lines.len() >= 10_000).then_some(lines)
        },
    )
    .await;
    // Let any duplicate show up before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lines = if host.sink_lines("orders").len() != lines.len() {
        host.sink_lines("orders")
    } else {
        lines
    };
    assert_eq!(lines.len(), 10_000, "every row exactly once");
    let ids: BTreeSet<u64> = lines
        .iter()
        .map(|line| {
            let row: serde_json::Value = serde_json::from_str(line).expect("sink wrote JSON");
            assert_eq!(row["email"], "***", "the validator masks email");
            row["id"].as_u64().expect("id")
        })
        .collect();
    assert_eq!(ids, (0..10_000).collect::<BTreeSet<u64>>());

    let client = nats.client().await;
    let drained = eventually(Duration::from_secs(10), "the stream to drain", || async {
        let state = backlog(&client).await;
        (state == (0, 0, 0)).then_some(state)
    })
    .await;
    assert_eq!(
        drained,
        (0, 0, 0),
        "nothing pending, nothing unacked, nothing stored"
    );
    let report = host.host.status().report().await;
    assert_eq!(report.rows.accepted, 10_000);
    assert_eq!(report.rows.delivered, 10_000);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rejected_rows_are_dead_lettered_with_reason_and_original_payload() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;

    let body =
        "{\"id\":1,\"email\":\"a@b.c\"}\n{\"name\":\"no id\",\"email\":\"x@y.z\"}\n{\"id\":3}\n";
    let response = host.ingest("orders", body).await;
    assert_eq!(response.status(), 202);

    let client = nats.client().await;
    let letters = eventually(Duration::from_secs(20), "one dead letter", || async {
        let letters = read_stream(&client, "weir_dlq").await;
        (!letters.is_empty()).then_some(letters)
    })
    .await;
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter.subject.as_str(), "weir.dlq.acme.orders");
    assert_eq!(
        &letter.payload[..],
        b"{\"name\":\"no id\",\"email\":\"x@y.z\"}",
        "original row, unmasked"
    );
    let header = |name: &str| crate::support::header_of(letter, name);
    assert_eq!(header(headers::REASON), "missing required field `id`");
    assert_eq!(header(headers::TENANT), "acme");
    assert_eq!(header(headers::TABLE), "orders");
    assert_eq!(header(headers::PLUGIN), "validate");
    assert_eq!(header(headers::DELIVERIES), "1");
    assert_eq!(header(headers::PLUGIN_VERSION).len(), 12);
    // No delivery header of the server's (a pinned consumer's) in the row.
    assert_eq!(header("Nats-Pin-Id"), "");

    let lines = eventually(Duration::from_secs(20), "two rows in the sink", || async {
        let lines = host.sink_lines("orders");
        (lines.len() >= 2).then_some(lines)
    })
    .await;
    assert_eq!(lines, vec!["{\"id\":1,\"email\":\"***\"}", "{\"id\":3}"]);
    eventually(Duration::from_secs(10), "the stream to drain", || async {
        (backlog(&client).await == (0, 0, 0)).then_some(())
    })
    .await;
    let report = host.host.status().report().await;
    assert_eq!((report.rows.delivered, report.rows.dead_lettered), (2, 1));
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_of_each_table_arrive_in_publish_order_across_interleaved_tables() {
    let nats = Nats::start();
    let tables: Vec<String> = (0..8).map(|t| format!("t{t}")).collect();
    let extra = format!(
        "[[pipelines]]\ntables = [{}]\ntransforms = [\"validate\"]\nsink = \"files\"\n",
        tables
            .iter()
            .map(|t| format!("\"{t}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;

    let (rounds, per_request) = (25, 20);
    for round in 0..rounds {
        for table in &tables {
            let response = host
                .ingest(table, orders(round * per_request, per_request))
                .await;
            assert_eq!(response.status(), 202);
        }
    }
    let expected: Vec<u64> = (0..(rounds * per_request) as u64).collect();
    for table in &tables {
        let ids = eventually(
            Duration::from_secs(30),
            "every row of the table",
            || async {
                let ids = host.sink_ids(table);
                (ids.len() >= expected.len()).then_some(ids)
            },
        )
        .await;
        assert_eq!(ids, expected, "table {table} in publish order");
    }
    // The tables really were spread over more than one unit.
    let client = nats.client().await;
    let busy = crate::support::unit_consumers(&client)
        .await
        .iter()
        .filter(|info| info.delivered.stream_sequence > 0)
        .count();
    assert!(busy > 1, "tables spread over {busy} units");
    host.shutdown().await;
}

/// A valid config needing more instances than the old fixed pool of 256
/// (120 units × 3 steps): the pool is sized from the config, and every row
/// is delivered, none dead-lettered for want of an instance.
#[tokio::test(flavor = "multi_thread")]
async fn a_config_needing_more_than_256_plugin_instances_delivers_every_row() {
    const SHARDS: u64 = 120;
    const TABLES: u64 = 240;
    let nats = Nats::start();
    let extra = "\n[plugins.pass]\nwasm = \"weir_chaos.wasm\"\nworld = \"transform\"\n\
                 settings = { mode = \"pass\" }\n";
    let tables: Vec<String> = (0..TABLES).map(|t| format!("\"t{t}\"")).collect();
    let config = base_config(nats.url(), extra)
        .replace("[stream]\n", &format!("[stream]\nshards = {SHARDS}\n"))
        .replace(
            "tables = [\"orders\"]",
            &format!("tables = [{}]", tables.join(", ")),
        )
        .replace(
            "transforms = [\"validate\"]",
            "transforms = [\"validate\", \"pass\"]",
        );
    let host = TestHost::start(&config).await;
    for t in 0..TABLES {
        let response = host.ingest(&format!("t{t}"), orders(t as usize, 1)).await;
        assert_eq!(response.status(), 202);
    }
    eventually(Duration::from_secs(120), "a row in every table", || async {
        (0..TABLES)
            .all(|t| host.sink_lines(&format!("t{t}")).len() == 1)
            .then_some(())
    })
    .await;
    let client = nats.client().await;
    let letters = read_stream(&client, "weir_dlq").await;
    assert!(
        letters.is_empty(),
        "{} rows dead-lettered, e.g. {:?}",
        letters.len(),
        letters[0].headers
    );
    host.shutdown().await;
}
