//! Shadows on a real fleet of two hosts. The release of `validate` is the
//! pass-through (every row `ok`, written as sent); its shadow is the
//! validator with `required = ["id"]` and `mask = ["email"]`, which would
//! dead-letter the 5% of rows without an `id` and mask the others. The
//! shadow reports those rows' difference class with examples, the sinks
//! write exactly what the pass-through passed (nothing masked, nothing
//! dead-lettered), and a shadow of a sink or of a plugin granted `state`
//! is refused with the reason. Ended, its differences are still shown
//! (kept in the release) until the plugin's next shadow starts. Promoted,
//! the candidate serves.

use std::time::Duration;

use weir_test_artifacts::{NDJSON_SINK, VALIDATOR, WINDOW};

use crate::support::{TestHost, base_config, eventually, every_host_runs, operator};

/// Rows sent; every twentieth has no `id`.
const ROWS: u64 = 100;

fn config(nats_url: &str, id: &str) -> String {
    base_config(
        nats_url,
        &format!(
            "\n[coordination]\nhost_id = \"{id}\"\nmember_ttl_secs = 5\n{}",
            crate::state::WINDOW
        ),
    )
    .replace("weir_validator.wasm", "weir_bench_passthrough.wasm")
}

/// `weir plugin COMMAND ARGS…` through `host`'s config.
fn plugin(host: &TestHost, command: &str, args: &[&str]) -> std::process::Output {
    operator(&host.config_path(), ["plugin", command], args)
}

fn stdout(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What both hosts' sinks wrote for `acme`/`orders`, as JSON rows.
fn written(hosts: &[&TestHost]) -> Vec<serde_json::Value> {
    hosts
        .iter()
        .flat_map(|h| h.sink_lines("orders"))
        .map(|line| serde_json::from_str(&line).expect("a JSON line"))
        .collect()
}

/// `weir_rows_dead_lettered_total` on `host` (absent: none).
async fn dead_lettered(host: &TestHost) -> u64 {
    let metrics = host.get_text("/metrics").await;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("weir_rows_dead_lettered_total "))
        .map_or(0, |value| value.trim().parse::<f64>().unwrap_or(0.0) as u64)
}

/// The shadow's version, as `weir plugin diff --json` names it.
fn diff_version(host: &TestHost) -> String {
    let output = plugin(host, "diff", &["validate", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    json["candidate"].as_str().expect("a version").to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shadow_reports_its_differences_and_delivers_nothing() {
    let nats = crate::support::Nats::start();
    let a = TestHost::start(&config(nats.url(), "host-a")).await;
    let b = TestHost::start(&config(nats.url(), "host-b")).await;
    let hosts = [&a, &b];

    // Refused before anything is pushed, each with its reason.
    for (args, says) in [
        (
            vec!["files", NDJSON_SINK, "--shadow"],
            "a shadow runs transforms only",
        ),
        (vec!["window", WINDOW, "--shadow"], "is granted `state`"),
        (
            vec!["validate", VALIDATOR, "--shadow", "--canary", "5%"],
            "cannot be used with",
        ),
    ] {
        let output = plugin(&a, "push", &args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains(says),
            "{args:?}: {stderr}"
        );
    }
    let diff = plugin(&a, "diff", &["validate"]);
    let stderr = String::from_utf8_lossy(&diff.stderr);
    assert!(
        !diff.status.success() && stderr.contains("has no shadow running"),
        "{stderr}"
    );

    let said = stdout(&plugin(
        &a,
        "push",
        &["validate", VALIDATOR, "--shadow", "--wait", "30"],
    ));
    assert!(
        said.contains("every live member is ready to run")
            && said.contains("shadow of")
            && said.contains("delivering nothing"),
        "{said}"
    );
    every_host_runs(
        &hosts,
        "every host runs the shadow",
        ("validate", None),
        true,
    )
    .await;

    let body: String = (0..ROWS)
        .map(|n| match n % 20 {
            0 => format!("{{\"seq\":{n},\"email\":\"u{n}@example.com\"}}\n"),
            _ => format!("{{\"id\":{n},\"seq\":{n},\"email\":\"u{n}@example.com\"}}\n"),
        })
        .collect();
    let response = a.ingest("orders", body).await;
    assert_eq!(response.status(), 202);
    eventually(Duration::from_secs(60), "every row delivered", || async {
        (written(&hosts).len() as u64 == ROWS).then_some(())
    })
    .await;

    // The fleet's differences: each host compared what it ran.
    let diff = eventually(
        Duration::from_secs(30),
        "the differences shared",
        || async {
            let output = plugin(&a, "diff", &["validate", "--json"]);
            let json: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
            (json["diff"]["compared"].as_u64()? + json["diff"]["skipped"].as_u64()? == ROWS)
                .then_some(json)
        },
    )
    .await;
    println!("{}", serde_json::to_string_pretty(&diff).unwrap());
    let diff = &diff["diff"];
    assert_eq!(diff["skipped"], 0, "a 4-batch queue is not full here");
    let dead = &diff["classes"]["ok→dead_letter"];
    assert_eq!(dead["rows"], ROWS / 20, "the rows without an id");
    let examples = dead["examples"].as_array().expect("examples");
    assert!(!examples.is_empty() && examples.len() <= 3, "{examples:?}");
    for example in examples {
        assert_eq!(
            (&example["tenant"], &example["table"], &example["serving"]),
            (&"acme".into(), &"orders".into(), &"ok".into())
        );
        let candidate = example["candidate"].as_str().unwrap();
        assert!(
            candidate.starts_with("dead_letter: ") && candidate.contains("id"),
            "{candidate}"
        );
    }
    // The others the validator masks: it emits them changed.
    assert_eq!(diff["classes"]["ok→emit"]["rows"], ROWS - ROWS / 20);
    let text = stdout(&plugin(&a, "diff", &["validate"]));
    assert!(
        text.contains(&format!("compared {ROWS} rows, {ROWS} differ"))
            && text.contains("ok→dead_letter: 5 rows")
            && text.contains("acme/orders #"),
        "{text}"
    );
    let listed = stdout(&plugin(&a, "list", &["validate"]));
    assert!(
        listed.contains("shadow: ") && listed.contains(&format!("compared {ROWS} rows")),
        "{listed}"
    );
    let status = std::process::Command::new(crate::support::WEIR)
        .args(["status", "--url", &b.url("")])
        .output()
        .expect("weir runs");
    let status = stdout(&status);
    assert!(
        status.contains(&format!("shadow of validate: {} beside ", diff_version(&a)))
            && status.contains(&format!(
                "compared {ROWS} rows, {ROWS} differ, 0 not compared"
            )),
        "{status}"
    );

    // Nothing of the shadow was delivered or dead-lettered: every row as
    // sent, none masked, each once.
    let rows = written(&hosts);
    let mut seqs: Vec<u64> = rows.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..ROWS).collect::<Vec<_>>());
    assert!(
        rows.iter().all(|r| r["email"] != "***"),
        "the shadow's masked rows reached a sink"
    );
    for host in hosts {
        assert_eq!(dead_lettered(host).await, 0);
    }

    // Ended: the release serves on, and no shadow runs.
    let ended = stdout(&plugin(&a, "rollback", &["validate"]));
    assert!(ended.contains("ended"), "{ended}");
    let listed = stdout(&plugin(&a, "list", &["validate"]));
    assert!(!listed.contains("shadow: "), "{listed}");
    every_host_runs(
        &hosts,
        "every host ends the shadow",
        ("validate", None),
        false,
    )
    .await;

    // Its differences are kept in the release: still shown once the
    // hosts' own counts are gone (purged here, as their TTL would).
    let kv = async_nats::jetstream::new(nats.client().await)
        .get_key_value("weir_coord")
        .await
        .expect("the coordination bucket");
    let counts: Vec<String> = {
        use futures::TryStreamExt;
        kv.keys()
            .await
            .expect("keys")
            .try_collect::<Vec<String>>()
            .await
            .expect("keys")
            .into_iter()
            .filter(|key| key.starts_with("canary.validate."))
            .collect()
    };
    assert!(!counts.is_empty(), "the hosts' counts of the shadow");
    for key in &counts {
        kv.purge(key).await.expect("purge a host's counts");
    }
    let kept: serde_json::Value =
        serde_json::from_slice(&plugin(&a, "diff", &["validate", "--json"]).stdout).expect("JSON");
    assert!(kept["ended_ms"].as_u64().is_some(), "{kept}");
    assert_eq!(kept["diff"], *diff, "the same differences as while it ran");
    let text = stdout(&plugin(&a, "diff", &["validate"]));
    assert!(
        text.contains("the last shadow")
            && text.contains(&format!("compared {ROWS} rows, {ROWS} differ"))
            && text.contains("ok→dead_letter: 5 rows"),
        "{text}"
    );

    // The next shadow starts: its own differences replace the last one's.
    stdout(&plugin(
        &a,
        "push",
        &["validate", VALIDATOR, "--shadow", "--wait", "30"],
    ));
    let next: serde_json::Value =
        serde_json::from_slice(&plugin(&a, "diff", &["validate", "--json"]).stdout).expect("JSON");
    assert!(next["ended_ms"].is_null(), "{next}");
    assert_eq!(next["diff"]["compared"], 0, "{next}");
    a.shutdown().await;
    b.shutdown().await;
}

/// Promoted, the shadow's candidate serves every row: the validator
/// masks from then on, and no shadow runs any more.
#[tokio::test(flavor = "multi_thread")]
async fn a_promoted_shadow_serves_every_row() {
    let nats = crate::support::Nats::start();
    let a = TestHost::start(&config(nats.url(), "host-a")).await;
    let b = TestHost::start(&config(nats.url(), "host-b")).await;
    let hosts = [&a, &b];
    stdout(&plugin(
        &a,
        "push",
        &["validate", VALIDATOR, "--shadow", "--wait", "30"],
    ));
    let row = |n: u64| format!("{{\"id\":{n},\"seq\":{n},\"email\":\"u{n}@example.com\"}}\n");
    assert_eq!(a.ingest("orders", row(0)).await.status(), 202);
    eventually(Duration::from_secs(30), "the first row", || async {
        (written(&hosts).len() == 1).then_some(())
    })
    .await;
    let promoted = stdout(&plugin(&a, "promote", &["validate"]));
    assert!(promoted.contains("the fleet now runs"), "{promoted}");
    let validator = weir::sandbox::version_of(&std::fs::read(VALIDATOR).unwrap());
    every_host_runs(
        &hosts,
        "every host serves it",
        ("validate", Some(&validator)),
        false,
    )
    .await;
    assert_eq!(a.ingest("orders", row(1)).await.status(), 202);
    let rows = eventually(Duration::from_secs(30), "the second row", || async {
        let rows = written(&hosts);
        (rows.len() == 2).then_some(rows)
    })
    .await;
    let email = |seq: u64| {
        rows.iter()
            .find(|r| r["seq"] == seq)
            .map(|r| r["email"].clone())
    };
    assert_eq!(
        email(0),
        Some("u0@example.com".into()),
        "before: the release"
    );
    assert_eq!(email(1), Some("***".into()), "after: the candidate");
    let listed = stdout(&plugin(&a, "list", &["validate"]));
    assert!(
        !listed.contains("shadow: ") && listed.contains("promoted (operator)"),
        "{listed}"
    );
    a.shutdown().await;
    b.shutdown().await;
}
