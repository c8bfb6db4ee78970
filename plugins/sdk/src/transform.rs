//! Transforms: the [`Transform`] trait a validating, transforming or
//! enriching plugin implements, and [`Outcomes`], where it writes what it
//! decided for each row.
//!
//! [`export_transform!`](crate::export_transform) exports an implementation.

wit_bindgen::generate!({
    path: "../../wit",
    world: "weir:plugin/transform",
    pub_export_macro: true,
    export_macro_name: "export_world",
    default_bindings_module: "weir_plugin::transform",
});

use std::cell::RefCell;
use std::thread::LocalKey;

use self::weir::plugin::types as wit;
use crate::rows::{Packer, Row, Rows, bytes, items, text};

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
    outcomes: Vec<wit::Outcome>,
    rows: Vec<wit::EmittedRow>,
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
            outcomes: Vec::with_capacity(rows),
            rows: Vec::new(),
        }
    }

    /// Pass the row on unchanged.
    pub fn ok(&mut self) {
        self.outcomes.push(wit::Outcome::Ok);
    }

    /// Try the row again after `after_ms` milliseconds.
    pub fn retry(&mut self, after_ms: u32) {
        self.outcomes.push(wit::Outcome::Retry(after_ms));
    }

    /// Give up on the row: it is dead-lettered with `reason`.
    pub fn dead_letter(&mut self, reason: impl Into<String>) {
        self.outcomes.push(wit::Outcome::DeadLetter(reason.into()));
    }

    /// Drop the row: it emits nothing and is acked.
    pub fn discard(&mut self) {
        self.emit([]);
    }

    /// Replace `row` by one row with its table and headers, and the payload
    /// `write` appends to the buffer it is given (e.g. `serde_json::to_writer`).
    pub fn replace_with(&mut self, row: &Row<'_>, write: impl FnOnce(&mut Vec<u8>)) {
        let first = self.rows.len();
        let payload = self.packer.append_with(write);
        let headers = self.packer.headers(row.headers());
        self.rows.push(wit::EmittedRow {
            table: None,
            payload,
            headers,
        });
        self.close_emit(first);
    }

    /// Replace the row by `rows` (none drops it).
    pub fn emit<'a>(&mut self, rows: impl IntoIterator<Item = Emitted<'a>>) {
        let first = self.rows.len();
        for row in rows {
            let emitted = wit::EmittedRow {
                table: row.table.map(|table| self.packer.append(table.as_bytes())),
                payload: self.packer.append(row.payload),
                headers: self.packer.headers(row.headers.iter().copied()),
            };
            self.rows.push(emitted);
        }
        self.close_emit(first);
    }

    /// Records an `emit` of the rows pushed since `first`.
    fn close_emit(&mut self, first: usize) {
        self.outcomes.push(wit::Outcome::Emit(wit::Range {
            first: u32::try_from(first).unwrap_or(u32::MAX),
            count: u32::try_from(self.rows.len() - first).unwrap_or(u32::MAX),
        }));
    }

    /// How many rows have been decided.
    pub fn len(&self) -> usize {
        self.outcomes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.outcomes.is_empty()
    }

    /// The decisions so far, readable: for a plugin's own tests.
    pub fn decided(&self) -> Vec<Outcome> {
        let data = &self.packer.data;
        self.outcomes
            .iter()
            .map(|outcome| match outcome {
                wit::Outcome::Ok => Outcome::Ok,
                wit::Outcome::Retry(ms) => Outcome::Retry(*ms),
                wit::Outcome::DeadLetter(reason) => Outcome::DeadLetter(reason.clone()),
                wit::Outcome::Emit(range) => Outcome::Emit(
                    items(&self.rows, *range)
                        .iter()
                        .map(|row| EmittedRow {
                            table: row.table.map(|span| text(data, span).to_string()),
                            payload: bytes(data, row.payload).to_vec(),
                            headers: items(&self.packer.header_list, row.headers)
                                .iter()
                                .map(|h| (text(data, h.name).into(), text(data, h.value).into()))
                                .collect(),
                        })
                        .collect(),
                ),
            })
            .collect()
    }

    fn into_transformed(self) -> Transformed {
        Transformed {
            data: self.packer.data,
            outcomes: self.outcomes,
            rows: self.rows,
            headers: self.packer.header_list,
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

/// Where [`export_transform!`](crate::export_transform) keeps the instance's plugin.
#[doc(hidden)]
pub type Slot<P> = RefCell<Option<P>>;

#[doc(hidden)]
pub fn init<P: Transform>(
    slot: &'static LocalKey<Slot<P>>,
    settings: String,
) -> Result<(), String> {
    let plugin = P::init(settings)?;
    slot.with(|slot| *slot.borrow_mut() = Some(plugin));
    Ok(())
}

#[doc(hidden)]
pub fn run<P: Transform>(slot: &'static LocalKey<Slot<P>>, batch: wit::Batch) -> Transformed {
    let rows = Rows::from_batch(batch);
    let mut out = Outcomes::with_capacity(rows.len());
    slot.with(|slot| match slot.borrow_mut().as_mut() {
        Some(plugin) => plugin.transform(&rows, &mut out),
        // The host always calls `init` first; a trap tells it otherwise.
        None => panic!("weir-plugin: transform called before init"),
    });
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
