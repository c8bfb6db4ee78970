//! What an idle fleet asks of NATS: three `weir` processes over 64
//! partitions, settled, with nothing to do. A spy on the server counts every
//! JetStream API request and every write to the coordination bucket over a
//! window, by the connection (inbox) that sent it, so the cost per host is
//! a count, not a timing. Idle cost must not grow with the partitions.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::support::{Host, Nats, balanced, base_config};

const PARTITIONS: u32 = 64;
const HOSTS: [&str; 3] = ["idle-a", "idle-b", "idle-c"];
/// After the fleet is balanced: first pulls, the usage leader's first
/// reading of the streams, claims written.
const SETTLE: Duration = Duration::from_secs(8);
/// One idle pull period (`IDLE_PULL_EXPIRES`): the units of a fleet that
/// started at once renew their requests together, so a shorter window
/// counts each of them once all the same.
const WINDOW: Duration = Duration::from_secs(12);
/// Per host and second, over the window (issue #35's targets).
const MAX_API_PER_HOST: f64 = 3.0;
const MAX_KV_WRITES_PER_HOST: f64 = 1.0;

fn idle_config(nats_url: &str, id: &str) -> String {
    base_config(nats_url, &format!("\n[coordination]\nhost_id = \"{id}\"\n")).replace(
        "[stream]\ncreate = true\n",
        &format!("[stream]\ncreate = true\npartitions = {PARTITIONS}\nmax_bytes = \"8MiB\"\n"),
    )
}

/// The process a request came from: a reply inbox is `_INBOX.<nuid>`, and
/// a process's nuids share their first 12 characters.
fn sender(message: &async_nats::Message) -> String {
    let reply = message.reply.as_deref().unwrap_or("(no reply)");
    let nuid = reply.split('.').nth(1).unwrap_or(reply);
    nuid.chars().take(12).collect()
}

/// What a JetStream API subject asks: `STREAM.INFO`, `CONSUMER.MSG.NEXT`, …
fn api_kind(subject: &str) -> String {
    let tokens: Vec<&str> = subject.split('.').skip(2).collect();
    let take = if tokens.first() == Some(&"CONSUMER") && tokens.get(1) == Some(&"MSG") {
        3
    } else {
        2
    };
    tokens.into_iter().take(take).collect::<Vec<_>>().join(".")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_fleet_at_64_partitions_makes_few_jetstream_requests_per_host() {
    let nats = Nats::start();
    let hosts: Vec<Host> = HOSTS
        .iter()
        .map(|id| Host::spawn_with(id, idle_config(nats.url(), id)))
        .collect();
    let Ok(owned) =
        tokio::time::timeout(Duration::from_secs(35), balanced(&hosts[0], &HOSTS)).await
    else {
        let tail: Vec<String> = hosts
            .iter()
            .map(|host| {
                host.log()
                    .lines()
                    .rev()
                    .take(15)
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .collect();
        panic!("the fleet did not settle: {tail:#?}");
    };
    assert_eq!(
        owned.values().map(Vec::len).sum::<usize>(),
        PARTITIONS as usize
    );
    tokio::time::sleep(SETTLE).await;

    let spy = nats.client().await;
    let mut api = spy.subscribe("$JS.API.>").await.expect("spy on the API");
    let mut kv = spy
        .subscribe("$KV.weir_coord.>")
        .await
        .expect("spy on the bucket");
    spy.flush().await.expect("spy subscribed");
    let mut api_by_sender: BTreeMap<String, u64> = BTreeMap::new();
    let mut api_by_kind: BTreeMap<String, u64> = BTreeMap::new();
    let mut kv_by_sender: BTreeMap<String, u64> = BTreeMap::new();
    let mut kv_by_key: BTreeMap<String, u64> = BTreeMap::new();
    let mut pulls_by_unit: BTreeMap<String, u64> = BTreeMap::new();
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + WINDOW;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => break,
            Some(message) = api.next() => {
                *api_by_sender.entry(sender(&message)).or_default() += 1;
                *api_by_kind.entry(api_kind(&message.subject)).or_default() += 1;
                if let Some(unit) = message.subject.strip_prefix("$JS.API.CONSUMER.MSG.NEXT.") {
                    *pulls_by_unit.entry(unit.to_string()).or_default() += 1;
                }
            }
            Some(message) = kv.next() => {
                *kv_by_sender.entry(sender(&message)).or_default() += 1;
                let key = message.subject.split('.').skip(2).take(1).collect::<String>();
                *kv_by_key.entry(key).or_default() += 1;
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let per_second = |count: u64| count as f64 / seconds;
    let api_total: u64 = api_by_sender.values().sum();
    let kv_total: u64 = kv_by_sender.values().sum();
    let api_per_host = per_second(api_total) / HOSTS.len() as f64;
    let kv_per_host = per_second(kv_total) / HOSTS.len() as f64;
    println!(
        "idle fleet, {} hosts × {PARTITIONS} partitions, {seconds:.1} s: \
         {api_per_host:.2} JetStream API requests/s per host, {kv_per_host:.2} KV writes/s per host",
        HOSTS.len()
    );
    for (kind, count) in &api_by_kind {
        println!("  {kind}: {:.2}/s (fleet)", per_second(*count));
    }
    let mut units_by_pulls: BTreeMap<u64, usize> = BTreeMap::new();
    for count in pulls_by_unit.values() {
        *units_by_pulls.entry(*count).or_default() += 1;
    }
    println!("  units by pull requests in the window: {units_by_pulls:?}");
    for (sender, count) in &api_by_sender {
        println!("  API from {sender}: {:.2}/s", per_second(*count));
    }
    for (key, count) in &kv_by_key {
        println!("  KV writes to {key}.: {:.2}/s (fleet)", per_second(*count));
    }
    assert!(
        api_per_host <= MAX_API_PER_HOST,
        "{api_per_host:.2} JetStream API requests/s per host (bound {MAX_API_PER_HOST}): {api_by_kind:?}"
    );
    let busiest = api_by_sender.values().copied().max().unwrap_or(0);
    assert!(
        per_second(busiest) <= MAX_API_PER_HOST,
        "one host made {:.2} JetStream API requests/s (bound {MAX_API_PER_HOST}): {api_by_sender:?}",
        per_second(busiest)
    );
    let busiest_writer = kv_by_sender.values().copied().max().unwrap_or(0);
    assert!(
        per_second(busiest_writer) <= MAX_KV_WRITES_PER_HOST,
        "one host wrote the coordination bucket {:.2} times/s (bound {MAX_KV_WRITES_PER_HOST}): {kv_by_key:?}",
        per_second(busiest_writer)
    );
    drop(hosts);
}
