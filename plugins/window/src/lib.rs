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
//! | `keep`        | string | `"state"`    |
//!
//! `keep = "state"` keeps the tallies in `grants.state`; `keep = "memory"`
//! in the instance, per tenant and table, as a stream processor without
//! durable state would: lost when the instance is recycled or the host
//! stops, and counted again on a redelivery. It is there to measure what
//! the durable state costs (`host/benches/state.rs`).
//!
//! Each input row is consumed (acked, nothing passed on). When a row of a
//! later window arrives, the open window closes: one summary row per key,
//! `{"window": start_ms, "key": …, "count": n, "sum": s}`, is emitted to
//! `to_table` in place of that row. A row of a window already closed is
//! dead-lettered as late. A row without the fields is dead-lettered, and so
//! is a row whose tally the state refuses (`grants.state` limits: the open
//! window's start is one key, each key's tally another).

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use weir_plugin::{Emitted, Outcomes, Row, Rows, Transform, state};

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
    #[serde(default)]
    keep: KeepIn,
}

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
enum KeepIn {
    #[default]
    State,
    Memory,
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
    /// With `keep = "memory"`: each (tenant, table)'s keys.
    memory: HashMap<(String, String), BTreeMap<Vec<u8>, Vec<u8>>>,
}

/// One row's tallies: its scope in `grants.state`, or the instance's map.
enum Tallies<'a> {
    State(usize),
    Memory(&'a mut BTreeMap<Vec<u8>, Vec<u8>>),
}

/// The state's refusals (its limits) hold for any retry too: the row is
/// dead-lettered with them.
fn refused(err: String) -> String {
    format!("state: {err}")
}

impl Tallies<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        match self {
            Tallies::State(row) => state::get(*row, key).map_err(refused),
            Tallies::Memory(map) => Ok(map.get(key).cloned()),
        }
    }

    fn set(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
        match self {
            Tallies::State(row) => state::set(*row, key, value).map_err(refused),
            Tallies::Memory(map) => {
                map.insert(key.to_vec(), value.to_vec());
                Ok(())
            }
        }
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), String> {
        match self {
            Tallies::State(row) => state::delete(*row, key).map_err(refused),
            Tallies::Memory(map) => {
                map.remove(key);
                Ok(())
            }
        }
    }

    fn list(&self, prefix: &[u8]) -> Result<Vec<state::Entry>, String> {
        match self {
            Tallies::State(row) => state::list(*row, prefix).map_err(refused),
            Tallies::Memory(map) => Ok(map
                .range(prefix.to_vec()..)
                .take_while(|(key, _)| key.starts_with(prefix))
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect()),
        }
    }
}

impl Transform for Window {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Settings = weir_plugin::settings(&settings)?;
        if settings.width_ms == 0 {
            return Err("width_ms must be at least 1".into());
        }
        Ok(Window {
            settings,
            memory: HashMap::new(),
        })
    }

    fn transform(&mut self, rows: &Rows, out: &mut Outcomes) {
        // Only this call writes its scopes while it runs: each scope's open
        // window is read once per call, not once per row.
        let mut opens = Opens::default();
        for (index, row) in rows.iter().enumerate() {
            match self.count(index, &row, &mut opens) {
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
                Err(reason) => out.dead_letter(reason),
            }
        }
    }
}

/// The open window's start of each (tenant, table) a call has seen, as
/// its tallies hold it now.
#[derive(Default)]
struct Opens(Vec<(String, String, u64)>);

impl Opens {
    fn get(&self, row: &Row<'_>) -> Option<u64> {
        self.0
            .iter()
            .find(|(tenant, table, _)| tenant == row.tenant && table == row.table)
            .map(|(_, _, open)| *open)
    }

    fn set(&mut self, row: &Row<'_>, open: u64) {
        match self
            .0
            .iter_mut()
            .find(|(tenant, table, _)| tenant == row.tenant && table == row.table)
        {
            Some((_, _, known)) => *known = open,
            None => self
                .0
                .push((row.tenant.to_string(), row.table.to_string(), open)),
        }
    }
}

impl Window {
    /// Counts one row; the summaries of the window it closed, if any.
    fn count(
        &mut self,
        index: usize,
        row: &Row<'_>,
        opens: &mut Opens,
    ) -> Result<Vec<String>, String> {
        let fields: serde_json::Value =
            serde_json::from_slice(row.payload).map_err(|err| format!("not JSON: {err}"))?;
        let s = &self.settings;
        let key = match &fields[&s.key_field] {
            serde_json::Value::String(key) => key.clone(),
            serde_json::Value::Null => return Err(format!("no `{}`", s.key_field)),
            other => other.to_string(),
        };
        let value = fields[&s.value_field]
            .as_f64()
            .ok_or_else(|| format!("`{}` is not a number", s.value_field))?;
        let time = fields[&s.time_field]
            .as_u64()
            .ok_or_else(|| format!("`{}` is not a time in ms", s.time_field))?;
        let start = time - time % s.width_ms;

        let mut tallies = match s.keep {
            KeepIn::State => Tallies::State(index),
            KeepIn::Memory => Tallies::Memory(
                self.memory
                    .entry((row.tenant.to_string(), row.table.to_string()))
                    .or_default(),
            ),
        };
        let open = match opens.get(row) {
            Some(open) => Some(open),
            None => {
                let open = tallies
                    .get(OPEN)?
                    .and_then(|bytes| String::from_utf8(bytes).ok()?.parse::<u64>().ok());
                if let Some(open) = open {
                    opens.set(row, open);
                }
                open
            }
        };
        let mut summaries = Vec::new();
        match open {
            Some(open) if start < open => {
                return Err(format!(
                    "late: window {start} closed (the open one starts at {open})"
                ));
            }
            Some(open) if start > open => {
                // The new start first: if the state refuses it, nothing of
                // the closing window is gone yet.
                tallies.set(OPEN, start.to_string().as_bytes())?;
                opens.set(row, start);
                for (tally_key, tally) in tallies.list(TALLY)? {
                    let name = String::from_utf8_lossy(&tally_key[TALLY.len()..]).to_string();
                    let (count, sum) = parse_tally(&tally);
                    summaries.push(
                        serde_json::json!({"window": open, "key": name, "count": count, "sum": sum})
                            .to_string(),
                    );
                    tallies.delete(&tally_key)?;
                }
            }
            Some(_) => {}
            None => {
                tallies.set(OPEN, start.to_string().as_bytes())?;
                opens.set(row, start);
            }
        }
        let tally_key = [TALLY, key.as_bytes()].concat();
        let (count, sum) = tallies
            .get(&tally_key)?
            .map_or((0, 0.0), |tally| parse_tally(&tally));
        tallies.set(
            &tally_key,
            format!("{},{}", count + 1, sum + value).as_bytes(),
        )?;
        Ok(summaries)
    }
}

fn parse_tally(bytes: &[u8]) -> (u64, f64) {
    let text = String::from_utf8_lossy(bytes);
    let (count, sum) = text.split_once(',').unwrap_or(("0", "0"));
    (count.parse().unwrap_or(0), sum.parse().unwrap_or(0.0))
}

weir_plugin::export_transform!(Window);
