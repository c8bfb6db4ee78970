//! The compiled cache: components compiled by Cranelift, kept as native
//! code in one directory shared by every data dir of the user, so a fresh
//! data dir (or a second host) loads a big plugin without compiling it.
//!
//! Architecture invariant: an entry is loaded only by the exact engine that
//! wrote it. Its name holds the `.wasm`'s SHA-256, weir's version and the
//! engine's compatibility hash (wasmtime's version and every setting that
//! shapes the code), so another weir build never maps an incompatible file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use wasmtime::Engine;
use wasmtime::component::Component;

const EXTENSION: &str = "cwasm";
/// A store's file written aside, before its rename under the key.
const PARTIAL: &str = "partial-";
/// A store takes seconds; a partial file this old was left by a crash.
const ABANDONED_AFTER: Duration = Duration::from_secs(3600);

/// A directory of compiled components with a size bound; least recently
/// used entries are evicted after each store.
#[derive(Debug)]
pub struct CompileCache {
    dir: PathBuf,
    max_bytes: u64,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// Where a component came from: the cache, the fleet's artifact, or
/// Cranelift here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Cache = 0,
    Fleet = 1,
    Compiled = 2,
}

impl CompileCache {
    pub fn new(dir: PathBuf, max_bytes: u64) -> CompileCache {
        CompileCache {
            dir,
            max_bytes,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Loads served from the cache so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Loads that had to compile so far.
    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    /// The entry of this `.wasm` for this engine.
    fn path_of(&self, engine: &Engine, wasm: &[u8]) -> PathBuf {
        use sha2::Digest;
        let hex = |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
        let engine_key = engine_key(engine);
        self.dir.join(format!(
            "{}-{}.{EXTENSION}",
            hex(&sha2::Sha256::digest(wasm)),
            hex(&engine_key[..8])
        ))
    }

    /// The compiled component, if the cache holds it; its entry is marked
    /// as just used. An unusable entry is removed.
    pub fn load(&self, engine: &Engine, wasm: &[u8]) -> Option<Component> {
        let path = self.path_of(engine, wasm);
        if !path.exists() {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        match map(engine, &path) {
            Ok(component) => {
                // The modification time is the entry's last use, for eviction.
                let _ = std::fs::File::options()
                    .append(true)
                    .open(&path)
                    .and_then(|file| file.set_modified(SystemTime::now()));
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(component)
            }
            Err(err) => {
                tracing::warn!(cache = %path.display(), error = %err, "unusable compiled component; compiling again");
                let _ = std::fs::remove_file(&path);
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Keeps a compiled component (`Engine::precompile_component`'s bytes of
    /// an engine configured as `engine`), then evicts the least recently used
    /// entries beyond the bound, and returns the entry mapped from its file
    /// (its code then lives in the page cache, shared by every host on the
    /// machine, not in this process's heap), with the file's path. Trouble
    /// only costs a later compilation; `None`: the caller loads `compiled`
    /// itself.
    pub fn store(
        &self,
        engine: &Engine,
        wasm: &[u8],
        compiled: &[u8],
    ) -> Option<(Component, PathBuf)> {
        let path = self.path_of(engine, wasm);
        let stored = std::fs::create_dir_all(&self.dir).and_then(|()| {
            // Written aside and renamed: a crash never leaves half a file under the key.
            // Named for this store alone: hosts in one process storing the same
            // component at once must not write (and truncate) one file.
            static STORES: AtomicU64 = AtomicU64::new(0);
            let store = STORES.fetch_add(1, Ordering::Relaxed);
            let partial = path.with_extension(format!("{PARTIAL}{}-{store}", std::process::id()));
            std::fs::write(&partial, compiled)?;
            std::fs::rename(&partial, &path)
        });
        if let Err(err) = stored {
            tracing::warn!(cache = %self.dir.display(), error = %err, "cannot keep the compiled component");
            return None;
        }
        self.evict(&path);
        map(engine, &path)
            .inspect_err(|err| tracing::warn!(cache = %path.display(), error = %err, "cannot map the compiled component just kept"))
            .ok()
            .map(|component| (component, path))
    }

    /// Removes least recently used entries until the cache fits its bound,
    /// and partial files a crashed store left; `keep` (the entry just
    /// written) is never removed.
    fn evict(&self, keep: &Path) {
        let Ok(listing) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let files: Vec<Entry> = listing
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let meta = entry.metadata().ok()?;
                Some(Entry {
                    path: entry.path(),
                    bytes: meta.len(),
                    used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                })
            })
            .collect();
        let now = SystemTime::now();
        for abandoned in files.iter().filter(|file| abandoned_partial(file, now)) {
            if let Err(err) = std::fs::remove_file(&abandoned.path) {
                tracing::warn!(cache = %abandoned.path.display(), error = %err, "cannot remove a partial file left by a crashed store");
            }
        }
        let entries: Vec<Entry> = files
            .into_iter()
            .filter(|file| file.path.extension().is_some_and(|ext| ext == EXTENSION))
            .collect();
        for path in to_evict(entries, self.max_bytes, keep) {
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    tracing::info!(cache = %path.display(), "evicted a compiled component (cache over its bound)")
                }
                Err(err) => {
                    tracing::warn!(cache = %path.display(), error = %err, "cannot evict a compiled component")
                }
            }
        }
    }
}

/// What tells engines whose compiled code is interchangeable from others:
/// wasmtime's compatibility hash (its version and every setting that
/// shapes the code) and weir's version.
pub(crate) fn engine_key(engine: &Engine) -> [u8; 32] {
    use sha2::Digest;
    use std::hash::Hash;
    // SHA-256 rather than std's hasher, whose output may change between
    // Rust releases: the same engine keeps finding its entries.
    let mut key = Sha256Hasher(sha2::Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut key);
    env!("CARGO_PKG_VERSION").hash(&mut key);
    key.0.finalize().into()
}

/// Feeds what a `Hash` impl writes into SHA-256.
struct Sha256Hasher(sha2::Sha256);

impl std::hash::Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        sha2::Digest::update(&mut self.0, bytes);
    }

    /// Unused: the digest is read from the inner hasher.
    fn finish(&self) -> u64 {
        0
    }
}

/// One cache file, as eviction sees it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: PathBuf,
    pub bytes: u64,
    /// Last load or store.
    pub used: SystemTime,
}

/// A cache entry mapped from its file.
fn map(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    // SAFETY: the file holds a component compiled by an engine with this
    // compatibility hash (it is in the name), written into weir's own
    // cache directory, never a plugins directory; nothing else writes there.
    unsafe { Component::deserialize_file(engine, path) }
}

/// Whether `file` is a store's partial file old enough that its store
/// crashed (a live store renames its file within seconds).
pub fn abandoned_partial(file: &Entry, now: SystemTime) -> bool {
    let partial = file
        .path
        .extension()
        .and_then(|ext| ext.to_str())
        .is_some_and(|ext| ext.starts_with(PARTIAL));
    partial
        && now
            .duration_since(file.used)
            .is_ok_and(|age| age > ABANDONED_AFTER)
}

/// The entries to remove, least recently used first, so the rest fit in
/// `max_bytes`; `keep` stays even if it alone is over the bound.
pub fn to_evict(mut entries: Vec<Entry>, max_bytes: u64, keep: &Path) -> Vec<PathBuf> {
    let mut total: u64 = entries.iter().map(|entry| entry.bytes).sum();
    entries.sort_by_key(|entry| entry.used);
    let mut evicted = Vec::new();
    for entry in entries {
        if total <= max_bytes {
            break;
        }
        if entry.path == keep {
            continue;
        }
        total = total.saturating_sub(entry.bytes);
        evicted.push(entry.path);
    }
    evicted
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT_BOUND: u64 = 1 << 30;

    fn entry(name: &str, bytes: u64, age_secs: u64) -> Entry {
        Entry {
            path: PathBuf::from(name),
            bytes,
            used: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 - age_secs),
        }
    }

    #[test]
    fn eviction_removes_the_least_recently_used_until_the_cache_fits() {
        let entries = vec![
            entry("new", 40, 1),
            entry("oldest", 30, 300),
            entry("old", 30, 200),
            entry("mid", 30, 100),
        ];
        // 130 bytes, bound 70: the two oldest go, 70 remain.
        assert_eq!(
            to_evict(entries.clone(), 70, Path::new("new")),
            vec![PathBuf::from("oldest"), PathBuf::from("old")]
        );
        assert!(to_evict(entries.clone(), 130, Path::new("new")).is_empty());
    }

    #[test]
    fn an_entry_is_named_by_the_wasm_and_the_engine_that_compiled_it() {
        let cache = CompileCache::new(PathBuf::from("/cache"), DEFAULT_BOUND);
        let plain = Engine::default();
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        let other = Engine::new(&config).unwrap();
        let name = |engine: &Engine, wasm: &[u8]| cache.path_of(engine, wasm);
        assert_eq!(name(&plain, b"a"), name(&Engine::default(), b"a"));
        assert_ne!(name(&plain, b"a"), name(&plain, b"b"));
        assert_ne!(name(&plain, b"a"), name(&other, b"a"));
        assert!(name(&plain, b"a").starts_with("/cache"));
    }

    #[test]
    fn only_partial_files_older_than_any_store_are_abandoned() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let abandoned = |name, age_secs| abandoned_partial(&entry(name, 1, age_secs), now);
        assert!(abandoned("k.partial-41-0", 2 * 3600));
        assert!(!abandoned("k.partial-41-0", 10), "a store still writing");
        assert!(
            !abandoned("k.cwasm", 2 * 3600),
            "an entry is evicted by size"
        );
        assert!(!abandoned("notes.txt", 2 * 3600), "not weir's to remove");
    }

    #[test]
    fn the_entry_just_written_stays_even_over_the_bound() {
        let entries = vec![entry("big", 500, 1), entry("old", 10, 50)];
        assert_eq!(
            to_evict(entries, 100, Path::new("big")),
            vec![PathBuf::from("old")]
        );
    }
}
