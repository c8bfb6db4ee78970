//! A memory soak: two `weir run` processes take rows at a steady rate for
//! `WEIR_SOAK_SECS` (135 s in CI, under 3 minutes with start-up and drain; `examples/soak/run.sh` runs the hour),
//! while each host's resident memory, open file descriptors and threads are
//! read from `/proc` every `SAMPLE_EVERY`. What is checked is a shape, not a
//! time: none of the three grows by more than a generous bound from the
//! second third of the run to the last (start-up and warm-up are the first
//! third), and every row posted reaches a sink (0 lost). The samples are
//! printed, and written as CSV to `WEIR_SOAK_CSV` when set.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::{ACME_KEY, Host, Nats, base_config, eventually, orders, output};

/// Seconds of load (start-up and the drain come on top).
const DEFAULT_SECS: u64 = 135;
/// Rows a second offered to the pair: well under what one host takes on a
/// shared CI machine (the front door bench's ~100k rows/s), so the hosts
/// idle between requests as a half-loaded fleet does. `WEIR_SOAK_RATE`.
const DEFAULT_RATE: usize = 2_000;
/// Requests a second at most: larger rates send larger requests.
const REQUESTS_PER_SEC: usize = 100;
const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// Growth allowed from the second third's largest sample to the last
/// third's: memory by a quarter plus 32 MiB (allocator slack, a compiled
/// cache page), descriptors and threads by a fixed few (a reconnect, a
/// blocking-pool thread).
const RSS_GROWTH: f64 = 1.25;
const RSS_SLACK_KIB: u64 = 32 * 1024;
const FD_SLACK: u64 = 16;
const THREAD_SLACK: u64 = 8;

#[derive(Debug, Clone, Copy)]
struct Sample {
    seconds: f64,
    rss_kib: u64,
    fds: u64,
    threads: u64,
}

/// One process's figures from `/proc`, or `None` once it is gone.
fn sample(pid: u32, seconds: f64) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(Sample {
        seconds,
        rss_kib: field("VmRSS:")?,
        fds,
        threads: field("Threads:")?,
    })
}

/// The ids the sink wrote under `dir`.
fn sunk(dir: &Path) -> Vec<u64> {
    std::fs::read_to_string(output(dir, "orders"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|row| row["id"].as_u64())
        .collect()
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hosts_at_a_steady_load_keep_memory_descriptors_and_threads_flat_and_lose_no_row() {
    let seconds = env_number("WEIR_SOAK_SECS", DEFAULT_SECS);
    let rate = env_number("WEIR_SOAK_RATE", DEFAULT_RATE as u64) as usize;
    let nats = Nats::start();
    let hosts = [
        Host::spawn_with("soak-a", base_config(nats.url(), "")),
        Host::spawn_with("soak-b", base_config(nats.url(), "")),
    ];
    let http = reqwest::Client::new();
    for host in &hosts {
        eventually(Duration::from_secs(60), "the host is ready", || async {
            let ready = http.get(format!("{}/readyz", host.url)).send().await.ok()?;
            ready.status().is_success().then_some(())
        })
        .await;
    }

    // Requests of 100 rows or more, sent in turn to each host at `rate`
    // rows/s.
    let rows_per_request = (rate / REQUESTS_PER_SEC).max(100);
    let requests_per_sec = (rate / rows_per_request).max(1);
    let period = Duration::from_secs(1) / requests_per_sec as u32;
    let started = Instant::now();
    let end = started + Duration::from_secs(seconds);
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(), Vec::new()];
    let mut next_sample = started;
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent = 0usize;
    let mut request = 0usize;
    while Instant::now() < end {
        ticker.tick().await;
        let host = &hosts[request % hosts.len()];
        request += 1;
        let body = orders(sent, rows_per_request);
        let response = http
            .post(format!("{}/v1/ingest/orders", host.url))
            .bearer_auth(ACME_KEY)
            .body(body)
            .send()
            .await
            .expect("the front door answers");
        assert_eq!(
            response.status(),
            202,
            "{}",
            response.text().await.unwrap_or_default()
        );
        sent += rows_per_request;
        if Instant::now() >= next_sample {
            let at = started.elapsed().as_secs_f64();
            for (host, samples) in hosts.iter().zip(&mut samples) {
                samples.push(sample(host.child.id(), at).expect("the host is running"));
            }
            next_sample += SAMPLE_EVERY;
        }
    }

    // Every row reaches a sink, once or (after a redelivery) more: none lost.
    let lost = eventually(Duration::from_secs(120), "every row sunk", || async {
        let seen: HashSet<u64> = hosts.iter().flat_map(|h| sunk(h.dir.path())).collect();
        let missing = (0..sent as u64).filter(|id| !seen.contains(id)).count();
        (missing == 0).then_some(missing)
    })
    .await;
    assert_eq!(lost, 0);

    let csv = std::env::var_os("WEIR_SOAK_CSV");
    let mut lines = vec!["host,seconds,rss_kib,fds,threads".to_string()];
    for (host, samples) in hosts.iter().zip(&samples) {
        for s in samples {
            lines.push(format!(
                "{},{:.0},{},{},{}",
                host.id, s.seconds, s.rss_kib, s.fds, s.threads
            ));
        }
    }
    if let Some(path) = csv {
        std::fs::write(path, lines.join("\n") + "\n").expect("write the soak's CSV");
    }
    println!(
        "soak: {sent} rows ({:.0} rows/s sent of {rate} offered) for {seconds} s over 2 hosts, 0 lost",
        sent as f64 / seconds as f64
    );
    for (host, samples) in hosts.iter().zip(&samples) {
        let third = samples.len() / 3;
        assert!(
            third >= 2,
            "too few samples ({}) to see a shape",
            samples.len()
        );
        let (second, last) = (&samples[third..2 * third], &samples[2 * third..]);
        let most = |part: &[Sample], f: fn(&Sample) -> u64| part.iter().map(f).max().unwrap_or(0);
        let (rss2, rss3) = (most(second, |s| s.rss_kib), most(last, |s| s.rss_kib));
        let (fd2, fd3) = (most(second, |s| s.fds), most(last, |s| s.fds));
        let (th2, th3) = (most(second, |s| s.threads), most(last, |s| s.threads));
        println!(
            "soak: {}: RSS {:.1} → {:.1} MiB, fds {fd2} → {fd3}, threads {th2} → {th3} (largest of the second third → of the last)",
            host.id,
            rss2 as f64 / 1024.0,
            rss3 as f64 / 1024.0
        );
        assert!(
            rss3 as f64 <= rss2 as f64 * RSS_GROWTH + RSS_SLACK_KIB as f64,
            "{}: resident memory grew from {rss2} KiB to {rss3} KiB: {samples:?}",
            host.id
        );
        assert!(
            fd3 <= fd2 + FD_SLACK,
            "{}: descriptors grew from {fd2} to {fd3}: {samples:?}",
            host.id
        );
        assert!(
            th3 <= th2 + THREAD_SLACK,
            "{}: threads grew from {th2} to {th3}: {samples:?}",
            host.id
        );
    }
}
