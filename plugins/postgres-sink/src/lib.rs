//! A weir sink that writes each row's JSON fields to the columns of a
//! PostgreSQL table, through the database the host holds for it
//! (`grants.postgres`): every statement of a batch runs in the host's
//! transaction for the call, committed with the rows' acks, so each row is
//! written once even across crashes and takeovers.
//!
//! Settings (unknown keys are refused):
//!
//! | key             | type   | default         | meaning                                                          |
//! |-----------------|--------|-----------------|------------------------------------------------------------------|
//! | `table`         | string | —               | target table template: `events`, `{tenant}_{table}`, `{tenant}.{table}` |
//! | `columns`       | table  | —               | column name → field of the payload (`id`, `order.amount`, `/a/b`, `.`) |
//! | `tenant_column` | string | none            | a column that gets the row's tenant                              |
//! | `table_column`  | string | none            | a column that gets the table the row was sent to                 |
//! | `mode`          | string | `"insert"`      | `"insert"`, or `"upsert"` on `key`                               |
//! | `key`           | array  | —               | upsert only: the conflict target's columns, e.g. `["id"]`        |
//! | `on_conflict`   | string | `"error"`       | insert only: `"error"` (dead-letter the row) or `"ignore"`       |
//! | `missing`       | string | `"dead-letter"` | a payload lacking a mapped field: `"dead-letter"` or `"null"`    |
//!
//! `table` is a table name or `schema.table`, each part literal text and
//! the placeholders `{tenant}` and `{table}` (the row's); `columns` and
//! `key` name columns. Every name is used exactly as written, quoted:
//! case is kept (`"{tenant}_{table}"` for tenant `Acme` is the table
//! `"Acme_orders"`, not `acme_orders`), and a name longer than 63 bytes
//! is refused (at init, or the row is dead-lettered) rather than cut.
//! The tables must exist: the sink creates nothing.
//!
//! A field is `"."` for the whole payload, a JSON pointer (`"/order/amount"`,
//! for keys with dots) or dotted keys (`"order.amount"`, `"items.0"`). Its
//! JSON goes to the column as the producer wrote it, and PostgreSQL turns
//! it into the column's type (`json_populate_recordset`): a string's text
//! for `text`, `timestamptz` or `uuid` columns, a number for numeric ones
//! (every digit kept), an object or array for `json`/`jsonb` (or arrays),
//! `null` for NULL. A payload that is not a JSON object is dead-lettered,
//! and so is one lacking a field (`missing = "dead-letter"`) or it is
//! NULL (`missing = "null"`).
//!
//! Each batch's rows are grouped by target table and each group written by
//! one statement with one parameter, the group's rows as a JSON array:
//!
//! ```sql
//! INSERT INTO "t" ("a", "b") SELECT "a", "b" FROM json_populate_recordset(NULL::"t", $1::json)
//!   [ON CONFLICT DO NOTHING | ON CONFLICT ("a") DO UPDATE SET "b" = EXCLUDED."b"]
//! ```
//!
//! (an upsert whose group holds a key twice is split into statements that
//! each hold it once, applied in order). If the statement fails for its
//! data (a constraint, a bad value), the group's rows are written one
//! statement each: those that fail are dead-lettered with the database's
//! message, SQLSTATE, constraint and column, e.g. `postgres: duplicate key
//! value violates unique constraint "orders_pkey" (23505, constraint
//! orders_pkey): Key (id)=(7) already exists.`, and the others are
//! written. An error in the statement itself (SQLSTATE class 42: no such
//! table or column, a type mismatch, no privilege) dead-letters the whole
//! group at once. An error the host marks `retry` (the connection was
//! lost, a serialisation failure) retries every row of the batch after a
//! second: the host commits nothing of that call.
//!
//! Counter: `rows_written` (rows the statements wrote, counted when the
//! call is answered; the host commits them with it).

// `postgres::Error` is the WIT's record, returned as the SDK returns it:
// small on wasm32, over clippy's limit only in the native tests.
#![allow(clippy::result_large_err)]

mod names;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Deserialize;
use weir_plugin::postgres::{self, Error, Value};
use weir_plugin::{Deliveries, Delivery, Row, Rows, Sink};

use names::{Template, quote};
use weir_json::fields::{Field, Payload as Object};

/// How long the host waits before a batch the database could not take
/// comes back.
const RETRY_MS: u32 = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    table: String,
    columns: BTreeMap<String, String>,
    #[serde(default)]
    tenant_column: Option<String>,
    #[serde(default)]
    table_column: Option<String>,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    key: Option<Vec<String>>,
    #[serde(default)]
    on_conflict: Option<OnConflict>,
    #[serde(default)]
    missing: Missing,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Mode {
    #[default]
    Insert,
    Upsert,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum OnConflict {
    #[default]
    Error,
    Ignore,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Missing {
    #[default]
    DeadLetter,
    Null,
}

/// Where a column's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Field { spec: String, field: Field },
    Tenant,
    Table,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Column {
    name: String,
    source: Source,
}

/// The settings made into what each batch needs.
#[derive(Debug)]
struct Plan {
    template: Template,
    columns: Vec<Column>,
    /// The quoted column names, comma-separated.
    column_list: String,
    /// What follows the `SELECT`: empty, or an `ON CONFLICT` clause.
    conflict: String,
    /// Upsert: the indexes in `columns` of the key's columns. One statement
    /// cannot update a row twice, so a key seen twice starts a new one.
    key: Vec<usize>,
    missing: Missing,
}

impl Plan {
    fn new(settings: Settings) -> Result<Plan, String> {
        let template = Template::parse(&settings.table)
            .map_err(|e| format!("postgres-sink: `table` {:?}: {e}", settings.table))?;
        if settings.columns.is_empty() {
            return Err("postgres-sink: `columns` maps no column".to_string());
        }
        let mut columns = Vec::new();
        for (name, spec) in settings.columns {
            let field =
                Field::parse(&spec).map_err(|e| format!("postgres-sink: `columns.{name}`: {e}"))?;
            columns.push(Column {
                name,
                source: Source::Field { spec, field },
            });
        }
        for (setting, name, source) in [
            ("tenant_column", settings.tenant_column, Source::Tenant),
            ("table_column", settings.table_column, Source::Table),
        ] {
            let Some(name) = name else { continue };
            if columns.iter().any(|c| c.name == name) {
                return Err(format!(
                    "postgres-sink: `{setting}` {name:?} is a column of `columns` too"
                ));
            }
            quote(&name).map_err(|e| format!("postgres-sink: `{setting}`: {e}"))?;
            columns.push(Column { name, source });
        }
        let mut quoted = Vec::with_capacity(columns.len());
        for column in &columns {
            quoted.push(quote(&column.name).map_err(|e| format!("postgres-sink: `columns`: {e}"))?);
        }
        let (conflict, key) = conflict(
            settings.mode,
            settings.key,
            settings.on_conflict,
            &columns,
            &quoted,
        )?;
        Ok(Plan {
            template,
            column_list: quoted.join(", "),
            columns,
            conflict,
            key,
            missing: settings.missing,
        })
    }

    /// The statement writing rows into `table` (quoted), its one parameter
    /// the rows as a JSON array of objects keyed by column name.
    fn statement(&self, table: &str) -> String {
        let columns = &self.column_list;
        format!(
            "INSERT INTO {table} ({columns}) SELECT {columns} \
             FROM json_populate_recordset(NULL::{table}, $1::json){}",
            self.conflict
        )
    }

    /// A row's target table (quoted) and its JSON object keyed by column,
    /// or why it cannot be written.
    fn prepare(&self, row: &Row<'_>) -> Result<Prepared, String> {
        let table = self.template.render(row.tenant, row.table).map_err(|e| {
            format!(
                "postgres sink: no table for tenant {:?} and table {:?}: {e}",
                row.tenant, row.table
            )
        })?;
        let payload = Object::parse(row.payload).map_err(|e| format!("postgres sink: {e}"))?;
        let mut object = String::from("{");
        let mut values = Vec::with_capacity(self.columns.len());
        for (index, column) in self.columns.iter().enumerate() {
            let value = match &column.source {
                Source::Tenant => json_string(row.tenant),
                Source::Table => json_string(row.table),
                Source::Field { spec, field } => match (field.get(&payload), self.missing) {
                    (Some(raw), _) => raw.get().to_string(),
                    (None, Missing::Null) => "null".to_string(),
                    (None, Missing::DeadLetter) => {
                        return Err(format!(
                            "postgres sink: field `{spec}` (column `{}`) is missing",
                            column.name
                        ));
                    }
                },
            };
            if index > 0 {
                object.push(',');
            }
            object.push_str(&json_string(&column.name));
            object.push(':');
            object.push_str(&value);
            values.push(value);
        }
        object.push('}');
        let key = (!self.key.is_empty()).then(|| {
            // Raw JSON has no NUL byte, so the join is unambiguous.
            self.key
                .iter()
                .map(|&i| values[i].as_str())
                .collect::<Vec<_>>()
                .join("\0")
        });
        Ok(Prepared { table, object, key })
    }
}

/// The `ON CONFLICT` clause of the settings, and the key's column indexes.
fn conflict(
    mode: Mode,
    key: Option<Vec<String>>,
    on_conflict: Option<OnConflict>,
    columns: &[Column],
    quoted: &[String],
) -> Result<(String, Vec<usize>), String> {
    match mode {
        Mode::Insert => {
            if key.is_some() {
                return Err(
                    "postgres-sink: `key` applies to mode = \"upsert\" (an insert may set on_conflict = \"ignore\")"
                        .to_string(),
                );
            }
            Ok(match on_conflict.unwrap_or_default() {
                OnConflict::Error => (String::new(), Vec::new()),
                OnConflict::Ignore => (" ON CONFLICT DO NOTHING".to_string(), Vec::new()),
            })
        }
        Mode::Upsert => {
            if on_conflict.is_some() {
                return Err(
                    "postgres-sink: `on_conflict` applies to mode = \"insert\": an upsert updates the row"
                        .to_string(),
                );
            }
            let key = key.unwrap_or_default();
            if key.is_empty() {
                return Err(
                    "postgres-sink: mode = \"upsert\" needs `key`, the columns of the conflict target"
                        .to_string(),
                );
            }
            let mut indexes = Vec::new();
            for name in &key {
                let Some(index) = columns.iter().position(|c| &c.name == name) else {
                    return Err(format!(
                        "postgres-sink: `key` column {name:?} is not mapped (in `columns`, `tenant_column` or `table_column`)"
                    ));
                };
                if indexes.contains(&index) {
                    return Err(format!("postgres-sink: `key` names {name:?} twice"));
                }
                indexes.push(index);
            }
            let target = indexes
                .iter()
                .map(|&i| quoted[i].as_str())
                .collect::<Vec<_>>()
                .join(", ");
            let updates = (0..columns.len())
                .filter(|i| !indexes.contains(i))
                .map(|i| format!("{0} = EXCLUDED.{0}", quoted[i]))
                .collect::<Vec<_>>();
            let action = if updates.is_empty() {
                "DO NOTHING".to_string()
            } else {
                format!("DO UPDATE SET {}", updates.join(", "))
            };
            Ok((format!(" ON CONFLICT ({target}) {action}"), indexes))
        }
    }
}

fn json_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "null".to_string())
}

/// A row ready to write.
#[derive(Debug)]
struct Prepared {
    table: String,
    object: String,
    /// Upsert: the key's values, as JSON text.
    key: Option<String>,
}

/// The rows of one statement: their indexes in the batch and their objects.
#[derive(Debug, Default)]
struct Run {
    rows: Vec<usize>,
    objects: Vec<String>,
    keys: HashSet<String>,
}

/// The rows bound for one table, in batch order, in as few runs as can be.
#[derive(Debug)]
struct Group {
    table: String,
    runs: Vec<Run>,
}

impl Group {
    fn push(&mut self, row: usize, prepared: Prepared) {
        let new_run = match (&prepared.key, self.runs.last()) {
            (_, None) => true,
            (Some(key), Some(run)) => run.keys.contains(key),
            (None, Some(_)) => false,
        };
        if new_run {
            self.runs.push(Run::default());
        }
        if let Some(run) = self.runs.last_mut() {
            run.rows.push(row);
            run.objects.push(prepared.object);
            if let Some(key) = prepared.key {
                run.keys.insert(key);
            }
        }
    }
}

/// The database the statements go to: the host's, or a test's stand-in.
trait Database {
    fn execute(&mut self, statement: &str, params: &[Value]) -> Result<u64, Error>;
}

/// The host's connection, in its transaction for the call.
struct HostDatabase;

impl Database for HostDatabase {
    fn execute(&mut self, statement: &str, params: &[Value]) -> Result<u64, Error> {
        postgres::execute(statement, params)
    }
}

/// Every row of the batch must come back: the call cannot commit.
struct Abort;

struct PostgresSink {
    plan: Plan,
}

impl Sink for PostgresSink {
    fn init(settings: String) -> Result<Self, String> {
        let settings: Settings = weir_plugin::settings(&settings)?;
        Ok(PostgresSink {
            plan: Plan::new(settings)?,
        })
    }

    fn deliver(&mut self, rows: &Rows, out: &mut Deliveries) {
        out.extend(write(&self.plan, rows, &mut HostDatabase));
    }
}

weir_plugin::export_sink!(PostgresSink);

/// Writes a batch; what became of each row, in order.
fn write(plan: &Plan, rows: &Rows, db: &mut impl Database) -> Vec<Delivery> {
    let mut outcomes = vec![Delivery::Ok; rows.len()];
    let mut groups: Vec<Group> = Vec::new();
    let mut by_table: HashMap<String, usize> = HashMap::new();
    for (index, row) in rows.iter().enumerate() {
        let prepared = match plan.prepare(&row) {
            Ok(prepared) => prepared,
            Err(reason) => {
                outcomes[index] = Delivery::DeadLetter(reason);
                continue;
            }
        };
        let group = *by_table.entry(prepared.table.clone()).or_insert_with(|| {
            groups.push(Group {
                table: prepared.table.clone(),
                runs: Vec::new(),
            });
            groups.len() - 1
        });
        groups[group].push(index, prepared);
    }
    let mut written = 0;
    for group in &groups {
        let statement = plan.statement(&group.table);
        for run in &group.runs {
            match write_run(db, &statement, run, &mut outcomes) {
                Ok(count) => written += count,
                Err(Abort) => return vec![Delivery::Retry(RETRY_MS); rows.len()],
            }
        }
    }
    if written > 0 {
        weir_plugin::counter("rows_written", written);
    }
    outcomes
}

/// Writes one run in one statement, or, if its data is refused, one
/// statement per row; the rows written.
fn write_run(
    db: &mut impl Database,
    statement: &str,
    run: &Run,
    outcomes: &mut [Delivery],
) -> Result<u64, Abort> {
    let error = match db.execute(statement, &[Value::Text(json_array(&run.objects))]) {
        Ok(_) => return Ok(run.rows.len() as u64),
        Err(error) => error,
    };
    if error.retry {
        weir_plugin::log::warn(&format!(
            "postgres-sink: {}; the batch comes back in {RETRY_MS} ms",
            error.describe()
        ));
        return Err(Abort);
    }
    // Class 42 is the statement's own fault: every row would fail alike.
    if error.code.starts_with("42") {
        let reason = reason(&error);
        weir_plugin::log::warn(&format!("postgres-sink: {statement}: {reason}"));
        for &row in &run.rows {
            outcomes[row] = Delivery::DeadLetter(reason.clone());
        }
        return Ok(0);
    }
    weir_plugin::log::info(&format!(
        "postgres-sink: {} rows refused together ({}); writing them one by one",
        run.rows.len(),
        error.describe()
    ));
    let mut written = 0;
    for (&row, object) in run.rows.iter().zip(&run.objects) {
        match db.execute(statement, &[Value::Text(format!("[{object}]"))]) {
            Ok(_) => written += 1,
            Err(error) if error.retry => return Err(Abort),
            Err(error) => outcomes[row] = Delivery::DeadLetter(reason(&error)),
        }
    }
    Ok(written)
}

/// A dead letter's reason for a statement's error.
fn reason(error: &Error) -> String {
    format!("postgres: {}", error.describe())
}

fn json_array(objects: &[String]) -> String {
    let mut array = String::with_capacity(objects.iter().map(|o| o.len() + 1).sum::<usize>() + 2);
    array.push('[');
    for (index, object) in objects.iter().enumerate() {
        if index > 0 {
            array.push(',');
        }
        array.push_str(object);
    }
    array.push(']');
    array
}

#[cfg(test)]
mod tests;
