//! The packed batch layout of `weir:plugin@0.2.0`, defined once for the host and the guest SDK.
//!
//! `wit/types.wit` packs a batch (`batch`) and a plugin's answer
//! (`transformed`, `delivered`) as one byte buffer plus flat lists of u32s.
//! WIT can only say in prose which number means what; this crate says it in
//! code: each list's width, where each field lies in it, the outcome codes
//! and the "same table" sentinel, and records that write and read them. The
//! host (`host/src/delivery/batch.rs`) and the SDK (`plugins/sdk`) both go
//! through it, so the two sides of the boundary cannot drift apart.
//!
//! Lists, one module each:
//!
//! | list                                      | module      | numbers per item |
//! |-------------------------------------------|-------------|------------------|
//! | `batch.rows`                              | [`row`]     | [`row::WIDTH`]   |
//! | `batch.headers`, `transformed.headers`    | [`header`]  | [`header::WIDTH`]|
//! | `transformed.outcomes`, `delivered.outcomes` | [`outcome`] | [`outcome::WIDTH`] |
//! | `transformed.emitted`                     | [`emitted`] | [`emitted::WIDTH`] |
//!
//! Reading never panics: an item past the end of its list is `None`, a
//! span's arithmetic saturates. What a short or out-of-bounds answer means
//! (a broken plugin, a broken host) is the caller's to decide.
//!
//! ```
//! use weir_layout::{Span, row};
//!
//! let mut rows = Vec::new();
//! let packed = row::Record {
//!     tenant: Span::new(0, 4),
//!     table: Span::new(4, 6),
//!     payload: Span::new(10, 7),
//!     headers: Span::new(0, 0),
//! };
//! rows.extend(packed.encode());
//! assert_eq!(row::Record::read(&rows, 0), Some(packed));
//! assert_eq!(row::Record::read(&rows, 1), None);
//! ```

#![no_std]

use core::ops::Range;

/// An index or length as the u32 the boundary carries. It saturates rather
/// than fails: a batch is far below 4 GiB (the host caps it by `batch_bytes`
/// and a plugin's memory cap), so `u32::MAX` only ever means "too big".
#[inline]
pub fn number(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// Two numbers that place a run in a list: the offset and length of a piece
/// of `data` (in bytes), or the first header in `headers` and how many there
/// are (in headers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Span {
    pub offset: u32,
    pub len: u32,
}

impl Span {
    #[inline]
    pub const fn new(offset: u32, len: u32) -> Span {
        Span { offset, len }
    }

    /// The span of `range`, e.g. what was just appended to a buffer
    /// (saturating; an inverted range is empty).
    #[inline]
    pub fn from_range(range: Range<usize>) -> Span {
        Span {
            offset: number(range.start),
            len: number(range.end.saturating_sub(range.start)),
        }
    }

    /// The indexes it covers. Saturating: a length sent by the other side
    /// cannot overflow.
    #[inline]
    pub fn range(self) -> Range<usize> {
        let start = self.offset as usize;
        start..start.saturating_add(self.len as usize)
    }

    /// Its part of `list`, if it lies wholly within it.
    #[inline]
    pub fn get<T>(self, list: &[T]) -> Option<&[T]> {
        list.get(self.range())
    }
}

/// Item `index` of a list of `WIDTH` numbers per item, if the list holds it
/// whole. Fixed-size arrays let every field index below be checked when it
/// compiles.
#[inline]
fn item<const WIDTH: usize>(numbers: &[u32], index: usize) -> Option<&[u32; WIDTH]> {
    numbers.as_chunks::<WIDTH>().0.get(index)
}

/// `batch.rows`: per row, where its tenant, table, payload and headers lie.
pub mod row {
    use super::{Span, item};

    /// Numbers per row: "Eight numbers per row, row `i` from index `8 × i`".
    pub const WIDTH: usize = 8;
    /// Offset and length in `data` of the row's tenant.
    pub const TENANT: usize = 0;
    /// Offset and length in `data` of its table.
    pub const TABLE: usize = 2;
    /// Offset and length in `data` of its payload.
    pub const PAYLOAD: usize = 4;
    /// Its first header in `headers` (counted in headers) and how many it has.
    pub const HEADERS: usize = 6;

    /// One row's numbers.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Record {
        pub tenant: Span,
        pub table: Span,
        pub payload: Span,
        /// First header and count, in headers.
        pub headers: Span,
    }

    impl Record {
        /// Row `index` of `rows`, if `rows` holds it.
        #[inline]
        pub fn read(rows: &[u32], index: usize) -> Option<Record> {
            let n = item::<WIDTH>(rows, index)?;
            Some(Record {
                tenant: Span::new(n[TENANT], n[TENANT + 1]),
                table: Span::new(n[TABLE], n[TABLE + 1]),
                payload: Span::new(n[PAYLOAD], n[PAYLOAD + 1]),
                headers: Span::new(n[HEADERS], n[HEADERS + 1]),
            })
        }

        /// Its numbers, to append to `rows`.
        #[inline]
        pub fn encode(self) -> [u32; WIDTH] {
            let mut n = [0; WIDTH];
            (n[TENANT], n[TENANT + 1]) = (self.tenant.offset, self.tenant.len);
            (n[TABLE], n[TABLE + 1]) = (self.table.offset, self.table.len);
            (n[PAYLOAD], n[PAYLOAD + 1]) = (self.payload.offset, self.payload.len);
            (n[HEADERS], n[HEADERS + 1]) = (self.headers.offset, self.headers.len);
            n
        }
    }
}

/// `headers` of a batch or of a transform's answer: per header, where its
/// name and value lie in `data`.
pub mod header {
    use super::{Span, item};

    /// Numbers per header: "Four numbers per header".
    pub const WIDTH: usize = 4;
    /// Offset and length in `data` of the header's name.
    pub const NAME: usize = 0;
    /// Offset and length in `data` of its value.
    pub const VALUE: usize = 2;

    /// One header's numbers.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Record {
        pub name: Span,
        pub value: Span,
    }

    impl Record {
        /// Header `index` of `headers`, if `headers` holds it.
        #[inline]
        pub fn read(headers: &[u32], index: usize) -> Option<Record> {
            item::<WIDTH>(headers, index).map(Record::decode)
        }

        /// A header from its numbers.
        #[inline]
        pub fn decode(n: &[u32; WIDTH]) -> Record {
            Record {
                name: Span::new(n[NAME], n[NAME + 1]),
                value: Span::new(n[VALUE], n[VALUE + 1]),
            }
        }

        /// Its numbers, to append to `headers`.
        #[inline]
        pub fn encode(self) -> [u32; WIDTH] {
            let mut n = [0; WIDTH];
            (n[NAME], n[NAME + 1]) = (self.name.offset, self.name.len);
            (n[VALUE], n[VALUE + 1]) = (self.value.offset, self.value.len);
            n
        }
    }

    /// The numbers of the headers `run` (first header, count) picks from
    /// `headers`: as many of them as `headers` holds, so a caller that needs
    /// them all compares [`records`]' length with `run.len`.
    #[inline]
    pub fn run(headers: &[u32], run: Span) -> &[u32] {
        let start = (run.offset as usize).saturating_mul(WIDTH);
        let len = (run.len as usize).saturating_mul(WIDTH);
        let tail = headers.get(start..).unwrap_or_default();
        tail.get(..len).unwrap_or(tail)
    }

    /// The headers packed in `numbers`, in order (a partial header at the
    /// end is not one).
    #[inline]
    pub fn records(numbers: &[u32]) -> impl ExactSizeIterator<Item = Record> + '_ {
        numbers.as_chunks::<WIDTH>().0.iter().map(Record::decode)
    }
}

/// `outcomes` of `transformed` and `delivered`: per input row, in order, an
/// outcome code and its argument.
pub mod outcome {
    use super::item;

    /// Numbers per outcome: "Two numbers per input row, in order".
    pub const WIDTH: usize = 2;
    /// Where the code lies.
    pub const CODE: usize = 0;
    /// Where its argument lies.
    pub const ARGUMENT: usize = 1;

    /// "0 ok": pass the row on unchanged (transform) or delivered (sink); argument 0.
    pub const OK: u32 = 0;
    /// "1 emit": replace the row by the next `argument` rows of `emitted`
    /// (0 drops it). Transforms only.
    pub const EMIT: u32 = 1;
    /// "2 retry": try the row again after `argument` milliseconds.
    pub const RETRY: u32 = 2;
    /// "3 dead-letter": give up on the row, with the reason `reasons[argument]`.
    pub const DEAD_LETTER: u32 = 3;

    /// One row's outcome as packed: the code is kept as a number, since a
    /// reader must be able to name a code it does not know.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Record {
        pub code: u32,
        pub argument: u32,
    }

    impl Record {
        #[inline]
        pub const fn ok() -> Record {
            Record {
                code: OK,
                argument: 0,
            }
        }

        /// Replaced by the next `rows` emitted rows.
        #[inline]
        pub const fn emit(rows: u32) -> Record {
            Record {
                code: EMIT,
                argument: rows,
            }
        }

        #[inline]
        pub const fn retry(after_ms: u32) -> Record {
            Record {
                code: RETRY,
                argument: after_ms,
            }
        }

        /// Dead-lettered with `reasons[reason]`.
        #[inline]
        pub const fn dead_letter(reason: u32) -> Record {
            Record {
                code: DEAD_LETTER,
                argument: reason,
            }
        }

        /// Outcome `index` of `outcomes`, if `outcomes` holds it.
        #[inline]
        pub fn read(outcomes: &[u32], index: usize) -> Option<Record> {
            item::<WIDTH>(outcomes, index).map(Record::decode)
        }

        /// Its numbers, to append to `outcomes`.
        #[inline]
        pub fn encode(self) -> [u32; WIDTH] {
            let mut n = [0; WIDTH];
            n[CODE] = self.code;
            n[ARGUMENT] = self.argument;
            n
        }

        /// An outcome from its numbers.
        #[inline]
        pub fn decode(n: &[u32; WIDTH]) -> Record {
            Record {
                code: n[CODE],
                argument: n[ARGUMENT],
            }
        }
    }

    /// The outcomes packed in `outcomes`, in order (a partial one at the end
    /// is not one).
    #[inline]
    pub fn records(outcomes: &[u32]) -> impl ExactSizeIterator<Item = Record> + '_ {
        outcomes.as_chunks::<WIDTH>().0.iter().map(Record::decode)
    }
}

/// `transformed.emitted`: per emitted row, where its table, payload and
/// headers lie.
pub mod emitted {
    use super::{Span, item};

    /// Numbers per emitted row: "Six numbers per emitted row".
    pub const WIDTH: usize = 6;
    /// Offset and length in `data` of its table ([`SAME_TABLE`] as the length
    /// keeps the input's table).
    pub const TABLE: usize = 0;
    /// Offset and length in `data` of its payload.
    pub const PAYLOAD: usize = 2;
    /// Its first header in `headers` (counted in headers) and how many it has.
    pub const HEADERS: usize = 4;
    /// A table length meaning "the input row's table": "length 4294967295
    /// keeps the input's table". Its offset is written as 0 and never read.
    pub const SAME_TABLE: u32 = u32::MAX;

    /// One emitted row's numbers.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Record {
        /// None keeps the input row's table.
        pub table: Option<Span>,
        pub payload: Span,
        /// First header and count, in headers.
        pub headers: Span,
    }

    impl Record {
        /// Emitted row `index` of `emitted`, if `emitted` holds it.
        #[inline]
        pub fn read(emitted: &[u32], index: usize) -> Option<Record> {
            let n = item::<WIDTH>(emitted, index)?;
            Some(Record {
                table: (n[TABLE + 1] != SAME_TABLE).then(|| Span::new(n[TABLE], n[TABLE + 1])),
                payload: Span::new(n[PAYLOAD], n[PAYLOAD + 1]),
                headers: Span::new(n[HEADERS], n[HEADERS + 1]),
            })
        }

        /// Its numbers, to append to `emitted`.
        #[inline]
        pub fn encode(self) -> [u32; WIDTH] {
            let table = self.table.unwrap_or(Span::new(0, SAME_TABLE));
            let mut n = [0; WIDTH];
            (n[TABLE], n[TABLE + 1]) = (table.offset, table.len);
            (n[PAYLOAD], n[PAYLOAD + 1]) = (self.payload.offset, self.payload.len);
            (n[HEADERS], n[HEADERS + 1]) = (self.headers.offset, self.headers.len);
            n
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contract these constants encode, in the WIT's own words: a change
    /// on either side fails here until the other follows.
    #[test]
    fn the_constants_are_what_the_wit_says() {
        let wit = include_str!("../../../wit/types.wit");
        for (said, constant, value) in [
            ("Eight numbers per row", row::WIDTH as u32, 8),
            ("Four numbers per header", header::WIDTH as u32, 4),
            ("Two numbers per input row", outcome::WIDTH as u32, 2),
            ("Six numbers per emitted row", emitted::WIDTH as u32, 6),
            ("0 ok:", outcome::OK, 0),
            ("1 emit:", outcome::EMIT, 1),
            ("2 retry:", outcome::RETRY, 2),
            ("3 dead-letter:", outcome::DEAD_LETTER, 3),
            (
                "length 4294967295 keeps",
                emitted::SAME_TABLE,
                4_294_967_295,
            ),
        ] {
            assert!(wit.contains(said), "wit/types.wit no longer says {said:?}");
            assert_eq!(constant, value, "{said}");
        }
    }

    /// Field order as the WIT lists it: each record's numbers in place.
    #[test]
    fn records_put_each_field_where_the_wit_says() {
        let span = |a, b| Span::new(a, b);
        let row = row::Record {
            tenant: span(1, 2),
            table: span(3, 4),
            payload: span(5, 6),
            headers: span(7, 8),
        };
        assert_eq!(row.encode(), [1, 2, 3, 4, 5, 6, 7, 8]);
        let header = header::Record {
            name: span(1, 2),
            value: span(3, 4),
        };
        assert_eq!(header.encode(), [1, 2, 3, 4]);
        let emitted = emitted::Record {
            table: Some(span(1, 2)),
            payload: span(3, 4),
            headers: span(5, 6),
        };
        assert_eq!(emitted.encode(), [1, 2, 3, 4, 5, 6]);
        let same_table = emitted::Record {
            table: None,
            ..emitted
        };
        assert_eq!(same_table.encode(), [0, u32::MAX, 3, 4, 5, 6]);
        assert_eq!(outcome::Record::ok().encode(), [0, 0]);
        assert_eq!(outcome::Record::emit(5).encode(), [1, 5]);
        assert_eq!(outcome::Record::retry(500).encode(), [2, 500]);
        assert_eq!(outcome::Record::dead_letter(7).encode(), [3, 7]);
    }

    #[test]
    fn records_read_back_as_written_and_none_past_the_end() {
        let first = row::Record {
            tenant: Span::new(0, 4),
            ..row::Record::default()
        };
        let second = row::Record {
            payload: Span::new(9, 1),
            headers: Span::new(2, 1),
            ..row::Record::default()
        };
        let mut rows = [0; 2 * row::WIDTH + 3];
        rows[..row::WIDTH].copy_from_slice(&first.encode());
        rows[row::WIDTH..2 * row::WIDTH].copy_from_slice(&second.encode());
        assert_eq!(row::Record::read(&rows, 0), Some(first));
        assert_eq!(row::Record::read(&rows, 1), Some(second));
        // Three stray numbers are not a row; no index overflows.
        assert_eq!(row::Record::read(&rows, 2), None);
        assert_eq!(row::Record::read(&rows, usize::MAX), None);

        let same_table = emitted::Record {
            table: None,
            payload: Span::new(1, 2),
            headers: Span::new(0, 0),
        };
        assert_eq!(
            emitted::Record::read(&same_table.encode(), 0),
            Some(same_table)
        );
        let outcomes = [outcome::RETRY, 250, 9, 1];
        assert_eq!(
            outcome::Record::read(&outcomes, 0),
            Some(outcome::Record::retry(250))
        );
        // An unknown code reads as it is, for the reader to refuse by name.
        assert_eq!(outcome::Record::read(&outcomes, 1).map(|o| o.code), Some(9));
        assert_eq!(outcome::Record::read(&outcomes, 2), None);
        assert!(outcome::records(&outcomes[..3]).eq([outcome::Record::retry(250)]));
    }

    #[test]
    fn header_runs_are_clamped_to_what_the_list_holds() {
        let a = header::Record {
            name: Span::new(0, 1),
            value: Span::new(1, 2),
        };
        let b = header::Record {
            name: Span::new(3, 1),
            value: Span::new(4, 0),
        };
        let mut headers = [0; 2 * header::WIDTH];
        headers[..header::WIDTH].copy_from_slice(&a.encode());
        headers[header::WIDTH..].copy_from_slice(&b.encode());
        let all = header::run(&headers, Span::new(0, 2));
        assert!(header::records(all).eq([a, b]));
        assert!(header::records(header::run(&headers, Span::new(1, 1))).eq([b]));
        // Past the end: fewer (or no) headers, never a panic.
        assert_eq!(
            header::records(header::run(&headers, Span::new(1, 5))).len(),
            1
        );
        assert_eq!(header::run(&headers, Span::new(3, 1)), &[] as &[u32]);
        assert_eq!(
            header::run(&headers, Span::new(u32::MAX, u32::MAX)),
            &[] as &[u32]
        );
        assert_eq!(header::Record::read(&headers, 1), Some(b));
        assert_eq!(header::Record::read(&headers, 2), None);
    }

    #[test]
    fn spans_saturate() {
        assert_eq!(Span::new(3, 4).range(), 3..7);
        assert_eq!(Span::new(u32::MAX, u32::MAX).get(b"abc".as_slice()), None);
        assert_eq!(Span::new(1, 2).get(b"abc".as_slice()), Some(&b"bc"[..]));
        assert_eq!(Span::from_range(5..9), Span::new(5, 4));
        let (start, end) = (9, 5);
        assert_eq!(Span::from_range(start..end), Span::new(9, 0));
        assert_eq!(number(7), 7);
        assert_eq!(number(usize::MAX), u32::MAX);
    }
}
