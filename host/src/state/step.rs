//! The stateful step: what wraps the call of the one plugin of a pipeline
//! granted `state`. Before the batch enters the pipeline it reads each
//! row's scope (once per runner) and says which rows the scope already
//! settled; around the plugin's call it hands over one overlay per scope;
//! once every row has its verdict it writes each scope the call changed
//! whose rows all finished. The pipeline (`delivery::pipeline`) runs it
//! in place of a bare plugin step; the types here are its own, so state
//! knows nothing of delivery.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::coordination::Lease;
use crate::state::batch::BatchState;
use crate::state::scope::{Changes, Limits, Overlay, Settled};
use crate::state::store::{ScopeStore, StoreError, Stored, UnitState, scope_key};
use crate::telemetry::{Metrics, PluginLabels, StateWriteLabels};
use crate::topology::route::Unit;

/// How soon rows come back when their state could not be read or written.
pub const STATE_RETRY: Duration = Duration::from_secs(1);

/// The scopes of a batch could not be read: every row comes back.
#[derive(Debug, thiserror::Error)]
#[error("the state of plugin `{plugin}`: {source}")]
pub struct Unreadable {
    pub plugin: String,
    pub source: StoreError,
}

/// The lease ran out before a scope was written: nothing of the batch may
/// be delivered.
#[derive(Debug, thiserror::Error)]
#[error("the lease ran out before the state was written")]
pub struct LeaseLost;

/// How an input row ended, for its scope's write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowEnd {
    /// Delivered or dropped: its scope may be written with it applied.
    Applied,
    DeadLettered,
    /// Its scope keeps its old state: all its rows come back.
    Retried,
}

/// The state of the pipeline's plugin granted `state` (at most one), and
/// its scopes as this runner last read or wrote them.
pub struct StateStep {
    plugin: String,
    limits: Limits,
    store: ScopeStore,
    /// The unit whose rows this runner runs: part of every scope's key.
    unit: Unit,
    metrics: Metrics,
    /// Scopes by key: the runner runs under one owner of the unit, whose
    /// writes are the only ones.
    cache: HashMap<String, Stored>,
    /// The unit consumer's ack floor as last read: applied sequences at or
    /// below it are dropped from a scope as it is written.
    ack_floor: u64,
    /// This batch: each input row's scope key and sequence.
    keys: Vec<String>,
    sequences: Vec<u64>,
    /// The scopes' keys the call got, in its overlays' order.
    given: Vec<String>,
    /// The call's overlays, named by their keys, for the write.
    runs: Vec<ScopeRun>,
}

/// What a stateful run keeps between the plugin's call and the write.
struct ScopeRun {
    key: String,
    overlay: Overlay,
}

impl StateStep {
    pub fn new(plugin: &str, limits: Limits, state: UnitState) -> StateStep {
        StateStep {
            plugin: plugin.to_string(),
            limits,
            store: state.store,
            unit: state.unit,
            metrics: state.metrics,
            cache: HashMap::new(),
            ack_floor: 0,
            keys: Vec::new(),
            sequences: Vec::new(),
            given: Vec::new(),
            runs: Vec::new(),
        }
    }

    pub fn plugin(&self) -> &str {
        &self.plugin
    }

    /// The unit consumer's ack floor: what the scopes may forget.
    pub fn set_ack_floor(&mut self, floor: u64) {
        self.ack_floor = self.ack_floor.max(floor);
    }

    /// Rows whose acks the server applied: they never come back, so the
    /// scopes held need not remember them.
    pub fn forget_applied(&mut self, sequences: &[u64]) {
        for stored in self.cache.values_mut() {
            if stored.scope.settled_count() > 0 {
                Arc::make_mut(&mut stored.scope).forget(sequences);
            }
        }
    }

    /// Before a batch enters the pipeline: reads every scope of its rows
    /// (`tenant`, `table`, `sequence` of each) not held yet, and says per
    /// row whether its scope settled it before (its answer was lost).
    pub async fn begin<'a>(
        &mut self,
        rows: impl Iterator<Item = (&'a str, &'a str, u64)>,
    ) -> Result<Vec<Option<Settled>>, Unreadable> {
        self.keys.clear();
        self.sequences.clear();
        self.given.clear();
        self.runs.clear();
        for (tenant, table, sequence) in rows {
            self.keys
                .push(scope_key(tenant, &self.plugin, table, self.unit));
            self.sequences.push(sequence);
        }
        for key in &self.keys {
            if !self.cache.contains_key(key) {
                let stored = self.store.load(key).await.map_err(|source| Unreadable {
                    plugin: self.plugin.clone(),
                    source,
                })?;
                self.cache.insert(key.clone(), stored);
            }
        }
        let labels = PluginLabels {
            plugin: self.plugin.clone(),
        };
        let settled_again = self.metrics.state_rows_settled_again.get_or_create(&labels);
        let settled = self
            .keys
            .iter()
            .zip(&self.sequences)
            .map(|(key, &sequence)| {
                let settled = self
                    .cache
                    .get(key)
                    .and_then(|stored| stored.scope.settled(sequence));
                if settled.is_some() {
                    settled_again.inc();
                }
                settled
            })
            .collect();
        Ok(settled)
    }

    /// For the plugin's call: one overlay per scope of the rows it gets
    /// (`origins`: each one's input row) and each row's overlay.
    pub fn give(&mut self, origins: &[usize]) -> BatchState {
        self.given.clear();
        let mut row_scopes = Vec::with_capacity(origins.len());
        for &origin in origins {
            let key = self.keys.get(origin).map_or("", String::as_str);
            let index = match self.given.iter().position(|k| k == key) {
                Some(index) => index,
                None => {
                    self.given.push(key.to_string());
                    self.given.len() - 1
                }
            };
            row_scopes.push(index);
        }
        let overlays = self
            .given
            .iter()
            .map(|key| {
                let base = self
                    .cache
                    .get(key)
                    .map(|stored| Arc::clone(&stored.scope))
                    .unwrap_or_default();
                Overlay::new(base, self.limits)
            })
            .collect();
        BatchState::new(overlays, row_scopes)
    }

    /// After the call: its overlays, named by the keys [`StateStep::give`] gave.
    pub fn took(&mut self, state: Option<BatchState>) {
        let keys = std::mem::take(&mut self.given);
        self.runs = match state {
            Some(state) => keys
                .into_iter()
                .zip(state.into_overlays())
                .map(|(key, overlay)| ScopeRun { key, overlay })
                .collect(),
            None => Vec::new(),
        };
    }

    /// Stores each scope the call wrote whose rows are all settled (`ends`,
    /// per input row), before they are answered; a scope with a row to
    /// retry keeps its old state and all its rows come back. Nothing is
    /// written once `lease` no longer holds. A write someone else made
    /// since this runner read the scope (a host that owned the unit
    /// before, woken past its lease) sends the rows back to run again on
    /// what is stored now. Returns the rows to retry, with why.
    pub async fn commit(
        &mut self,
        ends: &[RowEnd],
        lease: &Lease,
    ) -> Result<Vec<(usize, String)>, LeaseLost> {
        let mut retries = Vec::new();
        for run in std::mem::take(&mut self.runs) {
            if !run.overlay.changed() {
                continue;
            }
            let rows: Vec<usize> = (0..self.keys.len())
                .filter(|&row| self.keys[row] == run.key)
                .collect();
            let end = |row: usize| ends.get(row).copied().unwrap_or(RowEnd::Retried);
            let failure = if rows.iter().any(|&row| end(row) == RowEnd::Retried) {
                Some(format!(
                    "a row of its state scope was retried: plugin `{}`'s writes wait for all of them",
                    self.plugin
                ))
            } else {
                if !lease.held() {
                    return Err(LeaseLost);
                }
                let (dead, applied): (Vec<usize>, Vec<usize>) = rows
                    .iter()
                    .partition(|&&row| end(row) == RowEnd::DeadLettered);
                let next = run.overlay.commit(
                    applied.into_iter().map(|row| self.sequences[row]),
                    dead.into_iter().map(|row| self.sequences[row]),
                    self.ack_floor,
                );
                self.write(&run.key, next).await
            };
            if let Some(reason) = failure {
                retries.extend(rows.into_iter().map(|row| (row, reason.clone())));
            }
        }
        Ok(retries)
    }

    /// Writes one scope's changes over what was read; why its rows come
    /// back if not. The scope leaves the cache meanwhile (so it is changed
    /// in place, not copied) and comes back only if the write landed.
    async fn write(&mut self, key: &str, changes: Changes) -> Option<String> {
        let read = self.cache.remove(key).unwrap_or_default();
        let written = self.store.commit(key, read, changes).await;
        let result = match &written {
            Ok(_) => "stored",
            Err(StoreError::Fenced { .. }) => "conflict",
            Err(StoreError::Purged { .. }) => "purged",
            Err(_) => "failed",
        };
        let labels = StateWriteLabels {
            plugin: self.plugin.clone(),
            result,
        };
        self.metrics.state_writes.get_or_create(&labels).inc();
        match written {
            Ok(stored) => {
                self.cache.insert(key.to_string(), stored);
                None
            }
            Err(err @ StoreError::Fenced { .. }) => {
                self.cache.remove(key);
                Some(format!("plugin `{}`: {err}; read again", self.plugin))
            }
            // `weir state purge`: the rows run again on empty state.
            Err(err @ StoreError::Purged { .. }) => {
                self.cache.remove(key);
                Some(format!("plugin `{}`: {err}", self.plugin))
            }
            Err(err) => {
                self.cache.remove(key);
                Some(format!("the state of plugin `{}`: {err}", self.plugin))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::scope::Limits;

    const LIMITS: Limits = Limits {
        max_keys: 10,
        max_bytes: 1000,
    };

    fn step() -> StateStep {
        let state = UnitState {
            store: ScopeStore::in_memory(),
            unit: Unit {
                partition: 0,
                shard: 0,
            },
            metrics: Metrics::default(),
        };
        StateStep::new("window", LIMITS, state)
    }

    /// One call writing `count` for rows 1 and 2 of one scope, ending `ends`.
    async fn run(step: &mut StateStep, ends: &[RowEnd]) -> Vec<(usize, String)> {
        let rows = [("acme", "events", 1), ("acme", "events", 2)];
        let settled = step.begin(rows.into_iter()).await.unwrap();
        assert_eq!(settled, [None, None]);
        let mut state = step.give(&[0, 1]);
        state.scope_of(0).unwrap().set(b"count", b"2").unwrap();
        step.took(Some(state));
        let lease = Lease::until(tokio::time::Instant::now() + Duration::from_secs(60));
        step.commit(ends, &lease).await.unwrap()
    }

    #[tokio::test]
    async fn a_scope_is_written_once_its_rows_are_settled_and_kept_while_one_is_retried() {
        let mut step = step();
        let retried = run(&mut step, &[RowEnd::Applied, RowEnd::Retried]).await;
        assert_eq!(
            retried.iter().map(|(row, _)| *row).collect::<Vec<_>>(),
            [0, 1]
        );
        let written = run(&mut step, &[RowEnd::Applied, RowEnd::DeadLettered]).await;
        assert!(written.is_empty(), "{written:?}");
        // The rows came back after their answer was lost: settled before.
        let again = [("acme", "events", 1), ("acme", "events", 2)];
        let settled = step.begin(again.into_iter()).await.unwrap();
        assert_eq!(
            settled,
            [Some(Settled::Applied), Some(Settled::DeadLettered)]
        );
    }
}
