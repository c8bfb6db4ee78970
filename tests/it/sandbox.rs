//! A plugin that traps, spins or eats memory fails its own call only: the
//! host goes on, other pipelines keep delivering, and the rows come back.

use std::time::Duration;

use weir::config::{Config, Overrides};
use weir::host::StartError;
use weir::sandbox::{LoadError, Sandbox};

use crate::support::{
    ACME_KEY, Nats, TestHost, base_config, dead_letter_reasons, eventually, orders, start_error,
};

/// A pipeline of the chaos plugin with `settings` for `table`, then the file sink.
fn chaos_pipeline(table: &str, settings: &str, limits: &str) -> String {
    format!(
        r#"
[plugins.chaos_{table}]
wasm = "weir_chaos.wasm"
world = "transform"
settings = {{ {settings} }}
{limits}

[[pipelines]]
tables = ["{table}"]
transforms = ["chaos_{table}"]
sink = "files"
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_that_traps_is_retried_and_delivered_once_the_plugin_stops_trapping() {
    let nats = Nats::start();
    let extra = chaos_pipeline("flaky", "mode = \"trap-first-attempt\"", "");
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;

    let response = host.ingest("flaky", orders(0, 5)).await;
    assert_eq!(response.status(), 202);
    let lines = eventually(
        Duration::from_secs(20),
        "5 rows after the retry",
        || async {
            let lines = host.sink_lines("flaky");
            (lines.len() >= 5).then_some(lines)
        },
    )
    .await;
    assert_eq!(lines.len(), 5);
    let metrics = host
        .http
        .get(host.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let traps: u64 = metrics
        .lines()
        .filter(|line| line.starts_with("weir_plugin_failures_total{plugin=\"chaos_flaky\","))
        .find_map(|line| line.rsplit_once(' ')?.1.parse().ok())
        .unwrap_or(0);
    // Every failed call is counted (isolating the rows takes several).
    assert!(traps >= 1, "the trap is counted:\n{metrics}");
    let report = host.host.status().report().await;
    assert_eq!(report.rows.delivered, 5);
    assert!(report.rows.retried >= 5);

    // The host still serves the other pipeline.
    assert_eq!(host.ingest("orders", orders(0, 3)).await.status(), 202);
    eventually(Duration::from_secs(20), "orders delivered", || async {
        (host.sink_lines("orders").len() == 3).then_some(())
    })
    .await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runaway_loop_is_cut_off_at_its_deadline_and_others_keep_flowing() {
    let nats = Nats::start();
    let extra = chaos_pipeline("spin", "mode = \"spin\"", "deadline_ms = 200");
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;

    assert_eq!(host.ingest("spin", orders(0, 1)).await.status(), 202);
    assert_eq!(host.ingest("orders", orders(0, 20)).await.status(), 202);
    eventually(
        Duration::from_secs(20),
        "orders delivered beside the spinner",
        || async { (host.sink_lines("orders").len() == 20).then_some(()) },
    )
    .await;
    // max_deliveries = 3: after three interrupted calls the row is dead-lettered.
    let reasons = dead_letter_reasons(&nats, 1).await;
    assert!(
        reasons[0].starts_with(
            "gave up after 3 deliveries: plugin `chaos_spin` ran past its deadline of 200 ms"
        ),
        "{reasons:?}"
    );
    assert!(host.sink_lines("spin").is_empty());
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_memory_bomb_fails_only_its_own_call() {
    let nats = Nats::start();
    let extra = chaos_pipeline(
        "bomb",
        "mode = \"grow\", grow_mb = 256, trigger = \"boom\"",
        "memory_mb = 32",
    );
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;

    assert_eq!(
        host.ingest("bomb", "{\"id\":1,\"boom\":true}\n")
            .await
            .status(),
        202
    );
    let reasons = dead_letter_reasons(&nats, 1).await;
    assert!(
        reasons[0].contains("plugin `chaos_bomb` tried to grow memory past its cap of 32 MiB"),
        "{reasons:?}"
    );
    // The same plugin serves the next batch from a fresh instance.
    assert_eq!(host.ingest("bomb", "{\"id\":2}\n").await.status(), 202);
    eventually(
        Duration::from_secs(20),
        "a harmless row delivered",
        || async { (host.sink_lines("bomb") == vec!["{\"id\":2}".to_string()]).then_some(()) },
    )
    .await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_component_of_the_wrong_world_is_refused_naming_what_is_missing() {
    let nats = Nats::start();
    let extra = r#"
[plugins.not_a_transform]
wasm = "weir_ndjson_sink.wasm"
world = "transform"
"#;
    let err = start_error(&base_config(nats.url(), extra)).await;
    let StartError::Plugin(LoadError::WrongWorld {
        plugin, missing, ..
    }) = &err
    else {
        panic!("expected a wrong-world error, got {err}");
    };
    assert_eq!(plugin, "not_a_transform");
    assert!(missing.starts_with("`transform`"), "{missing}");
    let message = err.to_string();
    assert!(
        message.contains("weir_ndjson_sink.wasm does not implement world `weir:plugin/transform@0.3.0`: missing export `transform`"),
        "{message}"
    );
}

/// What a transform built with the 0.1.0 SDK imports, older than the
/// previous version (0.2.0), which this host still serves. The host
/// refuses it by its imports, before it looks at its exports.
const BUILT_FOR_0_1_0: &str = r#"
(component
  (import "weir:plugin/types@0.1.0" (instance
    (type $batch (record
      (field "data" (list u8))
      (field "rows" (list u32))
      (field "sequences" (list u64))
      (field "attempts" (list u32))
      (field "headers" (list u32))))
    (export "batch" (type (eq $batch)))))
  (import "weir:plugin/host@0.1.0" (instance
    (export "add-counter" (func (param "name" string) (param "delta" u64)))))
)
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_built_for_an_older_wit_is_refused_naming_its_version_and_the_rebuild() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let wasm = dir.path().join("old_sdk.wasm");
    std::fs::write(
        &wasm,
        wat::parse_str(BUILT_FOR_0_1_0).expect("component text"),
    )
    .expect("write");
    let extra = format!(
        r#"
[plugins.old]
wasm = "{}"
world = "transform"
"#,
        wasm.display()
    );
    let err = start_error(&base_config(nats.url(), &extra)).await;
    let StartError::Plugin(LoadError::WrongVersion { plugin, found, .. }) = &err else {
        panic!("expected a wrong-version error, got {err}");
    };
    assert_eq!((plugin.as_str(), found.as_str()), ("old", "0.1.0"));
    let message = err.to_string();
    assert!(
        message.contains(&format!(
            "old_sdk.wasm was built for `weir:plugin@0.1.0`, but this weir speaks `weir:plugin@{}` (and still runs plugins built for 0.2.0)",
            weir::sandbox::WIT_VERSION
        )),
        "{message}"
    );
    assert!(
        message.contains("rebuild the plugin with the current SDK"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_that_fails_or_traps_in_init_is_refused() {
    let nats = Nats::start();
    for (mode, expected) in [
        (
            "fail-init",
            "init refused its settings: chaos: init refused",
        ),
        ("trap-init", "trapped"),
    ] {
        let extra = chaos_pipeline("bad", &format!("mode = \"{mode}\""), "");
        let err = start_error(&base_config(nats.url(), &extra)).await;
        assert!(
            matches!(err, StartError::Plugin(LoadError::Init { .. })),
            "{err}"
        );
        assert!(err.to_string().contains(expected), "{mode}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_that_is_not_a_component_is_refused() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("junk.wasm"), b"not wasm at all").unwrap();
    let extra = format!(
        "[plugins.junk]\nwasm = \"{}\"\nworld = \"transform\"\n",
        dir.path().join("junk.wasm").display()
    );
    let err = start_error(&base_config(nats.url(), &extra)).await;
    assert!(
        matches!(err, StartError::Plugin(LoadError::Compile { .. })),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("junk.wasm is not a valid WebAssembly component"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn files_network_and_environment_are_out_of_reach_without_a_grant() {
    let nats = Nats::start();
    let nats_address = nats.url().trim_start_matches("nats://").to_string();
    let extra = [
        chaos_pipeline(
            "file",
            "mode = \"open-file\", target = \"/etc/hostname\"",
            "",
        ),
        chaos_pipeline(
            "net",
            &format!("mode = \"connect\", target = \"{nats_address}\""),
            "",
        ),
        chaos_pipeline("env", "mode = \"env\", target = \"HOME\"", ""),
        chaos_pipeline(
            "granted",
            "mode = \"env\", target = \"WEIR_TEST_GRANT\"",
            "grants.env = { WEIR_TEST_GRANT = \"yes\" }",
        ),
    ]
    .concat();
    let host = TestHost::start(&base_config(nats.url(), &extra)).await;
    for table in ["file", "net", "env", "granted"] {
        assert_eq!(host.ingest(table, "{\"id\":1}\n").await.status(), 202);
    }
    let mut reasons = dead_letter_reasons(&nats, 4).await;
    reasons.sort();
    assert_eq!(reasons.len(), 4, "{reasons:?}");
    // A listening NATS port is right there, yet the plugin cannot reach it.
    assert!(
        reasons[0].starts_with(&format!("connect {nats_address}: ")),
        "{reasons:?}"
    );
    assert_eq!(reasons[1], "env HOME=unset");
    assert_eq!(reasons[2], "env WEIR_TEST_GRANT=yes");
    assert!(
        reasons[3].starts_with("open /etc/hostname: "),
        "{reasons:?}"
    );
    // The host is fine.
    assert_eq!(host.ingest("orders", orders(0, 3)).await.status(), 202);
    eventually(Duration::from_secs(20), "orders delivered", || async {
        (host.sink_lines("orders").len() == 3).then_some(())
    })
    .await;
    host.shutdown().await;
}

/// Resident memory of this process, from /proc (Linux).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|value| value.trim().trim_end_matches(" kB").parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leaking_warm_instance_is_recycled_and_host_memory_stays_flat_over_100_000_batches() {
    use weir::delivery::{Batch, PipelineRunner, Position, Verdict};
    use weir::sandbox::Sandbox;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    // 64 KiB leaked per call would fill the 32 MiB cap in ~500 calls; the
    // instance is recycled after 4 MiB of growth instead.
    let text = base_config(
        "nats://127.0.0.1:1",
        &chaos_pipeline(
            "leaky",
            "mode = \"leak\", leak_kb = 64",
            "memory_mb = 32\nrecycle_after_growth_mb = 4\nrecycle_after_batches = 1000000",
        ),
    );
    std::fs::write(&path, text).unwrap();
    let config = Config::load(&path, &Overrides::default()).unwrap();
    let sandbox = Sandbox::new(weir::telemetry::Metrics::default()).unwrap();
    let plugin = sandbox.load(&config.plugins["chaos_leaky"]).await.unwrap();
    let pipeline = config.pipeline_for("leaky").unwrap().clone();
    let pipeline = weir::config::Pipeline {
        sink: None,
        ..pipeline
    };
    let mut runner = PipelineRunner::new(&pipeline, |_| Some(plugin.clone()), None).unwrap();
    let mut row = Batch::default();
    row.push(
        "acme",
        "leaky",
        b"{\"id\":1}",
        [],
        Position {
            sequence: 1,
            attempt: 1,
        },
    );

    let batches = 100_000;
    let mut rss = Vec::new();
    let lease = weir::coordination::Lease::until(
        tokio::time::Instant::now() + std::time::Duration::from_secs(86_400),
    );
    for batch in 0..batches {
        let verdicts = runner
            .run(row.clone(), &lease)
            .await
            .expect("no call fails");
        assert!(matches!(verdicts[0], Verdict::Done));
        if batch % 20_000 == 0 || batch == batches - 1 {
            rss.push((batch, rss_kib()));
        }
    }
    println!("host RSS over {batches} batches (batch, KiB): {rss:?}");
    let (first, last) = (rss[1].1, rss[rss.len() - 1].1);
    // Not a timing assertion: 100,000 × 64 KiB leaked without recycling
    // would be 6 GiB; flat means within a few tens of MiB.
    assert!(
        last < first + 64 * 1024,
        "RSS grew from {first} KiB to {last} KiB"
    );
}

/// The compiled cache is the user's, not a data dir's: a host with a
/// fresh data dir (a new process: a fresh engine) loads every plugin from
/// the cache another data dir filled, compiling nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_fresh_data_dir_loads_compiled_plugins_from_the_shared_cache() {
    let cache = tempfile::tempdir().unwrap();
    let mut configs = Vec::new();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    for dir in &dirs {
        let path = dir.path().join("weir.toml");
        let text = base_config("nats://127.0.0.1:1", "").replace(
            &format!(
                "compile_cache_dir = \"{}\"",
                crate::support::compile_cache_dir().display()
            ),
            &format!("compile_cache_dir = \"{}\"", cache.path().display()),
        );
        std::fs::write(&path, text).unwrap();
        configs.push(Config::load(&path, &Overrides::default()).unwrap());
    }
    assert_ne!(configs[0].data_dir, configs[1].data_dir);
    assert_eq!(configs[0].compile_cache_dir, cache.path());

    let mut counts = Vec::new();
    for config in &configs {
        let sandbox = Sandbox::new(weir::telemetry::Metrics::default())
            .unwrap()
            .with_cache(
                config.compile_cache_dir.clone(),
                config.compile_cache_max_bytes,
            );
        for plugin in config.plugins.values() {
            sandbox.load(plugin).await.unwrap();
        }
        let counter = sandbox.compile_cache().unwrap();
        counts.push((counter.hits(), counter.misses()));
        if counts.len() == 1 {
            assert_eq!(
                cached(cache.path()).len(),
                2,
                "one compiled file per plugin"
            );
        }
    }
    // (hits, misses): the first data dir compiled both, the second neither.
    assert_eq!(counts, [(0, 2), (2, 0)]);
    assert_eq!(cached(cache.path()).len(), 2);
    for dir in &dirs {
        assert!(!dir.path().join("data/compiled").exists());
    }
}

/// The compiled files.
fn cached(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    files
}

/// A plugin cannot grow the host through its counters (at most 64 names
/// of at most 64 bytes; the rest refused and counted) nor forge host log
/// lines (control characters in its messages are escaped).
#[tokio::test(flavor = "multi_thread")]
async fn a_plugins_counters_and_log_lines_are_bounded_and_cannot_forge_host_lines() {
    let nats = Nats::start();
    let extra = chaos_pipeline("noisy", "mode = \"noisy\"", "");
    let host = crate::support::Host::spawn_with("noisy", base_config(nats.url(), &extra));
    let http = reqwest::Client::new();
    eventually(Duration::from_secs(60), "weir ready", || async {
        let ready = http.get(format!("{}/readyz", host.url)).send().await.ok()?;
        ready.status().is_success().then_some(())
    })
    .await;
    for first in [0, 10, 20] {
        let response = http
            .post(format!("{}/v1/ingest/noisy", host.url))
            .bearer_auth(ACME_KEY)
            .body(orders(first, 10))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
    }
    let metrics = eventually(Duration::from_secs(30), "the rows delivered", || async {
        let text = http
            .get(format!("{}/metrics", host.url))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.contains("weir_plugin_counter_refusals_total{plugin=\"chaos_noisy\"}")
            .then_some(text)
    })
    .await;
    let counters = metrics
        .lines()
        .filter(|line| line.starts_with("weir_plugin_counter_total{plugin=\"chaos_noisy\""))
        .count();
    assert_eq!(counters, 64, "{metrics}");
    assert!(!metrics.contains("nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"));
    let log = host.log();
    assert!(
        log.contains("chaos: noisy\\n2026"),
        "the newline is escaped:\n{log}"
    );
    assert!(
        !log.lines()
            .any(|line| line.starts_with("2026-01-01T00:00:00Z")),
        "a plugin forged a host log line:\n{log}"
    );
}
