//! Unit tests of the usage ledger: accepts, snapshots and what a budget is asked with.

use super::*;

fn accept(tenant: &str, partition: u32, last_seq: u64, rows: u64, bytes: u64) -> Accept {
    Accept {
        tenant: tenant.into(),
        partition,
        last_seq,
        rows,
        bytes,
    }
}

fn snapshot(last_seq: Vec<u64>, tenants: &[(&str, u64, u64)]) -> Snapshot {
    Snapshot {
        by: "leader".into(),
        last_seq,
        tenants: tenants
            .iter()
            .map(|(t, rows, bytes)| {
                (
                    t.to_string(),
                    Queued {
                        rows: *rows,
                        bytes: *bytes,
                    },
                )
            })
            .collect(),
    }
}

#[test]
fn a_snapshot_drops_exactly_the_accepts_it_covers() {
    let ledger = Ledger::new("me");
    ledger.apply_snapshot(snapshot(vec![10, 10], &[("a", 5, 500)]));
    ledger.accepted(vec![accept("a", 0, 12, 2, 200), accept("a", 1, 15, 3, 300)]);
    ledger.shared(Shared {
        host: "other".into(),
        accepts: vec![accept("a", 0, 13, 1, 100)],
        settled: Vec::new(),
        delivered: 0,
    });
    assert_eq!(
        ledger.usage("a").queued,
        Queued {
            rows: 11,
            bytes: 1100
        }
    );
    // The streams now hold partition 0 up to 13, and 2 of a's rows were delivered.
    ledger.apply_snapshot(snapshot(vec![13, 10], &[("a", 6, 600)]));
    assert_eq!(
        ledger.usage("a").queued,
        Queued {
            rows: 9,
            bytes: 900
        }
    );
    // An older snapshot (another leader a moment ago) changes nothing.
    ledger.apply_snapshot(snapshot(vec![12, 10], &[("a", 100, 10_000)]));
    assert_eq!(
        ledger.usage("a").queued,
        Queued {
            rows: 9,
            bytes: 900
        }
    );
    // An accept that arrives after the snapshot that covers it is not counted twice.
    ledger.shared(Shared {
        host: "other".into(),
        accepts: vec![accept("a", 0, 11, 4, 400)],
        settled: Vec::new(),
        delivered: 0,
    });
    assert_eq!(
        ledger.usage("a").queued,
        Queued {
            rows: 9,
            bytes: 900
        }
    );
    assert_eq!(ledger.usage("b").queued, Queued::default());
}

#[test]
fn reservations_count_until_dropped_and_own_messages_are_ignored() {
    let ledger = Ledger::new("me");
    let held = ledger.reserve("a", Queued { rows: 3, bytes: 30 });
    assert_eq!(ledger.usage("a").queued, Queued { rows: 3, bytes: 30 });
    drop(held);
    assert_eq!(ledger.usage("a").queued, Queued::default());
    ledger.accepted(vec![accept("a", 0, 1, 1, 10)]);
    let own = ledger.take_outbox().expect("an accept to share");
    ledger.shared(own);
    assert_eq!(ledger.usage("a").queued, Queued { rows: 1, bytes: 10 });
    assert_eq!(ledger.usage("a").recent, Queued { rows: 1, bytes: 10 });
    assert_eq!(ledger.mean_row_bytes().get("a").copied(), Some(10.0));
}

fn reads(read: Reads) -> String {
    match read {
        Reads::Nothing => "nothing".into(),
        Reads::Some(partitions) => format!("some {partitions:?}"),
        Reads::Check(partitions) => format!("check {partitions:?}"),
        Reads::All => "all".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn the_leader_reads_only_partitions_something_happened_in() {
    let ledger = Ledger::new("me");
    let mut reader = Reader::default();
    // Nothing read yet: every partition, once.
    assert_eq!(reads(ledger.leader_reads(&mut reader, 4)), "all");
    reader.partitions = vec![PartitionRead::default(); 4];
    reader.checked_at = Some(Instant::now());
    assert_eq!(reads(ledger.leader_reads(&mut reader, 4)), "nothing");
    // An accept and another host's settlement: read twice each.
    ledger.accepted(vec![accept("a", 2, 1, 1, 10)]);
    ledger.shared(Shared {
        host: "other".into(),
        accepts: Vec::new(),
        settled: vec![0],
        delivered: 0,
    });
    assert_eq!(reads(ledger.leader_reads(&mut reader, 4)), "some [0, 2]");
    assert_eq!(reads(ledger.leader_reads(&mut reader, 4)), "some [0, 2]");
    assert_eq!(reads(ledger.leader_reads(&mut reader, 4)), "nothing");
    // The slow check comes due.
    tokio::time::advance(SLOW_CHECK).await;
    ledger.settled(3, 1);
    assert_eq!(reads(ledger.leader_reads(&mut reader, 4)), "check [3]");
}

#[tokio::test(start_paused = true)]
async fn a_host_reads_itself_when_no_snapshot_covers_its_accepts() {
    let ledger = Ledger::new("me");
    let started = Instant::now();
    ledger.apply_snapshot(snapshot(vec![5], &[]));
    assert!(!ledger.stale(started));
    // Settlements alone wait for the leader's next read or slow check.
    ledger.settled(0, 1);
    tokio::time::advance(STALE_AFTER * 2).await;
    assert!(!ledger.stale(started));
    // An accept no snapshot covers within STALE_AFTER: the leader is gone.
    ledger.accepted(vec![accept("a", 0, 6, 1, 10)]);
    tokio::time::advance(STALE_AFTER / 2).await;
    assert!(!ledger.stale(started));
    tokio::time::advance(STALE_AFTER).await;
    assert!(ledger.stale(started));
    ledger.apply_snapshot(snapshot(vec![6], &[("a", 1, 10)]));
    assert!(!ledger.stale(started));
    // No snapshot at all for the slow check and then some.
    tokio::time::advance(SLOW_CHECK + STALE_AFTER + Duration::from_millis(1)).await;
    assert!(ledger.stale(started));
}

#[tokio::test(start_paused = true)]
async fn the_rate_window_forgets_what_is_older_than_a_second() {
    let ledger = Ledger::new("me");
    ledger.accepted(vec![accept("a", 0, 1, 2, 20)]);
    tokio::time::advance(Duration::from_millis(600)).await;
    ledger.accepted(vec![accept("a", 0, 2, 3, 30)]);
    assert_eq!(ledger.usage("a").recent, Queued { rows: 5, bytes: 50 });
    tokio::time::advance(Duration::from_millis(500)).await;
    assert_eq!(ledger.usage("a").recent, Queued { rows: 3, bytes: 30 });
    tokio::time::advance(Duration::from_millis(600)).await;
    let usage = ledger.usage("a");
    assert_eq!(usage.recent, Queued::default());
    assert_eq!(
        usage.queued,
        Queued { rows: 5, bytes: 50 },
        "queued until a snapshot"
    );
}

#[test]
fn the_fleets_accepted_and_delivered_rows_count_each_share_once() {
    let ledger = Ledger::new("me");
    ledger.accepted(vec![accept("a", 0, 1, 3, 30)]);
    ledger.settled(0, 2);
    let own = ledger
        .take_outbox()
        .expect("accepts and deliveries to share");
    assert_eq!(
        (own.accepts.len(), own.settled.clone(), own.delivered),
        (1, vec![0], 2)
    );
    // This host's own message comes back over NATS: not counted again.
    ledger.shared(own);
    assert!(ledger.take_outbox().is_none());
    ledger.shared(Shared {
        host: "other".into(),
        accepts: vec![accept("b", 1, 1, 4, 40)],
        settled: vec![1],
        delivered: 5,
    });
    assert_eq!(
        ledger.moved(),
        Moved {
            accepted: 7,
            delivered: 7
        }
    );
}
