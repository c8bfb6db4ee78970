//! Shadows: a pushed candidate of a transform that serves no tenant but
//! runs, on each host, on copies of the batches the release transforms,
//! off the serving path (`delivery::shadow`). Nothing it answers is
//! delivered, acked, dead-lettered or written: per row, its outcome is
//! compared with the release's, and the differences are kept by class
//! (`ok→dead_letter`, `emit payload differs`) with counts and a few
//! examples. Each host shares its [`Diff`] in its canary report
//! (`canary.<name>.<member>`); `weir plugin diff` sums them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Examples kept per difference class (per host, and fleet-wide).
pub const EXAMPLES_KEPT: usize = 3;
/// Characters of an outcome an example keeps.
pub const EXAMPLE_CHARS: usize = 200;

/// What one version did with one row, owned, for comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowResult {
    /// Passed on as it is.
    Ok,
    /// Replaced by these rows' payloads (none: dropped).
    Emit(Vec<Vec<u8>>),
    Retry(u32),
    DeadLetter(String),
    /// The call failed (trap, deadline, malformed answer): every row of it.
    Failed(String),
}

impl RowResult {
    /// The outcome kind a class names.
    pub fn kind(&self) -> &'static str {
        match self {
            RowResult::Ok => "ok",
            RowResult::Emit(rows) if rows.is_empty() => "drop",
            RowResult::Emit(_) => "emit",
            RowResult::Retry(_) => "retry",
            RowResult::DeadLetter(_) => "dead_letter",
            RowResult::Failed(_) => "failed",
        }
    }

    /// For an example: the kind, then what it said, truncated.
    pub fn describe(&self) -> String {
        let text = match self {
            RowResult::Ok => "ok".to_string(),
            RowResult::Emit(rows) if rows.is_empty() => "drop".to_string(),
            RowResult::Emit(rows) => {
                let shown: Vec<String> = rows.iter().map(|p| show_payload(p)).collect();
                format!("emit {}", shown.join(", "))
            }
            RowResult::Retry(ms) => format!("retry after {ms} ms"),
            RowResult::DeadLetter(reason) => format!("dead_letter: {reason}"),
            RowResult::Failed(error) => format!("failed: {error}"),
        };
        truncate(&text, EXAMPLE_CHARS)
    }
}

/// A payload as JSON when it parses (compact), else its bytes, lossily.
fn show_payload(payload: &[u8]) -> String {
    match serde_json::from_slice::<serde_json::Value>(payload) {
        Ok(value) => value.to_string(),
        Err(_) => String::from_utf8_lossy(payload).into_owned(),
    }
}

/// Whether two payloads say the same: equal JSON values where both parse
/// (key order and spacing aside), equal bytes otherwise.
fn same_payload(a: &[u8], b: &[u8]) -> bool {
    if a == b {
        return true;
    }
    match (
        serde_json::from_slice::<serde_json::Value>(a),
        serde_json::from_slice::<serde_json::Value>(b),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

fn truncate(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// The difference class of one row's two outcomes; `None`: the same.
pub fn classify(serving: &RowResult, candidate: &RowResult) -> Option<String> {
    if serving.kind() != candidate.kind() {
        return Some(format!("{}→{}", serving.kind(), candidate.kind()));
    }
    match (serving, candidate) {
        (RowResult::Emit(a), RowResult::Emit(b)) if a.len() != b.len() => {
            Some("emit count differs".to_string())
        }
        (RowResult::Emit(a), RowResult::Emit(b))
            if a.iter().zip(b).any(|(a, b)| !same_payload(a, b)) =>
        {
            Some("emit payload differs".to_string())
        }
        (RowResult::DeadLetter(a), RowResult::DeadLetter(b)) if a != b => {
            Some("dead_letter reason differs".to_string())
        }
        (RowResult::Retry(a), RowResult::Retry(b)) if a != b => {
            Some("retry delay differs".to_string())
        }
        (RowResult::Failed(a), RowResult::Failed(b)) if a != b => {
            Some("failure differs".to_string())
        }
        _ => None,
    }
}

/// One row whose outcomes differ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Example {
    pub tenant: String,
    pub table: String,
    /// Its sequence in its partition stream.
    pub sequence: u64,
    /// What the release did, then the candidate (truncated).
    pub serving: String,
    pub candidate: String,
}

/// One class of differences: how many rows, and a few of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Class {
    pub rows: u64,
    pub examples: Vec<Example>,
}

/// A shadow's differences from the release.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diff {
    /// Rows both versions answered and were compared.
    pub compared: u64,
    /// Rows of batches not compared: the shadow's queue was full (it never
    /// holds the serving path up), or its copy could not be made.
    pub skipped: u64,
    /// By class (`ok→dead_letter`).
    pub classes: BTreeMap<String, Class>,
}

impl Diff {
    /// Compares one row's outcomes and counts it.
    pub fn compare(
        &mut self,
        (tenant, table, sequence): (&str, &str, u64),
        serving: &RowResult,
        candidate: &RowResult,
    ) {
        self.compared += 1;
        let Some(class) = classify(serving, candidate) else {
            return;
        };
        let class = self.classes.entry(class).or_default();
        class.rows += 1;
        if class.examples.len() < EXAMPLES_KEPT {
            class.examples.push(Example {
                tenant: tenant.to_string(),
                table: table.to_string(),
                sequence,
                serving: serving.describe(),
                candidate: candidate.describe(),
            });
        }
    }

    /// Adds another count of the same shadow (another batch, another host).
    pub fn add(&mut self, other: &Diff) {
        self.compared += other.compared;
        self.skipped += other.skipped;
        for (name, theirs) in &other.classes {
            let class = self.classes.entry(name.clone()).or_default();
            class.rows += theirs.rows;
            let room = EXAMPLES_KEPT.saturating_sub(class.examples.len());
            class
                .examples
                .extend(theirs.examples.iter().take(room).cloned());
        }
    }

    /// Rows whose outcomes differ, every class.
    pub fn differing(&self) -> u64 {
        self.classes.values().map(|c| c.rows).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_classed_by_kind_then_by_what_they_said() {
        let emit = |p: &str| RowResult::Emit(vec![p.as_bytes().to_vec()]);
        let dead = RowResult::DeadLetter("missing `email`".into());
        assert_eq!(
            classify(&RowResult::Ok, &dead).as_deref(),
            Some("ok→dead_letter")
        );
        assert_eq!(
            classify(&RowResult::Ok, &RowResult::Emit(Vec::new())).as_deref(),
            Some("ok→drop")
        );
        // JSON compares as values: key order and spaces are no difference.
        assert_eq!(
            classify(&emit(r#"{"a":1,"b":2}"#), &emit(r#"{ "b":2, "a":1 }"#)),
            None
        );
        assert_eq!(
            classify(&emit(r#"{"a":1}"#), &emit(r#"{"a":2}"#)).as_deref(),
            Some("emit payload differs")
        );
        assert_eq!(
            classify(
                &emit("x"),
                &RowResult::Emit(vec![b"x".to_vec(), b"y".to_vec()])
            )
            .as_deref(),
            Some("emit count differs")
        );
        assert_eq!(classify(&dead, &dead), None);
        assert_eq!(classify(&RowResult::Ok, &RowResult::Ok), None);
    }

    #[test]
    fn a_diff_counts_every_row_keeps_a_few_examples_and_sums_across_hosts() {
        let mut a = Diff::default();
        let dead = RowResult::DeadLetter("x".repeat(500));
        for seq in 0..10 {
            a.compare(("t", "orders", seq), &RowResult::Ok, &dead);
        }
        a.compare(("t", "orders", 10), &RowResult::Ok, &RowResult::Ok);
        let class = &a.classes["ok→dead_letter"];
        assert_eq!((a.compared, class.rows), (11, 10));
        assert_eq!(class.examples.len(), EXAMPLES_KEPT);
        assert_eq!(class.examples[0].sequence, 0);
        assert_eq!(class.examples[0].serving, "ok");
        // Truncated: the kind, then the reason's first characters.
        assert_eq!(
            class.examples[0].candidate.chars().count(),
            EXAMPLE_CHARS + 1
        );
        let mut fleet = Diff {
            skipped: 4,
            ..Diff::default()
        };
        fleet.add(&a);
        fleet.add(&a);
        assert_eq!(
            (fleet.compared, fleet.skipped, fleet.differing()),
            (22, 4, 20)
        );
        assert_eq!(
            fleet.classes["ok→dead_letter"].examples.len(),
            EXAMPLES_KEPT
        );
        let payload = RowResult::Emit(vec![br#"{"b": 1}"#.to_vec(), b"\xffraw".to_vec()]);
        assert_eq!(payload.describe(), "emit {\"b\":1}, \u{fffd}raw");
    }
}
