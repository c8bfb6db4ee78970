//! `[traces]`: a collector the test runs (OTLP/HTTP, JSON) gets, for each
//! row posted to one host of a fleet of two, the request's `ingest` span
//! from that host (child of the producer's own `traceparent`) and a
//! `deliver` span from whichever host delivered the row, child of the
//! `ingest` span, with a child span per plugin call of the row's pipeline
//! naming the plugin and its version: one row's path across hosts in one
//! trace.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use serde_json::Value;

use crate::support::{
    ACME_KEY, Host, Nats, all_tables, balanced, eventually, fleet_config, written_rows,
};

/// A span as the collector got it.
#[derive(Debug, Clone)]
struct Received {
    host: String,
    name: String,
    trace: String,
    span: String,
    parent: String,
    /// String and integer attributes, as text.
    attributes: BTreeMap<String, String>,
}

/// The span id the producer's context names as the parent of every request.
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

fn attribute(attributes: &Value, key: &str) -> Option<String> {
    attributes
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .and_then(|a| a["value"]["stringValue"].as_str())
        .map(str::to_string)
}

/// An OTLP/HTTP JSON collector on a free port; returns its URL and spans.
async fn collector() -> (String, Arc<Mutex<Vec<Received>>>) {
    let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            axum::routing::post(
                |State(spans): State<Arc<Mutex<Vec<Received>>>>, body: axum::body::Bytes| async move {
                    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
                        return axum::http::StatusCode::BAD_REQUEST;
                    };
                    let mut spans = spans.lock().unwrap();
                    for resource in request["resourceSpans"].as_array().into_iter().flatten() {
                        let host = attribute(&resource["resource"]["attributes"], "service.instance.id")
                            .unwrap_or_default();
                        for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                            for span in scope["spans"].as_array().into_iter().flatten() {
                                let text = |key: &str| span[key].as_str().unwrap_or("").to_string();
                                let attributes = span["attributes"]
                                    .as_array()
                                    .into_iter()
                                    .flatten()
                                    .filter_map(|a| {
                                        let value = &a["value"];
                                        let value = value["stringValue"].as_str().map(str::to_string).or_else(|| {
                                            // OTLP/JSON writes 64-bit integers as strings.
                                            value["intValue"].as_str().map(str::to_string)
                                                .or_else(|| value["intValue"].as_i64().map(|n| n.to_string()))
                                        })?;
                                        Some((a["key"].as_str()?.to_string(), value))
                                    })
                                    .collect();
                                spans.push(Received {
                                    host: host.clone(),
                                    name: text("name"),
                                    trace: text("traceId"),
                                    span: text("spanId"),
                                    parent: text("parentSpanId"),
                                    attributes,
                                });
                            }
                        }
                    }
                    axum::http::StatusCode::OK
                },
            ),
        )
        .with_state(spans.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.expect("collector serves") });
    (url, spans)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_collector_gets_one_trace_per_row_from_the_front_door_to_the_sink_of_two_hosts() {
    let (collector, spans) = collector().await;
    let nats = Nats::start();
    let traced = format!("\n[traces]\notlp_endpoint = \"{collector}\"\n");
    let spawn = |id| Host::spawn_with(id, fleet_config(nats.url(), id, 0, 5) + &traced);
    let (a, b) = (spawn("trace-a"), spawn("trace-b"));
    balanced(&a, &["trace-a", "trace-b"]).await;
    // The versions the fleet runs, as status names them.
    let versions: BTreeMap<String, String> = a
        .status()
        .await
        .expect("trace-a's status")
        .plugins
        .into_iter()
        .map(|p| (p.name, p.version))
        .collect();

    // One row per request, each request in a trace of the producer's.
    let http = reqwest::Client::new();
    let mut traces: BTreeMap<String, u64> = BTreeMap::new();
    for (n, table) in all_tables().iter().enumerate() {
        let id = n as u64 + 1;
        let trace = format!("{:032x}", 0x5eed_0000_u128 + u128::from(id));
        let response = http
            .post(format!("{}/v1/ingest/{table}", a.url))
            .bearer_auth(ACME_KEY)
            .header("traceparent", format!("00-{trace}-{PRODUCER_SPAN}-01"))
            .body(format!("{{\"id\":{id},\"email\":\"u{id}@example.com\"}}\n"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202, "{table}");
        traces.insert(trace, id);
    }
    eventually(Duration::from_secs(60), "every row delivered", || async {
        let rows = written_rows(&[(a.id, a.dir.path()), (b.id, b.dir.path())]);
        (rows.values().map(Vec::len).sum::<usize>() == traces.len()).then_some(())
    })
    .await;
    let delivered_by: BTreeMap<u64, &str> =
        written_rows(&[(a.id, a.dir.path()), (b.id, b.dir.path())])
            .values()
            .flatten()
            .map(|row| (row.id, row.host))
            .collect();

    // Each trace: the front door's span, child of the producer's, and the
    // delivering host's, child of the front door's.
    let deliverers = eventually(Duration::from_secs(30), "every trace complete", || async {
        let spans = spans.lock().unwrap().clone();
        let mut deliverers = BTreeSet::new();
        for (trace, id) in &traces {
            let of_trace: Vec<&Received> = spans.iter().filter(|s| &s.trace == trace).collect();
            let ingest = of_trace
                .iter()
                .find(|s| s.name == "ingest" && s.host == "trace-a" && s.parent == PRODUCER_SPAN)?;
            let deliver = of_trace
                .iter()
                .find(|s| s.name == "deliver" && s.parent == ingest.span)?;
            assert_eq!(
                deliver.host, delivered_by[id],
                "row {id}: the deliver span comes from the host that wrote it"
            );
            // Each plugin of the pipeline, in a child span of the deliver
            // span naming the plugin and the version that ran the row.
            let mut calls: Vec<(String, String, String)> = Vec::new();
            for plugin in ["validate", "files"] {
                let call = of_trace
                    .iter()
                    .find(|s| s.parent == deliver.span && s.name == format!("plugin {plugin}"))?;
                calls.push((
                    call.attributes.get("weir.plugin")?.clone(),
                    call.attributes.get("weir.plugin.version")?.clone(),
                    call.attributes.get("weir.rows")?.clone(),
                ));
            }
            let expected: Vec<(String, String, String)> = ["validate", "files"]
                .iter()
                .map(|p| (p.to_string(), versions[*p].clone(), "1".to_string()))
                .collect();
            assert_eq!(calls, expected, "row {id}: its plugin calls");
            deliverers.insert(deliver.host.clone());
        }
        Some(deliverers)
    })
    .await;
    assert_eq!(
        deliverers,
        BTreeSet::from(["trace-a".to_string(), "trace-b".to_string()]),
        "rows delivered by both hosts, each traced from the front door of one"
    );
    let untraced = spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| !traces.contains_key(&s.trace))
        .count();
    println!(
        "traces: {} rows, each one trace from trace-a's front door to the sink of {deliverers:?}; {untraced} spans of other traces",
        traces.len()
    );
}
