//! The key table ([`super::keys`]) against the raw forms serde reads and
//! against docs/configuration.md: every key the code accepts is documented
//! with its default and reload class, and every documented key exists.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::de::{self, DeserializeOwned, Visitor};

use super::keys::{Fallback, Key};
use super::{
    RawConfig, coordination, dead_letters, delivery, nats, pipelines, plugins, policies, stream,
    tenants, tls, traces,
};

/// A deserializer that only records the field names a derived
/// `Deserialize` asks for: the keys a raw form accepts.
struct Introspect<'a>(&'a mut &'static [&'static str]);

impl<'de> de::Deserializer<'de> for Introspect<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(de::Error::custom("fields taken"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

fn fields_of<T: DeserializeOwned>(prefix: &str) -> BTreeSet<String> {
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Introspect(&mut fields));
    assert!(
        !fields.is_empty(),
        "{} has no fields",
        std::any::type_name::<T>()
    );
    fields
        .iter()
        .map(|field| format!("{prefix}{field}"))
        .collect()
}

/// The sections' tables, as `RawConfig` names them.
const SECTIONS: [&str; 11] = [
    "nats",
    "stream",
    "delivery",
    "dead_letters",
    "coordination",
    "tenants",
    "plugins",
    "pipelines",
    "policies",
    "tls",
    "traces",
];

/// What each section's raw form accepts, by section as the key table names it.
fn accepted() -> BTreeMap<&'static str, BTreeSet<String>> {
    let mut top = fields_of::<RawConfig>("");
    for section in SECTIONS {
        assert!(top.remove(section), "RawConfig has no `{section}`");
    }
    let mut plugin = fields_of::<plugins::RawPlugin>("");
    assert!(plugin.remove("grants"));
    plugin.extend(fields_of::<plugins::RawGrants>("grants."));
    plugin.extend(fields_of::<plugins::RawStateGrant>("grants.state."));
    plugin.extend(fields_of::<plugins::RawPostgresGrant>("grants.postgres."));
    plugin.extend(fields_of::<plugins::RawNatsGrant>("grants.nats."));
    plugin.extend(fields_of::<super::objects::RawObjectsGrant>(
        "grants.objects.",
    ));
    BTreeMap::from([
        ("", top),
        ("nats", fields_of::<nats::RawNats>("")),
        ("stream", fields_of::<stream::RawStream>("")),
        ("delivery", fields_of::<delivery::RawDelivery>("")),
        (
            "dead_letters",
            fields_of::<dead_letters::RawDeadLetters>(""),
        ),
        (
            "coordination",
            fields_of::<coordination::RawCoordination>(""),
        ),
        ("tenants", fields_of::<tenants::RawTenant>("")),
        ("plugins.NAME", plugin),
        ("pipelines", fields_of::<pipelines::RawPipeline>("")),
        ("policies", fields_of::<policies::RawPolicies>("")),
        ("tls", fields_of::<tls::RawTls>("")),
        ("traces", fields_of::<traces::RawTraces>("")),
    ])
}

#[test]
fn the_key_table_names_every_key_the_raw_forms_accept() {
    let mut tabled: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for key in super::all_keys() {
        let names = tabled.entry(key.section).or_default();
        for name in [Some(key.name), key.legacy].into_iter().flatten() {
            assert!(
                names.insert(name.to_string()),
                "{} is in the table twice",
                key.display()
            );
        }
    }
    assert_eq!(tabled, accepted());
}

/// One row of a key table in the docs.
#[derive(Debug)]
struct Row {
    legacy: Option<String>,
    default: String,
    reload: String,
    line: String,
}

/// The docs' key tables, by section (`""`: top level).
fn documented(doc: &str) -> BTreeMap<(String, String), Row> {
    let mut rows = BTreeMap::new();
    let mut section: Option<String> = None;
    let mut in_table = false;
    for line in doc.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            section = match title {
                "Top level" => Some(String::new()),
                title if title.starts_with("`[") => {
                    Some(title.trim_matches(['`', '[', ']']).to_string())
                }
                _ => None,
            };
            continue;
        }
        if section.is_some() && line.starts_with("| Key | Type | Default |") {
            in_table = true;
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
        }
        let (Some(section), true) = (&section, in_table) else {
            continue;
        };
        if line.starts_with("| ---") {
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 9, "a key row has 7 cells: {line}");
        let mut names = cells[1]
            .split(" / ")
            .map(|name| name.trim_matches('`').to_string());
        let name = names.next().unwrap_or_default();
        let row = Row {
            legacy: names.next(),
            default: cells[3].to_string(),
            reload: cells[7].to_string(),
            line: line.to_string(),
        };
        let twice = rows.insert((section.clone(), name), row);
        assert!(twice.is_none(), "[{section}] documented twice: {line}");
    }
    rows
}

/// A Default cell as a [`Fallback`]: its first value (`"16 MiB (16777216)"`,
/// `"1000, or `batch_rows` if larger"`); prose is [`Fallback::Derived`].
fn documented_default(cell: &str) -> Fallback {
    let head = cell.split(", or ").next().unwrap_or(cell);
    let head = head.split(" (").next().unwrap_or(head).trim();
    let leak = |text: &str| -> &'static str { Box::leak(text.to_string().into_boxed_str()) };
    match head {
        "required" => return Fallback::Required,
        "none" => return Fallback::Off,
        "`[]`" | "`{}`" => return Fallback::Empty,
        "`false`" => return Fallback::Bool(false),
        "`true`" => return Fallback::Bool(true),
        _ => {}
    }
    if let Some(code) = head.strip_prefix('`').and_then(|h| h.strip_suffix('`')) {
        if let Some(text) = code.strip_prefix('"').and_then(|c| c.strip_suffix('"')) {
            return Fallback::Text(leak(text));
        }
        if code.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            return Fallback::SameAs(leak(code));
        }
        return Fallback::Derived;
    }
    if let Ok(count) = head.parse() {
        return Fallback::Count(count);
    }
    let Some((number, unit)) = head.split_once(' ') else {
        return Fallback::Derived;
    };
    let Ok(n) = number.parse::<u64>() else {
        return Fallback::Derived;
    };
    match unit {
        "ms" => Fallback::Time(Duration::from_millis(n)),
        "s" => Fallback::Time(Duration::from_secs(n)),
        "days" => Fallback::Time(Duration::from_secs(n * 24 * 3600)),
        "KiB" => Fallback::Bytes(n << 10),
        "MiB" => Fallback::Bytes(n << 20),
        "GiB" => Fallback::Bytes(n << 30),
        _ => Fallback::Derived,
    }
}

/// A Reload cell's class: `reload¹`, `reload (the pull size: unit start)`.
fn documented_reload(cell: &str) -> &'static str {
    ["unit start", "restart", "reload"]
        .into_iter()
        .find(|class| cell.starts_with(class))
        .unwrap_or("(none)")
}

/// What the docs say of `key` that the code does not.
fn disagreements(key: &Key, row: &Row) -> Vec<String> {
    let mut found = Vec::new();
    let name = key.display();
    if row.legacy.as_deref() != key.legacy {
        found.push(format!(
            "{name}: the docs' older key is {:?}, the code's {:?}",
            row.legacy, key.legacy
        ));
    }
    let default = documented_default(&row.default);
    if default != key.default {
        found.push(format!(
            "{name}: the docs' default `{}` reads as {default:?}, the code's is {:?}",
            row.default, key.default
        ));
    }
    if documented_reload(&row.reload) != key.reload.as_str() {
        found.push(format!(
            "{name}: the docs say `{}` on reload, the code `{}`",
            row.reload,
            key.reload.as_str()
        ));
    }
    found
}

/// The older keys as the docs pair them (`ack_wait` / `ack_wait_secs`):
/// the tables whose header names an integer key.
fn documented_pairs(doc: &str) -> BTreeSet<(String, String)> {
    let mut pairs = BTreeSet::new();
    let mut in_table = false;
    for line in doc.lines() {
        if line.starts_with('|') && line.contains("| Integer") {
            in_table = true;
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
        }
        if !in_table || line.starts_with("| ---") {
            continue;
        }
        let cells: Vec<&str> = line
            .split('|')
            .map(|c| c.trim().trim_matches('`'))
            .collect();
        let (name, legacy) = (cells[cells.len() - 3], cells[cells.len() - 2]);
        pairs.insert((name.to_string(), legacy.to_string()));
    }
    pairs
}

/// Every problem of `doc` against the key table, each a line.
fn check(doc: &str) -> Vec<String> {
    let mut rows = documented(doc);
    let mut problems = Vec::new();
    for key in super::all_keys() {
        match rows.remove(&(key.section.to_string(), key.name.to_string())) {
            Some(row) => problems.extend(disagreements(key, &row)),
            None => problems.push(format!(
                "{} (default {:?}) is not documented",
                key.display(),
                key.default
            )),
        }
    }
    for ((section, name), row) in rows {
        problems.push(format!(
            "[{section}] {name} is documented but the code has no such key: {}",
            row.line
        ));
    }
    let paired: BTreeSet<(String, String)> = super::all_keys()
        .filter_map(|key| Some((key.name.to_string(), key.legacy?.to_string())))
        .collect();
    let doc_pairs = documented_pairs(doc);
    for (name, legacy) in paired.symmetric_difference(&doc_pairs) {
        problems.push(format!(
            "`{name}` / `{legacy}`: in one of the code and the docs' pair tables only"
        ));
    }
    problems
}

const DOC: &str = include_str!("../../../docs/configuration.md");

#[test]
fn docs_configuration_md_matches_the_key_table() {
    let problems = check(DOC);
    assert!(
        problems.is_empty(),
        "docs/configuration.md disagrees with host/src/config:\n{}",
        problems.join("\n")
    );
    // A grant of directories is a list of tables: its fields are in its row.
    let rows = documented(DOC);
    let dirs = &rows[&("plugins.NAME".to_string(), "grants.dirs".to_string())];
    for field in fields_of::<plugins::RawDirGrant>("") {
        assert!(
            dirs.line.contains(&format!("{field} =")),
            "grants.dirs does not show `{field}`"
        );
    }
}

#[test]
fn the_check_notices_a_renamed_key_and_a_wrong_default() {
    let renamed = DOC.replace("| `batch_rows` |", "| `batch_rowz` |");
    let found = check(&renamed);
    assert!(
        found
            .iter()
            .any(|p| p.contains("[delivery] batch_rows (default Count(256)) is not documented")),
        "{found:#?}"
    );
    assert!(
        found
            .iter()
            .any(|p| p.contains("[delivery] batch_rowz is documented but")),
        "{found:#?}"
    );
    let wrong = DOC.replace(
        "| integer | 10 | deliveries |",
        "| integer | 12 | deliveries |",
    );
    let found = check(&wrong);
    assert!(
        found
            .iter()
            .any(|p| p.contains("[delivery] max_deliveries: the docs' default `12`")),
        "{found:#?}"
    );
}
