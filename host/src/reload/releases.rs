//! Plugins pushed to the fleet, in two phases. `weir plugin push` stores a
//! `.wasm` in the `<prefix>_plugins` object store and writes
//! `prepare.<name>`: every host sees it through its one coordination watch,
//! fetches the object, checks its SHA-256, loads it (compiled, linked,
//! `init`) and answers `ready.<name>.<member>`, ready or refused with the
//! reason. Only once every live member is ready does the push point
//! `plugins.<name>` at it; each host then swaps in the version it holds
//! ready, between batches, so the fleet switches at one generation and a
//! refused push switches nothing. `weir plugin rollback` points the key
//! back at the previous release, or at any release still in its history.
//!
//! The coordination bucket keeps one revision per key (member keys are
//! renewed every few seconds and the usage snapshot every second, so a
//! deeper history would multiply what the bucket stores for nothing). A
//! release therefore carries its own history, the last [`HISTORY_KEPT`]
//! releases before it, written by the same compare-and-set.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, object_store};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::Digest;
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use crate::config::PluginConfig;
use crate::coordination::{KeyFollower, MEMBERS, MemberRecord};
use crate::nats::kv::{Entry, KvError, KvWatch, KvWrite, NatsKv, WatchEvent, WatchStart};
use crate::reload::canary::{Canary, Ended, Outcome, Report, ShadowEnded, TALLIES, fleet_diff};
use crate::reload::shadow::Diff;
use crate::sandbox::{LoadError, Sandbox};
use crate::topology::route::Names;

mod compiled;
mod follower;
mod rollback;

pub use compiled::FleetCompiled;
pub use follower::{ReleaseFollower, Tallies};
pub use rollback::{RollbackTo, stage_rollback};

/// Key prefix of plugin releases in the coordination bucket.
pub const RELEASES: &str = "plugins.";
/// Key prefix of pushes being prepared: `prepare.<name>`.
pub const PREPARES: &str = "prepare.";
/// Key prefix of the members' answers: `ready.<name>.<member>`.
pub const READY: &str = "ready.";
/// How long a member's answer stays in the bucket: past any push's wait,
/// then it goes on its own.
const READY_TTL: Duration = Duration::from_secs(600);

/// What `prepare.<name>` asks every host: load this version and say
/// whether it can run it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepare {
    /// SHA-256 (hex) of the pushed `.wasm`.
    pub digest: String,
    /// Tells this push from an earlier one of the same digest.
    pub pushed_ms: u64,
}

/// A member's answer to a [`Prepare`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    pub digest: String,
    pub pushed_ms: u64,
    /// Why this member cannot run it; `None`: loaded and ready.
    #[serde(default)]
    pub refused: Option<String>,
}
/// Earlier releases a release remembers: enough to go back days of pushes,
/// small enough that the key stays a few kilobytes.
pub const HISTORY_KEPT: usize = 32;
/// Hex digits of a digest that make a plugin's version as member keys and
/// status report it (`sandbox::version_of`: the first 6 bytes).
const VERSION_HEX: usize = 12;

/// What `plugins.<name>` says every host should run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    /// SHA-256 (hex) of the pushed `.wasm`; `None`: each host's own file
    /// from its config (what a rollback of the first push goes back to).
    pub digest: Option<String>,
    /// The release this one replaced, for `weir plugin rollback`.
    pub previous: Option<Previous>,
    pub pushed_ms: u64,
    /// How it was made; `None` in releases written by an older weir.
    #[serde(default)]
    pub how: Option<How>,
    /// The releases before this one, newest first (at most
    /// [`HISTORY_KEPT`]); empty in releases written by an older weir.
    #[serde(default)]
    pub history: Vec<Step>,
    /// A candidate serving some tenants beside this release, if one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<Canary>,
    /// How the last canary ended, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<Ended>,
    /// The last shadow's fleet-wide differences as they stood when it
    /// ended (the hosts' counts expire soon after): `weir plugin diff`
    /// shows them until the plugin's next shadow starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_shadow: Option<ShadowEnded>,
}

/// What made a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum How {
    Push,
    Rollback,
    /// A canary's candidate made the release.
    Promote,
}

impl How {
    pub fn as_str(self) -> &'static str {
        match self {
            How::Push => "push",
            How::Rollback => "rollback",
            How::Promote => "promote",
        }
    }
}

/// One release in a release's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// As in [`Release`]: `None` is each host's own file.
    pub digest: Option<String>,
    pub pushed_ms: u64,
    #[serde(default)]
    pub how: Option<How>,
}

impl Release {
    /// This release as a step of the history.
    pub fn step(&self) -> Step {
        Step {
            digest: self.digest.clone(),
            pushed_ms: self.pushed_ms,
            how: self.how,
        }
    }

    /// This release and every one before it that it remembers, newest first.
    pub fn steps(&self) -> impl Iterator<Item = Step> + '_ {
        std::iter::once(self.step()).chain(self.history.iter().cloned())
    }

    /// The release that replaces this one with `digest`.
    fn followed_by(&self, digest: Option<String>, how: How) -> Release {
        let mut history: Vec<Step> = self.steps().collect();
        history.truncate(HISTORY_KEPT);
        Release {
            digest,
            previous: Some(Previous {
                digest: self.digest.clone(),
            }),
            pushed_ms: unix_ms(),
            how: Some(how),
            history,
            canary: None,
            ended: self.ended.clone(),
            last_shadow: self.last_shadow.clone(),
        }
    }
}

/// The version (as member keys and status report it) of a pushed digest.
pub fn version_of_digest(digest: &str) -> &str {
    digest.get(..VERSION_HEX).unwrap_or(digest)
}

/// What ran before a release (its `digest` as in [`Release`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Previous {
    pub digest: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("plugin object store `{bucket}`: {reason}")]
    Store { bucket: String, reason: String },
    #[error("plugin `{name}`")]
    Kv { name: String, source: KvError },
    #[error(
        "plugin `{name}` has a canary of {version} running: promote it (`weir plugin promote {name}`) or end it (`weir plugin rollback {name}`) first"
    )]
    CanaryRunning { name: String, version: String },
    #[error("plugin `{name}` has no canary running")]
    NoCanary { name: String },
    #[error(
        "plugin `{name}`: the fleet already serves {version}; a canary of it would change nothing"
    )]
    CanaryOfServing { name: String, version: String },
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
    #[error("refused, nothing pushed")]
    Refused { name: String, source: LoadError },
    #[error("plugin `{name}`: {path} changed while it was being checked; nothing pushed")]
    Changed { name: String, path: String },
    #[error(
        "plugin `{name}`: `{wanted}` is not a digest (hex digits, or `file` for each host's own file)"
    )]
    NotADigest { name: String, wanted: String },
    #[error("plugin `{name}`: no release `{wanted}` in its history (it has {known})")]
    NoSuchRelease {
        name: String,
        wanted: String,
        known: String,
    },
    #[error("plugin `{name}`: `{wanted}` matches several releases ({matches}); give more digits")]
    AmbiguousRelease {
        name: String,
        wanted: String,
        matches: String,
    },
    #[error(
        "plugin `{name}`: release {digest} is no longer in the object store `{bucket}`; push its file again"
    )]
    ObjectGone {
        name: String,
        digest: String,
        bucket: String,
    },
}

/// Why `--wait` gave up.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("plugin `{name}`: cannot follow the members")]
    Kv { name: String, source: KvError },
    #[error("plugin `{name}`: no live member reported running {version} within {waited:?}")]
    NoMembers {
        name: String,
        version: String,
        waited: Duration,
    },
    #[error(
        "plugin `{name}`: after {waited:?}, {count} of {members} live members do not run {version}: {behind}"
    )]
    Timeout {
        name: String,
        version: String,
        waited: Duration,
        count: usize,
        members: usize,
        /// Each member behind and what it runs.
        behind: String,
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
    router: &Names,
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

/// Loads `file` (whose content is `bytes`) as `plugin` would run it —
/// compiled, checked against its world, linked and `init` with its
/// settings, as `weir check` does — so a plugin no host could run is
/// refused before anything is pushed.
pub async fn check(
    sandbox: &Sandbox,
    plugin: &PluginConfig,
    file: &Path,
    bytes: &[u8],
) -> Result<(), StoreError> {
    let candidate = PluginConfig {
        wasm: file.to_path_buf(),
        ..plugin.clone()
    };
    let loaded = sandbox
        .load(&candidate)
        .await
        .map_err(|source| StoreError::Refused {
            name: plugin.name.clone(),
            source,
        })?;
    // The sandbox read the file again: what was checked must be what is pushed.
    if loaded.version != crate::sandbox::version_of(bytes) {
        return Err(StoreError::Changed {
            name: plugin.name.clone(),
            path: file.display().to_string(),
        });
    }
    Ok(())
}

/// A push whose `.wasm` is stored, not yet the fleet's release.
#[derive(Debug, Clone)]
pub struct Staged {
    pub name: String,
    /// As in [`Release`]: `None` is each host's own file (a rollback).
    pub digest: Option<String>,
    /// The release it replaces and that key's revision (compare-and-set).
    current: Option<(Release, u64)>,
    pushed_ms: u64,
    how: How,
}

/// Stores `bytes` as plugin `name` in the object store; `None` when the
/// fleet runs exactly that already (a push of it changes nothing).
pub async fn stage(
    client: &async_nats::Client,
    router: &Names,
    name: &str,
    bytes: &[u8],
) -> Result<Option<Staged>, StoreError> {
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
    if let Some((release, _)) = &current {
        if let Some(canary) = &release.canary {
            return Err(StoreError::CanaryRunning {
                name: name.to_string(),
                version: version_of_digest(&canary.digest).to_string(),
            });
        }
        if release.digest.as_deref() == Some(digest.as_str()) {
            return Ok(None);
        }
    }
    Ok(Some(Staged {
        name: name.to_string(),
        digest: Some(digest),
        current,
        pushed_ms: unix_ms(),
        how: How::Push,
    }))
}

/// Why a push's first phase failed; nothing switched.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("plugin `{name}`: cannot follow the members' answers")]
    Kv { name: String, source: KvError },
    #[error("plugin `{name}`: no live member to run {version}; nothing switched")]
    NoMembers { name: String, version: String },
    #[error(
        "plugin `{name}`: {count} of {members} live members cannot run {version}, nothing switched: {reasons}"
    )]
    Refused {
        name: String,
        version: String,
        count: usize,
        members: usize,
        /// Each refusing member and its reason.
        reasons: String,
    },
    #[error(
        "plugin `{name}`: after {waited:?}, {count} of {members} live members have not said whether they can run {version}: {silent}; nothing switched"
    )]
    Timeout {
        name: String,
        version: String,
        waited: Duration,
        count: usize,
        members: usize,
        silent: String,
    },
}

/// The first phase: asks every live member to load `staged` (fetch,
/// compile, `init`) and waits until each has answered. Ready everywhere:
/// the members, named; a refusal or silence past `timeout`: the error, and
/// the request is withdrawn.
pub async fn prepare(
    client: &async_nats::Client,
    router: &Names,
    staged: &Staged,
    timeout: Duration,
) -> Result<Vec<String>, PrepareError> {
    let name = staged.name.as_str();
    // Each host's own file: loaded at its start, nothing to fetch ahead.
    let Some(digest) = &staged.digest else {
        return Ok(Vec::new());
    };
    let kv_error = |source| PrepareError::Kv {
        name: name.to_string(),
        source,
    };
    let kv = NatsKv::open(client, &router.coordination_bucket())
        .await
        .map_err(kv_error)?;
    let answers = format!("{READY}{name}.");
    let mut watch = kv
        .watch_prefixes(&[MEMBERS, answers.as_str()], WatchStart::CurrentValues)
        .await
        .map_err(kv_error)?;
    let request = Prepare {
        digest: digest.clone(),
        pushed_ms: staged.pushed_ms,
    };
    let key = format!("{PREPARES}{name}");
    // Plain data always serializes.
    let value = bytes::Bytes::from(serde_json::to_vec(&request).unwrap_or_default());
    if let Err(err) = kv.put(&key, value).await {
        watch.close().await;
        return Err(kv_error(err));
    }
    let version = version_of_digest(digest).to_string();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut members: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut ready: BTreeMap<String, Ready> = BTreeMap::new();
    let mut caught_up = false;
    let result = loop {
        let answer = |member: &str| {
            ready
                .get(member)
                .filter(|r| r.digest == request.digest && r.pushed_ms == request.pushed_ms)
        };
        if caught_up && !members.is_empty() && members.keys().all(|m| answer(m).is_some()) {
            let refused: Vec<String> = members
                .keys()
                .filter_map(|m| Some(format!("{m}: {}", answer(m)?.refused.as_ref()?)))
                .collect();
            break match refused.is_empty() {
                true => Ok(members.keys().cloned().collect()),
                false => Err(PrepareError::Refused {
                    name: name.to_string(),
                    version: version.clone(),
                    count: refused.len(),
                    members: members.len(),
                    reasons: refused.join("; "),
                }),
            };
        }
        match tokio::time::timeout_at(deadline, watch.next()).await {
            Ok(Some(Ok(WatchEvent::CaughtUp))) => caught_up = true,
            Ok(Some(Ok(WatchEvent::Update(entry)))) => {
                if let Some(member) = entry.key.strip_prefix(answers.as_str()) {
                    let record = entry
                        .operation
                        .is_put()
                        .then(|| serde_json::from_slice::<Ready>(&entry.value).ok())
                        .flatten();
                    match record {
                        Some(record) => ready.insert(member.to_string(), record),
                        None => ready.remove(member),
                    };
                } else {
                    apply_member(&mut members, &entry);
                }
            }
            Ok(Some(Err(err))) => break Err(kv_error(err)),
            Ok(None) => break Err(kv_error(watch_ended(&kv))),
            Err(_) if members.is_empty() => {
                break Err(PrepareError::NoMembers {
                    name: name.to_string(),
                    version: version.clone(),
                });
            }
            Err(_) => {
                let silent: Vec<&str> = members
                    .keys()
                    .filter(|m| answer(m).is_none())
                    .map(String::as_str)
                    .collect();
                break Err(PrepareError::Timeout {
                    name: name.to_string(),
                    version: version.clone(),
                    waited: timeout,
                    count: silent.len(),
                    members: members.len(),
                    silent: silent.join(", "),
                });
            }
        }
    };
    watch.close().await;
    if result.is_err()
        && let Err(err) = kv.delete(&key).await
    {
        tracing::warn!(error = %err, plugin = %name, "cannot withdraw the push's prepare request");
    }
    result
}

/// The second phase: makes a prepared push the fleet's release (every
/// host swaps in the version it holds ready), then withdraws the prepare
/// request. Refused if another push or rollback changed the release since
/// [`stage`].
pub async fn activate(
    client: &async_nats::Client,
    router: &Names,
    staged: Staged,
) -> Result<Release, StoreError> {
    let Staged {
        name,
        digest,
        current,
        how,
        ..
    } = staged;
    let release = match &current {
        Some((current, _)) => current.followed_by(digest, how),
        None => Release {
            digest,
            previous: Some(Previous { digest: None }),
            pushed_ms: unix_ms(),
            how: Some(how),
            history: Vec::new(),
            canary: None,
            ended: None,
            last_shadow: None,
        },
    };
    write_and_withdraw(client, router, &name, release, current.map(|(_, rev)| rev)).await
}

/// Writes `release` over revision `revision` (compare-and-set), then
/// withdraws the prepare request the push made: its second phase is done.
async fn write_and_withdraw(
    client: &async_nats::Client,
    router: &Names,
    name: &str,
    release: Release,
    revision: Option<u64>,
) -> Result<Release, StoreError> {
    write(client, router, name, &release, revision).await?;
    let kv = kv(client, router, name).await?;
    if let Err(err) = kv.delete(&format!("{PREPARES}{name}")).await {
        tracing::warn!(error = %err, plugin = %name, "cannot withdraw the push's prepare request");
    }
    Ok(release)
}

/// The second phase of a canary push: the prepared candidate serves the
/// tenants `canary` names beside the release (every host holds both
/// loaded), then the prepare request is withdrawn. Refused if another
/// push or rollback changed the release since [`stage`].
pub async fn activate_canary(
    client: &async_nats::Client,
    router: &Names,
    staged: Staged,
    canary: Canary,
) -> Result<Release, StoreError> {
    let Staged { name, current, .. } = staged;
    let mut release = match &current {
        Some((current, _)) => current.clone(),
        None => Release {
            digest: None,
            previous: None,
            pushed_ms: unix_ms(),
            how: None,
            history: Vec::new(),
            canary: None,
            ended: None,
            last_shadow: None,
        },
    };
    // A new shadow's differences replace the last one's.
    if canary.shadow {
        release.last_shadow = None;
    }
    release.canary = Some(canary);
    write_and_withdraw(client, router, &name, release, current.map(|(_, rev)| rev)).await
}

/// Ends plugin `name`'s canary: promoted (its candidate becomes the
/// release; every host holds it loaded already, so nothing is prepared) or
/// rolled back (the release serves everyone again), recording who and why.
/// `only`: end it only if it is still this canary (the leader's judgement
/// of it); `Ok(None)` when it is not.
pub async fn end_canary(
    client: &async_nats::Client,
    router: &Names,
    name: &str,
    only: Option<&Canary>,
    outcome: Outcome,
    by: &str,
    reason: String,
) -> Result<Option<Release>, StoreError> {
    let no_canary = || StoreError::NoCanary {
        name: name.to_string(),
    };
    let (current, revision) = current(client, router, name).await?.ok_or_else(no_canary)?;
    let Some(canary) = current.canary.clone() else {
        return match only {
            Some(_) => Ok(None),
            None => Err(no_canary()),
        };
    };
    if only.is_some_and(|only| *only != canary) {
        return Ok(None);
    }
    let ended = Ended {
        digest: canary.digest.clone(),
        outcome,
        by: by.to_string(),
        reason,
        at_ms: unix_ms(),
    };
    let mut release = match outcome {
        Outcome::Promoted => current.followed_by(Some(canary.digest.clone()), How::Promote),
        Outcome::RolledBack => current.clone(),
    };
    if canary.shadow {
        // Kept in the release: the members' reports expire after TALLY_TTL.
        let diff = match canary_reports(client, router, name).await {
            Ok(reports) => fleet_diff(&canary, reports.values()),
            Err(err) => {
                tracing::warn!(error = %err, plugin = %name, "cannot read the shadow's differences to keep them");
                Diff::default()
            }
        };
        release.last_shadow = Some(ShadowEnded {
            digest: canary.digest.clone(),
            serving: current.digest.clone(),
            started_ms: canary.started_ms,
            ended_ms: ended.at_ms,
            diff,
        });
    }
    release.canary = None;
    release.ended = Some(ended);
    write(client, router, name, &release, Some(revision)).await?;
    Ok(Some(release))
}

/// A member's answer to a prepare request, kept for [`READY_TTL`].
pub async fn answer(kv: &NatsKv, name: &str, member: &str, ready: &Ready) -> Result<(), KvError> {
    // Plain data always serializes.
    let value = bytes::Bytes::from(serde_json::to_vec(ready).unwrap_or_default());
    kv.put_with_ttl(&format!("{READY}{name}.{member}"), value, READY_TTL)
        .await
        .map(|_| ())
}

/// The push of plugin `name` being prepared, if one is.
pub async fn preparing(
    client: &async_nats::Client,
    router: &Names,
    name: &str,
) -> Result<Option<Prepare>, StoreError> {
    Ok(read_put(client, router, name, &format!("{PREPARES}{name}"))
        .await?
        .map(|(prepare, _)| prepare))
}

/// Plugin `name`'s current release, if it was ever pushed.
pub async fn release(
    client: &async_nats::Client,
    router: &Names,
    name: &str,
) -> Result<Option<Release>, StoreError> {
    Ok(current(client, router, name)
        .await?
        .map(|(release, _)| release))
}

/// The plugin versions each live member reports (its member key), by member.
pub async fn member_versions(
    client: &async_nats::Client,
    router: &Names,
) -> Result<BTreeMap<String, BTreeMap<String, String>>, KvError> {
    let kv = NatsKv::open(client, &router.coordination_bucket()).await?;
    let mut watch = kv
        .watch_prefixes(&[MEMBERS], WatchStart::CurrentValues)
        .await?;
    let mut members = BTreeMap::new();
    let result = loop {
        match watch.next().await {
            Some(Ok(WatchEvent::CaughtUp)) => break Ok(members),
            Some(Ok(WatchEvent::Update(entry))) => apply_member(&mut members, &entry),
            Some(Err(err)) => break Err(err),
            None => break Err(watch_ended(&kv)),
        }
    };
    watch.close().await;
    result
}

/// Each member's counts of plugin `name`'s canaries (`canary.<name>.`).
pub async fn canary_reports(
    client: &async_nats::Client,
    router: &Names,
    name: &str,
) -> Result<BTreeMap<String, Report>, KvError> {
    let kv = NatsKv::open(client, &router.coordination_bucket()).await?;
    let prefix = format!("{TALLIES}{name}.");
    let mut watch = kv
        .watch_prefixes(&[prefix.as_str()], WatchStart::CurrentValues)
        .await?;
    let mut reports = BTreeMap::new();
    let result = loop {
        match watch.next().await {
            Some(Ok(WatchEvent::CaughtUp)) => break Ok(reports),
            Some(Ok(WatchEvent::Update(entry))) => {
                let Some(member) = entry.key.strip_prefix(prefix.as_str()) else {
                    continue;
                };
                let report = entry
                    .operation
                    .is_put()
                    .then(|| serde_json::from_slice::<Report>(&entry.value).ok())
                    .flatten();
                match report {
                    Some(report) => reports.insert(member.to_string(), report),
                    None => reports.remove(member),
                };
            }
            Some(Err(err)) => break Err(err),
            None => break Err(watch_ended(&kv)),
        }
    };
    watch.close().await;
    result
}

/// Waits until every live member reports `version` for plugin `name`;
/// returns them. Member keys carry the versions each host runs and are
/// renewed every third of their TTL, so this follows them (no polling).
pub async fn wait_for(
    client: &async_nats::Client,
    router: &Names,
    name: &str,
    version: &str,
    timeout: Duration,
) -> Result<Vec<String>, WaitError> {
    let kv_error = |source| WaitError::Kv {
        name: name.to_string(),
        source,
    };
    let kv = NatsKv::open(client, &router.coordination_bucket())
        .await
        .map_err(kv_error)?;
    let mut watch = kv
        .watch_prefixes(&[MEMBERS], WatchStart::CurrentValues)
        .await
        .map_err(kv_error)?;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut members = BTreeMap::new();
    let mut caught_up = false;
    let result = loop {
        let runs = |plugins: &BTreeMap<String, String>| {
            plugins.get(name).map(String::as_str) == Some(version)
        };
        if caught_up && !members.is_empty() && members.values().all(runs) {
            break Ok(members.keys().cloned().collect());
        }
        match tokio::time::timeout_at(deadline, watch.next()).await {
            Ok(Some(Ok(WatchEvent::CaughtUp))) => caught_up = true,
            Ok(Some(Ok(WatchEvent::Update(entry)))) => apply_member(&mut members, &entry),
            Ok(Some(Err(err))) => break Err(kv_error(err)),
            Ok(None) => break Err(kv_error(watch_ended(&kv))),
            Err(_) if members.is_empty() => {
                break Err(WaitError::NoMembers {
                    name: name.to_string(),
                    version: version.to_string(),
                    waited: timeout,
                });
            }
            Err(_) => {
                let behind: Vec<String> = members
                    .iter()
                    .filter(|(_, plugins)| !runs(plugins))
                    .map(|(member, plugins)| match plugins.get(name) {
                        Some(running) => format!("{member} runs {running}"),
                        None => format!("{member} runs no `{name}`"),
                    })
                    .collect();
                break Err(WaitError::Timeout {
                    name: name.to_string(),
                    version: version.to_string(),
                    waited: timeout,
                    count: behind.len(),
                    members: members.len(),
                    behind: behind.join(", "),
                });
            }
        }
    };
    watch.close().await;
    result
}

/// A member key's change, applied to what each member runs.
fn apply_member(members: &mut BTreeMap<String, BTreeMap<String, String>>, entry: &Entry) {
    let Some(member) = entry.key.strip_prefix(MEMBERS) else {
        return;
    };
    let record = entry
        .operation
        .is_put()
        .then(|| serde_json::from_slice::<MemberRecord>(&entry.value).ok())
        .flatten();
    match record {
        Some(record) => members.insert(member.to_string(), record.plugins),
        None => members.remove(member),
    };
}

fn watch_ended(kv: &NatsKv) -> KvError {
    KvError::Unavailable {
        bucket: kv.bucket().to_string(),
        reason: "the watch of member keys ended".into(),
    }
}

async fn kv(client: &async_nats::Client, router: &Names, name: &str) -> Result<NatsKv, StoreError> {
    NatsKv::open(client, &router.coordination_bucket())
        .await
        .map_err(|source| StoreError::Kv {
            name: name.to_string(),
            source,
        })
}

async fn current(
    client: &async_nats::Client,
    router: &Names,
    name: &str,
) -> Result<Option<(Release, u64)>, StoreError> {
    read_put(client, router, name, &format!("{RELEASES}{name}")).await
}

/// Key `key` of plugin `name`'s records, decoded with its revision, if it
/// holds a value (a deleted key, or one an older weir cannot read: none).
async fn read_put<T: serde::de::DeserializeOwned>(
    client: &async_nats::Client,
    router: &Names,
    name: &str,
    key: &str,
) -> Result<Option<(T, u64)>, StoreError> {
    let entry = kv(client, router, name)
        .await?
        .entry(key)
        .await
        .map_err(|source| StoreError::Kv {
            name: name.to_string(),
            source,
        })?;
    Ok(entry.filter(|e| e.operation.is_put()).and_then(|e| {
        let value = serde_json::from_slice(&e.value).ok()?;
        Some((value, e.revision))
    }))
}

async fn write(
    client: &async_nats::Client,
    router: &Names,
    name: &str,
    release: &Release,
    revision: Option<u64>,
) -> Result<(), StoreError> {
    let kv = kv(client, router, name).await?;
    let key = format!("{RELEASES}{name}");
    // A struct of strings and numbers always serializes.
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
    router: &Names,
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

/// Milliseconds since the Unix epoch, as releases record time.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests;
