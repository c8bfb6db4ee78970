//! A unit's claim on this host: whether it may be claimed, claiming it,
//! taking it over from a dead owner, running it and recording the handover,
//! or dropping a claim no worker stands behind.

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::takeover::{self, Takeover};
use super::{
    FleetView, Lease, MEMBERS, Membership, OwnerRecord, OwnerState, RETRY_PAUSE, STEP_DOWN_MARGIN,
    TAKEOVER_RECHECK, UnitEnd, owner_key, to_bytes, unix_ms,
};
use crate::nats::connection::connected;
use crate::nats::kv::KvWrite;
use crate::topology::route::Unit;

/// Shared by the coordinator and its unit tasks.
pub(super) struct UnitContext {
    pub(super) membership: Membership,
    pub(super) run: String,
}

/// How a unit is claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Claim {
    /// The owner record's revision (`None`: there is none yet).
    pub(super) revision: Option<u64>,
    /// The previous owner did not hand over: check for rows it left.
    pub(super) takeover: bool,
    /// The unit changes owner without a release: another member's claim
    /// is still recorded (counted as a takeover, rows in flight or not).
    pub(super) from_other: bool,
}

/// A finished unit task, with what it wrote last to the owner record.
pub(super) type TaskDone = (Unit, u64, Option<Written>);

/// What a unit task wrote last to its owner record, at which revision.
pub(super) enum Written {
    Record(OwnerRecord, u64),
    Deleted(u64),
}

/// What a unit task does.
pub(super) enum UnitWork {
    /// Claim the unit; from this member's claim, if it takes one over.
    Claim(Claim, Option<String>),
    /// Remove a claim of ours that no worker stands behind (see
    /// [`orphaned_claim`]), at this revision.
    DropClaim(u64),
}

/// A unit recorded as ours that is assigned elsewhere and has no worker
/// here: its worker was aborted (a step-down) or its `released` record
/// could not be written. Left alone, the assigned owner would wait for a
/// release forever; dropped, it takes the unit over (checking for rows
/// left in flight).
pub(super) fn orphaned_claim(view: &FleetView, unit: Unit) -> Option<u64> {
    let (record, revision) = view.owners.get(&unit)?;
    (record.state == OwnerState::Owned && record.member == view.me).then_some(*revision)
}

/// Deletes an orphaned claim (compare-and-set on its revision). The
/// deletion counts at once, not when the watch brings it: a claim made
/// meanwhile would go to the revision just deleted and fail.
pub(super) async fn drop_claim(ctx: &UnitContext, unit: Unit, revision: u64) -> Option<Written> {
    let key = owner_key(unit);
    match ctx.membership.kv.delete_at(&key, revision).await {
        Ok(revision) => {
            tracing::info!(%key, "dropped a claim no worker stood behind");
            Some(Written::Deleted(revision))
        }
        Err(err) => {
            tracing::debug!(%key, error = %err, "cannot drop the claim yet");
            tokio::time::sleep(RETRY_PAUSE).await;
            None
        }
    }
}

/// Whether this host may claim `unit` now, and how.
pub(super) fn claim(view: &FleetView, unit: Unit) -> Option<Claim> {
    let Some((record, revision)) = view.owners.get(&unit) else {
        return Some(Claim {
            revision: None,
            takeover: true,
            from_other: false,
        });
    };
    let revision = Some(*revision);
    match record.state {
        OwnerState::Released => Some(Claim {
            revision,
            takeover: false,
            from_other: false,
        }),
        // Recorded as ours but not running here: a previous run, or a
        // worker aborted when this host stepped down.
        OwnerState::Owned if record.member == view.me => Some(Claim {
            revision,
            takeover: true,
            from_other: false,
        }),
        OwnerState::Owned if !view.is_live(&record.member) => Some(Claim {
            revision,
            takeover: true,
            from_other: true,
        }),
        // A live member still holds it: wait for its `released`.
        OwnerState::Owned => None,
    }
}

/// A unit's life on this host: claim it, take it over if its owner died,
/// pull it until released, then record the clean handover. Returns what it
/// wrote last to the owner record.
pub(super) async fn run_unit(
    ctx: &UnitContext,
    unit: Unit,
    (claim, from): (Claim, Option<String>),
    release: CancellationToken,
    lease: Lease,
) -> Option<Written> {
    let membership = &ctx.membership;
    let key = owner_key(unit);
    if let Some(owner) = from
        && !owner_key_ended(membership, &owner).await
    {
        tokio::time::sleep(RETRY_PAUSE).await;
        return None;
    }
    let record = OwnerRecord {
        member: membership.me.clone(),
        run: ctx.run.clone(),
        state: OwnerState::Owned,
        since_ms: unix_ms(),
    };
    let value = to_bytes(&record);
    let written = match claim.revision {
        Some(revision) => membership.kv.update(&key, value, revision).await,
        None => membership.kv.create(&key, value).await,
    };
    let revision = match written {
        Ok(revision) => revision,
        Err(err) => {
            // Someone else's claim got there first; the watch will tell.
            tracing::debug!(%key, error = %err, "claim lost");
            tokio::time::sleep(RETRY_PAUSE).await;
            return None;
        }
    };
    let consumer = membership.router.unit_consumer(unit);
    // Whether the rows a previous owner may have left in flight are dealt
    // with: only then can this claim end in a `released` record.
    let mut stale_requests = false;
    let taken_over = match claim.takeover {
        false => {
            stale_requests = check_handover(membership, unit).await;
            true
        }
        true => match take_over(membership, unit, &release).await {
            None => false,
            Some(taken) => {
                // Rows left in flight are a takeover whoever left them (an
                // earlier run, a claim dropped as an orphan).
                if claim.from_other || taken.reset {
                    membership.metrics.unit_takeovers.inc();
                }
                stale_requests = taken.requests_waiting;
                true
            }
        },
    };
    if !taken_over {
        // Asked to let go while still waiting to take over (the old owner
        // came back, say): its rows may still be in flight and pinned, so a
        // `released` record would wrongly tell the next owner there is nothing
        // to redo. Removing the claim leaves the takeover to the next owner.
        return match membership.kv.delete_at(&key, revision).await {
            Ok(revision) => {
                tracing::info!(%consumer, "gave up a takeover not done yet; the next owner takes the unit over");
                Some(Written::Deleted(revision))
            }
            Err(err) => {
                tracing::warn!(%key, error = %err, "cannot give up the claim; it will be dropped as an orphan");
                None
            }
        };
    }
    tracing::debug!(%consumer, "pulling");
    let lease = match stale_requests {
        true => lease.claimed(revision).after_takeover(),
        false => lease.claimed(revision),
    };
    match membership.units.run(unit, release.clone(), lease).await {
        Ok(UnitEnd::Drained) => {}
        Ok(UnitEnd::Fenced) => {
            // Rows may be unsettled: the claim stays `owned` for the next
            // owner (or this host, once a member again) to take over.
            return None;
        }
        Err(err) => {
            tracing::error!(error = %err, "cannot pull the unit");
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
    if !connected(&membership.client) {
        // The write would wait out its timeout; the claim stays `owned`,
        // and the next owner takes the unit over as from a dead host.
        tracing::warn!(%key, "NATS is unreachable: the handover is not recorded; the next owner checks for rows left in flight");
        return None;
    }
    let released = OwnerRecord {
        state: OwnerState::Released,
        since_ms: unix_ms(),
        ..record
    };
    match membership
        .kv
        .update(&key, to_bytes(&released), revision)
        .await
    {
        Ok(revision) => Some(Written::Record(released, revision)),
        Err(err) => {
            tracing::warn!(%key, error = %err, "cannot record the handover; the claim will be dropped and the next owner checks for rows left in flight");
            None
        }
    }
}

/// Whether `owner`, which holds a claim and was never in the roster, has
/// no member key renewed either: a renewed key means a host that counts
/// members by their keys (a version from before the roster, in a rolling
/// upgrade), not dead, not to be taken over. (An owner whose entry was
/// removed is taken over whatever its key says: the entry goes only once
/// its key expired after it was written, so the term that claimed ended.)
async fn owner_key_ended(membership: &Membership, owner: &str) -> bool {
    match membership.kv.entry(&format!("{MEMBERS}{owner}")).await {
        Ok(Some(entry)) if entry.operation.is_put() => {
            tracing::debug!(%owner, "the owner is not in the roster but renews its member key; not taking its unit over");
            false
        }
        Ok(_) => true,
        Err(err) => {
            tracing::warn!(%owner, error = %err, "cannot read the owner's member key; taking over later");
            false
        }
    }
}

/// Checks a unit handed over with a `released` record before pulling it.
/// The old owner settled every row it took before writing the record, so
/// a row still unacked, or a pin, is a pull request of the old owner's
/// that the server kept after its release (one sent without a pin id is
/// pinned anew by its next row; in a cluster the consumer's leader may
/// learn of its inbox's end late): it took rows no one reads, which would
/// come back after the ack wait, behind newer ones (measured: 5 rows 9.4 s
/// late at a heal). They are sent back now, as at a takeover. Says whether
/// requests were still waiting, so that the new owner also takes the unit
/// back from one that takes rows after this check.
async fn check_handover(membership: &Membership, unit: Unit) -> bool {
    let stream = membership.router.partition_stream(unit.partition);
    let consumer = membership.router.unit_consumer(unit);
    let client = &membership.client;
    let state = match takeover::inspect(client, &stream, &consumer).await {
        Ok(state) => state,
        Err(err) => {
            tracing::warn!(%consumer, error = %err, "cannot read the state of a unit handed over; pulling it as a takeover would");
            return true;
        }
    };
    if state.pinned || state.ack_pending > 0 {
        let action = takeover::rows_back(&state);
        match takeover::apply(client, &stream, &consumer, &state, action).await {
            Ok(()) => tracing::info!(
                %consumer,
                ?state,
                "a unit handed over was held by a request its old owner left; its rows are redelivered"
            ),
            Err(err) => {
                tracing::warn!(%consumer, error = %err, "cannot take a unit handed over back from its old owner's request")
            }
        }
    }
    state.waiting > 0 || state.pinned
}

/// A takeover done.
struct TakenOver {
    /// Rows left in flight were sent back from the ack floor.
    reset: bool,
    /// Pull requests the old owner sent were still waiting on the server.
    requests_waiting: bool,
}

/// Takes over a unit whose owner did not hand it over: unpins it and, if
/// rows were left in flight, resets it to its ack floor once nobody pulled
/// it within the quiet margin. Says whether that is done, and how (`None`:
/// asked to let go first).
async fn take_over(
    membership: &Membership,
    unit: Unit,
    release: &CancellationToken,
) -> Option<TakenOver> {
    let stream = membership.router.partition_stream(unit.partition);
    let consumer = membership.router.unit_consumer(unit);
    let client = &membership.client;
    let started = Instant::now();
    loop {
        match takeover::inspect(client, &stream, &consumer).await {
            Ok(state) => match takeover::decide(&state, STEP_DOWN_MARGIN) {
                Takeover::Wait => {
                    tracing::debug!(%consumer, ?state, "the unit was pulled within the quiet margin; looking again")
                }
                action => match takeover::apply(client, &stream, &consumer, &state, action).await {
                    Ok(()) => {
                        // Nobody of ours pulls yet: a pin now is a request the
                        // old owner left open, which took the pin and the rows
                        // just reset (they would wait out the ack wait there).
                        let after = takeover::inspect(client, &stream, &consumer).await;
                        tracing::debug!(%consumer, ?state, ?after, "the unit's state before and after its takeover");
                        if after.as_ref().is_ok_and(|after| after.pinned) {
                            tracing::warn!(
                                %consumer,
                                "a pull request left by the old owner took the unit after the reset; taking it over again"
                            );
                        } else {
                            if action == Takeover::Reset {
                                tracing::info!(
                                    %consumer,
                                    rows = state.ack_pending,
                                    waited_ms = started.elapsed().as_millis() as u64,
                                    "took over a unit; rows left in flight are redelivered"
                                );
                            }
                            return Some(TakenOver {
                                reset: action == Takeover::Reset,
                                requests_waiting: state.waiting > 0,
                            });
                        }
                    }
                    Err(err) => {
                        tracing::warn!(%consumer, error = %err, "cannot take the unit over yet")
                    }
                },
            },
            Err(err) => tracing::warn!(%consumer, error = %err, "cannot read the unit's state"),
        }
        tokio::select! {
            _ = release.cancelled() => return None,
            _ = tokio::time::sleep(TAKEOVER_RECHECK) => {}
        }
    }
}
