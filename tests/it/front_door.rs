//! Bad input gets a clear 4xx naming what is wrong; NATS trouble a 503 with
//! Retry-After; nothing of a refused request is stored.

use std::time::Duration;

use crate::support::{ACME_KEY, Nats, TestHost, backlog, base_config, eventually, orders};

async fn error_of(response: reqwest::Response) -> (u16, serde_json::Value) {
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

/// Waits until every row stored in the partition stream has been delivered
/// and acked (a work-queue stream then holds none): from then on the sink
/// holds every row it will ever get, so its line count can be compared
/// exactly.
async fn drained(client: &async_nats::Client) {
    eventually(
        Duration::from_secs(20),
        "every stored row delivered and acked",
        || async { (backlog(client).await == (0, 0, 0)).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_are_refused_with_what_and_where() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;

    let (status, body) = error_of(
        host.ingest("orders", "{\"id\":1}\n{\"id\":2}\n{\"id\": oops}\n")
            .await,
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(body["line"], 3);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("line 3: invalid JSON"),
        "{body}"
    );

    let (status, body) = error_of(host.ingest("orders", "[1,2]\n").await).await;
    assert_eq!((status, body["line"].as_u64()), (400, Some(1)));

    let missing_key = host
        .http
        .post(host.url("/v1/ingest/orders"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(missing_key.status(), 401);
    let wrong_key = host
        .http
        .post(host.url("/v1/ingest/orders"))
        .bearer_auth("not-a-key-of-anyone")
        .body("{}")
        .send()
        .await
        .unwrap();
    let (status, body) = error_of(wrong_key).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("unknown api key"))
    );

    let (status, body) = error_of(host.ingest("nosuchtable", "{}").await).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"], "no pipeline takes table `nosuchtable`");

    // max_body_bytes is 1 MiB in the test config.
    let (status, body) = error_of(host.ingest("orders", orders(0, 30_000)).await).await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("larger than the limit of 1048576 bytes")
    );

    // None of it was stored.
    let client = nats.client().await;
    assert_eq!(backlog(&client).await.2, 0);
    let report = host.host.status().report().await;
    assert_eq!(report.rows.accepted, 0);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_unreachable_is_a_503_with_retry_after() {
    let mut nats = Nats::start();
    // The stop below waits out the drain timeout (30 s by default): the
    // delivered row's ack cannot be confirmed with NATS gone.
    let config =
        base_config(nats.url(), "").replace("[delivery]\n", "[delivery]\ndrain_timeout = \"2s\"\n");
    let host = TestHost::start(&config).await;
    assert_eq!(host.ingest("orders", orders(0, 1)).await.status(), 202);

    nats.server.stop();
    // The front door refuses once the client has noticed the connection is
    // gone, which `/readyz` reports from the same connection state.
    eventually(Duration::from_secs(10), "/readyz says 503", || async {
        let ready = host.http.get(host.url("/readyz")).send().await.ok()?;
        (ready.status() == 503).then_some(())
    })
    .await;
    let response = host
        .http
        .post(host.url("/v1/ingest/orders"))
        .bearer_auth(ACME_KEY)
        .body(orders(1, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_request_with_the_same_idempotency_key_stores_its_rows_once() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    let post = |key: &'static str| {
        host.http
            .post(host.url("/v1/ingest/orders"))
            .bearer_auth(ACME_KEY)
            .header("Idempotency-Key", key)
            .body(orders(0, 50))
            .send()
    };
    let (status, body) = error_of(post("batch-1").await.unwrap()).await;
    assert_eq!(
        (
            status,
            body["accepted"].as_u64(),
            body["duplicates"].as_u64()
        ),
        (202, Some(50), Some(0))
    );
    let (status, body) = error_of(post("batch-1").await.unwrap()).await;
    assert_eq!(
        (
            status,
            body["accepted"].as_u64(),
            body["duplicates"].as_u64()
        ),
        (202, Some(50), Some(50))
    );

    // The same key with other rows is a client bug: refused, not dropped.
    let other_rows = host
        .http
        .post(host.url("/v1/ingest/orders"))
        .bearer_auth(ACME_KEY)
        .header("Idempotency-Key", "batch-1")
        .body(orders(50, 10))
        .send()
        .await
        .unwrap();
    let (status, body) = error_of(other_rows).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("`batch-1`"),
        "the answer names the key: {body}"
    );

    drained(&nats.client().await).await;
    assert_eq!(
        host.sink_lines("orders").len(),
        50,
        "stored and delivered once"
    );
    assert_eq!(host.host.status().report().await.rows.accepted, 50);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_with_the_same_idempotency_field_are_stored_once() {
    let nats = Nats::start();
    let config = format!(
        "idempotency_field = \"id\"\n{}",
        base_config(nats.url(), "")
    );
    let host = TestHost::start(&config).await;
    let (status, body) = error_of(host.ingest("orders", orders(0, 10)).await).await;
    assert_eq!((status, body["duplicates"].as_u64()), (202, Some(0)));
    // Rows 5..15: the first five were already stored.
    let (status, body) = error_of(host.ingest("orders", orders(5, 10)).await).await;
    assert_eq!(
        (
            status,
            body["accepted"].as_u64(),
            body["duplicates"].as_u64()
        ),
        (202, Some(10), Some(5))
    );

    drained(&nats.client().await).await;
    assert_eq!(host.sink_lines("orders").len(), 15);
    host.shutdown().await;
}

/// A request is all or nothing: a row too large for NATS, or a line that
/// is not UTF-8, refuses the request before its first row is stored.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_request_stores_none_of_its_rows() {
    let nats = Nats::start();
    let config =
        base_config(nats.url(), "").replace("max_body_bytes = 1048576", "max_body_bytes = 4194304");
    let host = TestHost::start(&config).await;

    // NATS stores at most 1 MiB a message; the body limit is 4 MiB.
    let big = format!("{{\"id\":\"b\",\"pad\":\"{}\"}}\n", "x".repeat(2 << 20));
    let (status, body) = error_of(
        host.ingest("orders", format!("{{\"id\":\"a\"}}\n{big}"))
            .await,
    )
    .await;
    assert_eq!((status, body["line"].as_u64()), (413, Some(2)), "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("nothing was stored"),
        "{body}"
    );

    let (status, body) = error_of(
        host.ingest("orders", b"{\"id\":1}\n{\"name\":\"caf\xe9\"}\n".to_vec())
            .await,
    )
    .await;
    assert_eq!((status, body["line"].as_u64()), (400, Some(2)), "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("not valid UTF-8"),
        "{body}"
    );

    let client = nats.client().await;
    assert_eq!(
        backlog(&client).await.2,
        0,
        "a row of a refused request was stored"
    );
    host.shutdown().await;
}

/// Resident memory of a process, in bytes (Linux /proc).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Hostile clients cost the host nothing it keeps: 100 unauthenticated
/// requests announcing 9 MiB bodies are answered 401 without their bodies
/// being read, 100 clients trickling their headers are cut off at the
/// header deadline, and a tenant with a key gets its 202 meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn unauthenticated_and_slow_clients_cost_no_memory_and_do_not_block_a_tenant() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let nats = Nats::start();
    let host = crate::support::Host::spawn_with(
        "edge",
        base_config(nats.url(), "")
            .replace("max_body_bytes = 1048576", "max_body_bytes = 16777216"),
    );
    let http = reqwest::Client::new();
    eventually(Duration::from_secs(60), "weir ready", || async {
        let ready = http.get(format!("{}/readyz", host.url)).send().await.ok()?;
        ready.status().is_success().then_some(())
    })
    .await;
    let address = host.url.trim_start_matches("http://").to_string();
    let idle = rss_bytes(host.child.id());

    let oversized = (0..100).map(|_| {
        let address = address.clone();
        tokio::spawn(async move {
            let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
            let head = "POST /v1/ingest/orders HTTP/1.1\r\nHost: weir\r\n\
                        Content-Length: 9437184\r\n\r\n";
            stream.write_all(head.as_bytes()).await.unwrap();
            // As much body as the host will take before answering.
            let chunk = vec![b'x'; 64 << 10];
            for _ in 0..16 {
                if stream.write_all(&chunk).await.is_err() {
                    break;
                }
            }
            let mut answer = vec![0; 64];
            let read = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut answer))
                .await
                .map_or(0, |read| read.unwrap_or(0));
            String::from_utf8_lossy(&answer[..read]).to_string()
        })
    });
    let oversized: Vec<_> = oversized.collect();
    let trickling: Vec<_> = (0..100)
        .map(|_| {
            let address = address.clone();
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
                for byte in b"POST /v1/ingest/orders HTTP/1.1\r\nHost: weir\r\n"
                    .iter()
                    .cycle()
                {
                    if stream.write_all(&[*byte]).await.is_err() {
                        return started.elapsed();
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    if started.elapsed() > Duration::from_secs(60) {
                        break;
                    }
                }
                started.elapsed()
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_secs(2)).await;
    let response = http
        .post(format!("{}/v1/ingest/orders", host.url))
        .bearer_auth(ACME_KEY)
        .body("{\"id\":1}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202, "a tenant is served meanwhile");
    let loaded = rss_bytes(host.child.id());

    for answer in oversized {
        let answer = answer.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer:?}");
    }
    for cut_off in trickling {
        let lasted = cut_off.await.unwrap();
        assert!(
            lasted < Duration::from_secs(30),
            "a client trickling its headers stayed connected {lasted:?}"
        );
    }
    println!(
        "hostile clients: RSS {} MiB idle, {} MiB with 200 hostile connections open",
        idle >> 20,
        loaded >> 20
    );
    assert!(
        loaded < idle + (50 << 20),
        "RSS grew from {} to {} MiB",
        idle >> 20,
        loaded >> 20
    );
}

/// `/v1/status` shows tenants' usage only to an admin key (all) or a
/// tenant's key (its own), and where NATS is only to an admin key, with
/// the password redacted.
#[tokio::test(flavor = "multi_thread")]
async fn the_status_shows_tenants_and_nats_only_to_whom_it_may() {
    let nats = Nats::start_with("authorization { user: weir, password: s3cret-pw }");
    let url = nats.url().replace("nats://", "nats://weir:s3cret-pw@");
    let config = base_config(
        &url,
        "\n[[tenants]]\nname = \"beta\"\napi_keys = [\"beta-key-456\"]\n\
         \n[[tenants]]\nname = \"gamma\"\napi_keys = [\"gamma-key-000\"]\n",
    )
    .replace(
        "max_body_bytes = 1048576\n",
        "max_body_bytes = 1048576\nadmin_api_keys = [\"admin-key-789\"]\n",
    );
    let host = TestHost::start(&config).await;
    assert_eq!(host.ingest("orders", orders(0, 3)).await.status(), 202);
    let beta = host
        .http
        .post(host.url("/v1/ingest/orders"))
        .bearer_auth("beta-key-456")
        .body(orders(3, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(beta.status(), 202);

    let base = host.url("");
    let as_key = |key: Option<&'static str>| {
        let base = base.clone();
        async move { weir::client::fetch_status(&base, key).await.unwrap() }
    };
    // An admin sees every tenant, the idle one at zero.
    let admin = as_key(Some("admin-key-789")).await;
    let every: Vec<&str> = admin.tenants.iter().map(|t| t.tenant.as_str()).collect();
    assert_eq!(every, ["acme", "beta", "gamma"]);
    let gamma = &admin.tenants[2];
    assert_eq!((gamma.queued_rows, gamma.recent_rows), (0, 0));
    assert!(
        admin.nats.url.contains("weir:***@") && !admin.nats.url.contains("s3cret-pw"),
        "{}",
        admin.nats.url
    );
    let acme = as_key(Some(ACME_KEY)).await;
    let seen: Vec<&str> = acme.tenants.iter().map(|t| t.tenant.as_str()).collect();
    assert_eq!(seen, vec!["acme"]);
    assert_eq!(acme.nats.url, "");
    let anyone = as_key(None).await;
    assert!(anyone.tenants.is_empty(), "{:?}", anyone.tenants);
    assert_eq!(anyone.nats.url, "");
    let raw = host.get_text("/v1/status").await;
    assert!(!raw.contains("s3cret-pw") && !raw.contains("beta"), "{raw}");
    host.shutdown().await;
}

/// Guessing keys is slowed: past 20 unknown keys from one address within a
/// minute, that address is answered 429 with Retry-After without its key
/// being looked at (a right guess included); a request without any key is
/// a plain 401 and does not count.
#[tokio::test(flavor = "multi_thread")]
async fn an_address_guessing_api_keys_is_slowed() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    let post = |key: Option<String>| {
        let request = host
            .http
            .post(host.url("/v1/ingest/orders"))
            .body("{\"id\":1}\n");
        let request = match key {
            Some(key) => request.bearer_auth(key),
            None => request,
        };
        async move { request.send().await.unwrap() }
    };
    for _ in 0..30 {
        assert_eq!(post(None).await.status(), 401, "no key is not a guess");
    }
    assert_eq!(post(Some(ACME_KEY.to_string())).await.status(), 202);
    for guess in 0..20 {
        assert_eq!(post(Some(format!("guess-{guess:04}"))).await.status(), 401);
    }
    let slowed = post(Some("guess-0020".to_string())).await;
    assert_eq!(slowed.status(), 429);
    let retry_after: u64 = slowed.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    assert_eq!(
        post(Some(ACME_KEY.to_string())).await.status(),
        429,
        "a right guess is not told apart while the address is slowed"
    );
    host.shutdown().await;
}

/// Many large requests at once all get their answer: each request keeps its
/// own PubAcks moving while it waits for room to publish, so requests never
/// wait on each other's unread acks (async-nats bounds acks in flight per
/// connection).
#[tokio::test(flavor = "multi_thread")]
async fn many_large_requests_at_once_are_all_answered() {
    const REQUESTS: usize = 10;
    const ROWS: usize = 8_000;
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    let requests = (0..REQUESTS).map(|request| {
        let body = orders(request * ROWS, ROWS);
        let (http, url) = (host.http.clone(), host.url("/v1/ingest/orders"));
        async move {
            http.post(url)
                .bearer_auth(ACME_KEY)
                .body(body)
                .send()
                .await
                .map(|response| response.status().as_u16())
        }
    });
    let answers = tokio::time::timeout(
        Duration::from_secs(120),
        futures::future::join_all(requests),
    )
    .await
    .expect("every request answered (a hang here is publishes waiting on each other)");
    for answer in answers {
        assert_eq!(answer.unwrap(), 202);
    }
}

/// A full partition refuses row k: no row after it is stored, so the
/// producer's retry cannot store row k behind its own later rows. Rows with
/// fresh ids go as a fast batch (the rows before k are stored), rows that
/// may be stored already as atomic batches (all or nothing), and a batch
/// that outgrows even an empty partition is a 413 with nothing stored. The
/// publisher is driven directly against the partition stream weir creates,
/// with no consumer, so the stream's fill is exact.
#[tokio::test(flavor = "multi_thread")]
async fn a_row_refused_by_a_full_partition_leaves_no_later_row_stored() {
    use bytes::Bytes;
    use weir::ingest::{Ids, Placement, PublishError};
    use weir::topology::Unit;

    let nats = Nats::start();
    let bare = BarePartition::create(&nats, "max_bytes = \"16KiB\"").await;
    let (js, partition, publisher) = (&bare.js, &bare.partition, bare.publisher());
    let placement = Placement::Table(Unit {
        partition: 0,
        shard: 0,
    });
    let rows = |names: &[(&str, usize)]| -> Vec<(Bytes, Option<String>)> {
        names
            .iter()
            .map(|(name, size)| {
                let payload = format!("{name}:{}", "x".repeat(*size));
                (Bytes::from(payload), Some(format!("id-{name}")))
            })
            .collect()
    };
    // The names of the rows the partition holds, in stream order.
    let stored = || async {
        let payloads = bare.stored().await;
        let names = payloads
            .iter()
            .map(|p| p.split(':').next().unwrap_or_default());
        names.map(str::to_string).collect::<Vec<_>>()
    };
    let publish = |rows, ids| publisher.publish("acme", "orders", &placement, rows, ids, None);

    // 10 KB of the partition's 16 KiB.
    let fill: Vec<(String, usize)> = (0..10).map(|i| (format!("f{i}"), 1000)).collect();
    let fill: Vec<(&str, usize)> = fill.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let published = publish(rows(&fill), Ids::Fresh).await.unwrap();
    assert_eq!((published.stored, published.duplicates), (10, 0));

    // b1 does not fit; b2, small, would.
    let request = [("b0", 1000), ("b1", 5000), ("b2", 10)];
    let refused = publish(rows(&request), Ids::Fresh).await;
    assert!(
        matches!(refused, Err(PublishError::StreamFull(_))),
        "{refused:?}"
    );
    let mut expected: Vec<String> = fill.iter().map(|(n, _)| n.to_string()).collect();
    expected.push("b0".into());
    assert_eq!(
        stored().await,
        expected,
        "a fast batch stores the rows before the refused one, and none after"
    );

    // The retry: b0 is stored already, b1 still does not fit.
    for ids in [Ids::MaybeStored, Ids::Retry] {
        let refused = publish(rows(&request), ids).await;
        assert!(
            matches!(refused, Err(PublishError::StreamFull(_))),
            "{refused:?}"
        );
        assert_eq!(
            stored().await,
            expected,
            "a retry stored a row behind a refused one ({ids:?})"
        );
    }

    // Delivery makes room; the retry stores the rest, in order.
    let stream = js.get_stream(&partition).await.unwrap();
    for sequence in 1..=10 {
        stream.delete_message(sequence).await.unwrap();
    }
    let published = publish(rows(&request), Ids::MaybeStored).await.unwrap();
    assert_eq!((published.stored, published.duplicates), (3, 1));
    assert_eq!(stored().await, ["b0", "b1", "b2"]);

    // An atomic batch is stored whole or not at all: s0 would fit alone.
    let refused = publish(rows(&[("s0", 5000), ("s1", 8000)]), Ids::MaybeStored).await;
    assert!(
        matches!(refused, Err(PublishError::StreamFull(_))),
        "{refused:?}"
    );
    assert_eq!(stored().await, ["b0", "b1", "b2"]);

    // Larger than the partition can ever hold: refused before a row is sent.
    let huge: Vec<(String, usize)> = (0..20).map(|i| (format!("h{i}"), 1000)).collect();
    let huge: Vec<(&str, usize)> = huge.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    for ids in [Ids::Fresh, Ids::MaybeStored, Ids::Retry] {
        let refused = publish(rows(&huge), ids).await;
        assert!(
            matches!(
                refused,
                Err(PublishError::LargerThanPartition {
                    first: 0,
                    last: 19,
                    ..
                })
            ),
            "{refused:?}"
        );
    }
    assert_eq!(stored().await, ["b0", "b1", "b2"]);

    // No stream for the partition (it is electing a leader, or gone): a
    // retryable 503, whichever way the rows go.
    js.delete_stream(&partition).await.unwrap();
    for ids in [Ids::Fresh, Ids::MaybeStored, Ids::Retry] {
        let refused = publish(rows(&[("n0", 10), ("n1", 10)]), ids).await;
        assert!(
            matches!(refused, Err(PublishError::Unavailable(_))),
            "{refused:?}"
        );
    }
}

pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn zstd(bytes: &[u8]) -> Vec<u8> {
    zstd::stream::encode_all(bytes, 3).unwrap()
}

/// Bodies come gzip- or zstd-compressed, and as a JSON array of objects
/// besides NDJSON; the decompressed size counts against `max_body_bytes`
/// (a bomb is a 413, nothing stored), an unknown encoding is a 415, and a
/// bad element of an array is named by its position.
#[tokio::test(flavor = "multi_thread")]
async fn compressed_and_array_bodies_are_accepted_and_bombs_refused() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    let post = |encoding: Option<&'static str>, json: bool, body: Vec<u8>| {
        let mut request = host
            .http
            .post(host.url("/v1/ingest/orders"))
            .bearer_auth(ACME_KEY)
            .body(body);
        if let Some(encoding) = encoding {
            request = request.header("content-encoding", encoding);
        }
        if json {
            request = request.header("content-type", "application/json; charset=utf-8");
        }
        async move { error_of(request.send().await.unwrap()).await }
    };

    let (status, body) = post(Some("gzip"), false, gzip(orders(0, 100).as_bytes())).await;
    assert_eq!(
        (status, body["accepted"].as_u64()),
        (202, Some(100)),
        "{body}"
    );
    let (status, body) = post(Some("zstd"), false, zstd(orders(100, 100).as_bytes())).await;
    assert_eq!(
        (status, body["accepted"].as_u64()),
        (202, Some(100)),
        "{body}"
    );
    let array = |start: usize, count: usize| -> Vec<u8> {
        let text = orders(start, count);
        let rows: Vec<&str> = text.lines().collect();
        format!("[\n  {}\n]", rows.join(",\n  ")).into_bytes()
    };
    let (status, body) = post(None, true, array(200, 3)).await;
    assert_eq!(
        (status, body["accepted"].as_u64()),
        (202, Some(3)),
        "{body}"
    );
    let (status, body) = post(Some("gzip"), true, gzip(&array(203, 50))).await;
    assert_eq!(
        (status, body["accepted"].as_u64()),
        (202, Some(50)),
        "{body}"
    );

    // Refused, each naming what and where; none of it is stored.
    let (status, body) = post(None, true, b"[{\"id\":-1}, [1], {\"id\":-2}]".to_vec()).await;
    assert_eq!((status, body["line"].as_u64()), (400, Some(2)), "{body}");
    assert_eq!(body["error"], "row 2: a row must be a JSON object");
    let (status, body) = post(None, true, b"[{\"id\":-1},\n {\"id\": oops}]".to_vec()).await;
    assert_eq!((status, body["line"].as_u64()), (400, Some(2)), "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("row 2: invalid JSON array"),
        "{body}"
    );
    let (status, body) = post(Some("br"), false, orders(0, 1).into_bytes()).await;
    assert_eq!(status, 415, "{body}");
    assert!(body["error"].as_str().unwrap().contains("`br`"), "{body}");
    let (status, body) = post(Some("gzip"), false, orders(0, 1).into_bytes()).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("not valid gzip"),
        "{body}"
    );
    // 64 MiB of one byte: kilobytes compressed, 64 times the 1 MiB limit.
    let bomb = vec![b' '; 64 << 20];
    for (encoding, compressed) in [("gzip", gzip(&bomb)), ("zstd", zstd(&bomb))] {
        assert!(
            compressed.len() < 1 << 20,
            "{encoding}: {}",
            compressed.len()
        );
        let (status, body) = post(Some(encoding), false, compressed).await;
        assert_eq!(status, 413, "{encoding}: {body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .contains("decompresses to more than the limit of 1048576 bytes"),
            "{body}"
        );
    }

    drained(&nats.client().await).await;
    let mut ids = host.sink_ids("orders");
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..253).collect::<Vec<u64>>(),
        "each accepted row once, no refused one"
    );
    host.shutdown().await;
}

/// A body over `max_body_bytes` gets a 413 that a client sending it whole
/// before reading (Python's `http.client`) reads, instead of a broken
/// pipe: the host reads and drops the rest (up to a bound) before
/// answering. Both with a `Content-Length` (refused before the body) and
/// chunked (refused once the limit is passed).
#[tokio::test(flavor = "multi_thread")]
async fn a_body_over_the_limit_gets_a_413_python_http_client_reads() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    let port = host.url("").rsplit(':').next().unwrap().to_string();
    let script = r#"
import http.client, sys
port, key = int(sys.argv[1]), sys.argv[2]
row = b'{"id": 1, "pad": "' + b'x' * 80 + b'"}\n'
body = row * (16 * 1024 * 1024 // len(row))
headers = {"Authorization": "Bearer " + key}
for chunked in (False, True):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    payload = iter([body[i:i + 65536] for i in range(0, len(body), 65536)]) if chunked else body
    conn.request("POST", "/v1/ingest/orders", body=payload, headers=headers, encode_chunked=chunked)
    answer = conn.getresponse()
    print(answer.status, answer.read().decode())
    conn.close()
"#;
    let output = tokio::process::Command::new("python3")
        .args(["-c", script, &port, ACME_KEY])
        .output()
        .await
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answers: Vec<&str> = stdout.lines().collect();
    assert_eq!(answers.len(), 2, "{stdout}");
    for answer in answers {
        assert!(
            answer.starts_with("413 ") && answer.contains("larger than the limit of 1048576 bytes"),
            "{answer}"
        );
    }
    let client = nats.client().await;
    assert_eq!(backlog(&client).await.2, 0, "nothing was stored");
    host.shutdown().await;
}

/// The dead letters in the stream: (line, reason, payload), by line.
async fn ingest_letters(client: &async_nats::Client) -> Vec<(u64, String, String)> {
    use weir::delivery::headers;
    let mut letters: Vec<(u64, String, String)> = crate::support::read_stream(client, "weir_dlq")
        .await
        .iter()
        .map(|letter| {
            let header = |name: &str| crate::support::header_of(letter, name);
            assert_eq!(
                (header(headers::TENANT), header(headers::TABLE)),
                ("acme".into(), "orders".into())
            );
            (
                header(headers::LINE).parse().unwrap(),
                header(headers::REASON),
                String::from_utf8_lossy(&letter.payload).into_owned(),
            )
        })
        .collect();
    letters.sort();
    letters
}

/// With `bad_lines = "dead-letter"` a request's good rows are stored and
/// each bad line goes to the dead-letter stream with its line number and
/// reason, the answer saying how many of each and which; `Weir-Bad-Lines`
/// picks the other way per request; a retry stores nothing twice.
#[tokio::test(flavor = "multi_thread")]
async fn bad_lines_go_to_the_dead_letter_stream_when_the_table_says_so() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "bad_lines = \"dead-letter\"\n")).await;
    let body = format!(
        "{}{{\"id\": oops}}\n{}not json\n\n{}[7]\n",
        orders(0, 3),
        orders(3, 2),
        orders(5, 1)
    );
    let post = |body: String, headers: &[(&'static str, &'static str)]| {
        let mut request = host
            .http
            .post(host.url("/v1/ingest/orders"))
            .bearer_auth(ACME_KEY)
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        async move { error_of(request.send().await.unwrap()).await }
    };
    let (status, answer) = post(body.clone(), &[("Idempotency-Key", "bad-1")]).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(
        (
            answer["accepted"].as_u64(),
            answer["duplicates"].as_u64(),
            answer["dead_lettered"].as_u64()
        ),
        (Some(6), Some(0), Some(3)),
        "{answer}"
    );
    let lines: Vec<u64> = answer["bad_lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|bad| bad["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, [4, 7, 10], "{answer}");
    assert!(
        answer["bad_lines"][0]["error"]
            .as_str()
            .unwrap()
            .starts_with("line 4: invalid JSON"),
        "{answer}"
    );
    // The same request again: nothing stored twice, letters included.
    let (status, again) = post(body.clone(), &[("Idempotency-Key", "bad-1")]).await;
    assert_eq!(status, 202, "{again}");
    assert_eq!(
        (
            again["accepted"].as_u64(),
            again["duplicates"].as_u64(),
            again["dead_lettered"].as_u64()
        ),
        (Some(6), Some(6), Some(3)),
        "{again}"
    );
    // Per request, the other way: all or nothing, as before.
    let (status, refused) = post(body.clone(), &[("Weir-Bad-Lines", "refuse")]).await;
    assert_eq!(
        (status, refused["line"].as_u64()),
        (400, Some(4)),
        "{refused}"
    );
    let (status, refused) = post(body, &[("Weir-Bad-Lines", "maybe")]).await;
    assert_eq!(status, 400, "{refused}");
    // Numbered from the line the client says its body starts at.
    let (status, answer) = post(
        format!("{}{{\"id\":\n", orders(6, 2)),
        &[("Weir-First-Line", "1001")],
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["bad_lines"][0]["line"], 1003, "{answer}");

    let client = nats.client().await;
    let letters = ingest_letters(&client).await;
    let seen: Vec<(u64, &str)> = letters
        .iter()
        .map(|(line, _, payload)| (*line, payload.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (4, "{\"id\": oops}"),
            (7, "not json"),
            (10, "[7]"),
            (1003, "{\"id\":")
        ],
        "one letter per bad line, the line as sent"
    );
    assert!(
        letters[2]
            .1
            .contains("line 10: a row must be a JSON object"),
        "{letters:?}"
    );
    drained(&client).await;
    let mut ids = host.sink_ids("orders");
    ids.sort_unstable();
    assert_eq!(ids, (0..8).collect::<Vec<u64>>(), "every good row once");
    host.shutdown().await;
}

/// weir's topology of one partition (`stream_keys` added to its
/// `[stream]`) with only its partition stream, created directly: no
/// consumer takes a row, so what it holds is exactly what was published.
pub(crate) struct BarePartition {
    config: weir::config::Config,
    router: weir::topology::Names,
    client: async_nats::Client,
    js: async_nats::jetstream::Context,
    partition: String,
}

impl BarePartition {
    async fn create(nats: &Nats, stream_keys: &str) -> BarePartition {
        BarePartition::create_on(nats.url(), nats.client().await, stream_keys).await
    }

    /// On any server (or cluster) `client` reaches at `url`.
    pub(crate) async fn create_on(
        url: &str,
        client: async_nats::Client,
        stream_keys: &str,
    ) -> BarePartition {
        let config = base_config(url, "").replace(
            "[stream]\ncreate = true",
            &format!("[stream]\ncreate = true\npartitions = 1\n{stream_keys}"),
        );
        let config = weir::config::Config::parse(
            std::path::Path::new("weir.toml"),
            &config,
            &Default::default(),
        )
        .unwrap();
        let router = weir::topology::Names::new(&config.stream.prefix, 1, 1);
        let manifest =
            weir::topology::Manifest::new(&router, &config.stream, &config.delivery, None);
        let js = crate::support::patient_jetstream(client.clone());
        let partition = router.partition_stream(0);
        let stream = manifest.streams.iter().find(|s| s.name == partition);
        js.create_stream(stream.unwrap().clone()).await.unwrap();
        // A replicated stream answers publishes only once it has elected a
        // leader: before that the front door finds no stream (CI saw it).
        crate::support::eventually(
            std::time::Duration::from_secs(30),
            "the partition stream has a leader",
            || async {
                let mut stream = js.get_stream(&partition).await.ok()?;
                let info = stream.info().await.ok()?;
                let led = info.cluster.as_ref().is_none_or(|c| c.leader.is_some());
                led.then_some(())
            },
        )
        .await;
        BarePartition {
            config,
            router,
            client,
            js,
            partition,
        }
    }

    /// The front door's publisher into it.
    fn publisher(&self) -> weir::ingest::Publisher {
        let (client, router) = (self.client.clone(), self.router.clone());
        weir::ingest::Publisher::new(client, router, self.config.stream.max_bytes)
    }

    /// The payloads it holds, in stream order (a work-queue stream takes no
    /// second consumer: rows are read one sequence at a time).
    async fn stored(&self) -> Vec<String> {
        let mut stream = self.js.get_stream(&self.partition).await.unwrap();
        let state = stream.info().await.unwrap().state.clone();
        let mut payloads = Vec::new();
        for sequence in state.first_sequence..=state.last_sequence {
            if let Ok(message) = stream.get_raw_message(sequence).await {
                payloads.push(String::from_utf8_lossy(&message.payload).to_string());
            }
        }
        payloads
    }
}

/// Retries of partly stored requests, through the front door's publisher:
/// each new row is stored once and in request order, the stored ones are
/// counted as duplicates, and usage counts only the new rows, whether the
/// stored rows are the first part (a request cut short) or scattered
/// (rows with their own keys sent before).
pub(crate) async fn partly_stored_retries(bare: &BarePartition) {
    use bytes::Bytes;
    use weir::ingest::{Ids, Placement};
    use weir::topology::Unit;

    let publisher = bare.publisher();
    let placement = Placement::Table(Unit {
        partition: 0,
        shard: 0,
    });
    // Row `name` carries the id `id-name` unless told otherwise.
    let rows = |names: &[&str]| -> Vec<(Bytes, Option<String>)> {
        names
            .iter()
            .map(|name| {
                let (name, id) = match name.split_once('=') {
                    Some((name, "")) => (name, None),
                    Some((name, id)) => (name, Some(format!("id-{id}"))),
                    None => (*name, Some(format!("id-{name}"))),
                };
                (Bytes::from(format!("{name}:payload")), id)
            })
            .collect()
    };
    let publish = |names: Vec<String>, ids| {
        let (publisher, placement) = (publisher.clone(), placement.clone());
        async move {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            publisher
                .publish("acme", "orders", &placement, rows(&names), ids, None)
                .await
                .unwrap()
        }
    };
    let named = |prefix: &str, range: std::ops::Range<usize>| -> Vec<String> {
        range.map(|i| format!("{prefix}{i}")).collect()
    };
    let stored = || async {
        let payloads = bare.stored().await;
        payloads
            .iter()
            .map(|p| p.split(':').next().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    };
    let new_rows = |published: &weir::ingest::Published| -> (u64, u64) {
        published
            .accepts
            .iter()
            .fold((0, 0), |(rows, bytes), a| (rows + a.rows, bytes + a.bytes))
    };
    let bytes_of = |names: &[String]| -> u64 {
        names
            .iter()
            .map(|n| format!("{n}:payload").len() as u64)
            .sum()
    };

    // A request cut short: the first 1500 of 2500 rows stored, in more than
    // one atomic batch's worth.
    let all = named("h", 0..2500);
    publish(all[..1500].to_vec(), Ids::Fresh).await;
    let published = publish(all.clone(), Ids::Retry).await;
    assert_eq!((published.stored, published.duplicates), (2500, 1500));
    assert_eq!(new_rows(&published), (1000, bytes_of(&all[1500..])));
    assert_eq!(stored().await, all, "each row once, in request order");

    // Sent again whole, either way: every row a duplicate, nothing stored.
    for ids in [Ids::Retry, Ids::MaybeStored] {
        let published = publish(all.clone(), ids).await;
        assert_eq!((published.stored, published.duplicates), (2500, 2500));
        assert_eq!(new_rows(&published), (0, 0));
        assert_eq!(stored().await, all);
    }

    // Scattered: every seventh row, and the last, stored before.
    let scattered = named("s", 0..1200);
    let before: Vec<String> = scattered
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 7 == 3 || *i == 1199)
        .map(|(_, name)| name.clone())
        .collect();
    publish(before.clone(), Ids::MaybeStored).await;
    let published = publish(scattered.clone(), Ids::MaybeStored).await;
    assert_eq!(
        (published.stored, published.duplicates),
        (1200, before.len())
    );
    let mut expected = all.clone();
    expected.extend(before.iter().cloned());
    expected.extend(scattered.iter().filter(|n| !before.contains(n)).cloned());
    assert_eq!(stored().await, expected, "the new rows once, in order");

    // The same id twice in one request, and a row without an id: the
    // first of the two is stored, the other is a duplicate.
    publish(vec!["b".into()], Ids::MaybeStored).await;
    let request = ["a", "b", "a2=a", "x=", "c"].map(String::from).to_vec();
    let published = publish(request, Ids::MaybeStored).await;
    assert_eq!((published.stored, published.duplicates), (5, 2));
    assert_eq!(new_rows(&published).0, 3);
    expected.extend(["b", "a", "x", "c"].map(String::from));
    assert_eq!(stored().await, expected);

    // A retry none of whose rows were stored (refused at once before).
    let untouched = named("u", 0..300);
    let published = publish(untouched.clone(), Ids::Retry).await;
    assert_eq!((published.stored, published.duplicates), (300, 0));
    assert_eq!(new_rows(&published), (300, bytes_of(&untouched)));
    expected.extend(untouched);
    assert_eq!(stored().await, expected);
}
#[tokio::test(flavor = "multi_thread")]
async fn partly_stored_retries_store_the_rest_once_in_order_and_count_it() {
    let nats = Nats::start();
    let bare = BarePartition::create(&nats, "").await;
    partly_stored_retries(&bare).await;
}
