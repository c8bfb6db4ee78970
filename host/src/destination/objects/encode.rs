//! What an object holds, encoded as rows come: Parquet (columns and types
//! declared in the sink's settings, pages compressed with zstd or snappy,
//! row groups of a bounded number of rows) or NDJSON (each row's line as
//! it came, optionally gzip or zstd). A row that does not fit its column
//! is refused with the column named, and the object goes on without it.

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use parquet::basic::{Compression, ZstdLevel};
use parquet::column::writer::ColumnWriter;
use parquet::data_type::ByteArray;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;

pub use crate::config::{Column, ColumnType, Format, NdjsonCompression, ParquetCompression};

/// A row fitted to a format ([`Format::fit`]): what an object of that
/// format takes without refusing it.
#[derive(Debug)]
pub struct Record(Fit);

#[derive(Debug)]
enum Fit {
    Columns(Vec<Fitted>),
    Line(Vec<u8>),
}

impl Record {
    /// About how many bytes it adds to an object before compression.
    pub fn size(&self) -> usize {
        match &self.0 {
            Fit::Line(row) => row.len() + 1,
            Fit::Columns(values) => values.iter().map(Fitted::size).sum(),
        }
    }
}

impl Format {
    /// `row` (one JSON value, as the sink gave it) fitted to this format,
    /// or why it does not fit, naming the column.
    pub fn fit(&self, row: &[u8]) -> Result<Record, RowRefused> {
        match self {
            Format::Parquet { columns, .. } => fit_columns(columns, row),
            Format::Ndjson { .. } => fit_line(row),
        }
    }
}

/// Why a row is not in the object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowRefused {
    #[error("the row is not a JSON object: {0}")]
    NotAnObject(String),
    #[error("column `{column}` ({kind:?}): {reason}")]
    Column {
        column: String,
        kind: ColumnType,
        reason: String,
    },
}

/// Why an object could not be encoded (not a row's fault).
#[derive(Debug, thiserror::Error)]
#[error("encoding the object: {0}")]
pub struct EncodeError(String);

impl From<parquet::errors::ParquetError> for EncodeError {
    fn from(err: parquet::errors::ParquetError) -> Self {
        EncodeError(err.to_string())
    }
}

impl From<std::io::Error> for EncodeError {
    fn from(err: std::io::Error) -> Self {
        EncodeError(err.to_string())
    }
}

/// One object being filled.
pub struct ObjectWriter {
    body: Body,
    rows: usize,
}

enum Body {
    Parquet(ParquetBody),
    Plain(Vec<u8>),
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

struct ParquetBody {
    columns: Vec<Column>,
    row_group_rows: usize,
    file: SerializedFileWriter<Vec<u8>>,
    /// The rows of the row group being filled, column by column.
    pending: Vec<Values>,
    pending_rows: usize,
    pending_bytes: usize,
}

/// One column's values in a row group, and which rows have one.
#[derive(Default)]
struct Values {
    defined: Vec<i16>,
    bytes: Vec<ByteArray>,
    longs: Vec<i64>,
    doubles: Vec<f64>,
    bools: Vec<bool>,
}

/// A value fitted to its column.
#[derive(Debug)]
enum Fitted {
    Null,
    Bytes(Vec<u8>),
    Long(i64),
    Double(f64),
    Bool(bool),
}

impl Fitted {
    fn size(&self) -> usize {
        match self {
            Fitted::Null => 0,
            Fitted::Bytes(bytes) => bytes.len(),
            Fitted::Long(_) | Fitted::Double(_) => 8,
            Fitted::Bool(_) => 1,
        }
    }
}

impl ObjectWriter {
    /// An empty object of `format` (checked: [`Format::check`]).
    pub fn new(format: &Format) -> Result<ObjectWriter, EncodeError> {
        let body = match format {
            Format::Parquet {
                columns,
                compression,
                row_group_rows,
            } => {
                format.check().map_err(EncodeError)?;
                let schema = parquet::schema::parser::parse_message_type(&schema_of(columns))?;
                let compression = match compression {
                    ParquetCompression::Zstd => Compression::ZSTD(ZstdLevel::try_new(3)?),
                    ParquetCompression::Snappy => Compression::SNAPPY,
                    ParquetCompression::None => Compression::UNCOMPRESSED,
                };
                let properties = WriterProperties::builder()
                    .set_compression(compression)
                    .set_created_by(format!("weir {}", env!("CARGO_PKG_VERSION")))
                    .build();
                Body::Parquet(ParquetBody {
                    columns: columns.clone(),
                    row_group_rows: *row_group_rows,
                    file: SerializedFileWriter::new(
                        Vec::new(),
                        Arc::new(schema),
                        Arc::new(properties),
                    )?,
                    pending: columns.iter().map(|_| Values::default()).collect(),
                    pending_rows: 0,
                    pending_bytes: 0,
                })
            }
            Format::Ndjson { compression } => match compression {
                NdjsonCompression::None => Body::Plain(Vec::new()),
                NdjsonCompression::Gzip => Body::Gzip(flate2::write::GzEncoder::new(
                    Vec::new(),
                    flate2::Compression::default(),
                )),
                NdjsonCompression::Zstd => {
                    Body::Zstd(zstd::stream::write::Encoder::new(Vec::new(), 3)?)
                }
            },
        };
        Ok(ObjectWriter { body, rows: 0 })
    }

    /// Adds `row` (one JSON value, as the sink gave it). A refused row
    /// leaves the object as it was.
    pub fn append(&mut self, row: &[u8]) -> Result<(), AppendError> {
        let record = match &self.body {
            Body::Parquet(parquet) => fit_columns(&parquet.columns, row)?,
            _ => fit_line(row)?,
        };
        Ok(self.push(record)?)
    }

    /// Adds a row fitted before ([`Format::fit`]) to this object's format.
    pub fn push(&mut self, record: Record) -> Result<(), EncodeError> {
        match (&mut self.body, record.0) {
            (Body::Parquet(parquet), Fit::Columns(values)) => parquet.push(values)?,
            (Body::Plain(out), Fit::Line(row)) => line(out, &row)?,
            (Body::Gzip(out), Fit::Line(row)) => line(out, &row)?,
            (Body::Zstd(out), Fit::Line(row)) => line(out, &row)?,
            _ => {
                return Err(EncodeError(
                    "a row fitted to another format than the object's".into(),
                ));
            }
        }
        self.rows += 1;
        Ok(())
    }

    /// The rows in it.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// About how large it is so far: bytes encoded, and those of rows
    /// not encoded yet (a Parquet row group being filled).
    pub fn bytes(&self) -> usize {
        match &self.body {
            Body::Parquet(parquet) => parquet.file.bytes_written() + parquet.pending_bytes,
            Body::Plain(out) => out.len(),
            Body::Gzip(out) => out.get_ref().len(),
            Body::Zstd(out) => out.get_ref().len(),
        }
    }

    /// The whole object.
    pub fn finish(self) -> Result<Bytes, EncodeError> {
        let bytes = match self.body {
            Body::Parquet(mut parquet) => {
                parquet.flush()?;
                parquet.file.into_inner()?
            }
            Body::Plain(out) => out,
            Body::Gzip(out) => out.finish()?,
            Body::Zstd(out) => out.finish()?,
        };
        Ok(bytes.into())
    }
}

/// Why a row was not added: the row's fault, or the object's.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error(transparent)]
    Refused(#[from] RowRefused),
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

/// A row as one NDJSON line: its bytes without a newline of its own
/// (one is written after it), refused if it spans lines.
fn fit_line(row: &[u8]) -> Result<Record, RowRefused> {
    let row = row.strip_suffix(b"\n").unwrap_or(row);
    if row.contains(&b'\n') {
        return Err(RowRefused::NotAnObject("a row spans lines".into()));
    }
    Ok(Record(Fit::Line(row.to_vec())))
}

fn line(out: &mut impl Write, row: &[u8]) -> Result<(), EncodeError> {
    out.write_all(row)?;
    out.write_all(b"\n")?;
    Ok(())
}

/// `row`'s fields fitted to `columns`: every column at once, so a refused
/// row adds nothing.
fn fit_columns(columns: &[Column], row: &[u8]) -> Result<Record, RowRefused> {
    let value: serde_json::Value =
        serde_json::from_slice(row).map_err(|err| RowRefused::NotAnObject(err.to_string()))?;
    let serde_json::Value::Object(fields) = value else {
        return Err(RowRefused::NotAnObject(format!(
            "found {}",
            kind_of(&value)
        )));
    };
    let values = columns
        .iter()
        .map(|column| fit(column, fields.get(&column.name)))
        .collect::<Result<_, _>>()?;
    Ok(Record(Fit::Columns(values)))
}

/// The Parquet schema of `columns` (checked names: plain identifiers).
fn schema_of(columns: &[Column]) -> String {
    let fields: String = columns
        .iter()
        .map(|column| {
            let repetition = if column.required {
                "REQUIRED"
            } else {
                "OPTIONAL"
            };
            let kind = match column.kind {
                ColumnType::String => "BYTE_ARRAY",
                ColumnType::Int64 => "INT64",
                ColumnType::Float64 => "DOUBLE",
                ColumnType::Boolean => "BOOLEAN",
                ColumnType::Timestamp => "INT64",
                ColumnType::Json => "BYTE_ARRAY",
            };
            let annotation = match column.kind {
                ColumnType::String => " (STRING)",
                ColumnType::Timestamp => " (TIMESTAMP(MICROS,true))",
                ColumnType::Json => " (JSON)",
                _ => "",
            };
            format!("  {repetition} {kind} {}{annotation};\n", column.name)
        })
        .collect();
    format!("message row {{\n{fields}}}")
}

impl ParquetBody {
    fn push(&mut self, fitted: Vec<Fitted>) -> Result<(), EncodeError> {
        if fitted.len() != self.columns.len() {
            return Err(EncodeError("a row fitted to other columns".into()));
        }
        for (values, value) in self.pending.iter_mut().zip(fitted) {
            self.pending_bytes += value.size();
            values
                .defined
                .push(i16::from(!matches!(value, Fitted::Null)));
            match value {
                Fitted::Null => {}
                Fitted::Bytes(bytes) => values.bytes.push(bytes.into()),
                Fitted::Long(n) => values.longs.push(n),
                Fitted::Double(x) => values.doubles.push(x),
                Fitted::Bool(b) => values.bools.push(b),
            }
        }
        self.pending_rows += 1;
        if self.pending_rows >= self.row_group_rows {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the rows pending as one row group.
    fn flush(&mut self) -> Result<(), EncodeError> {
        if self.pending_rows == 0 {
            return Ok(());
        }
        let mut group = self.file.next_row_group()?;
        for (column, values) in self.columns.iter().zip(&mut self.pending) {
            let Some(mut writer) = group.next_column()? else {
                return Err(EncodeError(format!(
                    "no column `{}` in the schema",
                    column.name
                )));
            };
            let levels = (!column.required).then_some(values.defined.as_slice());
            let written = match writer.untyped() {
                ColumnWriter::ByteArrayColumnWriter(w) => {
                    w.write_batch(&values.bytes, levels, None)
                }
                ColumnWriter::Int64ColumnWriter(w) => w.write_batch(&values.longs, levels, None),
                ColumnWriter::DoubleColumnWriter(w) => w.write_batch(&values.doubles, levels, None),
                ColumnWriter::BoolColumnWriter(w) => w.write_batch(&values.bools, levels, None),
                _ => Err(parquet::errors::ParquetError::General(format!(
                    "column `{}`: not a type weir writes",
                    column.name
                ))),
            };
            written?;
            writer.close()?;
            *values = Values::default();
        }
        group.close()?;
        self.pending_rows = 0;
        self.pending_bytes = 0;
        Ok(())
    }
}

/// `value` (the row's field, if it has one) fitted to `column`.
fn fit(column: &Column, value: Option<&serde_json::Value>) -> Result<Fitted, RowRefused> {
    use serde_json::Value;
    let refuse = |reason: String| RowRefused::Column {
        column: column.name.clone(),
        kind: column.kind,
        reason,
    };
    let value = match value {
        None | Some(Value::Null) if column.required => {
            return Err(refuse("required, and the row has none".into()));
        }
        None | Some(Value::Null) => return Ok(Fitted::Null),
        Some(value) => value,
    };
    let expected = |what: &str| refuse(format!("expected {what}, found {}", kind_of(value)));
    match (column.kind, value) {
        (ColumnType::String, Value::String(s)) => Ok(Fitted::Bytes(s.clone().into_bytes())),
        (ColumnType::Int64, Value::Number(n)) => n
            .as_i64()
            .map(Fitted::Long)
            .ok_or_else(|| refuse(format!("expected an integer within ±2^63, found {n}"))),
        (ColumnType::Float64, Value::Number(n)) => n
            .as_f64()
            .map(Fitted::Double)
            .ok_or_else(|| refuse(format!("{n} is not a double"))),
        (ColumnType::Boolean, Value::Bool(b)) => Ok(Fitted::Bool(*b)),
        (ColumnType::Timestamp, Value::String(s)) => {
            let at = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
                .map_err(|err| refuse(format!("`{s}` is not an RFC 3339 time: {err}")))?;
            i64::try_from(at.unix_timestamp_nanos() / 1000)
                .map(Fitted::Long)
                .map_err(|_| refuse(format!("`{s}` is out of range")))
        }
        (ColumnType::Json, value) => Ok(Fitted::Bytes(value.to_string().into_bytes())),
        (ColumnType::String, _) => Err(expected("a string")),
        (ColumnType::Int64, _) => Err(expected("an integer")),
        (ColumnType::Float64, _) => Err(expected("a number")),
        (ColumnType::Boolean, _) => Err(expected("true or false")),
        (ColumnType::Timestamp, _) => Err(expected("an RFC 3339 string")),
    }
}

fn kind_of(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    fn orders(row_group_rows: usize) -> Format {
        let settings = format!(
            r#"{{"format": "parquet", "row_group_rows": {row_group_rows}, "columns": [
                {{"name": "id", "type": "int64", "required": true}},
                {{"name": "customer", "type": "string"}},
                {{"name": "amount", "type": "float64"}},
                {{"name": "paid", "type": "boolean"}},
                {{"name": "at", "type": "timestamp"}},
                {{"name": "extra", "type": "json"}}
            ]}}"#
        );
        serde_json::from_str(&settings).expect("a format")
    }

    #[test]
    fn parquet_rows_come_back_column_by_column_across_row_groups() {
        let mut object = ObjectWriter::new(&orders(2)).expect("a writer");
        let rows = [
            r#"{"id": 1, "customer": "ada", "amount": 9.5, "paid": true, "at": "2026-12-07T10:00:00Z", "extra": {"a": [1]}}"#,
            r#"{"id": 2, "amount": 3}"#,
            r#"{"id": 3, "customer": "bob", "paid": false, "other": "ignored"}"#,
        ];
        for row in rows {
            object.append(row.as_bytes()).expect("append");
        }
        assert_eq!(object.rows(), 3);
        let bytes = object.finish().expect("finish");
        let reader = SerializedFileReader::new(bytes).expect("a Parquet file");
        assert_eq!(reader.metadata().num_row_groups(), 2);
        let read: Vec<String> = reader
            .get_row_iter(None)
            .expect("rows")
            .map(|row| row.expect("a row").to_string())
            .collect();
        assert_eq!(
            read,
            vec![
                r#"{id: 1, customer: "ada", amount: 9.5, paid: true, at: 2026-12-07 10:00:00.000000 +00:00, extra: "{"a":[1]}"}"#,
                r#"{id: 2, customer: null, amount: 3.0, paid: null, at: null, extra: null}"#,
                r#"{id: 3, customer: "bob", amount: null, paid: false, at: null, extra: null}"#,
            ]
        );
    }

    #[test]
    fn a_row_that_does_not_fit_is_refused_naming_its_column_and_adds_nothing() {
        let mut object = ObjectWriter::new(&orders(10)).expect("a writer");
        let refused = |object: &mut ObjectWriter, row: &str| match object.append(row.as_bytes()) {
            Err(AppendError::Refused(refused)) => refused.to_string(),
            other => panic!("{row}: {other:?}"),
        };
        assert_eq!(
            refused(&mut object, r#"{"id": "7"}"#),
            "column `id` (Int64): expected an integer, found a string"
        );
        assert_eq!(
            refused(&mut object, r#"{"customer": "x"}"#),
            "column `id` (Int64): required, and the row has none"
        );
        assert_eq!(
            refused(&mut object, r#"{"id": 1.5}"#),
            "column `id` (Int64): expected an integer within ±2^63, found 1.5"
        );
        assert!(
            refused(&mut object, r#"{"id": 1, "at": "yesterday"}"#)
                .starts_with("column `at` (Timestamp): `yesterday` is not an RFC 3339 time")
        );
        assert_eq!(
            refused(&mut object, "[1]"),
            "the row is not a JSON object: found an array"
        );
        object
            .append(br#"{"id": 5, "paid": true}"#)
            .expect("append");
        assert_eq!(object.rows(), 1);
        let reader = SerializedFileReader::new(object.finish().expect("finish")).expect("Parquet");
        assert_eq!(reader.metadata().file_metadata().num_rows(), 1);
    }

    #[test]
    fn ndjson_keeps_each_row_as_its_line_plain_gzip_or_zstd() {
        for compression in ["none", "gzip", "zstd"] {
            let format: Format = serde_json::from_str(&format!(
                r#"{{"format": "ndjson", "compression": "{compression}"}}"#
            ))
            .expect("a format");
            let mut object = ObjectWriter::new(&format).expect("a writer");
            object.append(b"{\"id\":1}").expect("append");
            object.append(b"{\"id\":2}\n").expect("append");
            assert!(object.append(b"{\"id\":3}\n{\"id\":4}").is_err());
            let bytes = object.finish().expect("finish").to_vec();
            let text = match compression {
                "gzip" => {
                    let mut out = String::new();
                    std::io::Read::read_to_string(
                        &mut flate2::read::GzDecoder::new(&bytes[..]),
                        &mut out,
                    )
                    .expect("gunzip");
                    out
                }
                "zstd" => {
                    String::from_utf8(zstd::decode_all(&bytes[..]).expect("unzstd")).expect("UTF-8")
                }
                _ => String::from_utf8(bytes).expect("UTF-8"),
            };
            assert_eq!(text, "{\"id\":1}\n{\"id\":2}\n", "{compression}");
        }
    }

    #[test]
    fn a_format_that_cannot_write_says_which_setting() {
        let bad = |settings: &str| {
            serde_json::from_str::<Format>(settings)
                .map_err(|e| e.to_string())
                .and_then(|format| format.check())
                .expect_err(settings)
        };
        assert!(bad(r#"{"format": "parquet", "columns": []}"#).starts_with("columns:"));
        assert!(
            bad(r#"{"format": "parquet", "columns": [{"name": "a b", "type": "string"}]}"#)
                .starts_with("columns[0].name `a b`")
        );
        assert!(bad(r#"{"format": "parquet", "columns": [{"name": "a", "type": "int64"}, {"name": "a", "type": "string"}]}"#)
            .contains("named twice"));
        assert!(
            bad(r#"{"format": "parquet", "columns": [{"name": "a", "type": "int32"}]}"#)
                .contains("unknown variant `int32`")
        );
        assert!(bad(r#"{"format": "csv"}"#).contains("unknown variant `csv`"));
    }
}
