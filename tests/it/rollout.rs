//! One plugin version per fleet: a pushed release is what every host
//! serves with, also a host restarted after the push (with an empty or a
//! warm compiled cache); a push is ready on every member before anything
//! switches, switches each table from the old version to the new once,
//! never back, and a push one member cannot run switches nothing.
//!
//! The versions tell themselves apart in the rows: the configured
//! `validate` (the validator) masks `email` as `***`, the pushed
//! pass-through leaves it as sent.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use weir_test_artifacts::{PASSTHROUGH, VALIDATOR};

use crate::support::{
    Host, Nats, PRODUCERS, TABLES, TestHost, all_tables, balanced, base_config, every_table_grows,
    fleet_config, operator, produce, sizes,
};

const MEMBER_TTL_SECS: u64 = 5;

/// A fleet host as member `id`.
fn spawn(nats_url: &str, id: &'static str) -> Host {
    Host::spawn_with(id, fleet_config(nats_url, id, 0, MEMBER_TTL_SECS))
}

/// Whether a sink line was written by the validator (email masked).
fn masked(line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line)
        .ok()
        .is_some_and(|row| row["email"] == "***")
}

/// The byte length of each table's output of each host: where "after" starts.
fn marks(hosts: &[&Host]) -> BTreeMap<(&'static str, String), u64> {
    let mut marks = BTreeMap::new();
    for host in hosts {
        for table in all_tables() {
            let size = std::fs::metadata(host.output(&table)).map_or(0, |m| m.len());
            marks.insert((host.id, table), size);
        }
    }
    marks
}

/// Complete lines written after `marks` by each of `hosts`: (old, new)
/// version counts.
fn versions_since(hosts: &[&Host], marks: &BTreeMap<(&'static str, String), u64>) -> (u64, u64) {
    let (mut old, mut new) = (0, 0);
    for host in hosts {
        for table in all_tables() {
            let text = std::fs::read(host.output(&table)).unwrap_or_default();
            let from = marks.get(&(host.id, table.clone())).copied().unwrap_or(0) as usize;
            let text = String::from_utf8_lossy(text.get(from..).unwrap_or_default());
            for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
                if masked(line) { old += 1 } else { new += 1 }
            }
        }
    }
    (old, new)
}

/// `weir plugin push validate FILE --wait 60` through `host`'s config.
fn push(host: &Host, file: &str) -> String {
    let config = host.dir.path().join("weir.toml");
    let output = operator(
        &config,
        ["plugin", "push"],
        &["validate", file, "--wait", "60"],
    );
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "push: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Stops `host` (SIGTERM: it hands its units over, so it takes them back
/// from `released` records at once when it starts), points its compiled cache at `cache`, and
/// starts it again on the same data dir.
fn restart_with_cache(host: &mut Host, cache: &Path) {
    host.terminate();
    host.child.wait().unwrap();
    let path = host.dir.path().join("weir.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    let line = config
        .lines()
        .find(|line| line.starts_with("compile_cache_dir = "))
        .unwrap()
        .to_string();
    let config = config.replace(
        &line,
        &format!("compile_cache_dir = \"{}\"", cache.display()),
    );
    std::fs::write(&path, config).unwrap();
    host.start_again();
}

/// After a push is acknowledged, a host restarted with an empty compiled
/// cache, then with a warm one, delivers nothing with the version it has
/// in its own config: it loads the fleet's release before it claims a unit.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_restarted_after_a_push_never_serves_the_old_version() {
    let nats = Nats::start();
    let a = spawn(nats.url(), "host-a");
    let mut b = spawn(nats.url(), "host-b");
    balanced(&a, &["host-a", "host-b"]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| tokio::spawn(produce(a.url.clone(), p, stop.clone())))
        .collect();
    let tables = all_tables();
    let dirs = |a: &Host, b: &Host| [a.dir.path().to_path_buf(), b.dir.path().to_path_buf()];
    let grows = |what: &'static str, before: Vec<u64>, a: &Host, b: &Host| {
        let dirs = dirs(a, b);
        let tables = tables.clone();
        async move {
            let dirs: Vec<&Path> = dirs.iter().map(|d| d.as_path()).collect();
            every_table_grows(&dirs, &tables, &before, what).await;
        }
    };
    grows("rows on every unit", vec![0; TABLES], &a, &b).await;

    let pushed = Instant::now();
    let said = push(&a, PASSTHROUGH);
    println!("push --wait: {:?}\n{said}", pushed.elapsed());
    // Batches that started before the switch finish on the old version:
    // the mark is taken once every table has had a row since.
    let now = |a: &Host, b: &Host| {
        let dirs = dirs(a, b);
        let dirs: Vec<&Path> = dirs.iter().map(|d| d.as_path()).collect();
        sizes(&dirs, &tables)
    };
    grows("rows after the push", now(&a, &b), &a, &b).await;
    grows("more rows after the push", now(&a, &b), &a, &b).await;
    let mark = marks(&[&a, &b]);

    // One cache dir for both restarts: empty at the first, filled by it
    // for the second.
    let cache = tempfile::tempdir().unwrap();
    for what in ["empty", "warm"] {
        let restarted = Instant::now();
        restart_with_cache(&mut b, cache.path());
        balanced(&a, &["host-a", "host-b"]).await;
        grows("rows after the restart", now(&a, &b), &a, &b).await;
        println!(
            "host-b restarted with an {what} compiled cache: serving again in {:?}",
            restarted.elapsed()
        );
    }

    stop.store(true, Ordering::Relaxed);
    for producer in producers {
        producer.await.unwrap();
    }
    let (old, new) = versions_since(&[&a, &b], &mark);
    println!("after the push: {old} rows with the old version, {new} with the new");
    assert!(new > 0, "rows flowed after the push");
    assert_eq!(
        old,
        0,
        "rows delivered with the old version after the push\n{}",
        b.log()
    );
}

/// `weir_reloads_total{result="applied"}` of a host process.
async fn applied_reloads(host: &Host) -> u64 {
    let text = reqwest::get(format!("{}/metrics", host.url))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|line| line.strip_prefix("weir_reloads_total{result=\"applied\"} "))
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

/// Every complete row the hosts wrote for `table`: (its place in the
/// table's sequence, whether the old version wrote it).
fn table_rows(hosts: &[&Host], table: &str) -> Vec<(u64, bool)> {
    let mut rows = Vec::new();
    for host in hosts {
        let text = std::fs::read_to_string(host.output(table)).unwrap_or_default();
        for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
            let row: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            let seq = row["seq"].as_u64().expect("rows carry their seq");
            rows.push((seq, masked(line)));
        }
    }
    rows.sort();
    rows
}

/// A push under load: every member is ready before anything switches, then
/// each host switches once (one new generation), and each table's rows go
/// from the old version to the new at one point of its sequence, never
/// back; a rollback under load likewise.
#[tokio::test(flavor = "multi_thread")]
async fn a_push_under_load_switches_each_table_once_at_one_generation() {
    let nats = Nats::start();
    let a = spawn(nats.url(), "host-a");
    let b = spawn(nats.url(), "host-b");
    balanced(&a, &["host-a", "host-b"]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| tokio::spawn(produce(a.url.clone(), p, stop.clone())))
        .collect();
    let tables = all_tables();
    let dirs = [a.dir.path(), b.dir.path()];
    every_table_grows(&dirs, &tables, &[0; TABLES], "rows on every unit").await;
    let before = [applied_reloads(&a).await, applied_reloads(&b).await];

    let pushed = Instant::now();
    let said = push(&a, PASSTHROUGH);
    println!("push --wait under load: {:?}\n{said}", pushed.elapsed());
    let phase = |text: &str| {
        said.find(text)
            .unwrap_or_else(|| panic!("no {text:?}: {said}"))
    };
    assert!(
        phase("every live member is ready to run") < phase("the fleet now runs")
            && phase("the fleet now runs") < phase("every live member runs"),
        "both phases, in order: {said}"
    );
    every_table_grows(
        &dirs,
        &tables,
        &sizes(&dirs, &tables),
        "rows after the push",
    )
    .await;
    let pushed_reloads = [applied_reloads(&a).await, applied_reloads(&b).await];
    assert_eq!(
        [pushed_reloads[0] - before[0], pushed_reloads[1] - before[1]],
        [1, 1],
        "each host switched at one new generation"
    );
    for host in [&a, &b] {
        assert!(
            host.log().contains("switching to the prepared version"),
            "{} switched to the version it loaded in the first phase",
            host.id
        );
    }

    // Back to each host's own file, still under load: batches wait for the
    // host's switch rather than run on the version the fleet left.
    let config = a.dir.path().join("weir.toml");
    let output = operator(
        &config,
        ["plugin", "rollback"],
        &["validate", "--wait", "60"],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    every_table_grows(
        &dirs,
        &tables,
        &sizes(&dirs, &tables),
        "rows after the rollback",
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for producer in producers {
        producer.await.unwrap();
    }
    let after = [applied_reloads(&a).await, applied_reloads(&b).await];
    assert_eq!(
        [after[0] - pushed_reloads[0], after[1] - pushed_reloads[1]],
        [1, 1],
        "each host switched back at one new generation"
    );

    // Each table: old, then new, then old again, each at one point of its
    // sequence (a table whose first row came after a switch starts later).
    let (mut pushed, mut back) = (0, 0);
    for table in &tables {
        let rows = table_rows(&[&a, &b], table);
        let mut runs: Vec<bool> = Vec::new();
        let mut starts: Vec<u64> = Vec::new();
        for (seq, old) in &rows {
            if runs.last() != Some(old) {
                runs.push(*old);
                starts.push(*seq);
            }
        }
        let allowed: [&[bool]; 5] = [
            &[true],
            &[false],
            &[true, false],
            &[false, true],
            &[true, false, true],
        ];
        assert!(
            allowed.contains(&runs.as_slice()),
            "{table}: versions by sequence (old = true) {runs:?}, switching at rows {starts:?}"
        );
        pushed += usize::from(runs.starts_with(&[true, false]));
        back += usize::from(runs.ends_with(&[false, true]));
    }
    println!(
        "of {TABLES} tables under load, {pushed} switched to the pushed version and {back} back, each once"
    );
    assert!(pushed > 0 && back > 0, "the switches happened under load");
}

/// A push one member cannot run (its settings for the plugin are ones the
/// new version refuses) fails in the first phase with that member's
/// reason, and nothing switches anywhere; the next push goes through.
#[tokio::test(flavor = "multi_thread")]
async fn a_push_a_member_cannot_run_is_refused_and_nothing_switches() {
    let nats = Nats::start();
    let member = |id: &str| format!("\n[coordination]\nhost_id = \"{id}\"\n");
    let a = TestHost::start(&base_config(nats.url(), &member("host-a"))).await;
    // host-b runs the pass-through with a setting the validator refuses.
    let config_b = base_config(nats.url(), &member("host-b"))
        .replace("weir_validator.wasm", "weir_bench_passthrough.wasm")
        .replace("mask = [\"email\"] }", "mask = [\"email\"], bogus = 1 }");
    let b = TestHost::start(&config_b).await;
    let running = [
        a.running_version("validate").await.unwrap(),
        b.running_version("validate").await.unwrap(),
    ];

    let output = operator(
        &a.config_path(),
        ["plugin", "push"],
        &["validate", VALIDATOR, "--wait", "30"],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the push went through: {stderr}");
    assert!(
        stderr.contains("1 of 2 live members cannot run")
            && stderr.contains("host-b: ")
            && stderr.contains("bogus")
            && stderr.contains("nothing switched"),
        "{stderr}"
    );
    let listed = String::from_utf8_lossy(
        &operator(&a.config_path(), ["plugin", "list"], &["validate"]).stdout,
    )
    .into_owned();
    assert!(listed.contains("never pushed"), "{listed}");
    assert!(!listed.contains("being prepared"), "{listed}");
    assert_eq!(
        [
            a.running_version("validate").await.unwrap(),
            b.running_version("validate").await.unwrap()
        ],
        running
    );

    // One both can run: ready on both, then both run it.
    let output = operator(
        &a.config_path(),
        ["plugin", "push"],
        &["validate", PASSTHROUGH, "--wait", "30"],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let pushed = weir::sandbox::version_of(&std::fs::read(PASSTHROUGH).unwrap());
    assert_eq!(a.running_version("validate").await, Some(pushed.clone()));
    assert_eq!(b.running_version("validate").await, Some(pushed));
    a.shutdown().await;
    b.shutdown().await;
}

/// `push` checks the component in the config's compiled cache: a version
/// compiled before is checked from it, not compiled again.
#[tokio::test(flavor = "multi_thread")]
async fn a_push_checks_a_cached_version_without_compiling_it() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    // The operator's own config: the same fleet, an empty compiled cache.
    let cache = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(host.config_path()).unwrap();
    let line = text
        .lines()
        .find(|line| line.starts_with("compile_cache_dir = "))
        .unwrap();
    let operator_config = cache.path().join("weir.toml");
    let own_cache = format!("compile_cache_dir = \"{}\"", cache.path().display());
    std::fs::write(&operator_config, text.replace(line, &own_cache)).unwrap();
    let run = |args: &[&str]| {
        let output = operator(&operator_config, ["plugin", args[0]], &args[1..]);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{args:?}: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    };
    let version = weir::sandbox::version_of(&std::fs::read(PASSTHROUGH).unwrap());

    let first = run(&["push", "validate", PASSTHROUGH, "--wait", "30"]);
    assert!(first.contains(&format!("{version} checked in")), "{first}");
    assert!(
        first.contains("(compiled)"),
        "an empty cache compiles: {first}"
    );
    run(&["rollback", "validate", "--to", "file", "--wait", "30"]);
    let again = run(&["push", "validate", PASSTHROUGH, "--wait", "30"]);
    assert!(again.contains("(from the compiled cache)"), "{again}");
    assert_eq!(host.running_version("validate").await, Some(version));
    println!("{first}{again}");
    host.shutdown().await;
}
