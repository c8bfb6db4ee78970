//! Plugins pushed to the fleet: `weir plugin push` stores a `.wasm` in the
//! `<prefix>_plugins` object store and points `plugins.<name>` in the
//! coordination bucket at it; every host sees that key through its one
//! coordination watch, fetches the object, checks its SHA-256 and swaps the
//! plugin in as a hot reload would. `weir plugin rollback` points the key
//! back at the previous release.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, object_store};
use serde::{Deserialize, Serialize};
use sha2::Digest;
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use crate::coordination::KeyFollower;
use crate::nats::kv::{Entry, KvError, KvWrite, NatsKv};
use crate::topology::route::Router;

/// Key prefix of plugin releases in the coordination bucket.
pub const RELEASES: &str = "plugins.";

/// What `plugins.<name>` says every host should run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    /// SHA-256 (hex) of the pushed `.wasm`; `None`: each host's own file
    /// from its config (what a rollback of the first push goes back to).
    pub digest: Option<String>,
    /// The release this one replaced, for `weir plugin rollback`.
    pub previous: Option<Previous>,
    pub pushed_ms: u64,
}

/// What ran before a release (its `digest` as in [`Release`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Previous {
    pub digest: Option<String>,
}

/// The releases the fleet was told to run, as the coordination watch brings
/// them: published to the reloader only when the watch is caught up, so a
/// watch that starts over never looks like every release being withdrawn.
pub struct ReleaseFollower {
    state: Mutex<Following>,
    published: watch::Sender<BTreeMap<String, Release>>,
}

struct Following {
    releases: BTreeMap<String, Release>,
    rebuilding: bool,
}

impl ReleaseFollower {
    pub fn new() -> (
        Arc<ReleaseFollower>,
        watch::Receiver<BTreeMap<String, Release>>,
    ) {
        let (published, releases) = watch::channel(BTreeMap::new());
        let follower = ReleaseFollower {
            state: Mutex::new(Following {
                releases: BTreeMap::new(),
                rebuilding: true,
            }),
            published,
        };
        (Arc::new(follower), releases)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Following> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn publish(&self, following: &Following) {
        if !following.rebuilding {
            self.published.send_if_modified(|current| {
                let changed = *current != following.releases;
                if changed {
                    current.clone_from(&following.releases);
                }
                changed
            });
        }
    }
}

impl KeyFollower for ReleaseFollower {
    fn prefixes(&self) -> &'static [&'static str] {
        &[RELEASES]
    }

    fn apply(&self, entry: &Entry) {
        let Some(name) = entry.key.strip_prefix(RELEASES) else {
            return;
        };
        let release = entry
            .operation
            .is_put()
            .then(|| serde_json::from_slice::<Release>(&entry.value).ok())
            .flatten();
        let mut following = self.state();
        match release {
            Some(release) => following.releases.insert(name.to_string(), release),
            None => following.releases.remove(name),
        };
        self.publish(&following);
    }

    fn restart(&self) {
        let mut following = self.state();
        following.releases.clear();
        following.rebuilding = true;
    }

    fn caught_up(&self) {
        let mut following = self.state();
        following.rebuilding = false;
        self.publish(&following);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("plugin object store `{bucket}`: {reason}")]
    Store { bucket: String, reason: String },
    #[error("plugin `{name}`: {source}")]
    Kv { name: String, source: KvError },
    #[error("plugin `{name}` has no earlier release to roll back to")]
    NothingToRollBack { name: String },
    #[error(
        "plugin `{name}`: the stored object has SHA-256 {found}, not the {expected} that was pushed"
    )]
    Digest {
        name: String,
        expected: String,
        found: String,
    },
    #[error("plugin `{name}`: cannot write {path}: {source}")]
    Write {
        name: String,
        path: String,
        source: std::io::Error,
    },
}

/// SHA-256 of a `.wasm`, in hex.
pub fn digest(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn object_name(name: &str, digest: &str) -> String {
    format!("{name}.{digest}")
}

async fn store(
    client: &async_nats::Client,
    router: &Router,
) -> Result<object_store::ObjectStore, StoreError> {
    let bucket = router.plugin_store();
    let js = jetstream::new(client.clone());
    let error = |err: &dyn std::fmt::Display| StoreError::Store {
        bucket: bucket.clone(),
        reason: err.to_string(),
    };
    match js.get_object_store(&bucket).await {
        Ok(store) => Ok(store),
        Err(_) => js
            .create_object_store(object_store::Config {
                bucket: bucket.clone(),
                description: Some("weir plugins pushed to the fleet".into()),
                ..Default::default()
            })
            .await
            .map_err(|err| error(&err)),
    }
}

/// Stores `bytes` as plugin `name` and makes it the fleet's release.
pub async fn push(
    client: &async_nats::Client,
    router: &Router,
    name: &str,
    bytes: &[u8],
) -> Result<Release, StoreError> {
    let digest = digest(bytes);
    let store = store(client, router).await?;
    let object = object_name(name, &digest);
    if store.info(&object).await.is_err() {
        store
            .put(object.as_str(), &mut &bytes[..])
            .await
            .map_err(|err| StoreError::Store {
                bucket: router.plugin_store(),
                reason: err.to_string(),
            })?;
    }
    let current = current(client, router, name).await?;
    let release = Release {
        digest: Some(digest),
        previous: Some(Previous {
            digest: current.as_ref().and_then(|(r, _)| r.digest.clone()),
        }),
        pushed_ms: unix_ms(),
    };
    write(client, router, name, &release, current.map(|(_, rev)| rev)).await?;
    Ok(release)
}

/// Points plugin `name` back at the release before the current one.
pub async fn rollback(
    client: &async_nats::Client,
    router: &Router,
    name: &str,
) -> Result<Release, StoreError> {
    let nothing = || StoreError::NothingToRollBack {
        name: name.to_string(),
    };
    let (current, revision) = current(client, router, name).await?.ok_or_else(nothing)?;
    let previous = current.previous.clone().ok_or_else(nothing)?;
    let release = Release {
        digest: previous.digest,
        previous: Some(Previous {
            digest: current.digest,
        }),
        pushed_ms: unix_ms(),
    };
    write(client, router, name, &release, Some(revision)).await?;
    Ok(release)
}

async fn kv(
    client: &async_nats::Client,
    router: &Router,
    name: &str,
) -> Result<NatsKv, StoreError> {
    NatsKv::open(client, &router.coordination_bucket())
        .await
        .map_err(|source| StoreError::Kv {
            name: name.to_string(),
            source,
        })
}

async fn current(
    client: &async_nats::Client,
    router: &Router,
    name: &str,
) -> Result<Option<(Release, u64)>, StoreError> {
    let entry = kv(client, router, name)
        .await?
        .entry(&format!("{RELEASES}{name}"))
        .await
        .map_err(|source| StoreError::Kv {
            name: name.to_string(),
            source,
        })?;
    Ok(entry.filter(|e| e.operation.is_put()).and_then(|e| {
        let release = serde_json::from_slice(&e.value).ok()?;
        Some((release, e.revision))
    }))
}

async fn write(
    client: &async_nats::Client,
    router: &Router,
    name: &str,
    release: &Release,
    revision: Option<u64>,
) -> Result<(), StoreError> {
    let kv = kv(client, router, name).await?;
    let key = format!("{RELEASES}{name}");
    let value = bytes::Bytes::from(serde_json::to_vec(release).unwrap_or_default());
    // Compare-and-set: two pushes at once cannot lose one's `previous`.
    let written = match revision {
        Some(revision) => kv.update(&key, value, revision).await,
        None => kv.create(&key, value).await,
    };
    written.map(|_| ()).map_err(|source| StoreError::Kv {
        name: name.to_string(),
        source,
    })
}

/// The `.wasm` of a pushed release in `dir` (weir's own), fetched from the
/// object store and checked against its digest unless already there.
pub async fn fetch(
    client: &async_nats::Client,
    router: &Router,
    name: &str,
    digest_hex: &str,
    dir: &Path,
) -> Result<PathBuf, StoreError> {
    let path = dir.join(format!("{}.wasm", object_name(name, digest_hex)));
    if tokio::fs::read(&path)
        .await
        .is_ok_and(|bytes| digest(&bytes) == digest_hex)
    {
        return Ok(path);
    }
    let store_error = |err: &dyn std::fmt::Display| StoreError::Store {
        bucket: router.plugin_store(),
        reason: err.to_string(),
    };
    let store = jetstream::new(client.clone())
        .get_object_store(router.plugin_store())
        .await
        .map_err(|err| store_error(&err))?;
    let mut object = store
        .get(object_name(name, digest_hex))
        .await
        .map_err(|err| store_error(&err))?;
    let mut bytes = Vec::new();
    object
        .read_to_end(&mut bytes)
        .await
        .map_err(|err| store_error(&err))?;
    let found = digest(&bytes);
    if found != digest_hex {
        return Err(StoreError::Digest {
            name: name.to_string(),
            expected: digest_hex.to_string(),
            found,
        });
    }
    let write_error = |source| StoreError::Write {
        name: name.to_string(),
        path: path.display().to_string(),
        source,
    };
    tokio::fs::create_dir_all(dir).await.map_err(write_error)?;
    let partial = path.with_extension("partial");
    tokio::fs::write(&partial, &bytes)
        .await
        .map_err(write_error)?;
    tokio::fs::rename(&partial, &path)
        .await
        .map_err(write_error)?;
    Ok(path)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
