//! `grants.objects`: the object store a sink's rows go to (bucket,
//! endpoint, keys), how its objects are written (Parquet columns or
//! NDJSON) and when each is committed (`max_rows`, `max_bytes`,
//! `max_age`). The host fills and commits the objects
//! (`destination::objects`); the sink names each row's path.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::World;
use super::checker::{Checker, Legacy};
use super::units::{HumanDuration, Size};
use crate::capability::{
    Capability, DEFAULT_OBJECT_MAX_AGE, DEFAULT_OBJECT_MAX_BYTES, DEFAULT_OBJECT_MAX_ROWS,
    MAX_OBJECT_ROWS,
};

/// How a sink's objects are written (from its settings).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "format", rename_all = "lowercase", deny_unknown_fields)]
pub enum Format {
    Parquet {
        columns: Vec<Column>,
        #[serde(default)]
        compression: ParquetCompression,
        /// Rows per row group (at most; the last one holds the rest).
        #[serde(default = "default_row_group_rows")]
        row_group_rows: usize,
    },
    Ndjson {
        #[serde(default)]
        compression: NdjsonCompression,
    },
}

fn default_row_group_rows() -> usize {
    100_000
}

/// One column of a Parquet object: the row's JSON field of the same name.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Column {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ColumnType,
    /// A row without the field (or with `null`) is refused.
    #[serde(default)]
    pub required: bool,
}

/// A column's type, and the JSON values it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ColumnType {
    /// A JSON string (Parquet `BYTE_ARRAY (STRING)`).
    String,
    /// A JSON integer within ±2⁶³ (`INT64`).
    Int64,
    /// Any JSON number (`DOUBLE`).
    Float64,
    /// `true` or `false` (`BOOLEAN`).
    Boolean,
    /// An RFC 3339 string, kept as microseconds since the epoch, UTC
    /// (`INT64 (TIMESTAMP(MICROS,true))`).
    Timestamp,
    /// Any JSON value, kept as its JSON text (`BYTE_ARRAY (JSON)`).
    Json,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParquetCompression {
    #[default]
    Zstd,
    Snappy,
    None,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NdjsonCompression {
    #[default]
    None,
    Gzip,
    Zstd,
}

impl Format {
    /// The file name extension of its objects.
    pub fn extension(&self) -> &'static str {
        match self {
            Format::Parquet { .. } => "parquet",
            Format::Ndjson { compression } => match compression {
                NdjsonCompression::None => "ndjson",
                NdjsonCompression::Gzip => "ndjson.gz",
                NdjsonCompression::Zstd => "ndjson.zst",
            },
        }
    }

    /// Whether it can write anything: the reason it cannot, naming the
    /// setting.
    pub fn check(&self) -> Result<(), String> {
        let Format::Parquet {
            columns,
            row_group_rows,
            ..
        } = self
        else {
            return Ok(());
        };
        if columns.is_empty() {
            return Err("columns: a Parquet object needs at least one column".into());
        }
        if *row_group_rows == 0 {
            return Err("row_group_rows must be at least 1".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, column) in columns.iter().enumerate() {
            let name = &column.name;
            let plain = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !plain {
                return Err(format!(
                    "columns[{i}].name `{name}`: a column is named with letters, digits and `_`, not starting with a digit"
                ));
            }
            if !seen.insert(name) {
                return Err(format!("columns[{i}].name `{name}` is named twice"));
            }
        }
        Ok(())
    }
}

/// When an object being filled is committed: whichever bound comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rolling {
    pub max_rows: usize,
    pub max_bytes: usize,
    pub max_age: Duration,
}

/// Where a sink's objects go in the bucket, what they hold and when each
/// is committed.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectsTarget {
    /// The keys' prefix in the bucket (may be empty).
    pub prefix: String,
    pub format: Format,
    pub rolling: Rolling,
}

/// `grants.objects`: the store, and what goes there.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectsGrant {
    pub bucket: String,
    /// `None`: AWS S3 itself (the region's endpoint).
    pub endpoint: Option<String>,
    pub region: String,
    /// A TOML file with `access_key_id` and `secret_access_key`, read at
    /// each load; `None`: the `AWS_*` environment variables.
    pub credentials_file: Option<PathBuf>,
    pub target: ObjectsTarget,
}

/// The longest `max_age`: rows wait unacked, answered "in progress", that long.
const MAX_OBJECT_AGE: Duration = Duration::from_secs(3600);

/// The region when the grant names none.
pub const DEFAULT_OBJECTS_REGION: &str = "us-east-1";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawObjectsGrant {
    bucket: Spanned<String>,
    endpoint: Option<Spanned<String>>,
    region: Option<String>,
    prefix: Option<Spanned<String>>,
    credentials_file: Option<Spanned<String>>,
    format: Spanned<String>,
    compression: Option<Spanned<String>>,
    #[serde(default)]
    columns: Vec<Column>,
    row_group_rows: Option<Spanned<u64>>,
    max_rows: Option<Spanned<u64>>,
    max_bytes: Option<Spanned<Size>>,
    max_age: Option<Spanned<HumanDuration>>,
}

impl Checker<'_> {
    /// The store's names must be plain, the format one weir writes with
    /// columns it can encode, and the bounds within what a unit can hold
    /// unacked.
    pub(super) fn objects_grant(
        &self,
        plugin: &str,
        world: World,
        raw: RawObjectsGrant,
    ) -> ObjectsGrant {
        self.grant_for_its_worlds(Capability::Objects, plugin, world, raw.bucket.span().start);
        let say = |at: usize, what: String| {
            self.report(at, format!("plugin `{plugin}`: grants.objects.{what}"))
        };
        let bucket = raw.bucket.get_ref();
        if bucket.is_empty() || bucket.contains(['/', ' ']) {
            say(
                raw.bucket.span().start,
                format!("bucket `{bucket}` is not a bucket name"),
            );
        }
        if let Some(endpoint) = &raw.endpoint
            && !(endpoint.get_ref().starts_with("http://")
                || endpoint.get_ref().starts_with("https://"))
        {
            say(
                endpoint.span().start,
                format!(
                    "endpoint `{}` is not an http:// or https:// URL",
                    endpoint.get_ref()
                ),
            );
        }
        let prefix = raw.prefix.as_ref().map_or(String::new(), |prefix| {
            let trimmed = prefix.get_ref().trim_matches('/').to_string();
            if trimmed
                .split('/')
                .any(|segment| segment.is_empty() || segment == "..")
                && !trimmed.is_empty()
            {
                say(
                    prefix.span().start,
                    format!("prefix `{}` has an empty or `..` segment", prefix.get_ref()),
                );
            }
            trimmed
        });
        let credentials_file = raw.credentials_file.as_ref().map(|path| {
            let resolved = self.resolve(path.get_ref());
            if !resolved.is_file() {
                say(
                    path.span().start,
                    format!("credentials_file {} is not a file", resolved.display()),
                );
            }
            resolved
        });
        let format = self.objects_format(&raw, &say);
        let max_rows = match &raw.max_rows {
            Some(rows) if !(1..=MAX_OBJECT_ROWS).contains(rows.get_ref()) => {
                say(
                    rows.span().start,
                    format!(
                        "max_rows must be between 1 and {MAX_OBJECT_ROWS}: an object's rows wait unacked until it commits, and a unit holds at most 20000 unacked"
                    ),
                );
                DEFAULT_OBJECT_MAX_ROWS
            }
            Some(rows) => *rows.get_ref(),
            None => DEFAULT_OBJECT_MAX_ROWS,
        };
        let max_bytes = self.size(
            "grants.objects.max_bytes",
            &raw.max_bytes,
            1 << 10,
            4 << 30,
            DEFAULT_OBJECT_MAX_BYTES,
        );
        let mut max_age = self.duration(
            "grants.objects.max_age",
            &raw.max_age,
            (Legacy::Secs, &None),
            Duration::from_millis(100),
            DEFAULT_OBJECT_MAX_AGE,
        );
        if let Some(set) = &raw.max_age
            && max_age > MAX_OBJECT_AGE
        {
            say(
                set.span().start,
                "max_age must be at most 1h: a row waits unacked for its object that long".into(),
            );
            max_age = DEFAULT_OBJECT_MAX_AGE;
        }
        ObjectsGrant {
            bucket: raw.bucket.into_inner(),
            endpoint: raw.endpoint.map(Spanned::into_inner),
            region: raw
                .region
                .unwrap_or_else(|| DEFAULT_OBJECTS_REGION.to_string()),
            credentials_file,
            target: ObjectsTarget {
                prefix,
                format,
                rolling: Rolling {
                    max_rows: usize::try_from(max_rows).unwrap_or(usize::MAX),
                    max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
                    max_age,
                },
            },
        }
    }

    fn objects_format(&self, raw: &RawObjectsGrant, say: &impl Fn(usize, String)) -> Format {
        let compression = raw.compression.as_ref();
        let compression_at = compression.map_or(raw.format.span().start, |c| c.span().start);
        let compression_name = compression.map(|c| c.get_ref().as_str());
        let format = match raw.format.get_ref().as_str() {
            "parquet" => Format::Parquet {
                columns: raw.columns.clone(),
                compression: match compression_name {
                    None | Some("zstd") => ParquetCompression::Zstd,
                    Some("snappy") => ParquetCompression::Snappy,
                    Some("none") => ParquetCompression::None,
                    Some(other) => {
                        say(
                            compression_at,
                            format!(
                                "compression `{other}` is not one Parquet is written with here: zstd, snappy or none"
                            ),
                        );
                        ParquetCompression::Zstd
                    }
                },
                row_group_rows: raw
                    .row_group_rows
                    .as_ref()
                    .map_or(default_row_group_rows(), |rows| {
                        usize::try_from(*rows.get_ref()).unwrap_or(usize::MAX)
                    }),
            },
            "ndjson" => {
                if !raw.columns.is_empty() {
                    say(raw.format.span().start, "columns are for format = \"parquet\": an NDJSON object keeps each row as it came".into());
                }
                Format::Ndjson {
                    compression: match compression_name {
                        None | Some("none") => NdjsonCompression::None,
                        Some("gzip") => NdjsonCompression::Gzip,
                        Some("zstd") => NdjsonCompression::Zstd,
                        Some(other) => {
                            say(
                                compression_at,
                                format!(
                                    "compression `{other}` is not one NDJSON is written with here: none, gzip or zstd"
                                ),
                            );
                            NdjsonCompression::None
                        }
                    },
                }
            }
            other => {
                say(
                    raw.format.span().start,
                    format!("format `{other}` is not one weir writes: parquet or ndjson"),
                );
                return Format::Ndjson {
                    compression: NdjsonCompression::None,
                };
            }
        };
        if let Err(problem) = format.check() {
            say(raw.format.span().start, problem);
        }
        format
    }
}
