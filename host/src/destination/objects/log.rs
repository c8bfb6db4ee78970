//! A unit's commit log in the store, which makes "every row in exactly one
//! visible object" hold across owners of the unit.
//!
//! A sink's objects from one unit are committed one at a time, each as a
//! numbered entry `<prefix>/_weir/<sink>/<unit>/<number>.json` written
//! create-only (`If-None-Match: *`): the entry names the object's key and
//! the stream sequences of its rows, and the object is written (create-only
//! too) only after its entry. An entry is the commit; the object is its
//! content. Rows are acked only once their object stands.
//!
//! A new owner reads the log, then takes it over before it commits
//! anything ([`UnitLog::take_over`]): it writes a marker at the next
//! number, so an earlier owner woken past its lease (it checked its lease,
//! froze, and sends its write late) cannot add an entry after it; and it
//! voids every entry whose object is missing (its writer died, or is
//! frozen, between the two writes) by writing an empty object under that
//! key, marked void, so the late object can never appear. A void entry's
//! rows, all still unacked, are delivered afresh.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};

use crate::destination::objects::store::{Standing, Store, StoreError};
use crate::fence::{Fence, Fenced};

/// The entries' folder under a sink's prefix.
const LOG_DIR: &str = "_weir";
/// Digits of an entry's number: its name sorts as its number.
const NUMBER_WIDTH: usize = 20;

/// One commit: the object and the rows it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The object's key in the bucket.
    pub object: String,
    /// The stream sequences of its rows, as inclusive ranges, ascending.
    pub sequences: Vec<[u64; 2]>,
    /// Who wrote the entry (host and claim): tells a writer its own entry
    /// from another's when a write's answer was lost.
    pub writer: String,
}

impl Entry {
    /// The entry of `object` holding rows `sequences` (any order).
    pub fn new(object: String, sequences: &[u64], writer: String) -> Entry {
        let mut sorted = sequences.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut ranges: Vec<[u64; 2]> = Vec::new();
        for seq in sorted {
            match ranges.last_mut() {
                Some(range) if range[1] + 1 == seq => range[1] = seq,
                _ => ranges.push([seq, seq]),
            }
        }
        Entry {
            object,
            sequences: ranges,
            writer,
        }
    }

    /// Whether the row of stream sequence `seq` is in the object.
    pub fn holds(&self, seq: u64) -> bool {
        self.sequences
            .binary_search_by(|[first, last]| {
                if *last < seq {
                    std::cmp::Ordering::Less
                } else if *first > seq {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .is_ok()
    }

    /// Every stream sequence of its rows, ascending.
    pub fn rows(&self) -> impl Iterator<Item = u64> + '_ {
        self.sequences
            .iter()
            .flat_map(|[first, last]| *first..=*last)
    }

    /// A new owner's marker ([`UnitLog::take_over`]): no object, no rows.
    pub fn is_marker(&self) -> bool {
        self.object.is_empty()
    }

    /// The highest sequence it holds.
    fn last(&self) -> u64 {
        self.sequences.last().map_or(0, |range| range[1])
    }
}

/// What the earlier owners of a unit left in the log.
#[derive(Debug, Default)]
pub struct Recovery {
    /// Entries whose object stands: their rows are delivered (acked again,
    /// with no write, when they come back).
    pub written: Vec<(u64, Entry)>,
    /// Entries whose object is missing: voided at take-over.
    pub unwritten: Vec<(u64, Entry)>,
    /// Entries voided: their rows are in no object.
    pub voided: Vec<(u64, Entry)>,
}

/// How a commit ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Committed {
    /// The entry is number `0` and its object stands.
    Written(u64),
    /// Number `number` is another writer's (an earlier owner, woken late):
    /// its entry says which rows it holds. Nothing of this commit was
    /// written; the next number is free for it.
    Taken { number: u64, entry: Entry },
}

/// Why a commit did not end.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("entry `{key}` of the commit log is not one weir wrote: {reason}")]
    Entry { key: String, reason: String },
    #[error(transparent)]
    Fenced(#[from] Fenced),
    #[error(
        "object `{key}` was voided by the unit's next owner before it was written: its rows are delivered afresh there"
    )]
    Voided { key: String },
}

/// What the log's owner keeps of an entry: its last row, and when it was
/// written (as the store listed it, or as this owner wrote it).
#[derive(Debug, Clone, Copy)]
struct Known {
    last: u64,
    written: std::time::SystemTime,
}

/// One unit's log, as its owner keeps it: the next number, and the last
/// row of each entry it knows (what `prune` removes).
#[derive(Debug)]
pub struct UnitLog {
    store: Store,
    dir: Path,
    next: u64,
    known: BTreeMap<u64, Known>,
}

impl UnitLog {
    /// Reads the log of `unit` for sink `sink` under `prefix`: what earlier
    /// owners committed, and the number this owner goes on from.
    pub async fn open(
        store: &Store,
        prefix: &str,
        sink: &str,
        unit: &str,
    ) -> Result<(UnitLog, Recovery), LogError> {
        let dir = Path::from(prefix).join(LOG_DIR).join(sink).join(unit);
        let listed: Vec<_> = store
            .inner
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|source| store.failed(format!("listing `{dir}`"), source))?;
        let mut numbers: Vec<(u64, std::time::SystemTime)> = listed
            .iter()
            .filter_map(|meta| {
                let number = number_of(meta.location.filename()?)?;
                Some((number, std::time::SystemTime::from(meta.last_modified)))
            })
            .collect();
        numbers.sort_unstable();
        let mut log = UnitLog {
            store: store.clone(),
            next: numbers.last().map_or(0, |(n, _)| n + 1),
            dir,
            known: BTreeMap::new(),
        };
        let mut recovery = Recovery::default();
        for (number, written) in numbers {
            let Some(entry) = log.entry(number).await? else {
                continue;
            };
            let last = entry.last();
            log.known.insert(number, Known { last, written });
            log.recover(number, entry, &mut recovery).await?;
        }
        Ok((log, recovery))
    }

    /// Sorts a standing entry into `recovery`: a marker holds no rows.
    async fn recover(
        &self,
        number: u64,
        entry: Entry,
        recovery: &mut Recovery,
    ) -> Result<(), LogError> {
        if entry.is_marker() {
            return Ok(());
        }
        match self
            .store
            .standing(&Path::from(entry.object.as_str()))
            .await?
        {
            Standing::Written => recovery.written.push((number, entry)),
            Standing::Missing => recovery.unwritten.push((number, entry)),
            Standing::Void => recovery.voided.push((number, entry)),
        }
        Ok(())
    }

    /// A new owner's first write, before it commits anything: a marker
    /// entry (no object, no rows) at the next number. An earlier owner can
    /// have one write in flight when it loses the unit (it checks its lease
    /// before each); from the marker on, every number it could still try is
    /// taken. An entry that took the number first is that write: it joins
    /// `recovery`, and the marker goes to the next number.
    /// Then every entry whose object is missing is voided: `empty` (an
    /// object of the sink's format with no rows) is written under its key,
    /// marked void; if the late object got there first, the entry is
    /// written after all. The recovery left has no unwritten entry.
    pub async fn take_over(
        &mut self,
        writer: &str,
        mut recovery: Recovery,
        empty: Bytes,
        fence: &dyn Fence,
    ) -> Result<Recovery, LogError> {
        let marker = Entry::new(String::new(), &[], writer.to_string());
        loop {
            let number = self.next;
            match self.claim(number, &marker, fence).await? {
                None => break,
                Some(theirs) => self.recover(number, theirs, &mut recovery).await?,
            }
        }
        for (number, entry) in std::mem::take(&mut recovery.unwritten) {
            if !fence.held() {
                return Err(Fenced.into());
            }
            let key = Path::from(entry.object.as_str());
            let standing = match self.store.create_void(&key, empty.clone()).await? {
                true => Standing::Void,
                false => self.store.standing(&key).await?,
            };
            match standing {
                Standing::Void => recovery.voided.push((number, entry)),
                Standing::Written => recovery.written.push((number, entry)),
                Standing::Missing => {
                    return Err(LogError::Entry {
                        key: key.to_string(),
                        reason: "its object was refused as existing, then not found".into(),
                    });
                }
            }
        }
        Ok(recovery)
    }

    /// The number the next commit takes.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Commits `data` as the object `object(number)` holding rows
    /// `sequences`, while `fence` holds: its entry first, then the object.
    /// An error before the claim leaves the number free for the same commit
    /// again (an entry written whose answer was lost is recognised as this
    /// writer's); one after it leaves the entry standing: write its object
    /// again ([`UnitLog::write_object`]), never commit its rows anew.
    pub async fn commit(
        &mut self,
        object: impl Fn(u64) -> String,
        sequences: &[u64],
        writer: &str,
        data: Bytes,
        fence: &dyn Fence,
    ) -> Result<Committed, LogError> {
        let number = self.next;
        let entry = Entry::new(object(number), sequences, writer.to_string());
        match self.claim(number, &entry, fence).await? {
            None => {
                self.write_object(&entry, data).await?;
                Ok(Committed::Written(number))
            }
            Some(theirs) => Ok(Committed::Taken {
                number,
                entry: theirs,
            }),
        }
    }

    /// Writes entry `number` create-only while `fence` holds: `None` once
    /// it stands as this writer's (written now, or before with its answer
    /// lost), or the other writer's entry that took the number. Either way
    /// the number is used.
    pub async fn claim(
        &mut self,
        number: u64,
        entry: &Entry,
        fence: &dyn Fence,
    ) -> Result<Option<Entry>, LogError> {
        if !fence.held() {
            return Err(Fenced.into());
        }
        let body = serde_json::to_vec(entry).map_err(|err| LogError::Entry {
            key: self.key(number).to_string(),
            reason: err.to_string(),
        })?;
        let created = self.store.create(&self.key(number), body.into()).await?;
        let standing = match created {
            true => None,
            false => match self.entry(number).await? {
                Some(theirs) if theirs == *entry => None,
                Some(theirs) => Some(theirs),
                None => {
                    return Err(LogError::Entry {
                        key: self.key(number).to_string(),
                        reason: "refused as existing, then not found".into(),
                    });
                }
            },
        };
        let standing_entry = standing.as_ref().unwrap_or(entry);
        let known = Known {
            last: standing_entry.last(),
            written: std::time::SystemTime::now(),
        };
        self.known.insert(number, known);
        self.next = self.next.max(number + 1);
        Ok(standing)
    }

    /// Writes the object of an entry that stands (the second half of a
    /// commit), create-only. One standing already holds the same rows (an
    /// entry names its object's rows), so it is left; a void one means a
    /// new owner took the unit over first: the rows are in no object.
    pub async fn write_object(&self, entry: &Entry, data: Bytes) -> Result<(), LogError> {
        let key = Path::from(entry.object.as_str());
        if self.store.create(&key, data).await? {
            return Ok(());
        }
        match self.store.standing(&key).await? {
            Standing::Written => Ok(()),
            Standing::Void => Err(LogError::Voided {
                key: key.to_string(),
            }),
            // Not an answer to act on: the write is tried again.
            Standing::Missing => Err(LogError::Entry {
                key: key.to_string(),
                reason: "its object was refused as existing, then not found".into(),
            }),
        }
    }

    /// Removes the entries whose rows are all acked (`acked_through`: the
    /// consumer's ack floor) and that were written at least `settled_for`
    /// ago, but the newest, which the next owner numbers on from. Their
    /// objects stay. The entries removed.
    ///
    /// The age is what keeps a late write out: a writer frozen with its
    /// entry's PUT in flight could otherwise create a number once pruned;
    /// a request older than S3's 15-minute signature window is refused.
    pub async fn prune(
        &mut self,
        acked_through: u64,
        settled_for: std::time::Duration,
    ) -> Result<usize, LogError> {
        let newest = self.known.keys().next_back().copied();
        let now = std::time::SystemTime::now();
        let old_enough =
            |known: &Known| known.written + settled_for <= now && known.last <= acked_through;
        let settled: Vec<u64> = self
            .known
            .iter()
            .filter(|(number, known)| Some(**number) != newest && old_enough(known))
            .map(|(number, _)| *number)
            .collect();
        for number in &settled {
            let key = self.key(*number);
            match self.store.inner.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(source) => {
                    return Err(self
                        .store
                        .failed(format!("removing `{key}`"), source)
                        .into());
                }
            }
            self.known.remove(number);
        }
        Ok(settled.len())
    }

    fn key(&self, number: u64) -> Path {
        self.dir
            .clone()
            .join(format!("{number:0NUMBER_WIDTH$}.json"))
    }

    /// Entry `number`, if it stands.
    async fn entry(&self, number: u64) -> Result<Option<Entry>, LogError> {
        let key = self.key(number);
        let Some(bytes) = self.store.read(&key).await? else {
            return Ok(None);
        };
        let refused = |reason: String| LogError::Entry {
            key: key.to_string(),
            reason,
        };
        let entry: Entry =
            serde_json::from_slice(&bytes).map_err(|err| refused(err.to_string()))?;
        // Its ranges decide which rows are acked without a write: only
        // ascending, disjoint ranges are believed.
        let mut after = None;
        for &[first, last] in &entry.sequences {
            if first > last || after.is_some_and(|after: u64| first <= after) {
                return Err(refused(format!(
                    "its rows [{first}, {last}] are not an ascending range after the ones before"
                )));
            }
            after = Some(last);
        }
        Ok(Some(entry))
    }
}

/// The number an entry's file name says, if it is one.
fn number_of(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".json")?;
    (digits.len() == NUMBER_WIDTH && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_keeps_its_rows_as_ranges_and_finds_each() {
        let entry = Entry::new("o".into(), &[7, 3, 4, 5, 9, 4, 10], "w".into());
        assert_eq!(entry.sequences, vec![[3, 5], [7, 7], [9, 10]]);
        assert_eq!(entry.rows().collect::<Vec<_>>(), vec![3, 4, 5, 7, 9, 10]);
        for seq in [3, 4, 5, 7, 9, 10] {
            assert!(entry.holds(seq), "{seq}");
        }
        for seq in [0, 2, 6, 8, 11] {
            assert!(!entry.holds(seq), "{seq}");
        }
        assert_eq!(entry.last(), 10);
    }

    #[test]
    fn only_a_numbered_json_name_is_an_entry() {
        assert_eq!(number_of("00000000000000000042.json"), Some(42));
        assert_eq!(number_of("42.json"), None);
        assert_eq!(number_of("0000000000000000004x.json"), None);
        assert_eq!(number_of("00000000000000000042.tmp"), None);
    }
}
