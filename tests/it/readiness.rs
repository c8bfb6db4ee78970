//! `/readyz` says whether this host can store a row: 503 with the reason
//! within 2 s of its nats-server freezing (SIGSTOP) or dying (SIGKILL), 200
//! again within 2 s of it coming back.

use std::time::{Duration, Instant};

use crate::support::{Nats, TestHost, base_config};

/// How soon after a change `/readyz` must say so.
const WITHIN: Duration = Duration::from_secs(2);

/// Polls `/readyz` until it answers `status`; the time it took and the body.
async fn readyz_becomes(host: &TestHost, status: u16, what: &str) -> (Duration, String) {
    let started = Instant::now();
    loop {
        let answer = host
            .http
            .get(host.url("/readyz"))
            .timeout(Duration::from_secs(1))
            .send()
            .await;
        let mut last = String::new();
        if let Ok(answer) = answer {
            let now = answer.status();
            let body = answer.text().await.unwrap_or_default();
            if now != status {
                last = format!("{now}: {body}");
            } else {
                println!(
                    "{what}: /readyz {status} after {:?}: {body}",
                    started.elapsed()
                );
                return (started.elapsed(), body);
            }
        }
        assert!(
            started.elapsed() < WITHIN,
            "{what}: /readyz did not answer {status} within {WITHIN:?} (last: {last})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `signal` to the server and waits until the kernel has acted on it
/// (`kill` only queues it).
async fn signal_and_wait(pid: u32, signal: libc::c_int, state: impl Fn(Option<char>) -> bool) {
    let pid = pid as libc::pid_t;
    // SAFETY: kill(2) on the test's own nats-server child.
    unsafe { libc::kill(pid, signal) };
    let started = Instant::now();
    loop {
        let now = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let after = stat.rsplit_once(')')?.1.to_string();
                after.split_whitespace().next()?.chars().next()
            });
        if state(now) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "signal {signal} not taken"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn readyz_is_503_with_the_reason_while_nats_is_frozen_or_dead_and_200_once_back() {
    let mut nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    readyz_becomes(&host, 200, "running").await;

    // Frozen: the client still counts itself connected; JetStream does
    // not answer.
    let pid = nats.server.pid();
    signal_and_wait(pid, libc::SIGSTOP, |state| state == Some('T')).await;
    let (_, body) = readyz_becomes(&host, 503, "frozen").await;
    assert!(
        body.contains("has not answered a JetStream request"),
        "{body}"
    );
    signal_and_wait(pid, libc::SIGCONT, |state| state != Some('T')).await;
    readyz_becomes(&host, 200, "thawed").await;

    // Dead: the connection closes.
    signal_and_wait(pid, libc::SIGKILL, |state| {
        matches!(state, None | Some('Z'))
    })
    .await;
    let (_, body) = readyz_becomes(&host, 503, "killed").await;
    assert!(body.contains("NATS is not connected"), "{body}");
    // The next server on the same port and storage; `restart` returns
    // once it accepts connections.
    tokio::task::block_in_place(|| nats.restart(Duration::ZERO));
    readyz_becomes(&host, 200, "restarted").await;

    // Rows are stored again.
    assert_eq!(
        host.ingest("orders", crate::support::orders(0, 1))
            .await
            .status(),
        202
    );
    host.shutdown().await;
}

/// A host that cannot run the fleet's release of a plugin (here: a release
/// naming a component no host has) is not ready once that has lasted past
/// the grace a switch takes, saying why; ready again once the release is
/// gone. Its budget and router policies answer the front door.
#[tokio::test(flavor = "multi_thread")]
async fn readyz_is_503_while_the_host_is_behind_the_fleets_plugin_versions() {
    let nats = Nats::start();
    let host = TestHost::start(&base_config(nats.url(), "")).await;
    readyz_becomes(&host, 200, "started").await;

    let js = async_nats::jetstream::new(nats.client().await);
    let kv = js.get_key_value("weir_coord").await.unwrap();
    let missing = "ab".repeat(32);
    let release = serde_json::json!({ "digest": missing, "previous": null, "pushed_ms": 0 });
    kv.put("plugins.validate", release.to_string().into())
        .await
        .unwrap();
    let started = Instant::now();
    let body = loop {
        let answer = host.http.get(host.url("/readyz")).send().await.unwrap();
        let (status, body) = (answer.status().as_u16(), answer.text().await.unwrap());
        if status == 503 {
            break body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "/readyz still {status} ({body}) with a release no host can load"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let after = started.elapsed();
    println!("behind the fleet: /readyz 503 after {after:?}: {body}");
    assert!(
        body.contains("behind the fleet's plugin versions") && body.contains("validate"),
        "{body}"
    );
    assert!(
        after >= weir::ops::BEHIND_GRACE,
        "a switch's moments do not count"
    );

    kv.delete("plugins.validate").await.unwrap();
    let started = Instant::now();
    loop {
        let answer = host.http.get(host.url("/readyz")).send().await.unwrap();
        if answer.status() == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "/readyz not 200 again once the release is gone"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    host.shutdown().await;
}
