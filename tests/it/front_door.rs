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
    let host = TestHost::start(&base_config(nats.url(), "")).await;
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
