use super::*;
use weir_plugin::RowData;

fn plan(settings: &str) -> Result<Plan, String> {
    Plan::new(weir_plugin::settings(settings)?)
}

fn row(tenant: &str, table: &str, payload: &str) -> RowData {
    RowData {
        tenant: tenant.into(),
        table: table.into(),
        headers: vec![("trace".into(), "t-1".into())],
        ..RowData::new(payload)
    }
}

fn message(plan: &Plan, row: &RowData) -> Result<Message, String> {
    let rows = Rows::pack([row]);
    let first = rows.get(0).unwrap();
    plan.message(&first)
}

#[test]
fn subjects_come_from_tenant_table_and_fields() {
    let plan = plan(r#"{"subject": "audit.{tenant}.{table}.{customer.id}.{/a.b}.{ok}"}"#).unwrap();
    let sent = message(
        &plan,
        &row(
            "acme",
            "orders",
            r#"{"customer": {"id": "c7"}, "a.b": 12, "ok": true}"#,
        ),
    )
    .unwrap();
    assert_eq!(sent.subject, "audit.acme.orders.c7.12.true");
    assert_eq!(sent.headers, [("trace".to_string(), "t-1".to_string())]);
    assert_eq!(
        sent.payload,
        br#"{"customer": {"id": "c7"}, "a.b": 12, "ok": true}"#
    );
}

#[test]
fn a_row_lacking_a_field_or_making_a_bad_subject_is_refused_by_name() {
    let plan = plan(r#"{"subject": "audit.{customer.id}"}"#).unwrap();
    let reason = |payload: &str| message(&plan, &row("t", "x", payload)).unwrap_err();
    assert_eq!(
        reason(r#"{"customer": {}}"#),
        "nats sink: the payload has no field `customer.id`"
    );
    assert!(reason(r#"{"customer": {"id": null}}"#).contains("`customer.id` is null"));
    assert!(reason(r#"{"customer": {"id": [1]}}"#).contains("not a string"));
    assert!(reason(r#"{"customer": {"id": "a b"}}"#).contains("holds whitespace"));
    assert!(reason(r#"{"customer": {"id": "*"}}"#).contains("wildcard"));
    assert!(reason(r#"{"customer": {"id": ""}}"#).contains("empty token"));
    assert!(reason("[1]").contains("not a JSON object"));
}

#[test]
fn a_subject_of_tenant_and_table_alone_reads_no_payload() {
    let plan = plan(r#"{"subject": "audit.{tenant}.{table}"}"#).unwrap();
    let sent = message(&plan, &row("t", "x", "not json")).unwrap();
    assert_eq!(sent.subject, "audit.t.x");
    assert_eq!(sent.payload, b"not json");
}

#[test]
fn headers_are_kept_added_or_dropped_and_a_field_can_be_the_payload() {
    let plan = plan(
        r#"{"subject": "a.{table}", "headers": {"source": "weir"}, "keep_headers": false, "payload": "body"}"#,
    )
    .unwrap();
    let sent = message(&plan, &row("t", "x", r#"{"body": "hello"}"#)).unwrap();
    assert_eq!(sent.headers, [("source".to_string(), "weir".to_string())]);
    assert_eq!(sent.payload, b"hello");
    let sent = message(&plan, &row("t", "x", r#"{"body": {"k": 1}}"#)).unwrap();
    assert_eq!(sent.payload, br#"{"k": 1}"#);
}

#[test]
fn settings_are_checked_at_init() {
    for bad in [
        r#"{"subject": "a.{tenant"}"#,
        r#"{"subject": "a.tenant}"}"#,
        r#"{"subject": ""}"#,
        r#"{"subject": "a.{x..y}"}"#,
        r#"{"subject": "a", "headers": {"a:b": "v"}}"#,
        r#"{"subject": "a", "payload": ""}"#,
        r#"{"subject": "a", "unknown": 1}"#,
        r#"{}"#,
    ] {
        assert!(plan(bad).is_err(), "{bad}");
    }
}

#[test]
fn each_row_is_published_once_or_dead_lettered() {
    let plan = plan(r#"{"subject": "audit.{id}"}"#).unwrap();
    let batch = [
        row("t", "x", r#"{"id": 1}"#),
        row("t", "x", r#"{}"#),
        row("t", "x", r#"{"id": "b"}"#),
    ];
    let rows = Rows::pack(&batch);
    weir_plugin::nats::published();
    let outcomes = publish(&plan, &rows);
    assert_eq!(outcomes[0], Delivery::Ok);
    assert!(matches!(&outcomes[1], Delivery::DeadLetter(r) if r.contains("no field `id`")));
    assert_eq!(outcomes[2], Delivery::Ok);
    let sent: Vec<(u32, String)> = weir_plugin::nats::published()
        .into_iter()
        .map(|p| (p.row, p.subject))
        .collect();
    assert_eq!(
        sent,
        [(0, "audit.1".to_string()), (2, "audit.b".to_string())]
    );
}
