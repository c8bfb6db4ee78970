//! Unit tests of `weir send`'s client: URLs, keys, retries and summaries.

use super::*;

#[test]
fn the_table_is_one_path_segment_of_the_url() {
    let url = |base: &str, table: &str| ingest_url(base, table).map_err(|e| e.to_string());
    assert_eq!(
        url("http://127.0.0.1:8080", "orders").unwrap(),
        "http://127.0.0.1:8080/v1/ingest/orders"
    );
    assert_eq!(
        url("http://h:1/weir/", "a/b?c").unwrap(),
        "http://h:1/weir/v1/ingest/a%2Fb%3Fc"
    );
    assert_eq!(url("https://h", "t").unwrap(), "https://h/v1/ingest/t");
    assert_eq!(
        url("ftp://h", "t").unwrap_err(),
        "ftp://h is not a URL weir can post to: weir send speaks http:// and https://, not ftp://"
    );
    assert!(url("127.0.0.1:8080", "t").is_err());
}

#[test]
fn the_key_names_the_chunk_by_table_place_and_bytes() {
    let key = idempotency_key("orders", 1, b"{}\n");
    assert!(key.starts_with("send-") && key.len() == 5 + 32, "{key}");
    assert_eq!(key, idempotency_key("orders", 1, b"{}\n"));
    assert_ne!(key, idempotency_key("orders", 2, b"{}\n"));
    assert_ne!(key, idempotency_key("order", 1, b"{}\n"));
    assert_ne!(key, idempotency_key("orders", 1, b"{} \n"));
}

#[test]
fn errors_say_where_and_what_was_accepted() {
    let refused = SendError::Refused {
        place: Place {
            input: "rows.ndjson".into(),
            line: Some(2501),
            first_line: 2001,
            last_line: 3000,
        },
        status: 400,
        message: "invalid JSON".into(),
        sent: Sent {
            lines: Some((2001, 3000)),
            before: 2000,
            after: 1000,
        },
    };
    assert_eq!(
        refused.to_string(),
        "rows.ndjson:2501: refused (400): invalid JSON; 2000 rows before line 2001 were accepted, and 1000 after line 3000"
    );
    let mut summary = Summary {
        accepted: 120_000,
        duplicates: 0,
        elapsed: Duration::from_millis(3200),
        ..Summary::default()
    };
    assert_eq!(
        summary.to_string(),
        "120000 rows accepted, 0 duplicates, in 3.2 s (37500 rows/s)"
    );
    summary.dead_lettered = 3;
    summary.refused = vec!["a".into()];
    summary.refused_rows = 1000;
    assert_eq!(
        summary.to_string(),
        "120000 rows accepted, 0 duplicates, 3 lines dead-lettered, 1 chunk refused (1000 rows not stored), in 3.2 s (37500 rows/s)"
    );
    assert_eq!(backoff(1), FIRST_BACKOFF);
    assert_eq!(backoff(40), MAX_BACKOFF);
}
