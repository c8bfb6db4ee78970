//! Hot reload: a changed TOML or `.wasm` swaps plugin versions between
//! batches without losing or doubling a row; a broken one is refused and the
//! running version keeps serving.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::{Nats, TestHost, base_config, eventually, operator, orders};

/// A pipeline for table `tagged`: the chaos plugin in `tag` mode, then the
/// file sink. `wasm` is the chaos component's path.
fn tagged_pipeline(wasm: &Path, tag: &str) -> String {
    format!(
        r#"
[plugins.tagger]
wasm = "{wasm}"
world = "transform"
settings = {{ mode = "tag", tag = "{tag}" }}

[[pipelines]]
tables = ["tagged"]
transforms = ["tagger"]
sink = "files"
"#,
        wasm = wasm.display()
    )
}

/// A copy of the chaos component in a folder of the test's own, so the
/// test may overwrite it.
fn own_chaos_copy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let wasm = dir.path().join("chaos.wasm");
    std::fs::copy(weir_test_artifacts::CHAOS, &wasm).expect("copy the chaos plugin");
    (dir, wasm)
}

/// `(id, tag)` of every line the sink wrote for `tagged`.
fn tagged_rows(host: &TestHost) -> Vec<(u64, String)> {
    host.sink_lines("tagged")
        .iter()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).expect("sink line is JSON");
            let id = value["id"].as_u64().expect("row has its id");
            let tag = value["tag"].as_str().unwrap_or("<none>").to_string();
            (id, tag)
        })
        .collect()
}

/// The value of `weir_reloads_total{result=...}` on `/metrics`.
async fn reloads(host: &TestHost, result: &str) -> u64 {
    let metrics = host
        .http
        .get(host.url("/metrics"))
        .send()
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    let prefix = format!("weir_reloads_total{{result=\"{result}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn swapping_a_transform_under_load_delivers_every_row_once_on_one_version() {
    let nats = Nats::start();
    let (_plugins, wasm) = own_chaos_copy();
    let host =
        Arc::new(TestHost::start(&base_config(nats.url(), &tagged_pipeline(&wasm, "v1"))).await);

    // Steady load for the whole test: 10 rows a request, ids never reused.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let producer = {
        let (host, stop, sent) = (host.clone(), stop.clone(), sent.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let start = sent.load(Ordering::Relaxed);
                let response = host.ingest("tagged", orders(start, 10)).await;
                assert_eq!(
                    response.status(),
                    202,
                    "the front door takes rows during swaps"
                );
                sent.fetch_add(10, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    let path = host.config_path();
    let mut tag = "v1";
    for swap in 1..=10 {
        let next = if tag == "v1" { "v2" } else { "v1" };
        let before = host.sink_lines("tagged").len();
        let text = std::fs::read_to_string(&path).expect("read config");
        let written = Instant::now();
        std::fs::write(
            &path,
            text.replace(&format!("tag = \"{tag}\""), &format!("tag = \"{next}\"")),
        )
        .expect("rewrite config");
        eventually(
            Duration::from_secs(60),
            "rows tagged by the new version",
            || async {
                tagged_rows(&host)
                    .get(before..)
                    .and_then(|rows| rows.iter().any(|(_, t)| t == next).then_some(()))
            },
        )
        .await;
        println!(
            "swap {swap} ({tag} -> {next}) took effect {:?} after the write",
            written.elapsed()
        );
        tag = next;
    }

    stop.store(true, Ordering::Relaxed);
    producer.await.expect("the producer finished");
    let total = sent.load(Ordering::Relaxed);
    let rows = eventually(
        Duration::from_secs(60),
        "every posted row delivered",
        || async {
            let rows = tagged_rows(&host);
            (rows.len() >= total).then_some(rows)
        },
    )
    .await;
    let mut seen: HashMap<u64, String> = HashMap::new();
    for (id, tag) in &rows {
        assert!(tag == "v1" || tag == "v2", "row {id} tagged {tag}");
        assert!(
            seen.insert(*id, tag.clone()).is_none(),
            "row {id} delivered twice"
        );
    }
    assert_eq!(seen.len(), total, "every row delivered exactly once");
    assert!(seen.values().any(|t| t == "v1") && seen.values().any(|t| t == "v2"));
    assert!(reloads(&host, "applied").await >= 10);

    // Status names the running version of each plugin.
    let report = host.host.status().report().await;
    let tagger = report
        .plugins
        .iter()
        .find(|plugin| plugin.name == "tagger")
        .expect("status lists the tagger");
    assert_eq!(tagger.version.len(), 12, "a digest: {tagger:?}");

    let host = Arc::into_inner(host).expect("the producer let go of the host");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broken_wasm_is_refused_and_the_running_version_keeps_delivering() {
    let nats = Nats::start();
    let (_plugins, wasm) = own_chaos_copy();
    let host = TestHost::start(&base_config(nats.url(), &tagged_pipeline(&wasm, "v1"))).await;
    let version = |report: &weir::ops::StatusReport| {
        report
            .plugins
            .iter()
            .find(|plugin| plugin.name == "tagger")
            .map(|plugin| plugin.version.clone())
    };
    let running = version(&host.host.status().report().await);

    std::fs::write(&wasm, b"this is not a WebAssembly component").expect("break the wasm");
    eventually(Duration::from_secs(30), "the reload refused", || async {
        (reloads(&host, "refused").await >= 1).then_some(())
    })
    .await;

    assert_eq!(host.ingest("tagged", orders(0, 20)).await.status(), 202);
    let rows = eventually(Duration::from_secs(30), "rows delivered", || async {
        let rows = tagged_rows(&host);
        (rows.len() >= 20).then_some(rows)
    })
    .await;
    assert_eq!(rows.len(), 20);
    assert!(rows.iter().all(|(_, tag)| tag == "v1"), "{rows:?}");
    assert_eq!(version(&host.host.status().report().await), running);
    assert_eq!(reloads(&host, "applied").await, 0);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_toml_is_refused_and_the_running_config_stays() {
    let nats = Nats::start();
    let (_plugins, wasm) = own_chaos_copy();
    let host = TestHost::start(&base_config(nats.url(), &tagged_pipeline(&wasm, "v1"))).await;
    let path = host.config_path();
    let good = std::fs::read_to_string(&path).expect("read config");

    // A change of tag, but in a file that does not parse: nothing of it applies.
    let broken = good.replace("tag = \"v1\"", "tag = \"v2\"") + "\n[delivery\n";
    std::fs::write(&path, broken).expect("break the config");
    eventually(Duration::from_secs(30), "the reload refused", || async {
        (reloads(&host, "refused").await >= 1).then_some(())
    })
    .await;
    assert_eq!(host.ingest("tagged", orders(0, 10)).await.status(), 202);
    let rows = eventually(Duration::from_secs(30), "rows delivered", || async {
        let rows = tagged_rows(&host);
        (rows.len() >= 10).then_some(rows)
    })
    .await;
    assert!(rows.iter().all(|(_, tag)| tag == "v1"), "{rows:?}");

    // Fixed, the same change applies.
    std::fs::write(&path, good.replace("tag = \"v1\"", "tag = \"v2\"")).expect("fix the config");
    eventually(Duration::from_secs(30), "the reload applied", || async {
        (reloads(&host, "applied").await >= 1).then_some(())
    })
    .await;
    assert_eq!(host.ingest("tagged", orders(10, 10)).await.status(), 202);
    eventually(
        Duration::from_secs(30),
        "rows of the new version",
        || async {
            tagged_rows(&host)
                .iter()
                .any(|(id, tag)| *id >= 10 && tag == "v2")
                .then_some(())
        },
    )
    .await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_added_by_a_reload_reaches_the_front_door() {
    let nats = Nats::start();
    let (_plugins, wasm) = own_chaos_copy();
    let host = TestHost::start(&base_config(nats.url(), &tagged_pipeline(&wasm, "v1"))).await;
    assert_eq!(host.ingest("late", orders(0, 1)).await.status(), 404);

    let path = host.config_path();
    let text = std::fs::read_to_string(&path).expect("read config");
    let added =
        "\n[[pipelines]]\ntables = [\"late\"]\ntransforms = [\"tagger\"]\nsink = \"files\"\n";
    std::fs::write(&path, text + added).expect("add a table");
    eventually(Duration::from_secs(30), "the new table taken", || async {
        (host.ingest("late", orders(0, 5)).await.status() == 202).then_some(())
    })
    .await;
    eventually(
        Duration::from_secs(30),
        "the new table delivered",
        || async { (host.sink_lines("late").len() >= 5).then_some(()) },
    )
    .await;
    host.shutdown().await;
}

/// Runs `weir plugin ARGS --config <host's config>` and returns its output.
fn weir_plugin(host: &TestHost, args: &[&str]) -> String {
    let output = operator(&host.config_path(), ["plugin", args[0]], &args[1..]);
    assert!(
        output.status.success(),
        "weir plugin {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `weir plugin push` reaches every host of a fleet through the
/// coordination watch (each fetches the object and checks its digest);
/// `weir plugin rollback` takes every host back.
#[tokio::test(flavor = "multi_thread")]
async fn a_pushed_plugin_reaches_every_host_and_a_rollback_takes_it_back() {
    let nats = Nats::start();
    let config = base_config(nats.url(), "");
    let hosts = [
        TestHost::start(&config).await,
        TestHost::start(&config).await,
        TestHost::start(&config).await,
    ];
    let original = hosts[0].running_version("validate").await.unwrap();
    let pushed_bytes = std::fs::read(weir_test_artifacts::PASSTHROUGH).unwrap();
    let pushed = weir::sandbox::version_of(&pushed_bytes);
    assert_ne!(original, pushed);

    let began = Instant::now();
    let said = weir_plugin(
        &hosts[0],
        &["push", "validate", weir_test_artifacts::PASSTHROUGH],
    );
    assert!(said.contains("the fleet now runs"), "{said}");
    for host in &hosts {
        eventually(
            Duration::from_secs(20),
            "every host runs the push",
            || async { (host.running_version("validate").await? == pushed).then_some(()) },
        )
        .await;
    }
    println!("push reached 3 hosts in {:?}", began.elapsed());
    // Any host shows what every member runs: a half-done rollout is visible.
    eventually(
        Duration::from_secs(20),
        "members report the push",
        || async {
            let fleet = hosts[2].host.status().report().await.fleet;
            (fleet.members.len() == 3
                && fleet
                    .members
                    .iter()
                    .all(|m| m.plugins.get("validate") == Some(&pushed)))
            .then_some(())
        },
    )
    .await;
    // The pushed pass-through no longer masks: rows show it.
    assert_eq!(hosts[1].ingest("orders", orders(0, 3)).await.status(), 202);
    let lines = eventually(Duration::from_secs(20), "3 rows delivered", || async {
        let lines: Vec<String> = hosts.iter().flat_map(|h| h.sink_lines("orders")).collect();
        (lines.len() == 3).then_some(lines)
    })
    .await;
    assert!(
        lines.iter().all(|line| line.contains("@example.com")),
        "{lines:?}"
    );

    weir_plugin(&hosts[0], &["rollback", "validate"]);
    for host in &hosts {
        eventually(
            Duration::from_secs(20),
            "every host rolled back",
            || async { (host.running_version("validate").await? == original).then_some(()) },
        )
        .await;
    }
    for host in hosts {
        host.shutdown().await;
    }
}

/// `POST /v1/admin/reload` forces a reload and answers with its outcome;
/// it needs an admin key, and is off without `admin_api_keys`.
#[tokio::test(flavor = "multi_thread")]
async fn the_admin_api_forces_a_reload_and_says_why_one_is_refused() {
    let nats = Nats::start();
    let config = format!(
        "admin_api_keys = [\"admin-secret\"]\n{}",
        base_config(nats.url(), "")
    );
    let host = TestHost::start(&config).await;
    let reload = |key: Option<&'static str>| {
        let request = host.http.post(host.url("/v1/admin/reload"));
        let request = match key {
            Some(key) => request.bearer_auth(key),
            None => request,
        };
        async move { request.send().await.expect("front door answers") }
    };
    assert_eq!(reload(None).await.status(), 401);
    assert_eq!(reload(Some(crate::support::ACME_KEY)).await.status(), 401);
    let applied = reload(Some("admin-secret")).await;
    assert_eq!(applied.status(), 200);

    // The topology is a restart's: the reload says so and keeps it.
    let path = host.config_path();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("[stream]\n", "[stream]\nshards = 7\n")).unwrap();
    let partial = reload(Some("admin-secret")).await;
    assert_eq!(partial.status(), 200);
    let body: serde_json::Value = partial.json().await.unwrap();
    assert_eq!(
        body["restart_needed"],
        serde_json::json!(["[stream]"]),
        "{body}"
    );
    assert_eq!(
        host.host.status().report().await.units.len(),
        4,
        "still 4 shards"
    );
    std::fs::write(&path, text).unwrap();

    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("max_deliveries = 3", "max_deliveries = \"three\""),
    )
    .unwrap();
    let refused = reload(Some("admin-secret")).await;
    assert_eq!(refused.status(), 422);
    let body: serde_json::Value = refused.json().await.unwrap();
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("weir.toml:"), "names file:line:col: {error}");
    // The running config still delivers.
    assert_eq!(host.ingest("orders", orders(0, 2)).await.status(), 202);
    eventually(Duration::from_secs(20), "rows delivered", || async {
        (host.sink_lines("orders").len() == 2).then_some(())
    })
    .await;
    host.shutdown().await;

    let plain = TestHost::start(&base_config(nats.url(), "")).await;
    let off = plain
        .http
        .post(plain.url("/v1/admin/reload"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(off.status(), 404);
    plain.shutdown().await;
}
