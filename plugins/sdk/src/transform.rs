//! Transforms: the [`Transform`] trait a validating, transforming or
//! enriching plugin implements, and [`Outcomes`], where it writes what it
//! decided for each row.
//!
//! [`export_transform!`](crate::export_transform) exports an implementation.

// The generated export glue flattens a batch into many arguments.
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({
    path: "../../wit",
    world: "weir:plugin/transform",
    pub_export_macro: true,
    export_macro_name: "export_world",
    default_bindings_module: "weir_plugin::transform",
});

use std::thread::LocalKey;

#[doc(hidden)]
pub use crate::slot::Slot;

use crate::rows::{HEADER_WIDTH, Packer, Row, Rows, bytes, number, text};

/// Outcome codes (see `transformed` in `wit/types.wit`).
pub(crate) const OK: u32 = 0;
pub(crate) const EMIT: u32 = 1;
pub(crate) const RETRY: u32 = 2;
pub(crate) const DEAD_LETTER: u32 = 3;
/// Numbers per emitted row.
const EMITTED_WIDTH: usize = 6;
/// An emitted row's table length meaning "the input's table".
const SAME_TABLE: [u32; 2] = [0, u32::MAX];

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
    packer: Packer,
    /// Two numbers per decided row: code, argument.
    outcomes: Vec<u32>,
    /// Six numbers per emitted row.
    emitted: Vec<u32>,
    reasons: Vec<String>,
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
            packer: Packer::default(),
            outcomes: Vec::with_capacity(rows * 2),
            emitted: Vec::new(),
            reasons: Vec::new(),
        }
    }

    /// Pass the row on unchanged.
    pub fn ok(&mut self) {
        self.outcomes.extend([OK, 0]);
    }

    /// Try the row again after `after_ms` milliseconds.
    pub fn retry(&mut self, after_ms: u32) {
        self.outcomes.extend([RETRY, after_ms]);
    }

    /// Give up on the row: it is dead-lettered with `reason`.
    pub fn dead_letter(&mut self, reason: impl Into<String>) {
        self.outcomes
            .extend([DEAD_LETTER, number(self.reasons.len())]);
        self.reasons.push(reason.into());
    }

    /// Drop the row: it emits nothing and is acked.
    pub fn discard(&mut self) {
        self.outcomes.extend([EMIT, 0]);
    }

    /// Replace `row` by one row with its table and headers, and the payload
    /// `write` appends to the buffer it is given (e.g. `serde_json::to_writer`).
    pub fn replace_with(&mut self, row: &Row<'_>, write: impl FnOnce(&mut Vec<u8>)) {
        let payload = self.packer.append_with(write);
        let headers = self.packer.headers(row.headers());
        self.emitted
            .extend(SAME_TABLE.into_iter().chain(payload).chain(headers));
        self.outcomes.extend([EMIT, 1]);
    }

    /// Replace the row by `rows` (none drops it).
    pub fn emit<'a>(&mut self, rows: impl IntoIterator<Item = Emitted<'a>>) {
        let mut count = 0;
        for row in rows {
            let table = match row.table {
                Some(table) => self.packer.append(table.as_bytes()),
                None => SAME_TABLE,
            };
            let payload = self.packer.append(row.payload);
            let headers = self.packer.headers(row.headers.iter().copied());
            self.emitted
                .extend(table.into_iter().chain(payload).chain(headers));
            count += 1;
        }
        self.outcomes.extend([EMIT, count]);
    }

    /// How many rows have been decided.
    pub fn len(&self) -> usize {
        self.outcomes.len() / 2
    }

    pub fn is_empty(&self) -> bool {
        self.outcomes.is_empty()
    }

    /// The decisions so far, readable: for a plugin's own tests.
    pub fn decided(&self) -> Vec<Outcome> {
        let data = &self.packer.data;
        let mut emitted = self.emitted.chunks_exact(EMITTED_WIDTH);
        self.outcomes
            .chunks_exact(2)
            .map(|pair| match (pair[0], pair[1]) {
                (EMIT, count) => Outcome::Emit(
                    emitted
                        .by_ref()
                        .take(count as usize)
                        .map(|e| EmittedRow {
                            table: (e[1] != u32::MAX).then(|| text(data, e[0], e[1]).to_string()),
                            payload: bytes(data, e[2], e[3]).to_vec(),
                            headers: self
                                .packer
                                .header_numbers
                                .chunks_exact(HEADER_WIDTH)
                                .skip(e[4] as usize)
                                .take(e[5] as usize)
                                .map(|h| {
                                    (
                                        text(data, h[0], h[1]).to_string(),
                                        text(data, h[2], h[3]).to_string(),
                                    )
                                })
                                .collect(),
                        })
                        .collect(),
                ),
                (RETRY, ms) => Outcome::Retry(ms),
                (DEAD_LETTER, reason) => Outcome::DeadLetter(
                    self.reasons
                        .get(reason as usize)
                        .cloned()
                        .unwrap_or_default(),
                ),
                _ => Outcome::Ok,
            })
            .collect()
    }

    fn into_transformed(self) -> Transformed {
        Transformed {
            data: self.packer.data,
            outcomes: self.outcomes,
            emitted: self.emitted,
            headers: self.packer.header_numbers,
            reasons: self.reasons,
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

#[doc(hidden)]
pub fn init<P: Transform>(
    slot: &'static LocalKey<Slot<P>>,
    settings: String,
) -> Result<(), String> {
    crate::slot::fill(slot, P::init(settings))
}

#[doc(hidden)]
pub fn run<P: Transform>(slot: &'static LocalKey<Slot<P>>, batch: Batch) -> Transformed {
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
                static PLUGIN: $crate::transform::Slot<$plugin> = const { ::std::cell::RefCell::new(None) };
            }
            struct Export;
            impl $crate::transform::Guest for Export {
                fn init(settings: String) -> Result<(), String> {
                    $crate::transform::init(&PLUGIN, settings)
                }
                fn transform(
                    rows: $crate::transform::Batch,
                ) -> $crate::transform::Transformed {
                    $crate::transform::run(&PLUGIN, rows)
                }
            }
            $crate::transform::export_world!(Export with_types_in $crate::transform);
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
