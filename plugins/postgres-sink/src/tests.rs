use super::*;
use weir_plugin::RowData;

fn plan(settings: &str) -> Result<Plan, String> {
    Plan::new(weir_plugin::settings(settings)?)
}

fn row(tenant: &str, table: &str, payload: &str) -> RowData {
    RowData {
        tenant: tenant.into(),
        table: table.into(),
        ..RowData::new(payload)
    }
}

/// A database that records each statement with its JSON parameter and
/// answers with `answer`.
struct Fake<F> {
    calls: Vec<(String, String)>,
    answer: F,
}

impl<F: FnMut(&str) -> Result<u64, Error>> Database for Fake<F> {
    fn execute(&mut self, statement: &str, params: &[Value]) -> Result<u64, Error> {
        let [Value::Text(json)] = params else {
            panic!("one text parameter, got {params:?}");
        };
        self.calls.push((statement.to_string(), json.clone()));
        (self.answer)(json)
    }
}

fn fake<F: FnMut(&str) -> Result<u64, Error>>(answer: F) -> Fake<F> {
    Fake {
        calls: Vec::new(),
        answer,
    }
}

fn accepting() -> Fake<impl FnMut(&str) -> Result<u64, Error>> {
    fake(|_| Ok(1))
}

fn unique_violation() -> Error {
    Error {
        code: "23505".into(),
        message: "duplicate key value violates unique constraint \"orders_pkey\"".into(),
        detail: Some("Key (id)=(2) already exists.".into()),
        constraint: Some("orders_pkey".into()),
        table: Some("acme_orders".into()),
        column: None,
        retry: false,
    }
}

fn connection_lost() -> Error {
    Error {
        code: String::new(),
        message: "connection closed".into(),
        detail: None,
        constraint: None,
        table: None,
        column: None,
        retry: true,
    }
}

const ORDERS: &str =
    r#"{"table": "{tenant}_{table}", "columns": {"id": "id", "amount": "order.amount"}}"#;

#[test]
fn builds_one_bulk_statement_per_mode() {
    let insert = plan(ORDERS).unwrap();
    assert_eq!(
        insert.statement("\"acme_orders\""),
        "INSERT INTO \"acme_orders\" (\"amount\", \"id\") SELECT \"amount\", \"id\" \
         FROM json_populate_recordset(NULL::\"acme_orders\", $1::json)"
    );
    let ignore =
        plan(r#"{"table": "{tenant}.{table}", "columns": {"id": "id"}, "on_conflict": "ignore"}"#)
            .unwrap();
    assert_eq!(
        ignore.statement("\"acme\".\"orders\""),
        "INSERT INTO \"acme\".\"orders\" (\"id\") SELECT \"id\" \
         FROM json_populate_recordset(NULL::\"acme\".\"orders\", $1::json) ON CONFLICT DO NOTHING"
    );
    let upsert = plan(
        r#"{"table": "events", "columns": {"id": "id", "body": ".", "at": "ts"},
            "tenant_column": "tenant", "mode": "upsert", "key": ["tenant", "id"]}"#,
    )
    .unwrap();
    assert_eq!(
        upsert.statement("\"events\""),
        "INSERT INTO \"events\" (\"at\", \"body\", \"id\", \"tenant\") \
         SELECT \"at\", \"body\", \"id\", \"tenant\" \
         FROM json_populate_recordset(NULL::\"events\", $1::json) \
         ON CONFLICT (\"tenant\", \"id\") DO UPDATE SET \"at\" = EXCLUDED.\"at\", \"body\" = EXCLUDED.\"body\""
    );
    let key_only =
        plan(r#"{"table": "seen", "columns": {"id": "id"}, "mode": "upsert", "key": ["id"]}"#)
            .unwrap();
    assert!(
        key_only
            .statement("\"seen\"")
            .ends_with(" ON CONFLICT (\"id\") DO NOTHING")
    );
}

#[test]
fn refuses_bad_settings_naming_the_key() {
    for (settings, expected) in [
        (
            r#"{"columns": {"id": "id"}}"#,
            "settings: missing field `table`",
        ),
        (r#"{"table": "t"}"#, "settings: missing field `columns`"),
        (
            r#"{"table": "t", "columns": {}}"#,
            "`columns` maps no column",
        ),
        (
            r#"{"table": "t", "columns": {"id": 1}}"#,
            "settings.columns.id: invalid type",
        ),
        (
            r#"{"table": "t", "columns": {"id": "a..b"}}"#,
            "`columns.id`: the field \"a..b\" has an empty key",
        ),
        (
            r#"{"table": "t", "columns": {"": "id"}}"#,
            "`columns`: an empty name",
        ),
        (
            r#"{"table": "a..b", "columns": {"id": "id"}}"#,
            "`table` \"a..b\"",
        ),
        (
            r#"{"table": "{x}", "columns": {"id": "id"}}"#,
            "unknown placeholder {x}",
        ),
        (
            r#"{"table": "t", "columns": {"id": "id"}, "mode": "merge"}"#,
            "settings.mode: unknown variant `merge`",
        ),
        (
            r#"{"table": "t", "columns": {"id": "id"}, "colour": 1}"#,
            "unknown field `colour`",
        ),
        (
            r#"{"table": "t", "columns": {"id": "id"}, "key": ["id"]}"#,
            "`key` applies to mode = \"upsert\"",
        ),
        (
            r#"{"table": "t", "columns": {"id": "id"}, "mode": "upsert"}"#,
            "needs `key`",
        ),
        (
            r#"{"table": "t", "columns": {"id": "id"}, "mode": "upsert", "key": ["nope"]}"#,
            "`key` column \"nope\" is not mapped",
        ),
        (
            r#"{"table": "t", "columns": {"id": "id"}, "mode": "upsert", "key": ["id", "id"]}"#,
            "`key` names \"id\" twice",
        ),
        (
            r#"{"table": "t", "columns": {"id": "id"}, "mode": "upsert", "key": ["id"], "on_conflict": "ignore"}"#,
            "`on_conflict` applies to mode = \"insert\"",
        ),
        (
            r#"{"table": "t", "columns": {"id": "id"}, "on_conflict": "skip"}"#,
            "settings.on_conflict: unknown variant `skip`",
        ),
        (
            r#"{"table": "t", "columns": {"id": "id"}, "missing": "zero"}"#,
            "settings.missing: unknown variant `zero`",
        ),
        (
            r#"{"table": "t", "columns": {"id": "id"}, "tenant_column": "id"}"#,
            "`tenant_column` \"id\" is a column of `columns` too",
        ),
        (
            r#"{"table": "t", "columns": {"id": "id"}, "table_column": "a\u0000b"}"#,
            "`table_column`: the name \"a\\0b\" holds a NUL",
        ),
    ] {
        let error = plan(settings).unwrap_err();
        assert!(error.contains(expected), "{settings}: {error}");
    }
    assert!(plan(r#"{"table": "t", "columns": {"id": "id"}, "tenant_column": "tenant", "table_column": "table", "missing": "null"}"#).is_ok());
}

#[test]
fn groups_a_batch_by_table_one_statement_each() {
    let plan = plan(
        r#"{"table": "{tenant}_{table}", "columns": {"id": "id", "amount": "order.amount", "body": "."},
            "table_column": "source"}"#,
    )
    .unwrap();
    let rows = [
        row("acme", "orders", r#"{"id": 1, "order": {"amount": 12.50}}"#),
        row(
            "beta",
            "orders",
            r#"{"id": "b1", "order": {"amount": "7"}}"#,
        ),
        row("acme", "orders", r#"{"order": {"amount": 1}, "id": 2}"#),
    ];
    let mut db = accepting();
    let outcomes = write(&plan, &Rows::pack(&rows), &mut db);
    assert_eq!(outcomes, vec![Delivery::Ok; 3]);
    let calls: Vec<(&str, &str)> = db
        .calls
        .iter()
        .map(|(statement, json)| (statement.as_str(), json.as_str()))
        .collect();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls[0].0.starts_with("INSERT INTO \"acme_orders\" "));
    assert_eq!(
        calls[0].1,
        r#"[{"amount":12.50,"body":{"id": 1, "order": {"amount": 12.50}},"id":1,"source":"orders"},{"amount":1,"body":{"order": {"amount": 1}, "id": 2},"id":2,"source":"orders"}]"#
    );
    assert!(calls[1].0.starts_with("INSERT INTO \"beta_orders\" "));
    assert_eq!(
        calls[1].1,
        r#"[{"amount":"7","body":{"id": "b1", "order": {"amount": "7"}},"id":"b1","source":"orders"}]"#
    );
    // Each parameter is JSON a database can read.
    for (_, json) in &db.calls {
        serde_json::from_str::<serde_json::Value>(json).unwrap();
    }
}

#[test]
fn dead_letters_rows_it_cannot_map() {
    let strict = plan(ORDERS).unwrap();
    let rows = [
        row("acme", "orders", "[1, 2]"),
        row("acme", "orders", "{\"id\": "),
        row("acme", "orders", r#"{"id": 1, "order": {}}"#),
        row(
            &"t".repeat(60),
            "orders",
            r#"{"id": 1, "order": {"amount": 1}}"#,
        ),
        row("acme", "orders", r#"{"id": 1, "order": {"amount": null}}"#),
    ];
    let mut db = accepting();
    let outcomes = write(&strict, &Rows::pack(&rows), &mut db);
    let reasons: Vec<String> = outcomes
        .iter()
        .map(|outcome| match outcome {
            Delivery::DeadLetter(reason) => reason.clone(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(reasons[0], "postgres sink: payload is not a JSON object");
    assert!(
        reasons[1].starts_with("postgres sink: payload is not JSON: "),
        "{}",
        reasons[1]
    );
    assert_eq!(
        reasons[2],
        "postgres sink: field `order.amount` (column `amount`) is missing"
    );
    assert!(
        reasons[3].contains("longer than PostgreSQL's 63 bytes"),
        "{}",
        reasons[3]
    );
    // A null the producer sent is a value: NULL.
    assert_eq!(reasons[4], "Ok");
    assert_eq!(db.calls.len(), 1);
    assert_eq!(db.calls[0].1, r#"[{"amount":null,"id":1}]"#);

    let lenient = plan(&ORDERS.replace("}}", "}, \"missing\": \"null\"}")).unwrap();
    let mut db = accepting();
    let rows = [row("acme", "orders", r#"{"id": 3}"#)];
    assert_eq!(
        write(&lenient, &Rows::pack(&rows), &mut db),
        vec![Delivery::Ok]
    );
    assert_eq!(db.calls[0].1, r#"[{"amount":null,"id":3}]"#);
}

#[test]
fn a_refused_bulk_statement_is_retried_row_by_row() {
    let plan = plan(ORDERS).unwrap();
    let rows: Vec<RowData> = (1..=3)
        .map(|id| {
            row(
                "acme",
                "orders",
                &format!(r#"{{"id": {id}, "order": {{"amount": 1}}}}"#),
            )
        })
        .chain([row("acme", "orders", "not json")])
        .collect();
    // The database refuses any statement holding row 2.
    let mut db = fake(|json: &str| {
        if json.contains(r#""id":2"#) {
            Err(unique_violation())
        } else {
            Ok(1)
        }
    });
    let outcomes = write(&plan, &Rows::pack(&rows), &mut db);
    assert_eq!(outcomes[0], Delivery::Ok);
    assert_eq!(
        outcomes[1],
        Delivery::DeadLetter(
            "postgres: duplicate key value violates unique constraint \"orders_pkey\" \
             (23505, constraint orders_pkey): Key (id)=(2) already exists."
                .into()
        )
    );
    assert_eq!(outcomes[2], Delivery::Ok);
    assert!(matches!(&outcomes[3], Delivery::DeadLetter(r) if r.contains("not JSON")));
    let params: Vec<&str> = db.calls.iter().map(|(_, json)| json.as_str()).collect();
    assert_eq!(
        params,
        [
            r#"[{"amount":1,"id":1},{"amount":1,"id":2},{"amount":1,"id":3}]"#,
            r#"[{"amount":1,"id":1}]"#,
            r#"[{"amount":1,"id":2}]"#,
            r#"[{"amount":1,"id":3}]"#,
        ]
    );
}

#[test]
fn a_statement_error_of_its_own_dead_letters_its_group_at_once() {
    let plan = plan(ORDERS).unwrap();
    let rows = [
        row("acme", "orders", r#"{"id": 1, "order": {"amount": 1}}"#),
        row("beta", "orders", r#"{"id": 2, "order": {"amount": 1}}"#),
        row("acme", "orders", r#"{"id": 3, "order": {"amount": 1}}"#),
    ];
    let mut db = fake(|json: &str| {
        if json.contains(r#""id":2"#) {
            Ok(1)
        } else {
            Err(Error {
                code: "42P01".into(),
                message: "relation \"acme_orders\" does not exist".into(),
                retry: false,
                ..connection_lost()
            })
        }
    });
    let outcomes = write(&plan, &Rows::pack(&rows), &mut db);
    let missing =
        Delivery::DeadLetter("postgres: relation \"acme_orders\" does not exist (42P01)".into());
    assert_eq!(outcomes, vec![missing.clone(), Delivery::Ok, missing]);
    assert_eq!(db.calls.len(), 2, "no statement per row");
}

#[test]
fn an_error_that_cannot_commit_retries_the_whole_batch() {
    let plan = plan(ORDERS).unwrap();
    let rows = [
        row("acme", "orders", r#"{"id": 1, "order": {"amount": 1}}"#),
        row("acme", "orders", "[]"),
        row("beta", "orders", r#"{"id": 2, "order": {"amount": 1}}"#),
    ];
    let mut db = fake(|_: &str| Err(connection_lost()));
    let outcomes = write(&plan, &Rows::pack(&rows), &mut db);
    assert_eq!(outcomes, vec![Delivery::Retry(1000); 3]);
    assert_eq!(db.calls.len(), 1, "nothing is sent after it");

    // The same when it comes while rows are written one by one.
    let mut calls = 0;
    let mut db = fake(move |_: &str| {
        calls += 1;
        Err(if calls == 1 {
            unique_violation()
        } else {
            connection_lost()
        })
    });
    let outcomes = write(&plan, &Rows::pack(&rows), &mut db);
    assert_eq!(outcomes, vec![Delivery::Retry(1000); 3]);
    assert_eq!(db.calls.len(), 2);
}

#[test]
fn an_upsert_writes_a_key_seen_twice_in_order_in_two_statements() {
    let plan = plan(
        r#"{"table": "t", "columns": {"id": "id", "v": "v"}, "mode": "upsert", "key": ["id"]}"#,
    )
    .unwrap();
    let rows: Vec<RowData> = [(1, "a"), (2, "b"), (1, "c"), (3, "d")]
        .into_iter()
        .map(|(id, v)| row("acme", "orders", &format!(r#"{{"id": {id}, "v": "{v}"}}"#)))
        .collect();
    let mut db = accepting();
    assert_eq!(
        write(&plan, &Rows::pack(&rows), &mut db),
        vec![Delivery::Ok; 4]
    );
    let params: Vec<&str> = db.calls.iter().map(|(_, json)| json.as_str()).collect();
    assert_eq!(
        params,
        [
            r#"[{"id":1,"v":"a"},{"id":2,"v":"b"}]"#,
            r#"[{"id":1,"v":"c"},{"id":3,"v":"d"}]"#,
        ]
    );
}

#[test]
fn an_empty_batch_sends_nothing() {
    let mut db = accepting();
    assert!(write(&plan(ORDERS).unwrap(), &Rows::pack([]), &mut db).is_empty());
    assert!(db.calls.is_empty());
}
