//! `/metrics` against `docs/metrics.md`: every documented metric is served
//! with its type and label set, nothing undocumented is served, and a run
//! with dead letters and refusals moves the metrics it should.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::support::{TestHost, base_config, eventually, orders};

/// Labelled families this test's run does not reach (their own tests do:
/// `sandbox`, `reload`, `topology`, and `a_severity_label_is_lowercase`
/// below); every other family must be served here, so each documented
/// label set is checked against real samples.
const NOT_EXERCISED: &[&str] = &[
    "weir_plugin_failures",
    // Only while a canary runs (tests/it/rollout.rs).
    "weir_canary_rows",
    "weir_plugin_counter",
    "weir_plugin_counter_refusals",
    "weir_reloads",
    "weir_topology_mismatches",
    // Only a row lost in flight with a NATS node (tests/it/cluster.rs).
    "weir_rows_out_of_order",
    // Only plugins calling http-batch (tests/it/enrich.rs).
    "weir_plugin_http_requests",
    // Only plugins granted state (tests/it/state.rs).
    "weir_state_writes",
    "weir_state_rows_settled_again",
];

/// One row of the doc table.
#[derive(Debug)]
struct Documented {
    kind: String,
    labels: BTreeSet<String>,
}

/// The doc table, by family name (a counter's `_total` taken off, as in
/// the `# TYPE` line).
fn documented() -> BTreeMap<String, Documented> {
    let doc = include_str!("../../docs/metrics.md");
    let mut table = BTreeMap::new();
    for line in doc.lines().filter(|line| line.starts_with("| `weir_")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`');
        let kind = cells[2].to_string();
        let labels = cells[3]
            .split(',')
            .map(|label| label.trim().trim_matches('`'))
            .filter(|label| !label.is_empty())
            .map(str::to_string)
            .collect();
        let family = match kind.as_str() {
            "counter" => name
                .strip_suffix("_total")
                .unwrap_or_else(|| panic!("counter {name} must end in _total")),
            _ => name,
        };
        let previous = table.insert(family.to_string(), Documented { kind, labels });
        assert!(previous.is_none(), "{name} is documented twice");
    }
    assert!(table.len() > 20, "the doc table was not found");
    table
}

/// What `/metrics` serves: each family's type, and the label names of each
/// of its samples (`le` of a bucket left out).
type Sample = (String, BTreeMap<String, String>, f64);

#[derive(Debug, Default)]
struct Scraped {
    kinds: BTreeMap<String, String>,
    /// By family: each sample's name, labels and value.
    samples: BTreeMap<String, Vec<Sample>>,
}

fn parse(text: &str) -> Scraped {
    let mut scraped = Scraped::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            scraped.kinds.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (name, labels, value) = sample(line);
        // The family: the longest declared name the sample's name extends.
        let family = scraped
            .kinds
            .keys()
            .filter(|family| {
                name == family.as_str()
                    || ["_total", "_bucket", "_sum", "_count", "_created"]
                        .iter()
                        .any(|suffix| name == format!("{family}{suffix}"))
            })
            .max_by_key(|family| family.len())
            .unwrap_or_else(|| panic!("sample {name} of no declared family"))
            .clone();
        let mut labels = labels;
        if name.ends_with("_bucket") {
            labels.remove("le");
        }
        scraped
            .samples
            .entry(family)
            .or_default()
            .push((name, labels, value));
    }
    scraped
}

/// `name{a="x",b="y"} value` → its parts (values may hold escaped quotes).
fn sample(line: &str) -> (String, BTreeMap<String, String>, f64) {
    let mut labels = BTreeMap::new();
    let (name, rest) = match line.find('{') {
        Some(open) => (&line[..open], &line[open + 1..]),
        None => {
            let (name, value) = line.split_once(' ').expect("name value");
            return (name.to_string(), labels, value.parse().expect("a number"));
        }
    };
    let mut chars = rest.char_indices().peekable();
    let mut key = String::new();
    let mut end = rest.len();
    while let Some((index, c)) = chars.next() {
        match c {
            '}' => {
                end = index + 1;
                break;
            }
            ',' => {}
            '=' => {
                assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "{line}");
                let mut value = String::new();
                while let Some((_, c)) = chars.next() {
                    match c {
                        '\\' => value.extend(chars.next().map(|(_, c)| c)),
                        '"' => break,
                        c => value.push(c),
                    }
                }
                labels.insert(std::mem::take(&mut key), value);
            }
            c => key.push(c),
        }
    }
    let value = rest[end..].trim().split(' ').next().expect("a value");
    (
        name.to_string(),
        labels,
        value.parse().expect("a numeric value"),
    )
}

async fn scrape(host: &TestHost) -> Scraped {
    parse(&host.get_text("/metrics").await)
}

fn value(scraped: &Scraped, sample: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let wanted: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    scraped
        .samples
        .values()
        .flatten()
        .find(|(name, found, _)| name == sample && *found == wanted)
        .map(|(_, _, value)| *value)
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_served_match_the_documented_table_and_count_a_run() {
    let nats = crate::support::Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;

    // 90 valid rows and 10 without `id`, which the validator dead-letters.
    let mut body = orders(0, 90);
    for n in 0..10 {
        body.push_str(&format!("{{\"email\":\"nobody{n}@example.com\"}}\n"));
    }
    assert_eq!(host.ingest("orders", body).await.status(), 202);
    assert_eq!(host.ingest("nowhere", orders(0, 1)).await.status(), 404);
    assert_eq!(host.ingest("orders", "not json\n").await.status(), 400);

    let scraped = eventually(Duration::from_secs(30), "100 rows settled", || async {
        let scraped = scrape(&host).await;
        let settled = value(&scraped, "weir_rows_delivered_total", &[])?
            + value(&scraped, "weir_rows_dead_lettered_total", &[])?;
        (settled == 100.0).then_some(scraped)
    })
    .await;

    let documented = documented();
    let served: BTreeSet<&String> = scraped
        .kinds
        .keys()
        .filter(|name| name.starts_with("weir_"))
        .collect();
    let in_doc: BTreeSet<&String> = documented.keys().collect();
    let undocumented: Vec<_> = served.difference(&in_doc).collect();
    assert!(
        undocumented.is_empty(),
        "served, not in docs/metrics.md: {undocumented:?}"
    );
    // A family without samples is not served at all (not even `# TYPE`).
    let missing: Vec<_> = in_doc
        .difference(&served)
        .filter(|family| !NOT_EXERCISED.contains(&family.as_str()))
        .collect();
    assert!(missing.is_empty(), "documented, not served: {missing:?}");
    for (family, doc) in &documented {
        let Some(kind) = scraped.kinds.get(family) else {
            continue;
        };
        assert_eq!(
            *kind, doc.kind,
            "{family}: served as {kind}, documented as {}",
            doc.kind
        );
        for (_, labels, _) in scraped.samples.get(family).into_iter().flatten() {
            let names: BTreeSet<String> = labels.keys().cloned().collect();
            assert_eq!(names, doc.labels, "{family}: labels served vs documented");
        }
    }

    let count = |name: &str, labels: &[(&str, &str)]| {
        value(&scraped, name, labels).unwrap_or_else(|| panic!("no {name}{labels:?}"))
    };
    assert_eq!(count("weir_rows_accepted_total", &[]), 100.0);
    assert_eq!(count("weir_rows_delivered_total", &[]), 90.0);
    assert_eq!(count("weir_rows_dead_lettered_total", &[]), 10.0);
    assert_eq!(
        count(
            "weir_dead_letters_total",
            &[("plugin", "validate"), ("cause", "verdict")]
        ),
        10.0
    );
    assert_eq!(
        count(
            "weir_ingest_requests_refused_total",
            &[("door", "http"), ("code", "404")]
        ),
        1.0
    );
    assert_eq!(
        count(
            "weir_ingest_requests_refused_total",
            &[("door", "http"), ("code", "400")]
        ),
        1.0
    );
    assert_eq!(
        count(
            "weir_ingest_request_duration_seconds_count",
            &[("door", "http"), ("code", "202")]
        ),
        1.0
    );
    assert_eq!(count("weir_accept_to_ack_seconds_count", &[]), 100.0);
    assert!(count("weir_batch_duration_seconds_count", &[]) >= 1.0);
    let version = |wasm: &str| weir::sandbox::version_of(&std::fs::read(wasm).unwrap());
    let (sink, validator) = (
        version(weir_test_artifacts::NDJSON_SINK),
        version(weir_test_artifacts::VALIDATOR),
    );
    assert!(
        count(
            "weir_plugin_call_duration_seconds_count",
            &[("plugin", "files"), ("world", "sink"), ("version", &sink)]
        ) >= 1.0
    );
    assert!(
        count(
            "weir_plugin_call_duration_seconds_count",
            &[
                ("plugin", "validate"),
                ("world", "transform"),
                ("version", &validator)
            ]
        ) >= 1.0
    );
    // The tests' topology, the default: four partitions of one shard, all owned here.
    assert_eq!(count("weir_units_owned", &[]), 4.0);
    assert_eq!(count("weir_units_unowned", &[]), 0.0);
    let pending = &scraped.samples["weir_unit_pending_rows"];
    assert!(
        pending
            .iter()
            .all(|(_, labels, value)| labels["unit"].starts_with("weir_in_") && *value == 0.0),
        "every unit that delivered says 0 rows left: {pending:?}"
    );
    let build = &scraped.samples["weir_build_info"];
    assert_eq!(build.len(), 1);
    assert_eq!(build[0].1["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(build[0].2, 1.0);

    host.shutdown().await;
}

/// A transform that drops the rows it finds invalid, before the same sink.
const DROPPING: &str = r#"
[plugins.lenient]
wasm = "weir_validator.wasm"
world = "transform"
settings = { required = ["id"], on_invalid = "drop" }

[[pipelines]]
tables = ["clicks"]
transforms = ["lenient"]
sink = "files"
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_row_is_counted_as_dropped_not_delivered() {
    let nats = crate::support::Nats::start();
    let host = TestHost::start(&base_config(nats.url(), DROPPING)).await;
    let mut body = orders(0, 7);
    for n in 0..3 {
        body.push_str(&format!("{{\"no_id\":{n}}}\n"));
    }
    assert_eq!(host.ingest("clicks", body).await.status(), 202);
    let scraped = eventually(Duration::from_secs(30), "10 rows settled", || async {
        let scraped = scrape(&host).await;
        let settled = value(&scraped, "weir_rows_delivered_total", &[])?
            + value(&scraped, "weir_rows_dropped_total", &[])?;
        (settled == 10.0).then_some(scraped)
    })
    .await;
    assert_eq!(value(&scraped, "weir_rows_delivered_total", &[]), Some(7.0));
    assert_eq!(value(&scraped, "weir_rows_dropped_total", &[]), Some(3.0));
    assert_eq!(
        value(&scraped, "weir_rows_dead_lettered_total", &[]),
        Some(0.0)
    );
    assert_eq!(
        host.sink_lines("clicks").len(),
        7,
        "the sink has the delivered rows"
    );

    // `weir status` says the same of this host.
    let status = host.get_text("/v1/status").await;
    let status: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
    assert_eq!(status["rows"]["delivered"], 7, "{status}");
    assert_eq!(status["rows"]["dropped"], 3, "{status}");
    host.shutdown().await;
}

#[test]
fn a_severity_label_is_lowercase() {
    use prometheus_client::registry::Registry;
    use weir::telemetry::{Metrics, SeverityLabels};
    use weir::topology::Severity;
    let metrics = Metrics::default();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    metrics
        .topology_mismatches
        .get_or_create(&SeverityLabels {
            severity: Severity::Required.as_str(),
        })
        .set(1);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("weir_topology_mismatches{severity=\"required\"} 1"),
        "{text}"
    );
}

/// The dashboard queries only documented metrics (a rename in code and
/// docs must reach it too).
#[test]
fn the_grafana_dashboard_queries_documented_metrics() {
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../../examples/grafana/weir.json"))
            .expect("the dashboard is JSON");
    let documented = documented();
    let mut queried = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a PromQL expression");
            let mut rest = expr;
            while let Some(start) = rest.find("weir_") {
                let name: String = rest[start..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                rest = &rest[start + name.len()..];
                queried.insert(name);
            }
        }
    }
    assert!(queried.len() > 10, "{queried:?}");
    for name in &queried {
        let family = ["_bucket", "_total"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        assert!(
            documented.contains_key(family),
            "the dashboard queries {name}, which docs/metrics.md does not list"
        );
    }
}
