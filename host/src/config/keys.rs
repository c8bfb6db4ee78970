//! Every key the TOML file takes, section by section: its default and what
//! a reload does with it. The sections state their own keys next to their
//! raw form; `reload` keeps the restart-only ones from this table, and
//! tests check it against the raw forms and against docs/configuration.md.

use std::time::Duration;

use super::Config;
use crate::capability::KeyDefault;

/// What a reload does with a key.
#[derive(Debug, Clone, Copy)]
pub enum Reload {
    /// Applied: delivery workers take it before their next batch, the front
    /// door before its next request.
    Hot,
    /// Applied, but read only when a unit's worker starts.
    UnitStart,
    /// Kept at its running value until the host restarts; the reload names it.
    Restart(Keep),
}

/// Puts a restart-only key's running value into the next config; true when
/// the next config had another value (the reload then names the key).
pub type Keep = fn(next: &mut Config, running: &Config) -> bool;

impl Reload {
    /// As docs/configuration.md's Reload column writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reload::Hot => "reload",
            Reload::UnitStart => "unit start",
            Reload::Restart(_) => "restart",
        }
    }
}

/// What a key is when the file does not set it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fallback {
    /// The key must be set.
    Required,
    /// Unset: the setting is off.
    Off,
    /// An empty list or table.
    Empty,
    Text(&'static str),
    Count(u64),
    Bool(bool),
    Bytes(u64),
    Time(Duration),
    /// The value of another key of the section.
    SameAs(&'static str),
    /// Worked out from elsewhere (the environment, the topology), as the
    /// docs explain.
    Derived,
}

/// A capability's key default (`crate::capability`) as a key of the file.
impl From<KeyDefault> for Fallback {
    fn from(default: KeyDefault) -> Fallback {
        match default {
            KeyDefault::Required => Fallback::Required,
            KeyDefault::Off => Fallback::Off,
            KeyDefault::Empty => Fallback::Empty,
            KeyDefault::Text(text) => Fallback::Text(text),
            KeyDefault::Count(count) => Fallback::Count(count),
            KeyDefault::Bool(value) => Fallback::Bool(value),
            KeyDefault::Bytes(bytes) => Fallback::Bytes(bytes),
            KeyDefault::Time(time) => Fallback::Time(time),
        }
    }
}

/// One key of the file.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// `""` for the top level, else the section as the docs head it
    /// (`nats`, `tenants`, `plugins.NAME`); `grants.state.max_keys` is a key
    /// of `plugins.NAME`.
    pub section: &'static str,
    pub name: &'static str,
    /// The older integer form of the same setting (`ack_wait_secs`).
    pub legacy: Option<&'static str>,
    pub default: Fallback,
    pub reload: Reload,
}

impl Key {
    /// A key without an older form.
    pub const fn new(
        section: &'static str,
        name: &'static str,
        default: Fallback,
        reload: Reload,
    ) -> Key {
        Key {
            section,
            name,
            legacy: None,
            default,
            reload,
        }
    }

    /// The same setting also taken as the older integer key `legacy`.
    pub const fn or_legacy(self, legacy: &'static str) -> Key {
        Key {
            legacy: Some(legacy),
            ..self
        }
    }

    /// How a reload names it: `listen`, `[delivery] drain_timeout`.
    pub fn display(&self) -> String {
        match self.section {
            "" => self.name.to_string(),
            section => format!("[{section}] {}", self.name),
        }
    }
}

/// The [`Keep`] of most keys: `running` into `next`, true when they differed.
pub fn keep<T: PartialEq + Clone>(next: &mut T, running: &T) -> bool {
    if next == running {
        return false;
    }
    *next = running.clone();
    true
}
