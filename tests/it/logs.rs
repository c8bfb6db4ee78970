//! What `weir run` writes to stderr, read from a real process: flat JSON
//! lines, few INFO lines for many dead letters, refusals said without the
//! key; and operator commands that stay quiet.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::{ACME_KEY, Nats, WEIR, base_config, eventually, free_port};

/// Rows sent, and every how many one lacks `id` (dead-lettered): 4 %.
const ROWS: usize = 100_000;
const DEAD_EVERY: usize = 25;
/// Rows per request: well under the tests' 1 MiB body limit.
const ROWS_PER_REQUEST: usize = 10_000;

/// NDJSON rows `start..start+count`; every `DEAD_EVERY`th has no `id`.
fn rows(start: usize, count: usize) -> String {
    (start..start + count)
        .map(|n| {
            if n % DEAD_EVERY == 0 {
                format!("{{\"amount\":{n}}}\n")
            } else {
                format!("{{\"id\":{n},\"amount\":{n}}}\n")
            }
        })
        .collect()
}

/// The value of an unlabelled counter on `/metrics`.
async fn counter(http: &reqwest::Client, url: &str, name: &str) -> Option<f64> {
    let text = http.get(format!("{url}/metrics")).send().await.ok()?;
    let text = text.text().await.ok()?;
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.parse().ok())
}

/// `weir run` on the base config with `WEIR_LOG_FORMAT=json`, stderr to
/// `weir.log` in `dir` (a file: no terminal), `WEIR_LOG` as given (unset:
/// the defaults an operator gets). Returns the child and its URL once ready.
async fn spawn_host(
    nats: &Nats,
    dir: &std::path::Path,
    weir_log: Option<&str>,
) -> (std::process::Child, String) {
    let port = free_port();
    let config = base_config(nats.url(), "").replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    );
    let path = dir.join("weir.toml");
    std::fs::write(&path, config).unwrap();
    let stderr = std::fs::File::create(dir.join("weir.log")).unwrap();
    let mut command = Command::new(WEIR);
    command
        .args(["run", "--config"])
        .arg(&path)
        .env_remove("WEIR_LOG")
        .env_remove("RUST_LOG")
        .env("WEIR_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(stderr);
    if let Some(filter) = weir_log {
        command.env("WEIR_LOG", filter);
    }
    let child = command.spawn().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    eventually(Duration::from_secs(30), "the host to listen", || async {
        http.get(format!("{url}/readyz"))
            .send()
            .await
            .ok()
            .filter(|answer| answer.status().is_success())
    })
    .await;
    (child, url)
}

/// Stops the host (SIGTERM: units drain, summaries are said) and returns
/// its log, one JSON object per line (or fails).
async fn stop_and_read(
    mut child: std::process::Child,
    dir: &std::path::Path,
) -> (String, Vec<serde_json::Map<String, Value>>) {
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let stopped = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(stopped.success(), "weir run exited with {stopped}");
    let log = std::fs::read_to_string(dir.join("weir.log")).unwrap();
    let lines = log
        .lines()
        .map(|line| match serde_json::from_str(line) {
            Ok(Value::Object(object)) => object,
            _ => panic!("not one JSON object per line: {line}"),
        })
        .collect();
    (log, lines)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_100k_row_run_with_4_percent_dead_letters_logs_few_flat_json_lines() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let (child, url) = spawn_host(&nats, dir.path(), None).await;
    let http = reqwest::Client::new();

    for start in (0..ROWS).step_by(ROWS_PER_REQUEST) {
        let answer = http
            .post(format!("{url}/v1/ingest/orders"))
            .bearer_auth(ACME_KEY)
            .body(rows(start, ROWS_PER_REQUEST))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 202, "{:?}", answer.text().await);
    }
    let refused = http
        .post(format!("{url}/v1/ingest/nowhere"))
        .bearer_auth(ACME_KEY)
        .body("{}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 404);

    let dead = eventually(Duration::from_secs(120), "every row settled", || async {
        let delivered = counter(&http, &url, "weir_rows_delivered_total").await?;
        let dead = counter(&http, &url, "weir_rows_dead_lettered_total").await?;
        (delivered + dead == ROWS as f64).then_some(dead)
    })
    .await;
    assert_eq!(dead, (ROWS / DEAD_EVERY) as f64);

    // An operator command says nothing on stderr unless asked (-v).
    let status = Command::new(WEIR)
        .args(["status", "--url", &url])
        .env_remove("WEIR_LOG")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(status.status.success());
    assert_eq!(String::from_utf8_lossy(&status.stderr), "");

    // Stopping flushes each unit's summary.
    let (log, lines) = stop_and_read(child, dir.path()).await;
    assert!(!log.contains('\u{1b}'), "no ANSI escape in a file");
    assert!(!log.contains(ACME_KEY), "an API key reached the log");
    let info = lines.iter().filter(|line| line["level"] == "INFO").count();
    println!("{} lines, {info} at INFO, for {ROWS} rows:", lines.len());
    for line in lines.iter().filter(|line| line["level"] == "INFO") {
        println!("{}", Value::Object((*line).clone()));
    }
    assert!(info < 50, "{info} INFO lines:\n{log}");
    assert!(
        lines.iter().all(|line| !line.contains_key("fields")),
        "fields are at the top, not under `fields`"
    );

    // The refusal: its reason and code, and the span's fields at the top.
    let refusal = lines
        .iter()
        .find(|line| line["message"] == "ingest request refused")
        .unwrap_or_else(|| panic!("no refusal logged:\n{log}"));
    assert_eq!(refusal["level"], "INFO");
    assert_eq!(refusal["code"], 404);
    assert_eq!(refusal["tenant"], "acme");
    assert_eq!(refusal["table"], "nowhere");
    assert!(refusal["reason"].as_str().unwrap().contains("nowhere"));

    // The summaries add up to every dead letter, by unit and reason.
    let summaries: Vec<_> = lines
        .iter()
        .filter(|line| line.contains_key("dead_lettered") && line["level"] == "INFO")
        .collect();
    let summed: u64 = summaries
        .iter()
        .map(|line| line["dead_lettered"].as_u64().unwrap())
        .sum();
    assert_eq!(summed, (ROWS / DEAD_EVERY) as u64, "{summaries:?}");
    for line in &summaries {
        assert!(line["unit"].as_str().unwrap().starts_with("weir_in_"));
        assert!(line["reasons"].as_str().unwrap().contains("validate"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_lettered_row_is_logged_at_debug_with_where_it_was() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let (child, url) = spawn_host(&nats, dir.path(), Some("info,weir::delivery=debug")).await;
    let http = reqwest::Client::new();
    let answer = http
        .post(format!("{url}/v1/ingest/orders"))
        .bearer_auth(ACME_KEY)
        .body(rows(0, 50))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 202);
    eventually(Duration::from_secs(30), "every row settled", || async {
        let delivered = counter(&http, &url, "weir_rows_delivered_total").await?;
        let dead = counter(&http, &url, "weir_rows_dead_lettered_total").await?;
        (delivered + dead == 50.0).then_some(())
    })
    .await;
    // The unit goes idle: its summary is said on its own, not only at stop.
    let log_path = dir.path().join("weir.log");
    eventually(
        Duration::from_secs(30),
        "the unit's INFO summary",
        || async {
            let log = std::fs::read_to_string(&log_path).ok()?;
            log.lines()
                .any(|line| line.contains("\"dead_lettered\":2,"))
                .then_some(())
        },
    )
    .await;
    let (log, lines) = stop_and_read(child, dir.path()).await;
    let dead: Vec<_> = lines
        .iter()
        .filter(|line| line["message"] == "row dead-lettered")
        .collect();
    assert_eq!(dead.len(), 50 / DEAD_EVERY, "{log}");
    for line in dead {
        assert_eq!(line["level"], "DEBUG");
        assert_eq!(line["tenant"], "acme");
        assert_eq!(line["table"], "orders");
        assert_eq!(line["plugin"], "validate");
        assert_eq!(line["cause"], "verdict");
        assert!(line["unit"].as_str().unwrap().starts_with("weir_in_"));
        assert!(line["sequence"].as_u64().unwrap() >= 1);
        // Logged within the batch's span, whose fields come up to the top.
        assert_eq!(line["span"], "batch");
        assert!(line["rows"].as_u64().unwrap() >= 1);
    }
}
