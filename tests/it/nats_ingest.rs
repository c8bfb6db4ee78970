//! The NATS door against a real nats-server whose users are built from
//! what weir prints: the hosts from `weir mq permissions`, one producer per
//! tenant from `weir mq permissions --producer`. A producer cannot send as
//! another tenant (the server refuses it); rows sent over NATS are stored,
//! routed, budgeted and answered as over HTTP; an idempotency key dedupes
//! across the doors; a host killed while answering loses nothing it
//! acknowledged.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::front_door::gzip;
use crate::support::{
    ACME_KEY, Host, Nats, TestHost, backlog, base_config, eventually, free_port, operator, orders,
};

const BETA_KEY: &str = "beta-key-4567";
const STATUS: &str = weir::ingest::STATUS_HEADER;

/// The base config as an operator's NATS sees it (the test applies the
/// topology as admin; the host only verifies it), with a second tenant
/// `beta`. `extra` goes into the `orders` pipeline (and may add tables).
pub(crate) fn config(nats_url: &str, extra: &str) -> String {
    format!(
        "{}\n[[tenants]]\nname = \"beta\"\napi_keys = [\"{BETA_KEY}\"]\n",
        base_config(nats_url, extra).replace("[stream]\ncreate = true\n", "")
    )
}

/// `weir mq permissions --config CONFIG ARGS…`: its JSON, as text.
fn permissions(config: &str, args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, config).unwrap();
    let output = operator(&path, ["mq", "permissions"], args);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// A nats-server with an admin, the hosts' user `weir` and a producer user
/// per tenant (`acme`, `beta`, password `<name>-secret`), each with exactly
/// the permissions weir prints for `template`, and the topology applied.
pub(crate) struct Server {
    /// Kept running (and removed) with the server value.
    _nats: Nats,
    port: u16,
}

impl Server {
    pub(crate) fn start(template: &str) -> Server {
        Server::start_for(template, &["acme", "beta"], "")
    }

    /// The same, with a producer user for each of `tenants`, and
    /// `settings` in the server's config.
    fn start_for(template: &str, tenants: &[&str], settings: &str) -> Server {
        let host = permissions(template, &[]);
        let producers: String = tenants
            .iter()
            .map(|tenant| {
                let allowed = permissions(template, &["--producer", tenant]);
                format!("      {{ user: {tenant}, password: {tenant}-secret, permissions: {allowed} }}\n")
            })
            .collect();
        let nats = Nats::start_with(&format!(
            "{settings}\naccounts {{\n  APP {{\n    jetstream: enabled\n    users: [\n      {{ user: admin, password: admin-secret }}\n      {{ user: weir, password: weir-secret, permissions: {host} }}\n{producers}    ]\n  }}\n}}\n"
        ));
        let port = nats.server.port();
        let server = Server { _nats: nats, port };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weir.toml");
        std::fs::write(&path, template).unwrap();
        let applied = operator(
            &path,
            ["mq", "apply"],
            &["--nats-url", &server.url("admin")],
        );
        assert!(
            applied.status.success(),
            "{}",
            String::from_utf8_lossy(&applied.stderr)
        );
        server
    }

    pub(crate) fn url(&self, user: &str) -> String {
        format!("nats://{user}:{user}-secret@127.0.0.1:{}", self.port)
    }

    pub(crate) async fn admin(&self) -> async_nats::Client {
        async_nats::ConnectOptions::with_user_and_password("admin".into(), "admin-secret".into())
            .connect(format!("nats://127.0.0.1:{}", self.port))
            .await
            .unwrap()
    }

    /// A producer of `tenant` as the docs set it up: its own user, answers
    /// on its own inbox prefix. The server's errors arrive on the receiver.
    pub(crate) async fn producer(
        &self,
        tenant: &str,
    ) -> (async_nats::Client, mpsc::UnboundedReceiver<String>) {
        let (errors, received) = mpsc::unbounded_channel();
        let client = async_nats::ConnectOptions::with_user_and_password(
            tenant.into(),
            format!("{tenant}-secret"),
        )
        .custom_inbox_prefix(format!("_INBOX.weir.{tenant}"))
        .request_timeout(Some(Duration::from_secs(10)))
        .event_callback(move |event| {
            let errors = errors.clone();
            async move {
                if let async_nats::Event::ServerError(err) = event {
                    let _ = errors.send(err.to_string());
                }
            }
        })
        .connect(format!("nats://127.0.0.1:{}", self.port))
        .await
        .unwrap();
        (client, received)
    }
}

/// Sends `body` as a request to `subject` with `headers`: the answer's
/// `Weir-Status` and JSON body.
async fn request(
    client: &async_nats::Client,
    subject: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> (u16, serde_json::Value) {
    let mut map = async_nats::HeaderMap::new();
    for (name, value) in headers {
        map.insert(*name, *value);
    }
    let reply = client
        .request_with_headers(subject.to_string(), map, body.into())
        .await
        .unwrap_or_else(|err| panic!("no answer on {subject}: {err}"));
    let status = crate::support::header_of(&reply, STATUS);
    let status = status
        .parse()
        .unwrap_or_else(|_| panic!("{STATUS}: `{status}`"));
    (status, serde_json::from_slice(&reply.payload).unwrap())
}

/// POSTs `body` to `/v1/ingest/{table}` with `key` and `headers`.
async fn post(
    host: &TestHost,
    key: &str,
    table: &str,
    headers: &[(&str, &str)],
    body: impl Into<reqwest::Body>,
) -> (u16, serde_json::Value) {
    let mut request = host
        .http
        .post(host.url(&format!("/v1/ingest/{table}")))
        .bearer_auth(key)
        .body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

/// Waits until every stored row was delivered and acked.
async fn drained(client: &async_nats::Client) {
    eventually(
        Duration::from_secs(30),
        "every stored row delivered and acked",
        || async { (backlog(client).await == (0, 0, 0)).then_some(()) },
    )
    .await;
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_producer_sends_as_its_own_tenant_and_the_server_refuses_it_another() {
    let template = config("nats://127.0.0.1:1", "");
    let server = Server::start(&template);
    let host = TestHost::start(&config(&server.url("weir"), "")).await;
    let (acme, mut acme_errors) = server.producer("acme").await;
    let (beta, _) = server.producer("beta").await;

    let (status, answer) = request(&acme, "weir.ingest.acme.orders", &[], orders(0, 5)).await;
    assert_eq!(
        (status, answer["accepted"].as_u64()),
        (202, Some(5)),
        "{answer}"
    );
    let (status, answer) = request(&beta, "weir.ingest.beta.orders", &[], orders(100, 3)).await;
    assert_eq!(
        (status, answer["accepted"].as_u64()),
        (202, Some(3)),
        "{answer}"
    );

    // acme sending as beta: the server refuses the publish, no host sees it.
    let refused = tokio::time::timeout(
        Duration::from_secs(2),
        acme.request("weir.ingest.beta.orders", orders(200, 7).into()),
    )
    .await;
    assert!(
        !matches!(refused, Ok(Ok(_))),
        "no answer to a refused publish"
    );
    let error = tokio::time::timeout(Duration::from_secs(5), acme_errors.recv())
        .await
        .expect("the server says why")
        .unwrap();
    assert!(
        error.contains("Permissions Violation for Publish to \"weir.ingest.beta.orders\""),
        "{error}"
    );
    // Nor may it read beta's answers.
    let _spy = acme.subscribe("_INBOX.weir.beta.>").await.unwrap();
    let error = tokio::time::timeout(Duration::from_secs(5), acme_errors.recv())
        .await
        .expect("the server says why")
        .unwrap();
    assert!(
        error.contains("Permissions Violation for Subscription to \"_INBOX.weir.beta.>\""),
        "{error}"
    );

    // A tenant or table the config does not have is answered, by name.
    let admin = server.admin().await;
    let (status, answer) = request(&admin, "weir.ingest.nobody.orders", &[], orders(0, 1)).await;
    assert_eq!(status, 404, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("no tenant `nobody`"),
        "{answer}"
    );
    let (status, answer) = request(&admin, "weir.ingest.acme.nowhere", &[], orders(0, 1)).await;
    assert_eq!(
        (status, answer),
        post(&host, ACME_KEY, "nowhere", &[], orders(0, 1)).await,
        "the HTTP door's answer"
    );
    let (status, answer) = request(&admin, "weir.ingest.acme.orders.x", &[], orders(0, 1)).await;
    assert_eq!(status, 404, "{answer}");

    // The metrics tell the doors apart.
    let metrics = host.get_text("/metrics").await;
    for sample in [
        "weir_ingest_request_duration_seconds_count{door=\"nats\",code=\"202\"} 2",
        "weir_ingest_requests_refused_total{door=\"nats\",code=\"404\"} 3",
        "weir_ingest_requests_refused_total{door=\"http\",code=\"404\"} 1",
    ] {
        assert!(metrics.contains(sample), "no `{sample}` in:\n{metrics}");
    }

    drained(&admin).await;
    assert_eq!(host.sink_lines("orders").len(), 5);
    let beta_rows = host.dir.path().join("out/beta/orders.ndjson");
    assert_eq!(lines(&beta_rows), 3, "beta's rows only: none of acme's");

    // A producer's permissions are printed for a tenant of the config only.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, &template).unwrap();
    let unknown = operator(&path, ["mq", "permissions"], &["--producer", "nobody"]);
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("no tenant `nobody` in the config"),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );
    host.shutdown().await;
}

/// A tenant that only produces over NATS has no API key: the config is
/// valid (`weir check` clean), its producer's rows are stored, and the
/// HTTP door has no way in for it.
#[tokio::test(flavor = "multi_thread")]
async fn a_nats_only_tenant_needs_no_api_key() {
    let with_gamma = |url: &str| format!("{}\n[[tenants]]\nname = \"gamma\"\n", config(url, ""));
    let server = Server::start_for(&with_gamma("nats://127.0.0.1:1"), &["gamma"], "");
    let text = with_gamma(&server.url("weir"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, &text).unwrap();
    let checked = std::process::Command::new(crate::support::WEIR)
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );

    let host = TestHost::start(&text).await;
    let (gamma, _) = server.producer("gamma").await;
    let (status, answer) = request(&gamma, "weir.ingest.gamma.orders", &[], orders(0, 4)).await;
    assert_eq!(
        (status, answer["accepted"].as_u64()),
        (202, Some(4)),
        "{answer}"
    );
    // No key of the config is gamma's: over HTTP it is no one.
    let (status, _) = post(&host, "gamma-key-1234", "orders", &[], orders(10, 1)).await;
    assert_eq!(status, 401);
    drained(&server.admin().await).await;
    let rows = host.dir.path().join("out/gamma/orders.ndjson");
    assert_eq!(lines(&rows), 4, "gamma's rows stored");
    host.shutdown().await;
}

/// Every stored message of the partition streams: (subject, headers by
/// name, payload).
async fn stored(client: &async_nats::Client) -> Vec<(String, BTreeMap<String, String>, String)> {
    let mut found = Vec::new();
    for mut stream in crate::support::partition_streams(client).await {
        let state = stream.info().await.unwrap().state.clone();
        for sequence in state.first_sequence..=state.last_sequence {
            let Ok(message) = stream.get_raw_message(sequence).await else {
                continue;
            };
            let headers = message
                .headers
                .iter()
                .map(|(name, values)| {
                    let values: Vec<&str> = values.iter().map(|v| v.as_str()).collect();
                    (name.to_string(), values.join(","))
                })
                .collect();
            let payload = String::from_utf8_lossy(&message.payload).into_owned();
            found.push((message.subject.to_string(), headers, payload));
        }
    }
    found
}

/// Rows sent over NATS are stored with the subject (the router's route) and
/// headers HTTP rows get; a budget, a bad line, a compressed or array body
/// and a bomb are answered with the HTTP door's very answer.
#[tokio::test(flavor = "multi_thread")]
async fn rows_over_nats_are_stored_and_answered_exactly_as_over_http() {
    // `held` goes to a sink that is never there: its rows stay in their
    // streams to be read. acme is spread over 4 units by `user`; beta may
    // queue 5 rows.
    let extra = format!(
        r#"
[plugins.nowhere]
wasm = "weir_http_sink.wasm"
world = "sink"
settings = {{ url = "http://127.0.0.1:{port}/x" }}
grants.http = ["127.0.0.1:{port}"]

[[pipelines]]
tables = ["held"]
sink = "nowhere"

[policies]
budget = "budget"
router = "router"
routing_field = "user"

[plugins.budget]
wasm = "weir_tenant_budget.wasm"
world = "budget"
settings = {{ tenants = {{ beta = {{ queued_rows = 5 }} }} }}

[plugins.router]
wasm = "weir_hot_tenant_router.wasm"
world = "router"
settings = {{ hot_tenants = {{ acme = 4 }} }}
"#,
        port = free_port()
    );
    let for_url =
        |url: &str| config(url, &extra).replace("max_deliveries = 3", "max_deliveries = 1000");
    let server = Server::start(&for_url("nats://127.0.0.1:1"));
    let host = TestHost::start(&for_url(&server.url("weir"))).await;
    let (acme, _) = server.producer("acme").await;
    let (beta, _) = server.producer("beta").await;
    let admin = server.admin().await;

    let rows = |door: &str| -> String {
        (0..16)
            .map(|id| {
                format!(
                    "{{\"id\":{id},\"user\":\"u{}\",\"door\":\"{door}\"}}\n",
                    id % 8
                )
            })
            .collect()
    };
    let (status, answer) = post(
        &host,
        ACME_KEY,
        "held",
        &[("Idempotency-Key", "k-http")],
        rows("http"),
    )
    .await;
    assert_eq!(
        (status, answer["accepted"].as_u64()),
        (202, Some(16)),
        "{answer}"
    );
    let (status, answer) = request(
        &acme,
        "weir.ingest.acme.held",
        &[("Idempotency-Key", "k-nats")],
        rows("nats"),
    )
    .await;
    assert_eq!(
        (status, answer["accepted"].as_u64()),
        (202, Some(16)),
        "{answer}"
    );

    // Each NATS row is stored as its HTTP twin: same subject, same headers
    // (the message id names its own request key).
    let mut by_row: BTreeMap<(String, u64), (String, BTreeMap<String, String>)> = BTreeMap::new();
    for (subject, headers, payload) in stored(&admin).await {
        let row: serde_json::Value = serde_json::from_str(&payload).unwrap();
        let door = row["door"].as_str().unwrap().to_string();
        let headers = headers
            .into_iter()
            .map(|(name, value)| (name, value.replace(&format!("k-{door}"), "KEY")))
            .collect();
        by_row.insert((door, row["id"].as_u64().unwrap()), (subject, headers));
    }
    assert_eq!(by_row.len(), 32, "{by_row:?}");
    let mut subjects = BTreeSet::new();
    for id in 0..16 {
        let http = &by_row[&("http".to_string(), id)];
        let nats = &by_row[&("nats".to_string(), id)];
        assert_eq!(http, nats, "row {id}");
        assert!(http.1.contains_key("Nats-Msg-Id"), "{http:?}");
        subjects.insert(http.0.clone());
    }
    assert!(
        subjects.len() > 1,
        "the router spread acme's rows: {subjects:?}"
    );

    // The budget: beta may not queue 10 rows, whichever door.
    let nats = request(&beta, "weir.ingest.beta.orders", &[], orders(0, 10)).await;
    assert_eq!(nats.0, 403, "{}", nats.1);
    assert_eq!(
        nats,
        post(&host, BETA_KEY, "orders", &[], orders(0, 10)).await
    );

    // A bad line: refused by name, or dead-lettered when asked.
    let bad = format!("{}not json\n{}", orders(0, 1), orders(1, 1));
    let nats = request(&acme, "weir.ingest.acme.orders", &[], bad.clone()).await;
    assert_eq!(
        (nats.0, nats.1["line"].as_u64()),
        (400, Some(2)),
        "{}",
        nats.1
    );
    assert_eq!(
        nats,
        post(&host, ACME_KEY, "orders", &[], bad.clone()).await
    );
    let dead_letter = [("Weir-Bad-Lines", "dead-letter")];
    let nats = request(&acme, "weir.ingest.acme.orders", &dead_letter, bad.clone()).await;
    assert_eq!(
        (
            nats.0,
            nats.1["accepted"].as_u64(),
            nats.1["bad_lines"][0]["line"].as_u64()
        ),
        (202, Some(2), Some(2)),
        "{}",
        nats.1
    );
    assert_eq!(
        nats,
        post(&host, ACME_KEY, "orders", &dead_letter, bad).await
    );

    // Compressed and array bodies; a bomb is a 413.
    let gzipped = [("Content-Encoding", "gzip")];
    let (status, answer) = request(
        &acme,
        "weir.ingest.acme.orders",
        &gzipped,
        gzip(orders(10, 50).as_bytes()),
    )
    .await;
    assert_eq!(
        (status, answer["accepted"].as_u64()),
        (202, Some(50)),
        "{answer}"
    );
    let array = [("Content-Type", "application/json")];
    let (status, answer) = request(
        &acme,
        "weir.ingest.acme.orders",
        &array,
        "[{\"id\":70},{\"id\":71}]",
    )
    .await;
    assert_eq!(
        (status, answer["accepted"].as_u64()),
        (202, Some(2)),
        "{answer}"
    );
    let bomb = gzip(&vec![b' '; 2 << 20]);
    let nats = request(&acme, "weir.ingest.acme.orders", &gzipped, bomb.clone()).await;
    assert_eq!(nats.0, 413, "{}", nats.1);
    assert_eq!(nats, post(&host, ACME_KEY, "orders", &gzipped, bomb).await);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idempotency_key_dedupes_a_retry_across_the_doors() {
    let server = Server::start(&config("nats://127.0.0.1:1", ""));
    let host = TestHost::start(&config(&server.url("weir"), "")).await;
    let (acme, _) = server.producer("acme").await;
    let nats = |key: &'static str, body: String| {
        let acme = acme.clone();
        async move {
            request(
                &acme,
                "weir.ingest.acme.orders",
                &[("Idempotency-Key", key)],
                body,
            )
            .await
        }
    };
    let counts = |(status, answer): (u16, serde_json::Value)| {
        (
            status,
            answer["accepted"].as_u64(),
            answer["duplicates"].as_u64(),
        )
    };

    let http_first = post(
        &host,
        ACME_KEY,
        "orders",
        &[("Idempotency-Key", "k1")],
        orders(0, 10),
    )
    .await;
    assert_eq!(counts(http_first), (202, Some(10), Some(0)));
    assert_eq!(
        counts(nats("k1", orders(0, 10)).await),
        (202, Some(10), Some(10))
    );
    assert_eq!(
        counts(nats("k2", orders(10, 10)).await),
        (202, Some(10), Some(0))
    );
    let http_again = post(
        &host,
        ACME_KEY,
        "orders",
        &[("Idempotency-Key", "k2")],
        orders(10, 10),
    )
    .await;
    assert_eq!(counts(http_again), (202, Some(10), Some(10)));
    // The same key for other rows is refused, whichever door.
    let (status, answer) = nats("k1", orders(50, 10)).await;
    assert_eq!(status, 409, "{answer}");

    drained(&server.admin().await).await;
    assert_eq!(host.sink_lines("orders").len(), 20, "each row stored once");
    host.shutdown().await;
}

/// Two `weir run` hosts answer the producers' requests; one is killed
/// (SIGKILL) while answering. Every row a producer was answered 202 for is
/// delivered; what was not answered, the producer knows to send again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_killed_while_answering_loses_no_acknowledged_row() {
    let server = Server::start(&config("nats://127.0.0.1:1", ""));
    let host_config = |id: &str| {
        format!(
            "{}\n[coordination]\nhost_id = \"{id}\"\nmember_ttl = \"3s\"\n",
            config(&server.url("weir"), "")
        )
    };
    let a = Host::spawn_with("a", host_config("a"));
    let b = Host::spawn_with("b", host_config("b"));
    let http = reqwest::Client::new();
    for host in [&a, &b] {
        eventually(Duration::from_secs(60), "the host ready", || async {
            let ready = http.get(format!("{}/readyz", host.url)).send().await.ok()?;
            ready.status().is_success().then_some(())
        })
        .await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let mut producers = Vec::new();
    for producer in 0..4u64 {
        let (client, _) = server.producer("acme").await;
        let stop = stop.clone();
        producers.push(tokio::spawn(async move {
            let (mut acked, mut unanswered, mut request) = (Vec::new(), 0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let first = (request * 4 + producer) * 20;
                request += 1;
                let answer = request_rows(&client, first..first + 20).await;
                match answer {
                    Ok(Ok(reply)) if crate::support::header_of(&reply, STATUS) == "202" => {
                        acked.extend(first..first + 20)
                    }
                    _ => unanswered += 1,
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (acked, unanswered)
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut acked, mut unanswered) = (BTreeSet::new(), 0);
    for producer in producers {
        let (ids, missed) = producer.await.unwrap();
        acked.extend(ids);
        unanswered += missed;
    }
    assert!(
        acked.len() > 1000,
        "the load ran: {} rows acked",
        acked.len()
    );

    let hosts = [&a, &b];
    let missing = eventually(
        Duration::from_secs(60),
        "every acknowledged row delivered",
        || async {
            let delivered: BTreeSet<u64> = hosts
                .iter()
                .flat_map(|host| {
                    let text = std::fs::read_to_string(host.output("orders")).unwrap_or_default();
                    text.lines()
                        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
                        .filter_map(|row| row["id"].as_u64())
                        .collect::<Vec<_>>()
                })
                .collect();
            let missing: Vec<u64> = acked.difference(&delivered).copied().collect();
            missing.is_empty().then_some(missing)
        },
    )
    .await;
    println!(
        "acknowledged {} rows, {unanswered} requests unanswered, {} acknowledged rows missing",
        acked.len(),
        missing.len()
    );
    b.terminate();
}

/// Rows `ids` (`{"id":N}` each) to acme/orders as one NATS request,
/// waited for at most 5 s.
async fn request_rows(
    client: &async_nats::Client,
    ids: std::ops::Range<u64>,
) -> Result<Result<async_nats::Message, async_nats::RequestError>, tokio::time::error::Elapsed> {
    let body: String = ids.map(|id| format!("{{\"id\":{id}}}\n")).collect();
    tokio::time::timeout(
        Duration::from_secs(5),
        client.request("weir.ingest.acme.orders", body.into()),
    )
    .await
}

/// A host that stops drains its subscription: it takes no new request and
/// answers every one it took, so no producer waits out a timeout and every
/// row answered 202 is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopping_host_answers_every_request_it_took() {
    let server = Server::start(&config("nats://127.0.0.1:1", ""));
    let TestHost { host, dir, .. } = TestHost::start(&config(&server.url("weir"), "")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut producers = Vec::new();
    for producer in 0..8u64 {
        let (client, _) = server.producer("acme").await;
        let stop = stop.clone();
        producers.push(tokio::spawn(async move {
            let (mut acked, mut no_host, mut timed_out, mut request) =
                (Vec::new(), 0u64, Vec::new(), 0u64);
            while !stop.load(Ordering::Relaxed) {
                let first = (request * 8 + producer) * 50;
                request += 1;
                let answer = request_rows(&client, first..first + 50).await;
                match answer {
                    Ok(Ok(reply)) => {
                        let status = crate::support::header_of(&reply, STATUS);
                        assert_eq!(status, "202", "{:?}", reply.payload);
                        acked.extend(first..first + 50);
                    }
                    // Once the host stopped taking requests: no one to ask.
                    Ok(Err(err)) if err.kind() == async_nats::RequestErrorKind::NoResponders => {
                        no_host += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    _ => timed_out.push(first),
                }
            }
            (acked, no_host, timed_out)
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    host.shutdown().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut acked, mut no_host, mut timed_out) = (BTreeSet::new(), 0, Vec::new());
    let mut timed_out_per_producer = Vec::new();
    for producer in producers {
        let (ids, none, late) = producer.await.unwrap();
        acked.extend(ids);
        no_host += none;
        timed_out_per_producer.push(late.len());
        timed_out.extend(late);
    }
    assert!(
        acked.len() > 500,
        "the load ran: {} rows acked",
        acked.len()
    );
    assert!(no_host > 0, "requests after the stop found no host");
    // async-nats drops what the server sent in the last round trip before
    // it took the UNSUB of a draining subscription (the client forgets the
    // subscription before the server's PONG): such a request never reached
    // the door, and its producer retries. Only requests in flight then can
    // be lost, one per producer at most (each waits for its answer; how
    // many were in flight depends on the machine's load: 5 of 8 once under
    // CI). A request the door took is answered: nothing of an unanswered
    // one was stored (checked below).
    assert!(
        timed_out_per_producer.iter().all(|late| *late <= 1),
        "a producer had more than its request in flight at the stop unanswered: {timed_out_per_producer:?}"
    );

    // Every acknowledged row is delivered, or still in its stream.
    let admin = server.admin().await;
    let mut found: BTreeSet<u64> = stored(&admin)
        .await
        .iter()
        .filter_map(|(_, _, payload)| serde_json::from_str::<serde_json::Value>(payload).ok())
        .filter_map(|row| row["id"].as_u64())
        .collect();
    let written = std::fs::read_to_string(crate::support::output(dir.path(), "orders"));
    found.extend(
        written
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter_map(|row| row["id"].as_u64()),
    );
    let missing = acked.difference(&found).count();
    assert_eq!(missing, 0, "of {} acknowledged rows", acked.len());
    for first in timed_out {
        assert!(
            !(first..first + 50).any(|id| found.contains(&id)),
            "the request of rows {first}.. was taken, its rows stored, and left unanswered"
        );
    }
}

/// `weir send --nats` as `tenant`'s producer (user `<tenant>`, password
/// `<tenant>-secret`) to table `orders`, with `args`: its output.
async fn send_over_nats(port: u16, tenant: &str, args: &[&str]) -> std::process::Output {
    let password = format!("{tenant}-secret");
    let command = tokio::process::Command::new(crate::support::WEIR)
        .args(["send", "--quiet", "--table", "orders", "--tenant", tenant])
        .args(["--nats", &format!("nats://127.0.0.1:{port}")])
        .args(["--nats-user", tenant, "--nats-password", &password])
        .args(args)
        // An HTTP producer's settings in the environment are not used.
        .env("WEIR_API_KEY", "not-used-over-nats")
        .env("WEIR_URL", "http://127.0.0.1:1")
        .output();
    tokio::time::timeout(Duration::from_secs(120), command)
        .await
        .expect("weir send finishes")
        .expect("weir runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `weir send --nats` sends a file through the NATS door as over HTTP: the
/// same chunks, a refused chunk named by `file:line` while the rest goes,
/// `--fail-fast`, dead-lettered lines, the summary and exit code; with no
/// host serving the door, or no NATS at all, it stops with the reason
/// within `--timeout`.
#[tokio::test(flavor = "multi_thread")]
async fn weir_send_over_nats_chunks_reports_and_stops_as_over_http() {
    let server = Server::start(&config("nats://127.0.0.1:1", ""));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rows.ndjson");
    let mut rows = orders(0, 6);
    rows.push_str("{\"id\": broken\n");
    rows.push_str(&orders(100, 18));
    std::fs::write(&file, rows).unwrap();
    let file_arg = file.to_str().unwrap().to_string();

    // No host yet: nobody serves the door; said at once.
    let started = std::time::Instant::now();
    let output = send_over_nats(server.port, "acme", &[&file_arg]).await;
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains(
            "no weir host answers on weir.ingest.acme.orders: no weir host serves the NATS door (no responders)"
        ),
        "{}",
        text(&output.stderr)
    );
    // Not the request's own 60 s timeout.
    assert!(started.elapsed() < Duration::from_secs(30));

    let host = TestHost::start(&config(&server.url("weir"), "")).await;
    let chunks = ["--chunk-rows", "10", "-j", "2"];
    let output = send_over_nats(server.port, "acme", &[&chunks[..], &[&file_arg]].concat()).await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(5), "{stdout}{stderr}");
    assert!(
        stdout.starts_with(
            "15 rows accepted, 0 duplicates, 1 chunk refused (10 rows not stored), in "
        ),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!("{file_arg}:7: refused (400): invalid JSON")),
        "{stderr}"
    );

    // Again, bad lines dead-lettered: what was stored comes back as
    // duplicates, the bad line is named.
    let output = send_over_nats(
        server.port,
        "acme",
        &[&chunks[..], &["--bad-lines", "dead-letter", &file_arg]].concat(),
    )
    .await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("24 rows accepted, 15 duplicates, 1 line dead-lettered, in "),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!("{file_arg}:7: invalid JSON")),
        "{stderr}"
    );

    // --fail-fast: nothing after the refused chunk.
    let late = dir.path().join("late.ndjson");
    std::fs::write(&late, format!("{{\"id\": broken\n{}", orders(500, 30))).unwrap();
    let late_arg = late.to_str().unwrap();
    let output = send_over_nats(
        server.port,
        "acme",
        &["--chunk-rows", "10", "-j", "1", "--fail-fast", late_arg],
    )
    .await;
    assert_eq!(output.status.code(), Some(5), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains(&format!("{late_arg}:1: refused (400)")),
        "{}",
        text(&output.stderr)
    );
    drained(&server.admin().await).await;
    let ids: BTreeSet<u64> = host
        .sink_lines("orders")
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|row| row["id"].as_u64())
        .collect();
    let expected: BTreeSet<u64> = (0..6).chain(100..118).collect();
    assert_eq!(
        ids, expected,
        "each good row once, none after the fail-fast"
    );
    host.shutdown().await;

    // No NATS at all: the reason within --timeout.
    let started = std::time::Instant::now();
    let output = send_over_nats(free_port(), "acme", &["--timeout", "2", &file_arg]).await;
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("cannot reach NATS"),
        "{}",
        text(&output.stderr)
    );
    // Not the connection's own 10 s of retries.
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "{:?}",
        started.elapsed()
    );
}

/// A NATS message over the server's `max_payload` never reaches a host: a
/// client that checks (async-nats, as nats.go and nats-py do) refuses it
/// before sending, and the server answers one that does not check with
/// `-ERR 'Maximum Payload Violation'` and closes its connection. Nothing
/// is stored. `weir send --nats` keeps its chunks below the limit it
/// learns from the server, and refuses (413) only a line that alone is
/// over it, sending the rest.
#[tokio::test(flavor = "multi_thread")]
async fn a_body_over_the_servers_max_payload_is_refused_and_weir_send_splits_below_it() {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    const MAX_PAYLOAD: usize = 16 << 10;
    let template = config("nats://127.0.0.1:1", "");
    let server = Server::start_for(&template, &["acme"], "max_payload: 16384");
    let host = TestHost::start(&config(&server.url("weir"), "")).await;
    let (acme, _) = server.producer("acme").await;
    assert_eq!(acme.server_info().max_payload, MAX_PAYLOAD);
    let big = orders(0, 1000);
    assert!(big.len() > MAX_PAYLOAD);

    let refused = acme
        .request("weir.ingest.acme.orders", big.clone().into())
        .await
        .expect_err("over max_payload");
    assert_eq!(
        refused.kind(),
        async_nats::client::RequestErrorKind::MaxPayloadExceeded
    );
    assert!(
        refused
            .to_string()
            .contains("Payload size limit of 16384 exceeded"),
        "{refused}"
    );

    // A client that does not check: the server refuses it and hangs up.
    let socket = tokio::net::TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    let (read, mut write) = socket.into_split();
    let mut read = tokio::io::BufReader::new(read);
    let mut line = String::new();
    read.read_line(&mut line).await.unwrap();
    assert!(line.starts_with("INFO "), "{line}");
    let mut raw = format!(
        "CONNECT {{\"user\":\"acme\",\"pass\":\"acme-secret\",\"verbose\":false,\"pedantic\":false}}\r\nPUB weir.ingest.acme.orders _INBOX.weir.acme.raw {}\r\n",
        big.len()
    )
    .into_bytes();
    raw.extend_from_slice(big.as_bytes());
    raw.extend_from_slice(b"\r\n");
    // The server may hang up before reading it all.
    let _ = write.write_all(&raw).await;
    let mut said = Vec::new();
    loop {
        line.clear();
        match tokio::time::timeout(Duration::from_secs(5), read.read_line(&mut line)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(_)) => said.push(line.trim().to_string()),
            Err(_) => panic!("the server neither answered nor hung up: {said:?}"),
        }
    }
    assert!(
        said.iter()
            .any(|line| line == "-ERR 'Maximum Payload Violation'"),
        "{said:?}"
    );
    assert_eq!(
        weir::client::fetch_status(&host.url(""), None)
            .await
            .unwrap()
            .rows
            .accepted,
        0,
        "nothing stored"
    );

    // weir send --nats: 1000-row chunks (about 60 KB) go in pieces below
    // 16 KiB; a line longer than that alone is refused, by its place.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rows.ndjson");
    let mut rows = orders(0, 1000);
    rows.push_str(&format!(
        "{{\"id\":5000,\"pad\":\"{}\"}}\n",
        "x".repeat(MAX_PAYLOAD)
    ));
    rows.push_str(&orders(1000, 1000));
    std::fs::write(&file, rows).unwrap();
    let file_arg = file.to_str().unwrap();
    let output = send_over_nats(server.port, "acme", &[file_arg]).await;
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(5), "{stdout}{stderr}");
    assert!(
        stdout.starts_with(
            "2000 rows accepted, 0 duplicates, 1 chunk refused (1 row not stored), in "
        ),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!(
            "{file_arg}, lines 1001-1001: refused (413): over the NATS server's max_payload"
        )),
        "{stderr}"
    );
    drained(&server.admin().await).await;
    assert_eq!(host.sink_lines("orders").len(), 2000);
    host.shutdown().await;
}
