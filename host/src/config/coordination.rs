//! `[coordination]`: how this host takes part in a fleet sharing the units.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::checker::{Checker, Legacy};
use super::keys::{Fallback, Key, Reload, keep};
use super::units::HumanDuration;

/// A crashed host's units are taken over within about this long.
pub const DEFAULT_MEMBER_TTL: Duration = Duration::from_secs(5);
/// A member renews three times per TTL and steps down a second before it
/// runs out: below 3 s that leaves no time to renew.
const MIN_MEMBER_TTL: Duration = Duration::from_secs(3);

/// `[coordination]`, all of it a restart's: the membership is taken at start.
pub(super) const KEYS: &[Key] = &[
    Key::new(
        "coordination",
        "host_id",
        Fallback::Derived,
        Reload::Restart(|n, r| keep(&mut n.coordination.host_id, &r.coordination.host_id)),
    ),
    Key::new(
        "coordination",
        "member_ttl",
        Fallback::Time(DEFAULT_MEMBER_TTL),
        Reload::Restart(|n, r| keep(&mut n.coordination.member_ttl, &r.coordination.member_ttl)),
    )
    .or_legacy("member_ttl_secs"),
];

/// How this host takes part in a fleet sharing the units.
#[derive(Debug, Clone, PartialEq)]
pub struct CoordinationConfig {
    /// This host's member name; `None` keeps a generated one in the data
    /// directory, so a restarted process is recognised as the same member.
    pub host_id: Option<String>,
    /// How long a member key lives without renewal: a crashed host's units
    /// are taken over within about this long.
    pub member_ttl: Duration,
}

/// `[coordination]` as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCoordination {
    host_id: Option<Spanned<String>>,
    member_ttl: Option<Spanned<HumanDuration>>,
    member_ttl_secs: Option<Spanned<u64>>,
}

impl Checker<'_> {
    pub(super) fn coordination(&self, raw: &RawCoordination) -> CoordinationConfig {
        if let Some(id) = &raw.host_id {
            self.check_token("host_id", id);
        }
        let member_ttl = self.duration(
            "member_ttl",
            &raw.member_ttl,
            (Legacy::Secs, &raw.member_ttl_secs),
            MIN_MEMBER_TTL,
            DEFAULT_MEMBER_TTL,
        );
        CoordinationConfig {
            host_id: raw.host_id.as_ref().map(|id| id.get_ref().clone()),
            member_ttl,
        }
    }
}
