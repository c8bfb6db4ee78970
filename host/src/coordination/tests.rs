use super::claim::Claim;
use super::*;

fn owned_by(member: &str) -> (OwnerRecord, u64) {
    (
        OwnerRecord {
            member: member.into(),
            run: "r".into(),
            state: OwnerState::Owned,
            since_ms: 0,
        },
        7,
    )
}

fn view(members: &[&str]) -> FleetView {
    FleetView {
        me: "me".into(),
        member: true,
        members: members
            .iter()
            .map(|m| {
                (
                    m.to_string(),
                    MemberRecord {
                        run: "r".into(),
                        http: String::new(),
                        since_ms: 0,
                        plugins: BTreeMap::new(),
                        ttl_ms: 5_000,
                    },
                )
            })
            .collect(),
        owners: BTreeMap::new(),
    }
}

#[test]
fn a_renewal_is_overdue_half_a_period_after_it_was_due() {
    let record = |ttl_ms| MemberRecord {
        run: "r".into(),
        http: String::new(),
        since_ms: 0,
        plugins: BTreeMap::new(),
        ttl_ms,
    };
    let ms = Duration::from_millis;
    // 5 s TTL: renewed every 1.67 s, overdue after 2.5 s.
    assert!(!record(5_000).renewal_overdue(ms(2_400)));
    assert!(record(5_000).renewal_overdue(ms(2_600)));
    // Short periods still get half a second of slack.
    assert!(!record(3_000).renewal_overdue(ms(1_400)));
    assert!(record(3_000).renewal_overdue(ms(1_600)));
    // An older member that did not say its TTL is never called late.
    assert!(!record(0).renewal_overdue(ms(60_000)));
}

const UNIT: Unit = Unit {
    partition: 0,
    shard: 1,
};

#[test]
fn a_unit_held_by_a_live_member_waits_for_its_release() {
    let mut view = view(&["me", "other"]);
    view.owners.insert(UNIT, owned_by("other"));
    assert_eq!(claim(&view, UNIT), None);
    assert_eq!(view.owner(UNIT), Some("other"));

    let mut released = owned_by("other");
    released.0.state = OwnerState::Released;
    view.owners.insert(UNIT, released);
    assert_eq!(
        claim(&view, UNIT),
        Some(Claim {
            revision: Some(7),
            takeover: false,
            from_other: false,
        })
    );
    assert_eq!(view.unowned(&[UNIT]), vec![UNIT]);
}

#[test]
fn units_of_a_dead_member_or_an_earlier_run_are_taken_over() {
    let mut view = view(&["me"]);
    view.owners.insert(UNIT, owned_by("gone"));
    assert_eq!(
        claim(&view, UNIT),
        Some(Claim {
            revision: Some(7),
            takeover: true,
            from_other: true,
        })
    );
    assert_eq!(view.owner(UNIT), None);

    view.owners.insert(UNIT, owned_by("me"));
    // An earlier run of this host: no change of owner.
    assert!(claim(&view, UNIT).is_some_and(|c| c.takeover && !c.from_other));
    // Never recorded: there may be rows from before coordination.
    view.owners.clear();
    assert!(claim(&view, UNIT).is_some_and(|c| c.takeover && c.revision.is_none()));
}

#[test]
fn a_host_without_its_lease_is_not_a_member_even_if_its_key_lives() {
    let mut view = view(&["me", "other"]);
    view.member = false;
    assert_eq!(
        view.live_members().into_iter().collect::<Vec<_>>(),
        ["other"]
    );
}

#[test]
fn a_claim_of_ours_without_a_worker_is_an_orphan_to_drop() {
    let mut view = view(&["me", "other"]);
    view.owners.insert(UNIT, owned_by("me"));
    assert_eq!(orphaned_claim(&view, UNIT), Some(7));
    view.owners.insert(UNIT, owned_by("other"));
    assert_eq!(orphaned_claim(&view, UNIT), None);
    let mut released = owned_by("me");
    released.0.state = OwnerState::Released;
    view.owners.insert(UNIT, released);
    assert_eq!(orphaned_claim(&view, UNIT), None);
}

fn lease_state(term: u64, until: Instant) -> Option<LeaseState> {
    Some(LeaseState {
        term,
        until,
        listed: Some(1),
    })
}

#[tokio::test]
async fn a_lease_holds_through_renewals_of_its_term_only() {
    let now = Instant::now();
    let (renewals, state) = watch::channel(lease_state(1, now + Duration::from_millis(50)));
    let mut lease = Lease::current(state);
    assert!(lease.held());
    // Renewed in time: the same term, later.
    renewals.send_replace(lease_state(1, now + Duration::from_secs(60)));
    assert!(lease.held());
    let lost = tokio::time::timeout(Duration::from_millis(100), lease.lost()).await;
    assert!(lost.is_err(), "a renewed lease is not lost");
    // Renewed after it ran out: valid again, but not for this runner,
    // whose unit may have been taken over meanwhile.
    renewals.send_replace(lease_state(2, now + Duration::from_secs(60)));
    assert!(!lease.held());
    tokio::time::timeout(Duration::from_secs(1), lease.lost())
        .await
        .expect("a new term ends the lease at once");
}

#[tokio::test]
async fn a_lease_runs_out_on_the_clock_without_any_event() {
    let lease = Lease::until(Instant::now() + Duration::from_millis(30));
    assert!(lease.held());
    let mut waiting = lease.clone();
    tokio::time::timeout(Duration::from_secs(1), waiting.lost())
        .await
        .expect("lost when it runs out");
    assert!(!lease.held());
    let none = Lease::current(watch::channel(None).1);
    assert!(!none.held(), "no lease yet holds nothing");
}

#[test]
fn owner_keys_round_trip() {
    assert_eq!(owner_key(UNIT), "owners.0.1");
    assert_eq!(parse_unit("0.1"), Some(UNIT));
    assert_eq!(parse_unit("0"), None);
    assert_eq!(parse_unit("x.1"), None);
}
