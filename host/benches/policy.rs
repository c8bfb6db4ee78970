//! Benchmark: what the per-tenant policies cost the front door — the budget
//! once per request, the router once per table (remembered) or once per
//! request for a table routed by key — against the same calls with no
//! policy configured, measured side by side in one run.
//!
//! The policies are the shipped plugins (`weir_tenant_budget.wasm`,
//! `weir_hot_tenant_router.wasm`) called exactly as the front door calls
//! them (`policy::Policies`, pooled instances). Each figure is the median of
//! `WEIR_BENCH_SAMPLES` samples of `WEIR_BENCH_REQUESTS` calls, variants
//! taking turns so the machine's noise hits them alike.
//!
//! `cargo bench -p weir --bench policy`.

#[allow(dead_code)] // each bench uses part of the helpers
mod support;

use std::collections::HashMap;
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use weir::config::{Config, Overrides};
use weir::ingest::{Admit, Placement, Policies, Queued, Usage};
use weir::sandbox::{Plugin, Sandbox};
use weir::telemetry::Metrics;

use support::{Table, env_count, median, print_figure};

const BENCH: &str = "policy";
const DEFAULT_REQUESTS: usize = 2_000;
const DEFAULT_SAMPLES: usize = 11;
/// Rows per request routed by key.
const KEYED_ROWS: [usize; 3] = [1, 100, 1000];

fn config(with_policies: bool) -> String {
    let policies = if with_policies {
        "[policies]\nbudget = \"budget\"\nrouter = \"router\"\nrouting_field = \"user\"\n"
    } else {
        ""
    };
    format!(
        r#"
[stream]
partitions = 4
shards = 8

{policies}
[plugins.budget]
wasm = {budget:?}
world = "budget"
settings = {{ queued_bytes = 1_000_000_000, queued_rows = 10_000_000, rate_bytes_per_sec = 1_000_000_000, tenants.hot = {{ queued_bytes = 5_000_000_000 }} }}

[plugins.router]
wasm = {router:?}
world = "router"
settings = {{ hot_tenants = {{ hot = 8 }} }}
"#,
        budget = weir_test_artifacts::TENANT_BUDGET,
        router = weir_test_artifacts::HOT_TENANT_ROUTER,
    )
}

/// The figure of routing by key at `rows` rows per request.
fn keyed_figure(rows: usize) -> &'static str {
    match rows {
        1 => "by_key_ns_per_row_1",
        100 => "by_key_ns_per_row_100",
        _ => "by_key_ns_per_row_1000",
    }
}

/// Nanoseconds per call of `call`, `requests` times, median of the samples
/// taken in turn with the other variants by the caller.
fn time<F: FnMut()>(requests: usize, mut call: F) -> f64 {
    let started = Instant::now();
    for _ in 0..requests {
        call();
    }
    started.elapsed().as_nanos() as f64 / requests as f64
}

fn main() {
    let requests = env_count("WEIR_BENCH_REQUESTS", DEFAULT_REQUESTS);
    let samples = env_count("WEIR_BENCH_SAMPLES", DEFAULT_SAMPLES);
    // One thread: each request awaits its policy call in turn.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let parse = |with: bool| {
        Config::parse(
            Path::new("policy.toml"),
            &config(with),
            &Overrides::default(),
        )
        .unwrap_or_else(|err| panic!("the bench's config is valid: {err}"))
    };
    let (with, without) = (parse(true), parse(false));
    let sandbox = Sandbox::new(Metrics::default()).expect("wasm engine");
    let mut plugins: HashMap<String, Arc<Plugin>> = HashMap::new();
    for name in ["budget", "router"] {
        let plugin = runtime
            .block_on(sandbox.load(&with.plugins[name]))
            .unwrap_or_else(|err| panic!("load plugin `{name}`: {err}"));
        plugins.insert(name.to_string(), plugin);
    }
    let policies = Policies::new(&with, |name| plugins.get(name).cloned());
    let none = Policies::new(&without, |name| plugins.get(name).cloned());
    let usage = Usage {
        queued: Queued {
            rows: 1_000,
            bytes: 250_000,
        },
        recent: Queued {
            rows: 5_000,
            bytes: 1_250_000,
        },
    };
    let settings: Option<Arc<str>> = Some(Arc::from(r#"{"rate_bytes_per_sec": 2000000000}"#));

    let admit = |policies: &Policies| {
        let decision = runtime
            .block_on(policies.admit("acme", "orders", 1000, 250_000, usage, settings.clone()))
            .expect("the budget answers");
        assert_eq!(decision, Admit::Yes, "the bench's requests are admitted");
        black_box(decision);
    };
    let place = |policies: &Policies, tenant: &str, keys: &[Option<String>]| {
        let placement = runtime
            .block_on(policies.place(tenant, "orders", || keys.to_vec()))
            .expect("the router answers");
        black_box(placement)
    };
    let keys: HashMap<usize, Vec<Option<String>>> = KEYED_ROWS
        .iter()
        .map(|&rows| (rows, (0..rows).map(|k| Some(format!("user-{k}"))).collect()))
        .collect();
    // The hot tenant's rows really are spread; the others keep one unit.
    match place(&policies, "hot", &keys[&1000]) {
        Placement::Rows(units) => {
            let distinct: std::collections::BTreeSet<_> = units.iter().collect();
            assert_eq!(distinct.len(), 8, "hot spreads over 8 units");
        }
        other => panic!("hot is routed by key, got {other:?}"),
    }
    assert!(matches!(place(&policies, "acme", &[]), Placement::Table(_)));

    let mut figures: HashMap<&str, Vec<f64>> = HashMap::new();
    for _ in 0..samples {
        let mut record = |name: &'static str, ns: f64| figures.entry(name).or_default().push(ns);
        record("no_budget_ns_per_request", time(requests, || admit(&none)));
        record("budget_ns_per_request", time(requests, || admit(&policies)));
        record(
            "default_route_ns_per_request",
            time(requests, || drop(place(&none, "acme", &[]))),
        );
        record(
            "remembered_route_ns_per_request",
            time(requests, || drop(place(&policies, "acme", &[]))),
        );
        for rows in KEYED_ROWS {
            let calls = (requests / rows).max(20);
            let per_request = time(calls, || drop(place(&policies, "hot", &keys[&rows])));
            record(keyed_figure(rows), per_request / rows as f64);
        }
    }
    let figure = |name: &str| median(&figures[name]);
    let mut table = Table::new(&["call", "policy", "no policy", "added"]);
    let pairs = [
        (
            "budget, per request",
            "budget_ns_per_request",
            "no_budget_ns_per_request",
        ),
        (
            "route, per request (table remembered)",
            "remembered_route_ns_per_request",
            "default_route_ns_per_request",
        ),
    ];
    for (label, with_policy, without_policy) in pairs {
        let (a, b) = (figure(with_policy), figure(without_policy));
        print_figure(BENCH, with_policy, a);
        print_figure(BENCH, without_policy, b);
        table.push(vec![
            label.to_string(),
            format!("{a:.0} ns"),
            format!("{b:.0} ns"),
            format!("{:.0} ns", a - b),
        ]);
    }
    for rows in KEYED_ROWS {
        let name = keyed_figure(rows);
        let ns = figure(name);
        print_figure(BENCH, name, ns);
        table.push(vec![
            format!("route by key, per row ({rows}-row requests)"),
            format!("{ns:.0} ns"),
            String::from("-"),
            format!("{ns:.0} ns"),
        ]);
    }
    table.print();
}
