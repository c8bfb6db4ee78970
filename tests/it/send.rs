//! `weir send` as a producer runs it: the real binary against a real host
//! (or, for answers a host gives only under load, a stand-in server).

use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt as _;

use crate::support::{ACME_KEY, Nats, TestHost, WEIR, base_config, eventually, orders};

/// Runs `weir send` as tenant `acme` to `url` with `args`, feeding `stdin`.
async fn weir_send(url: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = tokio::process::Command::new(WEIR)
        .args(["send", "--key", ACME_KEY, "--url", url])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("weir runs");
    let mut pipe = child.stdin.take().expect("stdin is piped");
    // A failed write is what a refusing `weir send` may cause; its output
    // says why.
    let _ = pipe.write_all(stdin).await;
    drop(pipe);
    // A hang guard, not a speed check: the million-row run takes about a
    // minute on a loaded debug build.
    tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .expect("weir send finishes within five minutes")
        .expect("weir send's output")
}

/// Rows the host stored (duplicates not counted), as its status says.
async fn accepted(host: &TestHost) -> u64 {
    weir::client::fetch_status(&host.url(""), None)
        .await
        .expect("the host reports its status")
        .rows
        .accepted
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn send_from_stdin_delivers_every_row_once() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    let rows = orders(0, 5000);
    let output = weir_send(
        &host.url(""),
        &["-t", "orders", "--chunk-rows", "300", "-j", "4", "-"],
        rows.as_bytes(),
    )
    .await;
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        stdout.starts_with("5000 rows accepted, 0 duplicates, in "),
        "{stdout}"
    );
    assert_eq!(stdout.lines().count(), 1, "one summary line: {stdout}");

    let lines = eventually(Duration::from_secs(30), "5000 rows in the sink", || {
        let lines = host.sink_lines("orders");
        async move { (lines.len() >= 5000).then_some(lines) }
    })
    .await;
    let mut ids: Vec<u64> = lines
        .iter()
        .map(|line| {
            let row: serde_json::Value = serde_json::from_str(line).expect("JSON row");
            row["id"].as_u64().expect("an id")
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..5000).collect::<Vec<u64>>(),
        "each row exactly once"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sending_the_same_file_twice_stores_it_once_and_reports_duplicates() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    let file = host.dir.path().join("rows.ndjson");
    std::fs::write(&file, orders(0, 3000)).unwrap();
    let file_arg = file.to_str().expect("a UTF-8 temp path");
    let args = ["--table", "orders", "--chunk-rows", "500", file_arg];

    let first = weir_send(&host.url(""), &args, b"").await;
    assert!(first.status.success(), "{}", text(&first.stderr));
    let stdout = text(&first.stdout);
    assert!(
        stdout.starts_with("3000 rows accepted, 0 duplicates"),
        "{stdout}"
    );
    let second = weir_send(&host.url(""), &args, b"").await;
    assert!(second.status.success(), "{}", text(&second.stderr));
    let stdout = text(&second.stdout);
    assert!(
        stdout.starts_with("3000 rows accepted, 3000 duplicates"),
        "{stdout}"
    );

    assert_eq!(
        accepted(&host).await,
        3000,
        "the second send stored nothing"
    );
    host.shutdown().await;
}

/// A file with a bad line at 1234, in chunks of 200 lines.
fn file_with_a_bad_line(host: &TestHost) -> (std::path::PathBuf, String) {
    let file = host.dir.path().join("rows.ndjson");
    let mut text_rows = orders(0, 1233);
    text_rows.push_str("{\"id\": broken\n");
    text_rows.push_str(&orders(2000, 1766));
    std::fs::write(&file, text_rows).unwrap();
    let file_arg = file.to_str().expect("a UTF-8 temp path").to_string();
    (file, file_arg)
}

#[tokio::test(flavor = "multi_thread")]
async fn with_fail_fast_a_bad_line_mid_file_is_named_by_file_and_line_and_stops_the_send() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    // Line 1234 is broken; chunks of 200 lines: lines 1-1200 go through,
    // the chunk of lines 1201-1400 is refused.
    let (_file, file_arg) = file_with_a_bad_line(&host);
    let output = weir_send(
        &host.url(""),
        &[
            "-t",
            "orders",
            "--chunk-rows",
            "200",
            "-j",
            "2",
            "--fail-fast",
            &file_arg,
        ],
        b"",
    )
    .await;
    assert_eq!(output.status.code(), Some(5));
    assert!(output.stdout.is_empty(), "{}", text(&output.stdout));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(&format!("{file_arg}:1234: refused (400): invalid JSON")),
        "{stderr}"
    );
    assert!(
        stderr.contains("1200 rows before line 1201 were accepted"),
        "{stderr}"
    );
    // Nothing was sent past the chunks in flight when the refusal came.
    let stored = accepted(&host).await;
    assert!((1200..2800).contains(&stored), "{stored} rows stored");
    host.shutdown().await;
}

/// By default a refused chunk is said (file:line) and the rest of the file
/// still goes; the summary counts it and the exit code says it.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_chunk_is_reported_and_the_rest_of_the_file_is_sent() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    let (_file, file_arg) = file_with_a_bad_line(&host);
    let output = weir_send(
        &host.url(""),
        &["-t", "orders", "--chunk-rows", "200", "-j", "2", &file_arg],
        b"",
    )
    .await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(5), "{stdout}{stderr}");
    assert!(
        stdout.starts_with(
            "2800 rows accepted, 0 duplicates, 1 chunk refused (200 rows not stored), in "
        ),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!("{file_arg}:1234: refused (400): invalid JSON")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "1 chunk refused (200 rows not stored): {file_arg}:1234"
        )),
        "the closing error names where: {stderr}"
    );
    assert_eq!(accepted(&host).await, 2800, "every other chunk was stored");
    host.shutdown().await;
}

/// With the table's bad lines dead-lettered, `weir send` stores every good
/// row and names each dead-lettered line by the file's line number, as do
/// the letters themselves (`Weir-Line`).
#[tokio::test(flavor = "multi_thread")]
async fn dead_lettered_lines_are_named_by_file_and_line() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "bad_lines = \"dead-letter\"\n")).await;
    let (_file, file_arg) = file_with_a_bad_line(&host);
    let output = weir_send(
        &host.url(""),
        &["-t", "orders", "--chunk-rows", "200", &file_arg],
        b"",
    )
    .await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("2999 rows accepted, 0 duplicates, 1 line dead-lettered, in "),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!("{file_arg}:1234: invalid JSON"))
            && stderr.contains("dead-lettered"),
        "{stderr}"
    );
    let letters = crate::support::read_stream(&nats.client().await, "weir_dlq").await;
    let lines: Vec<String> = letters
        .iter()
        .filter_map(|l| {
            l.headers
                .as_ref()?
                .get(weir::delivery::headers::LINE)
                .map(|v| v.to_string())
        })
        .collect();
    assert_eq!(lines, ["1234"]);
    assert_eq!(accepted(&host).await, 2999);
    host.shutdown().await;
}

/// With NATS down the host answers 503 to every chunk: `--timeout 5`
/// stops the send with the host's answer within about that long, instead
/// of waiting for ever.
#[tokio::test(flavor = "multi_thread")]
async fn with_nats_down_a_send_gives_up_at_its_timeout_saying_why() {
    let mut nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    nats.server.stop();
    eventually(Duration::from_secs(10), "/readyz says 503", || async {
        let ready = host.http.get(host.url("/readyz")).send().await.ok()?;
        (ready.status() == 503).then_some(())
    })
    .await;
    let started = Instant::now();
    let output = weir_send(
        &host.url(""),
        &["-t", "orders", "--timeout", "5"],
        orders(0, 10).as_bytes(),
    )
    .await;
    let took = started.elapsed();
    let stderr = text(&output.stderr);
    println!("weir send --timeout 5 with NATS down: {took:?}");
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("gave up after"), "{stderr}");
    assert!(
        stderr.contains("503") && stderr.contains("NATS"),
        "the reason: {stderr}"
    );
    assert!(
        stderr.contains("retrying in"),
        "it said what it waited for: {stderr}"
    );
    // The bound of the option, not a performance figure: 5 s and a margin
    // for starting the process on a loaded machine.
    assert!(took < Duration::from_secs(9), "took {took:?}");

    // And the retry limit: one retry is two requests, whatever the time.
    let started = Instant::now();
    let output = weir_send(
        &host.url(""),
        &["-t", "orders", "--retries", "1"],
        orders(0, 10).as_bytes(),
    )
    .await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("gave up after 2 attempts"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "{:?}",
        started.elapsed()
    );
    // A stop while NATS is down, with no row in hand, waits on nothing it
    // cannot have: the member keys expire and the others take over. It took
    // the drain timeout and 5 s more while the host kept retrying to drop
    // its claims, then ~4.5 s in a renewal, a claim drop begun before the
    // stop and the watch's consumer delete, each waiting out a timeout
    // (the shortest, 5 s, bounds it here); now a few milliseconds.
    let stopping = Instant::now();
    host.shutdown().await;
    let stopped = stopping.elapsed();
    println!("a stop with NATS down and no row in hand: {stopped:?}");
    assert!(
        stopped < Duration::from_secs(3),
        "a stop with NATS down took {stopped:?}"
    );
}

/// A request the stand-in server saw: when, and its Idempotency-Key.
type Seen = Arc<Mutex<Vec<(Instant, String)>>>;

/// A 429 is waited out as its body's `retry_after_ms` says (more precise
/// than the header's whole seconds), and the retry carries the same key.
#[tokio::test(flavor = "multi_thread")]
async fn a_429_is_retried_after_retry_after_ms_with_the_same_key() {
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::IntoResponse;

    let seen: Seen = Arc::default();
    let answer = {
        let seen = seen.clone();
        move |headers: HeaderMap| {
            let seen = seen.clone();
            async move {
                let key = headers
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let attempt = {
                    let mut seen = seen.lock().unwrap();
                    seen.push((Instant::now(), key));
                    seen.len()
                };
                if attempt == 1 {
                    (
                        StatusCode::TOO_MANY_REQUESTS,
                        [(header::RETRY_AFTER, "5")],
                        r#"{"error":"over budget","retry_after_ms":300}"#,
                    )
                        .into_response()
                } else {
                    (StatusCode::ACCEPTED, r#"{"accepted":2,"duplicates":0}"#).into_response()
                }
            }
        }
    };
    let app = axum::Router::new().route("/v1/ingest/{table}", axum::routing::post(answer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let output = weir_send(&url, &["-t", "orders"], b"{\"id\":1}\n{\"id\":2}\n").await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).starts_with("2 rows accepted, 0 duplicates"),
        "{}",
        text(&output.stdout)
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen[0].1.starts_with("send-"), "{seen:?}");
    assert_eq!(seen[0].1, seen[1].1, "a retry carries the same key");
    let waited = seen[1].0 - seen[0].0;
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(4),
        "waited {waited:?}"
    );
    server.abort();
}

/// #38's acceptance run: 1,000,001 lines with 3 bad ones through `weir
/// send` to a table that dead-letters bad lines: 3 letters naming the
/// file's lines, and every other row stored exactly once (the partition
/// streams' sequences count every row ever stored, delivered or not).
#[tokio::test(flavor = "multi_thread")]
async fn a_million_rows_with_three_bad_lines_through_weir_send() {
    const LINES: usize = 1_000_001;
    const BAD: [usize; 3] = [2, 500_000, 1_000_001];
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "bad_lines = \"dead-letter\"\n")).await;
    let file = host.dir.path().join("million.ndjson");
    let mut rows = String::with_capacity(LINES * 64);
    for line in 1..=LINES {
        if BAD.contains(&line) {
            rows.push_str("{\"id\": not json}\n");
        } else {
            rows.push_str(&orders(line, 1));
        }
    }
    std::fs::write(&file, rows).unwrap();
    let file_arg = file.to_str().expect("a UTF-8 temp path");
    let started = Instant::now();
    let output = weir_send(&host.url(""), &["-t", "orders", "-j", "4", file_arg], b"").await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    println!(
        "1,000,001 lines through weir send in {:?}: {stdout}",
        started.elapsed()
    );
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("999998 rows accepted, 0 duplicates, 3 lines dead-lettered, in "),
        "{stdout}"
    );
    for line in BAD {
        assert!(
            stderr.contains(&format!("{file_arg}:{line}: invalid JSON")),
            "{stderr}"
        );
    }
    let client = nats.client().await;
    let mut lines: Vec<u64> = crate::support::read_stream(&client, "weir_dlq")
        .await
        .iter()
        .filter_map(|l| {
            l.headers
                .as_ref()?
                .get(weir::delivery::headers::LINE)?
                .as_str()
                .parse()
                .ok()
        })
        .collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        BAD.map(|line| line as u64),
        "one letter per bad line"
    );
    let mut stored = 0;
    for mut stream in crate::support::partition_streams(&client).await {
        stored += stream
            .info()
            .await
            .expect("stream info")
            .state
            .last_sequence;
    }
    assert_eq!(
        stored,
        (LINES - BAD.len()) as u64,
        "every good row stored once"
    );
    host.shutdown().await;
}
