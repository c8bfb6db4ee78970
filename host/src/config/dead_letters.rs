//! `[dead_letters]`: how long the dead-letter stream keeps letters, how
//! much it may hold, and which row fields never reach it.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::checker::{Checker, Legacy};
use super::keys::{Fallback, Key, Reload, keep};
use super::units::{HumanDuration, Size};

/// Letters older than this are removed by the server: two weeks to notice
/// and replay them.
pub const DEFAULT_DEAD_LETTER_MAX_AGE: Duration = Duration::from_secs(14 * 24 * 3600);
const MIN_DEAD_LETTER_MAX_AGE: Duration = Duration::from_secs(1);
/// Past this many bytes the oldest letters are removed first.
pub const DEFAULT_DEAD_LETTER_MAX_BYTES: u64 = 1 << 30;

/// `[dead_letters]`: the retention is the stream's, set up at start;
/// `redact` is read as each letter is written.
pub(super) const KEYS: &[Key] = &[
    Key::new(
        "dead_letters",
        "max_age",
        Fallback::Time(DEFAULT_DEAD_LETTER_MAX_AGE),
        Reload::Restart(|n, r| keep(&mut n.dead_letters.max_age, &r.dead_letters.max_age)),
    ),
    Key::new(
        "dead_letters",
        "max_bytes",
        Fallback::Bytes(DEFAULT_DEAD_LETTER_MAX_BYTES),
        Reload::Restart(|n, r| keep(&mut n.dead_letters.max_bytes, &r.dead_letters.max_bytes)),
    ),
    Key::new("dead_letters", "redact", Fallback::Empty, Reload::Hot),
];

/// The dead-letter stream's retention, and what is kept out of it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLettersConfig {
    /// The server removes a letter this long after it was stored.
    pub max_age: Duration,
    /// The stream's size limit; past it the oldest letters go first.
    pub max_bytes: i64,
    /// Top-level fields of a JSON row whose values are replaced by
    /// `"[redacted]"` in its letter (the row's own copy is untouched).
    pub redact: Vec<String>,
}

impl Default for DeadLettersConfig {
    fn default() -> Self {
        DeadLettersConfig {
            max_age: DEFAULT_DEAD_LETTER_MAX_AGE,
            max_bytes: DEFAULT_DEAD_LETTER_MAX_BYTES as i64,
            redact: Vec::new(),
        }
    }
}

/// `[dead_letters]` as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDeadLetters {
    max_age: Option<Spanned<HumanDuration>>,
    max_bytes: Option<Spanned<Size>>,
    #[serde(default)]
    redact: Vec<Spanned<String>>,
}

impl Checker<'_> {
    pub(super) fn dead_letters(&self, raw: &RawDeadLetters) -> DeadLettersConfig {
        let mut redact: Vec<String> = Vec::new();
        for field in &raw.redact {
            let name = field.get_ref();
            if name.trim().is_empty() || name.trim() != name {
                self.report(
                    field.span().start,
                    format!(
                        "redact: {name:?} is not a field name (empty, or with spaces around it)"
                    ),
                );
            } else if !redact.contains(name) {
                redact.push(name.clone());
            }
        }
        DeadLettersConfig {
            max_age: self.duration(
                "max_age",
                &raw.max_age,
                (Legacy::Secs, &None),
                MIN_DEAD_LETTER_MAX_AGE,
                DEFAULT_DEAD_LETTER_MAX_AGE,
            ),
            max_bytes: i64::try_from(self.size(
                "max_bytes",
                &raw.max_bytes,
                1,
                i64::MAX as u64,
                DEFAULT_DEAD_LETTER_MAX_BYTES,
            ))
            .unwrap_or(i64::MAX),
            redact,
        }
    }
}
