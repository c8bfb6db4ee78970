//! The input of `weir send` cut into chunks of whole lines, each with the
//! numbers of its lines, so the server's line numbers map back to the
//! input and a too-long line is named without reading it all.

use std::io::BufRead;

/// A line longer than this is refused before it is read further: NATS
/// stores at most 64 MiB in a message, so it could never be accepted.
pub(super) const MAX_LINE_BYTES: usize = 64 << 20;

/// Why the reader stopped, at which line of the input, in the chunk
/// from which line (none of whose rows were sent).
#[derive(Debug)]
pub(super) struct ReadError {
    pub(super) first_line: usize,
    pub(super) line: usize,
    pub(super) cause: ReadCause,
}

#[derive(Debug)]
pub(super) enum ReadCause {
    Io(std::io::Error),
    LineTooLong,
}

/// A run of whole lines of the input: at most `chunk_rows` rows (blank
/// lines are kept, so that the server's line numbers map back, but do not
/// count) and at most `chunk_bytes` bytes unless its one line is longer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Chunk {
    pub(super) first_line: usize,
    pub(super) last_line: usize,
    pub(super) rows: usize,
    pub(super) bytes: Vec<u8>,
}

/// Cuts a reader into chunks without holding more than one in memory.
pub(super) struct Chunker<R> {
    reader: R,
    max_rows: usize,
    max_bytes: usize,
    max_line: usize,
    /// The number of the next line to read.
    next_line: usize,
    /// A line read that did not fit the previous chunk.
    carried: Option<Vec<u8>>,
}

impl<R: BufRead> Chunker<R> {
    pub(super) fn new(reader: R, max_rows: usize, max_bytes: usize) -> Chunker<R> {
        Chunker {
            reader,
            max_rows: max_rows.max(1),
            max_bytes: max_bytes.max(1),
            max_line: MAX_LINE_BYTES,
            next_line: 1,
            carried: None,
        }
    }

    /// The next chunk holding at least one row, or `None` at the end.
    pub(super) fn next_chunk(&mut self) -> Result<Option<Chunk>, ReadError> {
        loop {
            match self.read_chunk()? {
                None => return Ok(None),
                // Blank lines alone are not worth a request (and a 400).
                Some(chunk) if chunk.rows == 0 => continue,
                Some(chunk) => return Ok(Some(chunk)),
            }
        }
    }

    fn read_chunk(&mut self) -> Result<Option<Chunk>, ReadError> {
        let first_line = self.next_line;
        let mut bytes = self.carried.take().unwrap_or_default();
        let (mut lines, mut rows) = (0, 0);
        if !bytes.is_empty() {
            lines += 1;
            self.next_line += 1;
            rows += usize::from(!is_blank(&bytes));
        }
        while rows < self.max_rows {
            let start = bytes.len();
            let read = self.read_line(&mut bytes).map_err(|cause| ReadError {
                first_line,
                line: self.next_line,
                cause,
            })?;
            if read == 0 {
                break;
            }
            if bytes.len() > self.max_bytes && lines > 0 {
                self.carried = Some(bytes.split_off(start));
                break;
            }
            lines += 1;
            self.next_line += 1;
            rows += usize::from(!is_blank(&bytes[start..]));
        }
        if lines == 0 {
            return Ok(None);
        }
        Ok(Some(Chunk {
            first_line,
            last_line: first_line + lines - 1,
            rows,
            bytes,
        }))
    }

    /// Appends the next line (with its `\n`, when it has one) to `out`;
    /// returns its length, 0 at the end of the input.
    fn read_line(&mut self, out: &mut Vec<u8>) -> Result<usize, ReadCause> {
        let start = out.len();
        loop {
            let available = match self.reader.fill_buf() {
                Ok(available) => available,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(cause) => return Err(ReadCause::Io(cause)),
            };
            if available.is_empty() {
                break;
            }
            let (take, ends) = match available.iter().position(|b| *b == b'\n') {
                Some(newline) => (newline + 1, true),
                None => (available.len(), false),
            };
            if out.len() - start + take > self.max_line.saturating_add(1) {
                return Err(ReadCause::LineTooLong);
            }
            out.extend_from_slice(&available[..take]);
            self.reader.consume(take);
            if ends {
                break;
            }
        }
        Ok(out.len() - start)
    }
}

/// Blank as the front door sees it: nothing but whitespace.
fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks_of(text: &[u8], rows: usize, bytes: usize) -> Vec<Chunk> {
        let mut chunker = Chunker::new(text, rows, bytes);
        std::iter::from_fn(|| chunker.next_chunk().expect("reads from memory")).collect()
    }

    fn summary(chunks: &[Chunk]) -> Vec<(usize, usize, usize, &[u8])> {
        chunks
            .iter()
            .map(|c| (c.first_line, c.last_line, c.rows, &c.bytes[..]))
            .collect()
    }

    #[test]
    fn chunks_keep_whole_lines_and_their_numbers_across_boundaries() {
        let chunks = chunks_of(b"a\nb\nc\nd\ne", 2, 1 << 20);
        assert_eq!(
            summary(&chunks),
            vec![
                (1, 2, 2, &b"a\nb\n"[..]),
                (3, 4, 2, &b"c\nd\n"[..]),
                (5, 5, 1, &b"e"[..])
            ]
        );
    }

    #[test]
    fn a_final_line_without_newline_is_sent_as_it_is() {
        let chunks = chunks_of(b"{\"a\":1}\n{\"b\":2}", 10, 1 << 20);
        assert_eq!(
            summary(&chunks),
            vec![(1, 2, 2, &b"{\"a\":1}\n{\"b\":2}"[..])]
        );
        assert!(chunks_of(b"", 10, 1 << 20).is_empty());
    }

    #[test]
    fn blank_lines_are_kept_for_numbering_but_are_not_rows() {
        // Two rows per chunk: the blank lines ride along without counting,
        // and a tail of blank lines alone is not a chunk.
        let chunks = chunks_of(b"a\n\nb\n \r\nc\nd\n\n\n", 2, 1 << 20);
        assert_eq!(
            summary(&chunks),
            vec![(1, 3, 2, &b"a\n\nb\n"[..]), (4, 6, 2, &b" \r\nc\nd\n"[..])]
        );
        assert!(chunks_of(b"\n\n  \n", 1, 1 << 20).is_empty());
    }

    #[test]
    fn a_chunk_closes_at_the_byte_cap_and_the_line_goes_to_the_next() {
        // 4-byte lines, an 8-byte cap: two lines per chunk though 10 rows
        // would be allowed.
        let chunks = chunks_of(b"aaa\nbbb\nccc\nddd\ne", 10, 8);
        assert_eq!(
            summary(&chunks),
            vec![
                (1, 2, 2, &b"aaa\nbbb\n"[..]),
                (3, 4, 2, &b"ccc\nddd\n"[..]),
                (5, 5, 1, &b"e"[..])
            ]
        );
        // A line longer than the cap travels alone.
        let chunks = chunks_of(b"a\nlong line\nb\n", 10, 4);
        assert_eq!(
            summary(&chunks),
            vec![
                (1, 1, 1, &b"a\n"[..]),
                (2, 2, 1, &b"long line\n"[..]),
                (3, 3, 1, &b"b\n"[..])
            ]
        );
    }

    #[test]
    fn blank_lines_past_the_byte_cap_do_not_shift_line_numbers() {
        let chunks = chunks_of(b"a\n\n\n\n\nb\n", 10, 3);
        assert_eq!(
            summary(&chunks),
            vec![(1, 2, 1, &b"a\n\n"[..]), (6, 6, 1, &b"b\n"[..])]
        );
    }

    #[test]
    fn a_line_past_the_longest_allowed_is_named_without_reading_it_all() {
        let text = b"{}\n0123456789abcdef\n{}\n";
        let mut chunker = Chunker::new(&text[..], 1, 1 << 20);
        chunker.max_line = 8;
        assert!(matches!(chunker.next_chunk(), Ok(Some(_))));
        assert!(matches!(
            chunker.next_chunk(),
            Err(ReadError {
                first_line: 2,
                line: 2,
                cause: ReadCause::LineTooLong
            })
        ));
        // Mid-chunk: the chunk's earlier lines are named as not sent.
        let mut chunker = Chunker::new(&text[..], 10, 1 << 20);
        chunker.max_line = 8;
        assert!(matches!(
            chunker.next_chunk(),
            Err(ReadError {
                first_line: 1,
                line: 2,
                cause: ReadCause::LineTooLong
            })
        ));
    }
}
