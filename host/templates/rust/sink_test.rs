/// Runs the plugin natively on rows.ndjson and compares each row's outcome
/// with expected.ndjson (`cargo test`; no wasm, no weir).
#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use weir_plugin::{Deliveries, Delivery, RowData, Rows, Sink};

    fn describe(delivery: Delivery) -> Value {
        match delivery {
            Delivery::Ok => json!({"outcome": "ok"}),
            Delivery::Retry(ms) => json!({"outcome": "retry", "after_ms": ms}),
            Delivery::DeadLetter(reason) => json!({"outcome": "dead_letter", "reason": reason}),
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
        let mut out = Deliveries::with_capacity(rows.len());
        plugin.deliver(&rows, &mut out);
        let got: Vec<Value> = out.decided().into_iter().map(describe).collect();
        let expected: Vec<Value> = include_str!("../expected.ndjson")
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| serde_json::from_str(line).expect("expected.ndjson is JSON"))
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
