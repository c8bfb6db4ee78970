//! The rows of a batch as a plugin reads them: borrowed views into the one
//! buffer the host packed them in, so reading a row allocates nothing.

use crate::transform::weir::plugin::types::{Batch, Header, Range, Row as PackedRow, Span};

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
        let rows = rows
            .into_iter()
            .map(|row| PackedRow {
                tenant: packer.append(row.tenant.as_bytes()),
                table: packer.append(row.table.as_bytes()),
                payload: packer.append(&row.payload),
                headers: packer.headers(row.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()))),
                sequence: row.sequence,
                attempt: row.attempt,
            })
            .collect();
        Rows {
            batch: Batch {
                data: packer.data,
                rows,
                headers: packer.header_list,
            },
        }
    }

    pub fn len(&self) -> usize {
        self.batch.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.batch.rows.is_empty()
    }

    /// Row `index`, if the batch has it.
    pub fn get(&self, index: usize) -> Option<Row<'_>> {
        self.batch.rows.get(index).map(|row| self.view(row))
    }

    /// The rows in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Row<'_>> {
        self.batch.rows.iter().map(|row| self.view(row))
    }

    fn view(&self, row: &PackedRow) -> Row<'_> {
        let data = &self.batch.data;
        Row {
            tenant: text(data, row.tenant),
            table: text(data, row.table),
            payload: bytes(data, row.payload),
            sequence: row.sequence,
            attempt: row.attempt,
            headers: items(&self.batch.headers, row.headers),
            data,
        }
    }
}

/// One row: its tenant, table, payload and headers borrow the batch.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    /// The tenant that sent the row (decided by its credential).
    pub tenant: &'a str,
    /// The table it was sent to.
    pub table: &'a str,
    /// Its bytes as the producer sent them (one NDJSON line for HTTP ingest).
    pub payload: &'a [u8],
    /// Its sequence in its partition stream: stable across redeliveries.
    pub sequence: u64,
    /// How many times it has been handed to the pipeline (1 the first time).
    pub attempt: u32,
    headers: &'a [Header],
    data: &'a [u8],
}

impl<'a> Row<'a> {
    /// The row's headers as (name, value) pairs, in order.
    pub fn headers(&self) -> impl ExactSizeIterator<Item = (&'a str, &'a str)> + use<'a> {
        let data = self.data;
        self.headers
            .iter()
            .map(move |h| (text(data, h.name), text(data, h.value)))
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

/// Appends bytes and headers to one buffer, handing out spans.
#[derive(Default)]
pub(crate) struct Packer {
    pub data: Vec<u8>,
    pub header_list: Vec<Header>,
}

impl Packer {
    pub fn append(&mut self, bytes: &[u8]) -> Span {
        let offset = index(self.data.len());
        self.data.extend_from_slice(bytes);
        Span {
            offset,
            len: index(bytes.len()),
        }
    }

    /// Appends bytes written by `write`.
    pub fn append_with(&mut self, write: impl FnOnce(&mut Vec<u8>)) -> Span {
        let start = self.data.len();
        write(&mut self.data);
        Span {
            offset: index(start),
            len: index(self.data.len() - start),
        }
    }

    pub fn headers<'h>(&mut self, headers: impl IntoIterator<Item = (&'h str, &'h str)>) -> Range {
        let first = self.header_list.len();
        for (name, value) in headers {
            let name = self.append(name.as_bytes());
            let value = self.append(value.as_bytes());
            self.header_list.push(Header { name, value });
        }
        Range {
            first: index(first),
            count: index(self.header_list.len() - first),
        }
    }
}

// The host packs batches itself, so spans are in bounds and strings UTF-8;
// the fallbacks keep a broken host from making a plugin panic.
pub(crate) fn bytes(data: &[u8], span: Span) -> &[u8] {
    let start = span.offset as usize;
    data.get(start..start.saturating_add(span.len as usize))
        .unwrap_or_default()
}

pub(crate) fn text(data: &[u8], span: Span) -> &str {
    std::str::from_utf8(bytes(data, span)).unwrap_or_default()
}

pub(crate) fn items<T>(list: &[T], range: Range) -> &[T] {
    let start = range.first as usize;
    list.get(start..start.saturating_add(range.count as usize))
        .unwrap_or_default()
}

/// Offsets are u32 on the boundary; a batch is far below 4 GiB.
fn index(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
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
