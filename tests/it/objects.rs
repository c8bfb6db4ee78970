//! A unit's commit log in a real object store (SeaweedFS's S3): every row
//! in exactly one visible object whatever the interleaving of a new owner
//! and an earlier one woken past its lease, a writer that died between
//! its entry and its object, a store killed mid-commit, and settled
//! entries pruned. Bad keys, a missing bucket and an unreachable endpoint
//! each say what failed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use weir::config::{ObjectsTarget, Rolling};
use weir::destination::{
    Committed, Delivered, Entry, Format, LogError, Recovery, Store, StoreSettings, UnitLog,
    UnitObjects, Waiting,
};
use weir::fence::Fence;

use crate::seaweed_support::{BUCKET, Seaweed, ndjson_rows};

const PREFIX: &str = "rows";
const SINK: &str = "lake";
const UNIT: &str = "weir_p0_s0";

/// What a worker's lease says, set by the test: a writer woken past its
/// lease still believes it holds until it looks again.
struct Lease(AtomicBool);

impl Lease {
    fn held() -> Lease {
        Lease(AtomicBool::new(true))
    }
}

impl Fence for Lease {
    fn held(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
    fn claim(&self) -> u64 {
        0
    }
    fn owned(&self) -> Box<dyn Fence> {
        Box::new(Lease(AtomicBool::new(self.held())))
    }
}

fn object_key(number: u64) -> String {
    format!("{PREFIX}/tenant=acme/table=orders/{UNIT}-{number:020}.ndjson")
}

/// The object's content: one line per row, its sequence.
fn ndjson(rows: impl IntoIterator<Item = u64>) -> Bytes {
    rows.into_iter()
        .map(|seq| format!("{{\"seq\":{seq}}}\n"))
        .collect::<String>()
        .into()
}

fn range(first: u64, last: u64) -> Vec<u64> {
    (first..=last).collect()
}

/// How many visible objects hold each row, as a reader listing the
/// prefix sees it (the log's folder is not data).
async fn rows_seen(store: &Store) -> BTreeMap<u64, usize> {
    let mut seen = BTreeMap::new();
    for (_, row) in ndjson_rows(store, PREFIX).await {
        *seen.entry(row["seq"].as_u64().expect("seq")).or_default() += 1;
    }
    seen
}

fn assert_each_once(seen: &BTreeMap<u64, usize>, first: u64, last: u64) {
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    let missing: Vec<u64> = (first..=last).filter(|s| !seen.contains_key(s)).collect();
    assert!(
        twice.is_empty() && missing.is_empty() && seen.len() as u64 == last - first + 1,
        "rows in more than one object: {twice:?}; in none: {missing:?}"
    );
}

/// Commits rows `first..=last` as one NDJSON object, as `writer`.
async fn commit_rows(
    log: &mut UnitLog,
    first: u64,
    last: u64,
    writer: &str,
    fence: &dyn Fence,
) -> Result<Committed, LogError> {
    log.commit(
        object_key,
        &range(first, last),
        writer,
        ndjson(first..=last),
        fence,
    )
    .await
}

async fn open(store: &Store) -> (UnitLog, weir::destination::Recovery) {
    UnitLog::open(store, PREFIX, SINK, UNIT)
        .await
        .expect("open the unit's log")
}

/// The unit's new owner reads the log and takes it over (its marker, and
/// every unwritten entry voided).
async fn take_over(store: &Store, writer: &str, lease: &Lease) -> (UnitLog, Recovery) {
    let (mut log, recovery) = open(store).await;
    let recovery = log
        .take_over(writer, recovery, Bytes::new(), lease)
        .await
        .expect("take the log over");
    (log, recovery)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_late_writer_and_a_new_owner_never_both_make_a_row_visible() {
    let seaweed = Seaweed::start().await;
    let store = seaweed.store();
    let (stale_lease, lease) = (Lease::held(), Lease::held());

    // The first owner commits rows 1..=100, then checks its lease for its
    // next commit and freezes there.
    let (mut old, recovery) = take_over(&store, "old", &stale_lease).await;
    assert!(recovery.written.is_empty() && recovery.unwritten.is_empty());
    assert_eq!(old.next(), 1, "its marker took number 0");
    let first = commit_rows(&mut old, 1, 100, "old", &stale_lease)
        .await
        .expect("commit");
    assert_eq!(first, Committed::Written(1));

    // The unit moves: the new owner finds entry 1 written, writes its
    // marker at 2 and commits the redelivered rows 101..=150 as 3.
    let (mut new, recovery) = take_over(&store, "new", &lease).await;
    assert_eq!(recovery.written.len(), 1, "{recovery:?}");
    assert!(recovery.written[0].1.holds(100) && !recovery.written[0].1.holds(101));
    let ours = commit_rows(&mut new, 101, 150, "new", &lease)
        .await
        .expect("commit");
    assert_eq!(ours, Committed::Written(3));

    // The old owner wakes and sends its write of 101..=200 as number 2:
    // refused, the number is the new owner's marker.
    let late = commit_rows(&mut old, 101, 200, "old", &stale_lease)
        .await
        .expect("a refused commit is an answer");
    let Committed::Taken { number, entry } = late else {
        panic!("the late write was not refused: {late:?}");
    };
    assert_eq!((number, entry.writer.as_str()), (2, "new"));
    assert!(entry.is_marker());
    stale_lease.0.store(false, Ordering::SeqCst);
    // It looks at its lease before anything else, and stops.
    let fenced = commit_rows(&mut old, 151, 200, "old", &stale_lease).await;
    assert!(matches!(fenced, Err(LogError::Fenced(_))), "{fenced:?}");

    // The other order: an owner's entry (4, rows 151..=250) lands, and it
    // freezes before writing its object; the unit moves on, and the next
    // owner voids that entry, so the late object is refused when it comes.
    let late_entry = Entry::new(object_key(4), &range(151, 250), "frozen".into());
    assert_eq!(
        new.claim(4, &late_entry, &lease).await.expect("claim"),
        None
    );
    let (mut next, recovery) = take_over(&store, "next", &lease).await;
    assert_eq!(recovery.voided, vec![(4, late_entry.clone())]);
    let voided = new.write_object(&late_entry, ndjson(151..=250)).await;
    assert!(matches!(voided, Err(LogError::Voided { .. })), "{voided:?}");
    // The voided rows are delivered afresh by the owner that voided them.
    let afresh = commit_rows(&mut next, 151, 300, "next", &lease)
        .await
        .expect("commit");
    assert_eq!(afresh, Committed::Written(6));

    assert_each_once(&rows_seen(&store).await, 1, 300);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_late_entry_that_beats_the_new_owners_marker_is_voided_at_take_over() {
    let seaweed = Seaweed::start().await;
    let store = seaweed.store();
    let lease = Lease::held();
    let (mut frozen, _) = take_over(&store, "frozen", &lease).await;
    commit_rows(&mut frozen, 1, 10, "frozen", &lease)
        .await
        .expect("commit");
    // The new owner reads the log (entries 0 and 1) ...
    let (mut next, recovery) = open(&store).await;
    assert_eq!(recovery.written.len(), 1);
    // ... and the frozen owner's entry 2 lands before the new owner's
    // marker, its object still on its way.
    let entry = Entry::new(object_key(2), &range(11, 20), "frozen".into());
    assert_eq!(frozen.claim(2, &entry, &lease).await.expect("claim"), None);
    let recovery = next
        .take_over("next", recovery, Bytes::new(), &lease)
        .await
        .expect("take over");
    assert_eq!(recovery.voided, vec![(2, entry.clone())], "{recovery:?}");
    assert_eq!(next.next(), 4, "the marker went to the next number");
    let late = frozen.write_object(&entry, ndjson(11..=20)).await;
    assert!(matches!(late, Err(LogError::Voided { .. })), "{late:?}");
    let written = commit_rows(&mut next, 11, 30, "next", &lease)
        .await
        .expect("commit");
    assert_eq!(written, Committed::Written(4));
    assert_each_once(&rows_seen(&store).await, 1, 30);

    // An object whose writer got there before the void is written after
    // all: a later owner finds its entry written.
    let raced = Entry::new(object_key(5), &range(31, 40), "next".into());
    assert_eq!(next.claim(5, &raced, &lease).await.expect("claim"), None);
    next.write_object(&raced, ndjson(31..=40))
        .await
        .expect("write");
    let (_, recovery) = take_over(&store, "last", &lease).await;
    assert!(
        recovery.written.iter().any(|(n, _)| *n == 5),
        "{recovery:?}"
    );
    assert_each_once(&rows_seen(&store).await, 1, 40);

    // A claim whose answer was lost is sent again: the entry standing is
    // the writer's own.
    let again = Entry::new(object_key(9), &range(41, 50), "next".into());
    assert_eq!(next.claim(9, &again, &lease).await.expect("claim"), None);
    assert_eq!(
        next.claim(9, &again, &lease).await.expect("claim again"),
        None
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_commit_while_the_store_is_down_fails_and_goes_through_once_it_is_back() {
    let mut seaweed = Seaweed::start().await;
    let store = seaweed.store();
    let lease = Lease::held();
    let (mut log, _) = open(&store).await;
    commit_rows(&mut log, 1, 50, "host", &lease)
        .await
        .expect("commit");

    seaweed.kill();
    let failed = commit_rows(&mut log, 51, 100, "host", &lease).await;
    let error = failed
        .expect_err("a commit into a dead store fails")
        .to_string();
    assert!(
        error.contains(BUCKET) && error.contains(&seaweed.endpoint()),
        "the error names neither the bucket nor the store: {error}"
    );
    assert_eq!(log.next(), 1, "a failed commit used its number");

    seaweed.start_again().await;
    let retried = commit_rows(&mut log, 51, 100, "host", &lease)
        .await
        .expect("the same commit once the store is back");
    assert_eq!(retried, Committed::Written(1));
    assert_each_once(&rows_seen(&store).await, 1, 100);

    // Entries whose rows are all acked go, but the newest: a next owner
    // numbers on from it.
    commit_rows(&mut log, 101, 150, "host", &lease)
        .await
        .expect("commit");
    let hour = std::time::Duration::from_secs(3600);
    assert_eq!(
        log.prune(100, hour).await.expect("prune"),
        0,
        "entries written within the hour stay"
    );
    assert_eq!(
        log.prune(100, std::time::Duration::ZERO)
            .await
            .expect("prune"),
        2
    );
    assert_eq!(
        log.prune(150, std::time::Duration::ZERO)
            .await
            .expect("prune"),
        0,
        "the newest entry stays"
    );
    let (next, recovery) = open(&store).await;
    assert_eq!((next.next(), recovery.written.len()), (3, 1));
    assert_each_once(&rows_seen(&store).await, 1, 150);
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_keys_a_missing_bucket_and_an_unreachable_store_say_what_failed() {
    let seaweed = Seaweed::start().await;
    let probe = |settings: StoreSettings| async move {
        Store::open(&settings)
            .expect("open")
            .probe(PREFIX)
            .await
            .expect_err("the probe fails")
            .to_string()
    };
    let mut wrong_secret = seaweed.settings();
    wrong_secret.keys = wrong_secret
        .keys
        .map(|(id, _)| (id, "not-the-secret".into()));
    let refused = probe(wrong_secret).await;
    assert!(
        refused.contains(BUCKET) && refused.contains("SignatureDoesNotMatch"),
        "{refused}"
    );
    let mut other_bucket = seaweed.settings();
    other_bucket.bucket = "no-such-bucket".into();
    let missing = probe(other_bucket).await;
    assert!(
        missing.contains("no-such-bucket") && missing.contains("NoSuchBucket"),
        "{missing}"
    );
    let mut nowhere = seaweed.settings();
    nowhere.endpoint = Some(format!("http://127.0.0.1:{}", crate::support::free_port()));
    let unreachable = probe(nowhere).await;
    assert!(unreachable.contains("127.0.0.1"), "{unreachable}");
    println!("refused keys: {refused}\nmissing bucket: {missing}\nunreachable: {unreachable}");
    let shown = format!("{:?}", seaweed.settings());
    assert!(!shown.contains("weir-test-secret"), "{shown}");
}

/// `sql` run by DuckDB (`duckdb` from PyPI, with the `httpfs` extension
/// from its wheel: DuckDB's own download needs the internet) against the
/// store, through the lake example's reader: the first row of its
/// answer, as text.
pub fn duckdb_over_s3(seaweed: &Seaweed, sql: &str) -> Vec<String> {
    let settings = seaweed.settings();
    let (key, secret) = settings.keys.expect("keys");
    let endpoint = seaweed.endpoint().trim_start_matches("http://").to_string();
    let output = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/lake/read.py"
        ))
        .args([&endpoint, &key, &secret, sql])
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "DuckDB failed (`.ci/setup` installs duckdb and duckdb-extension-httpfs): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .split('\t')
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn parquet_objects_committed_through_the_log_are_read_once_by_duckdb() {
    let seaweed = Seaweed::start().await;
    let store = seaweed.store();
    let lease = Lease::held();
    let format: weir::destination::Format = serde_json::from_value(serde_json::json!({
        "format": "parquet",
        "row_group_rows": 400,
        "columns": [
            {"name": "id", "type": "int64", "required": true},
            {"name": "customer", "type": "string"},
            {"name": "amount", "type": "float64"},
            {"name": "at", "type": "timestamp"},
        ],
    }))
    .expect("a format");
    let parquet_key = |number: u64| {
        format!("{PREFIX}/tenant=acme/table=orders/dt=2026-12-07/{UNIT}-{number:020}.parquet")
    };
    let (mut log, _) = open(&store).await;
    let (mut refused, mut next_seq) = (Vec::new(), 1u64);
    for object in 0..3u64 {
        let mut writer = weir::destination::ObjectWriter::new(&format).expect("a writer");
        let mut sequences = Vec::new();
        for i in 0..1000u64 {
            let id = object * 1000 + i + 1;
            let seq = next_seq;
            next_seq += 1;
            // One row in a hundred carries its amount as a string.
            let amount = if id % 100 == 0 {
                serde_json::json!("12.5")
            } else {
                serde_json::json!(id as f64 / 4.0)
            };
            let row = serde_json::json!({
                "id": id, "customer": format!("c{}", id % 7), "amount": amount,
                "at": "2026-12-07T12:00:00Z",
            });
            match writer.append(row.to_string().as_bytes()) {
                Ok(()) => sequences.push(seq),
                Err(weir::destination::AppendError::Refused(why)) => refused.push(why.to_string()),
                Err(err) => panic!("{err}"),
            }
        }
        let data = writer.finish().expect("finish");
        let committed = log
            .commit(parquet_key, &sequences, "host", data, &lease)
            .await
            .expect("commit");
        assert_eq!(committed, Committed::Written(object));
    }
    assert_eq!(refused.len(), 30);
    assert!(
        refused[0].starts_with("column `amount` (Float64): expected a number, found a string"),
        "{}",
        refused[0]
    );
    let answer = duckdb_over_s3(
        &seaweed,
        &format!(
            "SELECT count(*), count(DISTINCT id), min(\"at\")::VARCHAR, sum(amount) \
             FROM read_parquet('s3://{BUCKET}/{PREFIX}/**/*.parquet', hive_partitioning = true) \
             WHERE tenant = 'acme' AND dt = '2026-12-07'"
        ),
    );
    let expected_sum: f64 = (1..=3000u64)
        .filter(|id| id % 100 != 0)
        .map(|id| id as f64 / 4.0)
        .sum();
    assert_eq!(
        answer,
        vec![
            "2970".to_string(),
            "2970".to_string(),
            "2026-12-07 12:00:00+00".to_string(),
            format!("{expected_sum:.1}"),
        ],
        "DuckDB's count, distinct ids, first time and sum of amounts"
    );
}

/// A lease the test flips while a unit's committer holds it.
#[derive(Clone)]
struct SharedLease(std::sync::Arc<AtomicBool>);

impl SharedLease {
    fn held() -> SharedLease {
        SharedLease(std::sync::Arc::new(AtomicBool::new(true)))
    }
}

impl Fence for SharedLease {
    fn held(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
    fn claim(&self) -> u64 {
        0
    }
    fn owned(&self) -> Box<dyn Fence> {
        Box::new(self.clone())
    }
}

fn ndjson_target(max_rows: usize, max_age: std::time::Duration) -> std::sync::Arc<ObjectsTarget> {
    std::sync::Arc::new(ObjectsTarget {
        prefix: PREFIX.into(),
        format: Format::Ndjson {
            compression: weir::destination::NdjsonCompression::None,
        },
        rolling: Rolling {
            max_rows,
            max_bytes: 1 << 30,
            max_age,
        },
    })
}

async fn unit_objects(
    store: &Store,
    target: &std::sync::Arc<ObjectsTarget>,
    writer: &str,
    lease: &SharedLease,
) -> UnitObjects {
    UnitObjects::open(
        store,
        target.clone(),
        SINK,
        UNIT,
        writer.into(),
        Box::new(lease.clone()),
    )
    .await
    .expect("open the unit's objects")
}

/// Rows `first..=last` as one batch the sink delivered, each to `path`.
fn delivered(format: &Format, first: u64, last: u64, path: &str) -> Vec<Delivered> {
    (first..=last)
        .map(|seq| Delivered {
            sequence: seq,
            path: path.into(),
            records: vec![
                format
                    .fit(format!("{{\"seq\":{seq}}}").as_bytes())
                    .expect("fits"),
            ],
        })
        .collect()
}

/// Waits for every object a batch is in; the rows that came back, with why.
async fn outcomes(waiting: Vec<Waiting>) -> Vec<(Vec<u64>, String)> {
    let mut back = Vec::new();
    for wait in waiting {
        let outcome = tokio::time::timeout(std::time::Duration::from_secs(30), wait.outcome)
            .await
            .expect("an object commits or fails within 30 s")
            .unwrap_or_else(|_| Some("the committer ended".into()));
        if let Some(reason) = outcome {
            back.push((wait.sequences, reason));
        }
    }
    back
}

#[tokio::test(flavor = "multi_thread")]
async fn a_units_rows_wait_for_their_object_which_rolls_over_by_rows_and_by_age() {
    let seaweed = Seaweed::start().await;
    let store = seaweed.store();
    let lease = SharedLease::held();
    let target = ndjson_target(100, std::time::Duration::from_millis(700));
    let objects = unit_objects(&store, &target, "host", &lease).await;
    let (orders, refunds) = ("tenant=acme/table=orders", "tenant=acme/table=refunds");
    let mut waiting = Vec::new();
    for first in (1..=240).step_by(60) {
        let mut batch = delivered(&target.format, first, first + 29, orders);
        batch.extend(delivered(&target.format, first + 30, first + 59, refunds));
        let waits = objects.add(batch).expect("add");
        assert!(!waits.is_empty());
        waiting.extend(waits);
    }
    // 120 rows per path: one object of 100 each commits now; the other 20
    // each wait for their object's age.
    let began = std::time::Instant::now();
    assert_eq!(outcomes(waiting).await, []);
    assert!(
        began.elapsed() >= std::time::Duration::from_millis(300),
        "the last objects waited for their age"
    );
    assert_each_once(&rows_seen(&store).await, 1, 240);
    let keys: Vec<String> = store
        .raw()
        .list(Some(&Path::from(format!("{PREFIX}/{orders}"))))
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .expect("list");
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(
        keys.iter()
            .all(|key| key.contains(&format!("{SINK}-{UNIT}-"))),
        "{keys:?}"
    );

    // Rows of an object written before come back (their acks were lost):
    // done with no write, nothing to wait for.
    let again = objects
        .add(delivered(&target.format, 1, 100, orders))
        .expect("add");
    assert!(again.is_empty(), "{again:?}");
    // A path the sink names is checked before anything is added.
    assert!(weir::destination::check_path("tenant=acme/../x").is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_owner_skips_what_is_written_and_the_old_one_commits_nothing_more() {
    let seaweed = Seaweed::start().await;
    let store = seaweed.store();
    let target = ndjson_target(50, std::time::Duration::from_secs(3600));
    let path = "tenant=acme/table=orders";
    let old_lease = SharedLease::held();
    let old = unit_objects(&store, &target, "old", &old_lease).await;
    assert_eq!(
        outcomes(
            old.add(delivered(&target.format, 1, 100, path))
                .expect("add")
        )
        .await,
        []
    );
    // The old owner holds 101..=130 in an object not yet full when the unit
    // moves; it does not know yet.
    let stranded = old
        .add(delivered(&target.format, 101, 130, path))
        .expect("add");

    let new_lease = SharedLease::held();
    let new = unit_objects(&store, &target, "new", &new_lease).await;
    // Every unacked row comes back to the new owner: 1..=100 are written.
    let redelivered = new
        .add(delivered(&target.format, 1, 150, path))
        .expect("add");
    assert_eq!(redelivered.len(), 1);
    assert_eq!(redelivered[0].sequences, range(101, 150));
    new.flush();
    assert_eq!(outcomes(redelivered).await, []);

    // The old owner's object fills and goes to commit: refused by the new
    // owner's marker (or its lease), and its rows come back.
    old.add(delivered(&target.format, 131, 150, path))
        .expect("add");
    old.flush();
    let back = outcomes(stranded).await;
    assert_eq!(back.len(), 1, "{back:?}");
    assert!(back[0].1.contains("not this host's"), "{back:?}");
    let refused = old.add(delivered(&target.format, 151, 160, path));
    assert!(refused.is_err(), "a stopped committer takes no more rows");
    assert_each_once(&rows_seen(&store).await, 1, 150);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_object_opened_while_the_committer_waits_for_nothing_still_commits_by_age() {
    let seaweed = Seaweed::start().await;
    let store = seaweed.store();
    let lease = SharedLease::held();
    let target = ndjson_target(1000, std::time::Duration::from_millis(300));
    let objects = unit_objects(&store, &target, "host", &lease).await;
    // The committer has had nothing to wait for; one row opens an object
    // that never fills.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let waiting = objects
        .add(delivered(&target.format, 1, 1, "tenant=acme/table=orders"))
        .expect("add");
    assert_eq!(outcomes(waiting).await, []);
    assert_each_once(&rows_seen(&store).await, 1, 1);
}
