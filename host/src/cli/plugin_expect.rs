//! `weir plugin test --expect expected.ndjson`: each row's outcome compared
//! with the one the project expects, as JSON values (key order and
//! whitespace never matter, an emitted payload that is JSON is compared as
//! JSON), and every difference said with its line and field.

use std::path::Path;

use anyhow::Context as _;
use serde_json::{Map, Value};

/// Some outcomes differ from the expected ones: `weir plugin test` exits
/// with its own code (docs/cli.md).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotAsExpected(pub String);

/// The expected outcomes, one JSON value per non-blank line of `path`,
/// each in the shape of `normalize`; a line that is not JSON is an error
/// naming `path:line:col`.
pub fn read(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut outcomes = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line).map_err(|error| {
            anyhow::anyhow!(
                "{}:{}:{}: not a JSON outcome: {error}",
                path.display(),
                index + 1,
                error.column()
            )
        })?;
        outcomes.push(normalize(value, None));
    }
    Ok(outcomes)
}

/// An outcome in the fixtures' shape, as `weir plugin test --json` reports
/// it or as `expected.ndjson` writes it: no `line`; a sink's `delivered` is
/// `ok`; emitted rows under `rows`, each payload parsed when it is JSON,
/// its `table` only when it is not `input_table` (when known), its
/// `headers` only when there are some.
pub fn normalize(mut outcome: Value, input_table: Option<&str>) -> Value {
    let Some(fields) = outcome.as_object_mut() else {
        return outcome;
    };
    fields.remove("line");
    if fields.get("outcome").and_then(Value::as_str) == Some("delivered") {
        fields.insert("outcome".into(), Value::from("ok"));
    }
    if let Some(emitted) = fields.remove("emitted") {
        fields.insert("rows".into(), emitted);
    }
    if let Some(rows) = fields.get_mut("rows").and_then(Value::as_array_mut) {
        for row in rows.iter_mut().filter_map(Value::as_object_mut) {
            normalize_emitted(row, input_table);
        }
    }
    outcome
}

fn normalize_emitted(row: &mut Map<String, Value>, input_table: Option<&str>) {
    if let Some(Value::String(text)) = row.get("payload")
        && let Ok(parsed) = serde_json::from_str::<Value>(text)
    {
        row.insert("payload".into(), parsed);
    }
    if input_table.is_some() && row.get("table").and_then(Value::as_str) == input_table {
        row.remove("table");
    }
    if row
        .get("headers")
        .and_then(Value::as_object)
        .is_some_and(Map::is_empty)
    {
        row.remove("headers");
    }
}

/// Every difference between the outcomes `got` (by 1-based row line) and
/// `expected`, one line each: `line 3: rows[0].payload.id: got 2,
/// expected 3`. Empty when they agree.
pub fn differences(got: &[(usize, Value)], expected: &[Value]) -> Vec<String> {
    let mut lines = Vec::new();
    if got.len() != expected.len() {
        lines.push(format!(
            "{} rows but {} expected outcomes: one is expected per row",
            got.len(),
            expected.len()
        ));
    }
    for ((line, got), expected) in got.iter().zip(expected) {
        let mut found = Vec::new();
        diff(
            "",
            &unless_expected_error(got, expected),
            expected,
            &mut found,
        );
        lines.extend(
            found
                .into_iter()
                .map(|found| format!("line {line}: {found}")),
        );
    }
    lines
}

/// `got` without a failed call's `error` text when `expected` does not
/// say one: a trap's message quotes a stack no fixture should have to copy.
fn unless_expected_error(got: &Value, expected: &Value) -> Value {
    let mut got = got.clone();
    if got.get("outcome").and_then(Value::as_str) == Some("failed")
        && expected.get("error").is_none()
        && let Some(fields) = got.as_object_mut()
    {
        fields.remove("error");
    }
    got
}

/// The differences under `path`, where `got` should be `expected`.
fn diff(path: &str, got: &Value, expected: &Value, found: &mut Vec<String>) {
    let at = |path: &str| {
        if path.is_empty() {
            "the outcome".to_string()
        } else {
            path.to_string()
        }
    };
    match (got, expected) {
        (Value::Object(got), Value::Object(expected)) => {
            for (key, want) in expected {
                let path = join(path, key);
                match got.get(key) {
                    Some(have) => diff(&path, have, want, found),
                    None => found.push(format!("{path}: missing, expected {want}")),
                }
            }
            for (key, have) in got {
                if !expected.contains_key(key) {
                    found.push(format!("{}: got {have}, expected nothing", join(path, key)));
                }
            }
        }
        (Value::Array(got), Value::Array(expected)) => {
            if got.len() != expected.len() {
                found.push(format!(
                    "{}: got {} items, expected {}",
                    at(path),
                    got.len(),
                    expected.len()
                ));
            }
            for (index, (have, want)) in got.iter().zip(expected).enumerate() {
                diff(&format!("{path}[{index}]"), have, want, found);
            }
        }
        (have, want) if have != want => {
            found.push(format!("{}: got {have}, expected {want}", at(path)))
        }
        _ => {}
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_reordered_payload_is_the_same_outcome() {
        let got = normalize(
            json!({"line": 1, "outcome": "emit", "emitted": [
                {"table": "events", "payload": {"kind": "click", "id": 1}, "headers": {}}
            ]}),
            Some("events"),
        );
        let expected = normalize(
            json!({"outcome": "emit", "rows": [{"payload": "{\"id\":1,\"kind\":\"click\"}"}]}),
            None,
        );
        assert_eq!(differences(&[(1, got)], &[expected]), Vec::<String>::new());
    }

    #[test]
    fn each_difference_names_its_line_and_field() {
        let got = vec![
            (
                1,
                normalize(
                    json!({"line": 1, "outcome": "emit", "emitted": [
                        {"table": "other", "payload": {"id": 2}}
                    ]}),
                    Some("events"),
                ),
            ),
            (
                2,
                normalize(json!({"line": 2, "outcome": "delivered"}), None),
            ),
            (3, normalize(json!({"line": 3, "outcome": "drop"}), None)),
        ];
        let expected = vec![
            normalize(
                json!({"outcome": "emit", "rows": [{"payload": "{\"id\":1}"}]}),
                None,
            ),
            normalize(json!({"outcome": "ok"}), None),
            normalize(
                json!({"outcome": "dead_letter", "reason": "missing id"}),
                None,
            ),
        ];
        assert_eq!(
            differences(&got, &expected),
            [
                "line 1: rows[0].payload.id: got 2, expected 1",
                "line 1: rows[0].table: got \"other\", expected nothing",
                "line 3: outcome: got \"drop\", expected \"dead_letter\"",
                "line 3: reason: missing, expected \"missing id\"",
            ]
        );
    }

    #[test]
    fn a_missing_outcome_is_counted() {
        let got = vec![(1, json!({"outcome": "ok"}))];
        let expected = vec![json!({"outcome": "ok"}), json!({"outcome": "drop"})];
        assert_eq!(
            differences(&got, &expected),
            ["1 rows but 2 expected outcomes: one is expected per row"]
        );
    }

    #[test]
    fn a_failed_call_matches_its_kind_unless_its_error_is_expected() {
        let got = vec![(
            1,
            json!({"outcome": "failed", "kind": "trap", "error": "boom\n  at f"}),
        )];
        assert!(differences(&got, &[json!({"outcome": "failed", "kind": "trap"})]).is_empty());
        assert_eq!(
            differences(
                &got,
                &[json!({"outcome": "failed", "kind": "trap", "error": "boom"})]
            ),
            ["line 1: error: got \"boom\\n  at f\", expected \"boom\""]
        );
    }

    #[test]
    fn a_payload_that_is_not_json_compares_as_text() {
        let row = |payload: &str| {
            normalize(
                json!({"outcome": "emit", "rows": [{"payload": payload}]}),
                None,
            )
        };
        assert!(differences(&[(1, row("a,b"))], &[row("a,b")]).is_empty());
        assert_eq!(differences(&[(1, row("a,b"))], &[row("a;b")]).len(), 1);
    }
}
