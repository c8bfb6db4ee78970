//! Transforms: the [`Transform`] trait a validating, transforming or
//! enriching plugin implements, and [`Outcomes`], where it writes what it
//! decided for each row.
//!
//! [`export_transform!`](crate::export_transform) exports an implementation.

pub use crate::bindings::transform::{Batch, Transformed};
#[doc(hidden)]
pub use crate::bindings::transform::{Guest, weir};

use weir_layout::{emitted, header, outcome};

use crate::answer::Answer;
use crate::packed::{Packer, bytes, text};
use crate::rows::{Row, Rows};
use crate::slot::Slot;

/// A pipeline step that validates, transforms or enriches rows.
pub trait Transform: Sized + 'static {
    /// Called once per instance before any batch, with the plugin's settings
    /// table from the TOML as a JSON object. An error refuses the plugin.
    fn init(settings: String) -> Result<Self, String>;

    /// Decides every row of `rows`, in order: one call on `out` per row
    /// ([`Outcomes::ok`], [`Outcomes::replace_with`], [`Outcomes::emit`],
    /// [`Outcomes::discard`], [`Outcomes::retry`], [`Outcomes::dead_letter`]).
    fn transform(&mut self, rows: &Rows, out: &mut Outcomes);
}

/// What a transform decided for each row of a batch, packed the way the host
/// reads it: emitted rows' bytes go straight into one buffer.
pub struct Outcomes {
    answer: Answer,
    packer: Packer,
    /// [`emitted::BYTES`] bytes (little-endian numbers) per emitted row.
    emitted: Vec<u8>,
}

/// A row to emit: `table` none keeps the input row's table.
#[derive(Debug, Clone, Copy, Default)]
pub struct Emitted<'a> {
    pub table: Option<&'a str>,
    pub payload: &'a [u8],
    pub headers: &'a [(&'a str, &'a str)],
}

impl Outcomes {
    /// Room for the outcomes of `rows` rows.
    pub fn with_capacity(rows: usize) -> Outcomes {
        Outcomes {
            answer: Answer::with_capacity(rows),
            packer: Packer::default(),
            emitted: Vec::new(),
        }
    }

    /// Pass the row on unchanged.
    pub fn ok(&mut self) {
        self.answer.ok();
    }

    /// Try the row again after `after_ms` milliseconds.
    pub fn retry(&mut self, after_ms: u32) {
        self.answer.retry(after_ms);
    }

    /// Give up on the row: it is dead-lettered with `reason`.
    pub fn dead_letter(&mut self, reason: impl Into<String>) {
        self.answer.dead_letter(reason.into());
    }

    /// Drop the row: it emits nothing and is acked.
    pub fn discard(&mut self) {
        self.answer.emit(0);
    }

    /// Replace `row` by one row with its table and headers, and the payload
    /// `write` appends to the buffer it is given (e.g. `serde_json::to_writer`).
    pub fn replace_with(&mut self, row: &Row<'_>, write: impl FnOnce(&mut Vec<u8>)) {
        let record = emitted::Record {
            table: None,
            payload: self.packer.append_with(write),
            headers: self.packer.headers(row.headers()),
        };
        self.emitted.extend_from_slice(&record.encode());
        self.answer.emit(1);
    }

    /// Replace the row by `rows` (none drops it).
    pub fn emit<'a>(&mut self, rows: impl IntoIterator<Item = Emitted<'a>>) {
        let mut count = 0;
        for row in rows {
            let record = emitted::Record {
                table: row.table.map(|table| self.packer.append(table.as_bytes())),
                payload: self.packer.append(row.payload),
                headers: self.packer.headers(row.headers.iter().copied()),
            };
            self.emitted.extend_from_slice(&record.encode());
            count += 1;
        }
        self.answer.emit(count);
    }

    /// How many rows have been decided.
    pub fn len(&self) -> usize {
        self.answer.len()
    }

    pub fn is_empty(&self) -> bool {
        self.answer.len() == 0
    }

    /// The decisions so far, readable: for a plugin's own tests.
    pub fn decided(&self) -> Vec<Outcome> {
        let mut next_emitted = 0;
        self.answer
            .records()
            .map(|decided| match decided.code {
                outcome::EMIT => {
                    let first = next_emitted;
                    next_emitted += decided.argument as usize;
                    Outcome::Emit(
                        (first..next_emitted)
                            .filter_map(|index| emitted::Record::read(&self.emitted, index))
                            .map(|record| self.emitted_row(record))
                            .collect(),
                    )
                }
                outcome::RETRY => Outcome::Retry(decided.argument),
                outcome::DEAD_LETTER => Outcome::DeadLetter(self.answer.reason(decided.argument)),
                _ => Outcome::Ok,
            })
            .collect()
    }

    fn emitted_row(&self, record: emitted::Record) -> EmittedRow {
        let data = &self.packer.data;
        EmittedRow {
            table: record.table.map(|table| text(data, table).to_string()),
            payload: bytes(data, record.payload).to_vec(),
            headers: header::records(header::run(&self.packer.header_numbers, record.headers))
                .map(|h| {
                    (
                        text(data, h.name).to_string(),
                        text(data, h.value).to_string(),
                    )
                })
                .collect(),
        }
    }

    fn into_transformed(self) -> Transformed {
        Transformed {
            data: self.packer.data,
            outcomes: self.answer.outcomes,
            emitted: self.emitted,
            headers: self.packer.header_numbers,
            reasons: self.answer.reasons,
        }
    }
}

/// A decision read back by [`Outcomes::decided`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Emit(Vec<EmittedRow>),
    Retry(u32),
    DeadLetter(String),
}

/// An emitted row read back by [`Outcomes::decided`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmittedRow {
    pub table: Option<String>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, String)>,
}

/// The `transform` export: runs the instance's plugin on one batch.
#[doc(hidden)]
pub fn run<P: Transform>(slot: &'static Slot<P>, batch: Batch) -> Transformed {
    let rows = Rows::from_batch(batch);
    let mut out = Outcomes::with_capacity(rows.len());
    crate::slot::with(slot, |plugin: &mut P| plugin.transform(&rows, &mut out));
    out.into_transformed()
}

/// Exports a [`Transform`] as the plugin's `transform` world.
#[macro_export]
macro_rules! export_transform {
    ($plugin:ty) => {
        const _: () = {
            ::std::thread_local! {
                static PLUGIN: $crate::slot::Cell<$plugin> = const { ::std::cell::RefCell::new(None) };
            }
            struct Export;
            impl $crate::bindings::transform::Guest for Export {
                fn init(settings: String) -> Result<(), String> {
                    $crate::slot::fill(&PLUGIN, <$plugin as $crate::transform::Transform>::init(settings))
                }
                fn transform(rows: $crate::transform::Batch) -> $crate::transform::Transformed {
                    $crate::transform::run(&PLUGIN, rows)
                }
            }
            $crate::bindings::transform::export_world!(Export with_types_in $crate::bindings::transform);
        };
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::RowData;

    #[test]
    fn decisions_read_back_in_order() {
        let mut input = RowData::new("in");
        input.headers.push(("h".into(), "v".into()));
        let rows = Rows::pack([&input]);
        let row = rows.get(0).unwrap();
        let mut out = Outcomes::with_capacity(5);
        out.ok();
        out.replace_with(&row, |buf| buf.extend_from_slice(b"out"));
        out.emit([
            Emitted {
                table: Some("other"),
                payload: b"a",
                headers: &[],
            },
            Emitted {
                payload: b"b",
                ..Emitted::default()
            },
        ]);
        out.discard();
        out.dead_letter("bad");
        assert_eq!(
            out.decided(),
            vec![
                Outcome::Ok,
                Outcome::Emit(vec![EmittedRow {
                    table: None,
                    payload: b"out".to_vec(),
                    headers: vec![("h".into(), "v".into())],
                }]),
                Outcome::Emit(vec![
                    EmittedRow {
                        table: Some("other".into()),
                        payload: b"a".to_vec(),
                        headers: vec![],
                    },
                    EmittedRow {
                        table: None,
                        payload: b"b".to_vec(),
                        headers: vec![],
                    },
                ]),
                Outcome::Emit(vec![]),
                Outcome::DeadLetter("bad".into()),
            ]
        );
    }
}
