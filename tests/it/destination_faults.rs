//! What the destination tests (`postgres`, `nats_sink`) put a fleet
//! through: three hosts sharing the units, a steady load posted to h1
//! (which no fault touches), and h2 and h3 SIGKILLed, SIGTERMed and frozen
//! past their member TTL in turn, each followed by a few seconds of load.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::support::{Host, PRODUCERS, balanced, fleet_config, produce};

/// The hosts' member TTL: a freeze of three times it is a takeover.
pub const TTL_SECS: u64 = 3;
/// Load between two faults.
const PAUSE: Duration = Duration::from_secs(5);

/// A fleet host's config whose pipeline ends in the sink plugin `sink`
/// (`plugin`: its `[plugins.NAME]` table), rows keyed by their id at the
/// front door: a publish it retries (its answer lost in a fault) stores
/// nothing twice.
pub fn sink_fleet_config(nats_url: &str, id: &str, sink: &str, plugin: &str) -> String {
    let mut config = fleet_config(nats_url, id, 0, TTL_SECS)
        .replace("sink = \"files\"", &format!("sink = \"{sink}\""))
        .replace(
            "max_body_bytes = 1048576",
            "max_body_bytes = 1048576\nidempotency_field = \"id\"",
        );
    config.push_str(plugin);
    config
}

/// SIGTERM, wait for the host to finish, start it again (same directory).
pub fn stop_and_restart(host: &mut Host) {
    host.terminate();
    let _ = host.child.wait();
    let (child, url) = Host::run(host.dir.path());
    host.child = child;
    host.url = url;
}

pub fn signal(host: &Host, signal: libc::c_int) {
    unsafe { libc::kill(host.child.id() as libc::pid_t, signal) };
}

/// Three hosts under load, and the faults they went through so far.
pub struct LoadedFleet {
    pub hosts: Vec<Host>,
    pub faults: Vec<&'static str>,
    started: Instant,
    stop: Arc<AtomicBool>,
    producers: Vec<tokio::task::JoinHandle<Vec<u64>>>,
}

impl LoadedFleet {
    /// h1, h2 and h3 (`config` of each id), balanced, then the load.
    pub async fn start(config: impl Fn(&str) -> String) -> LoadedFleet {
        let ids = ["h1", "h2", "h3"];
        let hosts: Vec<Host> = ids
            .iter()
            .map(|id| Host::spawn_with(id, config(id)))
            .collect();
        balanced(&hosts[0], &ids).await;
        let stop = Arc::new(AtomicBool::new(false));
        let producers = (0..PRODUCERS)
            .map(|producer| tokio::spawn(produce(hosts[0].url.clone(), producer, stop.clone())))
            .collect();
        let fleet = LoadedFleet {
            hosts,
            faults: Vec::new(),
            started: Instant::now(),
            stop,
            producers,
        };
        fleet.pause().await;
        fleet
    }

    /// The load goes on a while.
    pub async fn pause(&self) {
        tokio::time::sleep(PAUSE).await;
    }

    /// `what` happened (the caller did it); then the load goes on a while.
    pub async fn after(&mut self, what: &'static str) {
        self.faults.push(what);
        self.pause().await;
    }

    /// h2 SIGKILLed and restarted, h3 SIGTERMed and restarted, h2 frozen
    /// past its TTL and thawed.
    pub async fn host_faults(&mut self) {
        self.hosts[1].crash_and_restart();
        self.after("SIGKILL h2, restarted").await;
        tokio::task::block_in_place(|| stop_and_restart(&mut self.hosts[2]));
        self.after("SIGTERM h3, restarted").await;
        signal(&self.hosts[1], libc::SIGSTOP);
        tokio::time::sleep(Duration::from_secs(TTL_SECS * 3)).await;
        signal(&self.hosts[1], libc::SIGCONT);
        self.after("SIGSTOP h2 past its member TTL, SIGCONT").await;
    }

    /// Stops the load: every id the front door accepted, and for how long
    /// the load ran.
    pub async fn stop_load(&mut self) -> (BTreeSet<u64>, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        let mut accepted = BTreeSet::new();
        for producer in std::mem::take(&mut self.producers) {
            accepted.extend(producer.await.expect("producer"));
        }
        (accepted, self.started.elapsed())
    }
}

/// What both destination fault tests promise: at least 100k rows went in,
/// none reached the destination twice (`twice`), none accepted is missing
/// (`lost`), and no host panicked. `what` is how a row reached it.
pub fn assert_exactly_once<T: std::fmt::Debug>(
    what: &str,
    accepted: usize,
    twice: &[T],
    lost: &[&u64],
    hosts: &[Host],
) {
    assert!(accepted >= 100_000, "only {accepted} rows accepted");
    assert!(
        twice.is_empty(),
        "{} ids {what} twice: {:?}",
        twice.len(),
        &twice[..twice.len().min(10)]
    );
    assert!(
        lost.is_empty(),
        "{} accepted ids not {what}: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    let logs: String = hosts.iter().map(Host::log).collect();
    assert!(!logs.contains("panicked"), "a host panicked");
}
