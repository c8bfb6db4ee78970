//! Operator commands against a running host, as the real binary runs them:
//! `weir plugin push|rollback|list` (a plugin is checked against its world
//! before anything is pushed; `--wait` follows member keys; any release in
//! the history can be gone back to) and `weir tenant set|get|list`
//! (settings checked against what the budget policy declares).

use std::process::Output;

use weir::reload::releases;
use weir_test_artifacts::{CHAOS, NDJSON_SINK, PASSTHROUGH, VALIDATOR};

use crate::support::{Nats, TestHost, base_config, operator};

/// (stdout, stderr) of a finished command.
fn said(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs `weir plugin|tenant COMMAND` and returns its stdout, asserting it succeeded.
fn ok(config: &std::path::Path, command: [&str; 2], args: &[&str]) -> String {
    let output = operator(config, command, args);
    let (stdout, stderr) = said(&output);
    assert!(
        output.status.success(),
        "weir {command:?} {args:?}: {stderr}"
    );
    stdout
}

/// Runs `weir plugin|tenant COMMAND` and returns its stderr, asserting it failed.
fn refused(config: &std::path::Path, command: [&str; 2], args: &[&str]) -> String {
    let output = operator(config, command, args);
    let (stdout, stderr) = said(&output);
    assert!(
        !output.status.success(),
        "weir {command:?} {args:?} succeeded: {stdout}"
    );
    stderr
}

fn digest_of(path: &str) -> String {
    releases::digest(&std::fs::read(path).expect("read a built plugin"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_push_is_checked_waited_for_listed_and_rolled_back_to_any_release() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    let config = host.config_path();
    let original = host.running_version("validate").await.unwrap();

    // A sink pushed as a transform: the sandbox's error, nothing pushed.
    let stderr = refused(&config, ["plugin", "push"], &["validate", NDJSON_SINK]);
    assert!(stderr.contains("missing export `transform`"), "{stderr}");
    assert!(stderr.contains("nothing pushed"), "{stderr}");
    let listed = ok(&config, ["plugin", "list"], &["validate"]);
    assert!(listed.contains("never pushed"), "{listed}");
    assert_eq!(
        host.running_version("validate").await,
        Some(original.clone())
    );

    // `--wait` returns once the host's member key reports the version.
    let passthrough = digest_of(PASSTHROUGH);
    let short = releases::version_of_digest(&passthrough).to_string();
    let stdout = ok(
        &config,
        ["plugin", "push"],
        &["validate", PASSTHROUGH, "--wait", "30"],
    );
    assert!(
        stdout.contains(&format!("every live member runs {short}")),
        "{stdout}"
    );
    assert_eq!(host.running_version("validate").await, Some(short.clone()));

    // A second release (the validator's own bytes), then the history.
    let validator = digest_of(VALIDATOR);
    ok(
        &config,
        ["plugin", "push"],
        &["validate", VALIDATOR, "--wait", "30"],
    );
    let listed = ok(&config, ["plugin", "list"], &[]);
    let newer = listed.find(&format!("push      {validator}  (current)"));
    let older = listed.find(&format!("push      {passthrough}\n"));
    assert!(
        newer.is_some() && older.is_some() && newer < older,
        "newest first, with how: {listed}"
    );
    assert!(listed.contains("files (sink)\n  release: each host's own file (never pushed)"));
    assert!(listed.contains(&format!("runs {original}")), "{listed}");
    assert!(listed.contains("Z  push"), "times in RFC 3339: {listed}");

    // Back to the older release by the version status shows, not a toggle.
    ok(
        &config,
        ["plugin", "rollback"],
        &["validate", "--to", &short, "--wait", "30"],
    );
    assert_eq!(host.running_version("validate").await, Some(short.clone()));
    let listed = ok(&config, ["plugin", "list"], &["validate"]);
    assert!(
        listed.contains(&format!("rollback  {passthrough}  (current)")),
        "{listed}"
    );
    let stderr = refused(
        &config,
        ["plugin", "rollback"],
        &["validate", "--to", "0000"],
    );
    assert!(stderr.contains("no release `0000`"), "{stderr}");
    ok(
        &config,
        ["plugin", "rollback"],
        &["validate", "--to", "file", "--wait", "30"],
    );
    assert_eq!(host.running_version("validate").await, Some(original));

    // A member that cannot run the release refuses it in the first phase,
    // naming why, and nothing switches: an operator's config with a plugin
    // this host's config lacks.
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("weir.toml");
    let tagger = format!(
        "[plugins.tagger]\nwasm = \"{CHAOS}\"\nworld = \"transform\"\nsettings = {{ mode = \"tag\", tag = \"v1\" }}\n"
    );
    std::fs::write(&other, base_config(nats.url(), &tagger)).unwrap();
    let stderr = refused(
        &other,
        ["plugin", "push"],
        &["tagger", CHAOS, "--wait", "3"],
    );
    assert!(
        stderr.contains("1 of 1 live members cannot run")
            && stderr.contains("no plugin `tagger` in this host's config")
            && stderr.contains("nothing switched"),
        "{stderr}"
    );
    let listed = ok(&other, ["plugin", "list"], &["tagger"]);
    assert!(listed.contains("never pushed"), "{listed}");
    assert!(!listed.contains("being prepared"), "{listed}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tenant_settings_are_checked_against_the_budget_policy_and_shown() {
    let nats = Nats::start();
    let budget = r#"
[policies]
budget = "budget"

[plugins.budget]
wasm = "weir_tenant_budget.wasm"
world = "budget"
settings = { queued_bytes = 100000000, tenants.acme = { queued_rows = 1000000 } }

[[tenants]]
name = "beta"
api_keys = ["beta-key-123"]
"#;
    let host = TestHost::start(&base_config(nats.url(), budget)).await;
    let config = host.config_path();
    let none = "none: the policy's own settings apply";

    // A misspelled key: refused, naming it, its likely fix and the known keys.
    let stderr = refused(
        &config,
        ["tenant", "set"],
        &["acme", r#"{"qeued_bytes": 5}"#],
    );
    for expected in [
        "key `qeued_bytes`",
        "did you mean `queued_bytes`?",
        "`queued_rows`",
        "--force",
    ] {
        assert!(stderr.contains(expected), "no {expected}: {stderr}");
    }
    assert_eq!(
        ok(&config, ["tenant", "get"], &["acme"]),
        format!("acme: {none}\n")
    );
    let output = operator(
        &config,
        ["tenant", "set"],
        &["acme", r#"{"qeued_bytes": 5}"#, "--force"],
    );
    let (_, stderr) = said(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("did you mean `queued_bytes`?"), "{stderr}");
    assert_eq!(
        ok(&config, ["tenant", "get"], &["acme"]),
        "acme: {\"qeued_bytes\":5}\n"
    );

    ok(
        &config,
        ["tenant", "set"],
        &["beta", r#"{"queued_rows": 7}"#],
    );
    assert_eq!(
        ok(&config, ["tenant", "list"], &[]),
        "acme  {\"qeued_bytes\":5}\nbeta  {\"queued_rows\":7}\n"
    );
    let stderr = refused(&config, ["tenant", "set"], &["acme", "[1]"]);
    assert!(stderr.contains("must be a JSON object"), "{stderr}");
    ok(&config, ["tenant", "unset"], &["acme"]);
    assert_eq!(
        ok(&config, ["tenant", "list"], &[]),
        format!("acme  {none}\nbeta  {{\"queued_rows\":7}}\n")
    );

    // Without a budget policy nothing would read them: refused, nothing written.
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("weir.toml");
    std::fs::write(&plain, base_config(nats.url(), "")).unwrap();
    let stderr = refused(
        &plain,
        ["tenant", "set"],
        &["acme", r#"{"queued_bytes": 5}"#],
    );
    assert!(
        stderr.contains("no budget policy reads tenant settings"),
        "{stderr}"
    );
    assert_eq!(
        ok(&config, ["tenant", "get"], &["acme"]),
        format!("acme: {none}\n")
    );
    host.shutdown().await;
}
