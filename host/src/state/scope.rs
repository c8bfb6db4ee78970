//! One scope's state: the entries of (plugin, tenant, table) and the stream
//! sequences of the rows whose effects they hold.
//!
//! A scope is one KV key, and each write to it one value, so a batch's
//! writes land at once or not at all. A value is either the whole scope
//! (`FORMAT`), or the changes of one batch (`CHANGES`: keys set or
//! deleted, sequences settled) on top of the scope the key held before;
//! the store writes changes, and the whole now and then (`store`). The
//! settled sequences let a row redelivered after its state was written
//! (the host died before its ack, or its dead letter was not stored) be
//! settled as it was, without a call: acked if it was applied,
//! dead-lettered if it was dead-lettered. Rows that cannot come back (their
//! acks applied, or at or below the unit consumer's ack floor) are dropped.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

/// A batch's writes by key (`None`: deleted). Hashed: a row reads and
/// writes its keys here first, and a hash costs less than a tree's key
/// comparisons (the order is the scope's, [`Entries`]). It holds one
/// batch's keys, with a seed of its own per process.
type Writes = foldhash::HashMap<Vec<u8>, Option<Vec<u8>>>;

/// First byte of an encoded scope: the format's version.
const FORMAT: u8 = 1;
/// First byte of a batch's changes, followed by the revision of the whole
/// scope (or deletion marker, or 0 for none) they build on.
const CHANGES: u8 = 2;

/// Why a scope's value cannot be read, or a write is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("the stored state is not in a format this host reads: {0}")]
    Corrupt(&'static str),
    /// A chain of changes whose start the bucket no longer keeps (its
    /// `history` was lowered below what the chain needs).
    #[error(
        "the stored state's changes build on revision {base}, which the state bucket no longer keeps; raise its history (`weir mq apply`) or purge the state"
    )]
    BaseGone { base: u64 },
    #[error("the state is full: grants.state.max_keys is {max_keys} keys")]
    TooManyKeys { max_keys: usize },
    #[error(
        "the state is full: grants.state.max_bytes is {max_bytes} bytes (keys and values, and 8 per key)"
    )]
    TooManyBytes { max_bytes: usize },
}

/// What a plugin's grant allows one scope to hold (`grants.state`).
pub(crate) use crate::config::StateLimits as Limits;

/// What each key costs in `max_bytes` beyond its key and value: the two
/// lengths it is stored with, so `max_bytes` bounds the stored value.
pub const ENTRY_FRAMING: usize = 8;

fn entry_bytes(key: &[u8], value: &[u8]) -> usize {
    key.len() + value.len() + ENTRY_FRAMING
}

/// How a row of a scope was settled when its state was last written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Its effects are in the state: ack it.
    Applied,
    /// It was dead-lettered (the state holds whatever the call wrote for
    /// it): dead-letter it again, its letter may not have been stored.
    DeadLettered,
}

/// A scope's keys and values: hashed for the reads and writes every row
/// makes (a tree of thousands of keys cost a dozen key comparisons each),
/// and the keys also in order, for `list` and the encoding. A key is one
/// allocation shared by both; only a new or removed key touches the order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Entries {
    values: foldhash::HashMap<Arc<[u8]>, Vec<u8>>,
    order: BTreeSet<Arc<[u8]>>,
}

impl Entries {
    fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.values.get(key).map(Vec::as_slice)
    }

    fn len(&self) -> usize {
        self.values.len()
    }

    /// Stores `value` at `key`; the value it replaced.
    fn insert(&mut self, key: Vec<u8>, value: Vec<u8>) -> Option<Vec<u8>> {
        if let Some(stored) = self.values.get_mut(key.as_slice()) {
            return Some(std::mem::replace(stored, value));
        }
        let key: Arc<[u8]> = key.into();
        self.order.insert(key.clone());
        self.values.insert(key, value);
        None
    }

    fn remove(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        let value = self.values.remove(key)?;
        self.order.remove(key);
        Some(value)
    }

    /// Every entry, in key order.
    fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.with_prefix(&[])
    }

    /// The entries whose key starts with `prefix`, in key order.
    fn with_prefix<'a>(&'a self, prefix: &'a [u8]) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        self.order
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |key| key.starts_with(prefix))
            .filter_map(|key| Some((&**key, self.get(key)?)))
    }
}

/// A scope as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    entries: Entries,
    applied: Sequences,
    dead_lettered: Sequences,
    /// [`Scope::bytes`], kept as entries change: a batch's overlay starts
    /// from it, and counting it each time would cost the scope's size.
    bytes: usize,
}

/// Stream sequences, ascending and each once. A batch's rows arrive in
/// order and leave from the front as their acks apply: a ring kept sorted
/// costs a push and a pop where a tree allocated and rebalanced per row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Sequences(VecDeque<u64>);

impl Sequences {
    fn contains(&self, sequence: u64) -> bool {
        self.0.binary_search(&sequence).is_ok()
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn insert(&mut self, sequence: u64) {
        match self.0.back() {
            Some(&last) if last < sequence => self.0.push_back(sequence),
            None => self.0.push_back(sequence),
            Some(_) => {
                if let Err(at) = self.0.binary_search(&sequence) {
                    self.0.insert(at, sequence);
                }
            }
        }
    }

    fn extend(&mut self, sequences: impl IntoIterator<Item = u64>) {
        for sequence in sequences {
            self.insert(sequence);
        }
    }

    fn remove(&mut self, sequence: u64) {
        if let Ok(at) = self.0.binary_search(&sequence) {
            self.0.remove(at);
        }
    }

    /// Drops every sequence at or below `floor`.
    fn drop_through(&mut self, floor: u64) {
        let below = self.0.partition_point(|&sequence| sequence <= floor);
        self.0.drain(..below);
    }
}

/// What one batch changed in a scope: the value a write stores.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// `None`: deleted.
    writes: Writes,
    applied: Vec<u64>,
    dead_lettered: Vec<u64>,
    /// Settled sequences at or below it are dropped.
    ack_floor: u64,
}

/// A stored value: the whole scope, or one batch's changes.
#[derive(Debug, PartialEq, Eq)]
pub enum Value {
    Whole(Scope),
    /// `base`: the revision of the whole scope or deletion marker the
    /// chain of changes starts from; 0 when the key held nothing before.
    Changes {
        base: u64,
        changes: Changes,
    },
}

impl Value {
    /// Reads a stored value of either format; anything else is an error,
    /// never a panic (the value comes from NATS).
    pub fn decode(bytes: &[u8]) -> Result<Value, StateError> {
        match bytes.first() {
            Some(&FORMAT) => Scope::decode(bytes).map(Value::Whole),
            Some(&CHANGES) => {
                let mut reader = Reader { bytes: &bytes[1..] };
                let base = reader.u64()?;
                let mut changes = Changes {
                    ack_floor: reader.u64()?,
                    ..Changes::default()
                };
                for _ in 0..reader.u32()? {
                    let key = reader.chunk()?.to_vec();
                    let value = match reader.take(1)? {
                        [0] => None,
                        [1] => Some(reader.chunk()?.to_vec()),
                        _ => {
                            return Err(StateError::Corrupt(
                                "a change that is neither set nor delete",
                            ));
                        }
                    };
                    changes.writes.insert(key, value);
                }
                for list in [&mut changes.applied, &mut changes.dead_lettered] {
                    for _ in 0..reader.u32()? {
                        list.push(reader.u64()?);
                    }
                }
                if !reader.bytes.is_empty() {
                    return Err(StateError::Corrupt("bytes after the end"));
                }
                Ok(Value::Changes { base, changes })
            }
            _ => Err(StateError::Corrupt("unknown format version")),
        }
    }
}

impl Changes {
    /// `CHANGES`, the base revision and the ack floor as little-endian u64,
    /// then the writes (key, then 1 and the value, or 0 for a delete), the
    /// applied and the dead-lettered sequences, each list counted: lengths
    /// and counts as little-endian u32.
    pub fn encode(&self, base: u64) -> Vec<u8> {
        let writes: usize = self
            .writes
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len) + 9)
            .sum();
        let sequences = 8 * (self.applied.len() + self.dead_lettered.len());
        let mut out = Vec::with_capacity(1 + 16 + 12 + writes + sequences);
        out.push(CHANGES);
        out.extend_from_slice(&base.to_le_bytes());
        out.extend_from_slice(&self.ack_floor.to_le_bytes());
        put_u32(&mut out, self.writes.len());
        for (key, value) in &self.writes {
            put_u32(&mut out, key.len());
            out.extend_from_slice(key);
            match value {
                Some(value) => {
                    out.push(1);
                    put_u32(&mut out, value.len());
                    out.extend_from_slice(value);
                }
                None => out.push(0),
            }
        }
        for list in [&self.applied, &self.dead_lettered] {
            put_u32(&mut out, list.len());
            for sequence in list {
                out.extend_from_slice(&sequence.to_le_bytes());
            }
        }
        out
    }
}

impl Scope {
    /// How the row at `sequence` was settled, if this state holds it.
    pub fn settled(&self, sequence: u64) -> Option<Settled> {
        if self.applied.contains(sequence) {
            Some(Settled::Applied)
        } else if self.dead_lettered.contains(sequence) {
            Some(Settled::DeadLettered)
        } else {
            None
        }
    }

    /// Whether the row at `sequence` already counted in this state.
    pub fn applied(&self, sequence: u64) -> bool {
        self.settled(sequence) == Some(Settled::Applied)
    }

    /// How many settled sequences the scope keeps: rows that may still
    /// come back.
    pub fn settled_count(&self) -> usize {
        self.applied.len() + self.dead_lettered.len()
    }

    /// Applies one batch's changes.
    pub fn apply(&mut self, changes: Changes) {
        for (key, written) in changes.writes {
            match written {
                Some(value) => self.insert(key, value),
                None => self.remove(&key),
            }
        }
        self.applied.extend(changes.applied);
        self.dead_lettered.extend(changes.dead_lettered);
        for set in [&mut self.applied, &mut self.dead_lettered] {
            set.drop_through(changes.ack_floor);
        }
    }

    fn insert(&mut self, key: Vec<u8>, value: Vec<u8>) {
        let framing = key.len() + ENTRY_FRAMING;
        self.bytes += framing + value.len();
        if let Some(old) = self.entries.insert(key, value) {
            self.bytes -= framing + old.len();
        }
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some(old) = self.entries.remove(key) {
            self.bytes -= entry_bytes(key, &old);
        }
    }

    /// Drops `sequences`: rows that cannot come back.
    pub fn forget(&mut self, sequences: &[u64]) {
        if self.settled_count() == 0 {
            return;
        }
        for &sequence in sequences {
            self.applied.remove(sequence);
            self.dead_lettered.remove(sequence);
        }
    }

    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.entries.get(key)
    }

    /// Bytes of keys and values with their framing, what `max_bytes` limits.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn keys(&self) -> usize {
        self.entries.len()
    }

    /// `FORMAT`, then the entries, the applied and the dead-lettered
    /// sequences, each list counted: lengths and counts as little-endian
    /// u32, sequences as u64.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + 12 + self.bytes() + 8 * self.settled_count());
        out.push(FORMAT);
        put_u32(&mut out, self.entries.len());
        for (key, value) in self.entries.iter() {
            put_u32(&mut out, key.len());
            out.extend_from_slice(key);
            put_u32(&mut out, value.len());
            out.extend_from_slice(value);
        }
        for set in [&self.applied, &self.dead_lettered] {
            put_u32(&mut out, set.len());
            for sequence in &set.0 {
                out.extend_from_slice(&sequence.to_le_bytes());
            }
        }
        out
    }

    /// Reads what [`Scope::encode`] wrote; anything else is an error, never
    /// a panic (the value comes from NATS).
    pub fn decode(bytes: &[u8]) -> Result<Scope, StateError> {
        let mut reader = Reader { bytes };
        if reader.take(1)? != [FORMAT] {
            return Err(StateError::Corrupt("unknown format version"));
        }
        let mut scope = Scope::default();
        for _ in 0..reader.u32()? {
            let key = reader.chunk()?.to_vec();
            let value = reader.chunk()?.to_vec();
            scope.insert(key, value);
        }
        for set in [&mut scope.applied, &mut scope.dead_lettered] {
            for _ in 0..reader.u32()? {
                set.insert(reader.u64()?);
            }
        }
        if !reader.bytes.is_empty() {
            return Err(StateError::Corrupt("bytes after the end"));
        }
        Ok(scope)
    }
}

fn put_u32(out: &mut Vec<u8>, value: usize) {
    out.extend_from_slice(&u32::try_from(value).unwrap_or(u32::MAX).to_le_bytes());
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8], StateError> {
        if self.bytes.len() < count {
            return Err(StateError::Corrupt("cut short"));
        }
        let (taken, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Ok(taken)
    }

    fn u32(&mut self) -> Result<usize, StateError> {
        let mut number = [0; 4];
        number.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(number) as usize)
    }

    fn u64(&mut self) -> Result<u64, StateError> {
        let mut number = [0; 8];
        number.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(number))
    }

    fn chunk(&mut self) -> Result<&'a [u8], StateError> {
        let length = self.u32()?;
        self.take(length)
    }
}

/// A batch's view of a scope: reads see the batch's own writes, writes are
/// kept until the batch's rows are all done, limits are checked on write.
#[derive(Debug)]
pub struct Overlay {
    base: Arc<Scope>,
    limits: Limits,
    /// `None`: deleted in this batch.
    writes: Writes,
    keys: usize,
    bytes: usize,
}

impl Overlay {
    pub fn new(base: Arc<Scope>, limits: Limits) -> Overlay {
        let (keys, bytes) = (base.keys(), base.bytes());
        Overlay {
            base,
            limits,
            writes: Writes::default(),
            keys,
            bytes,
        }
    }

    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        match self.writes.get(key) {
            Some(written) => written.as_deref(),
            None => self.base.get(key),
        }
    }

    /// Sets `key`, unless the scope would pass its limits (then nothing changes).
    pub fn set(
        &mut self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<(), StateError> {
        // Owned: a plugin's key and value arrive as vectors, kept as they are.
        let (key, value) = (key.into(), value.into());
        let entry = self.writes.entry(key);
        let old = match &entry {
            Entry::Occupied(written) => written.get().as_deref(),
            Entry::Vacant(vacant) => self.base.get(vacant.key()),
        }
        .map(|old| entry_bytes(entry.key(), old));
        let keys = self.keys + usize::from(old.is_none());
        let bytes = self.bytes - old.unwrap_or(0) + entry_bytes(entry.key(), &value);
        if keys > self.limits.max_keys {
            return Err(StateError::TooManyKeys {
                max_keys: self.limits.max_keys,
            });
        }
        if bytes > self.limits.max_bytes {
            return Err(StateError::TooManyBytes {
                max_bytes: self.limits.max_bytes,
            });
        }
        self.keys = keys;
        self.bytes = bytes;
        *entry.or_default() = Some(value);
        Ok(())
    }

    pub fn delete(&mut self, key: impl Into<Vec<u8>>) {
        let key = key.into();
        if let Some(old) = self.get(&key).map(|v| entry_bytes(&key, v)) {
            self.keys -= 1;
            self.bytes -= old;
            self.writes.insert(key, None);
        }
    }

    /// Entries whose key starts with `prefix`, in key order.
    pub fn list(&self, prefix: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut merged: BTreeMap<&[u8], &[u8]> = self.base.entries.with_prefix(prefix).collect();
        for (key, written) in self
            .writes
            .iter()
            .filter(|(key, _)| key.starts_with(prefix))
        {
            match written {
                Some(value) => merged.insert(key, value),
                None => merged.remove(key.as_slice()),
            };
        }
        merged
            .into_iter()
            .map(|(key, value)| (key.to_vec(), value.to_vec()))
            .collect()
    }

    /// Whether the batch wrote anything.
    pub fn changed(&self) -> bool {
        !self.writes.is_empty()
    }

    /// The changes to store once the batch's rows of this scope are all
    /// settled: the writes, the rows' sequences to add as `applied` or
    /// `dead_lettered`, and `ack_floor`, at or below which every sequence
    /// is dropped. Lets go of the base, so the store can change it in place.
    pub fn commit(
        self,
        applied: impl IntoIterator<Item = u64>,
        dead_lettered: impl IntoIterator<Item = u64>,
        ack_floor: u64,
    ) -> Changes {
        Changes {
            writes: self.writes,
            applied: applied.into_iter().collect(),
            dead_lettered: dead_lettered.into_iter().collect(),
            ack_floor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_keys: 3,
        max_bytes: 45,
    };

    /// `base` with `changes` applied, as the store keeps it after a write.
    fn stored(base: &Scope, changes: Changes) -> Scope {
        let mut scope = base.clone();
        scope.apply(changes);
        scope
    }

    #[test]
    fn a_batch_sees_its_own_writes_and_the_store_sees_them_only_at_commit() {
        let base = Scope::default();
        let mut overlay = Overlay::new(Arc::new(base.clone()), LIMITS);
        overlay.set(b"count", b"1").unwrap();
        overlay.set(b"count", b"2").unwrap();
        overlay.set(b"sum", b"10").unwrap();
        assert_eq!(overlay.get(b"count"), Some(&b"2"[..]));
        assert_eq!(base.get(b"count"), None);
        let scope = stored(&base, overlay.commit([7, 9], [], 0));
        assert_eq!(scope.get(b"count"), Some(&b"2"[..]));
        assert!(scope.applied(7) && scope.applied(9) && !scope.applied(8));
    }

    #[test]
    fn deletes_and_lists_merge_the_batch_over_the_stored_state() {
        let mut base = Scope::default();
        base.insert(b"w1.a".to_vec(), b"1".to_vec());
        base.insert(b"w1.b".to_vec(), b"2".to_vec());
        base.insert(b"w2.a".to_vec(), b"3".to_vec());
        let mut overlay = Overlay::new(Arc::new(base.clone()), LIMITS);
        overlay.delete(b"w1.a");
        overlay.set(b"w1.c", b"4").unwrap();
        assert_eq!(
            overlay.list(b"w1."),
            vec![
                (b"w1.b".to_vec(), b"2".to_vec()),
                (b"w1.c".to_vec(), b"4".to_vec())
            ]
        );
        let scope = stored(&base, overlay.commit([], [], 0));
        assert_eq!((scope.keys(), scope.get(b"w1.a")), (3, None));
    }

    #[test]
    fn entries_keep_key_order_for_lists_and_the_encoding_whatever_order_they_came_in() {
        let keys: [&[u8]; 5] = [b"b2", b"a", b"b10", b"b1", b"c"];
        let (mut forwards, mut backwards) = (Scope::default(), Scope::default());
        for key in keys {
            forwards.insert(key.to_vec(), key.to_vec());
        }
        for key in keys.iter().rev() {
            backwards.insert(key.to_vec(), key.to_vec());
        }
        assert_eq!(forwards.encode(), backwards.encode());
        // Replacing a value keeps its key's place; removing drops it from the order.
        forwards.insert(b"b1".to_vec(), b"new".to_vec());
        forwards.remove(b"b2");
        let overlay = Overlay::new(Arc::new(forwards), LIMITS);
        assert_eq!(
            overlay.list(b"b"),
            vec![
                (b"b1".to_vec(), b"new".to_vec()),
                (b"b10".to_vec(), b"b10".to_vec())
            ]
        );
        assert_eq!(overlay.list(b"").len(), 4);
    }

    #[test]
    fn limits_refuse_a_write_and_leave_the_state_as_it_was() {
        let base = Scope::default();
        let mut overlay = Overlay::new(Arc::new(base.clone()), LIMITS);
        for key in [b"a", b"b", b"c"] {
            overlay.set(key, b"x").unwrap();
        }
        assert_eq!(
            overlay.set(b"d", b"x"),
            Err(StateError::TooManyKeys { max_keys: 3 })
        );
        // Rewriting a key adds no key; its old bytes are given back.
        overlay.set(b"a", b"0123456789").unwrap();
        assert_eq!(
            overlay.set(b"b", b"0123456789"),
            Err(StateError::TooManyBytes { max_bytes: 45 })
        );
        overlay.delete(b"c");
        overlay.set(b"b", b"0123456").unwrap();
        assert_eq!(
            (overlay.get(b"b"), overlay.get(b"d")),
            (Some(&b"0123456"[..]), None)
        );
    }

    #[test]
    fn sequences_stay_sorted_and_unique_whatever_order_they_come_in() {
        let mut set = Sequences::default();
        set.extend([5, 6, 9, 2, 6, 7, 1]);
        assert_eq!(set.0, [1, 2, 5, 6, 7, 9]);
        assert!(set.contains(7) && !set.contains(8));
        set.remove(1);
        set.remove(8);
        set.remove(7);
        assert_eq!(set.0, [2, 5, 6, 9]);
        set.drop_through(5);
        assert_eq!(set.0, [6, 9]);
        set.drop_through(100);
        assert_eq!(set.len(), 0);
    }

    #[test]
    fn the_ack_floor_prunes_applied_sequences() {
        let empty = Scope::default();
        let first = Overlay::new(Arc::new(empty.clone()), LIMITS).commit([3, 5, 8], [4, 7], 0);
        let scope = stored(&empty, first);
        let next = Overlay::new(Arc::new(scope.clone()), LIMITS).commit([9], [], 5);
        let scope = stored(&scope, next);
        assert!(!scope.applied(3) && !scope.applied(5) && scope.settled(4).is_none());
        assert!(scope.applied(8) && scope.applied(9));
        assert_eq!(scope.settled(7), Some(Settled::DeadLettered));
        let mut scope = scope;
        scope.forget(&[7, 8, 100]);
        assert!(!scope.applied(8) && scope.applied(9) && scope.settled(7).is_none());
        assert_eq!(scope.settled_count(), 1);
    }

    #[test]
    fn a_scope_round_trips_and_garbage_is_an_error_not_a_panic() {
        let empty = Scope::default();
        let mut overlay = Overlay::new(Arc::new(empty.clone()), LIMITS);
        overlay.set(b"k", b"v").unwrap();
        let scope = stored(&empty, overlay.commit([1, 2], [3], 0));
        assert_eq!(Scope::decode(&scope.encode()), Ok(scope.clone()));
        let encoded = scope.encode();
        for cut in 0..encoded.len() {
            assert!(Scope::decode(&encoded[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = encoded.clone();
        longer.push(0);
        assert!(Scope::decode(&longer).is_err());
        assert!(Scope::decode(&[2, 0, 0, 0, 0]).is_err());
        // A count far past the bytes there are ends at the bytes.
        assert!(Scope::decode(&[1, 255, 255, 255, 255]).is_err());
    }

    #[test]
    fn changes_round_trip_apply_as_the_whole_would_and_garbage_is_an_error() {
        let mut base = Scope::default();
        base.insert(b"a".to_vec(), b"1".to_vec());
        base.insert(b"b".to_vec(), b"2".to_vec());
        let mut overlay = Overlay::new(Arc::new(base.clone()), LIMITS);
        overlay.set(b"a", b"10").unwrap();
        overlay.delete(b"b");
        overlay.set(b"c", b"3").unwrap();
        let changes = overlay.commit([5, 6], [7], 4);
        let encoded = changes.encode(42);
        assert_eq!(
            Value::decode(&encoded),
            Ok(Value::Changes {
                base: 42,
                changes: changes.clone()
            })
        );
        let scope = stored(&base, changes);
        assert_eq!((scope.get(b"a"), scope.get(b"b")), (Some(&b"10"[..]), None));
        assert_eq!(
            scope.bytes(),
            entry_bytes(b"a", b"10") + entry_bytes(b"c", b"3")
        );
        assert_eq!(Scope::decode(&scope.encode()), Ok(scope.clone()));
        for cut in 0..encoded.len() {
            assert!(Value::decode(&encoded[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = encoded.clone();
        bad.push(0);
        assert!(Value::decode(&bad).is_err());
        assert!(Value::decode(&[3]).is_err());
    }

    /// A whole scope as hosts before the change format wrote it (format 1,
    /// byte for byte) still loads: it is the base the first change builds on.
    #[test]
    fn a_scope_written_before_changes_existed_still_loads() {
        let mut old = vec![1];
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&5u32.to_le_bytes());
        old.extend_from_slice(b"count");
        old.extend_from_slice(&2u32.to_le_bytes());
        old.extend_from_slice(b"41");
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&9u64.to_le_bytes());
        old.extend_from_slice(&0u32.to_le_bytes());
        let Ok(Value::Whole(scope)) = Value::decode(&old) else {
            panic!("the old format loads");
        };
        assert_eq!(scope.get(b"count"), Some(&b"41"[..]));
        assert_eq!(scope.bytes(), entry_bytes(b"count", b"41"));
        assert!(scope.applied(9));
        assert_eq!(scope.encode(), old, "and is written the same way");
    }
}
