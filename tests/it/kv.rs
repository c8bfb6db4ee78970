//! KV watches on a real nats-server: one consumer per watch whatever the
//! number of prefixes, none for an empty list, every revision exactly once
//! across a server restart and a lost consumer, consumers deleted on drop,
//! TTL expiries, compare-and-set — and the in-process `MemoryKv` behaving
//! like the real thing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use weir::nats::kv::{
    BucketOptions, Entry, KvError, KvWatch, KvWrite, MemoryKv, NatsKv, Operation, Watch,
    WatchEvent, WatchStart,
};

use crate::support::{Nats, eventually, read_stream};

/// How long a test waits for an event that must come.
const DUE: Duration = Duration::from_secs(20);

async fn bucket(nats: &Nats, options: BucketOptions) -> (async_nats::Client, NatsKv) {
    let client = nats.client().await;
    let kv = NatsKv::open_or_create(&client, &options)
        .await
        .expect("bucket opens");
    (client, kv)
}

async fn consumer_count(client: &async_nats::Client, kv: &NatsKv) -> usize {
    let js = jetstream::new(client.clone());
    let stream = js
        .get_stream(kv.stream_name())
        .await
        .expect("bucket stream");
    stream
        .get_info()
        .await
        .expect("stream info")
        .state
        .consumer_count
}

/// The filter subjects of the stream's only consumer.
async fn only_consumer_filters(client: &async_nats::Client, kv: &NatsKv) -> Vec<String> {
    let js = jetstream::new(client.clone());
    let stream = js
        .get_stream(kv.stream_name())
        .await
        .expect("bucket stream");
    let names: Vec<String> = stream
        .consumer_names()
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(|name| name.expect("consumer name"))
        .collect();
    assert_eq!(names.len(), 1, "exactly one consumer: {names:?}");
    let info = stream
        .consumer_info(&names[0])
        .await
        .expect("consumer info");
    let mut filters = info.config.filter_subjects.clone();
    if !info.config.filter_subject.is_empty() {
        filters.push(info.config.filter_subject.clone());
    }
    filters
}

/// The next event, or a panic naming what was awaited.
async fn next_event(watch: &mut Watch, what: &str) -> WatchEvent {
    match tokio::time::timeout(DUE, watch.next()).await {
        Ok(Some(Ok(event))) => event,
        Ok(Some(Err(err))) => panic!("watch failed while waiting for {what}: {err}"),
        Ok(None) => panic!("watch ended while waiting for {what}"),
        Err(_) => panic!("no event within {DUE:?} while waiting for {what}"),
    }
}

async fn next_update(watch: &mut Watch, what: &str) -> Entry {
    match next_event(watch, what).await {
        WatchEvent::Update(entry) => entry,
        WatchEvent::CaughtUp => panic!("CaughtUp where {what} was due"),
    }
}

async fn caught_up(watch: &mut Watch) {
    let event = next_event(watch, "CaughtUp").await;
    assert_eq!(event, WatchEvent::CaughtUp, "CaughtUp was due");
}

/// Every event that arrives within `window` (expected: none).
async fn quiet(watch: &mut Watch, window: Duration) -> Vec<WatchEvent> {
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + window;
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline, watch.next()).await {
        events.push(event.expect("watch keeps working"));
    }
    events
}

/// Updates until (and including) `last_key`.
async fn updates_until(watch: &mut Watch, last_key: &str) -> Vec<Entry> {
    let mut updates = Vec::new();
    loop {
        let entry = next_update(watch, last_key).await;
        let done = entry.key == last_key;
        updates.push(entry);
        if done {
            return updates;
        }
    }
}

fn keys(updates: &[Entry]) -> Vec<&str> {
    updates.iter().map(|entry| entry.key.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_prefixes_share_one_consumer_and_other_keys_never_arrive() {
    let nats = Nats::start();
    let (client, kv) = bucket(&nats, BucketOptions::new("cfg")).await;
    kv.put("c.before", "no".into()).await.expect("put");

    let mut watch = kv
        .watch_prefixes(&["a.", "b."], WatchStart::CurrentValues)
        .await
        .expect("watch");
    assert_eq!(consumer_count(&client, &kv).await, 1);
    let mut filters = only_consumer_filters(&client, &kv).await;
    filters.sort();
    assert_eq!(filters, ["$KV.cfg.a.>", "$KV.cfg.b.>"]);
    caught_up(&mut watch).await;

    for key in ["a.1", "c.1", "b.1", "c.2", "b.x.y", "a.2"] {
        kv.put(key, key.as_bytes().to_vec().into())
            .await
            .expect("put");
    }
    let updates = updates_until(&mut watch, "a.2").await;
    // `c.*` comes before `a.2` in the stream: had the server sent it, it
    // would be in this list.
    assert_eq!(keys(&updates), ["a.1", "b.1", "b.x.y", "a.2"]);
    assert!(
        updates
            .iter()
            .all(|entry| entry.operation == Operation::Put)
    );
    assert!(
        updates
            .windows(2)
            .all(|pair| pair[0].revision < pair[1].revision)
    );
    assert_eq!(quiet(&mut watch, Duration::from_millis(300)).await, []);
    assert_eq!(consumer_count(&client, &kv).await, 1, "still one consumer");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_prefix_list_delivers_nothing_and_creates_no_consumer() {
    let nats = Nats::start();
    let (client, kv) = bucket(&nats, BucketOptions::new("cfg")).await;
    kv.put("a.1", "1".into()).await.expect("put");
    let no_prefixes: [&str; 0] = [];

    let mut watch = kv
        .watch_prefixes(&no_prefixes, WatchStart::CurrentValues)
        .await
        .expect("watch");
    caught_up(&mut watch).await;
    assert_eq!(consumer_count(&client, &kv).await, 0);
    kv.put("a.2", "2".into()).await.expect("put");
    kv.delete("a.1").await.expect("delete");
    assert_eq!(quiet(&mut watch, Duration::from_millis(500)).await, []);
    assert_eq!(consumer_count(&client, &kv).await, 0);

    // The empty prefix itself is refused rather than read as "everything".
    assert!(matches!(
        kv.watch_prefixes(&[""], WatchStart::NewChanges).await,
        Err(KvError::InvalidPrefix { .. })
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn overlapping_prefixes_fold_into_one_filter_on_one_consumer() {
    let nats = Nats::start();
    let (client, kv) = bucket(&nats, BucketOptions::new("cfg")).await;

    // Unfolded, the server would refuse these filters (error 10138).
    let prefixes = [
        "plugins.",
        "plugins.a.",
        "plugins.a.x",
        "tenants.acme",
        "plugins.",
    ];
    let mut watch = kv
        .watch_prefixes(&prefixes, WatchStart::NewChanges)
        .await
        .expect("overlapping prefixes are accepted");
    assert_eq!(consumer_count(&client, &kv).await, 1);
    let mut filters = only_consumer_filters(&client, &kv).await;
    filters.sort();
    assert_eq!(filters, ["$KV.cfg.plugins.>", "$KV.cfg.tenants.acme"]);
    caught_up(&mut watch).await;

    for key in [
        "plugins.a.x",
        "plugins.b",
        "tenants.acme",
        "tenants.acme.sub",
        "tenants.other",
        "plugins.end",
    ] {
        kv.put(key, "v".into()).await.expect("put");
    }
    let updates = updates_until(&mut watch, "plugins.end").await;
    assert_eq!(
        keys(&updates),
        ["plugins.a.x", "plugins.b", "tenants.acme", "plugins.end"],
        "each key once; `tenants.acme` is an exact key"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn puts_deletes_and_purges_arrive_typed_with_revision_and_time() {
    let nats = Nats::start();
    // A watch delivers the revisions still stored when its consumer reaches
    // them. With one revision per key, the delete below replaces the put at
    // once, and a watch that lags (CPU load: seen 3 times in 100 runs) never
    // sees the put; keeping history keeps every revision until the purge.
    let options = BucketOptions {
        history: 8,
        ..BucketOptions::new("ops")
    };
    let (client, kv) = bucket(&nats, options).await;
    let mut watch = kv
        .watch_prefixes(&["t."], WatchStart::NewChanges)
        .await
        .expect("watch");
    caught_up(&mut watch).await;

    let before = std::time::SystemTime::now() - Duration::from_secs(5);
    let put = kv.put("t.a", "1".into()).await.expect("put");
    let deleted = kv.delete("t.a").await.expect("delete");
    // weir has no purge of its own; another client's purge must still read
    // as one.
    let store = jetstream::new(client.clone())
        .get_key_value("ops")
        .await
        .expect("async-nats store");
    store.put("t.b", "2".into()).await.expect("put");
    let mut updates = seen_updates(&mut watch, 3).await;
    // Only once the put was delivered: a purge rolls up (removes) the key's
    // earlier revisions, and a watch still behind would never see them.
    store.purge("t.b").await.expect("purge");
    updates.extend(seen_updates(&mut watch, 1).await);

    let seen: Vec<(String, String, Operation)> = updates
        .into_iter()
        .map(|entry| {
            assert!(entry.created > before, "created {:?}", entry.created);
            let value = String::from_utf8_lossy(&entry.value).into_owned();
            (entry.key, value, entry.operation)
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("t.a".into(), "1".into(), Operation::Put),
            ("t.a".into(), String::new(), Operation::Delete),
            ("t.b".into(), "2".into(), Operation::Put),
            ("t.b".into(), String::new(), Operation::Purge),
        ]
    );
    assert!(put < deleted);
}

async fn seen_updates(watch: &mut Watch, count: usize) -> Vec<Entry> {
    let mut updates = Vec::new();
    for _ in 0..count {
        let what = format!("update {} of {count}, after {updates:?}", updates.len() + 1);
        updates.push(next_update(watch, &what).await);
    }
    updates
}

/// What a watch saw, comparable between stores whose revisions differ.
#[derive(Debug, PartialEq)]
enum Seen {
    Update(String, String, Operation),
    CaughtUp,
}

fn seen(event: WatchEvent) -> Seen {
    match event {
        WatchEvent::Update(entry) => Seen::Update(
            entry.key,
            String::from_utf8_lossy(&entry.value).into_owned(),
            entry.operation,
        ),
        WatchEvent::CaughtUp => Seen::CaughtUp,
    }
}

async fn seen_next(watch: &mut Watch, count: usize) -> Vec<Seen> {
    let mut events = Vec::new();
    for _ in 0..count {
        events.push(seen(next_event(watch, "the scenario's next event").await));
    }
    events
}

fn put(key: &str, value: &str) -> Seen {
    Seen::Update(key.into(), value.into(), Operation::Put)
}

/// One scenario for any store: last values, new changes, resuming after a
/// revision, and the conditional writes.
async fn watch_and_write_scenario<K: KvWatch + KvWrite>(kv: &K) {
    kv.put("a.1", "v1".into()).await.expect("put");
    kv.put("a.1", "v2".into()).await.expect("put");
    kv.put("a.2", "x".into()).await.expect("put");
    kv.delete("a.2").await.expect("delete");
    kv.put("b.1", "other".into()).await.expect("put");

    let mut current = kv
        .watch_prefixes(&["a."], WatchStart::CurrentValues)
        .await
        .expect("watch");
    assert_eq!(
        seen_next(&mut current, 3).await,
        [
            put("a.1", "v2"),
            Seen::Update("a.2".into(), String::new(), Operation::Delete),
            Seen::CaughtUp,
        ]
    );
    let mut new_only = kv
        .watch_prefixes(&["a."], WatchStart::NewChanges)
        .await
        .expect("watch");
    assert_eq!(seen_next(&mut new_only, 1).await, [Seen::CaughtUp]);

    let third = kv.put("a.3", "v3".into()).await.expect("put");
    let fourth = kv.create("a.4", "v4".into()).await.expect("create");
    assert_eq!(
        seen_next(&mut current, 2).await,
        [put("a.3", "v3"), put("a.4", "v4")]
    );
    assert_eq!(
        seen_next(&mut new_only, 2).await,
        [put("a.3", "v3"), put("a.4", "v4")]
    );

    let mut resumed = kv
        .watch_prefixes(&["a."], WatchStart::AfterRevision(third))
        .await
        .expect("watch");
    assert_eq!(
        seen_next(&mut resumed, 2).await,
        [put("a.4", "v4"), Seen::CaughtUp]
    );

    let entry = kv.entry("a.4").await.expect("entry").expect("present");
    assert_eq!((entry.revision, &entry.value[..]), (fourth, &b"v4"[..]));
    assert!(kv.entry("a.none").await.expect("entry").is_none());
    let deleted = kv.entry("a.2").await.expect("entry").expect("marker");
    assert_eq!(deleted.operation, Operation::Delete);
    // A deleted key can be created again; a present one cannot.
    kv.create("a.2", "again".into())
        .await
        .expect("create over a delete");
    assert!(matches!(
        kv.create("a.4", "again".into()).await,
        Err(KvError::AlreadyExists { key, .. }) if key == "a.4"
    ));
    assert!(matches!(
        kv.update("a.4", "stale".into(), third).await,
        Err(KvError::WrongRevision { key, expected, .. }) if key == "a.4" && expected == third
    ));
    assert!(matches!(
        kv.put("a.", "v".into()).await,
        Err(KvError::InvalidKey { .. })
    ));
}

/// A key's kept revisions, oldest first from a given one (what a state
/// scope's chain of changes is read with), alike on both stores; the
/// bucket's history says how many are kept.
async fn revisions_scenario<K: KvWrite>(kv: &K) {
    let first = kv.put("s.k", "v1".into()).await.expect("put");
    kv.put("other", "x".into()).await.expect("put");
    let second = kv.update("s.k", "v2".into(), first).await.expect("update");
    kv.delete("s.k").await.expect("delete");
    let last = kv.create("s.k", "v3".into()).await.expect("create");
    let seen = |entries: Vec<Entry>| -> Vec<(u64, Operation, String)> {
        entries
            .into_iter()
            .map(|e| {
                let value = String::from_utf8_lossy(&e.value).to_string();
                (e.revision, e.operation, value)
            })
            .collect()
    };
    let all = seen(kv.revisions("s.k", 0).await.expect("revisions"));
    assert_eq!(all.len(), 4, "{all:?}");
    assert_eq!(all[0], (first, Operation::Put, "v1".into()));
    assert_eq!(all[1], (second, Operation::Put, "v2".into()));
    assert_eq!(all[2].1, Operation::Delete);
    assert_eq!(all[3], (last, Operation::Put, "v3".into()));
    let from = seen(kv.revisions("s.k", second).await.expect("revisions"));
    assert_eq!(from, all[1..]);
    assert!(
        kv.revisions("s.none", 0)
            .await
            .expect("revisions")
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_kv_and_nats_kv_keep_a_keys_revisions_alike() {
    let nats = Nats::start();
    let (_client, kv) = bucket(
        &nats,
        BucketOptions {
            history: 8,
            ..BucketOptions::new("kept")
        },
    )
    .await;
    assert_eq!(kv.history(), Some(8));
    revisions_scenario(&kv).await;
    let memory = MemoryKv::new();
    assert_eq!(memory.history(), None);
    revisions_scenario(&memory).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_kv_and_nats_kv_agree_on_one_scenario() {
    let nats = Nats::start();
    let (_client, kv) = bucket(&nats, BucketOptions::new("same")).await;
    watch_and_write_scenario(&kv).await;
    watch_and_write_scenario(&MemoryKv::new()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn compare_and_set_with_a_stale_revision_fails_with_wrong_revision() {
    let nats = Nats::start();
    let (_client, kv) = bucket(&nats, BucketOptions::new("cas")).await;

    let first = kv.create("leader", "host-a".into()).await.expect("create");
    let second = kv
        .update("leader", "host-b".into(), first)
        .await
        .expect("update at the current revision");
    let lost = kv.update("leader", "host-c".into(), first).await;
    match lost {
        Err(KvError::WrongRevision {
            bucket,
            key,
            expected,
        }) => {
            assert_eq!(
                (bucket.as_str(), key.as_str(), expected),
                ("cas", "leader", first)
            );
        }
        other => panic!("a stale update must fail with WrongRevision, got {other:?}"),
    }
    assert!(matches!(
        kv.delete_at("leader", first).await,
        Err(KvError::WrongRevision { expected, .. }) if expected == first
    ));
    assert!(matches!(
        kv.create("leader", "host-c".into()).await,
        Err(KvError::AlreadyExists { .. })
    ));
    kv.delete_at("leader", second)
        .await
        .expect("delete at the current revision");
    kv.create("leader", "host-c".into())
        .await
        .expect("create after delete");

    // A bucket opened without limit markers refuses TTLs with its own kind.
    assert!(matches!(
        kv.put_with_ttl("lease", "me".into(), Duration::from_secs(5))
            .await,
        Err(KvError::TtlDisabled { .. })
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_put_with_a_one_second_ttl_arrives_as_an_expiry() {
    let nats = Nats::start();
    let mut options = BucketOptions::new("leases");
    options.limit_markers = Some(Duration::from_secs(60));
    let (_client, kv) = bucket(&nats, options).await;
    let mut watch = kv
        .watch_prefixes(&["lease."], WatchStart::NewChanges)
        .await
        .expect("watch");
    caught_up(&mut watch).await;

    let written = Instant::now();
    let revision = kv
        .put_with_ttl("lease.a", "host-a".into(), Duration::from_secs(1))
        .await
        .expect("put with TTL");
    let put = next_update(&mut watch, "the put").await;
    assert_eq!(
        (put.revision, put.operation, &put.value[..]),
        (revision, Operation::Put, &b"host-a"[..])
    );
    let expired = next_update(&mut watch, "the expiry").await;
    let delay = written.elapsed();
    println!("a 1 s TTL expired after {delay:?}");
    assert_eq!(
        (expired.key.as_str(), expired.operation),
        ("lease.a", Operation::Expired)
    );
    assert!(expired.value.is_empty());
    assert!(expired.revision > revision);
    assert!(
        delay >= Duration::from_millis(900) && delay < Duration::from_secs(10),
        "expiry after {delay:?}"
    );
    // The marker is the key's last entry; the key can be taken again.
    let marker = kv.entry("lease.a").await.expect("entry").expect("marker");
    assert_eq!(marker.operation, Operation::Expired);
    let retaken = kv
        .create_with_ttl("lease.a", "host-b".into(), Duration::from_secs(30))
        .await
        .expect("a lease is taken again over its expiry marker");
    assert!(matches!(
        kv.create_with_ttl("lease.a", "host-c".into(), Duration::from_secs(30))
            .await,
        Err(KvError::AlreadyExists { .. })
    ));
    kv.update_with_ttl("lease.a", "host-b".into(), retaken, Duration::from_secs(30))
        .await
        .expect("the holder renews it");
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_a_watch_deletes_its_consumer_at_once() {
    let nats = Nats::start();
    let (client, kv) = bucket(&nats, BucketOptions::new("cfg")).await;

    let watch = kv
        .watch_prefixes(&["a.", "b."], WatchStart::CurrentValues)
        .await
        .expect("watch");
    assert_eq!(consumer_count(&client, &kv).await, 1);
    drop(watch);
    let dropped = Instant::now();
    eventually(
        Duration::from_secs(1),
        "the dropped watch's consumer to go",
        || async { (consumer_count(&client, &kv).await == 0).then_some(()) },
    )
    .await;
    println!("consumer gone {:?} after drop", dropped.elapsed());

    // Watching again and again never piles consumers up.
    for round in 0..10 {
        let mut watch = kv
            .watch_prefixes(&["a.", "b."], WatchStart::CurrentValues)
            .await
            .expect("watch");
        caught_up(&mut watch).await;
        let count = consumer_count(&client, &kv).await;
        assert!(count <= 2, "round {round}: {count} consumers");
    }
    eventually(
        Duration::from_secs(1),
        "every re-watch's consumer to go",
        || async { (consumer_count(&client, &kv).await == 0).then_some(()) },
    )
    .await;

    // `close` waits for the delete: nothing to poll for.
    let watch = kv
        .watch_prefixes(&["a."], WatchStart::NewChanges)
        .await
        .expect("watch");
    assert_eq!(consumer_count(&client, &kv).await, 1);
    watch.close().await;
    assert_eq!(consumer_count(&client, &kv).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_consumer_is_replaced_after_the_last_revision() {
    let nats = Nats::start();
    let (client, kv) = bucket(&nats, BucketOptions::new("cfg")).await;
    let mut watch = kv
        .watch_prefixes(&["d.", "e."], WatchStart::CurrentValues)
        .await
        .expect("watch");
    caught_up(&mut watch).await;
    kv.put("d.1", "1".into()).await.expect("put");
    assert_eq!(next_update(&mut watch, "d.1").await.key, "d.1");

    let js = jetstream::new(client.clone());
    let stream = js.get_stream(kv.stream_name()).await.expect("stream");
    let names: Vec<String> = stream
        .consumer_names()
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(|name| name.expect("name"))
        .collect();
    assert_eq!(names.len(), 1);
    stream.delete_consumer(&names[0]).await.expect("delete");
    let lost = Instant::now();
    // Written while the watch has no consumer at all.
    kv.put("d.2", "2".into()).await.expect("put");
    kv.put("e.1", "3".into()).await.expect("put");

    let updates = updates_until(&mut watch, "e.1").await;
    println!(
        "watch recovered from a deleted consumer in {:?}",
        lost.elapsed()
    );
    assert_eq!(
        keys(&updates),
        ["d.2", "e.1"],
        "nothing missed, nothing twice"
    );
    kv.put("d.3", "4".into()).await.expect("put");
    assert_eq!(next_update(&mut watch, "d.3").await.key, "d.3");
    assert_eq!(quiet(&mut watch, Duration::from_millis(300)).await, []);
    assert_eq!(consumer_count(&client, &kv).await, 1, "one replacement");
}

/// The key of the restart test's write `index`: every fifth key is outside
/// the watch.
fn restart_key(index: usize) -> String {
    match index % 5 {
        4 => format!("x.{index:03}"),
        3 => format!("v.{index:03}"),
        _ => format!("w.{index:03}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_restart_mid_writes_loses_and_repeats_no_revision() {
    const WRITES: usize = 200;
    if std::env::var_os("WEIR_LOG").is_some() {
        weir::telemetry::init_logging();
    }
    let mut nats = Nats::start();
    // A write retried after a lost acknowledgement stores its key twice;
    // history keeps both, so the stream still holds every revision the watch
    // may have delivered.
    let mut options = BucketOptions::new("restart");
    options.history = 10;
    let (client, kv) = bucket(&nats, options).await;
    let mut watch = kv
        .watch_prefixes(&["w.", "v."], WatchStart::CurrentValues)
        .await
        .expect("watch");
    caught_up(&mut watch).await;

    // The writer retries every write until it is acknowledged; a write whose
    // acknowledgement was lost may be stored twice, which the watch must then
    // show twice — the stream is the truth compared against below.
    let written = Arc::new(AtomicUsize::new(0));
    let writer = tokio::spawn({
        let kv = kv.clone();
        let written = written.clone();
        async move {
            let mut acked = Vec::new();
            for index in 0..WRITES {
                let key = restart_key(index);
                loop {
                    match kv.put(&key, index.to_string().into()).await {
                        Ok(revision) => {
                            acked.push((key.clone(), revision));
                            break;
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
                written.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            acked
        }
    });
    let last_key = (0..WRITES)
        .rev()
        .map(restart_key)
        .find(|key| !key.starts_with("x."))
        .expect("a watched key");
    let reader = tokio::spawn(async move {
        let mut seen = updates_until(&mut watch, &last_key).await;
        // Anything delivered twice would show up right behind.
        seen.extend(
            quiet(&mut watch, Duration::from_millis(500))
                .await
                .into_iter()
                .map(|event| match event {
                    WatchEvent::Update(entry) => entry,
                    WatchEvent::CaughtUp => panic!("a second CaughtUp"),
                }),
        );
        seen
    });

    eventually(Duration::from_secs(30), "a third of the writes", || async {
        (written.load(Ordering::Relaxed) >= WRITES / 3).then_some(())
    })
    .await;
    let restart = Instant::now();
    tokio::task::block_in_place(|| nats.restart(Duration::from_millis(500)));
    println!(
        "nats-server restarted in {:?} after {} writes",
        restart.elapsed(),
        written.load(Ordering::Relaxed)
    );

    let acked = tokio::time::timeout(Duration::from_secs(90), writer)
        .await
        .expect("the writer finishes")
        .expect("writer task");
    let seen = tokio::time::timeout(Duration::from_secs(90), reader)
        .await
        .expect("the watch sees the last write")
        .expect("reader task");
    println!("whole run {:?}", restart.elapsed());

    let client = if client.connection_state() == async_nats::connection::State::Connected {
        client
    } else {
        nats.client().await
    };
    let truth: Vec<(String, u64)> = read_stream(&client, kv.stream_name())
        .await
        .iter()
        .filter_map(|message| {
            let key = message.subject.strip_prefix("$KV.restart.")?.to_string();
            let revision = message.info().expect("JetStream message").stream_sequence;
            (key.starts_with("w.") || key.starts_with("v.")).then_some((key, revision))
        })
        .collect();
    let watched: Vec<(String, u64)> = seen
        .iter()
        .map(|entry| (entry.key.clone(), entry.revision))
        .collect();
    assert_eq!(
        watched.len(),
        truth.len(),
        "as many updates as watched revisions stored"
    );
    assert_eq!(watched, truth, "every stored revision once, in order");
    for (key, revision) in acked.iter().filter(|(key, _)| !key.starts_with("x.")) {
        assert!(
            truth.contains(&(key.clone(), *revision)),
            "acked {key}@{revision} is stored and was seen"
        );
    }
}
