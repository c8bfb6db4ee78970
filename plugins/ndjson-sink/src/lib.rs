//! A weir sink that appends each row's payload as one line to `<dir>/<tenant>/<table>.ndjson`.
//!
//! Settings (unknown keys are refused):
//!
//! | key              | type    | default  | meaning                                                         |
//! |------------------|---------|----------|-----------------------------------------------------------------|
//! | `dir`            | string  | `"/out"` | guest path of the directory the host preopens                   |
//! | `fsync`          | bool    | `false`  | sync each file (then its sidecar) to disk after a batch's write |
//! | `dedupe_window`  | integer | `0`      | rows per file remembered to drop a replay (`65536`); `0`: off   |
//!
//! A batch is grouped by (tenant, table); each group's lines are appended
//! with one write to a file opened once for the batch, creating the tenant's
//! directory if needed. A payload containing a newline is dead-lettered, as
//! is a row whose tenant or table is not a plain file name (empty, `.`,
//! `..`, or containing `/`, `\` or NUL) or whose tenant is `.weir-written`,
//! so no row can write outside its tenant's directory. An I/O error asks
//! the host to retry the group's rows after a second. The sink sees only
//! the directories the host preopens.
//!
//! Replays (rows weir delivers again after a crash, a lost ack or a
//! takeover) are dropped: for each output file a sidecar
//! `<dir>/.weir-written/<tenant>/<table>.seen` gets a 16-byte record per
//! line appended, the row's sequence and the FNV-1a 64 hash of its payload
//! ([`weir_plugin::stable_hash64`]), both `u64` little-endian. A row whose
//! record is among the file's last `dedupe_window` records is not written
//! again and is delivered; so is a second copy of a row in one batch. The
//! hash tells apart two rows with one sequence (a table a router moved to
//! another partition stream). The lines are appended before their records,
//! so a crash between the two can only write a line twice later, never
//! lose one. An instance reads only a sidecar's tail, then what other
//! instances append; it keeps at most 64 sidecars' records in memory, and
//! about `max(dedupe_window, 262144)` records in all (some 50 bytes each).
//! A sidecar it cannot read costs a possible duplicate, never a row. A
//! directory reused with a new stream (whose sequences start again at 1)
//! needs its `.weir-written` removed, or a row equal to one of the last
//! `dedupe_window` ones with the same sequence would be dropped: that is
//! why it is off unless set (a quickstart run again on a fresh data dir
//! sends the same rows under the same sequences). Turn it on where the
//! output directory lives as long as the streams do.
//!
//! Counters: `rows_written`, `rows_skipped_replayed` (replays not written).

mod seen;

use serde::Deserialize;
use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use weir_plugin::{Deliveries, Delivery, Row, Rows, Sink};

use seen::{Record, Seen};

/// How long the host waits before retrying rows whose write failed.
const RETRY_MS: u32 = 1000;
/// The directory under `dir` holding the sidecars, hidden from `*/*.ndjson`.
const SIDECARS: &str = ".weir-written";
/// Largest `dedupe_window`: its tail is 16 MiB of sidecar, ~50 MiB of memory.
const MAX_DEDUPE_WINDOW: usize = 1 << 20;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default = "default_dir")]
    dir: String,
    #[serde(default)]
    fsync: bool,
    #[serde(default = "default_dedupe_window")]
    dedupe_window: usize,
}

fn default_dir() -> String {
    "/out".to_string()
}

/// Off: a directory outliving its streams would drop new rows equal to old ones.
fn default_dedupe_window() -> usize {
    0
}

struct NdjsonSink {
    settings: Settings,
    /// The sidecars' last records, read as needed.
    seen: Seen,
}

/// What a batch came to, for the counters.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    written: u64,
    skipped_replayed: u64,
}

impl Sink for NdjsonSink {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Settings = weir_plugin::settings(&settings)?;
        if settings.dedupe_window > MAX_DEDUPE_WINDOW {
            return Err(format!(
                "ndjson-sink: `dedupe_window` must be at most {MAX_DEDUPE_WINDOW} rows"
            ));
        }
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
        Ok(NdjsonSink {
            seen: Seen::new(settings.dedupe_window),
            settings,
        })
    }

    fn deliver(&mut self, rows: &Rows, out: &mut Deliveries) {
        let (results, tally) = self.write(rows);
        if tally.written > 0 {
            weir_plugin::counter("rows_written", tally.written);
        }
        if tally.skipped_replayed > 0 {
            weir_plugin::counter("rows_skipped_replayed", tally.skipped_replayed);
        }
        out.extend(results);
    }
}

weir_plugin::export_sink!(NdjsonSink);

impl NdjsonSink {
    /// Writes `rows`, group by group: what became of each, in order.
    fn write(&mut self, rows: &Rows) -> (Vec<Delivery>, Tally) {
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

        let mut tally = Tally::default();
        for (tenant, table, members) in groups {
            self.write_group(rows, tenant, table, &members, &mut results, &mut tally);
        }
        (results, tally)
    }

    /// Appends the lines of one (tenant, table) group that are not replays,
    /// then their records.
    fn write_group(
        &mut self,
        rows: &Rows,
        tenant: &str,
        table: &str,
        members: &[usize],
        results: &mut [Delivery],
        tally: &mut Tally,
    ) {
        let settings = &self.settings;
        let tenant_dir = Path::new(&settings.dir).join(tenant);
        let path = tenant_dir.join(format!("{table}.ndjson"));
        let sidecar = sidecar_path(&settings.dir, tenant, table);
        let dedupe = settings.dedupe_window > 0;

        // The file's last records; none if its sidecar cannot be read.
        let window = if dedupe {
            match self.seen.window(&sidecar) {
                Ok(window) => Some(window),
                Err(e) => {
                    weir_plugin::log::warn(&format!(
                        "ndjson-sink: cannot read {}: {e}; writing {} rows without dropping replays",
                        sidecar.display(),
                        members.len()
                    ));
                    None
                }
            }
        } else {
            None
        };

        // The rows to write, their records, and the second copies of rows
        // in this batch (index, index of the first copy).
        let mut fresh = Vec::with_capacity(members.len());
        let mut records = Vec::with_capacity(if dedupe { members.len() } else { 0 });
        let mut copies = Vec::new();
        let mut in_batch: HashMap<Record, usize> = HashMap::new();
        let mut buf = Vec::new();
        for &i in members {
            let Some(row) = rows.get(i) else { continue };
            if dedupe {
                let record = Record::of(row.sequence, row.payload);
                if window.is_some_and(|window| window.contains(&record)) {
                    tally.skipped_replayed += 1;
                    continue;
                }
                if let Some(&first) = in_batch.get(&record) {
                    copies.push((i, first));
                    continue;
                }
                in_batch.insert(record, i);
                records.push(record);
            }
            fresh.push(i);
            buf.extend_from_slice(row.payload);
            buf.push(b'\n');
        }

        if !fresh.is_empty() {
            match append(&tenant_dir, &path, &buf, settings.fsync) {
                Ok(()) => {
                    tally.written += fresh.len() as u64;
                    // Lines first: a crash before this can only repeat them.
                    if let Err(e) = self.seen.append(&sidecar, &records, settings.fsync) {
                        weir_plugin::log::warn(&format!(
                            "ndjson-sink: wrote {} rows to {} but cannot record them in {}: {e}; \
                             a replay of them would be written again",
                            fresh.len(),
                            path.display(),
                            sidecar.display()
                        ));
                    }
                }
                Err(e) => {
                    weir_plugin::log::warn(&format!(
                        "ndjson-sink: cannot append to {}: {e}; retrying {} rows in {RETRY_MS} ms",
                        path.display(),
                        fresh.len()
                    ));
                    for &i in &fresh {
                        results[i] = Delivery::Retry(RETRY_MS);
                    }
                }
            }
        }
        // A second copy shares its first copy's fate.
        for (i, first) in copies {
            results[i] = results[first].clone();
            if results[i] == Delivery::Ok {
                tally.skipped_replayed += 1;
            }
        }
    }
}

/// The sidecar recording what was written to `<dir>/<tenant>/<table>.ndjson`.
fn sidecar_path(dir: &str, tenant: &str, table: &str) -> PathBuf {
    Path::new(dir)
        .join(SIDECARS)
        .join(tenant)
        .join(format!("{table}.seen"))
}

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
    if row.tenant == SIDECARS {
        return Some(format!(
            "tenant `{SIDECARS}` would write among the sidecars"
        ));
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
        assert!(refusal_of(".weir-written", "events", "{}").is_some());
        assert_eq!(refusal_of(".acme", "events", "{}"), None);
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

    /// An empty directory of its own for one test.
    fn scratch(test: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("weir-ndjson-sink-{}-{test}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A sink on `dir` as a new instance would start, remembering `window` rows.
    fn sink(dir: &Path, window: usize) -> NdjsonSink {
        let settings = serde_json::json!({ "dir": dir, "dedupe_window": window });
        NdjsonSink::init(settings.to_string()).unwrap()
    }

    /// Rows of acme/events: (sequence, payload).
    fn rows(rows: &[(u64, &str)]) -> Rows {
        let rows: Vec<RowData> = rows
            .iter()
            .map(|&(sequence, payload)| RowData {
                tenant: "acme".into(),
                sequence,
                ..RowData::new(payload)
            })
            .collect();
        Rows::pack(&rows)
    }

    /// Delivers `batch`: every row must be delivered; what was counted.
    fn deliver(sink: &mut NdjsonSink, batch: &[(u64, &str)]) -> Tally {
        let (results, tally) = sink.write(&rows(batch));
        assert_eq!(results, vec![Delivery::Ok; batch.len()]);
        tally
    }

    fn tally(written: u64, skipped_replayed: u64) -> Tally {
        Tally {
            written,
            skipped_replayed,
        }
    }

    fn lines(dir: &Path) -> Vec<String> {
        fs::read_to_string(dir.join("acme/events.ndjson"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn sidecar(dir: &Path) -> PathBuf {
        dir.join(".weir-written/acme/events.seen")
    }

    #[test]
    fn a_replayed_batch_writes_nothing_and_is_counted() {
        let dir = scratch("replayed");
        let mut sink = sink(&dir, 100);
        assert_eq!(deliver(&mut sink, &[(1, "a"), (2, "b")]), tally(2, 0));
        assert_eq!(deliver(&mut sink, &[(1, "a"), (2, "b")]), tally(0, 2));
        // A batch mixing a replay and a new row writes the new one only.
        assert_eq!(deliver(&mut sink, &[(2, "b"), (3, "c")]), tally(1, 1));
        assert_eq!(lines(&dir), ["a", "b", "c"]);
        assert_eq!(fs::metadata(sidecar(&dir)).unwrap().len(), 3 * 16);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_row_with_the_same_sequence_but_another_payload_is_written() {
        let dir = scratch("same-sequence");
        let mut sink = sink(&dir, 100);
        assert_eq!(deliver(&mut sink, &[(1, "a")]), tally(1, 0));
        assert_eq!(deliver(&mut sink, &[(1, "moved")]), tally(1, 0));
        assert_eq!(lines(&dir), ["a", "moved"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_second_copy_in_one_batch_is_written_once() {
        let dir = scratch("in-batch");
        let mut sink = sink(&dir, 100);
        assert_eq!(
            deliver(&mut sink, &[(1, "a"), (2, "b"), (1, "a")]),
            tally(2, 1)
        );
        assert_eq!(lines(&dir), ["a", "b"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn records_survive_a_new_instance() {
        let dir = scratch("new-instance");
        assert_eq!(
            deliver(&mut sink(&dir, 100), &[(1, "a"), (2, "b")]),
            tally(2, 0)
        );
        let mut fresh = sink(&dir, 100);
        assert_eq!(
            deliver(&mut fresh, &[(1, "a"), (2, "b"), (3, "c")]),
            tally(1, 2)
        );
        assert_eq!(lines(&dir), ["a", "b", "c"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_window_of_n_forgets_sequences_older_than_n_records() {
        let dir = scratch("window");
        let mut sink3 = sink(&dir, 3);
        assert_eq!(
            deliver(&mut sink3, &[(1, "a"), (2, "b"), (3, "c"), (4, "d")]),
            tally(4, 0)
        );
        // The last 3 records are 2, 3 and 4: 1 is forgotten, in this
        // instance and in a new one, which reads only the sidecar's tail.
        assert_eq!(deliver(&mut sink3, &[(4, "d"), (2, "b")]), tally(0, 2));
        assert_eq!(
            deliver(&mut sink(&dir, 3), &[(2, "b"), (1, "a")]),
            tally(1, 1)
        );
        assert_eq!(lines(&dir), ["a", "b", "c", "d", "a"]);
        // Now 3, 4 and 1 (again): 2 is gone.
        assert_eq!(deliver(&mut sink3, &[(2, "b"), (1, "a")]), tally(1, 1));
        assert_eq!(sink3.seen.cached(), (1, 3));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_torn_sidecar_tail_is_tolerated() {
        let dir = scratch("torn");
        assert_eq!(deliver(&mut sink(&dir, 100), &[(1, "a")]), tally(1, 0));
        // A crash in the middle of writing the next record.
        let mut file = OpenOptions::new().append(true).open(sidecar(&dir)).unwrap();
        file.write_all(&[9; 7]).unwrap();
        let mut sink = sink(&dir, 100);
        assert_eq!(deliver(&mut sink, &[(1, "a"), (2, "b")]), tally(1, 1));
        // The torn record was padded to a whole one before row 2's.
        assert_eq!(fs::metadata(sidecar(&dir)).unwrap().len(), 3 * 16);
        assert_eq!(deliver(&mut sink, &[(1, "a"), (2, "b")]), tally(0, 2));
        let mut fresh = self::sink(&dir, 100);
        assert_eq!(deliver(&mut fresh, &[(1, "a"), (2, "b")]), tally(0, 2));
        assert_eq!(lines(&dir), ["a", "b"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn two_instances_see_each_others_records() {
        let dir = scratch("two-instances");
        let (mut one, mut two) = (sink(&dir, 100), sink(&dir, 100));
        assert_eq!(deliver(&mut one, &[(1, "a")]), tally(1, 0));
        assert_eq!(deliver(&mut two, &[(1, "a"), (2, "b")]), tally(1, 1));
        // `one` read the sidecar up to its own record: it reads on from there.
        assert_eq!(deliver(&mut one, &[(2, "b"), (3, "c")]), tally(1, 1));
        assert_eq!(deliver(&mut two, &[(3, "c")]), tally(0, 1));
        assert_eq!(
            deliver(&mut one, &[(1, "a"), (2, "b"), (3, "c")]),
            tally(0, 3)
        );
        assert_eq!(lines(&dir), ["a", "b", "c"]);
        assert_eq!((one.seen.cached(), two.seen.cached()), ((1, 3), (1, 3)));
        // A sidecar that shrank (removed, here) is read again from the start.
        fs::remove_file(sidecar(&dir)).unwrap();
        assert_eq!(deliver(&mut one, &[(1, "a")]), tally(1, 0));
        assert_eq!(one.seen.cached(), (1, 1));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_instance_reads_only_what_was_appended_since() {
        let dir = scratch("appended-since");
        let mut one = sink(&dir, 100);
        assert_eq!(deliver(&mut one, &[(1, "a")]), tally(1, 0));
        // Record 1 blanked in place: `one` has read it already, and reads
        // on past it when `two` appends.
        fs::write(sidecar(&dir), [0; 16]).unwrap();
        assert_eq!(deliver(&mut sink(&dir, 100), &[(2, "b")]), tally(1, 0));
        assert_eq!(deliver(&mut one, &[(1, "a"), (2, "b")]), tally(0, 2));
        // A new instance reads the tail: record 1 is not in it any more.
        assert_eq!(
            deliver(&mut sink(&dir, 100), &[(1, "a"), (2, "b")]),
            tally(1, 1)
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_window_of_0_writes_every_replay() {
        let dir = scratch("disabled");
        let mut sink = sink(&dir, 0);
        assert_eq!(deliver(&mut sink, &[(1, "a"), (1, "a")]), tally(2, 0));
        assert_eq!(deliver(&mut sink, &[(1, "a")]), tally(1, 0));
        assert_eq!(lines(&dir), ["a", "a", "a"]);
        assert!(!dir.join(SIDECARS).exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unusable_sidecar_costs_a_duplicate_never_a_row() {
        let dir = scratch("unusable");
        // A directory where the sidecar should be: it can be neither read
        // nor appended to.
        fs::create_dir_all(sidecar(&dir).join("x")).unwrap();
        let mut sink = sink(&dir, 100);
        assert_eq!(deliver(&mut sink, &[(1, "a")]), tally(1, 0));
        assert_eq!(deliver(&mut sink, &[(1, "a")]), tally(1, 0));
        assert_eq!(lines(&dir), ["a", "a"]);
        assert_eq!(sink.seen.cached().1, 0);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_write_retries_a_row_and_its_second_copy() {
        let dir = scratch("failed");
        // A directory where the output file should be.
        fs::create_dir_all(dir.join("acme/events.ndjson")).unwrap();
        let mut sink = sink(&dir, 100);
        let (results, tally) = sink.write(&rows(&[(1, "a"), (1, "a")]));
        assert_eq!(results, vec![Delivery::Retry(RETRY_MS); 2]);
        assert_eq!(tally, self::tally(0, 0));
        assert!(!sidecar(&dir).exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_instance_keeps_a_bounded_number_of_sidecars() {
        let dir = scratch("bounded");
        let mut sink = sink(&dir, 100);
        let tables: Vec<RowData> = (0..seen::MAX_FILES + 6)
            .map(|t| RowData {
                tenant: "acme".into(),
                table: format!("t{t}"),
                ..RowData::new("x")
            })
            .collect();
        let (results, _) = sink.write(&Rows::pack(&tables));
        assert!(results.iter().all(|r| *r == Delivery::Ok));
        assert_eq!(sink.seen.cached(), (seen::MAX_FILES, seen::MAX_FILES));
        // The forgotten ones are read again when needed.
        let (_, tally) = sink.write(&Rows::pack(&tables));
        assert_eq!(tally, self::tally(0, tables.len() as u64));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_a_window_too_large_to_keep() {
        let dir = scratch("too-large");
        let settings = serde_json::json!({ "dir": dir, "dedupe_window": MAX_DEDUPE_WINDOW + 1 });
        let error = NdjsonSink::init(settings.to_string()).err().unwrap();
        assert!(error.contains("`dedupe_window` must be at most"), "{error}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
