//! `weir status` and `/v1/status`: fleet-wide counts from the streams (the
//! same on every host, through a restart), a stalled unit's rows shown on
//! that unit, and answers while NATS is frozen or gone that say so and
//! mark what is unknown as unknown, never 0.

use std::process::Command;
use std::time::{Duration, Instant};

use weir::ops::{FleetTotals, ReasonCount, StatusReport};

use crate::support::{
    ACME_KEY, Host, Nats, TestHost, WEIR, balanced, base_config, eventually, fleet_config,
};

/// Tables posted to in the fleet test, and rows per table (one more row
/// each lacks `id`: the validator dead-letters it).
const TABLES_POSTED: usize = 8;
const ROWS_PER_TABLE: usize = 10;

async fn post(url: &str, table: &str, body: String) {
    let response = reqwest::Client::new()
        .post(format!("{url}/v1/ingest/{table}"))
        .bearer_auth(ACME_KEY)
        .body(body)
        .send()
        .await
        .expect("front door answers");
    assert_eq!(response.status(), 202, "{table}");
}

/// `weir status ARGS…` against `url`: exit success, stdout, stderr.
fn weir_status(url: &str, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(WEIR)
        .args(["status", "--url", url])
        .args(args)
        .output()
        .expect("weir runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn fleet_wide_counts_agree_across_hosts_and_survive_a_restart() {
    let nats = Nats::start();
    let mut a = Host::spawn_with("host-a", fleet_config(nats.url(), "host-a", 0, 5));
    let b = Host::spawn_with("host-b", fleet_config(nats.url(), "host-b", 0, 5));
    balanced(&a, &["host-a", "host-b"]).await;

    // Posted to host-a only: host-b delivers about half of them.
    for t in 0..TABLES_POSTED {
        let mut body: String = (0..ROWS_PER_TABLE)
            .map(|n| format!("{{\"id\":{n}}}\n"))
            .collect();
        body.push_str("{\"no_id\":true}\n");
        post(&a.url, &format!("t{t}"), body).await;
    }
    let accepted = (TABLES_POSTED * (ROWS_PER_TABLE + 1)) as u64;
    let dead = TABLES_POSTED as u64;
    let expected = FleetTotals {
        accepted: Some(accepted),
        settled: Some(accepted),
        delivered: Some(accepted - dead),
        dead_lettered: Some(dead),
        queued: Some(0),
    };
    let settled = |host: &Host| {
        let expected = expected.clone();
        let url = host.url.clone();
        async move {
            let report = weir::client::fetch_status(&url, Some(ACME_KEY))
                .await
                .ok()?;
            (report.drained() && report.totals == expected).then_some(report)
        }
    };
    let from_a = eventually(Duration::from_secs(60), "host-a counts every row", || {
        settled(&a)
    })
    .await;
    let from_b = eventually(Duration::from_secs(10), "host-b counts the same", || {
        settled(&b)
    })
    .await;
    assert_eq!(from_a.summary(), from_b.summary());
    // The first drained report (before any usage snapshot covers the
    // accepts) says what the backlog says: nothing is queued.
    for report in [&from_a, &from_b] {
        assert_eq!(report.tenants.len(), 1, "{:?}", report.tenants);
        assert_eq!(
            (
                report.tenants[0].queued_rows,
                report.tenants[0].queued_bytes
            ),
            (0, 0),
            "{:?}",
            report.tenants
        );
    }
    assert_eq!(
        from_a.summary(),
        format!(
            "accepted {accepted}, delivered {}, dead-lettered {dead}, backlog 0; 2 members, 0 unowned units",
            accepted - dead
        )
    );
    // Each host's own counters differ: host-a accepted every row.
    assert_eq!(from_a.rows.accepted, accepted);
    assert_eq!(from_b.rows.accepted, 0);
    assert_eq!(
        from_b.dead_letters.by_reason,
        [ReasonCount {
            plugin: Some("validate".into()),
            reason: "missing required field `id`".into(),
            count: dead,
        }]
    );
    assert_eq!(from_b.dead_letters.held, Some(dead));

    // After a crash and restart, host-a's own counters start at 0 but the
    // fleet's do not move. The crashed host-a's roster entry and claims
    // outlive it until their lease expires, so host-b can see a balanced
    // fleet before the takeover begins: wait for the restarted host-a's view.
    a.crash_and_restart();
    balanced(&a, &["host-a", "host-b"]).await;
    let restarted = eventually(Duration::from_secs(30), "host-a answers again", || {
        settled(&a)
    })
    .await;
    assert_eq!(restarted.rows.accepted, 0, "host-a's own count restarted");
    // Each host's watch sees the takeover's last claim at its own moment;
    // both settle on the same line, with every row still counted.
    let expected_line = format!(
        "accepted {accepted}, delivered {}, dead-lettered {dead}, backlog 0; 2 members, 0 unowned units\n",
        accepted - dead
    );
    eventually(
        Duration::from_secs(30),
        &format!("both hosts print {expected_line:?}"),
        || async {
            let (ok_a, line_a, err_a) = weir_status(&a.url, &["--brief"]);
            let (ok_b, line_b, err_b) = weir_status(&b.url, &["--brief"]);
            assert!(ok_a && ok_b, "{err_a}{err_b}");
            (line_a == expected_line && line_b == expected_line).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_unit_shows_its_rows_and_the_others_none() {
    let nats = Nats::start();
    // Table `stuck` traps on every delivery and may be retried 1000
    // times: its rows stay on its unit while `orders` drains.
    let extra = "\n[plugins.chaos]\nwasm = \"weir_chaos.wasm\"\nworld = \"transform\"\n\
                 settings = { mode = \"trap\" }\n\n[[pipelines]]\ntables = [\"stuck\"]\n\
                 transforms = [\"chaos\"]\nsink = \"files\"\n";
    let config =
        base_config(nats.url(), extra).replace("max_deliveries = 3", "max_deliveries = 1000");
    let host = TestHost::start(&config).await;
    let stuck: String = (0..20).map(|n| format!("{{\"id\":{n}}}\n")).collect();
    assert_eq!(host.ingest("stuck", stuck).await.status(), 202);
    let orders: String = (0..5).map(|n| format!("{{\"id\":{n}}}\n")).collect();
    assert_eq!(host.ingest("orders", orders).await.status(), 202);

    let unit_rows = |report: &StatusReport| -> Option<Vec<(String, u64)>> {
        report
            .units
            .iter()
            .map(|u| Some((u.consumer.clone(), u.pending? + u.ack_pending?)))
            .collect()
    };
    let (report, busy) = eventually(
        Duration::from_secs(30),
        "orders delivered, stuck's 20 rows on one unit",
        || async {
            let report = host.host.status().report().await;
            let rows = unit_rows(&report)?;
            let busy: Vec<(String, u64)> = rows.into_iter().filter(|(_, n)| *n > 0).collect();
            (host.sink_lines("orders").len() == 5 && busy.len() == 1 && busy[0].1 == 20)
                .then_some((report, busy))
        },
    )
    .await;
    assert!(report.units.len() > 1, "other units exist and show 0");
    assert_eq!(report.backlog(), Some(20));
    assert!(!report.drained());

    // The table names the unit with its rows; waiting says why it failed.
    let url = host.url("");
    let url = url.trim_end_matches('/').to_string();
    let (ok, table, stderr) = tokio::task::spawn_blocking(move || weir_status(&url, &[]))
        .await
        .unwrap();
    assert!(ok, "{stderr}");
    let line = table
        .lines()
        .find(|line| line.starts_with(&busy[0].0))
        .unwrap_or_else(|| panic!("no line for {}:\n{table}", busy[0].0));
    let cells: Vec<&str> = line.split_whitespace().collect();
    let rows: u64 = cells[2].parse::<u64>().unwrap() + cells[3].parse::<u64>().unwrap();
    assert_eq!(rows, 20, "{line}");
    let url = host.url("");
    let url = url.trim_end_matches('/').to_string();
    let (ok, _, stderr) =
        tokio::task::spawn_blocking(move || weir_status(&url, &["--wait-drained", "1"]))
            .await
            .unwrap();
    assert!(!ok);
    assert!(stderr.contains("rows not yet settled"), "{stderr}");

    // `--watch` redraws until Ctrl-C, then exits cleanly.
    let url = host.url("");
    let url = url.trim_end_matches('/').to_string();
    let (status, redraws) = tokio::task::spawn_blocking(move || watch_twice(&url))
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        redraws.iter().all(|line| line.contains("backlog 20;")),
        "{redraws:?}"
    );
    host.shutdown().await;
}

/// Runs `weir status --watch 1 --brief` until it drew twice, then sends
/// it SIGINT: its exit status and the lines it drew.
fn watch_twice(url: &str) -> (std::process::ExitStatus, Vec<String>) {
    use std::io::BufRead;
    let mut watch = Command::new(WEIR)
        .args(["status", "--url", url, "--brief", "--watch", "1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("weir runs");
    let stdout = watch.stdout.take().expect("piped stdout");
    let mut lines = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok);
    let redraws: Vec<String> = lines.by_ref().filter(|l| !l.is_empty()).take(2).collect();
    unsafe { libc::kill(watch.id() as libc::pid_t, libc::SIGINT) };
    // Read on to the end: a closed pipe would stop it by SIGPIPE instead.
    std::thread::spawn(move || lines.for_each(drop));
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(status) = watch.try_wait().expect("weir's status") {
            return (status, redraws);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = watch.kill();
    let _ = watch.wait();
    panic!("weir status --watch still ran 10 s after SIGINT");
}

/// `GET /v1/status` with a client that gives up after 10 s: before the
/// NATS reads were bounded, a frozen server made it take 20 s.
async fn status_within_10_s(url: &str) -> (StatusReport, Duration) {
    let started = Instant::now();
    let report = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("the status answers before the client gives up")
        .json::<StatusReport>()
        .await
        .expect("a status report");
    (report, started.elapsed())
}

fn assert_unknown(report: &StatusReport) {
    assert_eq!(report.totals, FleetTotals::default(), "counts unknown");
    assert!(
        report
            .units
            .iter()
            .all(|u| u.pending.is_none() && u.ack_pending.is_none()),
        "backlogs unknown"
    );
    assert_eq!(report.backlog(), None);
    assert_eq!(report.dead_letters.held, None);
    assert!(!report.nats.answered);
    assert!(!report.fleet.current, "the fleet shown is as last seen");
    assert!(
        report.summary().contains("members ?"),
        "{}",
        report.summary()
    );
    assert!(
        report.summary().contains("backlog ?"),
        "{}",
        report.summary()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn status_answers_while_nats_is_frozen_or_gone_and_says_what_it_cannot_know() {
    let mut nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    let rows: String = (0..5).map(|n| format!("{{\"id\":{n}}}\n")).collect();
    assert_eq!(host.ingest("orders", rows).await.status(), 202);
    eventually(Duration::from_secs(30), "5 rows delivered", || async {
        let report = host.host.status().report().await;
        (report.drained() && report.totals.delivered == Some(5)).then_some(())
    })
    .await;
    let status_url = host.url("/v1/status");
    let base = status_url.trim_end_matches("/v1/status").to_string();

    // Frozen: the client still counts itself connected, NATS just does
    // not answer.
    let pid = nats.server.pid() as libc::pid_t;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // The signal is only queued by `kill`: wait until the kernel says the
    // server stopped (state `T`), or a request may still be answered.
    eventually(Duration::from_secs(5), "nats-server stopped", || async {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let state = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .next()?
            .to_string();
        (state == "T").then_some(())
    })
    .await;
    let (frozen, took) = status_within_10_s(&status_url).await;
    println!("status with NATS frozen: {took:?}");
    assert_unknown(&frozen);
    let started = Instant::now();
    let url = base.clone();
    let (ok, _, stderr) =
        tokio::task::spawn_blocking(move || weir_status(&url, &["--wait-drained", "2"]))
            .await
            .unwrap();
    println!("--wait-drained 2 with NATS frozen: {:?}", started.elapsed());
    assert!(!ok);
    assert!(stderr.contains("backlog unknown"), "{stderr}");
    unsafe { libc::kill(pid, libc::SIGCONT) };

    // Gone: the client sees the socket close and says so.
    nats.server.stop();
    let (gone, took) = eventually(
        Duration::from_secs(20),
        "the status to say NATS is disconnected",
        || async {
            let (report, took) = status_within_10_s(&status_url).await;
            (!report.nats.connected).then_some((report, took))
        },
    )
    .await;
    println!("status with NATS gone: {took:?}");
    assert_unknown(&gone);
    assert!(gone.summary().contains("NATS disconnected"));
    let url = base.clone();
    let (ok, table, _) = tokio::task::spawn_blocking(move || weir_status(&url, &[]))
        .await
        .unwrap();
    assert!(ok);
    assert!(table.contains("DISCONNECTED"), "{table}");
    let started = Instant::now();
    let url = base.clone();
    let (ok, _, stderr) =
        tokio::task::spawn_blocking(move || weir_status(&url, &["--wait-drained", "2"]))
            .await
            .unwrap();
    println!("--wait-drained 2 with NATS gone: {:?}", started.elapsed());
    assert!(!ok);
    assert!(
        stderr.contains("backlog unknown: NATS is disconnected"),
        "{stderr}"
    );

    // Back: the same counts as before, read from the streams again.
    tokio::task::block_in_place(|| nats.restart(Duration::ZERO));
    eventually(Duration::from_secs(30), "the counts back", || async {
        let report = host.host.status().report().await;
        (report.nats.answered && report.totals.delivered == Some(5) && report.drained())
            .then_some(())
    })
    .await;
    host.shutdown().await;
}

/// A member whose renewals stop (SIGSTOP) is marked late by the others
/// while it still counts as a member (its key has not expired), in the
/// status JSON and `weir status`, and unmarked once it renews again.
#[tokio::test(flavor = "multi_thread")]
async fn a_member_whose_renewals_stop_is_marked_late_before_its_key_expires() {
    let nats = Nats::start();
    // 9 s TTL: renewals every 3 s, late after 4.5 s without one, gone at 9.
    let spawn = |id| Host::spawn_with(id, fleet_config(nats.url(), id, 0, 9));
    let (a, b) = (spawn("late-a"), spawn("late-b"));
    balanced(&a, &["late-a", "late-b"]).await;
    let b_of = |report: &StatusReport| {
        report
            .fleet
            .members
            .iter()
            .find(|m| m.id == "late-b")
            .cloned()
    };
    let healthy = b_of(&a.status().await.expect("status")).expect("late-b is a member");
    assert!(!healthy.late, "a renewing member is not late: {healthy:?}");
    assert!(healthy.renewed_ms_ago.is_some_and(|ms| ms < 4_500));

    let pid = b.child.id() as libc::pid_t;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let stopped = Instant::now();
    let late = eventually(Duration::from_secs(20), "late-b marked late", || async {
        b_of(&a.status().await?).filter(|m| m.late)
    })
    .await;
    let marked_after = stopped.elapsed();
    let text = Command::new(WEIR)
        .args(["status", "--url", &a.url])
        .output()
        .expect("weir status runs");
    let text = String::from_utf8_lossy(&text.stdout);
    unsafe { libc::kill(pid, libc::SIGCONT) };
    println!("late-b marked late {marked_after:?} after SIGSTOP: {late:?}");
    assert!(
        text.lines()
            .any(|line| line.starts_with("late-b (late: no renewal for")),
        "weir status marks the member:\n{text}"
    );
    eventually(Duration::from_secs(20), "late-b on time again", || async {
        b_of(&a.status().await?).filter(|m| !m.late)
    })
    .await;
}
