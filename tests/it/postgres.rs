//! The PostgreSQL sink end to end (issue #34): rows posted to the front
//! door land in a real PostgreSQL (a cluster of the test's own) through
//! the shipped `postgres-sink`, in the transaction the host holds for each
//! `deliver` call and commits with the rows it applied. Counted at the
//! destination: every accepted row exactly once, a row that violates a
//! constraint a dead letter naming it, across host crashes, stops and
//! freezes, a NATS restart and a PostgreSQL restart under load.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::destination_faults::{
    AMOUNT_LIMIT, LoadedFleet, assert_exactly_once, signal, sink_fleet_config, violates,
};
use crate::postgres_support::{PgServer, count};
use crate::support::{
    Host, Nats, TestHost, backlog, base_config, dead_letter_reasons, eventually, orders,
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

/// A fleet host whose sink is the postgres sink with `settings`.
fn fleet_host_config(nats_url: &str, id: &str, pg_url: &str, settings: &str) -> String {
    let plugin = format!(
        r#"
[plugins.db]
wasm = "weir_postgres_sink.wasm"
world = "sink"
settings = {settings}
grants.postgres = {{ url = "{pg_url}" }}
"#
    );
    sink_fleet_config(nats_url, id, "db", &plugin)
}

/// The load test's sink settings: table `rows` (no unique key: a row
/// written twice would be counted twice), with the row's tenant and table.
const LOAD_SETTINGS: &str = r#"{ table = "rows", columns = { id = "id", seq = "seq", amount = "amount" }, tenant_column = "tenant", table_column = "tbl" }"#;

#[tokio::test(flavor = "multi_thread")]
async fn every_accepted_row_is_in_postgres_exactly_once_across_host_nats_and_database_faults() {
    let mut pg = tokio::task::block_in_place(PgServer::start);
    let db = pg.client().await;
    // One row in a thousand breaks the CHECK: a statement that violates a
    // constraint, under load, through every fault.
    db.batch_execute(&format!(
        "CREATE TABLE rows (id bigint NOT NULL, tenant text NOT NULL, tbl text NOT NULL, \
         seq bigint NOT NULL, amount integer CONSTRAINT amount_below_limit CHECK (amount < {AMOUNT_LIMIT}))"
    ))
    .await
    .expect("create table");
    let mut nats = Nats::start();
    let mut fleet =
        LoadedFleet::start(|id| fleet_host_config(nats.url(), id, &pg.url(), LOAD_SETTINGS)).await;
    fleet.host_faults().await;

    tokio::task::block_in_place(|| {
        pg.kill();
        std::thread::sleep(Duration::from_secs(2));
        pg.start_again();
    });
    fleet
        .after("PostgreSQL killed (immediate), restarted after 2 s")
        .await;
    tokio::task::block_in_place(|| nats.restart(Duration::from_secs(2)));
    fleet.after("nats-server restarted after 2 s").await;

    // The load goes on until 100k rows are in, however busy the machine.
    let db = pg.client().await;
    eventually(Duration::from_secs(300), "100k rows written", || async {
        let written = db
            .query_one("SELECT count(*) FROM rows", &[])
            .await
            .ok()?
            .get::<_, i64>(0);
        (written >= 100_000).then_some(())
    })
    .await;

    let (accepted, load) = fleet.stop_load().await;
    let client = nats.client().await;
    fleet.settled(&client).await;

    let found: BTreeMap<(String, u64), usize> = db
        .query(
            "SELECT tenant, id, count(*) FROM rows GROUP BY tenant, id",
            &[],
        )
        .await
        .expect("read rows")
        .iter()
        .map(|row| {
            let (tenant, id, n): (String, i64, i64) = (row.get(0), row.get(1), row.get(2));
            ((tenant, id as u64), n as usize)
        })
        .collect();
    // The rows that break the CHECK are expected as dead letters, the
    // others in the table.
    let refused: BTreeSet<(&str, u64)> = accepted
        .iter()
        .flat_map(|(tenant, ids)| ids.iter().map(move |id| (*tenant, *id)))
        .filter(|(_, id)| violates(*id))
        .collect();
    let mut expected = accepted.clone();
    for ids in expected.values_mut() {
        ids.retain(|id| !violates(*id));
    }
    let total: usize = accepted.values().map(BTreeSet::len).sum();

    let letters = crate::support::read_stream(&client, "weir_dlq").await;
    let mut lettered: BTreeMap<(String, u64), usize> = BTreeMap::new();
    let mut reasons = BTreeSet::new();
    for letter in &letters {
        let header = |name: &str| crate::support::header_of(letter, name);
        let row: serde_json::Value =
            serde_json::from_slice(&letter.payload).expect("a dead letter's row is JSON");
        let id = row["id"].as_u64().expect("a dead letter's row has an id");
        *lettered
            .entry((header(weir::delivery::headers::TENANT), id))
            .or_default() += 1;
        reasons.insert(header(weir::delivery::headers::REASON));
    }
    println!(
        "postgres fleet: {total} rows accepted in {:.1} s, {} of them breaking the CHECK; \
         {} rows written ({} distinct tenant+id); {} dead letters ({} distinct rows); faults: {}",
        load.as_secs_f64(),
        refused.len(),
        found.values().sum::<usize>(),
        found.len(),
        letters.len(),
        lettered.len(),
        fleet.faults.join("; ")
    );
    if found.values().any(|&n| n > 1) {
        let overlaps = db
            .query(
                "SELECT a.unit, s, count(*), array_agg(a.claim) FROM weir_applied a, unnest(a.seqs) s \
                 GROUP BY a.unit, s HAVING count(*) > 1 LIMIT 10",
                &[],
            )
            .await
            .expect("read the ledger");
        for row in overlaps {
            let (unit, seq, n, claims): (String, i64, i64, Vec<i64>) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            println!("ledger: {unit} seq {seq} applied {n} times, claims {claims:?}");
        }
    }
    assert_exactly_once("written", total, &expected, &found, &fleet.hosts);

    // Every accepted row that breaks the CHECK is a dead letter naming it,
    // none is in the table, and no other row is a dead letter. (A row a
    // host dead-lettered and could not ack before a fault is lettered
    // again when redelivered: the letters count deliveries, not rows.)
    assert!(!refused.is_empty(), "no accepted row broke the CHECK");
    for reason in &reasons {
        assert!(
            reason.contains("amount_below_limit") && reason.contains("23514"),
            "a dead letter does not name the constraint: {reason}"
        );
    }
    let missing: Vec<&(&str, u64)> = refused
        .iter()
        .filter(|(tenant, id)| !lettered.contains_key(&(tenant.to_string(), *id)))
        .collect();
    assert!(
        missing.is_empty(),
        "{} rows breaking the CHECK are no dead letters: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    let wrongly: Vec<&(String, u64)> = lettered.keys().filter(|(_, id)| !violates(*id)).collect();
    assert!(
        wrongly.is_empty(),
        "rows dead-lettered that break no constraint: {wrongly:?}"
    );
    let written_anyway: Vec<&(String, u64)> =
        found.keys().filter(|(_, id)| violates(*id)).collect();
    assert!(
        written_anyway.is_empty(),
        "rows breaking the CHECK were written: {written_anyway:?}"
    );
}

/// The owner of the fleet's only unit, as `observer` sees it.
async fn owner_of_the_unit(observer: &Host) -> Option<String> {
    let report = observer.status().await?;
    report.units.first()?.owner.clone()
}

/// Backends of `weir` waiting on a lock while inserting into `fenced`.
async fn inserts_waiting(db: &tokio_postgres::Client) -> i64 {
    db.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'weir' \
         AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO \"fenced\"%'",
        &[],
    )
    .await
    .expect("read pg_stat_activity")
    .get(0)
}

/// The frozen-host test's sink settings: table `fenced`.
const FENCED_SETTINGS: &str =
    r#"{ table = "fenced", columns = { id = "id", seq = "seq" }, table_column = "tbl" }"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_host_frozen_inside_a_deliver_call_cannot_commit_after_its_unit_was_taken_over() {
    let pg = tokio::task::block_in_place(PgServer::start);
    let db = pg.client().await;
    db.batch_execute(
        "CREATE TABLE fenced (id bigint NOT NULL, tbl text NOT NULL, seq bigint NOT NULL)",
    )
    .await
    .expect("create table");
    let nats = Nats::start();
    // One unit, so the frozen host's rows are the ones taken over; a
    // deadline long enough that the blocked call is still running when
    // the host is frozen and thawed.
    let config = |id: &str| {
        fleet_host_config(nats.url(), id, &pg.url(), FENCED_SETTINGS)
            .replace(
                &format!(
                    "partitions = {}\nshards = {}\n",
                    crate::support::PARTITIONS,
                    crate::support::SHARDS
                ),
                "partitions = 1\nshards = 1\n",
            )
            .replace(
                "world = \"sink\"\nsettings = { table",
                "world = \"sink\"\ndeadline = \"60s\"\nsettings = { table",
            )
    };
    let first = Host::spawn_with("h1", config("h1"));
    let start = Instant::now();
    while owner_of_the_unit(&first).await.as_deref() != Some("h1") {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "h1 does not own the unit: {:?}\n{}",
            first.status().await.map(|s| s.units),
            first.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let second = Host::spawn_with("h2", config("h2"));
    // Both members, and the unit's owner the same a second apart (the
    // assignment may hand it to h2): that owner is frozen, the other takes over.
    let settled_owner = || async {
        let report = second.status().await?;
        let members = report
            .fleet
            .members
            .iter()
            .filter(|m| m.id == "h1" || m.id == "h2")
            .count();
        (members == 2).then_some(())?;
        report.units.first()?.owner.clone()
    };
    let owner_id = eventually(
        Duration::from_secs(120),
        "h2 is a member and the unit settled",
        || async {
            let before = settled_owner().await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            (settled_owner().await? == before).then_some(before)
        },
    )
    .await;
    let (owner, other) = if owner_id == "h1" {
        (&first, &second)
    } else {
        (&second, &first)
    };

    // The table is locked: the owner's insert waits inside its deliver call.
    let mut locker = pg.client().await;
    let lock = locker.transaction().await.expect("begin");
    lock.batch_execute("LOCK TABLE fenced IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock the table");
    let body: String = (0..10)
        .map(|id| format!("{{\"id\":{id},\"seq\":{id},\"email\":\"u{id}@example.com\"}}\n"))
        .collect();
    let http = reqwest::Client::new();
    let response = http
        .post(format!("{}/v1/ingest/t0", other.url))
        .bearer_auth(crate::support::ACME_KEY)
        .body(body)
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 202);
    eventually(
        Duration::from_secs(30),
        "h1's insert waits on the lock",
        || async { (inserts_waiting(&db).await == 1).then_some(()) },
    )
    .await;

    // Frozen inside the call, past its member TTL: h2 takes the unit over
    // and its insert of the same rows waits on the lock too.
    signal(owner, libc::SIGSTOP);
    eventually(Duration::from_secs(60), "h2 took the unit over", || async {
        (owner_of_the_unit(other).await? == other.id).then_some(())
    })
    .await;
    eventually(
        Duration::from_secs(60),
        "h2's insert waits on the lock",
        || async { (inserts_waiting(&db).await == 2).then_some(()) },
    )
    .await;
    lock.commit().await.expect("release the lock");
    eventually(Duration::from_secs(30), "h2 committed the rows", || async {
        (count(&db, "fenced").await == 10).then_some(())
    })
    .await;

    // Thawed, h1's call returns with its insert done in its transaction:
    // its commit is refused and nothing is written twice.
    signal(owner, libc::SIGCONT);
    // (It steps down at once, abandoning the call: its connection closes
    // and the database rolls the transaction back, long before the
    // server's own `idle_in_transaction` would end it. Or the call, whose
    // insert finished while it was frozen, reaches its commit first, and
    // the fence refuses it there: the same promise, by the other path.)
    let thawed = Instant::now();
    loop {
        let log = owner.log();
        let abandoned = log.contains("stepping down")
            && (log.contains("a call's transaction was abandoned before its commit")
                || log.contains("not committed: the unit is not this host's"));
        let open: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'weir' \
                 AND state = 'idle in transaction'",
                &[],
            )
            .await
            .expect("read pg_stat_activity")
            .get(0);
        if abandoned && open == 0 {
            break;
        }
        assert!(
            thawed.elapsed() < Duration::from_secs(20),
            "h1's transaction is not rolled back ({open} open):\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = nats.client().await;
    eventually(Duration::from_secs(60), "every row settled", || async {
        (backlog(&client).await == (0, 0, 0)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(count(&db, "fenced").await, 10, "a row was written twice");
    let distinct: i64 = db
        .query_one("SELECT count(DISTINCT id) FROM fenced", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(distinct, 10);
    drop(locker);
}
