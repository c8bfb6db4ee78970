//! Where a send stopped, as its error says it: the input's place and
//! what had been accepted around it.

use std::fmt;

/// Where in the input a chunk failed: a line when the server named one,
/// else the chunk's lines.
#[derive(Debug, Clone)]
pub struct Place {
    pub input: String,
    pub line: Option<usize>,
    pub first_line: usize,
    pub last_line: usize,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}", self.input),
            None => write!(
                f,
                "{}, lines {}-{}",
                self.input, self.first_line, self.last_line
            ),
        }
    }
}

/// What had been accepted when a send stopped at a chunk; displays as a
/// `; …` clause, or nothing when there is no chunk to speak of.
#[derive(Debug, Clone, Default)]
pub struct Sent {
    /// The failed chunk's first and last lines.
    pub lines: Option<(usize, usize)>,
    /// Rows accepted from the chunks before it: all of them were.
    pub before: u64,
    /// Rows accepted from chunks after it (that were in flight).
    pub after: u64,
}

impl fmt::Display for Sent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some((first, last)) = self.lines else {
            return Ok(());
        };
        if self.before == 0 && self.after == 0 {
            return Ok(());
        }
        write!(
            f,
            "; {} rows before line {first} were accepted",
            self.before
        )?;
        if self.after > 0 {
            write!(f, ", and {} after line {last}", self.after)?;
        }
        Ok(())
    }
}
