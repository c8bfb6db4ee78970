//! Packed batches: the rows handed to a plugin, every byte of them in one
//! buffer and every position in flat lists of numbers (see `batch` in
//! `wit/types.wit`).
//!
//! Lists of numbers cross the boundary as one copy each, where a list of
//! records is lowered field by field and a string costs a guest allocation;
//! so a call costs about its bytes, whatever its row count. Delivery packs
//! rows straight from their messages; a plugin's answer (`transformed`,
//! `delivered`) is read here, every code, span and count checked: an answer
//! that does not fit its batch is a contract failure of the plugin, never a
//! panic of the host.

use std::ops::Range;

use crate::sandbox::bindings::{Delivered, Transformed};

pub use crate::sandbox::bindings::Batch as Packed;

/// Numbers per row in `batch.rows`.
const ROW_WIDTH: usize = 8;
/// Numbers per header in `headers`.
const HEADER_WIDTH: usize = 4;
/// Numbers per emitted row in `transformed.emitted`.
const EMITTED_WIDTH: usize = 6;
/// An emitted row's table length meaning "the input's table".
const SAME_TABLE: u32 = u32::MAX;

/// Outcome codes, shared by `transformed` and `delivered`.
const OK: u32 = 0;
const EMIT: u32 = 1;
const RETRY: u32 = 2;
const DEAD_LETTER: u32 = 3;

/// A plugin's answer does not fit the batch it was given.
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
                rows: Vec::with_capacity(rows * ROW_WIDTH),
                sequences: Vec::with_capacity(rows),
                attempts: Vec::with_capacity(rows),
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
        let first = self.packed.headers.len() / HEADER_WIDTH;
        for (name, value) in headers {
            let name = self.append(name.as_bytes());
            let value = self.append(value.as_bytes());
            self.packed.headers.extend(name.into_iter().chain(value));
        }
        let count = self.packed.headers.len() / HEADER_WIDTH - first;
        self.packed.rows.extend(
            tenant
                .into_iter()
                .chain(table)
                .chain(payload)
                .chain([number(first), number(count)]),
        );
        self.packed.sequences.push(position.sequence);
        self.packed.attempts.push(position.attempt);
    }

    /// Appends row `row` of `other` as it is.
    pub fn push_from(&mut self, other: &Batch, row: usize) {
        self.push(
            other.tenant(row),
            other.table(row),
            other.payload(row),
            other.headers(row),
            other.position(row),
        );
    }

    pub fn len(&self) -> usize {
        self.packed.sequences.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packed.sequences.is_empty()
    }

    /// The bytes of every row together (what the batch costs to copy).
    pub fn data_len(&self) -> usize {
        self.packed.data.len()
    }

    /// The form that crosses the boundary.
    pub fn packed(&self) -> &Packed {
        &self.packed
    }

    pub fn tenant(&self, row: usize) -> &str {
        self.text(self.field(row, 0))
    }

    pub fn table(&self, row: usize) -> &str {
        self.text(self.field(row, 2))
    }

    pub fn payload(&self, row: usize) -> &[u8] {
        self.bytes(self.field(row, 4))
    }

    pub fn position(&self, row: usize) -> Position {
        Position {
            sequence: self.packed.sequences.get(row).copied().unwrap_or(0),
            attempt: self.packed.attempts.get(row).copied().unwrap_or(0),
        }
    }

    /// Row `row`'s headers as (name, value) pairs.
    pub fn headers(&self, row: usize) -> impl Iterator<Item = (&str, &str)> {
        let (first, count) = self.field(row, 6);
        let numbers = self
            .packed
            .headers
            .get(first as usize * HEADER_WIDTH..)
            .unwrap_or_default();
        numbers
            .chunks_exact(HEADER_WIDTH)
            .take(count as usize)
            .map(|h| (self.text((h[0], h[1])), self.text((h[2], h[3]))))
    }

    /// Two numbers of row `row`, from `at`.
    fn field(&self, row: usize, at: usize) -> (u32, u32) {
        let start = row * ROW_WIDTH + at;
        match self.packed.rows.get(start..start + 2) {
            Some([a, b]) => (*a, *b),
            _ => (0, 0),
        }
    }

    fn append(&mut self, bytes: &[u8]) -> [u32; 2] {
        let offset = number(self.packed.data.len());
        self.packed.data.extend_from_slice(bytes);
        [offset, number(bytes.len())]
    }

    // Spans this batch made itself are always in bounds and UTF-8 where
    // text was written; the fallbacks only keep a bug from panicking.
    fn bytes(&self, (offset, len): (u32, u32)) -> &[u8] {
        self.packed.data.get(span(offset, len)).unwrap_or_default()
    }

    fn text(&self, span: (u32, u32)) -> &str {
        std::str::from_utf8(self.bytes(span)).unwrap_or_default()
    }
}

/// What a plugin decided for one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<'a> {
    Ok,
    /// Replaced by these rows of the answer's `emitted` (none: dropped).
    Emit(Range<usize>),
    Retry(u32),
    DeadLetter(&'a str),
}

/// A transform's answer, read row by row.
pub struct Answer<'a> {
    transformed: &'a Transformed,
    /// The next emitted row not yet claimed by an `emit`.
    next_emitted: usize,
}

impl<'a> Answer<'a> {
    /// Checks the answer's shape against a batch of `rows` rows.
    pub fn new(transformed: &'a Transformed, rows: usize) -> Result<Answer<'a>, Malformed> {
        check_outcomes(&transformed.outcomes, rows)?;
        if !transformed.emitted.len().is_multiple_of(EMITTED_WIDTH)
            || !transformed.headers.len().is_multiple_of(HEADER_WIDTH)
        {
            return Err(Malformed(format!(
                "{} numbers of emitted rows and {} of headers; rows take {EMITTED_WIDTH} each, headers {HEADER_WIDTH}",
                transformed.emitted.len(),
                transformed.headers.len()
            )));
        }
        Ok(Answer {
            transformed,
            next_emitted: 0,
        })
    }

    /// True when every row is passed on unchanged: the batch goes on as it is.
    pub fn all_ok(&self) -> bool {
        self.transformed
            .outcomes
            .chunks_exact(2)
            .all(|pair| pair[0] == OK)
    }

    /// The outcome of row `row`; rows must be read in order.
    pub fn outcome(&mut self, row: usize) -> Result<Outcome<'a>, Malformed> {
        let outcome = read_outcome(
            &self.transformed.outcomes,
            &self.transformed.reasons,
            row,
            true,
        )?;
        if let Outcome::Emit(ref range) = outcome {
            let count = range.len();
            let emitted = self.transformed.emitted.len() / EMITTED_WIDTH;
            if self.next_emitted + count > emitted {
                return Err(Malformed(format!(
                    "row {row} emits {count} rows past the {emitted} returned"
                )));
            }
            let range = self.next_emitted..self.next_emitted + count;
            self.next_emitted = range.end;
            return Ok(Outcome::Emit(range));
        }
        Ok(outcome)
    }

    /// Appends emitted row `emitted` to `next`, in place of row `row` of `input`.
    pub fn push_emitted(
        &self,
        next: &mut Batch,
        input: &Batch,
        row: usize,
        emitted: usize,
    ) -> Result<(), Malformed> {
        let numbers = self
            .transformed
            .emitted
            .get(emitted * EMITTED_WIDTH..(emitted + 1) * EMITTED_WIDTH)
            .ok_or_else(|| Malformed(format!("no emitted row {emitted}")))?;
        let table = match (numbers[0], numbers[1]) {
            (_, SAME_TABLE) => input.table(row),
            span => self.text(span, "an emitted row's table")?,
        };
        let payload = self.bytes((numbers[2], numbers[3]), "an emitted row's payload")?;
        let (first, count) = (numbers[4] as usize, numbers[5] as usize);
        let headers = self
            .transformed
            .headers
            .get(first * HEADER_WIDTH..(first + count) * HEADER_WIDTH)
            .ok_or_else(|| Malformed("an emitted row's headers lie out of bounds".into()))?;
        for header in headers.chunks_exact(HEADER_WIDTH) {
            self.text((header[0], header[1]), "a header name")?;
            self.text((header[2], header[3]), "a header value")?;
        }
        // Checked just above, so the lookups below cannot fall back.
        let headers = headers.chunks_exact(HEADER_WIDTH).map(|h| {
            (
                self.text((h[0], h[1]), "").unwrap_or_default(),
                self.text((h[2], h[3]), "").unwrap_or_default(),
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

    fn bytes(&self, (offset, len): (u32, u32), what: &str) -> Result<&'a [u8], Malformed> {
        self.transformed.data.get(span(offset, len)).ok_or_else(|| {
            Malformed(format!(
                "{what} lies at {offset}..+{len}, past the {} bytes returned",
                self.transformed.data.len()
            ))
        })
    }

    fn text(&self, span: (u32, u32), what: &str) -> Result<&'a str, Malformed> {
        std::str::from_utf8(self.bytes(span, what)?)
            .map_err(|err| Malformed(format!("{what} is not UTF-8: {err}")))
    }
}

/// A sink's answer, checked against a batch of `rows` rows: one outcome per
/// row (ok, retry or dead letter).
pub fn delivered(delivered: &Delivered, rows: usize) -> Result<Vec<Outcome<'_>>, Malformed> {
    check_outcomes(&delivered.outcomes, rows)?;
    (0..rows)
        .map(|row| read_outcome(&delivered.outcomes, &delivered.reasons, row, false))
        .collect()
}

fn check_outcomes(outcomes: &[u32], rows: usize) -> Result<(), Malformed> {
    if outcomes.len() != rows * 2 {
        return Err(Malformed(format!(
            "{} outcomes for {rows} rows",
            outcomes.len() / 2
        )));
    }
    Ok(())
}

/// Row `row`'s outcome; an `emit` is read as a count from 0, placed by [`Answer`].
fn read_outcome<'a>(
    outcomes: &[u32],
    reasons: &'a [String],
    row: usize,
    may_emit: bool,
) -> Result<Outcome<'a>, Malformed> {
    let (code, argument) = match outcomes.get(row * 2..row * 2 + 2) {
        Some([code, argument]) => (*code, *argument),
        _ => return Err(Malformed(format!("no outcome for row {row}"))),
    };
    match code {
        OK => Ok(Outcome::Ok),
        EMIT if may_emit => Ok(Outcome::Emit(0..argument as usize)),
        RETRY => Ok(Outcome::Retry(argument)),
        DEAD_LETTER => reasons
            .get(argument as usize)
            .map(|reason| Outcome::DeadLetter(reason.as_str()))
            .ok_or_else(|| {
                Malformed(format!(
                    "row {row} is dead-lettered with reason {argument} of {}",
                    reasons.len()
                ))
            }),
        other => Err(Malformed(format!("row {row} has outcome code {other}"))),
    }
}

fn span(offset: u32, len: u32) -> Range<usize> {
    let start = offset as usize;
    start..start.saturating_add(len as usize)
}

/// Offsets are u32 on the boundary: a batch is capped far below 4 GiB by
/// `batch_bytes` and the plugin memory cap.
fn number(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn position(sequence: u64) -> Position {
        Position {
            sequence,
            attempt: 1,
        }
    }

    fn answer(data: &[u8], outcomes: &[u32], emitted: &[u32], reasons: &[&str]) -> Transformed {
        Transformed {
            data: data.to_vec(),
            outcomes: outcomes.to_vec(),
            emitted: emitted.to_vec(),
            headers: vec![],
            reasons: reasons.iter().map(|r| r.to_string()).collect(),
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
        assert_eq!(batch.tenant(5), "");

        let mut copy = Batch::default();
        copy.push_from(&batch, 0);
        assert_eq!(copy.payload(0), batch.payload(0));
        assert_eq!(copy.headers(0).collect::<Vec<_>>(), vec![("k", "v")]);
    }

    #[test]
    fn an_answer_is_read_in_order_and_emitted_rows_keep_tenant_and_position() {
        let mut input = Batch::default();
        input.push("acme", "orders", b"a", [], position(1));
        input.push("acme", "orders", b"b", [], position(2));
        input.push("acme", "orders", b"c", [], position(3));
        // Row 0 ok, row 1 emits two rows (one to table `t2`), row 2 is dead-lettered.
        let transformed = answer(
            b"xyt2",
            &[0, 0, 1, 2, 3, 0],
            &[0, u32::MAX, 0, 1, 0, 0, 2, 2, 1, 1, 0, 0],
            &["bad"],
        );
        let mut answer = Answer::new(&transformed, 3).unwrap();
        assert!(!answer.all_ok());
        assert_eq!(answer.outcome(0).unwrap(), Outcome::Ok);
        assert_eq!(answer.outcome(1).unwrap(), Outcome::Emit(0..2));
        assert_eq!(answer.outcome(2).unwrap(), Outcome::DeadLetter("bad"));
        let mut next = Batch::default();
        answer.push_emitted(&mut next, &input, 1, 0).unwrap();
        answer.push_emitted(&mut next, &input, 1, 1).unwrap();
        assert_eq!((next.table(0), next.payload(0)), ("orders", &b"x"[..]));
        assert_eq!((next.table(1), next.payload(1)), ("t2", &b"y"[..]));
        assert_eq!(next.tenant(1), "acme");
        assert_eq!(next.position(1).sequence, 2);
    }

    #[test]
    fn an_answer_that_does_not_fit_its_batch_is_refused() {
        let mut input = Batch::default();
        input.push("acme", "orders", b"x", [], position(1));
        let wrong_count = answer(b"", &[0, 0, 0, 0], &[], &[]);
        assert!(Answer::new(&wrong_count, 1).is_err());

        let past_the_data = answer(b"hello", &[1, 1], &[0, u32::MAX, 3, 9, 0, 0], &[]);
        let mut answer_ = Answer::new(&past_the_data, 1).unwrap();
        assert_eq!(answer_.outcome(0).unwrap(), Outcome::Emit(0..1));
        let err = answer_
            .push_emitted(&mut Batch::default(), &input, 0, 0)
            .unwrap_err();
        assert!(err.to_string().contains("past the 5 bytes"), "{err}");

        let too_many = answer(b"", &[1, 2], &[0, u32::MAX, 0, 0, 0, 0], &[]);
        let mut answer_ = Answer::new(&too_many, 1).unwrap();
        assert!(answer_.outcome(0).is_err());

        let no_reason = answer(b"", &[3, 4], &[], &[]);
        assert!(Answer::new(&no_reason, 1).unwrap().outcome(0).is_err());
        let bad_code = answer(b"", &[9, 0], &[], &[]);
        assert!(Answer::new(&bad_code, 1).unwrap().outcome(0).is_err());

        let sink = Delivered {
            outcomes: vec![0, 0, 1, 0],
            reasons: vec![],
        };
        let err = delivered(&sink, 2).unwrap_err();
        assert!(err.to_string().contains("outcome code 1"), "{err}");
    }
}
