//! weir reaches an operator's NATS as the `nats` CLI does — a seed list, a
//! `.creds` file, TLS with a client certificate — and names the cause when
//! it cannot (unreachable, login refused, TLS) before any topology check.
//! `weir mq apply` makes an empty server ready for a host that only verifies.

use std::process::Command;
use std::time::{Duration, Instant};

use weir::host::StartError;
use weir::nats::ConnectError;

use crate::nats_auth::{operator::operator_mode, tls::tls_files};
use crate::support::{
    Nats, TestHost, WEIR, base_config, eventually, free_port, orders, start_error,
};

/// The base config with more `[nats]` settings.
fn config_with_nats(url: &str, nats: &str) -> String {
    base_config(url, "").replace(
        &format!("[nats]\nurl = \"{url}\"\n"),
        &format!("[nats]\nurl = \"{url}\"\n{nats}"),
    )
}

async fn delivers_rows(config: &str) {
    let host = TestHost::start(config).await;
    assert_eq!(host.ingest("orders", orders(0, 5)).await.status(), 202);
    eventually(Duration::from_secs(20), "5 rows delivered", || async {
        (host.sink_lines("orders").len() == 5).then_some(())
    })
    .await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_creds_file_logs_in_and_a_wrong_one_is_named_as_a_refused_login() {
    let dir = tempfile::tempdir().unwrap();
    let operator = operator_mode(dir.path());
    let nats = Nats::start_with(&operator.server_config);

    let creds = format!("creds = \"{}\"\n", operator.creds_file.display());
    delivers_rows(&config_with_nats(nats.url(), &creds)).await;

    let wrong = format!("creds = \"{}\"\n", operator.wrong_creds_file.display());
    let started = Instant::now();
    let err = start_error(&config_with_nats(nats.url(), &wrong)).await;
    assert!(
        matches!(err, StartError::Connect(ConnectError::LoginRefused { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("refused weir's login"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a refused login is not retried: {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_with_a_client_certificate_connects_and_a_missing_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let tls = tls_files(dir.path());
    let nats = Nats::start_with(&tls.server_config);
    let url = nats.url().replace("nats://", "tls://");

    let settings = format!(
        "tls_ca = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
        tls.ca.display(),
        tls.client_cert.display(),
        tls.client_key.display()
    );
    delivers_rows(&config_with_nats(&url, &settings)).await;

    let without_cert = format!("tls_ca = \"{}\"\n", tls.ca.display());
    let err = start_error(&config_with_nats(&url, &without_cert)).await;
    assert!(
        matches!(err, StartError::Connect(ConnectError::Tls { .. })),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_seed_list_with_a_dead_address_connects_to_the_live_one() {
    let nats = Nats::start();
    let dead = format!("nats://127.0.0.1:{}", free_port());
    let seeds = format!("{dead},{}", nats.url());
    delivers_rows(&base_config(&seeds, "")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_server_is_named_as_unreachable_not_as_a_topology_mismatch() {
    let dead = format!("nats://127.0.0.1:{}", free_port());
    let err = start_error(&base_config(&dead, "")).await;
    assert!(
        matches!(err, StartError::Connect(ConnectError::Unreachable { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("cannot reach NATS"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn mq_apply_readies_an_empty_server_and_says_what_it_changed() {
    let nats = Nats::start();
    // A host that only verifies: `create = true` removed.
    let config = base_config(nats.url(), "").replace("[stream]\ncreate = true\n", "");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, &config).unwrap();
    let apply = || {
        let output = Command::new(WEIR)
            .args(["mq", "apply", "--config"])
            .arg(&path)
            .env_remove("NATS_URL")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };

    let first = apply();
    for object in [
        "created stream weir_in_0",
        "created stream weir_dlq",
        "created stream KV_weir_coord",
        "created stream KV_weir_state",
        "created stream OBJ_weir_plugins",
        "created stream OBJ_weir_compiled",
        "created stream weir_in_3",
        "created consumer weir_in_3/weir_in_3_0",
        "13 created, 0 updated, 0 unchanged",
    ] {
        assert!(first.contains(object), "no `{object}` in:\n{first}");
    }
    let second = apply();
    assert!(
        second.contains("0 created, 0 updated, 13 unchanged"),
        "{second}"
    );
    delivers_rows(&config).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mq_apply_as_a_user_who_cannot_create_streams_says_the_server_refused_it() {
    let nats = Nats::start_with(
        "authorization { users = [ { user: reader, password: reader-pw, \
         permissions: { publish: { allow: [\">\"], deny: [\"$JS.API.STREAM.CREATE.>\"] } } } ] }",
    );
    let url = nats.url().replace("nats://", "nats://reader:reader-pw@");
    let config = base_config(&url, "").replace("[stream]\ncreate = true\n", "");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, &config).unwrap();
    let started = Instant::now();
    let output = Command::new(WEIR)
        .args(["mq", "apply", "--config"])
        .arg(&path)
        .env_remove("NATS_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("mq apply refused in {:?}: {stderr}", started.elapsed());
    assert_eq!(output.status.code(), Some(5), "{stderr}");
    assert!(
        stderr.contains("NATS refused weir's user")
            && stderr.contains("Permissions Violation")
            && stderr.contains("$JS.API.STREAM.CREATE."),
        "{stderr}"
    );
    assert!(!stderr.contains("timed out"), "{stderr}");
}
