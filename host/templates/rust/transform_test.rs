/// Runs the plugin natively on rows.ndjson and compares each row's outcome
/// with expected.ndjson (`cargo test`; no wasm, no weir), as `weir plugin
/// test --expect` does: as JSON values, an emitted JSON payload as JSON.
#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use weir_plugin::transform::Outcome;
    use weir_plugin::{Outcomes, RowData, Rows, Transform};

    fn describe(outcome: Outcome) -> Value {
        match outcome {
            Outcome::Ok => json!({"outcome": "ok"}),
            Outcome::Retry(ms) => json!({"outcome": "retry", "after_ms": ms}),
            Outcome::DeadLetter(reason) => json!({"outcome": "dead_letter", "reason": reason}),
            Outcome::Emit(rows) if rows.is_empty() => json!({"outcome": "drop"}),
            Outcome::Emit(rows) => {
                let rows: Vec<Value> = rows
                    .iter()
                    .map(|row| {
                        let mut out = json!({"payload": payload(&row.payload)});
                        if let Some(table) = &row.table {
                            out["table"] = json!(table);
                        }
                        out
                    })
                    .collect();
                json!({"outcome": "emit", "rows": rows})
            }
        }
    }

    /// A payload as JSON when it is JSON, else as text: key order and
    /// spacing never make a difference.
    fn payload(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
    }

    /// An expected outcome with its emitted payloads parsed as `describe` gives them.
    fn expected(line: &str) -> Value {
        let mut outcome: Value = serde_json::from_str(line).expect("expected.ndjson is JSON");
        if let Some(rows) = outcome.get_mut("rows").and_then(Value::as_array_mut) {
            for row in rows {
                if let Some(text) = row.get("payload").and_then(Value::as_str) {
                    row["payload"] = payload(text.as_bytes());
                }
            }
        }
        outcome
    }

    #[test]
    fn fixture_rows_have_the_expected_outcomes() {
        let rows: Vec<RowData> = include_str!("../rows.ndjson")
            .lines()
            .map(RowData::new)
            .collect();
        let rows = Rows::pack(&rows);
        let mut plugin = super::Plugin::init("{}".into()).expect("init");
        let mut out = Outcomes::with_capacity(rows.len());
        plugin.transform(&rows, &mut out);
        let got: Vec<Value> = out.decided().into_iter().map(describe).collect();
        let expected: Vec<Value> = include_str!("../expected.ndjson")
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(expected)
            .collect();
        assert_eq!(got.len(), expected.len(), "one expected outcome per row");
        for (index, (got, expected)) in got.iter().zip(&expected).enumerate() {
            assert!(
                got == expected,
                "line {}: got {got}, expected {expected}",
                index + 1
            );
        }
    }
}
