//! A unit's commit log in the store, which makes "every row in exactly one
//! visible object" hold across owners of the unit.
//!
//! A sink's objects from one unit are committed one at a time, each as a
//! numbered entry `<prefix>/_weir/<sink>/<unit>/<number>.json` written
//! create-only (`If-None-Match: *`): the entry names the object's key and
//! the stream sequences of its rows, and the object is written (create-only
//! too) only after its entry. An entry is the commit; the object is its
//! content. Every owner numbers entries on from the last one it found, so
//! an earlier owner woken past its lease (it checked its lease, froze, and
//! sends its write late) can only write a number the new owner found free
//! and writes too: one of the two is refused (412), and the loser learns
//! from the winner's entry which rows it holds. A new owner completes any
//! entry whose object is missing (its writer died between the two writes)
//! with exactly the rows it names, which are all still unacked: rows are
//! acked only once their object stands.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};

use crate::destination::objects::store::{Store, StoreError};
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
    /// Entries whose object is missing: to be written with exactly their
    /// rows ([`UnitLog::complete`]) before those rows are acked.
    pub unwritten: Vec<(u64, Entry)>,
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
}

/// One unit's log, as its owner keeps it: the next number, and the last
/// row of each entry it knows (what `prune` removes).
#[derive(Debug)]
pub struct UnitLog {
    store: Store,
    dir: Path,
    next: u64,
    known: BTreeMap<u64, u64>,
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
        let mut numbers: Vec<u64> = listed
            .iter()
            .filter_map(|meta| number_of(meta.location.filename()?))
            .collect();
        numbers.sort_unstable();
        let mut log = UnitLog {
            store: store.clone(),
            next: numbers.last().map_or(0, |n| n + 1),
            dir,
            known: BTreeMap::new(),
        };
        let mut recovery = Recovery::default();
        for number in numbers {
            let Some(entry) = log.entry(number).await? else {
                continue;
            };
            log.known.insert(number, entry.last());
            match log.store.exists(&Path::from(entry.object.as_str())).await? {
                true => recovery.written.push((number, entry)),
                false => recovery.unwritten.push((number, entry)),
            }
        }
        Ok((log, recovery))
    }

    /// The number the next commit takes.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Commits `data` as the object `object(number)` holding rows
    /// `sequences`, while `fence` holds: its entry first, then the object.
    /// An error leaves the number free for the same commit again (an entry
    /// written whose answer was lost is recognised as this writer's).
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
                self.write(&entry, data).await?;
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
        self.known.insert(number, standing_entry.last());
        self.next = self.next.max(number + 1);
        Ok(standing)
    }

    /// Writes an entry's object, create-only: one that stands already is
    /// the same rows (an entry names its object's rows), so it is left.
    pub async fn complete(&self, entry: &Entry, data: Bytes) -> Result<(), LogError> {
        self.write(entry, data).await
    }

    async fn write(&self, entry: &Entry, data: Bytes) -> Result<(), LogError> {
        self.store
            .create(&Path::from(entry.object.as_str()), data)
            .await?;
        Ok(())
    }

    /// Removes the entries whose rows are all acked (`acked_through`: the
    /// consumer's ack floor), but the newest, which the next owner numbers
    /// on from. Their objects stay. The entries removed.
    pub async fn prune(&mut self, acked_through: u64) -> Result<usize, LogError> {
        let newest = self.known.keys().next_back().copied();
        let settled: Vec<u64> = self
            .known
            .iter()
            .filter(|(number, last)| Some(**number) != newest && **last <= acked_through)
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
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|err| LogError::Entry {
                key: key.to_string(),
                reason: err.to_string(),
            })
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
