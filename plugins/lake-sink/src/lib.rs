//! A weir sink that writes each row into an object of an S3 bucket
//! (`grants.objects`: the bucket, the format — Parquet columns or NDJSON —
//! and when an object is committed). The sink only names each row's
//! object by a path; the host fits the row to the format, fills one object
//! per path, commits it, and acks the row once its object stands: after
//! any crash or handover every delivered row is in exactly one object.
//!
//! Settings (unknown keys are refused; none are needed):
//!
//! | key          | type   | default                                  | meaning |
//! |--------------|--------|------------------------------------------|---------|
//! | `path`       | string | `tenant={tenant}/table={table}/dt={date}` | the object's path below the grant's prefix |
//! | `time_field` | string | none                                     | the payload field whose date (`YYYY-MM-DD…`, RFC 3339) is `{date}`; without it, today's (UTC) |
//! | `record`     | string | none                                     | write this field of the payload instead of the whole row |
//!
//! In `path`, `{tenant}`, `{table}` and `{date}` are the row's; any other
//! `{field}` is a field of its JSON payload (dotted keys or a JSON
//! pointer). A row lacking a field, whose time field is not a date, or
//! that does not fit the grant's columns is dead-lettered with the reason
//! (the host names the column).
//!
//! Counter: `rows_appended`.

use serde::Deserialize;
use weir_json::fields::{Field, Payload};
use weir_json::template::Template;
use weir_plugin::{Deliveries, Delivery, Row, Rows, Sink};

/// The names a path fills itself.
const NAMES: &[&str] = &["tenant", "table", "date"];
const DATE: usize = 2;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default = "default_path")]
    path: String,
    #[serde(default)]
    time_field: Option<String>,
    #[serde(default)]
    record: Option<String>,
}

fn default_path() -> String {
    "tenant={tenant}/table={table}/dt={date}".to_string()
}

/// The settings made into what each row needs.
#[derive(Debug)]
struct Plan {
    path: Template,
    time_field: Option<(String, Field)>,
    record: Option<(String, Field)>,
    reads_payload: bool,
}

fn field(setting: &str, spec: Option<String>) -> Result<Option<(String, Field)>, String> {
    spec.map(|spec| {
        let field = Field::parse(&spec).map_err(|e| format!("lake sink: {setting}: {e}"))?;
        Ok((spec, field))
    })
    .transpose()
}

impl Plan {
    fn new(settings: Settings) -> Result<Plan, String> {
        let path = Template::parse(&settings.path, "lake sink: path", NAMES)?;
        let time_field = field("time_field", settings.time_field)?;
        let record = field("record", settings.record)?;
        let reads_payload =
            path.reads_payload() || record.is_some() || (time_field.is_some() && path.uses(DATE));
        Ok(Plan {
            path,
            time_field,
            record,
            reads_payload,
        })
    }

    /// The path and the record of `row`, or why it has none (its dead
    /// letter's reason). `today` is `{date}` without a time field.
    fn place<'a>(&self, row: &'a Row, today: &str) -> Result<(String, &'a [u8]), String> {
        let payload = if self.reads_payload {
            Some(Payload::parse(row.payload).map_err(|e| format!("lake sink: {e}"))?)
        } else {
            None
        };
        let date = match (&self.time_field, &payload) {
            (Some((spec, field)), Some(payload)) if self.path.uses(DATE) => {
                let value = field
                    .get(payload)
                    .ok_or_else(|| format!("lake sink: the payload has no field `{spec}`"))?;
                date_of(value.get()).ok_or_else(|| {
                    format!("lake sink: the field `{spec}` is not an RFC 3339 date or time")
                })?
            }
            _ => today.to_string(),
        };
        let named = |index: usize| match index {
            0 => row.tenant,
            1 => row.table,
            _ => date.as_str(),
        };
        let path = self
            .path
            .render(named, payload.as_ref())
            .map_err(|e| format!("lake sink: {e}"))?;
        let record = match (&self.record, &payload) {
            (Some((spec, field)), Some(payload)) => field
                .get(payload)
                .ok_or_else(|| format!("lake sink: the payload has no field `{spec}`"))?
                .get()
                .as_bytes(),
            _ => row.payload,
        };
        Ok((path, record))
    }
}

/// The `YYYY-MM-DD` a JSON string starts with, if it does.
fn date_of(json: &str) -> Option<String> {
    let text: String = serde_json::from_str(json).ok()?;
    let date = text.get(..10)?;
    let bytes = date.as_bytes();
    let digits = |range: std::ops::Range<usize>| bytes[range].iter().all(u8::is_ascii_digit);
    (digits(0..4) && bytes[4] == b'-' && digits(5..7) && bytes[7] == b'-' && digits(8..10))
        .then(|| date.to_string())
}

/// Today's date, UTC, as `YYYY-MM-DD` (the civil date of the clock's days).
fn today() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let days = i64::try_from(seconds / 86_400).unwrap_or(0);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

struct LakeSink {
    plan: Plan,
}

impl Sink for LakeSink {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Settings = weir_plugin::settings(&settings)?;
        Ok(LakeSink {
            plan: Plan::new(settings)?,
        })
    }

    fn deliver(&mut self, rows: &Rows, out: &mut Deliveries) {
        out.extend(append(&self.plan, rows, &today()));
    }
}

weir_plugin::export_sink!(LakeSink);

/// Appends each row to its object; what became of each row, in order.
fn append(plan: &Plan, rows: &Rows, today: &str) -> Vec<Delivery> {
    let mut appended = 0;
    let outcomes = rows
        .iter()
        .enumerate()
        .map(|(index, row)| {
            let added = plan.place(&row, today).and_then(|(path, record)| {
                weir_plugin::objects::append(index, &path, record)
                    .map_err(|reason| format!("lake sink: {reason}"))
            });
            match added {
                Ok(()) => {
                    appended += 1;
                    Delivery::Ok
                }
                Err(reason) => Delivery::DeadLetter(reason),
            }
        })
        .collect();
    if appended > 0 {
        weir_plugin::counter("rows_appended", appended);
    }
    outcomes
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin::RowData;

    fn plan(settings: &str) -> Plan {
        Plan::new(weir_plugin::settings(settings).unwrap()).unwrap()
    }

    fn placed(plan: &Plan, payload: &str) -> Result<(String, Vec<u8>), String> {
        let data = RowData {
            tenant: "acme".into(),
            table: "orders".into(),
            ..RowData::new(payload)
        };
        let rows = Rows::pack([&data]);
        let row = rows.get(0).unwrap();
        plan.place(&row, "2026-12-07")
            .map(|(path, record)| (path, record.to_vec()))
    }

    #[test]
    fn the_default_path_is_tenant_table_and_todays_date() {
        let plan = plan("{}");
        assert!(!plan.reads_payload);
        let (path, record) = placed(&plan, r#"{"id": 1}"#).unwrap();
        assert_eq!(path, "tenant=acme/table=orders/dt=2026-12-07");
        assert_eq!(record, br#"{"id": 1}"#);
    }

    #[test]
    fn a_time_field_dates_the_row_and_a_record_field_is_written_alone() {
        let plan = plan(
            r#"{"time_field": "at", "record": "order", "path": "{table}/{date}/{order.region}"}"#,
        );
        let (path, record) = placed(
            &plan,
            r#"{"at": "2026-01-31T23:59:59Z", "order": {"region": "eu", "id": 7}}"#,
        )
        .unwrap();
        assert_eq!(path, "orders/2026-01-31/eu");
        assert_eq!(record, br#"{"region": "eu", "id": 7}"#);
        let refused =
            placed(&plan, r#"{"at": "yesterday", "order": {"region": "eu"}}"#).unwrap_err();
        assert!(refused.contains("`at` is not an RFC 3339"), "{refused}");
        let missing = placed(&plan, r#"{"at": "2026-01-31", "order": {}}"#).unwrap_err();
        assert!(missing.contains("no field `order.region`"), "{missing}");
    }

    #[test]
    fn todays_date_is_a_civil_date() {
        let today = today();
        assert_eq!(today.len(), 10);
        assert!(today.as_str() > "2026-01-01", "{today}");
    }

    #[test]
    fn every_row_is_appended_or_dead_lettered_with_why() {
        let plan = plan(r#"{"time_field": "at"}"#);
        let good = RowData::new(r#"{"at": "2026-12-07T10:00:00Z"}"#);
        let bad = RowData::new(r#"{"at": 5}"#);
        let rows = Rows::pack([&good, &bad]);
        let outcomes = append(&plan, &rows, "2026-12-08");
        assert_eq!(outcomes[0], Delivery::Ok);
        assert!(matches!(&outcomes[1], Delivery::DeadLetter(why) if why.contains("`at`")));
        let appended = weir_plugin::objects::appended();
        assert_eq!(appended.len(), 1);
        assert!(
            appended[0].path.ends_with("dt=2026-12-07"),
            "{:?}",
            appended[0]
        );
    }
}
