//! What the destination tests (`postgres`, `nats_sink`) put a fleet
//! through: three hosts sharing the units, a steady load posted to h1
//! (which no fault touches) by three tenants over 64 tables, and h2 and h3
//! SIGKILLed, SIGTERMed and frozen past their member TTL in turn, each
//! followed by a few seconds of load.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::support::{ACME_KEY, Host, PRODUCERS, TABLES, backlog, balanced_among, fleet_config};

/// The hosts' member TTL: a freeze of three times it is a takeover.
pub const TTL_SECS: u64 = 3;
/// Load between two faults.
const PAUSE: Duration = Duration::from_secs(5);

/// The tenants posting the load, each with its key (`acme` is the base
/// config's; the others are added by `sink_fleet_config`).
pub const TENANTS: [(&str, &str); 3] = [
    ("acme", ACME_KEY),
    ("globex", "globex-key-456"),
    ("initech", "initech-key-789"),
];

/// The CHECK the postgres fault test's table puts on `amount`: a row's
/// `amount` is `id % 1000`, so one row in a thousand breaks it.
pub const AMOUNT_LIMIT: u64 = 999;

/// Whether row `id` of the load breaks `amount < AMOUNT_LIMIT`.
pub fn violates(id: u64) -> bool {
    id % 1000 >= AMOUNT_LIMIT
}

/// A fleet host's config whose pipeline ends in the sink plugin `sink`
/// (`plugin`: its `[plugins.NAME]` table), the tenants of `TENANTS`, rows
/// keyed by their id at the front door: a publish it retries (its answer
/// lost in a fault) stores nothing twice.
pub fn sink_fleet_config(nats_url: &str, id: &str, sink: &str, plugin: &str) -> String {
    let mut config = fleet_config(nats_url, id, 0, TTL_SECS)
        .replace("sink = \"files\"", &format!("sink = \"{sink}\""))
        .replace(
            "max_body_bytes = 1048576",
            "max_body_bytes = 1048576\nidempotency_field = \"id\"",
        );
    for (name, key) in &TENANTS[1..] {
        config.push_str(&format!(
            "\n[[tenants]]\nname = \"{name}\"\napi_keys = [\"{key}\"]\n"
        ));
    }
    config.push_str(plugin);
    config
}

/// Every id the front door accepted, by tenant.
pub type Accepted = BTreeMap<&'static str, BTreeSet<u64>>;

/// Posts rows to `url` round-robin over its share of the tables, each
/// request as the next tenant of `TENANTS`, until `stop`; returns every
/// (tenant, id) the front door accepted. Ids are unique across producers
/// and tenants; a row's `seq` numbers its tenant's table's rows in the
/// order they were stored, its `amount` is `id % 1000`.
async fn produce(url: String, producer: u64, stop: Arc<AtomicBool>) -> Vec<(&'static str, u64)> {
    let http = reqwest::Client::new();
    let (mut accepted, mut request) = (Vec::new(), 0u64);
    let mut next_seq: BTreeMap<(usize, u64), u64> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        let table = (request * PRODUCERS + producer) % TABLES as u64;
        // A producer's tables are 16 apart: every tenant posts to each.
        let tenant = (request % TENANTS.len() as u64) as usize;
        let (name, key) = TENANTS[tenant];
        let first = (request * PRODUCERS + producer) * 20;
        request += 1;
        let ids: Vec<u64> = (first..first + 20).collect();
        let seq = next_seq.entry((tenant, table)).or_default();
        let body: String = ids
            .iter()
            .map(|id| {
                *seq += 1;
                format!(
                    "{{\"id\":{id},\"seq\":{seq},\"amount\":{},\"email\":\"u{id}@example.com\"}}\n",
                    id % 1000
                )
            })
            .collect();
        let response = http
            .post(format!("{url}/v1/ingest/t{table}"))
            .bearer_auth(key)
            .body(body)
            .send()
            .await;
        if response.is_ok_and(|r| r.status() == 202) {
            accepted.extend(ids.into_iter().map(|id| (name, id)));
        }
        // Pacing, not synchronisation: steady load that leaves the hosts CPU.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    accepted
}

/// SIGTERM, wait for the host to finish, start it again (same directory).
pub fn stop_and_restart(host: &mut Host) {
    host.terminate();
    let _ = host.child.wait();
    host.start_again();
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
    producers: Vec<tokio::task::JoinHandle<Vec<(&'static str, u64)>>>,
}

impl LoadedFleet {
    /// h1, h2 and h3 (`config` of each id), balanced, then the load.
    pub async fn start(config: impl Fn(&str) -> String) -> LoadedFleet {
        let ids = ["h1", "h2", "h3"];
        let hosts: Vec<Host> = ids
            .iter()
            .map(|id| Host::spawn_with(id, config(id)))
            .collect();
        let everyone: Vec<&Host> = hosts.iter().collect();
        balanced_among(&hosts[0], &ids, &everyone).await;
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

    /// Stops the load: every id the front door accepted (every tenant
    /// present, if it accepted none), and for how long the load ran.
    pub async fn stop_load(&mut self) -> (Accepted, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        let mut accepted: Accepted = TENANTS
            .iter()
            .map(|(name, _)| (*name, BTreeSet::new()))
            .collect();
        for producer in std::mem::take(&mut self.producers) {
            for (tenant, id) in producer.await.expect("producer") {
                accepted.entry(tenant).or_default().insert(id);
            }
        }
        (accepted, self.started.elapsed())
    }

    /// Waits until every row is settled (nothing pending, unacked or
    /// stored); past two minutes, prints what the hosts last warned of and
    /// fails.
    pub async fn settled(&self, client: &async_nats::Client) {
        let waiting = Instant::now();
        while backlog(client).await != (0, 0, 0) {
            if waiting.elapsed() > Duration::from_secs(120) {
                for host in &self.hosts {
                    let log = host.log();
                    let lines: Vec<&str> = log
                        .lines()
                        .filter(|line| line.contains("WARN") || line.contains("ERROR"))
                        .collect();
                    println!(
                        "{}:\n{}",
                        host.id,
                        lines[lines.len().saturating_sub(15)..].join("\n")
                    );
                }
                panic!("rows not settled after 120 s: {:?}", backlog(client).await);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// What both destination fault tests promise: at least 100k rows went in
/// from every tenant together; for each tenant, what reached the
/// destination (`found`: (tenant, id) → how many times) holds each of its
/// `expected` ids exactly once (`count(*) = count(DISTINCT id) =
/// expected`, a row stored without its answer reaching the producer
/// aside); and no host panicked. `what` is how a row reached it. Prints
/// the figures per tenant and in total.
pub fn assert_exactly_once(
    what: &str,
    accepted: usize,
    expected: &Accepted,
    found: &BTreeMap<(String, u64), usize>,
    hosts: &[Host],
) {
    let mut failures = Vec::new();
    let mut total = (0, 0, 0);
    for (tenant, ids) in expected {
        let mine: BTreeMap<u64, usize> = found
            .iter()
            .filter(|((t, _), _)| t == tenant)
            .map(|((_, id), n)| (*id, *n))
            .collect();
        let rows: usize = mine.values().sum();
        let twice: Vec<u64> = mine
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, _)| *id)
            .collect();
        let lost: Vec<&u64> = ids.iter().filter(|id| !mine.contains_key(id)).collect();
        let extra = mine.keys().filter(|id| !ids.contains(id)).count();
        println!(
            "  {tenant}: {} expected, {rows} {what} ({} distinct), {} twice, {} lost, {extra} not accepted",
            ids.len(),
            mine.len(),
            twice.len(),
            lost.len()
        );
        total = (total.0 + ids.len(), total.1 + rows, total.2 + mine.len());
        if ids.is_empty() {
            failures.push(format!("{tenant}: no row accepted"));
        }
        if !twice.is_empty() {
            failures.push(format!(
                "{tenant}: {} ids {what} twice: {:?}",
                twice.len(),
                &twice[..twice.len().min(10)]
            ));
        }
        if !lost.is_empty() {
            failures.push(format!(
                "{tenant}: {} expected ids not {what}: {:?}",
                lost.len(),
                &lost[..lost.len().min(10)]
            ));
        }
    }
    println!(
        "  all tenants: {} accepted, {} expected, {} {what} ({} distinct)",
        accepted, total.0, total.1, total.2
    );
    let stray: Vec<&(String, u64)> = found
        .keys()
        .filter(|(tenant, _)| !expected.contains_key(tenant.as_str()))
        .collect();
    if !stray.is_empty() {
        failures.push(format!(
            "rows of no tenant of the load: {:?}",
            &stray[..stray.len().min(10)]
        ));
    }
    assert!(accepted >= 100_000, "only {accepted} rows accepted");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let logs: String = hosts.iter().map(Host::log).collect();
    assert!(!logs.contains("panicked"), "a host panicked");
}
