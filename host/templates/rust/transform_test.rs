/// Runs the plugin natively on rows.ndjson and compares each row's outcome
/// with expected.ndjson (`cargo test`; no wasm, no weir).
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
                        let mut out = json!({"payload": String::from_utf8_lossy(&row.payload)});
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
            .map(|line| serde_json::from_str(line).expect("expected.ndjson is JSON"))
            .collect();
        assert_eq!(got, expected);
    }
}
