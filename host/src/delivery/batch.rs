//! Packed batches: the rows handed to a plugin, every byte of them in one
//! buffer and every position in flat lists of little-endian numbers, each
//! a `list<u8>` (see `batch` in `wit/types.wit`).
//!
//! Lists of bytes cross the boundary as one copy each in every guest
//! language, where a list of records is lowered field by field, a string
//! costs a guest allocation and componentize-py moves a `list<u32>` number
//! by number; so a call costs about its bytes, whatever its row count. Delivery packs
//! rows straight from their messages; a plugin's answer (`transformed`,
//! `delivered`) is read here, every code, span and count checked: an answer
//! that does not fit its batch is a contract failure of the plugin, never a
//! panic of the host.

use std::ops::Range;

// Every width, field position, code and sentinel of the layout comes from
// `weir_layout`, which the guest SDK packs and reads with too.
use weir_layout::outcome::{DEAD_LETTER, EMIT, OK, RETRY};
use weir_layout::{Span, U32, U64, emitted, header, numbers, outcome, row};

use crate::sandbox::bindings::{Delivered, Transformed};

pub use crate::sandbox::bindings::Batch as Packed;

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
                rows: Vec::with_capacity(rows * row::BYTES),
                sequences: Vec::with_capacity(rows * U64),
                attempts: Vec::with_capacity(rows * U32),
                headers: Vec::new(),
            },
        }
    }

    /// Empties the batch, keeping its buffers for the next rows.
    pub fn clear(&mut self) {
        let packed = &mut self.packed;
        packed.data.clear();
        packed.rows.clear();
        packed.sequences.clear();
        packed.attempts.clear();
        packed.headers.clear();
    }

    /// Bytes the batch's row buffer holds without growing.
    pub fn capacity(&self) -> usize {
        self.packed.data.capacity()
    }

    /// Makes room for `rows` more rows of `bytes` more bytes.
    pub fn reserve(&mut self, rows: usize, bytes: usize) {
        let packed = &mut self.packed;
        packed.data.reserve(bytes);
        packed.rows.reserve(rows * row::BYTES);
        packed.sequences.reserve(rows * U64);
        packed.attempts.reserve(rows * U32);
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
        let first = self.header_count();
        for (name, value) in headers {
            let header = header::Record {
                name: self.append(name.as_bytes()),
                value: self.append(value.as_bytes()),
            };
            self.packed.headers.extend_from_slice(&header.encode());
        }
        let row = row::Record {
            tenant,
            table,
            payload,
            headers: Span::from_range(first..self.header_count()),
        };
        self.packed.rows.extend_from_slice(&row.encode());
        self.packed
            .sequences
            .extend_from_slice(&position.sequence.to_le_bytes());
        self.packed
            .attempts
            .extend_from_slice(&position.attempt.to_le_bytes());
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
        self.packed.sequences.len() / U64
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
        self.text(self.record(row).tenant)
    }

    pub fn table(&self, row: usize) -> &str {
        self.text(self.record(row).table)
    }

    pub fn payload(&self, row: usize) -> &[u8] {
        self.bytes(self.record(row).payload)
    }

    pub fn position(&self, row: usize) -> Position {
        Position {
            sequence: numbers::u64_at(&self.packed.sequences, row).unwrap_or(0),
            attempt: numbers::u32_at(&self.packed.attempts, row).unwrap_or(0),
        }
    }

    /// Row `row`'s headers as (name, value) pairs.
    pub fn headers(&self, row: usize) -> impl Iterator<Item = (&str, &str)> {
        let numbers = header::run(&self.packed.headers, self.record(row).headers);
        header::records(numbers).map(|h| (self.text(h.name), self.text(h.value)))
    }

    /// Row `row`'s numbers; all zero (empty) past the end.
    fn record(&self, row: usize) -> row::Record {
        row::Record::read(&self.packed.rows, row).unwrap_or_default()
    }

    fn header_count(&self) -> usize {
        header::count(&self.packed.headers)
    }

    fn append(&mut self, bytes: &[u8]) -> Span {
        let start = self.packed.data.len();
        self.packed.data.extend_from_slice(bytes);
        Span::from_range(start..self.packed.data.len())
    }

    // Spans this batch made itself are always in bounds and UTF-8 where
    // text was written; the fallbacks only keep a bug from panicking.
    fn bytes(&self, span: Span) -> &[u8] {
        span.get(&self.packed.data).unwrap_or_default()
    }

    fn text(&self, span: Span) -> &str {
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
        check_outcomes("transformed.outcomes", &transformed.outcomes, rows)?;
        whole_items(
            "transformed.emitted",
            &transformed.emitted,
            emitted::WIDTH,
            "emitted row",
        )?;
        whole_items(
            "transformed.headers",
            &transformed.headers,
            header::WIDTH,
            "header",
        )?;
        Ok(Answer {
            transformed,
            next_emitted: 0,
        })
    }

    /// True when every row is passed on unchanged: the batch goes on as it is.
    pub fn all_ok(&self) -> bool {
        outcome::records(&self.transformed.outcomes).all(|decided| decided.code == OK)
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
            let emitted = emitted::count(&self.transformed.emitted);
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
        let record = emitted::Record::read(&self.transformed.emitted, emitted)
            .ok_or_else(|| Malformed(format!("transformed.emitted has no row {emitted}")))?;
        let table = match record.table {
            None => input.table(row),
            Some(span) => self.text(span, "an emitted row's table")?,
        };
        let payload = self.bytes(record.payload, "an emitted row's payload")?;
        let headers = header::run(&self.transformed.headers, record.headers);
        if header::records(headers).len() != record.headers.len as usize {
            return Err(Malformed(format!(
                "an emitted row's headers {}..+{} lie past the {} headers of transformed.headers",
                record.headers.offset,
                record.headers.len,
                header::count(&self.transformed.headers)
            )));
        }
        for header in header::records(headers) {
            self.text(header.name, "a header name")?;
            self.text(header.value, "a header value")?;
        }
        // Checked just above, so the lookups below cannot fall back.
        let headers = header::records(headers).map(|h| {
            (
                self.text(h.name, "").unwrap_or_default(),
                self.text(h.value, "").unwrap_or_default(),
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
        span.get(&self.transformed.data).ok_or_else(|| {
            Malformed(format!(
                "{what} lies at {}..+{}, past the {} bytes of transformed.data",
                span.offset,
                span.len,
                self.transformed.data.len()
            ))
        })
    }

    fn text(&self, span: Span, what: &str) -> Result<&'a str, Malformed> {
        std::str::from_utf8(self.bytes(span, what)?)
            .map_err(|err| Malformed(format!("{what} is not UTF-8: {err}")))
    }
}

/// A sink's answer, checked against a batch of `rows` rows: one outcome per
/// row (ok, retry or dead letter), each made a `T` as it is read: one
/// vector, sized once (collecting `Result`s would grow it row by row).
pub fn delivered_as<'a, T>(
    delivered: &'a Delivered,
    rows: usize,
    each: impl Fn(Outcome<'a>) -> T,
) -> Result<Vec<T>, Malformed> {
    check_outcomes("delivered.outcomes", &delivered.outcomes, rows)?;
    let mut outcomes = Vec::with_capacity(rows);
    for row in 0..rows {
        let outcome = read_outcome(&delivered.outcomes, &delivered.reasons, row, false)?;
        outcomes.push(each(outcome));
    }
    Ok(outcomes)
}

/// `field` holds one outcome per row of a batch of `rows` rows, whole.
fn check_outcomes(field: &str, outcomes: &[u8], rows: usize) -> Result<(), Malformed> {
    whole_items(field, outcomes, outcome::WIDTH, "outcome")?;
    let count = outcome::count(outcomes);
    if count != rows {
        return Err(Malformed(format!(
            "{field} has {count} outcomes for {rows} rows"
        )));
    }
    Ok(())
}

/// `field`'s bytes are whole items of `width` little-endian u32s: a list of
/// u32s whose length is not a multiple of 4 (or of its item) is malformed.
fn whole_items(field: &str, bytes: &[u8], width: usize, item: &str) -> Result<(), Malformed> {
    if !bytes.len().is_multiple_of(U32) {
        return Err(Malformed(format!(
            "{field} is {} bytes long, not a multiple of 4: it holds little-endian u32 numbers",
            bytes.len()
        )));
    }
    if !bytes.len().is_multiple_of(width * U32) {
        return Err(Malformed(format!(
            "{field} holds {} numbers, not a multiple of the {width} per {item}",
            bytes.len() / U32
        )));
    }
    Ok(())
}

/// Row `row`'s outcome; an `emit` is read as a count from 0, placed by [`Answer`].
fn read_outcome<'a>(
    outcomes: &[u8],
    reasons: &'a [String],
    row: usize,
    may_emit: bool,
) -> Result<Outcome<'a>, Malformed> {
    let Some(outcome::Record { code, argument }) = outcome::Record::read(outcomes, row) else {
        return Err(Malformed(format!("no outcome for row {row}")));
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
                    "row {row} is dead-lettered with reason {argument} of the {} in reasons",
                    reasons.len()
                ))
            }),
        other => Err(Malformed(format!("row {row} has outcome code {other}"))),
    }
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

    fn answer(
        data: &[u8],
        outcomes: &[outcome::Record],
        emitted: &[emitted::Record],
        reasons: &[&str],
    ) -> Transformed {
        Transformed {
            data: data.to_vec(),
            outcomes: outcomes.iter().flat_map(|o| o.encode()).collect(),
            emitted: emitted.iter().flat_map(|e| e.encode()).collect(),
            headers: vec![],
            reasons: reasons.iter().map(|r| r.to_string()).collect(),
        }
    }

    /// An emitted row with `payload`, keeping the input's table, no headers.
    fn emitted_row(payload: Span) -> emitted::Record {
        emitted::Record {
            table: None,
            payload,
            headers: Span::default(),
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
            &[
                outcome::Record::ok(),
                outcome::Record::emit(2),
                outcome::Record::dead_letter(0),
            ],
            &[
                emitted_row(Span::new(0, 1)),
                emitted::Record {
                    table: Some(Span::new(2, 2)),
                    ..emitted_row(Span::new(1, 1))
                },
            ],
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
    fn emitted_rows_carry_their_headers_and_headers_out_of_bounds_are_refused() {
        let mut input = Batch::default();
        input.push("acme", "orders", b"a", [], position(1));
        let header = header::Record {
            name: Span::new(1, 1),
            value: Span::new(2, 1),
        };
        let mut transformed = answer(
            b"xkv",
            &[outcome::Record::emit(1)],
            &[emitted::Record {
                headers: Span::new(0, 1),
                ..emitted_row(Span::new(0, 1))
            }],
            &[],
        );
        transformed.headers = header.encode().to_vec();
        let mut next = Batch::default();
        Answer::new(&transformed, 1)
            .unwrap()
            .push_emitted(&mut next, &input, 0, 0)
            .unwrap();
        assert_eq!(next.headers(0).collect::<Vec<_>>(), vec![("k", "v")]);

        transformed.headers.clear();
        let err = Answer::new(&transformed, 1)
            .unwrap()
            .push_emitted(&mut Batch::default(), &input, 0, 0)
            .unwrap_err();
        assert!(err.to_string().contains("lie past the 0 headers"), "{err}");
    }

    #[test]
    fn an_answer_that_does_not_fit_its_batch_is_refused() {
        let mut input = Batch::default();
        input.push("acme", "orders", b"x", [], position(1));
        let ok = outcome::Record::ok();
        let wrong_count = answer(b"", &[ok, ok], &[], &[]);
        assert!(Answer::new(&wrong_count, 1).is_err());

        let past_the_data = answer(
            b"hello",
            &[outcome::Record::emit(1)],
            &[emitted_row(Span::new(3, 9))],
            &[],
        );
        let mut answer_ = Answer::new(&past_the_data, 1).unwrap();
        assert_eq!(answer_.outcome(0).unwrap(), Outcome::Emit(0..1));
        let err = answer_
            .push_emitted(&mut Batch::default(), &input, 0, 0)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("past the 5 bytes of transformed.data"),
            "{err}"
        );

        let too_many = answer(
            b"",
            &[outcome::Record::emit(2)],
            &[emitted_row(Span::default())],
            &[],
        );
        let mut answer_ = Answer::new(&too_many, 1).unwrap();
        assert!(answer_.outcome(0).is_err());

        let no_reason = answer(b"", &[outcome::Record::dead_letter(4)], &[], &[]);
        assert!(Answer::new(&no_reason, 1).unwrap().outcome(0).is_err());
        let unknown = outcome::Record {
            code: 9,
            argument: 0,
        };
        let bad_code = answer(b"", &[unknown], &[], &[]);
        assert!(Answer::new(&bad_code, 1).unwrap().outcome(0).is_err());

        // A sink cannot emit.
        let sink = Delivered {
            outcomes: [ok, outcome::Record::emit(0)]
                .iter()
                .flat_map(|o| o.encode())
                .collect(),
            reasons: vec![],
        };
        let err = delivered_as(&sink, 2, |outcome| outcome).unwrap_err();
        assert!(err.to_string().contains("outcome code 1"), "{err}");
    }

    /// Each list of numbers is whole little-endian u32s, whole items of
    /// them; the error names the field.
    #[test]
    fn lists_of_numbers_that_are_not_whole_are_refused_naming_the_field() {
        let refused = |transformed: &Transformed, rows| match Answer::new(transformed, rows) {
            Ok(_) => panic!("a ragged answer was accepted"),
            Err(err) => err.to_string(),
        };
        let ok = outcome::Record::ok();
        let mut ragged = answer(b"", &[ok], &[], &[]);
        ragged.outcomes.push(0);
        assert_eq!(
            refused(&ragged, 1),
            "transformed.outcomes is 9 bytes long, not a multiple of 4: it holds little-endian u32 numbers"
        );
        ragged.outcomes.extend([0, 0, 0]);
        assert_eq!(
            refused(&ragged, 1),
            "transformed.outcomes holds 3 numbers, not a multiple of the 2 per outcome"
        );
        let mut ragged = answer(b"", &[ok], &[], &[]);
        ragged.emitted = vec![0; 4];
        assert_eq!(
            refused(&ragged, 1),
            "transformed.emitted holds 1 numbers, not a multiple of the 6 per emitted row"
        );
        let mut ragged = answer(b"", &[ok], &[], &[]);
        ragged.headers = vec![0; 18];
        assert!(refused(&ragged, 1).starts_with("transformed.headers is 18 bytes long"));
        let sink = Delivered {
            outcomes: vec![0; 4],
            reasons: vec![],
        };
        let err = delivered_as(&sink, 1, |outcome| outcome).unwrap_err();
        assert_eq!(
            err.to_string(),
            "delivered.outcomes holds 1 numbers, not a multiple of the 2 per outcome"
        );
        let sink = Delivered {
            outcomes: ok.encode().to_vec(),
            reasons: vec![],
        };
        let err = delivered_as(&sink, 2, |outcome| outcome).unwrap_err();
        assert_eq!(
            err.to_string(),
            "delivered.outcomes has 1 outcomes for 2 rows"
        );
    }
}
