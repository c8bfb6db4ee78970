//! No secret reaches a log at any level: `weir run` at DEBUG (async-nats at
//! TRACE) logs in with every kind of NATS login the test server supports —
//! a password in the URL or in the config, a token in the URL or in the
//! config, an nkey seed, a `.creds` file — stores a row, stops, and its
//! whole log is searched for the secret and for the tenant's API key.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::nats_auth::operator::operator_mode;
use crate::support::{ACME_KEY, Nats, WEIR, base_config, eventually, free_port, orders};

const PASSWORD: &str = "S3cretPassw0rd-a7f1";
const TOKEN: &str = "T0kenSecret-93bd";

/// A `weir run` that a failing test does not leave behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `url` with `userinfo@` after its scheme.
fn with_userinfo(url: &str, userinfo: &str) -> String {
    url.replacen("://", &format!("://{userinfo}@"), 1)
}

/// Runs a host on `url` with the `[nats]` lines `login`, stores a row,
/// stops it, and returns its whole log.
async fn log_of_a_host(url: &str, login: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = base_config(url, "")
        .replace(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{port}\""),
        )
        .replacen(
            &format!("url = \"{url}\"\n"),
            &format!("url = \"{url}\"\n{login}"),
            1,
        );
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, config).unwrap();
    let log_path = dir.path().join("weir.log");
    let mut child = KillOnDrop(
        Command::new(WEIR)
            .args(["run", "--config"])
            .arg(&path)
            .env_remove("RUST_LOG")
            .env("WEIR_LOG", "debug,weir=trace,async_nats=trace")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    eventually(Duration::from_secs(30), "the host to be ready", || async {
        let answer = http.get(format!("{base}/readyz")).send().await.ok()?;
        answer.status().is_success().then_some(())
    })
    .await;
    let stored = http
        .post(format!("{base}/v1/ingest/orders"))
        .bearer_auth(ACME_KEY)
        .body(orders(0, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(stored.status(), 202);
    // SAFETY: kill(2) on the test's own child.
    unsafe { libc::kill(child.0.id() as libc::pid_t, libc::SIGTERM) };
    let exited = tokio::task::block_in_place(|| child.0.wait()).unwrap();
    assert!(exited.success(), "weir run exited with {exited}");
    std::fs::read_to_string(&log_path).unwrap()
}

/// Fails naming the secret's kind and the lines that hold it; also checks
/// that the client's DEBUG lines are there (else the search proves nothing).
fn assert_no_secret(kind: &str, log: &str, secrets: &[&str]) {
    assert!(
        log.contains("async_nats") && log.contains("connecting to server"),
        "{kind}: async-nats' DEBUG lines are missing, so the search would prove nothing:\n{log}"
    );
    for secret in secrets.iter().chain([&ACME_KEY]) {
        let lines: Vec<&str> = log.lines().filter(|line| line.contains(secret)).collect();
        assert!(
            lines.is_empty(),
            "{kind}: a secret is in the log:\n{}",
            lines.join("\n")
        );
    }
    println!("{kind}: {} log lines, no secret", log.lines().count());
}

#[tokio::test(flavor = "multi_thread")]
async fn no_nats_secret_reaches_a_debug_log_whatever_the_login() {
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let seed_file = dir.path().join("weir.nk");
    std::fs::write(&seed_file, &seed).unwrap();

    let users = Nats::start_with(&format!(
        "authorization {{ users = [ {{ user: weiru, password: \"{PASSWORD}\" }}, {{ nkey: {} }} ] }}",
        user.public_key()
    ));
    let url = users.url();
    let log = log_of_a_host(&with_userinfo(url, &format!("weiru:{PASSWORD}")), "").await;
    assert_no_secret("password in the URL", &log, &[PASSWORD]);
    let login = format!("user = \"weiru\"\npassword = \"{PASSWORD}\"\n");
    assert_no_secret(
        "password in the config",
        &log_of_a_host(url, &login).await,
        &[PASSWORD],
    );
    let login = format!("nkey = \"{}\"\n", seed_file.display());
    assert_no_secret("nkey", &log_of_a_host(url, &login).await, &[&seed]);

    let tokens = Nats::start_with(&format!("authorization {{ token: \"{TOKEN}\" }}"));
    let url = tokens.url();
    let log = log_of_a_host(&with_userinfo(url, TOKEN), "").await;
    assert_no_secret("token in the URL", &log, &[TOKEN]);
    let login = format!("token = \"{TOKEN}\"\n");
    assert_no_secret(
        "token in the config",
        &log_of_a_host(url, &login).await,
        &[TOKEN],
    );

    let operator = operator_mode(dir.path());
    let creds = std::fs::read_to_string(&operator.creds_file).unwrap();
    let creds_seed = creds
        .lines()
        .find(|line| line.starts_with("SU"))
        .expect("a user seed in the creds file")
        .to_string();
    let server = Nats::start_with(&operator.server_config);
    let login = format!("creds = \"{}\"\n", operator.creds_file.display());
    assert_no_secret(
        "creds",
        &log_of_a_host(server.url(), &login).await,
        &[&creds_seed],
    );
}
