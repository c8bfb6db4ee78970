//! A unit's claim on this host: whether it may be claimed, claiming it,
//! taking it over from a dead owner, running it and recording the handover,
//! or dropping a claim no worker stands behind.

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::takeover;
use super::{
    FleetView, Lease, MEMBERS, Membership, OwnerRecord, OwnerState, RETRY_PAUSE, TAKEOVER_RECHECK,
    UnitEnd, owner_key, to_bytes, unix_ms,
};
use crate::nats::connection::connected;
use crate::nats::kv::KvWrite;
use crate::topology::manifest::unit_consumer;
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
    /// The previous owner did not hand over (counted as a takeover when it
    /// left rows in flight).
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
    let Some(left) = take(membership, unit, &release).await else {
        // Asked to let go before the unit was taken: nothing was pulled
        // under this claim, which is removed.
        return match membership.kv.delete_at(&key, revision).await {
            Ok(revision) => {
                tracing::info!(%consumer, "gave up a claim not taken yet; the next owner takes the unit");
                Some(Written::Deleted(revision))
            }
            Err(err) => {
                tracing::warn!(%key, error = %err, "cannot give up the claim; it will be dropped as an orphan");
                None
            }
        };
    };
    // Rows left in flight are a takeover whoever left them (an earlier
    // run, a claim dropped as an orphan, a request kept past a release).
    if claim.from_other || (claim.takeover && left.ack_pending > 0) {
        membership.metrics.unit_takeovers.inc();
    }
    tracing::debug!(%consumer, "pulling");
    let lease = lease.claimed(revision);
    match membership
        .units
        .run(unit, release.clone(), lease, left.settled_through)
        .await
    {
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

/// Takes the unit: creates its consumer afresh (retried until the server
/// does it). Says what the previous puller left (`None`: asked to let go
/// first).
async fn take(
    membership: &Membership,
    unit: Unit,
    release: &CancellationToken,
) -> Option<takeover::ConsumerState> {
    let stream = membership.router.partition_stream(unit.partition);
    let config = unit_consumer(&membership.router, unit, membership.ack_wait);
    let consumer = membership.router.unit_consumer(unit);
    let started = Instant::now();
    loop {
        match takeover::take(&membership.client, &stream, &config).await {
            Ok(left) => {
                if left.ack_pending > 0 || left.waiting > 0 {
                    tracing::info!(
                        %consumer,
                        rows = left.ack_pending,
                        requests = left.waiting,
                        took_ms = started.elapsed().as_millis() as u64,
                        "took a unit from its previous puller; rows left in flight are redelivered"
                    );
                }
                return Some(left);
            }
            Err(err) => tracing::warn!(%consumer, error = %err, "cannot take the unit yet"),
        }
        tokio::select! {
            _ = release.cancelled() => return None,
            _ = tokio::time::sleep(TAKEOVER_RECHECK) => {}
        }
    }
}
