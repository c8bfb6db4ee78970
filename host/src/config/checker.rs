//! The [`Checker`]: turns byte offsets into `file:line:col`, collects every
//! problem, and reads the value kinds all sections share (counts, sizes,
//! durations and their older integer keys, names, keys files).

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Spanned;

use super::Problem;
use super::units::{HumanDuration, Size, show_duration, show_size};

/// Longest tenant or table name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// Longest name used verbatim in stream and consumer names.
const MAX_TOKEN_CHARS: usize = 64;

/// The unit of an older integer duration key.
#[derive(Clone, Copy)]
pub(super) enum Legacy {
    Secs,
    Millis,
}

impl Legacy {
    fn suffix(self) -> &'static str {
        match self {
            Legacy::Secs => "secs",
            Legacy::Millis => "ms",
        }
    }

    fn of(self, value: u64) -> Duration {
        match self {
            Legacy::Secs => Duration::from_secs(value),
            Legacy::Millis => Duration::from_millis(value),
        }
    }
}

/// Turns byte offsets into positions and collects problems.
pub(super) struct Checker<'a> {
    pub(super) file: PathBuf,
    base_dir: PathBuf,
    text: &'a str,
    problems: RefCell<Vec<Problem>>,
    /// Plugins whose `world` names no world (already reported): their uses
    /// are not checked against the stand-in.
    pub(super) unknown_world: RefCell<std::collections::HashSet<String>>,
}

impl<'a> Checker<'a> {
    pub(super) fn new(file: &Path, text: &'a str) -> Self {
        let base_dir = file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Checker {
            file: file.to_path_buf(),
            base_dir,
            text,
            problems: Default::default(),
            unknown_world: Default::default(),
        }
    }

    pub(super) fn problem(&self, offset: usize, message: String) -> Problem {
        let before = &self.text[..offset.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rfind('\n').map_or(before.chars().count(), |nl| {
            before[nl + 1..].chars().count()
        }) + 1;
        Problem {
            file: self.file.clone(),
            line,
            column,
            message,
        }
    }

    /// The position of `offset`, kept for later problems.
    pub(super) fn place(&self, offset: usize) -> super::Place {
        let problem = self.problem(offset, String::new());
        super::Place {
            file: problem.file,
            line: problem.line,
            column: problem.column,
        }
    }

    /// Every problem reported so far, in the file's order (serde's are
    /// found before the checker's).
    pub(super) fn take_problems(&self) -> Vec<Problem> {
        let mut problems = self.problems.take();
        problems.sort_by_key(|problem| (problem.line, problem.column));
        problems
    }

    pub(super) fn report(&self, offset: usize, message: impl Into<String>) {
        let problem = self.problem(offset, message.into());
        self.problems.borrow_mut().push(problem);
    }

    pub(super) fn resolve(&self, path: &str) -> PathBuf {
        let path = Path::new(path);
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }

    /// The keys in a keys file (one per line; blank lines and `#` comments
    /// skipped), each spanned at the file setting so problems point there.
    pub(super) fn keys_from_file(&self, file: Option<&Spanned<String>>) -> Vec<Spanned<String>> {
        let Some(file) = file else {
            return Vec::new();
        };
        let path = self.resolve(file.get_ref());
        match std::fs::read_to_string(&path) {
            Ok(text) => text
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with('#'))
                .map(|key| Spanned::new(file.span(), key.to_string()))
                .collect(),
            Err(err) => {
                self.report(
                    file.span().start,
                    format!("cannot read keys file {}: {err}", path.display()),
                );
                Vec::new()
            }
        }
    }

    /// Reports an API key with whitespace around it: requests' keys are
    /// trimmed, so it could never match.
    pub(super) fn check_key_whitespace(&self, what: &str, key: &Spanned<String>) {
        if key.get_ref().trim() != key.get_ref() {
            self.report(
                key.span().start,
                format!("{what} has whitespace around it: it could never match a request's key"),
            );
        }
    }

    /// An optional number's value, or `default`; one below `min` is
    /// reported where it is written (nothing is clamped silently).
    pub(super) fn at_least<T: PartialOrd + Copy + std::fmt::Display>(
        &self,
        name: &str,
        value: &Option<Spanned<T>>,
        min: T,
        default: T,
    ) -> T {
        match value {
            Some(set) if *set.get_ref() < min => {
                self.report(set.span().start, format!("{name} must be at least {min}"));
                default
            }
            Some(set) => *set.get_ref(),
            None => default,
        }
    }

    /// A duration written as `key = "30s"` or as its older integer key
    /// (`key_secs`, `key_ms`); `default` when absent, and one below `min`
    /// reported where it is written.
    pub(super) fn duration(
        &self,
        key: &str,
        human: &Option<Spanned<HumanDuration>>,
        (unit, legacy): (Legacy, &Option<Spanned<u64>>),
        min: Duration,
        default: Duration,
    ) -> Duration {
        let name = key.split(' ').next().unwrap_or(key);
        let legacy_key = format!("{name}_{}", unit.suffix());
        let set = match (human, legacy) {
            (Some(human), Some(old)) => {
                self.report(
                    old.span().start,
                    format!("{legacy_key} and {name} are the same setting: keep one"),
                );
                Some((human.span().start, human.get_ref().0))
            }
            (Some(human), None) => Some((human.span().start, human.get_ref().0)),
            (None, Some(old)) => Some((old.span().start, unit.of(*old.get_ref()))),
            (None, None) => None,
        };
        match set {
            Some((at, value)) if value < min => {
                self.report(at, format!("{key} must be at least {}", show_duration(min)));
                default
            }
            Some((_, value)) => value,
            None => default,
        }
    }

    /// A size in `min..=max` bytes; `default` when absent.
    pub(super) fn size(
        &self,
        key: &str,
        value: &Option<Spanned<Size>>,
        min: u64,
        max: u64,
        default: u64,
    ) -> u64 {
        match value {
            Some(set) if !(min..=max).contains(&set.get_ref().0) => {
                let range = if max == u64::MAX || max >= i64::MAX as u64 {
                    format!("at least {}", show_size(min))
                } else {
                    format!("between {} and {}", show_size(min), show_size(max))
                };
                self.report(set.span().start, format!("{key} must be {range}"));
                default
            }
            Some(set) => set.get_ref().0,
            None => default,
        }
    }

    /// A size written as `key = "64MiB"` or as its older `key_mb` integer,
    /// at least 1 MiB.
    pub(super) fn megabytes(
        &self,
        key: &str,
        human: &Option<Spanned<Size>>,
        legacy: &Option<Spanned<u32>>,
        default: u64,
        max: u64,
    ) -> u64 {
        let legacy = legacy
            .as_ref()
            .map(|mb| Spanned::new(mb.span(), Size(u64::from(*mb.get_ref()) << 20)));
        if let (Some(_), Some(old)) = (human, &legacy) {
            self.report(
                old.span().start,
                format!("{key}_mb and {key} are the same setting: keep one"),
            );
        }
        self.size(key, &human.clone().or(legacy), 1 << 20, max, default)
    }

    /// Tenant and table names are encoded into subject tokens, so any
    /// printable text will do; only emptiness, control characters and
    /// absurd lengths are refused.
    pub(super) fn check_name(&self, what: &str, name: &Spanned<String>) {
        let value = name.get_ref();
        if value.is_empty() || value.len() > MAX_NAME_BYTES || value.chars().any(char::is_control) {
            self.report(
                name.span().start,
                format!("{what} `{value}` must be 1 to {MAX_NAME_BYTES} bytes without control characters"),
            );
        }
    }

    /// A count in `1..=max`, `default` when absent.
    pub(super) fn check_count(
        &self,
        what: &str,
        value: Option<&Spanned<u32>>,
        default: u32,
        max: u32,
    ) -> u32 {
        let Some(value) = value else { return default };
        if !(1..=max).contains(value.get_ref()) {
            self.report(
                value.span().start,
                format!("{what} must be between 1 and {max}"),
            );
            return default;
        }
        *value.get_ref()
    }

    /// Names used verbatim in stream and consumer names: a safe alphabet.
    pub(super) fn check_token(&self, what: &str, name: &Spanned<String>) {
        let value = name.get_ref();
        let ok = !value.is_empty()
            && value.len() <= MAX_TOKEN_CHARS
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok {
            self.report(
                name.span().start,
                format!("{what} `{value}` must be 1 to 64 characters of A-Z, a-z, 0-9, `_` or `-`"),
            );
        }
    }
}
