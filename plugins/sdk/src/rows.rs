//! The rows of a batch as a plugin reads them: borrowed views into the one
//! buffer the host packed them in, so reading a row allocates nothing.

use crate::transform::weir::plugin::types::Batch;

/// Numbers per row in `batch.rows` (see `wit/types.wit`).
const ROW_WIDTH: usize = 8;
/// Numbers per header.
pub(crate) const HEADER_WIDTH: usize = 4;

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
        let (mut numbers, mut sequences, mut attempts) = (Vec::new(), Vec::new(), Vec::new());
        for row in rows {
            numbers.extend(packer.append(row.tenant.as_bytes()));
            numbers.extend(packer.append(row.table.as_bytes()));
            numbers.extend(packer.append(&row.payload));
            numbers
                .extend(packer.headers(row.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()))));
            sequences.push(row.sequence);
            attempts.push(row.attempt);
        }
        Rows {
            batch: Batch {
                data: packer.data,
                rows: numbers,
                sequences,
                attempts,
                headers: packer.header_numbers,
            },
        }
    }

    pub fn len(&self) -> usize {
        self.batch.sequences.len()
    }

    pub fn is_empty(&self) -> bool {
        self.batch.sequences.is_empty()
    }

    /// Row `index`, if the batch has it.
    pub fn get(&self, index: usize) -> Option<Row<'_>> {
        let numbers = self
            .batch
            .rows
            .get(index * ROW_WIDTH..(index + 1) * ROW_WIDTH)?;
        let data = &self.batch.data;
        let headers = self
            .batch
            .headers
            .get(numbers[6] as usize * HEADER_WIDTH..)
            .unwrap_or_default();
        let header_count = (numbers[7] as usize).min(headers.len() / HEADER_WIDTH);
        Some(Row {
            tenant: text(data, numbers[0], numbers[1]),
            table: text(data, numbers[2], numbers[3]),
            payload: bytes(data, numbers[4], numbers[5]),
            sequence: self.batch.sequences.get(index).copied().unwrap_or(0),
            attempt: self.batch.attempts.get(index).copied().unwrap_or(0),
            headers: &headers[..header_count * HEADER_WIDTH],
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
    /// Its sequence in its partition stream: stable across redeliveries.
    pub sequence: u64,
    /// How many times it has been handed to the pipeline (1 the first time).
    pub attempt: u32,
    /// Four numbers per header, into `data`.
    headers: &'a [u32],
    data: &'a [u8],
}

impl<'a> Row<'a> {
    /// The row's headers as (name, value) pairs, in order.
    pub fn headers(&self) -> impl ExactSizeIterator<Item = (&'a str, &'a str)> + use<'a> {
        let data = self.data;
        self.headers
            .chunks_exact(HEADER_WIDTH)
            .map(move |h| (text(data, h[0], h[1]), text(data, h[2], h[3])))
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

/// Appends bytes and headers to one buffer, handing out (offset, length) spans.
#[derive(Default)]
pub(crate) struct Packer {
    pub data: Vec<u8>,
    /// Four numbers per header.
    pub header_numbers: Vec<u32>,
}

impl Packer {
    pub fn append(&mut self, bytes: &[u8]) -> [u32; 2] {
        let offset = number(self.data.len());
        self.data.extend_from_slice(bytes);
        [offset, number(bytes.len())]
    }

    /// Appends the bytes `write` writes.
    pub fn append_with(&mut self, write: impl FnOnce(&mut Vec<u8>)) -> [u32; 2] {
        let start = self.data.len();
        write(&mut self.data);
        [number(start), number(self.data.len() - start)]
    }

    /// Appends headers; returns (first header, count).
    pub fn headers<'h>(
        &mut self,
        headers: impl IntoIterator<Item = (&'h str, &'h str)>,
    ) -> [u32; 2] {
        let first = self.header_numbers.len() / HEADER_WIDTH;
        for (name, value) in headers {
            let name = self.append(name.as_bytes());
            let value = self.append(value.as_bytes());
            self.header_numbers.extend(name.into_iter().chain(value));
        }
        [
            number(first),
            number(self.header_numbers.len() / HEADER_WIDTH - first),
        ]
    }
}

// The host packs batches itself, so spans are in bounds and strings UTF-8;
// the fallbacks keep a broken host from making a plugin panic.
pub(crate) fn bytes(data: &[u8], offset: u32, len: u32) -> &[u8] {
    let start = offset as usize;
    data.get(start..start.saturating_add(len as usize))
        .unwrap_or_default()
}

pub(crate) fn text(data: &[u8], offset: u32, len: u32) -> &str {
    std::str::from_utf8(bytes(data, offset, len)).unwrap_or_default()
}

/// Offsets are u32 on the boundary; a batch is far below 4 GiB.
pub(crate) fn number(value: usize) -> u32 {
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
