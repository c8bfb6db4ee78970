//! The host's lease: renewals of its member key say until when it may act
//! as a member (and write its roster entry when it changes), and each unit
//! runner holds the [`Lease`] its unit was claimed under, which fences it
//! once that lease no longer holds.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    MEMBERS, MemberRecord, PluginVersions, RETRY_PAUSE, STEP_DOWN_MARGIN, roster_key, to_bytes,
};
use crate::fence::Fence;
use crate::nats::kv::{KvWrite, NatsKv};

/// The host's lease as renewals publish it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseState {
    /// Counts unbroken runs of renewals: a renewal answered after the
    /// previous lease ran out starts a new term, since the key may have
    /// expired (and the units been taken) in between.
    pub term: u64,
    /// Renewal time + TTL − [`STEP_DOWN_MARGIN`], on the monotonic clock
    /// (which runs on while the process is stopped).
    pub until: Instant,
    /// The revision of the roster entry first written in this term: the
    /// host is a member once its watch has its entry at or after it.
    pub listed: Option<u64>,
}

/// The lease a unit was claimed under, handed to its runner: the unit is
/// this host's to deliver only while that lease holds. A lease that lapsed
/// and was renewed since does not hold: another host may own the unit.
#[derive(Debug, Clone)]
pub struct Lease {
    state: watch::Receiver<Option<LeaseState>>,
    term: Option<u64>,
    /// The revision of the owner record this host's claim of the unit
    /// wrote: a later claim of the unit, by anyone, writes a higher one,
    /// so a destination fences an old owner by it (0: no claim, tools).
    claim: u64,
}

impl Lease {
    /// The lease as it is now (the term a runner started now holds under).
    pub fn current(state: watch::Receiver<Option<LeaseState>>) -> Lease {
        let term = state.borrow().map(|s| s.term);
        Lease {
            state,
            term,
            claim: 0,
        }
    }

    /// The same lease, for the claim written at `revision`.
    pub fn claimed(mut self, revision: u64) -> Lease {
        self.claim = revision;
        self
    }

    /// The revision of the claim this lease runs under (see [`Lease`]).
    pub fn claim(&self) -> u64 {
        self.claim
    }

    /// A lease held until `until` and never renewed (tests, tools).
    pub fn until(until: Instant) -> Lease {
        let (_, state) = watch::channel(Some(LeaseState {
            term: 1,
            until,
            listed: Some(0),
        }));
        Lease::current(state)
    }

    /// Whether the unit is still this host's to deliver: the lease has not
    /// run out and is still the term it started in.
    pub fn held(&self) -> bool {
        self.held_until()
            .is_some_and(|until| Instant::now() < until)
    }

    /// The end of the lease if it is still this term.
    fn held_until(&self) -> Option<Instant> {
        let state = (*self.state.borrow())?;
        (Some(state.term) == self.term).then_some(state.until)
    }

    /// Resolves once the lease no longer holds.
    pub async fn lost(&mut self) {
        loop {
            let state = *self.state.borrow_and_update();
            let Some(until) = state.filter(|s| Some(s.term) == self.term).map(|s| s.until) else {
                return;
            };
            if Instant::now() >= until {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(until) => return,
                changed = self.state.changed() => {
                    // No more renewals (the host is leaving): the last one
                    // runs out on its own.
                    if changed.is_err() {
                        tokio::time::sleep_until(until).await;
                        return;
                    }
                }
            }
        }
    }
}

/// What the row path below the worker sees of the lease.
impl Fence for Lease {
    fn held(&self) -> bool {
        Lease::held(self)
    }

    fn claim(&self) -> u64 {
        Lease::claim(self)
    }

    fn owned(&self) -> Box<dyn Fence> {
        Box::new(self.clone())
    }
}

/// What renewals need besides the record and the lease they publish.
pub(super) struct Renewal {
    pub kv: NatsKv,
    pub me: String,
    pub plugins: PluginVersions,
    /// Notified when `plugins` changed: renewed at once.
    pub plugins_changed: Arc<Notify>,
    pub ttl: Duration,
    /// Notified when the roster entry went (removed by the others).
    pub rewrite_roster: Arc<Notify>,
}

/// Renews the member key every third of its TTL (with the plugin versions
/// running then) and says until when this host may act as a member. After
/// a renewal, writes the roster entry when the record changed since it was
/// last written (new plugin versions), when a term starts (the first
/// renewal, or one after the lease ran out) or when asked to: the member
/// key is always written first, so a roster entry never stands without a
/// live key behind it but for a member that died. An entry written in a
/// term is newer than any expiry of the key before it, so a follower that
/// saw the key expire removes only entries of terms that ended, and a host
/// not in the roster holds no claim a live term stands behind.
pub(super) async fn renew(
    renewal: Renewal,
    mut record: MemberRecord,
    lease: watch::Sender<Option<LeaseState>>,
    stop: CancellationToken,
) {
    let Renewal {
        kv,
        me,
        plugins,
        plugins_changed,
        ttl,
        rewrite_roster,
    } = renewal;
    let key = format!("{MEMBERS}{me}");
    let roster = roster_key(&me);
    let period = ttl / 3;
    let mut held: Option<LeaseState> = None;
    // The record the roster entry holds and the term it was written in,
    // as this host last wrote it.
    let mut in_roster: Option<(MemberRecord, u64)> = None;
    loop {
        record.plugins = plugins();
        let value = to_bytes(&record);
        let sent = Instant::now();
        let mut renewed = false;
        // A stop does not wait on a write NATS may never answer (it is down):
        // the key expires on its own, or the leave deletes it.
        let put = tokio::time::timeout(period, kv.put_with_ttl(&key, value.clone(), ttl));
        let Some(written) = stop.run_until_cancelled(put).await else {
            return;
        };
        let mut pause = match written {
            Ok(Ok(_)) => {
                renewed = true;
                // Answered within the lease: the key never expired
                // meanwhile. Answered after it (a freeze, an outage): a
                // new term, and runners of the old one stay fenced.
                let term = match held {
                    Some(state) if Instant::now() < state.until => state.term,
                    Some(state) => state.term + 1,
                    None => 1,
                };
                let state = LeaseState {
                    term,
                    until: sent + ttl.saturating_sub(STEP_DOWN_MARGIN),
                    listed: held.filter(|s| s.term == term).and_then(|s| s.listed),
                };
                held = Some(state);
                lease.send_replace(held);
                period
            }
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "cannot renew the member key");
                RETRY_PAUSE
            }
            Err(_) => {
                tracing::warn!("renewing the member key timed out");
                Duration::ZERO
            }
        };
        let term = held.map_or(0, |s| s.term);
        if renewed && in_roster.as_ref() != Some(&(record.clone(), term)) {
            let entry = tokio::time::timeout(period, kv.put(&roster, value));
            let Some(written) = stop.run_until_cancelled(entry).await else {
                return;
            };
            match written {
                Ok(Ok(revision)) => {
                    in_roster = Some((record.clone(), term));
                    if let Some(state) = held.as_mut().filter(|s| s.listed.is_none()) {
                        state.listed = Some(revision);
                        lease.send_replace(held);
                    }
                }
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, "cannot write the roster entry");
                    pause = RETRY_PAUSE;
                }
                Err(_) => {
                    tracing::warn!("writing the roster entry timed out");
                    pause = Duration::ZERO;
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
            // Written again right after the next renewal.
            _ = rewrite_roster.notified() => in_roster = None,
            // New versions: renewed (and the roster written) now.
            _ = plugins_changed.notified(), if renewed => {}
        }
    }
}
