//! The rows of a batch as a plugin reads them: borrowed views into the one
//! buffer the host packed them in, so reading a row allocates nothing.

use weir_layout::{header, numbers, row};

use crate::bindings::transform::Batch;
use crate::packed::{Packer, bytes, text};

/// A batch of rows handed to a transform or a sink.
pub struct Rows {
    batch: Batch,
}

impl Rows {
    #[doc(hidden)]
    pub fn from_batch(batch: Batch) -> Rows {
        Rows { batch }
    }

    /// Packs rows the way the host does: for a plugin's own tests.
    pub fn pack<'a>(rows: impl IntoIterator<Item = &'a RowData>) -> Rows {
        let mut packer = Packer::default();
        let (mut packed_rows, mut sequences, mut attempts) = (Vec::new(), Vec::new(), Vec::new());
        for row in rows {
            let record = row::Record {
                tenant: packer.append(row.tenant.as_bytes()),
                table: packer.append(row.table.as_bytes()),
                payload: packer.append(&row.payload),
                headers: packer.headers(row.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()))),
            };
            packed_rows.extend_from_slice(&record.encode());
            sequences.extend_from_slice(&row.sequence.to_le_bytes());
            attempts.extend_from_slice(&row.attempt.to_le_bytes());
        }
        Rows {
            batch: Batch {
                data: packer.data,
                rows: packed_rows,
                sequences,
                attempts,
                headers: packer.header_numbers,
            },
        }
    }

    pub fn len(&self) -> usize {
        self.batch.sequences.len() / weir_layout::U64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Row `index`, if the batch has it.
    pub fn get(&self, index: usize) -> Option<Row<'_>> {
        let record = row::Record::read(&self.batch.rows, index)?;
        let data = &self.batch.data;
        Some(Row {
            tenant: text(data, record.tenant),
            table: text(data, record.table),
            payload: bytes(data, record.payload),
            sequence: numbers::u64_at(&self.batch.sequences, index).unwrap_or(0),
            attempt: numbers::u32_at(&self.batch.attempts, index).unwrap_or(0),
            headers: header::run(&self.batch.headers, record.headers),
            data,
        })
    }

    /// The rows in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Row<'_>> {
        (0..self.len()).map(|index| self.get(index).unwrap_or_default())
    }
}

/// One row: its tenant, table, payload and headers borrow the batch.
#[derive(Debug, Clone, Copy, Default)]
pub struct Row<'a> {
    /// The tenant that sent the row (decided by its credential).
    pub tenant: &'a str,
    /// The table it was sent to.
    pub table: &'a str,
    /// Its bytes as the producer sent them (one NDJSON line for HTTP ingest).
    pub payload: &'a [u8],
    /// Its sequence in its partition stream: stable across redeliveries, so
    /// with `tenant` and `table` a key by which a sink can drop a replay.
    pub sequence: u64,
    /// How many times it has been handed to the pipeline (1 the first time).
    pub attempt: u32,
    /// Its headers' numbers ([`header::BYTES`] bytes per header), into `data`.
    headers: &'a [u8],
    data: &'a [u8],
}

impl<'a> Row<'a> {
    /// The row's headers as (name, value) pairs, in order.
    pub fn headers(&self) -> impl ExactSizeIterator<Item = (&'a str, &'a str)> + use<'a> {
        let data = self.data;
        header::records(self.headers).map(move |h| (text(data, h.name), text(data, h.value)))
    }

    /// The first value of header `name` (exact match).
    pub fn header(&self, name: &str) -> Option<&'a str> {
        self.headers()
            .find(|(n, _)| *n == name)
            .map(|(_, value)| value)
    }
}

/// An owned row, to build a batch with [`Rows::pack`] in a plugin's tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowData {
    pub tenant: String,
    pub table: String,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, String)>,
    pub sequence: u64,
    pub attempt: u32,
}

impl RowData {
    /// A first-attempt row of tenant `t`, table `events`.
    pub fn new(payload: impl Into<Vec<u8>>) -> RowData {
        RowData {
            tenant: "t".into(),
            table: "events".into(),
            payload: payload.into(),
            headers: Vec::new(),
            sequence: 1,
            attempt: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_rows_read_back() {
        let mut first = RowData::new(r#"{"a":1}"#);
        first.headers.push(("Nats-Msg-Id".into(), "k1".into()));
        let second = RowData {
            tenant: "acme".into(),
            table: "orders".into(),
            sequence: 9,
            attempt: 2,
            ..RowData::new("x")
        };
        let rows = Rows::pack([&first, &second]);
        assert_eq!(rows.len(), 2);
        let row = rows.get(0).unwrap();
        assert_eq!(
            (row.tenant, row.table, row.payload),
            ("t", "events", &br#"{"a":1}"#[..])
        );
        assert_eq!(row.header("Nats-Msg-Id"), Some("k1"));
        let row = rows.get(1).unwrap();
        assert_eq!(
            (row.tenant, row.table, row.sequence, row.attempt),
            ("acme", "orders", 9, 2)
        );
        assert_eq!(row.headers().len(), 0);
        assert!(rows.get(2).is_none());
    }
}
