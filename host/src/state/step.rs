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

use tokio::task::JoinHandle;

use crate::fence::{Fence, Fenced};
use crate::state::batch::BatchState;
use crate::state::landing::{self, Landing};
use crate::state::scope::{Changes, Limits, Overlay, Settled};
use crate::state::store::{ScopeStore, StoreError, Stored, UnitState, Write, scope_key};
use crate::telemetry::{Metrics, PluginLabels};
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
    /// This batch's scopes.
    scopes: Vec<BatchScope>,
    /// This batch: each input row's scope (in `scopes`) and sequence.
    row_scopes: Vec<usize>,
    sequences: Vec<u64>,
    /// The scopes the call got (in `scopes`), in its overlays' order.
    given: Vec<Option<usize>>,
    /// The call's overlays, named by their keys, for the write.
    runs: Vec<ScopeRun>,
    /// Whether a commit returns before its writes landed (the unit
    /// worker's, which answers their rows once the batch's [`Landing`]
    /// landed).
    overlap: bool,
    /// Writes sent and not yet answered, all from one commit: the next
    /// commit waits for them (its compare-and-set needs their revisions),
    /// so a batch's writes travel while the next batch runs.
    in_flight: Vec<InFlight>,
    /// The same writes' outcomes, for whoever answers their rows
    /// ([`StateStep::take_landing`]).
    landing: Landing,
}

/// One scope's write on its way.
struct InFlight {
    key: String,
    write: Write,
    landed: JoinHandle<Result<u64, StoreError>>,
}

/// One scope of a batch: its (tenant, table), so that a row finds it
/// without formatting a key, and its key.
struct BatchScope {
    tenant: String,
    table: String,
    key: String,
}

/// What a stateful run keeps between the plugin's call and the write.
struct ScopeRun {
    /// In `StateStep::scopes`; `None`: the call got a row of no input row.
    scope: Option<usize>,
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
            scopes: Vec::new(),
            row_scopes: Vec::new(),
            sequences: Vec::new(),
            given: Vec::new(),
            runs: Vec::new(),
            overlap: false,
            in_flight: Vec::new(),
            landing: Landing::default(),
        }
    }

    /// Commits return with their writes on their way; their rows are to
    /// be answered once the batch's [`Landing`] landed.
    pub fn overlap_writes(&mut self) {
        self.overlap = true;
    }

    /// The writes sent by the last commit (overlapped), to be waited for
    /// before their rows are answered: a failed one sends its rows back.
    pub fn take_landing(&mut self) -> Landing {
        std::mem::take(&mut self.landing)
    }

    /// Waits for every write on its way; the keys whose write failed, with
    /// why (their scopes left the cache: read again before the next run).
    /// Their rows come back through their batch's [`Landing`].
    async fn land_all(&mut self) -> Vec<(String, String)> {
        let mut failed_keys = Vec::new();
        for flight in std::mem::take(&mut self.in_flight) {
            let landed = match flight.landed.await {
                Ok(landed) => landed,
                Err(join) => Err(StoreError::Unanswered {
                    key: flight.key.clone(),
                    reason: join.to_string(),
                }),
            };
            if let Some(reason) = self.landed(&flight.key, &flight.write, landed) {
                failed_keys.push((flight.key, reason));
            }
        }
        failed_keys
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
        self.scopes.clear();
        self.row_scopes.clear();
        self.sequences.clear();
        self.given.clear();
        self.runs.clear();
        // A batch's rows mostly share one scope: a key is formatted once
        // per scope, not per row (it was six allocations a row).
        let mut last: Option<(&str, &str, usize)> = None;
        for (tenant, table, sequence) in rows {
            let scope = match last {
                Some((t, b, scope)) if t == tenant && b == table => scope,
                _ => {
                    let scope = self.scope_of(tenant, table);
                    last = Some((tenant, table, scope));
                    scope
                }
            };
            self.row_scopes.push(scope);
            self.sequences.push(sequence);
        }
        self.load_scopes().await?;
        let mut settled: Vec<Option<Settled>> = self.settled_rows().collect();
        // A row settled by a write still on its way (a row redelivered
        // meanwhile) waits for it: if it failed, the row runs again.
        if !self.in_flight.is_empty() && settled.iter().any(Option::is_some) {
            self.land_all().await;
            self.load_scopes().await?;
            settled = self.settled_rows().collect();
        }
        let again = settled.iter().filter(|settled| settled.is_some()).count();
        if again > 0 {
            let labels = PluginLabels {
                plugin: self.plugin.clone(),
            };
            self.metrics
                .state_rows_settled_again
                .get_or_create(&labels)
                .inc_by(again as u64);
        }
        Ok(settled)
    }

    /// The index in `scopes` of (`tenant`, `table`)'s scope, added if new.
    fn scope_of(&mut self, tenant: &str, table: &str) -> usize {
        if let Some(scope) = self
            .scopes
            .iter()
            .position(|scope| scope.tenant == tenant && scope.table == table)
        {
            return scope;
        }
        self.scopes.push(BatchScope {
            tenant: tenant.to_string(),
            table: table.to_string(),
            key: scope_key(tenant, &self.plugin, table, self.unit),
        });
        self.scopes.len() - 1
    }

    /// Reads every scope of the batch's rows not held yet.
    async fn load_scopes(&mut self) -> Result<(), Unreadable> {
        for BatchScope { key, .. } in &self.scopes {
            if !self.cache.contains_key(key) {
                let stored = self.store.load(key).await.map_err(|source| Unreadable {
                    plugin: self.plugin.clone(),
                    source,
                })?;
                self.cache.insert(key.clone(), stored);
            }
        }
        Ok(())
    }

    /// Per input row, whether its scope settled it before.
    fn settled_rows(&self) -> impl Iterator<Item = Option<Settled>> + '_ {
        let stored: Vec<Option<&Stored>> = self
            .scopes
            .iter()
            .map(|scope| self.cache.get(&scope.key))
            .collect();
        self.row_scopes
            .iter()
            .zip(&self.sequences)
            .map(move |(&scope, &sequence)| {
                stored
                    .get(scope)
                    .copied()
                    .flatten()
                    .and_then(|stored| stored.scope.settled(sequence))
            })
    }

    /// The input rows of the scope whose key is `key`.
    fn rows_of_key(&self, key: &str) -> Vec<usize> {
        match self.scopes.iter().position(|scope| scope.key == key) {
            Some(scope) => self.rows_of(Some(scope)),
            None => Vec::new(),
        }
    }

    /// The input rows of `scope` (in `scopes`).
    fn rows_of(&self, scope: Option<usize>) -> Vec<usize> {
        (0..self.row_scopes.len())
            .filter(|&row| Some(self.row_scopes[row]) == scope)
            .collect()
    }

    /// For the plugin's call: one overlay per scope of the rows it gets
    /// (`origins`: each one's input row) and each row's overlay.
    pub fn give(&mut self, origins: &[usize]) -> BatchState {
        self.given.clear();
        let mut row_scopes = Vec::with_capacity(origins.len());
        for &origin in origins {
            let scope = self.row_scopes.get(origin).copied();
            let index = match self.given.iter().position(|&given| given == scope) {
                Some(index) => index,
                None => {
                    self.given.push(scope);
                    self.given.len() - 1
                }
            };
            row_scopes.push(index);
        }
        let overlays = self
            .given
            .iter()
            .map(|&scope| {
                let base = scope
                    .and_then(|scope| self.scopes.get(scope))
                    .and_then(|scope| self.cache.get(&scope.key))
                    .map(|stored| Arc::clone(&stored.scope))
                    .unwrap_or_default();
                Overlay::new(base, self.limits)
            })
            .collect();
        BatchState::new(overlays, row_scopes)
    }

    /// After the call: its overlays, named by the scopes [`StateStep::give`] gave.
    pub fn took(&mut self, state: Option<BatchState>) {
        let given = std::mem::take(&mut self.given);
        self.runs = match state {
            Some(state) => given
                .into_iter()
                .zip(state.into_overlays())
                .map(|(scope, overlay)| ScopeRun { scope, overlay })
                .collect(),
            None => Vec::new(),
        };
    }

    /// Sends the write of each scope the call wrote whose rows are all
    /// settled (`ends`, per input row); the rows are answered only once it
    /// landed ([`StateStep::take_landing`]), and meanwhile the next batch
    /// runs on the scope as written. A scope with a row to retry keeps its
    /// old state and all its rows come back. First the writes of the last
    /// commit land: a scope whose write failed comes back with all its
    /// rows, the last commit's (through its landing) and this one's,
    /// which ran on what was never stored. Nothing is written once `lease`
    /// no longer holds. A write someone else made since this runner read
    /// the scope (a host that owned the unit before, woken past its lease)
    /// sends the rows back to run again on what is stored now. Returns the
    /// rows to retry, with why.
    pub async fn commit(
        &mut self,
        ends: &[RowEnd],
        lease: &dyn Fence,
    ) -> Result<Vec<(usize, String)>, Fenced> {
        let mut retries = Vec::new();
        let failed_before = self.land_all().await;
        self.retry_rows_of(&failed_before, &mut retries);
        for run in std::mem::take(&mut self.runs) {
            let Some(key) = run
                .scope
                .and_then(|scope| self.scopes.get(scope))
                .map(|scope| scope.key.clone())
            else {
                continue;
            };
            if !run.overlay.changed() || failed_before.iter().any(|(failed, _)| *failed == key) {
                continue;
            }
            let rows = self.rows_of(run.scope);
            let end = |row: usize| ends.get(row).copied().unwrap_or(RowEnd::Retried);
            if rows.iter().any(|&row| end(row) == RowEnd::Retried) {
                let reason = format!(
                    "a row of its state scope was retried: plugin `{}`'s writes wait for all of them",
                    self.plugin
                );
                retries.extend(rows.into_iter().map(|row| (row, reason.clone())));
                continue;
            }
            if !lease.held() {
                return Err(Fenced);
            }
            let (dead, applied): (Vec<usize>, Vec<usize>) = rows
                .iter()
                .partition(|&&row| end(row) == RowEnd::DeadLettered);
            let changes = run.overlay.commit(
                applied.into_iter().map(|row| self.sequences[row]),
                dead.into_iter().map(|row| self.sequences[row]),
                self.ack_floor,
            );
            let sequences = rows.iter().map(|&row| self.sequences[row]).collect();
            self.send(key, changes, sequences);
        }
        if !self.overlap {
            let failed = self.land_all().await;
            // This run's own rows: answered by the retries returned.
            self.landing = Landing::default();
            self.retry_rows_of(&failed, &mut retries);
        }
        Ok(retries)
    }

    /// The rows of this run in the scopes of `failed` (keys, with why):
    /// they ran on what was never stored, or their write failed.
    fn retry_rows_of(&self, failed: &[(String, String)], retries: &mut Vec<(usize, String)>) {
        for (key, reason) in failed {
            let rows = self.rows_of_key(key);
            retries.extend(rows.into_iter().map(|row| (row, reason.clone())));
        }
    }

    /// Applies one scope's changes to the cached scope (the next batch
    /// reads them) and sends their write over what was read.
    fn send(&mut self, key: String, changes: Changes, sequences: Vec<u64>) {
        let stored = self.cache.entry(key.clone()).or_default();
        let write = self.store.prepare(stored, changes);
        let (store, sent_key, sent) = (self.store.clone(), key.clone(), write.clone());
        let outcome = self.landing.add(&key, &self.plugin, sequences);
        let (plugin, writes) = (self.plugin.clone(), self.metrics.state_writes.clone());
        let landed = tokio::spawn(async move {
            let landed = store.send(&sent_key, &sent).await;
            landing::tell(outcome, &writes, &plugin, &landed);
            landed
        });
        self.in_flight.push(InFlight { key, write, landed });
    }

    /// One scope's write answered: why its rows come back if it failed
    /// (the scope leaves the cache, to be read again).
    fn landed(
        &mut self,
        key: &str,
        write: &Write,
        landed: Result<u64, StoreError>,
    ) -> Option<String> {
        let reason = landing::failure(&self.plugin, &landed);
        match landed {
            Ok(revision) => {
                if let Some(stored) = self.cache.get_mut(key) {
                    stored.landed(write, revision);
                }
            }
            Err(_) => {
                self.cache.remove(key);
            }
        }
        reason
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nats::kv::{KvWrite, MemoryKv};
    use crate::state::scope::Limits;
    use crate::state::store::StateStore;

    const LIMITS: Limits = Limits {
        max_keys: 10,
        max_bytes: 1000,
    };

    /// A lease that always holds: these tests are about the writes.
    struct Held;

    impl Fence for Held {
        fn held(&self) -> bool {
            true
        }

        fn claim(&self) -> u64 {
            0
        }

        fn owned(&self) -> Box<dyn Fence> {
            Box::new(Held)
        }
    }

    fn step() -> StateStep {
        step_on(MemoryKv::new())
    }

    fn step_on(kv: MemoryKv) -> StateStep {
        let state = UnitState {
            store: ScopeStore::Memory(StateStore::new(kv)),
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
        step.commit(ends, &Held).await.unwrap()
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

    /// One call of rows `sequences` of one scope, each adding 1 to `count`.
    async fn count(step: &mut StateStep, sequences: &[u64]) -> Vec<(usize, String)> {
        let settled = step
            .begin(
                sequences
                    .iter()
                    .map(|&sequence| ("acme", "events", sequence)),
            )
            .await
            .unwrap();
        assert!(settled.iter().all(Option::is_none), "{settled:?}");
        let origins: Vec<usize> = (0..sequences.len()).collect();
        let mut state = step.give(&origins);
        for row in 0..sequences.len() as u32 {
            let scope = state.scope_of(row).unwrap();
            let count = scope.get(b"count").map_or(0, |v| v[0]);
            scope.set(b"count".to_vec(), vec![count + 1]).unwrap();
        }
        step.took(Some(state));
        let ends = vec![RowEnd::Applied; sequences.len()];
        step.commit(&ends, &Held).await.unwrap()
    }

    #[tokio::test]
    async fn an_overlapped_write_lands_before_its_rows_are_answered_and_a_fenced_one_sends_back_both_batches()
     {
        let kv = MemoryKv::new();
        let mut step = step_on(kv.clone());
        step.overlap_writes();
        assert!(count(&mut step, &[1, 2]).await.is_empty());
        let first = step.take_landing();
        assert!(!first.is_empty(), "the first batch's write is on its way");
        // The next batch runs on the first's count while its write travels.
        assert!(count(&mut step, &[3]).await.is_empty());
        let second = step.take_landing();
        assert!(first.landed().await.is_empty());
        let failed = second.landed().await;
        assert!(failed.is_empty(), "{failed:?}");
        let unit = Unit {
            partition: 0,
            shard: 0,
        };
        let key = scope_key("acme", "window", "events", unit);
        let stored = StateStore::new(kv.clone()).load(&key).await.unwrap();
        assert_eq!(stored.scope.get(b"count"), Some(&[3][..]));

        // Another owner writes; this host's next write is fenced, but only
        // found so when the batch after it commits: both come back.
        assert!(count(&mut step, &[4]).await.is_empty());
        let fenced = step.take_landing();
        kv.put(&key, bytes::Bytes::from_static(b"\x01"))
            .await
            .unwrap();
        let retried = count(&mut step, &[5, 6]).await;
        assert_eq!(
            retried.iter().map(|(row, _)| *row).collect::<Vec<_>>(),
            [0, 1],
            "the batch run on the unstored count comes back"
        );
        assert!(step.take_landing().is_empty(), "nothing written on it");
        let failed = fenced.landed().await;
        assert_eq!(
            failed
                .iter()
                .map(|(sequence, _)| *sequence)
                .collect::<Vec<_>>(),
            [4],
            "the fenced batch's row comes back"
        );
        assert!(failed[0].1.contains("another host"), "{failed:?}");
    }
}
