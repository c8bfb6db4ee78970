//! A weir sink that appends each row's payload as one line to `<dir>/<tenant>/<table>.ndjson`.
//!
//! Settings (unknown keys are refused):
//!
//! | key     | type   | default  | meaning                                                  |
//! |---------|--------|----------|----------------------------------------------------------|
//! | `dir`   | string | `"/out"` | guest path of the directory the host preopens            |
//! | `fsync` | bool   | `false`  | sync each file to disk after a batch's write             |
//!
//! A batch is grouped by (tenant, table); each group's lines are appended
//! with one write to a file opened once for the batch, creating the tenant's
//! directory if needed. A payload containing a newline is dead-lettered, as
//! is a row whose tenant or table is not a plain file name (empty, `.`,
//! `..`, or containing `/`, `\` or NUL), so no row can write outside its
//! tenant's directory. An I/O error asks the host to retry the group's rows
//! after a second. The sink sees only the directories the host preopens.
//! Counter: `rows_written`.

use serde::Deserialize;
use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;
use weir_plugin::{Deliveries, Delivery, Row, Rows, Sink};

/// How long the host waits before retrying rows whose write failed.
const RETRY_MS: u32 = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default = "default_dir")]
    dir: String,
    #[serde(default)]
    fsync: bool,
}

fn default_dir() -> String {
    "/out".to_string()
}

struct NdjsonSink {
    settings: Settings,
}

impl Sink for NdjsonSink {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Settings = weir_plugin::settings(&settings)?;
        match fs::metadata(&settings.dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(format!(
                    "ndjson-sink: `{}` is not a directory",
                    settings.dir
                ));
            }
            Err(e) => {
                return Err(format!(
                    "ndjson-sink: cannot use directory `{}` ({e}); does the host preopen it?",
                    settings.dir
                ));
            }
        }
        Ok(NdjsonSink { settings })
    }

    fn deliver(&mut self, rows: &Rows, out: &mut Deliveries) {
        let settings = &self.settings;
        // Rows are decided group by group, so out of order: kept here, then written in order.
        let mut results: Vec<Delivery> = vec![Delivery::Ok; rows.len()];

        // Groups in order of first appearance: (tenant, table) -> row indexes.
        let mut groups: Vec<(&str, &str, Vec<usize>)> = Vec::new();
        let mut index: HashMap<(&str, &str), usize> = HashMap::new();
        for (i, row) in rows.iter().enumerate() {
            if let Some(reason) = refusal(&row) {
                results[i] = Delivery::DeadLetter(reason);
                continue;
            }
            let key = (row.tenant, row.table);
            let g = *index.entry(key).or_insert_with(|| {
                groups.push((key.0, key.1, Vec::new()));
                groups.len() - 1
            });
            groups[g].2.push(i);
        }

        let mut written = 0;
        for (tenant, table, members) in groups {
            let payloads = members
                .iter()
                .filter_map(|&i| rows.get(i))
                .map(|row| row.payload);
            let mut buf = Vec::with_capacity(payloads.clone().map(|p| p.len() + 1).sum());
            for payload in payloads {
                buf.extend_from_slice(payload);
                buf.push(b'\n');
            }
            let tenant_dir = Path::new(&settings.dir).join(tenant);
            let path = tenant_dir.join(format!("{table}.ndjson"));
            match append(&tenant_dir, &path, &buf, settings.fsync) {
                Ok(()) => written += members.len() as u64,
                Err(e) => {
                    weir_plugin::log::warn(&format!(
                        "ndjson-sink: cannot append to {}: {e}; retrying {} rows in {RETRY_MS} ms",
                        path.display(),
                        members.len()
                    ));
                    for i in members {
                        results[i] = Delivery::Retry(RETRY_MS);
                    }
                }
            }
        }
        if written > 0 {
            weir_plugin::counter("rows_written", written);
        }
        out.extend(results);
    }
}

weir_plugin::export_sink!(NdjsonSink);

/// Why a row can never be written, if it cannot.
fn refusal(row: &Row<'_>) -> Option<String> {
    if row.payload.contains(&b'\n') {
        return Some("payload contains a newline; not one NDJSON line".to_string());
    }
    for (what, name) in [("tenant", row.tenant), ("table", row.table)] {
        if !is_plain_name(name) {
            return Some(format!(
                "{what} `{}` is not a plain file name",
                name.escape_debug()
            ));
        }
    }
    None
}

/// A name usable as one path component, naming nothing outside its directory.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

fn append(tenant_dir: &Path, path: &Path, buf: &[u8], fsync: bool) -> std::io::Result<()> {
    fs::create_dir_all(tenant_dir)?;
    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
    file.write_all(buf)?;
    if fsync {
        file.sync_data()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin::RowData;

    fn refusal_of(tenant: &str, table: &str, payload: &str) -> Option<String> {
        let row = RowData {
            tenant: tenant.into(),
            table: table.into(),
            ..RowData::new(payload)
        };
        let rows = Rows::pack([&row]);
        refusal(&rows.get(0).unwrap())
    }

    #[test]
    fn refuses_what_it_cannot_write() {
        assert_eq!(refusal_of("acme", "events", r#"{"a":1}"#), None);
        assert_eq!(
            refusal_of("acme", "events", "{}\n{}").as_deref(),
            Some("payload contains a newline; not one NDJSON line")
        );
        for (tenant, table) in [
            ("acme", "../x"),
            ("..", "events"),
            ("acme", ""),
            ("a/b", "t"),
        ] {
            assert!(
                refusal_of(tenant, table, "{}").is_some(),
                "{tenant}/{table}"
            );
        }
    }

    #[test]
    fn appends() {
        let dir = std::env::temp_dir().join(format!("weir-ndjson-sink-{}", std::process::id()));
        let tenant_dir = dir.join("acme");
        let path = tenant_dir.join("events.ndjson");
        append(&tenant_dir, &path, b"1\n2\n", false).unwrap();
        append(&tenant_dir, &path, b"3\n", true).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "1\n2\n3\n");
        fs::remove_dir_all(&dir).unwrap();
    }
}
