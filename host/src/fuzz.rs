//! Fuzzing on stable Rust: properties over arbitrary input from outside the
//! process, checked with proptest. Each runs `PROPTEST_CASES` cases (256 by
//! default, what CI runs); a longer run:
//! `PROPTEST_CASES=100000 cargo test -p weir --lib fuzz`.
//!
//! - NDJSON bodies (the front door's split);
//! - config files (parse and validate);
//! - subject tokens (tenant and table names in subjects, and subjects read
//!   back);
//! - a transform's packed answer (whatever a plugin returns);
//! - usage values read from the coordination bucket (another host's, or an
//!   attacker's, write).

use std::path::Path;
use std::time::SystemTime;

use bytes::Bytes;
use proptest::prelude::*;

use crate::config::{Config, Overrides};
use crate::coordination::KeyFollower;
use crate::delivery::batch::{Answer, Batch, Outcome, Position};
use crate::ingest::ndjson::{self, Fields};
use crate::ingest::usage::{Accept, Ledger};
use crate::nats::kv::{Entry, Operation};
use crate::sandbox::bindings::Transformed;
use crate::topology::route::{Names, Unit, decode_token, encode_token};

/// Text that is mostly JSON-ish, so splitting gets past the first byte.
fn ndjson_like() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            Just(b"{\"id\":1}".to_vec()),
            Just(b"{\"k\":\"\\u00e9\",\"n\":[1,2,{}]}".to_vec()),
            Just(b"\n".to_vec()),
            Just(b"\r\n".to_vec()),
            Just(b"{".to_vec()),
            Just(b"}".to_vec()),
            Just(b"\"".to_vec()),
            Just(vec![0xff, 0xfe]),
            prop::collection::vec(any::<u8>(), 0..8),
        ],
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #[test]
    fn ndjson_split_never_panics_and_keeps_only_json_objects(body in ndjson_like()) {
        let body = Bytes::from(body);
        let fields = Fields { key: Some("id"), route: Some("k") };
        if let Ok(lines) = ndjson::split(&body, fields) {
            let mut last = 0;
            for line in lines {
                prop_assert!(line.number > last);
                last = line.number;
                prop_assert!(std::str::from_utf8(&line.payload).is_ok());
                let value: serde_json::Value = serde_json::from_slice(&line.payload)
                    .map_err(|err| TestCaseError::fail(err.to_string()))?;
                prop_assert!(value.is_object());
            }
        }
    }

    #[test]
    fn config_parse_never_panics(text in "[a-z_\\[\\]=\"{}.,0-9 \\n-]{0,300}") {
        let _ = Config::parse(Path::new("/fuzz/weir.toml"), &text, &Overrides::default());
    }

    #[test]
    fn config_parse_of_a_mangled_valid_config_never_panics(
        cut in 0usize..400,
        insert in "[a-z_=\"\\[\\]{}0-9 \\n-]{0,12}",
    ) {
        let valid = "listen = \"127.0.0.1:1\"\nmax_body_bytes = 100\n[stream]\nshards = 2\n\
                     [delivery]\nbatch_rows = 5\nfailure_delay_cap_ms = 10\n\
                     [[tenants]]\nname = \"t\"\napi_keys = [\"k-123456\"]\n";
        let cut = cut.min(valid.len());
        let cut = (0..=cut).rev().find(|i| valid.is_char_boundary(*i)).unwrap_or(0);
        let text = format!("{}{insert}{}", &valid[..cut], &valid[cut..]);
        let _ = Config::parse(Path::new("/fuzz/weir.toml"), &text, &Overrides::default());
    }

    #[test]
    fn any_tenant_and_table_name_round_trips_through_a_subject(
        tenant in "\\PC{1,20}",
        table in "\\PC{1,20}",
    ) {
        let encoded = encode_token(&tenant);
        let decoded = decode_token(&encoded).map(|name| name.into_owned());
        prop_assert_eq!(decoded, Some(tenant.clone()));
        let router = Names::new("weir", 2, 3);
        let subject = router.subject(Unit { partition: 1, shard: 2 }, &tenant, &table);
        let (read_tenant, read_table) = router.parse(&subject)
            .map_err(|err| TestCaseError::fail(err.to_string()))?;
        prop_assert_eq!((read_tenant.as_ref(), read_table.as_ref()), (tenant.as_str(), table.as_str()));
    }

    #[test]
    fn reading_any_subject_never_panics(subject in "[a-z0-9._>*~-]{0,40}") {
        let _ = Names::new("weir", 2, 3).parse(&subject);
        let _ = decode_token(&subject);
    }

    #[test]
    fn a_plugins_packed_answer_never_panics_the_host(
        data in prop::collection::vec(any::<u8>(), 0..64),
        // Small numbers mostly, so answers get past the first check.
        outcomes in prop::collection::vec(prop_oneof![0u32..4, any::<u32>()], 0..16),
        emitted in prop::collection::vec(prop_oneof![0u32..80, any::<u32>()], 0..24),
        headers in prop::collection::vec(prop_oneof![0u32..80, any::<u32>()], 0..16),
        reasons in prop::collection::vec("\\PC{0,8}", 0..3),
        rows in 0usize..5,
        // Now and then a list a few bytes short of whole numbers.
        short in prop::collection::vec(prop_oneof![Just(0usize), 0usize..4], 3),
    ) {
        let bytes = |numbers: Vec<u32>, short: usize| {
            let mut bytes: Vec<u8> = numbers.iter().flat_map(|n| n.to_le_bytes()).collect();
            bytes.truncate(bytes.len().saturating_sub(short));
            bytes
        };
        let answer = Transformed {
            data,
            outcomes: bytes(outcomes, short[0]),
            emitted: bytes(emitted, short[1]),
            headers: bytes(headers, short[2]),
            reasons,
        };
        let mut input = Batch::with_capacity(rows, 64);
        for row in 0..rows {
            input.push("t", "tbl", b"{}", std::iter::empty(), Position { sequence: row as u64, attempt: 1 });
        }
        if let Ok(mut read) = Answer::new(&answer, rows) {
            let _ = read.all_ok();
            let mut next = Batch::with_capacity(rows, 64);
            for row in 0..rows {
                match read.outcome(row) {
                    Ok(Outcome::Emit(range)) => {
                        for emitted in range {
                            let _ = read.push_emitted(&mut next, &input, row, emitted);
                        }
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
    }

    #[test]
    fn any_usage_value_in_the_coordination_bucket_leaves_a_host_standing(
        values in prop::collection::vec(
            prop_oneof![
                prop::collection::vec(any::<u8>(), 0..32),
                (any::<u64>(), any::<u64>(), any::<u64>(), "\\PC{0,6}").prop_map(|(seq, rows, bytes, tenant)| {
                    serde_json::json!({
                        "by": "other-host",
                        "last_seq": [seq, u64::MAX],
                        "tenants": { tenant: { "rows": rows, "bytes": bytes } },
                    })
                    .to_string()
                    .into_bytes()
                }),
            ],
            1..6,
        ),
        keys in prop::collection::vec(prop_oneof![Just("usage.snapshot".to_string()), "tenants\\.[a-z~0-9]{0,8}"], 1..6),
        accepted in (any::<u64>(), any::<u64>(), any::<u64>()),
    ) {
        let ledger = Ledger::new("me");
        ledger.accepted(vec![Accept {
            tenant: "t".into(),
            partition: 0,
            last_seq: accepted.0,
            rows: accepted.1,
            bytes: accepted.2,
        }]);
        for (revision, (key, value)) in keys.iter().zip(values).enumerate() {
            ledger.apply(&Entry {
                key: key.clone(),
                value: Bytes::from(value),
                revision: revision as u64 + 1,
                operation: Operation::Put,
                created: SystemTime::now(),
            });
        }
        let _ = ledger.usage("t");
        let _ = ledger.tenants();
        let _ = ledger.tenant_settings("t");
    }
}
