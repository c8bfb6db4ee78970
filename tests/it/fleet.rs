//! A fleet of real `weir` processes sharing 32 units on one nats-server:
//! two hosts split the units evenly, a third joins by handover, one is
//! SIGKILLed under load and taken over, one leaves on SIGTERM. Every row
//! published is delivered; duplicates come only from rows in flight at the
//! kill. Takeover and handover times are printed, not asserted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use weir::ops::StatusReport;

use crate::support::{
    ACME_KEY, Host, Nats, PRODUCERS, TABLES, TestHost, all_tables, balanced, by_id, delivered,
    eventually, every_table_grows, fleet_config, produce, size, sizes, tables_of, written,
};

const MEMBER_TTL_SECS: u64 = 5;

/// A fleet host as member `id`.
fn spawn(nats_url: &str, id: &'static str) -> Host {
    Host::spawn_with(id, fleet_config(nats_url, id, 0, MEMBER_TTL_SECS))
}

/// Time until one of `tables` gets a new row in one of `hosts`' outputs.
async fn first_row(hosts: &[&Host], tables: &[String], since: Instant) -> Duration {
    let before: Vec<u64> = hosts
        .iter()
        .flat_map(|h| tables.iter().map(|t| size(&h.output(t))))
        .collect();
    eventually(Duration::from_secs(30), "a row of a moved unit", || async {
        let now: Vec<u64> = hosts
            .iter()
            .flat_map(|h| tables.iter().map(|t| size(&h.output(t))))
            .collect();
        (now != before).then(|| since.elapsed())
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_splits_units_hands_over_on_join_and_leave_and_takes_over_a_killed_host() {
    let nats = Nats::start();
    let a = spawn(nats.url(), "host-a");
    let b = spawn(nats.url(), "host-b");
    let owners = balanced(&a, &["host-a", "host-b"]).await;
    assert_eq!(owners["host-a"].len(), 16);
    assert_eq!(owners["host-b"].len(), 16);

    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| tokio::spawn(produce(a.url.clone(), p, stop.clone())))
        .collect();
    let (tables, dirs) = (all_tables(), [a.dir.path(), b.dir.path()]);
    every_table_grows(&dirs, &tables, &[0; TABLES], "rows on every unit").await;

    // A third host joins: it takes its share by handover.
    let joined = Instant::now();
    let c = spawn(nats.url(), "host-c");
    let owners = balanced(&a, &["host-a", "host-b", "host-c"]).await;
    let join_settled = joined.elapsed();
    // Every unit handed over has delivered since: a row the old owner
    // delivered and the new one repeated would be in the outputs now.
    let c_tables = tables_of(&owners["host-c"]);
    let what = "host-c delivers on every unit it took";
    every_table_grows(&[c.dir.path()], &c_tables, &vec![0; c_tables.len()], what).await;
    let before_kill = delivered(&[&a, &b, &c]);
    let handover_duplicates = before_kill.values().filter(|h| h.len() > 1).count();

    // SIGKILL under load: the others take b's units over.
    let b_tables = tables_of(&owners["host-b"]);
    let survivors = [a.dir.path(), c.dir.path()];
    let before_takeover = sizes(&survivors, &b_tables);
    let killed = Instant::now();
    let mut b = b;
    b.child.kill().unwrap();
    let takeover = first_row(&[&a, &c], &b_tables, killed).await;
    balanced(&a, &["host-a", "host-c"]).await;
    let what = "every unit of the killed host delivers again";
    every_table_grows(&survivors, &b_tables, &before_takeover, what).await;

    // SIGTERM: c hands its units to a.
    let owners = balanced(&a, &["host-a", "host-c"]).await;
    let c_tables = tables_of(&owners["host-c"]);
    let terminated = Instant::now();
    c.terminate();
    let handover = first_row(&[&a], &c_tables, terminated).await;
    balanced(&a, &["host-a"]).await;

    stop.store(true, Ordering::Relaxed);
    let mut accepted = Vec::new();
    for producer in producers {
        accepted.extend(producer.await.unwrap());
    }
    eventually(Duration::from_secs(60), "every row settled", || async {
        a.status().await.filter(StatusReport::drained)
    })
    .await;

    let seen = delivered(&[&a, &b, &c]);
    let missing: Vec<&u64> = accepted
        .iter()
        .filter(|id| !seen.contains_key(id))
        .collect();
    let duplicates: Vec<(&u64, &Vec<&str>)> = seen.iter().filter(|(_, h)| h.len() > 1).collect();
    println!(
        "fleet: {} rows accepted, {} delivered, {} duplicates (all from the kill); \
         join settled in {join_settled:?}; SIGKILL -> first row of a dead host's unit {takeover:?} \
         (member TTL {MEMBER_TTL_SECS} s); SIGTERM -> next owner's first row {handover:?}",
        accepted.len(),
        seen.len(),
        duplicates.len()
    );
    assert!(accepted.len() > 1000, "the producer kept going");
    assert!(
        missing.is_empty(),
        "{} rows never delivered, e.g. {:?}\n{}",
        missing.len(),
        &missing[..missing.len().min(5)],
        a.log()
    );
    assert_eq!(handover_duplicates, 0, "a join by handover repeats nothing");
    for (id, hosts) in &duplicates {
        // Only rows the killed host had in flight are seen twice: once by
        // it, once by its unit's next owner.
        assert!(
            hosts.len() == 2 && hosts.contains(&"host-b"),
            "row {id} delivered by {hosts:?}"
        );
    }
}

/// NATS goes away for longer than the member TTL while rows flow: both
/// hosts step down, rejoin when it is back and take their units over again.
/// No row accepted is lost, and no unit is pulled by two hosts at once: the
/// rows of each table go to one host at a time (a few switches around the
/// outage, never an interleaving).
#[tokio::test(flavor = "multi_thread")]
async fn a_nats_restart_loses_no_row_and_no_unit_is_pulled_twice() {
    let mut nats = Nats::start();
    let a = TestHost::start(&fleet_config(nats.url(), "host-a", 0, 3)).await;
    let b = TestHost::start(&fleet_config(nats.url(), "host-b", 0, 3)).await;
    eventually(
        Duration::from_secs(20),
        "both hosts share the units",
        || async {
            let report = a.host.status().report().await;
            (report.fleet.members.len() == 2 && report.fleet.unowned.is_empty()).then_some(())
        },
    )
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let url = a.url("");
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| tokio::spawn(produce(url.clone(), p, stop.clone())))
        .collect();
    let (tables, dirs) = (all_tables(), [a.dir.path(), b.dir.path()]);
    every_table_grows(&dirs, &tables, &[0; TABLES], "rows on every unit").await;
    // Longer than the 3 s TTL: every lease runs out while NATS is away.
    tokio::task::block_in_place(|| nats.restart(Duration::from_secs(4)));
    let before_rejoin = sizes(&dirs, &tables);
    eventually(
        Duration::from_secs(30),
        "the fleet is whole again",
        || async {
            let report = a.host.status().report().await;
            (report.fleet.members.len() == 2 && report.fleet.unowned.is_empty()).then_some(())
        },
    )
    .await;
    let what = "rows on every unit after the restart";
    every_table_grows(&dirs, &tables, &before_rejoin, what).await;
    stop.store(true, Ordering::Relaxed);
    let mut accepted = Vec::new();
    for producer in producers {
        accepted.extend(producer.await.unwrap());
    }
    eventually(Duration::from_secs(60), "every row settled", || async {
        a.host.status().report().await.drained().then_some(())
    })
    .await;

    let tables = written(&[("host-a", a.dir.path()), ("host-b", b.dir.path())]);
    let seen = by_id(&tables);
    let missing = accepted.iter().filter(|id| !seen.contains_key(id)).count();
    let duplicates = seen.values().filter(|hosts| hosts.len() > 1).count();
    let mut most_switches = 0;
    for rows in tables.values() {
        let mut rows = rows.clone();
        rows.sort();
        rows.dedup_by_key(|(id, _)| *id);
        let switches = rows.windows(2).filter(|w| w[0].1 != w[1].1).count();
        most_switches = most_switches.max(switches);
    }
    println!(
        "nats restart: {} rows accepted, {} delivered, {duplicates} delivered twice \
         (acks lost with the server), at most {most_switches} owner switches per table",
        accepted.len(),
        seen.len()
    );
    assert!(accepted.len() > 1000, "the producer kept going");
    assert_eq!(missing, 0, "rows accepted and never delivered");
    assert!(
        most_switches <= 4,
        "a table's rows alternate between hosts {most_switches} times: a unit was pulled twice"
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// A lone host SIGKILLed with rows in flight and started again at once:
/// its own previous run's unacked rows come back at takeover, long before
/// the 120 s ack wait would return them.
#[tokio::test(flavor = "multi_thread")]
async fn a_lone_host_restarted_after_a_crash_gets_its_rows_back_without_waiting_out_the_ack_wait() {
    let nats = Nats::start();
    // Every batch takes 3 s in a plugin: rows are in flight at the kill.
    let slow = "\n[plugins.slow]\nwasm = \"weir_chaos.wasm\"\nworld = \"transform\"\n\
                deadline_ms = 10000\nsettings = { mode = \"slow\", slow_ms = 3000 }\n";
    let config = (fleet_config(nats.url(), "host-a", 0, MEMBER_TTL_SECS) + slow)
        .replace(
            "transforms = [\"validate\"]",
            "transforms = [\"validate\", \"slow\"]",
        )
        .replace("[delivery]\n", "[delivery]\nack_wait_secs = 120\n");
    let mut host = Host::spawn_with("host-a", config);
    balanced(&host, &["host-a"]).await;

    let http = reqwest::Client::new();
    let mut accepted = Vec::new();
    for request in 0..40u64 {
        let ids: Vec<u64> = (request * 50..request * 50 + 50).collect();
        let body: String = ids
            .iter()
            .map(|id| format!("{{\"id\":{id},\"email\":\"u{id}@example.com\"}}\n"))
            .collect();
        let table = format!("t{}", request % TABLES as u64);
        let response = http
            .post(format!("{}/v1/ingest/{table}", host.url))
            .bearer_auth(ACME_KEY)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
        accepted.extend(ids);
    }
    // The first batches are in the slow plugin.
    let in_flight = eventually(
        Duration::from_secs(30),
        "rows in flight in the slow plugin",
        || async {
            let report = host.status().await?;
            let in_flight: u64 = report.units.iter().filter_map(|u| u.ack_pending).sum();
            (in_flight > 0).then_some(in_flight)
        },
    )
    .await;
    let crashed = Instant::now();
    host.crash_and_restart();
    let dirs = [(host.id, host.dir.path())];
    // Well inside the ack wait: only a takeover can bring the rows back.
    let recovered = eventually(Duration::from_secs(60), "every row delivered", || async {
        let seen = by_id(&written(&dirs));
        accepted
            .iter()
            .all(|id| seen.contains_key(id))
            .then(|| crashed.elapsed())
    })
    .await;
    println!(
        "lone restart: {in_flight} rows in flight at the SIGKILL; all {} rows delivered \
         {recovered:?} after it (ack wait 120 s)",
        accepted.len()
    );
}

/// `weir_unit_takeovers_total` on `host`'s `/metrics`.
async fn takeovers(host: &Host) -> Option<u64> {
    let text = reqwest::get(format!("{}/metrics", host.url))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("weir_unit_takeovers_total "))
        .and_then(|value| value.trim().parse().ok())
}

/// A SIGKILLed member's units change owner without a release: each is a
/// takeover on the host that claims it, whether rows were in flight or not
/// (here none: nothing is sent).
#[tokio::test(flavor = "multi_thread")]
async fn a_sigkill_takeover_is_counted_even_with_no_rows_in_flight() {
    let nats = Nats::start();
    let a = spawn(nats.url(), "host-a");
    let mut b = spawn(nats.url(), "host-b");
    let owners = balanced(&a, &["host-a", "host-b"]).await;
    assert_eq!(takeovers(&a).await, Some(0));
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    balanced(&a, &["host-a"]).await;
    let counted = eventually(Duration::from_secs(20), "the takeovers counted", || async {
        takeovers(&a)
            .await
            .filter(|&n| n as usize >= owners["host-b"].len())
    })
    .await;
    assert_eq!(counted as usize, owners["host-b"].len());
}
