//! A weir transform that dead-letters rows missing required fields and masks sensitive fields.
//!
//! Settings (unknown keys are refused):
//!
//! | key          | type                        | default         |
//! |--------------|-----------------------------|-----------------|
//! | `required`   | list of top-level fields    | `[]`            |
//! | `mask`       | list of top-level fields    | `[]`            |
//! | `mask_with`  | string                      | `"***"`         |
//! | `on_invalid` | `"dead-letter"` or `"drop"` | `"dead-letter"` |
//!
//! A row whose payload is not a JSON object, or that lacks a required field
//! (absent or `null`), is invalid: it is dead-lettered with the reason, or
//! dropped (acked, emitting nothing) when `on_invalid = "drop"`. A valid row
//! that has some masked field is replaced by one row with those values
//! replaced by `mask_with` (same headers and table); any other valid row
//! passes unchanged. Counters: `rows_valid`, `rows_invalid`, `fields_masked`.
//!
//! Rows are read with `weir_json`: keys borrowed, values kept as their raw
//! text. A masked row is written back compact, fields in their order, every
//! unmasked value exactly as the producer sent it.

use serde::Deserialize;
use weir_json::{Object, RawValue};
use weir_plugin::{Outcomes, Row, Rows, Transform};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default)]
    required: Vec<String>,
    #[serde(default)]
    mask: Vec<String>,
    #[serde(default = "default_mask_with")]
    mask_with: String,
    #[serde(default)]
    on_invalid: OnInvalid,
}

fn default_mask_with() -> String {
    "***".to_string()
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum OnInvalid {
    #[default]
    DeadLetter,
    Drop,
}

struct Validator {
    settings: Settings,
    /// `mask_with` as a JSON string, made once.
    mask: Box<RawValue>,
}

impl Transform for Validator {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Settings = weir_plugin::settings(&settings)?;
        Ok(Validator {
            mask: weir_json::raw(&settings.mask_with),
            settings,
        })
    }

    fn transform(&mut self, rows: &Rows, out: &mut Outcomes) {
        let mut tally = Tally::default();
        for row in rows.iter() {
            check(&self.settings, &self.mask, &row, &mut tally, out);
        }
        tally.report();
    }
}

weir_plugin::export_transform!(Validator);

#[derive(Default)]
struct Tally {
    valid: u64,
    invalid: u64,
    masked: u64,
}

impl Tally {
    fn report(&self) {
        for (name, delta) in [
            ("rows_valid", self.valid),
            ("rows_invalid", self.invalid),
            ("fields_masked", self.masked),
        ] {
            if delta > 0 {
                weir_plugin::counter(name, delta);
            }
        }
    }
}

/// Decides one row into `out`.
fn check(
    settings: &Settings,
    mask: &RawValue,
    row: &Row<'_>,
    tally: &mut Tally,
    out: &mut Outcomes,
) {
    let mut invalid = |reason: String| {
        tally.invalid += 1;
        match settings.on_invalid {
            OnInvalid::DeadLetter => out.dead_letter(reason),
            OnInvalid::Drop => out.discard(),
        }
    };

    let mut object = match Object::parse(row.payload) {
        Ok(object) => object,
        Err(e) => return invalid(format!("payload is not a JSON object: {e}")),
    };
    if let Some(field) = settings
        .required
        .iter()
        .find(|field| object.is_absent_or_null(field))
    {
        return invalid(format!("missing required field `{field}`"));
    }
    tally.valid += 1;

    let masked = settings
        .mask
        .iter()
        .filter(|field| object.replace(field, mask))
        .count() as u64;
    if masked == 0 {
        return out.ok();
    }
    tally.masked += masked;
    out.replace_with(row, |payload| object.write(payload));
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin::RowData;
    use weir_plugin::transform::Outcome;

    fn settings(json: &str) -> Settings {
        weir_plugin::settings(json).unwrap()
    }

    fn run(settings: &Settings, payload: &str) -> (Outcome, Tally) {
        let mut input = RowData::new(payload);
        input.headers.push(("h".into(), "v".into()));
        let rows = Rows::pack([&input]);
        let mut tally = Tally::default();
        let mut out = Outcomes::with_capacity(1);
        let mask = weir_json::raw(&settings.mask_with);
        check(settings, &mask, &rows.get(0).unwrap(), &mut tally, &mut out);
        let outcome = out.decided().pop().unwrap();
        (outcome, tally)
    }

    #[test]
    fn refuses_bad_settings() {
        let e = weir_plugin::settings::<Settings>(r#"{"requird": ["a"]}"#).unwrap_err();
        assert!(e.contains("unknown field `requird`"), "{e}");
        let e = weir_plugin::settings::<Settings>(r#"{"on_invalid": "ignore"}"#).unwrap_err();
        assert!(
            e.starts_with("settings.on_invalid: unknown variant `ignore`"),
            "{e}"
        );
    }

    #[test]
    fn not_an_object() {
        let s = settings("{}");
        let (outcome, tally) = run(&s, "[1, 2]");
        match outcome {
            Outcome::DeadLetter(reason) => {
                assert!(
                    reason.starts_with("payload is not a JSON object: invalid type"),
                    "{reason}"
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(tally.invalid, 1);
        assert!(matches!(run(&s, "{oops").0, Outcome::DeadLetter(_)));
    }

    #[test]
    fn required_fields() {
        let s = settings(r#"{"required": ["id", "ts"]}"#);
        assert!(matches!(run(&s, r#"{"id": 1, "ts": 2}"#).0, Outcome::Ok));
        for payload in [r#"{"id": 1}"#, r#"{"id": 1, "ts": null}"#] {
            match run(&s, payload).0 {
                Outcome::DeadLetter(reason) => assert_eq!(reason, "missing required field `ts`"),
                other => panic!("{other:?}"),
            }
        }
        let s = settings(r#"{"required": ["id"], "on_invalid": "drop"}"#);
        match run(&s, "{}") {
            (Outcome::Emit(rows), tally) => {
                assert!(rows.is_empty());
                assert_eq!((tally.valid, tally.invalid), (0, 1));
            }
            other => panic!("{other:?}", other = other.0),
        }
    }

    #[test]
    fn masks_and_keeps_order_and_headers() {
        let s = settings(r#"{"mask": ["ssn", "card"], "mask_with": "X"}"#);
        match run(&s, r#"{"z": 1, "ssn": "123", "a": {"ssn": 1}}"#) {
            (Outcome::Emit(rows), tally) => {
                assert_eq!(rows.len(), 1);
                let out = &rows[0];
                assert_eq!(
                    std::str::from_utf8(&out.payload).unwrap(),
                    // Unmasked values are kept as sent, nested ones too.
                    r#"{"z":1,"ssn":"X","a":{"ssn": 1}}"#
                );
                assert_eq!(out.table, None);
                assert_eq!(out.headers, vec![("h".to_string(), "v".to_string())]);
                assert_eq!((tally.valid, tally.masked), (1, 1));
            }
            other => panic!("{other:?}", other = other.0),
        }
        assert!(matches!(run(&s, r#"{"name": "x"}"#).0, Outcome::Ok));
    }
}
