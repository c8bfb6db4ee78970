//! Delivery semantics: a poison row is isolated from its batch, a row that
//! keeps failing is dead-lettered with its count and can be replayed after a
//! fix, and a long batch keeps its rows from being redelivered.

use std::process::Command;
use std::time::Duration;

use async_nats::jetstream;
use weir::delivery::{DeadLetters, LetterFilter};
use weir::ops::StatusReport;
use weir::topology::Names;

use crate::support::{
    ACME_KEY, Host, Nats, TestHost, backlog, base_config, dead_letter_reasons, eventually, orders,
    read_stream,
};

const WEIR: &str = env!("CARGO_BIN_EXE_weir");

/// A pipeline for `table`: the chaos plugin with `settings`, then the sink.
fn chaos(table: &str, settings: &str, limits: &str) -> String {
    format!(
        "[plugins.chaos_{table}]\nwasm = \"weir_chaos.wasm\"\nworld = \"transform\"\nsettings = {{ {settings} }}\n{limits}\n\n[[pipelines]]\ntables = [\"{table}\"]\ntransforms = [\"chaos_{table}\"]\nsink = \"files\"\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn one_poison_row_in_a_batch_of_500_is_dead_lettered_and_the_other_499_delivered() {
    let nats = Nats::start();
    let extra = chaos("mixed", "mode = \"trap\", trigger = \"poison\"", "");
    let config = base_config(nats.url(), &extra)
        .replace("batch_wait_ms = 5", "batch_wait_ms = 200\nbatch_rows = 500")
        .replace("failure_delay_ms = 100", "failure_delay_ms = 50");
    let host = TestHost::start(&config).await;

    let mut body = orders(0, 250);
    body.push_str("{\"id\":\"poison\"}\n");
    body.push_str(&orders(250, 249));
    assert_eq!(host.ingest("mixed", body).await.status(), 202);

    let lines = eventually(Duration::from_secs(30), "499 rows delivered", || async {
        let lines = host.sink_lines("mixed");
        (lines.len() >= 499).then_some(lines)
    })
    .await;
    assert_eq!(lines.len(), 499);
    assert!(lines.iter().all(|line| !line.contains("poison")));

    let client = nats.client().await;
    let letters = eventually(
        Duration::from_secs(30),
        "the poison row dead-lettered",
        || async {
            let letters = read_stream(&client, "weir_dlq").await;
            (!letters.is_empty()).then_some(letters)
        },
    )
    .await;
    assert_eq!(letters.len(), 1);
    assert_eq!(&letters[0].payload[..], b"{\"id\":\"poison\"}");
    let reason = letters[0]
        .headers
        .as_ref()
        .unwrap()
        .get("Weir-Reason")
        .unwrap()
        .to_string();
    assert!(
        reason.starts_with("gave up after 3 deliveries: plugin `chaos_mixed` trapped")
            && reason.contains("chaos: trapping on purpose"),
        "{reason}"
    );
    eventually(Duration::from_secs(10), "the stream drained", || async {
        (backlog(&client).await == (0, 0, 0)).then_some(())
    })
    .await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_row_that_keeps_asking_for_retry_is_dead_lettered_and_replayed_after_a_fix() {
    let nats = Nats::start();
    let broken = base_config(
        nats.url(),
        &chaos("flaky", "mode = \"retry\", trigger = \"again\"", ""),
    );
    let host = TestHost::start(&broken).await;
    let body = "{\"id\":1,\"note\":\"again\"}\n{\"id\":2}\n";
    assert_eq!(host.ingest("flaky", body).await.status(), 202);

    let client = nats.client().await;
    let letters = DeadLetters::new(jetstream::new(client.clone()), Names::new("weir", 1, 4));
    let listed = eventually(Duration::from_secs(30), "the row dead-lettered", || async {
        let listed = letters.list(&LetterFilter::default()).await.ok()?;
        (!listed.is_empty()).then_some(listed)
    })
    .await;
    let letter = &listed[0];
    assert_eq!(
        (letter.tenant.as_str(), letter.table.as_str()),
        ("acme", "flaky")
    );
    assert_eq!(
        letter.deliveries, 3,
        "max_deliveries is 3 in the test config"
    );
    assert!(
        letter
            .reason
            .starts_with("gave up after 3 deliveries: plugin `chaos_flaky` asked for a retry"),
        "{}",
        letter.reason
    );
    assert_eq!(host.sink_lines("flaky"), vec!["{\"id\":2}"]);
    host.shutdown().await;

    // The plugin is fixed (it passes every row); the operator replays.
    let fixed = base_config(nats.url(), &chaos("flaky", "mode = \"pass\"", ""));
    let host = TestHost::start(&fixed).await;
    let config_path = host.dir.path().join("weir.toml");
    let output = tokio::task::block_in_place(|| {
        Command::new(WEIR)
            .args([
                "dlq",
                "replay",
                "--table",
                "flaky",
                "--nats-url",
                nats.url(),
                "--config",
            ])
            .arg(&config_path)
            .output()
            .unwrap()
    });
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("1 dead letter replayed"));
    eventually(
        Duration::from_secs(20),
        "the replayed row delivered",
        || async {
            (host.sink_lines("flaky") == vec!["{\"id\":1,\"note\":\"again\"}".to_string()])
                .then_some(())
        },
    )
    .await;
    assert!(
        letters
            .list(&LetterFilter::default())
            .await
            .unwrap()
            .is_empty(),
        "the dead letter is gone"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_that_outlives_the_ack_wait_is_not_redelivered_while_it_runs() {
    slow_batches_are_not_redelivered("ack_wait_secs = 1", 3500, 3).await;
}

/// One-row batches from ten-row pull requests: the rows received for the
/// next batches wait in the host while a slow batch runs, past the ack
/// wait, and must be kept alive too.
#[tokio::test(flavor = "multi_thread")]
async fn rows_received_for_later_batches_are_kept_alive_while_a_batch_runs() {
    slow_batches_are_not_redelivered("ack_wait_secs = 1\nbatch_rows = 1\npull_rows = 10", 1500, 3)
        .await;
}

/// Batches shorter than the keep-alive period, so none ticks on its own:
/// the rows received for the last ones still wait past the ack wait in all,
/// and must be answered as each batch starts.
#[tokio::test(flavor = "multi_thread")]
async fn rows_waiting_through_many_short_batches_are_kept_alive() {
    slow_batches_are_not_redelivered("ack_wait_secs = 1\nbatch_rows = 1\npull_rows = 10", 250, 8)
        .await;
}

/// Runs `rows` rows through a plugin that takes `slow_ms` per batch, with
/// `delivery` settings, and checks every row was delivered exactly once.
async fn slow_batches_are_not_redelivered(delivery: &str, slow_ms: u64, rows: usize) {
    let nats = Nats::start();
    let extra = chaos(
        "slow",
        &format!("mode = \"slow\", slow_ms = {slow_ms}"),
        "deadline_ms = 10000",
    );
    let config = base_config(nats.url(), &extra)
        .replace("[delivery]\n", &format!("[delivery]\n{delivery}\n"));
    let host = TestHost::start(&config).await;
    assert_eq!(host.ingest("slow", orders(0, rows)).await.status(), 202);

    eventually(Duration::from_secs(30), "every row delivered", || async {
        (host.sink_lines("slow").len() >= rows).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        host.sink_lines("slow").len(),
        rows,
        "delivered once, not again after the ack wait"
    );
    let client = nats.client().await;
    for info in crate::support::unit_consumers(&client).await {
        assert_eq!(info.num_redelivered, 0, "{} redelivered rows", info.name);
    }
    let report = host.host.status().report().await;
    assert_eq!(report.rows.retried, 0);
    host.shutdown().await;
}

/// Whatever failed a row (a trap, the deadline, the memory cap, retries
/// asked for until `max_deliveries`, or a plugin's own verdict), its dead
/// letter names the plugin and the version that failed it.
#[tokio::test(flavor = "multi_thread")]
async fn every_dead_letter_names_the_plugin_and_version_that_failed_it() {
    let nats = Nats::start();
    let failing = [
        ("trap", "mode = \"trap\"", ""),
        ("spin", "mode = \"spin\"", "deadline_ms = 200"),
        ("grow", "mode = \"grow\", grow_mb = 256", "memory_mb = 32"),
        ("flaky", "mode = \"retry\"", ""),
    ];
    let extra: String = failing
        .iter()
        .map(|(table, settings, limits)| chaos(table, settings, limits))
        .collect();
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;
    for (table, ..) in failing {
        assert_eq!(host.ingest(table, "{\"id\":1}\n").await.status(), 202);
    }
    // `validate` dead-letters a row without `id` itself.
    assert_eq!(host.ingest("orders", "{\"no\":1}\n").await.status(), 202);

    let status: StatusReport = host
        .http
        .get(host.url("/v1/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let version = |name: &str| {
        status
            .plugins
            .iter()
            .find(|plugin| plugin.name == name)
            .map(|plugin| plugin.version.clone())
    };
    let client = nats.client().await;
    let letters = DeadLetters::new(jetstream::new(client.clone()), Names::new("weir", 1, 4));
    let listed = eventually(Duration::from_secs(60), "five dead letters", || async {
        let listed = letters.list(&LetterFilter::default()).await.ok()?;
        (listed.len() >= 5).then_some(listed)
    })
    .await;
    for letter in &listed {
        let plugin = if letter.table == "orders" {
            "validate".to_string()
        } else {
            format!("chaos_{}", letter.table)
        };
        assert_eq!(
            (letter.plugin.clone(), letter.plugin_version.clone()),
            (Some(plugin.clone()), version(&plugin)),
            "the letter of table {} ({})",
            letter.table,
            letter.reason
        );
    }
    host.shutdown().await;
}

/// Rows that run into their deadline cost about one deadline each, shared
/// by the isolation lanes, not a deadline per halving step one after
/// another: another tenant's row on the same unit gets through meanwhile,
/// and the slow rows still end dead-lettered for their deadline.
#[tokio::test(flavor = "multi_thread")]
async fn rows_that_run_into_their_deadline_do_not_stall_their_unit() {
    const SLOW_ROWS: u64 = 32;
    const DEADLINE_MS: u64 = 300;
    let nats = Nats::start();
    let extra = chaos(
        "slow",
        "mode = \"spin\", trigger = \"slow\"",
        &format!("deadline_ms = {DEADLINE_MS}"),
    ) + "\n[[tenants]]\nname = \"beta\"\napi_keys = [\"beta-key-456\"]\n";
    // One unit: every row of every tenant shares it.
    let config = base_config(nats.url(), &extra).replace("[stream]\n", "[stream]\nshards = 1\n");
    let host = TestHost::start(&config).await;

    let slow: String = (0..SLOW_ROWS)
        .map(|id| format!("{{\"id\":{id},\"slow\":true}}\n"))
        .collect();
    assert_eq!(host.ingest("slow", slow).await.status(), 202);
    let sent = std::time::Instant::now();
    let response = host
        .http
        .post(host.url("/v1/ingest/slow"))
        .bearer_auth("beta-key-456")
        .body("{\"id\":1000}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let beta = host.dir.path().join("out/beta/slow.ndjson");
    let waited = eventually(Duration::from_secs(60), "beta's row delivered", || async {
        let text = std::fs::read_to_string(&beta).ok()?;
        (text == "{\"id\":1000}\n").then(|| sent.elapsed())
    })
    .await;

    let reasons = dead_letter_reasons(&nats, SLOW_ROWS as usize).await;
    assert_eq!(reasons.len(), SLOW_ROWS as usize, "{reasons:?}");
    for reason in &reasons {
        assert!(
            reason.starts_with(&format!(
                "gave up after 3 deliveries: plugin `chaos_slow` ran past its deadline of {DEADLINE_MS} ms"
            )),
            "{reason}"
        );
    }
    println!(
        "slow rows: {SLOW_ROWS} rows spinning into a {DEADLINE_MS} ms deadline delayed another \
         tenant's row on their unit by {waited:?}"
    );
    // Halving would run about 2 × 32 − 1 deadline-long calls in a row
    // (~19 s); the lanes need about 1 + 32 / 8. The bound is generous.
    assert!(
        waited < Duration::from_millis(20 * DEADLINE_MS),
        "another tenant's row waited {waited:?} behind {SLOW_ROWS} slow rows"
    );
    host.shutdown().await;
}

/// A deadline measures the plugin, not the host: the whole process stopped
/// (SIGSTOP, a VM stall) in the middle of a slow but successful call does
/// not turn it into a failed one, and nothing is delivered twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_pause_of_the_whole_host_does_not_count_against_a_plugins_deadline() {
    const ROWS: usize = 24;
    let nats = Nats::start();
    let extra = chaos(
        "slow",
        "mode = \"slow\", slow_ms = 300",
        "deadline = \"1s\"",
    );
    // One row per batch: the plugin is busy nearly all the time, so each
    // freeze lands in a call. A member TTL well above the freezes: on a
    // loaded machine a 2.5 s freeze plus late renewals could otherwise end
    // the lease, and a fenced batch's rows (already written by the file
    // sink) come back: that is the lease's promise, not the deadline's.
    let config = base_config(nats.url(), &extra)
        .replace(
            "[delivery]\n",
            "[delivery]\nbatch_rows = 1\npull_rows = 1\n",
        )
        .replace(
            "[stream]\n",
            "[coordination]\nmember_ttl = \"15s\"\n\n[stream]\n",
        );
    let host = Host::spawn_with("paused", config);
    eventually(Duration::from_secs(60), "weir ready", || async {
        host.status().await
    })
    .await;
    let rows: String = (0..ROWS).map(|id| format!("{{\"id\":{id}}}\n")).collect();
    let accepted = reqwest::Client::new()
        .post(format!("{}/v1/ingest/slow", host.url))
        .bearer_auth(ACME_KEY)
        .body(rows)
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);

    let pid = host.child.id() as libc::pid_t;
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        tokio::time::sleep(Duration::from_millis(2500)).await;
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }
    let sink = host.output("slow");
    let lines = eventually(Duration::from_secs(60), "every row delivered", || async {
        let text = std::fs::read_to_string(&sink).ok()?;
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        (lines.len() >= ROWS).then_some(lines)
    })
    .await;
    let log = host.log();
    assert!(
        !log.contains("ran past its deadline"),
        "a pause was blamed on the plugin:\n{log}"
    );
    let unique: std::collections::BTreeSet<&String> = lines.iter().collect();
    assert_eq!(lines.len(), ROWS, "rows delivered twice: {lines:?}");
    assert_eq!(unique.len(), ROWS);
}
