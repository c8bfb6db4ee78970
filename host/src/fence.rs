//! What the row path below the worker sees of its unit's lease: whether
//! it still holds, and the claim it was taken under. Coordination's
//! `Lease` implements [`Fence`]; pipelines, destinations and state take a
//! `&dyn Fence`, so none of them (nor the sandbox, which imports
//! destinations and state) reaches coordination or NATS through it.
//! Imports nothing of the crate.

/// The lease a unit's rows are delivered under (see the module).
pub trait Fence: Send + Sync {
    /// Whether the unit is still this host's to deliver. Read right before
    /// anything the world sees (a sink call, a commit, a write, an answer).
    fn held(&self) -> bool;
    /// The revision of the claim the unit was taken under: a later claim,
    /// by anyone, is higher, so a destination refuses an old owner's
    /// commit by it (0: no claim, tools).
    fn claim(&self) -> u64;
    /// The same lease, owned: what a task outliving the call holds (a
    /// destination's committer), seeing it run out as the caller does.
    fn owned(&self) -> Box<dyn Fence>;
}

/// The lease ran out: nothing more of the batch in hand may be delivered
/// or answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the lease ran out")]
pub struct Fenced;
