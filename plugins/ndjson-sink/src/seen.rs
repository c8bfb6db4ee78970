//! What the sink has written: a sidecar per output file, one fixed-size
//! record per line appended, and a cache of each sidecar's last records.
//!
//! A record is 16 bytes: the row's sequence, then the
//! [`stable_hash64`](weir_plugin::stable_hash64) (FNV-1a 64) of its payload,
//! both `u64` little-endian. Records sit at multiples of 16 bytes from the
//! start of the sidecar: a torn last record (a crash mid-write) is ignored
//! when read, and padded to a whole record before the next append.

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Bytes of one record.
pub const RECORD_BYTES: u64 = 16;
/// Sidecars whose records an instance keeps in memory at once.
pub const MAX_FILES: usize = 64;
/// Records an instance keeps in memory across its files, unless one
/// window is larger (about 50 bytes each).
pub const CACHE_RECORDS: usize = 262_144;
/// Records read from a sidecar per read call.
const READ_RECORDS: usize = 4096;

/// One line written: the row's sequence and its payload's hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record {
    pub sequence: u64,
    pub hash: u64,
}

impl Record {
    /// The record of a row with this sequence and payload.
    pub fn of(sequence: u64, payload: &[u8]) -> Record {
        Record {
            sequence,
            hash: weir_plugin::stable_hash64(payload),
        }
    }

    fn encode(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.sequence.to_le_bytes());
        out.extend_from_slice(&self.hash.to_le_bytes());
    }

    fn decode(bytes: &[u8]) -> Record {
        let (sequence, hash) = bytes.split_at(8);
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
        Record {
            sequence: word(sequence),
            hash: word(hash),
        }
    }
}

/// The last records of one sidecar, oldest first, and how far it was read.
#[derive(Default)]
pub struct Window {
    order: VecDeque<Record>,
    /// How many times each record is in `order` (twice after a duplicate).
    counts: HashMap<Record, u32>,
    /// Bytes of the sidecar the window has read (a multiple of 16).
    read_to: u64,
    /// When the instance last used it, to forget the least recently used.
    used: u64,
}

impl Window {
    /// Whether `record` is among the last records.
    pub fn contains(&self, record: &Record) -> bool {
        self.counts.contains_key(record)
    }

    fn len(&self) -> usize {
        self.order.len()
    }

    /// Adds the newest record, forgetting the oldest beyond `capacity`.
    fn push(&mut self, record: Record, capacity: usize) {
        while self.order.len() >= capacity {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(count) = self.counts.get_mut(&oldest) {
                *count -= 1;
                if *count == 0 {
                    self.counts.remove(&oldest);
                }
            }
        }
        self.order.push_back(record);
        *self.counts.entry(record).or_default() += 1;
    }

    fn clear(&mut self) {
        self.order.clear();
        self.counts.clear();
        self.read_to = 0;
    }

    /// Brings the window up to date with the sidecar at `path`: reads only
    /// what was appended since (by this instance or another), or the tail
    /// again if it shrank or cannot be read from where the window stopped.
    fn sync(&mut self, path: &Path, capacity: usize) -> io::Result<()> {
        match self.sync_once(path, capacity) {
            Ok(()) => Ok(()),
            Err(_) => {
                self.clear();
                self.sync_once(path, capacity)
            }
        }
    }

    fn sync_once(&mut self, path: &Path, capacity: usize) -> io::Result<()> {
        let len = match fs::metadata(path) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        let whole = len - len % RECORD_BYTES;
        if whole == self.read_to {
            return Ok(());
        }
        let tail = capacity as u64 * RECORD_BYTES;
        // Grown by at most a window: read the new part; else the tail.
        if whole < self.read_to || whole - self.read_to > tail {
            self.clear();
        }
        let from = self.read_to.max(whole.saturating_sub(tail));
        if from < whole {
            let mut file = File::open(path)?;
            read_records(&mut file, from, whole, |record| self.push(record, capacity))?;
        }
        self.read_to = whole;
        Ok(())
    }
}

/// Reads the records in bytes `from..to` of `file`, in order.
fn read_records(
    file: &mut File,
    from: u64,
    to: u64,
    mut each: impl FnMut(Record),
) -> io::Result<()> {
    file.seek(SeekFrom::Start(from))?;
    let mut left = to - from;
    let mut buf = vec![0; (READ_RECORDS as u64 * RECORD_BYTES).min(left) as usize];
    let size = buf.len() as u64;
    while left > 0 {
        let chunk = &mut buf[..left.min(size) as usize];
        file.read_exact(chunk)?;
        for bytes in chunk.chunks_exact(RECORD_BYTES as usize) {
            each(Record::decode(bytes));
        }
        left -= chunk.len() as u64;
    }
    Ok(())
}

/// The windows of the sidecars an instance uses: at most [`MAX_FILES`] and
/// about `max(window, CACHE_RECORDS)` records in all.
pub struct Seen {
    /// Records remembered per sidecar (`dedupe_window`).
    capacity: usize,
    /// Records remembered across sidecars.
    budget: usize,
    files: HashMap<PathBuf, Window>,
    clock: u64,
}

impl Seen {
    pub fn new(capacity: usize) -> Seen {
        Seen {
            capacity,
            budget: capacity.max(CACHE_RECORDS),
            files: HashMap::new(),
            clock: 0,
        }
    }

    /// The window of the sidecar at `path`, up to date with it. On an error
    /// the sidecar is forgotten, to be read again next time.
    pub fn window(&mut self, path: &Path) -> io::Result<&Window> {
        self.clock += 1;
        let window = self.files.entry(path.to_path_buf()).or_default();
        window.used = self.clock;
        if let Err(e) = window.sync(path, self.capacity) {
            self.files.remove(path);
            return Err(e);
        }
        self.evict(path);
        self.files
            .get(path)
            .ok_or_else(|| io::Error::other("evicted"))
    }

    /// Appends `records` to the sidecar at `path` in one write (padding a
    /// torn last record first), creating its directory if needed.
    pub fn append(&mut self, path: &Path, records: &[Record], fsync: bool) -> io::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        let mut file = OpenOptions::new().create(true).append(true).open(path)?;
        let before = file.metadata()?.len();
        let pad = (RECORD_BYTES - before % RECORD_BYTES) % RECORD_BYTES;
        let mut buf = vec![0; pad as usize];
        buf.reserve(records.len() * RECORD_BYTES as usize);
        for record in records {
            record.encode(&mut buf);
        }
        file.write_all(&buf)?;
        if fsync {
            file.sync_data()?;
        }
        // Nothing else appended since the window read it: it takes the
        // records as they are; otherwise it reads them, in the file's
        // order, next time.
        let after = file.metadata().map(|meta| meta.len()).ok();
        let capacity = self.capacity;
        if let Some(window) = self.files.get_mut(path)
            && pad == 0
            && before == window.read_to
            && after == Some(before + buf.len() as u64)
        {
            for &record in records {
                window.push(record, capacity);
            }
            window.read_to = before + buf.len() as u64;
            self.evict(path);
        }
        Ok(())
    }

    /// Forgets the least recently used sidecars (never `keep`) until the
    /// cache is within its bounds.
    fn evict(&mut self, keep: &Path) {
        loop {
            let records: usize = self.files.values().map(Window::len).sum();
            if self.files.len() <= MAX_FILES && records <= self.budget {
                return;
            }
            let oldest = self
                .files
                .iter()
                .filter(|(path, _)| path.as_path() != keep)
                .min_by_key(|(_, window)| window.used)
                .map(|(path, _)| path.clone());
            match oldest {
                Some(path) => self.files.remove(&path),
                None => return,
            };
        }
    }

    #[cfg(test)]
    pub fn cached(&self) -> (usize, usize) {
        let records = self.files.values().map(Window::len).sum();
        (self.files.len(), records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_sequence_then_hash_little_endian() {
        let record = Record {
            sequence: 0x0102,
            hash: 0x0a0b,
        };
        let mut buf = Vec::new();
        record.encode(&mut buf);
        assert_eq!(buf, [2, 1, 0, 0, 0, 0, 0, 0, 0x0b, 0x0a, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Record::decode(&buf), record);
    }

    #[test]
    fn a_window_forgets_its_oldest_and_counts_repeats() {
        let r = |sequence| Record { sequence, hash: 7 };
        let mut window = Window::default();
        for sequence in [1, 2, 1, 3] {
            window.push(r(sequence), 3);
        }
        // [2, 1, 3]: the first 1 went, the second stays.
        assert!(!window.contains(&r(0)));
        assert!(window.contains(&r(1)) && window.contains(&r(2)) && window.contains(&r(3)));
        window.push(r(4), 3);
        assert!(!window.contains(&r(2)) && window.contains(&r(1)));
        assert_eq!(window.len(), 3);
    }
}
