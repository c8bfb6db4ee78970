//! The objects one unit's sink fills. The rows it delivered, fitted to the
//! sink's format, go into one object per path (`tenant=…/table=…/dt=…`,
//! as the sink names it) until it holds `max_rows` rows or `max_bytes`
//! bytes or is `max_age` old. Then the unit's committer task commits it
//! through the unit's log and tells every batch with rows in it (its
//! [`Waiting`]), so those rows are acked only once their object stands.
//! Objects commit one at a time, in the order they filled.
//!
//! Opening ([`UnitObjects::open`]) takes the unit's log over: a row of an
//! entry written before that comes back is done without a write; the rows
//! of an entry it voided come back and are written afresh.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::config::ObjectsTarget;
use crate::destination::objects::encode::{EncodeError, ObjectWriter, Record};
use crate::destination::objects::log::{Entry, LogError, UnitLog};
use crate::destination::objects::store::Store;
use crate::fence::Fence;

/// One input row the sink delivered: what it added for `path`.
#[derive(Debug)]
pub struct Delivered {
    pub sequence: u64,
    pub path: String,
    pub records: Vec<Record>,
}

/// The rows of one batch in one object, waiting for its commit: the
/// outcome is `None` once the object stands, or why the rows come back.
#[derive(Debug)]
pub struct Waiting {
    /// The object's path (its key is known only once it commits).
    pub path: String,
    pub sequences: Vec<u64>,
    pub outcome: oneshot::Receiver<Option<String>>,
}

/// Why a unit's objects could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

/// A path a sink names for its rows' object: relative, plain segments.
pub fn check_path(path: &str) -> Result<(), String> {
    const MAX_PATH: usize = 512;
    if path.len() > MAX_PATH {
        return Err(format!("a path is at most {MAX_PATH} bytes"));
    }
    for segment in path.split('/') {
        let problem = match segment {
            "" => Some("has an empty segment (a leading, trailing or doubled `/`)"),
            "." | ".." => Some("has a `.` or `..` segment"),
            "_weir" => Some("reaches weir's own log (`_weir`)"),
            _ if segment.chars().any(|c| c.is_control() || c == '\\') => {
                Some("holds a control character or `\\`")
            }
            _ => None,
        };
        if let Some(problem) = problem {
            return Err(format!("path `{path}` {problem}"));
        }
    }
    Ok(())
}

/// The objects a unit's sink fills, and the task committing them.
pub struct UnitObjects {
    shared: Arc<Shared>,
    committer: tokio::task::JoinHandle<()>,
}

struct Shared {
    filling: Mutex<Filling>,
    /// The unit consumer's ack floor as last read (0: not yet): entries
    /// whose rows are all at or below it are pruned from the log.
    ack_floor: std::sync::atomic::AtomicU64,
    /// An object sealed, or one to look at sooner.
    wake: Notify,
    target: Arc<ObjectsTarget>,
}

#[derive(Default)]
struct Filling {
    open: BTreeMap<String, Open>,
    sealed: VecDeque<Open>,
    /// The batches waiting for each object not committed yet, by its id.
    waiters: BTreeMap<u64, Vec<oneshot::Sender<Option<String>>>>,
    /// The rows in an object not committed yet, and that object's id: a
    /// row sent back meanwhile (a later step's write failed) waits for it
    /// when it comes again, rather than go into a second object.
    pending: BTreeMap<u64, u64>,
    /// The rows of every entry standing: done when they come back.
    written: Ranges,
    /// Why the committer stopped: what is added now comes back at once.
    stopped: Option<String>,
    /// Objects opened so far.
    opened: u64,
}

struct Open {
    /// Told apart from the next object of the same path.
    id: u64,
    path: String,
    writer: ObjectWriter,
    sequences: Vec<u64>,
    since: Instant,
}

impl Drop for UnitObjects {
    fn drop(&mut self) {
        self.committer.abort();
    }
}

impl UnitObjects {
    /// Takes over the log of `unit` for sink `sink` as `writer` (host and
    /// claim), while `fence` holds, and starts its committer.
    pub async fn open(
        store: &Store,
        target: Arc<ObjectsTarget>,
        sink: &str,
        unit: &str,
        writer: String,
        fence: Box<dyn Fence>,
    ) -> Result<UnitObjects, OpenError> {
        let (mut log, recovery) = UnitLog::open(store, &target.prefix, sink, unit).await?;
        let empty = ObjectWriter::new(&target.format)?.finish()?;
        let recovery = log.take_over(&writer, recovery, empty, &*fence).await?;
        tracing::info!(
            sink,
            unit,
            written = recovery.written.len(),
            voided = recovery.voided.len(),
            "took the unit's object log over"
        );
        let mut written = Ranges::default();
        for (_, entry) in &recovery.written {
            written.add(entry);
        }
        let shared = Arc::new(Shared {
            filling: Mutex::new(Filling {
                written,
                ..Filling::default()
            }),
            wake: Notify::new(),
            ack_floor: std::sync::atomic::AtomicU64::new(0),
            target,
        });
        let committer = Committer {
            shared: shared.clone(),
            log,
            sink: sink.to_string(),
            unit: unit.to_string(),
            writer,
            fence,
            pruned: Instant::now(),
        };
        Ok(UnitObjects {
            shared,
            committer: tokio::spawn(committer.run_guarded()),
        })
    }

    /// Adds the rows one batch delivered, each into the object of its path
    /// (a row written before is done as it is). What the batch waits for,
    /// per object. `Err`: the rows come back (the unit is no longer this
    /// host's, or an object could not take them), with why.
    pub fn add(&self, delivered: Vec<Delivered>) -> Result<Vec<Waiting>, String> {
        let mut filling = self.shared.lock();
        if let Some(why) = &filling.stopped {
            return Err(why.clone());
        }
        let mut waiting: Vec<Waiting> = Vec::new();
        // This batch's waiter of each object it is in, by the object's id.
        let mut waiting_for: BTreeMap<u64, usize> = BTreeMap::new();
        let (opened_before, mut sealed_any) = (filling.opened, false);
        for row in delivered {
            if row.records.is_empty() || filling.written.holds(row.sequence) {
                continue;
            }
            let id = match filling.pending.get(&row.sequence) {
                Some(&id) => id,
                None => {
                    let target = &self.shared.target;
                    let (id, full) = filling.put(target, row.sequence, &row.path, row.records)?;
                    if full && let Some(full) = filling.open.remove(&row.path) {
                        filling.sealed.push_back(full);
                        sealed_any = true;
                    }
                    id
                }
            };
            match waiting_for.get(&id) {
                Some(&index) => waiting[index].sequences.push(row.sequence),
                None => {
                    let (sender, outcome) = oneshot::channel();
                    filling.waiters.entry(id).or_default().push(sender);
                    waiting_for.insert(id, waiting.len());
                    waiting.push(Waiting {
                        path: row.path,
                        sequences: vec![row.sequence],
                        outcome,
                    });
                }
            }
        }
        // The committer looks again: at a sealed object, or at when a new
        // one comes of age (it may be waiting with no object to age).
        let wake = sealed_any || filling.opened != opened_before;
        drop(filling);
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(waiting)
    }

    /// The unit consumer's ack floor: the log's entries below it may go.
    pub fn set_ack_floor(&self, floor: u64) {
        self.shared
            .ack_floor
            .store(floor, std::sync::atomic::Ordering::Relaxed);
    }

    /// Seals every object being filled, to be committed now (the unit is
    /// released: its rows are settled before it goes).
    pub fn flush(&self) {
        let mut filling = self.shared.lock();
        let open = std::mem::take(&mut filling.open);
        filling.sealed.extend(open.into_values());
        drop(filling);
        self.shared.wake.notify_one();
    }
}

impl Filling {
    /// Puts a row's records into the open object of `path`: its id, and
    /// whether it is full now.
    fn put(
        &mut self,
        target: &ObjectsTarget,
        sequence: u64,
        path: &str,
        records: Vec<Record>,
    ) -> Result<(u64, bool), String> {
        if !self.open.contains_key(path) {
            let writer = ObjectWriter::new(&target.format).map_err(|err| err.to_string())?;
            self.opened += 1;
            let open = Open {
                id: self.opened,
                path: path.to_string(),
                writer,
                sequences: Vec::new(),
                since: Instant::now(),
            };
            self.open.insert(path.to_string(), open);
        }
        let Some(open) = self.open.get_mut(path) else {
            return Err(format!("object `{path}` is not open"));
        };
        for record in records {
            if let Err(err) = open.writer.push(record) {
                let reason = format!("object `{path}`: {err}");
                if let Some(open) = self.open.remove(path) {
                    self.ended(open.id, &open.sequences, None, &Some(reason.clone()));
                }
                return Err(reason);
            }
        }
        open.sequences.push(sequence);
        let (id, rows, bytes) = (open.id, open.writer.rows(), open.writer.bytes());
        self.pending.insert(sequence, id);
        let rolling = target.rolling;
        Ok((id, rows >= rolling.max_rows || bytes >= rolling.max_bytes))
    }

    /// An object's commit ended: its batches are told, its rows are no
    /// longer pending, and they are written if it stands.
    fn ended(
        &mut self,
        id: u64,
        sequences: &[u64],
        entry: Option<&Entry>,
        outcome: &Option<String>,
    ) {
        for sequence in sequences {
            self.pending.remove(sequence);
        }
        if let Some(entry) = entry {
            self.written.add(entry);
        }
        for waiter in self.waiters.remove(&id).unwrap_or_default() {
            // A batch no longer waiting (its unit was fenced) needs no word.
            let _ = waiter.send(outcome.clone());
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Filling> {
        // A panic while filling leaves nothing half-done that matters more
        // than stopping every unit: go on with the data as it is.
        self.filling
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next object to commit: a sealed one, or the oldest open one
    /// past its age (sealed now); else when to look again.
    fn next(&self) -> Result<Open, Option<Instant>> {
        let max_age = self.target.rolling.max_age;
        let mut filling = self.lock();
        if let Some(sealed) = filling.sealed.pop_front() {
            return Ok(sealed);
        }
        let oldest = filling
            .open
            .values()
            .min_by_key(|open| open.since)
            .map(|open| (open.path.clone(), open.since + max_age));
        match oldest {
            Some((path, due)) if due <= Instant::now() => {
                filling.open.remove(&path).ok_or(Some(due))
            }
            Some((_, due)) => Err(Some(due)),
            None => Err(None),
        }
    }

    /// The committer stopped: every row held comes back, and every row
    /// added from now on.
    fn stop(&self, reason: String) {
        let mut filling = self.lock();
        filling.open.clear();
        filling.sealed.clear();
        filling.pending.clear();
        filling.stopped = Some(reason.clone());
        let reason = Some(reason);
        for waiter in std::mem::take(&mut filling.waiters).into_values().flatten() {
            let _ = waiter.send(reason.clone());
        }
    }
}

/// The task committing a unit's objects, one at a time, through its log.
struct Committer {
    shared: Arc<Shared>,
    log: UnitLog,
    sink: String,
    unit: String,
    writer: String,
    fence: Box<dyn Fence>,
    /// When the log was last pruned.
    pruned: Instant,
}

/// How often the committer prunes its log, and how old an entry must be:
/// past S3's 15-minute signature window, so no late write of a pruned
/// number can still land ([`UnitLog::prune`]).
const PRUNE_PERIOD: Duration = Duration::from_secs(60);
const PRUNE_AGE: Duration = Duration::from_secs(20 * 60);

/// How long a commit waits before it is tried again while the store
/// cannot take it: doubling from the first to the last.
const AGAIN_FIRST_PAUSE: Duration = Duration::from_millis(250);
const AGAIN_LAST_PAUSE: Duration = Duration::from_secs(5);

impl Committer {
    /// [`Committer::run`], and if it panics, every row it holds comes
    /// back rather than wait for a commit that will not come.
    async fn run_guarded(self) {
        use futures::FutureExt;
        let shared = self.shared.clone();
        let (sink, unit) = (self.sink.clone(), self.unit.clone());
        if std::panic::AssertUnwindSafe(self.run())
            .catch_unwind()
            .await
            .is_err()
        {
            tracing::error!(%sink, %unit, "the unit's object committer panicked; its rows come back");
            shared.stop(format!(
                "sink `{sink}`: the object committer of unit {unit} stopped"
            ));
        }
    }

    async fn run(mut self) {
        loop {
            self.prune().await;
            let object = match self.shared.next() {
                Ok(object) => object,
                Err(due) => {
                    let wake = self.shared.wake.notified();
                    match due {
                        Some(due) => {
                            tokio::select! {
                                () = wake => {}
                                () = tokio::time::sleep_until(due) => {}
                            }
                        }
                        None => wake.await,
                    }
                    continue;
                }
            };
            if let Err(reason) = self.commit(object).await {
                tracing::warn!(sink = %self.sink, unit = %self.unit, %reason, "objects are no longer committed here");
                return;
            }
        }
    }

    /// Removes the log's settled entries, once a period, while the lease
    /// holds: a takeover then reads only what may still come back.
    async fn prune(&mut self) {
        let floor = self
            .shared
            .ack_floor
            .load(std::sync::atomic::Ordering::Relaxed);
        if floor == 0 || self.pruned.elapsed() < PRUNE_PERIOD || !self.fence.held() {
            return;
        }
        self.pruned = Instant::now();
        match self.log.prune(floor, PRUNE_AGE).await {
            Ok(0) => {}
            Ok(removed) => {
                tracing::debug!(sink = %self.sink, unit = %self.unit, removed, "pruned the unit's object log")
            }
            Err(err) => {
                tracing::warn!(sink = %self.sink, unit = %self.unit, error = %err, "cannot prune the unit's object log")
            }
        }
    }

    /// Commits one object; its rows' batches are told either way. `Err`:
    /// nothing more may be committed (the unit is not this host's).
    async fn commit(&mut self, object: Open) -> Result<(), String> {
        let Open {
            id,
            path,
            writer,
            sequences,
            ..
        } = object;
        let encoded = tokio::task::spawn_blocking(move || writer.finish()).await;
        let failed = match encoded {
            Ok(Ok(data)) => match self.commit_data(&path, &sequences, data).await {
                Ok(entry) => {
                    self.shared
                        .lock()
                        .ended(id, &sequences, Some(&entry), &None);
                    return Ok(());
                }
                Err(reason) => {
                    // Stopped before its batches hear: none adds rows after.
                    self.shared.stop(reason.clone());
                    return Err(reason);
                }
            },
            Ok(Err(err)) => err.to_string(),
            Err(panicked) => panicked.to_string(),
        };
        // Not encoded: its rows come back, and go into another object.
        let reason = Some(format!("object `{path}`: {failed}"));
        self.shared.lock().ended(id, &sequences, None, &reason);
        Ok(())
    }

    /// Commits `data` holding `sequences` under `path`, again and again
    /// while the store cannot take it and the unit is this host's.
    async fn commit_data(
        &mut self,
        path: &str,
        sequences: &[u64],
        data: Bytes,
    ) -> Result<Entry, String> {
        // The number is fixed once: an entry claimed whose object's write
        // failed is written again under the same number, never a second
        // entry of the same rows (its object may have landed unanswered).
        let number = self.log.next();
        let key = object_key(&self.shared.target, path, &self.sink, &self.unit, number);
        let entry = Entry::new(key, sequences, self.writer.clone());
        let mut again = Again::default();
        loop {
            match self.log.claim(number, &entry, &*self.fence).await {
                Ok(None) => break,
                Ok(Some(theirs)) => {
                    return Err(format!(
                        "entry {number} of the unit's object log is {}'s: the unit is not this host's",
                        theirs.writer
                    ));
                }
                Err(err) => again.wait(self, err).await?,
            }
        }
        loop {
            match self.log.write_object(&entry, data.clone()).await {
                Ok(()) => {
                    again.done(self);
                    return Ok(entry);
                }
                Err(err) => again.wait(self, err).await?,
            }
        }
    }
}

/// The pauses of a commit the store cannot take now: doubling, said once.
#[derive(Default)]
struct Again {
    pause: Option<Duration>,
}

impl Again {
    /// Waits before the next try, or gives up: the unit is not this
    /// host's, or a newer owner voided the object.
    async fn wait(&mut self, committer: &Committer, err: LogError) -> Result<(), String> {
        if matches!(err, LogError::Fenced(_) | LogError::Voided { .. }) {
            return Err(err.to_string());
        }
        let pause = match self.pause {
            None => {
                tracing::warn!(sink = %committer.sink, unit = %committer.unit, error = %err, "cannot commit an object; its rows wait and it is tried again");
                AGAIN_FIRST_PAUSE
            }
            Some(pause) => (pause * 2).min(AGAIN_LAST_PAUSE),
        };
        self.pause = Some(pause);
        tokio::time::sleep(pause).await;
        if !committer.fence.held() {
            return Err(format!(
                "the unit is not this host's (the last commit failed: {err})"
            ));
        }
        Ok(())
    }

    fn done(&self, committer: &Committer) {
        if self.pause.is_some() {
            tracing::info!(sink = %committer.sink, unit = %committer.unit, "the object store takes commits again");
        }
    }
}

/// An object's key: `<prefix>/<path>/<sink>-<unit>-<number>.<extension>`,
/// its number the log entry's, so no two commits share one.
fn object_key(target: &ObjectsTarget, path: &str, sink: &str, unit: &str, number: u64) -> String {
    let name = format!("{sink}-{unit}-{number:020}.{}", target.format.extension());
    match target.prefix.trim_end_matches('/') {
        "" => format!("{path}/{name}"),
        prefix => format!("{prefix}/{path}/{name}"),
    }
}

/// Stream sequences as disjoint inclusive ranges (first → last).
#[derive(Debug, Default)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    fn holds(&self, seq: u64) -> bool {
        self.0
            .range(..=seq)
            .next_back()
            .is_some_and(|(_, last)| *last >= seq)
    }

    /// Adds an entry's rows, merging ranges that touch.
    fn add(&mut self, entry: &Entry) {
        for &[first, last] in &entry.sequences {
            let (mut first, mut last) = (first, last);
            if let Some((&before, &end)) = self.0.range(..=first).next_back()
                && end.saturating_add(1) >= first
            {
                first = before;
                last = last.max(end);
            }
            let after: Vec<(u64, u64)> = self
                .0
                .range(first..=last.saturating_add(1))
                .map(|(a, b)| (*a, *b))
                .collect();
            for (start, end) in after {
                self.0.remove(&start);
                last = last.max(end);
            }
            self.0.insert(first, last);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_answer_membership() {
        let mut ranges = Ranges::default();
        ranges.add(&Entry::new(String::new(), &[5, 6, 7, 20], String::new()));
        ranges.add(&Entry::new(String::new(), &[8, 9, 19], String::new()));
        ranges.add(&Entry::new(String::new(), &[1], String::new()));
        assert_eq!(
            ranges.0.iter().map(|(a, b)| (*a, *b)).collect::<Vec<_>>(),
            [(1, 1), (5, 9), (19, 20)]
        );
        for (seq, held) in [
            (0, false),
            (1, true),
            (2, false),
            (5, true),
            (9, true),
            (10, false),
            (19, true),
            (21, false),
        ] {
            assert_eq!(ranges.holds(seq), held, "{seq}");
        }
    }

    #[test]
    fn paths_are_relative_plain_segments() {
        assert!(check_path("tenant=acme/table=orders/dt=2026-12-07").is_ok());
        for bad in [
            "", "/abs", "a//b", "a/", "a/../b", "./a", "_weir/x", "a\\b", "a\nb",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
    }
}
