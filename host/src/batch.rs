//! Packed batches: the rows handed to a plugin, every byte of them in one
//! buffer (see `batch` in `wit/types.wit`).
//!
//! A batch crosses the boundary as one `list<u8>` and two lists of numbers,
//! so the cost of a call grows with its bytes, not with one guest allocation
//! per string per row. Delivery packs rows straight from their messages; a
//! transform's answer is unpacked into the next step's batch here, checking
//! every span and range the plugin returned.

use std::ops::Range;

use crate::sandbox::bindings::{EmittedRow, Header, PackedRange, PackedRow, Span, Transformed};

pub use crate::sandbox::bindings::Batch as Packed;

/// A plugin's answer points outside what it returned, or is not UTF-8 where
/// a string is due.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(String);

/// A batch of rows being packed or passed between pipeline steps.
#[derive(Debug, Clone)]
pub struct Batch {
    packed: Packed,
}

/// What one row carries besides its bytes.
#[derive(Debug, Clone, Copy)]
pub struct Position {
    pub sequence: u64,
    pub attempt: u32,
}

impl Default for Batch {
    fn default() -> Batch {
        Batch::with_capacity(0, 0)
    }
}

impl Batch {
    pub fn with_capacity(rows: usize, bytes: usize) -> Batch {
        Batch {
            packed: Packed {
                data: Vec::with_capacity(bytes),
                rows: Vec::with_capacity(rows),
                headers: Vec::new(),
            },
        }
    }

    /// Appends a row. `headers` are (name, value) pairs.
    pub fn push<'a>(
        &mut self,
        tenant: &str,
        table: &str,
        payload: &[u8],
        headers: impl IntoIterator<Item = (&'a str, &'a str)>,
        position: Position,
    ) {
        let tenant = self.append(tenant.as_bytes());
        let table = self.append(table.as_bytes());
        let payload = self.append(payload);
        let first = self.packed.headers.len();
        for (name, value) in headers {
            let name = self.append(name.as_bytes());
            let value = self.append(value.as_bytes());
            self.packed.headers.push(Header { name, value });
        }
        let headers = PackedRange {
            first: index(first),
            count: index(self.packed.headers.len() - first),
        };
        self.packed.rows.push(PackedRow {
            tenant,
            table,
            payload,
            headers,
            sequence: position.sequence,
            attempt: position.attempt,
        });
    }

    /// Appends row `row` of `other` as it is.
    pub fn push_from(&mut self, other: &Batch, row: usize) {
        let Some(r) = other.packed.rows.get(row) else {
            return;
        };
        let headers = other.headers(row);
        self.push(
            other.str(r.tenant),
            other.str(r.table),
            other.bytes(r.payload),
            headers,
            Position {
                sequence: r.sequence,
                attempt: r.attempt,
            },
        );
    }

    pub fn len(&self) -> usize {
        self.packed.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packed.rows.is_empty()
    }

    /// Payload bytes of every row together (what the batch costs to copy).
    pub fn data_len(&self) -> usize {
        self.packed.data.len()
    }

    /// The form that crosses the boundary.
    pub fn packed(&self) -> &Packed {
        &self.packed
    }

    pub fn tenant(&self, row: usize) -> &str {
        self.packed.rows.get(row).map_or("", |r| self.str(r.tenant))
    }

    pub fn table(&self, row: usize) -> &str {
        self.packed.rows.get(row).map_or("", |r| self.str(r.table))
    }

    pub fn payload(&self, row: usize) -> &[u8] {
        self.packed
            .rows
            .get(row)
            .map_or(&[], |r| self.bytes(r.payload))
    }

    pub fn position(&self, row: usize) -> Position {
        self.packed.rows.get(row).map_or(
            Position {
                sequence: 0,
                attempt: 0,
            },
            |r| Position {
                sequence: r.sequence,
                attempt: r.attempt,
            },
        )
    }

    /// Row `row`'s headers as (name, value) pairs.
    pub fn headers(&self, row: usize) -> impl Iterator<Item = (&str, &str)> {
        let range = self.packed.rows.get(row).map_or(0..0, |r| items(r.headers));
        self.packed
            .headers
            .get(range)
            .unwrap_or_default()
            .iter()
            .map(|h| (self.str(h.name), self.str(h.value)))
    }

    fn append(&mut self, bytes: &[u8]) -> Span {
        let offset = index(self.packed.data.len());
        self.packed.data.extend_from_slice(bytes);
        Span {
            offset,
            len: index(bytes.len()),
        }
    }

    // Spans this batch made itself are always in bounds and UTF-8 where
    // strings were written; the fallbacks only keep a bug from panicking.
    fn bytes(&self, span: Span) -> &[u8] {
        self.packed.data.get(bytes(span)).unwrap_or_default()
    }

    fn str(&self, span: Span) -> &str {
        std::str::from_utf8(self.bytes(span)).unwrap_or_default()
    }
}

/// A transform's answer, checked piece by piece as it is read.
pub struct Answer<'a> {
    transformed: &'a Transformed,
}

impl<'a> Answer<'a> {
    pub fn new(transformed: &'a Transformed) -> Answer<'a> {
        Answer { transformed }
    }

    /// The emitted rows of an `emit(range)` outcome.
    pub fn emitted(&self, range: PackedRange) -> Result<&'a [EmittedRow], Malformed> {
        self.transformed.rows.get(items(range)).ok_or_else(|| {
            Malformed(format!(
                "emitted rows {}..+{} of {}",
                range.first,
                range.count,
                self.transformed.rows.len()
            ))
        })
    }

    /// Appends an emitted row to `next`, in place of row `row` of `input`.
    pub fn push_emitted(
        &self,
        next: &mut Batch,
        input: &Batch,
        row: usize,
        emitted: &EmittedRow,
    ) -> Result<(), Malformed> {
        let table = match emitted.table {
            Some(span) => self.str(span, "an emitted row's table")?,
            None => input.table(row),
        };
        let payload = self.bytes(emitted.payload, "an emitted row's payload")?;
        let headers = self
            .transformed
            .headers
            .get(items(emitted.headers))
            .ok_or_else(|| Malformed("an emitted row's headers lie out of bounds".into()))?;
        for header in headers {
            self.str(header.name, "a header name")?;
            self.str(header.value, "a header value")?;
        }
        // Checked just above, so the lookups below cannot fall back.
        let headers = headers.iter().map(|h| {
            (
                self.str(h.name, "").unwrap_or_default(),
                self.str(h.value, "").unwrap_or_default(),
            )
        });
        next.push(
            input.tenant(row),
            table,
            payload,
            headers,
            input.position(row),
        );
        Ok(())
    }

    fn bytes(&self, span: Span, what: &str) -> Result<&'a [u8], Malformed> {
        self.transformed.data.get(bytes(span)).ok_or_else(|| {
            Malformed(format!(
                "{what} lies at {}..+{}, past the {} bytes returned",
                span.offset,
                span.len,
                self.transformed.data.len()
            ))
        })
    }

    fn str(&self, span: Span, what: &str) -> Result<&'a str, Malformed> {
        std::str::from_utf8(self.bytes(span, what)?)
            .map_err(|err| Malformed(format!("{what} is not UTF-8: {err}")))
    }
}

fn bytes(span: Span) -> Range<usize> {
    let start = span.offset as usize;
    start..start.saturating_add(span.len as usize)
}

fn items(range: PackedRange) -> Range<usize> {
    let start = range.first as usize;
    start..start.saturating_add(range.count as usize)
}

/// Offsets are u32 on the boundary: a batch is capped far below 4 GiB by
/// `batch_bytes` and the plugin memory cap.
fn index(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::bindings::Outcome;

    fn position(sequence: u64) -> Position {
        Position {
            sequence,
            attempt: 1,
        }
    }

    #[test]
    fn rows_read_back_as_pushed() {
        let mut batch = Batch::with_capacity(2, 64);
        batch.push("acme", "orders", b"{\"a\":1}", [("k", "v")], position(7));
        batch.push("beta", "clicks", b"", [], position(8));
        assert_eq!(batch.len(), 2);
        assert_eq!(
            (batch.tenant(0), batch.table(0), batch.payload(0)),
            ("acme", "orders", &b"{\"a\":1}"[..])
        );
        assert_eq!(batch.headers(0).collect::<Vec<_>>(), vec![("k", "v")]);
        assert_eq!(batch.headers(1).count(), 0);
        assert_eq!(batch.position(1).sequence, 8);

        let mut copy = Batch::default();
        copy.push_from(&batch, 0);
        assert_eq!(copy.payload(0), batch.payload(0));
        assert_eq!(copy.headers(0).collect::<Vec<_>>(), vec![("k", "v")]);
    }

    #[test]
    fn an_answer_pointing_outside_itself_is_refused() {
        let mut input = Batch::default();
        input.push("acme", "orders", b"x", [], position(1));
        let transformed = Transformed {
            data: b"hello".to_vec(),
            outcomes: vec![Outcome::Emit(PackedRange { first: 0, count: 1 })],
            rows: vec![EmittedRow {
                table: None,
                payload: Span { offset: 3, len: 9 },
                headers: PackedRange { first: 0, count: 0 },
            }],
            headers: vec![],
        };
        let answer = Answer::new(&transformed);
        let emitted = answer.emitted(PackedRange { first: 0, count: 1 }).unwrap();
        let mut next = Batch::default();
        let err = answer
            .push_emitted(&mut next, &input, 0, &emitted[0])
            .unwrap_err();
        assert!(err.to_string().contains("past the 5 bytes"), "{err}");
        assert!(answer.emitted(PackedRange { first: 1, count: 1 }).is_err());
    }
}
