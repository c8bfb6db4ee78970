//! The packed batch layout of `weir:plugin@0.3.0`, defined once for the host and the guest SDK.
//!
//! `wit/types.wit` packs a batch (`batch`) and a plugin's answer
//! (`transformed`, `delivered`) as one byte buffer plus flat lists of
//! numbers, each list a `list<u8>` of little-endian u32s (u64s for
//! `batch.sequences`): bytes cross the boundary as one copy in every
//! guest language, where componentize-py moves a `list<u32>` number by
//! number. WIT can only say in prose which number means what; this crate
//! says it in code: each list's width, where each field lies in it, the
//! outcome codes and the "same table" sentinel, and records that write and
//! read them. The host (`host/src/delivery/batch.rs`) and the SDK
//! (`plugins/sdk`) both go through it, so the two sides of the boundary
//! cannot drift apart.
//!
//! Lists, one module each:
//!
//! | list                                      | module      | numbers per item |
//! |-------------------------------------------|-------------|------------------|
//! | `batch.rows`                              | [`row`]     | [`row::WIDTH`]   |
//! | `batch.headers`, `transformed.headers`    | [`header`]  | [`header::WIDTH`]|
//! | `transformed.outcomes`, `delivered.outcomes` | [`outcome`] | [`outcome::WIDTH`] |
//! | `transformed.emitted`                     | [`emitted`] | [`emitted::WIDTH`] |
//! | `batch.sequences` (u64), `batch.attempts` | [`numbers`] | 1                |
//!
//! Reading never panics: an item past the end of its list is `None`, a
//! span's arithmetic saturates, bytes short of a whole item are not one.
//! What a short or out-of-bounds answer means (a broken plugin, a broken
//! host) is the caller's to decide.
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
//! rows.extend_from_slice(&packed.encode());
//! assert_eq!(rows.len(), row::BYTES);
//! assert_eq!(row::Record::read(&rows, 0), Some(packed));
//! assert_eq!(row::Record::read(&rows, 1), None);
//! ```

#![no_std]

use core::ops::Range;

/// Bytes of one u32 in a packed list (little-endian).
pub const U32: usize = 4;
/// Bytes of one u64 in a packed list (little-endian): `batch.sequences`.
pub const U64: usize = 8;

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

/// The numbers of one item of `BYTES` bytes (`WIDTH` little-endian u32s).
#[inline]
fn decode<const WIDTH: usize, const BYTES: usize>(bytes: &[u8; BYTES]) -> [u32; WIDTH] {
    const { assert!(BYTES == WIDTH * U32) };
    let mut n = [0; WIDTH];
    for (number, chunk) in n.iter_mut().zip(bytes.as_chunks::<U32>().0) {
        *number = u32::from_le_bytes(*chunk);
    }
    n
}

/// `WIDTH` numbers as the `BYTES` little-endian bytes that carry them.
#[inline]
fn encode<const WIDTH: usize, const BYTES: usize>(n: [u32; WIDTH]) -> [u8; BYTES] {
    const { assert!(BYTES == WIDTH * U32) };
    let mut bytes = [0; BYTES];
    for (chunk, number) in bytes.as_chunks_mut::<U32>().0.iter_mut().zip(n) {
        *chunk = number.to_le_bytes();
    }
    bytes
}

/// Item `index` of a list of `BYTES` bytes per item, if the list holds it
/// whole. Fixed-size arrays let every field index below be checked when it
/// compiles.
#[inline]
fn item<const WIDTH: usize, const BYTES: usize>(list: &[u8], index: usize) -> Option<[u32; WIDTH]> {
    list.as_chunks::<BYTES>().0.get(index).map(decode)
}

/// `batch.sequences` and `batch.attempts`: one little-endian number per row.
pub mod numbers {
    use super::{U32, U64};

    /// Number `index` of a list of u32s, if the list holds it whole.
    #[inline]
    pub fn u32_at(list: &[u8], index: usize) -> Option<u32> {
        list.as_chunks::<U32>()
            .0
            .get(index)
            .map(|n| u32::from_le_bytes(*n))
    }

    /// Number `index` of a list of u64s, if the list holds it whole.
    #[inline]
    pub fn u64_at(list: &[u8], index: usize) -> Option<u64> {
        list.as_chunks::<U64>()
            .0
            .get(index)
            .map(|n| u64::from_le_bytes(*n))
    }
}

/// `batch.rows`: per row, where its tenant, table, payload and headers lie.
pub mod row {
    use super::{Span, U32, item};

    /// Numbers per row: "Eight numbers per row, row `i` from byte `32 × i`".
    pub const WIDTH: usize = 8;
    /// Bytes per row.
    pub const BYTES: usize = WIDTH * U32;
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
        pub fn read(rows: &[u8], index: usize) -> Option<Record> {
            let n = item::<WIDTH, BYTES>(rows, index)?;
            Some(Record {
                tenant: Span::new(n[TENANT], n[TENANT + 1]),
                table: Span::new(n[TABLE], n[TABLE + 1]),
                payload: Span::new(n[PAYLOAD], n[PAYLOAD + 1]),
                headers: Span::new(n[HEADERS], n[HEADERS + 1]),
            })
        }

        /// Its numbers.
        #[inline]
        pub fn numbers(self) -> [u32; WIDTH] {
            let mut n = [0; WIDTH];
            (n[TENANT], n[TENANT + 1]) = (self.tenant.offset, self.tenant.len);
            (n[TABLE], n[TABLE + 1]) = (self.table.offset, self.table.len);
            (n[PAYLOAD], n[PAYLOAD + 1]) = (self.payload.offset, self.payload.len);
            (n[HEADERS], n[HEADERS + 1]) = (self.headers.offset, self.headers.len);
            n
        }

        /// Its bytes, to append to `rows`.
        #[inline]
        pub fn encode(self) -> [u8; BYTES] {
            super::encode(self.numbers())
        }
    }
}

/// `headers` of a batch or of a transform's answer: per header, where its
/// name and value lie in `data`.
pub mod header {
    use super::{Span, U32, item};

    /// Numbers per header: "Four numbers per header".
    pub const WIDTH: usize = 4;
    /// Bytes per header.
    pub const BYTES: usize = WIDTH * U32;
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
        pub fn read(headers: &[u8], index: usize) -> Option<Record> {
            item::<WIDTH, BYTES>(headers, index).map(Record::from_numbers)
        }

        /// A header from its bytes.
        #[inline]
        pub fn decode(bytes: &[u8; BYTES]) -> Record {
            Record::from_numbers(super::decode(bytes))
        }

        fn from_numbers(n: [u32; WIDTH]) -> Record {
            Record {
                name: Span::new(n[NAME], n[NAME + 1]),
                value: Span::new(n[VALUE], n[VALUE + 1]),
            }
        }

        /// Its numbers.
        #[inline]
        pub fn numbers(self) -> [u32; WIDTH] {
            let mut n = [0; WIDTH];
            (n[NAME], n[NAME + 1]) = (self.name.offset, self.name.len);
            (n[VALUE], n[VALUE + 1]) = (self.value.offset, self.value.len);
            n
        }

        /// Its bytes, to append to `headers`.
        #[inline]
        pub fn encode(self) -> [u8; BYTES] {
            super::encode(self.numbers())
        }
    }

    /// The bytes of the headers `run` (first header, count) picks from
    /// `headers`: as many of them as `headers` holds, so a caller that needs
    /// them all compares [`records`]' length with `run.len`.
    #[inline]
    pub fn run(headers: &[u8], run: Span) -> &[u8] {
        let start = (run.offset as usize).saturating_mul(BYTES);
        let len = (run.len as usize).saturating_mul(BYTES);
        let tail = headers.get(start..).unwrap_or_default();
        tail.get(..len).unwrap_or(tail)
    }

    /// How many whole headers `headers` holds.
    #[inline]
    pub fn count(headers: &[u8]) -> usize {
        headers.len() / BYTES
    }

    /// The headers packed in `bytes`, in order (a partial header at the
    /// end is not one).
    #[inline]
    pub fn records(bytes: &[u8]) -> impl ExactSizeIterator<Item = Record> + '_ {
        bytes.as_chunks::<BYTES>().0.iter().map(Record::decode)
    }
}

/// `outcomes` of `transformed` and `delivered`: per input row, in order, an
/// outcome code and its argument.
pub mod outcome {
    use super::{U32, item};

    /// Numbers per outcome: "Two numbers per input row, in order".
    pub const WIDTH: usize = 2;
    /// Bytes per outcome.
    pub const BYTES: usize = WIDTH * U32;
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
        pub fn read(outcomes: &[u8], index: usize) -> Option<Record> {
            item::<WIDTH, BYTES>(outcomes, index).map(Record::from_numbers)
        }

        /// Its numbers.
        #[inline]
        pub fn numbers(self) -> [u32; WIDTH] {
            let mut n = [0; WIDTH];
            n[CODE] = self.code;
            n[ARGUMENT] = self.argument;
            n
        }

        /// Its bytes, to append to `outcomes`.
        #[inline]
        pub fn encode(self) -> [u8; BYTES] {
            super::encode(self.numbers())
        }

        /// An outcome from its bytes.
        #[inline]
        pub fn decode(bytes: &[u8; BYTES]) -> Record {
            Record::from_numbers(super::decode(bytes))
        }

        fn from_numbers(n: [u32; WIDTH]) -> Record {
            Record {
                code: n[CODE],
                argument: n[ARGUMENT],
            }
        }
    }

    /// How many whole outcomes `outcomes` holds.
    #[inline]
    pub fn count(outcomes: &[u8]) -> usize {
        outcomes.len() / BYTES
    }

    /// The outcomes packed in `outcomes`, in order (a partial one at the end
    /// is not one).
    #[inline]
    pub fn records(outcomes: &[u8]) -> impl ExactSizeIterator<Item = Record> + '_ {
        outcomes.as_chunks::<BYTES>().0.iter().map(Record::decode)
    }
}

/// `transformed.emitted`: per emitted row, where its table, payload and
/// headers lie.
pub mod emitted {
    use super::{Span, U32, item};

    /// Numbers per emitted row: "Six numbers per emitted row".
    pub const WIDTH: usize = 6;
    /// Bytes per emitted row.
    pub const BYTES: usize = WIDTH * U32;
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
        pub fn read(emitted: &[u8], index: usize) -> Option<Record> {
            let n = item::<WIDTH, BYTES>(emitted, index)?;
            Some(Record {
                table: (n[TABLE + 1] != SAME_TABLE).then(|| Span::new(n[TABLE], n[TABLE + 1])),
                payload: Span::new(n[PAYLOAD], n[PAYLOAD + 1]),
                headers: Span::new(n[HEADERS], n[HEADERS + 1]),
            })
        }

        /// Its numbers.
        #[inline]
        pub fn numbers(self) -> [u32; WIDTH] {
            let table = self.table.unwrap_or(Span::new(0, SAME_TABLE));
            let mut n = [0; WIDTH];
            (n[TABLE], n[TABLE + 1]) = (table.offset, table.len);
            (n[PAYLOAD], n[PAYLOAD + 1]) = (self.payload.offset, self.payload.len);
            (n[HEADERS], n[HEADERS + 1]) = (self.headers.offset, self.headers.len);
            n
        }

        /// Its bytes, to append to `emitted`.
        #[inline]
        pub fn encode(self) -> [u8; BYTES] {
            super::encode(self.numbers())
        }
    }

    /// How many whole emitted rows `emitted` holds.
    #[inline]
    pub fn count(emitted: &[u8]) -> usize {
        emitted.len() / BYTES
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
            ("little-endian u32", U32 as u32, 4),
            ("little-endian u64", U64 as u32, 8),
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

    /// Field order as the WIT lists it: each record's numbers in place, and
    /// each number as its four little-endian bytes.
    #[test]
    fn records_put_each_field_where_the_wit_says() {
        let span = |a, b| Span::new(a, b);
        let row = row::Record {
            tenant: span(1, 2),
            table: span(3, 4),
            payload: span(5, 6),
            headers: span(7, 8),
        };
        assert_eq!(row.numbers(), [1, 2, 3, 4, 5, 6, 7, 8]);
        let header = header::Record {
            name: span(1, 2),
            value: span(3, 0x0102_0304),
        };
        assert_eq!(header.numbers(), [1, 2, 3, 0x0102_0304]);
        assert_eq!(
            header.encode(),
            [1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 3, 2, 1]
        );
        let emitted = emitted::Record {
            table: Some(span(1, 2)),
            payload: span(3, 4),
            headers: span(5, 6),
        };
        assert_eq!(emitted.numbers(), [1, 2, 3, 4, 5, 6]);
        let same_table = emitted::Record {
            table: None,
            ..emitted
        };
        assert_eq!(same_table.numbers(), [0, u32::MAX, 3, 4, 5, 6]);
        assert_eq!(&same_table.encode()[4..8], &[0xff; 4]);
        assert_eq!(outcome::Record::ok().numbers(), [0, 0]);
        assert_eq!(outcome::Record::emit(5).numbers(), [1, 5]);
        assert_eq!(outcome::Record::retry(500).numbers(), [2, 500]);
        assert_eq!(
            outcome::Record::retry(500).encode(),
            [2, 0, 0, 0, 0xf4, 1, 0, 0]
        );
        assert_eq!(outcome::Record::dead_letter(7).numbers(), [3, 7]);
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
        let mut rows = [0; 2 * row::BYTES + 3];
        rows[..row::BYTES].copy_from_slice(&first.encode());
        rows[row::BYTES..2 * row::BYTES].copy_from_slice(&second.encode());
        assert_eq!(row::Record::read(&rows, 0), Some(first));
        assert_eq!(row::Record::read(&rows, 1), Some(second));
        // Three stray bytes are not a row; no index overflows.
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
        let mut outcomes = [0; 2 * outcome::BYTES];
        outcomes[..outcome::BYTES].copy_from_slice(&outcome::Record::retry(250).encode());
        outcomes[outcome::BYTES..].copy_from_slice(
            &outcome::Record {
                code: 9,
                argument: 1,
            }
            .encode(),
        );
        assert_eq!(
            outcome::Record::read(&outcomes, 0),
            Some(outcome::Record::retry(250))
        );
        // An unknown code reads as it is, for the reader to refuse by name.
        assert_eq!(outcome::Record::read(&outcomes, 1).map(|o| o.code), Some(9));
        assert_eq!(outcome::Record::read(&outcomes, 2), None);
        assert_eq!(outcome::count(&outcomes[..outcome::BYTES + 5]), 1);
        assert!(
            outcome::records(&outcomes[..outcome::BYTES + 5]).eq([outcome::Record::retry(250)])
        );
    }

    #[test]
    fn per_row_numbers_read_little_endian_and_none_past_the_end() {
        let mut sequences = [0u8; 2 * U64 + 1];
        sequences[U64..2 * U64].copy_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(numbers::u64_at(&sequences, 0), Some(0));
        assert_eq!(numbers::u64_at(&sequences, 1), Some(0x0102_0304_0506_0708));
        assert_eq!(numbers::u64_at(&sequences, 2), None);
        let attempts = [1, 0, 0, 0, 2, 0, 0];
        assert_eq!(numbers::u32_at(&attempts, 0), Some(1));
        assert_eq!(numbers::u32_at(&attempts, 1), None);
        assert_eq!(numbers::u32_at(&attempts, usize::MAX), None);
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
        let mut headers = [0; 2 * header::BYTES];
        headers[..header::BYTES].copy_from_slice(&a.encode());
        headers[header::BYTES..].copy_from_slice(&b.encode());
        assert_eq!(header::count(&headers), 2);
        let all = header::run(&headers, Span::new(0, 2));
        assert!(header::records(all).eq([a, b]));
        assert!(header::records(header::run(&headers, Span::new(1, 1))).eq([b]));
        // Past the end: fewer (or no) headers, never a panic.
        assert_eq!(
            header::records(header::run(&headers, Span::new(1, 5))).len(),
            1
        );
        assert_eq!(header::run(&headers, Span::new(3, 1)), &[] as &[u8]);
        assert_eq!(
            header::run(&headers, Span::new(u32::MAX, u32::MAX)),
            &[] as &[u8]
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
