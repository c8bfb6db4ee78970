//! A weir transform that counts and sums rows per key over tumbling
//! windows, keeping the open window in durable state (`grants.state`), so
//! the counts survive a crash or a handover of the unit.
//!
//! Settings (unknown keys are refused):
//!
//! | key           | type   | default      |
//! |---------------|--------|--------------|
//! | `width_ms`    | number | `60000`      |
//! | `key_field`   | string | `"key"`      |
//! | `value_field` | string | `"value"`    |
//! | `time_field`  | string | `"ts"` (ms)  |
//! | `to_table`    | string | `"windows"`  |
//!
//! Each input row is consumed (acked, nothing passed on). When a row of a
//! later window arrives, the open window closes: one summary row per key,
//! `{"window": start_ms, "key": …, "count": n, "sum": s}`, is emitted to
//! `to_table` in place of that row. A row of a window already closed is
//! dead-lettered as late. A row without the fields is dead-lettered.

use serde::Deserialize;
use weir_plugin::{Emitted, Outcomes, Rows, Transform, state};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default = "default_width")]
    width_ms: u64,
    #[serde(default = "default_key")]
    key_field: String,
    #[serde(default = "default_value")]
    value_field: String,
    #[serde(default = "default_time")]
    time_field: String,
    #[serde(default = "default_table")]
    to_table: String,
}

fn default_width() -> u64 {
    60_000
}
fn default_key() -> String {
    "key".into()
}
fn default_value() -> String {
    "value".into()
}
fn default_time() -> String {
    "ts".into()
}
fn default_table() -> String {
    "windows".into()
}

/// The state key of the open window's start.
const OPEN: &[u8] = b"open";
/// Before each key's tally: `k.<key>` holds `count,sum`.
const TALLY: &[u8] = b"k.";

struct Window {
    settings: Settings,
}

impl Transform for Window {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Settings = weir_plugin::settings(&settings)?;
        if settings.width_ms == 0 {
            return Err("width_ms must be at least 1".into());
        }
        Ok(Window { settings })
    }

    fn transform(&mut self, rows: &Rows, out: &mut Outcomes) {
        for (index, row) in rows.iter().enumerate() {
            match self.count(index, row.payload) {
                Ok(summaries) => {
                    let emitted: Vec<Emitted<'_>> = summaries
                        .iter()
                        .map(|payload| Emitted {
                            table: Some(&self.settings.to_table),
                            payload: payload.as_bytes(),
                            headers: &[],
                        })
                        .collect();
                    out.emit(emitted);
                }
                Err(Failure::Retry(reason)) => {
                    weir_plugin::log::warn(&reason);
                    out.retry(1000);
                }
                Err(Failure::Bad(reason)) => out.dead_letter(reason),
            }
        }
    }
}

enum Failure {
    /// The row is fine; the state refused (limits) or is missing.
    Retry(String),
    Bad(String),
}

impl Window {
    /// Counts one row; the summaries of the window it closed, if any.
    fn count(&self, row: usize, payload: &[u8]) -> Result<Vec<String>, Failure> {
        let fields: serde_json::Value = serde_json::from_slice(payload)
            .map_err(|err| Failure::Bad(format!("not JSON: {err}")))?;
        let s = &self.settings;
        let key = match &fields[&s.key_field] {
            serde_json::Value::String(key) => key.clone(),
            serde_json::Value::Null => return Err(Failure::Bad(format!("no `{}`", s.key_field))),
            other => other.to_string(),
        };
        let value = fields[&s.value_field]
            .as_f64()
            .ok_or_else(|| Failure::Bad(format!("`{}` is not a number", s.value_field)))?;
        let time = fields[&s.time_field]
            .as_u64()
            .ok_or_else(|| Failure::Bad(format!("`{}` is not a time in ms", s.time_field)))?;
        let start = time - time % s.width_ms;

        let retry = Failure::Retry;
        let open = state::get(row, OPEN)
            .map_err(retry)?
            .and_then(|bytes| String::from_utf8(bytes).ok()?.parse::<u64>().ok());
        let mut summaries = Vec::new();
        match open {
            Some(open) if start < open => {
                return Err(Failure::Bad(format!(
                    "late: window {start} closed (the open one starts at {open})"
                )));
            }
            Some(open) if start > open => {
                for (tally_key, tally) in state::list(row, TALLY).map_err(Failure::Retry)? {
                    let name = String::from_utf8_lossy(&tally_key[TALLY.len()..]).to_string();
                    let (count, sum) = parse_tally(&tally);
                    summaries.push(
                        serde_json::json!({"window": open, "key": name, "count": count, "sum": sum})
                            .to_string(),
                    );
                    state::delete(row, &tally_key).map_err(Failure::Retry)?;
                }
                state::set(row, OPEN, start.to_string().as_bytes()).map_err(Failure::Retry)?;
            }
            Some(_) => {}
            None => state::set(row, OPEN, start.to_string().as_bytes()).map_err(Failure::Retry)?,
        }
        let tally_key = [TALLY, key.as_bytes()].concat();
        let (count, sum) = state::get(row, &tally_key)
            .map_err(Failure::Retry)?
            .map_or((0, 0.0), |tally| parse_tally(&tally));
        state::set(
            row,
            &tally_key,
            format!("{},{}", count + 1, sum + value).as_bytes(),
        )
        .map_err(Failure::Retry)?;
        Ok(summaries)
    }
}

fn parse_tally(bytes: &[u8]) -> (u64, f64) {
    let text = String::from_utf8_lossy(bytes);
    let (count, sum) = text.split_once(',').unwrap_or(("0", "0"));
    (count.parse().unwrap_or(0), sum.parse().unwrap_or(0.0))
}

weir_plugin::export_transform!(Window);
