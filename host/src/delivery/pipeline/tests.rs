//! Unit tests of the pipeline runner's pure parts: traced requests, dropped rows, merged verdicts.

use super::*;

#[test]
fn a_calls_traced_requests_are_each_named_once_with_their_rows() {
    let (a, b): (Arc<str>, Arc<str>) = (Arc::from("00-a"), Arc::from("00-b"));
    let traced = vec![Some(a.clone()), None, Some(a.clone()), Some(b.clone())];
    assert_eq!(
        requests_among(&traced, &[0, 1, 2, 3]),
        vec![(a.clone(), 2), (b.clone(), 1)]
    );
    // A later step is given only some rows (row 3 was dropped).
    assert_eq!(requests_among(&traced, &[2, 2, 1]), vec![(a, 2)]);
    assert!(requests_among(&[], &[0, 1]).is_empty());
}

#[test]
fn only_done_rows_without_a_descendant_at_the_sink_are_dropped() {
    let mut verdicts = vec![
        Verdict::Done,
        Verdict::Done,
        Verdict::DeadLetter {
            plugin: None,
            reason: "bad".into(),
        },
        Verdict::Done,
    ];
    // Row 1 became two rows; rows 0 and 2 reached nothing.
    mark_dropped(&mut verdicts, &[1, 1, 3]);
    assert!(matches!(verdicts[0], Verdict::Dropped));
    assert!(matches!(verdicts[1], Verdict::Done));
    assert!(matches!(verdicts[2], Verdict::DeadLetter { .. }));
    assert!(matches!(verdicts[3], Verdict::Done));
}

#[test]
fn retry_wins_over_dead_letter_and_keeps_the_longest_delay() {
    let mut verdict = Verdict::Done;
    verdict.merge(Verdict::DeadLetter {
        plugin: None,
        reason: "bad".into(),
    });
    assert!(matches!(verdict, Verdict::DeadLetter { .. }));
    verdict.merge(Verdict::Retry {
        delay: Duration::from_millis(10),
        plugin: None,
        reason: "a".into(),
    });
    verdict.merge(Verdict::Retry {
        delay: Duration::from_millis(30),
        plugin: None,
        reason: "b".into(),
    });
    verdict.merge(Verdict::Done);
    match verdict {
        Verdict::Retry { delay, .. } => assert_eq!(delay, Duration::from_millis(30)),
        other => panic!("expected a retry, got {other:?}"),
    }
}
