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

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;

use serde::Deserialize;
use weir_plugin::sink::{Delivery, Guest, Row};

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

static SETTINGS: OnceLock<Settings> = OnceLock::new();

struct NdjsonSink;

impl Guest for NdjsonSink {
    fn init(settings: String) -> Result<(), String> {
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
        SETTINGS
            .set(settings)
            .map_err(|_| "ndjson-sink: init called twice".to_string())
    }

    fn deliver(rows: Vec<Row>) -> Vec<Delivery> {
        let settings = SETTINGS
            .get()
            .expect("ndjson-sink: deliver called before init");
        let mut results: Vec<Delivery> = (0..rows.len()).map(|_| Delivery::Ok).collect();

        // Groups in order of first appearance: (tenant, table) -> row indexes.
        let mut groups: Vec<(&str, &str, Vec<usize>)> = Vec::new();
        let mut index: HashMap<(&str, &str), usize> = HashMap::new();
        for (i, row) in rows.iter().enumerate() {
            if let Some(reason) = refusal(row) {
                results[i] = Delivery::DeadLetter(reason);
                continue;
            }
            let key = (row.tenant.as_str(), row.table.as_str());
            let g = *index.entry(key).or_insert_with(|| {
                groups.push((key.0, key.1, Vec::new()));
                groups.len() - 1
            });
            groups[g].2.push(i);
        }

        let mut written = 0;
        for (tenant, table, members) in groups {
            let mut buf =
                Vec::with_capacity(members.iter().map(|&i| rows[i].payload.len() + 1).sum());
            for &i in &members {
                buf.extend_from_slice(&rows[i].payload);
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
        results
    }
}

weir_plugin::export_sink!(NdjsonSink);

/// Why a row can never be written, if it cannot.
fn refusal(row: &Row) -> Option<String> {
    if row.payload.contains(&b'\n') {
        return Some("payload contains a newline; not one NDJSON line".to_string());
    }
    for (what, name) in [("tenant", &row.tenant), ("table", &row.table)] {
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

    fn row(tenant: &str, table: &str, payload: &str) -> Row {
        Row {
            tenant: tenant.into(),
            table: table.into(),
            payload: payload.as_bytes().to_vec(),
            headers: Vec::new(),
            sequence: 1,
            attempt: 1,
        }
    }

    #[test]
    fn refuses_what_it_cannot_write() {
        assert_eq!(refusal(&row("acme", "events", r#"{"a":1}"#)), None);
        assert_eq!(
            refusal(&row("acme", "events", "{}\n{}")).as_deref(),
            Some("payload contains a newline; not one NDJSON line")
        );
        for (tenant, table) in [
            ("acme", "../x"),
            ("..", "events"),
            ("acme", ""),
            ("a/b", "t"),
        ] {
            assert!(
                refusal(&row(tenant, table, "{}")).is_some(),
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
