//! The plugin author's tools against real plugins: `weir plugin test` gives
//! the outcomes a real host on a real nats-server gives for the same rows
//! (a stateful plugin and rows it dead-letters among them: both run the
//! same pipeline runner),
//! a trap exits non-zero quoting the guest's stderr (as the dead-letter
//! reason does), `weir plugin check` names each plugin's world or what it
//! misses, a second check loads from the shared compiled cache, and the
//! file sink drops a replay under the real sandbox.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;
use weir_test_artifacts::{
    CHAOS, HOT_TENANT_ROUTER, HTTP_SINK, NDJSON_SINK, TENANT_BUDGET, VALIDATOR, WINDOW,
};

use crate::support::{
    Nats, TestHost, WEIR, base_config, built_for_0_2_0, compile_cache_dir, dead_letter_reasons,
    eventually,
};

/// `weir plugin <args>` with the tests' compiled cache, never the user's.
fn weir_plugin(args: &[&str]) -> Output {
    weir_plugin_cached(&compile_cache_dir(), args)
}

fn weir_plugin_cached(cache: &Path, args: &[&str]) -> Output {
    Command::new(WEIR)
        .arg("plugin")
        .args(args)
        .env("WEIR_CACHE_DIR", cache)
        .env_remove("WEIR_LOG")
        .output()
        .expect("weir runs")
}

/// `weir plugin test --json` of `wasm` on `rows`, as plugin `plugin` of
/// `host`'s config (its limits, grants, tenant and table).
fn plugin_test_in(host: &TestHost, wasm: &str, rows: &Path, plugin: &str) -> Output {
    weir_plugin(&[
        "test",
        wasm,
        "--rows",
        rows.to_str().unwrap(),
        "--config",
        host.config_path().to_str().unwrap(),
        "--plugin",
        plugin,
        "--json",
    ])
}

/// Each row's `outcome` in a `weir plugin test --json` report, in order.
fn outcomes_of(report: &Value) -> Vec<&str> {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["outcome"].as_str().unwrap())
        .collect()
}

fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|err| {
        panic!(
            "not JSON ({err}): {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// Rows with an `id` (emitted, `email` masked) and without (dead-lettered).
const ROWS: &str = "{\"id\":1,\"email\":\"a@example.com\"}\n{\"name\":\"no id\"}\n\n{\"id\":3,\"email\":\"c@example.com\",\"amount\":7}\n{\"kind\":\"also no id\"}\n";

#[tokio::test(flavor = "multi_thread")]
async fn plugin_test_gives_the_outcomes_a_real_host_gives_for_the_same_rows() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    let rows = host.dir.path().join("rows.ndjson");
    std::fs::write(&rows, ROWS).unwrap();

    let output = plugin_test_in(&host, VALIDATOR, &rows, "validate");
    assert!(output.status.success(), "{output:?}");
    let report = json_of(&output);
    assert_eq!(report["world"], "transform");
    // The config's tenant, and the table of the pipeline the plugin is in.
    assert_eq!(
        (&report["tenant"], &report["table"]),
        (&"acme".into(), &"orders".into())
    );
    let mut emitted = Vec::new();
    let mut dead = Vec::new();
    for row in report["rows"].as_array().unwrap() {
        match row["outcome"].as_str().unwrap() {
            "emit" => {
                for new in row["emitted"].as_array().unwrap() {
                    assert_eq!(new["table"], "orders");
                    emitted.push(new["payload"].to_string());
                }
            }
            "dead_letter" => dead.push(row["reason"].as_str().unwrap().to_string()),
            other => panic!("unexpected outcome {other}: {report}"),
        }
    }
    // Line numbers are the file's: the blank third line is skipped.
    let lines: Vec<u64> = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, [1, 2, 4, 5]);
    assert_eq!(emitted.len(), 2, "{report}");
    assert_eq!(dead.len(), 2, "{report}");

    // The same rows through a real host: what its sink wrote and what it
    // dead-lettered are what `weir plugin test` said.
    assert_eq!(host.ingest("orders", ROWS).await.status(), 202);
    let written = eventually(Duration::from_secs(30), "the rows delivered", || async {
        let lines = host.sink_lines("orders");
        (lines.len() == 2).then_some(lines)
    })
    .await;
    let parsed = |text: &String| serde_json::from_str::<Value>(text).unwrap();
    assert_eq!(
        written.iter().map(parsed).collect::<Vec<_>>(),
        emitted.iter().map(parsed).collect::<Vec<_>>()
    );
    let mut reasons = dead_letter_reasons(&nats, 2).await;
    reasons.sort();
    dead.sort();
    assert_eq!(reasons, dead);
    host.shutdown().await;
}

/// The window plugin (`grants.state`) on rows it counts, a row without its
/// fields and a row of a window already closed.
const WINDOW_ROWS: &str = "{\"key\":\"a\",\"value\":1,\"ts\":0}\n{\"name\":\"no fields\"}\n\
    {\"key\":\"a\",\"value\":2,\"ts\":5}\n{\"key\":\"b\",\"value\":4,\"ts\":9}\n\
    {\"key\":\"a\",\"value\":1,\"ts\":1200}\n{\"key\":\"a\",\"value\":1,\"ts\":10}\n";

/// A stateful plugin through `weir plugin test` (its state in memory) and
/// through a real host (its state in the bucket): the same summaries
/// emitted, the same rows dead-lettered with the same reasons.
#[tokio::test(flavor = "multi_thread")]
async fn a_stateful_plugin_and_its_failing_rows_get_the_same_outcomes_in_plugin_test_and_a_host() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), crate::state::WINDOW)).await;
    let rows = host.dir.path().join("rows.ndjson");
    std::fs::write(&rows, WINDOW_ROWS).unwrap();
    let output = plugin_test_in(&host, WINDOW, &rows, "window");
    assert!(output.status.success(), "{output:?}");
    let report = json_of(&output);
    assert_eq!(report["table"], "events", "{report}");
    let outcomes = outcomes_of(&report);
    assert_eq!(
        outcomes,
        ["drop", "dead_letter", "drop", "drop", "emit", "dead_letter"],
        "{report}"
    );
    let mut emitted = Vec::new();
    let mut dead = Vec::new();
    for row in report["rows"].as_array().unwrap() {
        for new in row["emitted"].as_array().into_iter().flatten() {
            assert_eq!(new["table"], "windows", "{report}");
            emitted.push(new["payload"].clone());
        }
        if let Some(reason) = row["reason"].as_str() {
            dead.push(reason.to_string());
        }
    }
    assert_eq!(emitted.len(), 2, "{report}");

    assert_eq!(host.ingest("events", WINDOW_ROWS).await.status(), 202);
    let written = eventually(
        Duration::from_secs(30),
        "the summaries delivered",
        || async {
            let lines = host.sink_lines("windows");
            (lines.len() == 2).then_some(lines)
        },
    )
    .await;
    let written: Vec<Value> = written
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(written, emitted);
    let mut reasons = dead_letter_reasons(&nats, 2).await;
    reasons.sort();
    dead.sort();
    assert_eq!(reasons, dead);
    host.shutdown().await;
}

/// The traceback a guest prints before it traps is in the reason, both in
/// `weir plugin test` (which exits 6) and in a real host's dead letter; in
/// both, the failing row is isolated and the other one goes through.
#[tokio::test(flavor = "multi_thread")]
async fn a_trap_exits_non_zero_and_quotes_the_guests_stderr_as_the_dead_letter_does() {
    const ROWS: &str = "{\"id\":1}\n{\"sku\":\"boom\"}\n";
    let dir = tempfile::tempdir().unwrap();
    let rows = dir.path().join("rows.ndjson");
    std::fs::write(&rows, ROWS).unwrap();
    let output = weir_plugin(&[
        "test",
        CHAOS,
        "--rows",
        rows.to_str().unwrap(),
        "--settings",
        r#"{"mode":"traceback","trigger":"sku"}"#,
        "--json",
    ]);
    assert_eq!(output.status.code(), Some(6), "{output:?}");
    let report = json_of(&output);
    let outcomes = outcomes_of(&report);
    assert_eq!(outcomes, ["ok", "failed"], "{report}");
    assert_eq!(report["rows"][1]["kind"], "trap");
    let stderr = String::from_utf8_lossy(&output.stderr);
    for quoted in [
        "trapped (wasm trap",
        "Python function threw an unexpected exception",
        "  | Traceback (most recent call last):",
        "  |     value = row[\"sku\"]",
        "  | KeyError: 'sku'",
    ] {
        assert!(stderr.contains(quoted), "{quoted:?} not in {stderr}");
    }
    assert_eq!(stderr.matches("KeyError").count(), 1, "said once: {stderr}");

    // A real host delivers the first row, retries the second, then
    // dead-letters it with the same words.
    let nats = Nats::start();
    let extra = r#"
[plugins.py]
wasm = "weir_chaos.wasm"
world = "transform"
settings = { mode = "traceback", trigger = "sku" }

[[pipelines]]
tables = ["py"]
transforms = ["py"]
sink = "files"
"#;
    let host = TestHost::start(&base_config(nats.url(), extra)).await;
    assert_eq!(host.ingest("py", ROWS).await.status(), 202);
    let reasons = dead_letter_reasons(&nats, 1).await;
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(
        reasons[0].contains("KeyError: 'sku'") && reasons[0].contains("Traceback"),
        "{reasons:?}"
    );
    eventually(
        Duration::from_secs(30),
        "the other row delivered",
        || async { (host.sink_lines("py") == ["{\"id\":1}"]).then_some(()) },
    )
    .await;
    host.shutdown().await;
}

/// `weir plugin check` names the version a plugin was built for, and says
/// that 0.2.0 is the previous one, still served.
#[test]
fn plugin_check_names_the_previous_version_a_plugin_was_built_for() {
    let wasm = built_for_0_2_0("transform-rust");
    let output = weir_plugin(&["check", wasm.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains("world: weir:plugin/transform@0.2.0"),
        "{text}"
    );
    assert!(
        text.contains(
            "built for weir:plugin@0.2.0, the previous version, which this weir still serves"
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn plugin_check_names_each_plugins_world_and_the_grants_it_needs() {
    for (wasm, world) in [
        (VALIDATOR, "transform"),
        (CHAOS, "transform"),
        (NDJSON_SINK, "sink"),
        (HTTP_SINK, "sink"),
        (TENANT_BUDGET, "budget"),
        (HOT_TENANT_ROUTER, "router"),
    ] {
        let output = weir_plugin(&["check", wasm, "--json"]);
        assert!(output.status.success(), "{wasm}: {output:?}");
        let report = json_of(&output);
        assert_eq!(report["implements"], serde_json::json!([world]), "{wasm}");
        assert_eq!(report["worlds"][world]["missing"], serde_json::json!([]));
        assert_eq!(
            report["bytes"].as_u64(),
            Some(std::fs::metadata(wasm).unwrap().len())
        );
        let grants: Vec<&str> = report["grants"]
            .as_array()
            .unwrap()
            .iter()
            .map(|need| need["grant"].as_str().unwrap())
            .collect();
        assert_eq!(
            grants.contains(&"grants.http"),
            wasm == HTTP_SINK,
            "{wasm}: {grants:?}"
        );
    }
    // The text names the missing exports of every other world.
    let output = weir_plugin(&["check", NDJSON_SINK]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("world: weir:plugin/sink@0.3.0"), "{text}");
    assert!(text.contains("transform: missing `transform`"), "{text}");
    assert!(
        text.contains("router: missing `route-table`, `route-keys`"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_component_run_as_the_wrong_world_is_refused_naming_the_missing_export() {
    let dir = tempfile::tempdir().unwrap();
    let rows = dir.path().join("rows.ndjson");
    std::fs::write(&rows, "{\"id\":1}\n").unwrap();
    let output = weir_plugin(&[
        "test",
        NDJSON_SINK,
        "--world",
        "transform",
        "--rows",
        rows.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(5), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "does not implement world `weir:plugin/transform@0.3.0`: missing export `transform`"
        ),
        "{stderr}"
    );
}

/// `weir plugin test` on a sink reports what it delivered; the HTTP sink
/// without `grants.http` loads and each of its requests is denied.
#[tokio::test(flavor = "multi_thread")]
async fn a_sink_without_grants_http_loads_and_its_requests_are_denied() {
    let dir = tempfile::tempdir().unwrap();
    let rows = dir.path().join("rows.ndjson");
    std::fs::write(&rows, "{\"id\":1}\n{\"id\":2}\n").unwrap();
    let output = weir_plugin(&[
        "test",
        HTTP_SINK,
        "--rows",
        rows.to_str().unwrap(),
        "--settings",
        r#"{"url":"http://127.0.0.1:9/ingest"}"#,
        "--json",
    ]);
    assert!(output.status.success(), "{output:?}");
    let report = json_of(&output);
    assert_eq!(report["world"], "sink");
    for row in report["rows"].as_array().unwrap() {
        assert_eq!(row["outcome"], "dead_letter", "{report}");
        assert!(
            row["reason"]
                .as_str()
                .unwrap()
                .contains("request to 127.0.0.1:9 denied: not in grants.http"),
            "{report}"
        );
    }
}

/// A second `weir plugin check` in another process loads the component
/// from the cache the first filled: no "compiling" line, `from_cache`.
#[tokio::test(flavor = "multi_thread")]
async fn the_compiled_cache_is_shared_between_processes_and_the_compile_is_logged() {
    let cache = tempfile::tempdir().unwrap();
    // No `-v`: the compile lines show at the default level all the same.
    let first = weir_plugin_cached(cache.path(), &["check", VALIDATOR, "--json"]);
    let second = weir_plugin_cached(cache.path(), &["check", VALIDATOR, "--json"]);
    let logged = |output: &Output| String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        logged(&first).contains("compiling plugin weir_validator (0.2 MB)…")
            && logged(&first).contains("compiled plugin weir_validator in "),
        "{}",
        logged(&first)
    );
    assert!(
        !logged(&second).contains("compiling plugin"),
        "{}",
        logged(&second)
    );
    assert_eq!(json_of(&first)["from_cache"], false);
    assert_eq!(json_of(&second)["from_cache"], true);
}

/// An error `init` returns is said once, and the plugin does not load (5).
#[tokio::test(flavor = "multi_thread")]
async fn an_init_error_is_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let rows = dir.path().join("rows.ndjson");
    std::fs::write(&rows, "{\"id\":1}\n").unwrap();
    let output = weir_plugin(&[
        "test",
        CHAOS,
        "--rows",
        rows.to_str().unwrap(),
        "--settings",
        r#"{"mode":"fail-init"}"#,
    ]);
    assert_eq!(output.status.code(), Some(5), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("weir: error:"))
        .collect();
    assert_eq!(
        errors,
        [
            "weir: error: plugin `weir_chaos`: init failed: init refused its settings: chaos: init refused"
        ]
    );
    assert_eq!(stderr.matches("init refused").count(), 2, "{stderr}");
}

/// A budget answers each row as one request, what it admitted counting as
/// queued for the next; a router routes a hot tenant's rows by key (one
/// key, one unit) and anyone else's table by weir's default route.
#[tokio::test(flavor = "multi_thread")]
async fn budgets_and_routers_answer_for_each_row() {
    let dir = tempfile::tempdir().unwrap();
    let rows = dir.path().join("rows.ndjson");
    std::fs::write(
        &rows,
        "{\"user\":\"a\"}\n{\"user\":\"b\"}\n{\"user\":\"a\"}\n",
    )
    .unwrap();
    let rows = rows.to_str().unwrap();
    // Today's builds, and the same policies as built for 0.2.0, the previous
    // world version, which must answer alike.
    let (old_budget, old_router) = (
        built_for_0_2_0("budget-rust"),
        built_for_0_2_0("router-rust"),
    );
    let builds = [
        (TENANT_BUDGET, HOT_TENANT_ROUTER),
        (old_budget.to_str().unwrap(), old_router.to_str().unwrap()),
    ];
    for (budget, router) in builds {
        a_budget_and_a_router_answer_for_each_row(budget, router, rows);
    }
}

/// `weir plugin test` of the tenant budget at `budget` and the hot-tenant
/// router at `router` on `rows`: each answers every row as its settings say.
fn a_budget_and_a_router_answer_for_each_row(budget_wasm: &str, router_wasm: &str, rows: &str) {
    let budget = weir_plugin(&[
        "test",
        budget_wasm,
        "--rows",
        rows,
        "--settings",
        r#"{"queued_rows": 2}"#,
        "--json",
    ]);
    assert!(budget.status.success(), "{budget_wasm}: {budget:?}");
    let report = json_of(&budget);
    let decisions: Vec<&str> = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["decision"].as_str().unwrap())
        .collect();
    assert_eq!(
        decisions,
        ["admit", "admit", "throttle"],
        "{budget_wasm}: {report}"
    );
    let suspended = json_of(&weir_plugin(&[
        "test",
        budget_wasm,
        "--rows",
        rows,
        "--tenant-settings",
        r#"{"suspended": true}"#,
        "--json",
    ]));
    assert_eq!(
        suspended["rows"][0]["decision"], "reject",
        "{budget_wasm}: {suspended}"
    );

    let route = |tenant: &str| {
        let output = weir_plugin(&[
            "test",
            router_wasm,
            "--rows",
            rows,
            "--settings",
            r#"{"hot_tenants": {"acme": 4}}"#,
            "--routing-field",
            "user",
            "--tenant",
            tenant,
            "--json",
        ]);
        assert!(output.status.success(), "{router_wasm}: {output:?}");
        json_of(&output)
    };
    let hot = route("acme");
    let units: Vec<&Value> = hot["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            assert_eq!(row["table_route"], "by key", "{hot}");
            assert!(row["unit"]["partition"].is_u64(), "{hot}");
            &row["unit"]
        })
        .collect();
    assert_eq!(units[0], units[2], "one key, one unit: {hot}");
    let cold = route("beta");
    for row in cold["rows"].as_array().unwrap() {
        assert_eq!(row["table_route"], "fixed", "{cold}");
        assert_eq!(row["unit"], Value::Null, "the default route: {cold}");
    }
}

/// Past its bound, the cache keeps the entry just written and evicts the
/// least recently used; an evicted plugin is compiled again.
#[tokio::test(flavor = "multi_thread")]
async fn the_compiled_cache_evicts_the_least_recently_used_past_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, base_config("nats://127.0.0.1:1", "")).unwrap();
    let config = weir::config::Config::load(&path, &Default::default()).unwrap();
    let (validate, files) = (&config.plugins["validate"], &config.plugins["files"]);
    let cache = dir.path().join("compiled");
    let entries = || std::fs::read_dir(&cache).unwrap().count();
    // Room for both: each compiles to well under 2 MB (the file sink with
    // its replay records, the largest, to about 610 kB).
    let bound = 4_000_000;
    let sandbox = weir::sandbox::Sandbox::new(weir::telemetry::Metrics::default())
        .unwrap()
        .with_cache(cache.clone(), bound);
    sandbox.load(validate).await.unwrap();
    sandbox.load(files).await.unwrap();
    assert_eq!(entries(), 2, "both fit");

    let tight = weir::sandbox::Sandbox::new(weir::telemetry::Metrics::default())
        .unwrap()
        .with_cache(cache.clone(), 1); // room for none but the newest
    tight.load(validate).await.unwrap(); // a hit: nothing written, nothing evicted
    assert_eq!(entries(), 2);
    let chaos = {
        let mut chaos = validate.clone();
        chaos.wasm = CHAOS.into();
        chaos.settings = serde_json::json!({ "mode": "pass" });
        chaos
    };
    tight.load(&chaos).await.unwrap(); // a miss: written, then the rest evicted
    assert_eq!(entries(), 1, "only the entry just written stays");
    let counts = tight.compile_cache().unwrap();
    assert_eq!((counts.hits(), counts.misses()), (1, 1));
    tight.load(validate).await.unwrap();
    assert_eq!(counts.misses(), 2, "the evicted plugin compiles again");
}

/// The file sink under the real sandbox (WASI preopens, not the native
/// unit tests' files) drops a replay: rows it wrote once, handed to it
/// again with the same sequences and payloads (as after a crash before
/// their acks), are not written twice, even by a fresh instance in another
/// process; a row under a known sequence with another payload is.
#[tokio::test(flavor = "multi_thread")]
async fn the_file_sink_writes_a_row_handed_to_it_again_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("weir.toml");
    // `weir plugin test` never connects: the URL is never dialled.
    std::fs::write(&config, base_config("nats://127.0.0.1:1", "")).unwrap();
    std::fs::create_dir(dir.path().join("out")).unwrap();
    let rows = dir.path().join("rows.ndjson");
    let run = |body: &str| {
        std::fs::write(&rows, body).unwrap();
        let output = weir_plugin(&[
            "test",
            NDJSON_SINK,
            "--rows",
            rows.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--plugin",
            "files",
            "--settings",
            r#"{"dedupe_window":65536}"#,
            "--json",
        ]);
        assert!(output.status.success(), "{output:?}");
        let report = json_of(&output);
        let outcomes: Vec<String> = report["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row["outcome"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(outcomes.len(), body.lines().count(), "{report}");
        assert!(outcomes.iter().all(|o| o == "delivered"), "{report}");
    };
    let written = || std::fs::read_to_string(dir.path().join("out/acme/orders.ndjson")).unwrap();

    let first = "{\"id\":1}\n{\"id\":2}\n{\"id\":3}\n";
    run(first);
    assert_eq!(written(), first);
    // The same rows again (each row's sequence is its line number here).
    run(first);
    assert_eq!(written(), first, "a replay is written once");
    // Line 2 under the same sequence with another payload is another row.
    run("{\"id\":1}\n{\"id\":22}\n");
    assert_eq!(written(), format!("{first}{{\"id\":22}}\n"));
    assert!(
        dir.path()
            .join("out/.weir-written/acme/orders.seen")
            .exists(),
        "the sink's record of what it wrote is beside the tenants' files"
    );
}
