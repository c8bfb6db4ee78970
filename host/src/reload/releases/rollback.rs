//! Where `weir plugin rollback` goes: the release before, each host's
//! own file, or a version still in the release's history.

use super::*;

/// What `weir plugin rollback --to` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollbackTo {
    /// The release before the current one.
    Previous,
    /// Each host's own file from its config.
    File,
    /// A release in the history, by its digest or a unique prefix of it.
    Digest(String),
}

impl RollbackTo {
    /// `file`, else a digest prefix; none: the previous release.
    pub fn parse(wanted: Option<&str>) -> RollbackTo {
        match wanted {
            None => RollbackTo::Previous,
            Some(text) if text.eq_ignore_ascii_case("file") => RollbackTo::File,
            Some(text) => RollbackTo::Digest(text.to_ascii_lowercase()),
        }
    }
}

/// Stages pointing plugin `name` back at an earlier release: the one before
/// the current one, each host's own file, or one from the history; `None`
/// when the fleet runs that already. It goes through [`prepare`] and
/// [`activate`] as a push does.
pub async fn stage_rollback(
    client: &async_nats::Client,
    router: &Names,
    name: &str,
    to: &RollbackTo,
) -> Result<Option<Staged>, StoreError> {
    let nothing = || StoreError::NothingToRollBack {
        name: name.to_string(),
    };
    let (current, revision) = current(client, router, name).await?.ok_or_else(nothing)?;
    let target = match to {
        RollbackTo::Previous => current.previous.clone().ok_or_else(nothing)?.digest,
        RollbackTo::File => None,
        RollbackTo::Digest(wanted) => Some(resolve(name, &current, wanted)?),
    };
    if target == current.digest {
        return Ok(None);
    }
    if let Some(digest) = &target {
        // A host that cannot fetch the object would refuse the release.
        let store = store(client, router).await?;
        if store.info(object_name(name, digest)).await.is_err() {
            return Err(StoreError::ObjectGone {
                name: name.to_string(),
                digest: digest.clone(),
                bucket: router.plugin_store(),
            });
        }
    }
    Ok(Some(Staged {
        name: name.to_string(),
        digest: target,
        current: Some((current, revision)),
        pushed_ms: unix_ms(),
        how: How::Rollback,
    }))
}

/// The one digest in `current`'s history that starts with `wanted`.
pub(super) fn resolve(name: &str, current: &Release, wanted: &str) -> Result<String, StoreError> {
    if wanted.is_empty() || !wanted.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(StoreError::NotADigest {
            name: name.to_string(),
            wanted: wanted.to_string(),
        });
    }
    let mut known: Vec<String> = current
        .steps()
        .filter_map(|step| step.digest)
        .chain(current.previous.iter().filter_map(|p| p.digest.clone()))
        .collect();
    known.sort();
    known.dedup();
    let matches: Vec<&String> = known.iter().filter(|d| d.starts_with(wanted)).collect();
    let short = |digests: &mut dyn Iterator<Item = &String>| {
        digests
            .map(|d| version_of_digest(d).to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match matches.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(StoreError::NoSuchRelease {
            name: name.to_string(),
            wanted: wanted.to_string(),
            known: if known.is_empty() {
                "none".to_string()
            } else {
                short(&mut known.iter())
            },
        }),
        several => Err(StoreError::AmbiguousRelease {
            name: name.to_string(),
            wanted: wanted.to_string(),
            matches: short(&mut several.iter().copied()),
        }),
    }
}
