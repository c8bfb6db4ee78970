//! Canaries on a real fleet of two hosts: a candidate pushed to 25% of
//! eight tenants serves exactly those tenants' rows (the others never see
//! it) until it is promoted; a candidate that traps is rolled back by the
//! fleet on its own, with the reason in `weir plugin list` and the status;
//! a policy cannot be canaried; a candidate on chosen units serves every
//! tenant's rows there and no row elsewhere.
//!
//! The versions tell themselves apart in the rows: the configured
//! `validate` (the validator) masks `email` as `***`, the pushed
//! pass-through leaves it as sent.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use weir::reload::canary::{Outcome, bucket};
use weir_test_artifacts::{CHAOS, PASSTHROUGH};

use crate::support::{TestHost, base_config, eventually, every_host_runs, operator};

/// Eight tenants: two that `validate`'s 25% canary serves (by the stable
/// hash, as every host computes it) and six it does not.
fn tenants() -> (Vec<String>, Vec<String>) {
    let names = (0..).map(|n| format!("tenant-{n}"));
    let served = |t: &String| bucket("validate", t) < 2_500;
    let canary: Vec<String> = names.clone().filter(served).take(2).collect();
    let others: Vec<String> = names.filter(|t| !served(t)).take(6).collect();
    (canary, others)
}

/// The base config as member `id`, with `tenants` (API key `<tenant>-key`).
fn config(nats_url: &str, id: &str, tenants: &[String]) -> String {
    let declared: String = tenants
        .iter()
        .map(|t| format!("[[tenants]]\nname = \"{t}\"\napi_keys = [\"{t}-key\"]\n\n"))
        .collect();
    base_config(
        nats_url,
        &format!("\n[coordination]\nhost_id = \"{id}\"\nmember_ttl_secs = 5\n"),
    )
    .replace(
        "[[tenants]]\nname = \"acme\"",
        &format!("{declared}[[tenants]]\nname = \"acme\""),
    )
}

/// Sends rows `seqs` of `orders` as `tenant`.
async fn send(host: &TestHost, tenant: &str, seqs: std::ops::Range<u64>) {
    let body: String = seqs
        .map(|n| format!("{{\"id\":{n},\"seq\":{n},\"email\":\"u{n}@example.com\"}}\n"))
        .collect();
    let response = host
        .http
        .post(host.url("/v1/ingest/orders"))
        .bearer_auth(format!("{tenant}-key"))
        .body(body)
        .send()
        .await
        .expect("front door answers");
    assert_eq!(
        response.status(),
        202,
        "{tenant}: {:?}",
        response.text().await
    );
}

/// `tenant`'s rows the hosts wrote: seq → whether the validator (the
/// release) wrote it.
fn written(hosts: &[&TestHost], tenant: &str) -> BTreeMap<u64, bool> {
    let mut rows = BTreeMap::new();
    for host in hosts {
        let path = host
            .dir
            .path()
            .join("out")
            .join(tenant)
            .join("orders.ndjson");
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
            let row: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            let seq = row["seq"].as_u64().expect("rows carry their seq");
            rows.insert(seq, row["email"] == "***");
        }
    }
    rows
}

/// Waits until every tenant has rows `0..upto` written.
async fn delivered(hosts: &[&TestHost], tenants: &[String], upto: u64) {
    eventually(Duration::from_secs(60), "every row delivered", || async {
        tenants
            .iter()
            .all(|t| written(hosts, t).range(..upto).count() as u64 == upto)
            .then_some(())
    })
    .await;
}

/// `weir plugin ARGS…` through `host`'s config: stdout, or a panic with
/// stderr.
fn plugin(host: &TestHost, command: &str, args: &[&str]) -> String {
    let output = operator(&host.config_path(), ["plugin", command], args);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "plugin {command} {args:?}: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// `weir status` against `host`: its stdout.
fn weir_status(host: &TestHost) -> String {
    let output = std::process::Command::new(crate::support::WEIR)
        .args(["status", "--url", &host.url("")])
        .output()
        .expect("weir runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_canary_serves_only_its_tenants_until_it_is_promoted() {
    let nats = crate::support::Nats::start();
    let (canary, others) = tenants();
    let all: Vec<String> = canary.iter().chain(&others).cloned().collect();
    let a = TestHost::start(&config(nats.url(), "host-a", &all)).await;
    let b = TestHost::start(&config(nats.url(), "host-b", &all)).await;
    let hosts = [&a, &b];
    for tenant in &all {
        send(&a, tenant, 0..20).await;
    }
    delivered(&hosts, &all, 20).await;

    let said = plugin(
        &a,
        "push",
        &["validate", PASSTHROUGH, "--canary", "25%", "--wait", "30"],
    );
    assert!(
        said.contains("every live member is ready to run")
            && said.contains("canary of")
            && said.contains("25% of tenants"),
        "{said}"
    );
    // A host that sees the canary holds its batches until it runs it.
    every_host_runs(
        &hosts,
        "every host sees the canary",
        ("validate", None),
        true,
    )
    .await;
    // Two waves, the second once the first is in.
    for wave in [20..40, 40..60] {
        for tenant in &all {
            send(&b, tenant, wave.clone()).await;
        }
        delivered(&hosts, &all, wave.end).await;
    }
    // A host joining during the canary loads both versions before it
    // claims a unit, then serves its share of the rows.
    let c = TestHost::start(&config(nats.url(), "host-c", &all)).await;
    eventually(Duration::from_secs(30), "host-c pulls units", || async {
        let report = c.host.status().report().await;
        report
            .units
            .iter()
            .any(|u| u.owner.as_deref() == Some("host-c"))
            .then_some(())
    })
    .await;
    let hosts = [&a, &b, &c];
    for tenant in &all {
        send(&c, tenant, 60..70).await;
    }
    delivered(&hosts, &all, 70).await;
    let joined_wrote = all
        .iter()
        .filter(|t| {
            c.dir
                .path()
                .join("out")
                .join(t)
                .join("orders.ndjson")
                .exists()
        })
        .count();
    println!("host-c joined and wrote rows of {joined_wrote} tenants");
    for tenant in &others {
        let rows = written(&hosts, tenant);
        assert!(
            rows.values().all(|&old| old),
            "{tenant} is not in the canary, yet the candidate wrote {:?}",
            rows.iter()
                .filter(|(_, old)| !**old)
                .map(|(s, _)| s)
                .collect::<Vec<_>>()
        );
    }
    for tenant in &canary {
        let rows = written(&hosts, tenant);
        assert!(
            rows.range(..20).all(|(_, &old)| old),
            "{tenant}: before the canary"
        );
        assert!(
            rows.range(20..70).all(|(_, &old)| !old),
            "{tenant}: the canary's tenant got the release after the switch: {rows:?}"
        );
        // One switch, never back.
        let switches = rows
            .values()
            .zip(rows.values().skip(1))
            .filter(|(x, y)| x != y)
            .count();
        assert_eq!(switches, 1, "{tenant}: {rows:?}");
    }

    // Both versions side by side, fleet-wide: in the status and the list.
    let status = eventually(Duration::from_secs(20), "canary counts shared", || async {
        let report = a.host.status().report().await;
        let plugin = report.plugins.into_iter().find(|p| p.name == "validate")?;
        let canary = plugin.canary.clone()?;
        (canary.candidate.rows >= 2 * 50 && canary.serving.rows >= 6 * 50).then_some(plugin)
    })
    .await;
    let candidate = status.canary.as_ref().unwrap();
    println!(
        "canary {} ({}): serving {} / candidate {}",
        candidate.version,
        candidate.serves,
        candidate.serving.describe(),
        candidate.candidate.describe()
    );
    let status = weir_status(&b);
    assert!(
        status.contains("canary of validate: ")
            && status.contains("serving 25% of tenants since")
            && status.contains("  candidate "),
        "{status}"
    );
    let listed = plugin(&a, "list", &["validate"]);
    assert!(
        listed.contains("canary: ")
            && listed.contains("serving   ")
            && listed.contains("candidate ")
            && listed.contains("counted by host-"),
        "{listed}"
    );
    let metrics = a.get_text("/metrics").await + &b.get_text("/metrics").await;
    for role in ["serving", "candidate"] {
        assert!(
            metrics.contains(&format!("role=\"{role}\",outcome=\"ran\"")),
            "{role} rows in the metrics:\n{metrics}"
        );
    }

    // Promoted: every tenant gets the candidate, which is now the release.
    plugin(&a, "promote", &["validate"]);
    let passthrough = weir::sandbox::version_of(&std::fs::read(PASSTHROUGH).unwrap());
    every_host_runs(
        &hosts,
        "every host runs the promoted version",
        ("validate", Some(&passthrough)),
        false,
    )
    .await;
    for tenant in &all {
        send(&a, tenant, 70..90).await;
    }
    delivered(&hosts, &all, 90).await;
    for tenant in &all {
        let rows = written(&hosts, tenant);
        assert!(rows.range(70..).all(|(_, &old)| !old), "{tenant}: {rows:?}");
    }
    let listed = plugin(&a, "list", &["validate"]);
    assert!(
        listed.contains("promote ") && listed.contains("promoted (operator)"),
        "{listed}"
    );
    assert!(!listed.contains("\n  canary: "), "{listed}");
    a.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;
}

/// The release is the pass-through (which takes any settings) given the
/// chaos plugin's settings; the candidate is the chaos plugin, which traps
/// on every batch with them.
#[tokio::test(flavor = "multi_thread")]
async fn a_canary_that_traps_is_rolled_back_by_the_fleet_with_the_reason() {
    let nats = crate::support::Nats::start();
    let (canary, others) = tenants();
    let all: Vec<String> = canary.iter().chain(&others).cloned().collect();
    let config = |id: &str| {
        config(nats.url(), id, &all)
            .replace("weir_validator.wasm", "weir_bench_passthrough.wasm")
            .replace(
                "settings = { required = [\"id\"], mask = [\"email\"] }",
                "settings = { mode = \"trap\" }",
            )
    };
    let a = TestHost::start(&config("host-a")).await;
    let b = TestHost::start(&config("host-b")).await;
    let hosts = [&a, &b];

    let pushed = Instant::now();
    let said = plugin(
        &a,
        "push",
        &[
            "validate",
            CHAOS,
            "--canary",
            "25%",
            "--promote-after",
            "10m",
            "--max-trap-rate",
            "0",
            "--max-dead-letter-rate",
            "1%",
            "--wait",
            "30",
        ],
    );
    assert!(said.contains("promoted after 10m"), "{said}");
    for tenant in &all {
        send(&a, tenant, 0..20).await;
    }
    let status = eventually(
        Duration::from_secs(60),
        "the canary rolled back",
        || async {
            let report = a.host.status().report().await;
            let plugin = report.plugins.into_iter().find(|p| p.name == "validate")?;
            plugin
                .last_canary
                .as_ref()
                .is_some_and(|ended| ended.outcome == Outcome::RolledBack)
                .then_some(plugin)
        },
    )
    .await;
    let rolled_back = pushed.elapsed();
    let ended = status.last_canary.as_ref().unwrap();
    println!(
        "rolled back {rolled_back:?} after the push: {}",
        ended.reason
    );
    assert!(rolled_back < Duration::from_secs(600), "within its window");
    assert_eq!(ended.by, "automatic");
    assert!(ended.reason.contains("trap rate"), "{}", ended.reason);
    assert!(status.canary.is_none());
    let listed = plugin(&a, "list", &["validate"]);
    assert!(
        listed.contains("rolled back (automatic)") && listed.contains("trap rate"),
        "{listed}"
    );
    let status = weir_status(&b);
    assert!(
        status.contains("last canary of validate: ")
            && status.contains("rolled back (automatic): the candidate's trap rate"),
        "{status}"
    );
    // The release serves everyone again: every row ends delivered (a row
    // the candidate trapped on comes back to the release), none lost.
    let passthrough = weir::sandbox::version_of(&std::fs::read(PASSTHROUGH).unwrap());
    assert_eq!(a.running_version("validate").await, Some(passthrough));
    for tenant in &others {
        eventually(Duration::from_secs(30), "the others' rows", || async {
            (written(&hosts, tenant).len() == 20).then_some(())
        })
        .await;
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// A budget or router is asked at the front door, per request: a canary
/// of one is refused with the reason, before anything is pushed.
#[tokio::test(flavor = "multi_thread")]
async fn a_canary_of_a_policy_is_refused_with_the_reason() {
    let nats = crate::support::Nats::start();
    let policy = "\n[policies]\nbudget = \"budget\"\n\n[plugins.budget]\nwasm = \"weir_tenant_budget.wasm\"\nworld = \"budget\"\n";
    let host = TestHost::start(&base_config(nats.url(), policy)).await;
    let output = operator(
        &host.config_path(),
        ["plugin", "push"],
        &[
            "budget",
            weir_test_artifacts::TENANT_BUDGET,
            "--canary",
            "10%",
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("budget policy") && stderr.contains("front door per request"),
        "{stderr}"
    );
    // Thresholds judge a canary: alone they are refused, and a bad rate says so.
    for (args, says) in [
        (
            &["--max-trap-rate", "0"][..],
            "give --canary SHARE, --tenants or --units",
        ),
        (&["--canary", "120%"][..], "`120%` is not a percentage"),
        (
            &["--tenants", "acme,nobody"][..],
            "--tenants names nobody not in",
        ),
        (
            &["--canary", "5%", "--promote-after", "soon"][..],
            "`soon` is not a duration",
        ),
    ] {
        let mut all = vec!["validate", PASSTHROUGH];
        all.extend_from_slice(args);
        let output = operator(&host.config_path(), ["plugin", "push"], &all);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains(says),
            "{args:?}: {stderr}"
        );
    }
    let listed = String::from_utf8_lossy(
        &operator(&host.config_path(), ["plugin", "list"], &["budget"]).stdout,
    )
    .into_owned();
    assert!(listed.contains("never pushed"), "{listed}");
    host.shutdown().await;
}

/// A candidate that stays under its limits is promoted by the fleet once
/// its window is over, and the release records it.
#[tokio::test(flavor = "multi_thread")]
async fn a_canary_under_its_limits_is_promoted_after_its_window() {
    let nats = crate::support::Nats::start();
    let (canary, others) = tenants();
    let all: Vec<String> = canary.iter().chain(&others).cloned().collect();
    let a = TestHost::start(&config(nats.url(), "host-a", &all)).await;
    let b = TestHost::start(&config(nats.url(), "host-b", &all)).await;
    let pushed = Instant::now();
    plugin(
        &a,
        "push",
        &[
            "validate",
            PASSTHROUGH,
            "--tenants",
            &canary[0],
            "--promote-after",
            "3s",
            "--max-trap-rate",
            "0",
            "--wait",
            "30",
        ],
    );
    for tenant in &all {
        send(&a, tenant, 0..10).await;
    }
    let passthrough = weir::sandbox::version_of(&std::fs::read(PASSTHROUGH).unwrap());
    let status = eventually(Duration::from_secs(30), "the canary promoted", || async {
        let report = b.host.status().report().await;
        let plugin = report.plugins.into_iter().find(|p| p.name == "validate")?;
        (plugin.version == passthrough && plugin.canary.is_none()).then_some(plugin)
    })
    .await;
    let promoted = pushed.elapsed();
    let ended = status.last_canary.as_ref().expect("the end is recorded");
    println!("promoted {promoted:?} after the push: {}", ended.reason);
    assert!(promoted >= Duration::from_secs(3), "not before its window");
    assert_eq!(
        (ended.outcome, ended.by.as_str()),
        (Outcome::Promoted, "automatic")
    );
    assert!(
        ended.reason.contains("stayed under its limits for 3s"),
        "{}",
        ended.reason
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// `--units`: the candidate serves every row of the chosen unit, whatever
/// its tenant, and no row of another unit; units outside the topology, or
/// not written `<partition>.<shard>`, are refused with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn a_canary_on_units_serves_every_tenant_there_and_no_other_unit() {
    const PARTITIONS: u32 = 4;
    const SHARDS: u32 = 2;
    let nats = crate::support::Nats::start();
    let all: Vec<String> = (0..8).map(|n| format!("tenant-{n}")).collect();
    let config = |id: &str| {
        config(nats.url(), id, &all).replace(
            "[stream]\ncreate = true\n",
            &format!("[stream]\ncreate = true\npartitions = {PARTITIONS}\nshards = {SHARDS}\n"),
        )
    };
    let a = TestHost::start(&config("host-a")).await;
    let b = TestHost::start(&config("host-b")).await;
    let hosts = [&a, &b];
    // Where each tenant's `orders` go, as every host routes them.
    let router = weir::topology::Names::new("weir", PARTITIONS, SHARDS);
    let chosen = router.route(&all[0], "orders");
    let (there, elsewhere): (Vec<String>, Vec<String>) = all
        .iter()
        .cloned()
        .partition(|t| router.route(t, "orders") == chosen);
    assert!(!elsewhere.is_empty(), "eight tenants over eight units");

    for (units, says) in [
        ("9.0", "--units names 9.0 outside"),
        ("0.5", "--units names 0.5 outside"),
        ("first", "`first` is not a unit"),
    ] {
        let output = operator(
            &a.config_path(),
            ["plugin", "push"],
            &["validate", PASSTHROUGH, "--units", units],
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains(says),
            "--units {units}: {stderr}"
        );
    }

    let unit = chosen.to_string();
    let said = plugin(
        &a,
        "push",
        &["validate", PASSTHROUGH, "--units", &unit, "--wait", "30"],
    );
    assert!(
        said.contains("canary of") && said.contains(&format!("unit {unit}")),
        "{said}"
    );
    every_host_runs(
        &hosts,
        "every host sees the canary",
        ("validate", None),
        true,
    )
    .await;
    for tenant in &all {
        send(&a, tenant, 0..10).await;
    }
    delivered(&hosts, &all, 10).await;
    for tenant in &there {
        let rows = written(&hosts, tenant);
        assert!(
            rows.values().all(|&old| !old),
            "{tenant}'s rows are in unit {unit}, yet the release wrote some: {rows:?}"
        );
    }
    for tenant in &elsewhere {
        let rows = written(&hosts, tenant);
        assert!(
            rows.values().all(|&old| old),
            "{tenant}'s rows are not in unit {unit}, yet the candidate wrote some: {rows:?}"
        );
    }
    let status = weir_status(&a);
    assert!(
        status.contains(&format!("serving unit {unit} since")),
        "{status}"
    );
    println!(
        "a canary on unit {unit}: {} tenants there got the candidate, {} elsewhere the release",
        there.len(),
        elsewhere.len()
    );
    a.shutdown().await;
    b.shutdown().await;
}
