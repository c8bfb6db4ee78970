//! Sinks: the [`Sink`] trait the last step of a pipeline implements to
//! deliver rows somewhere, and [`Deliveries`], where it writes what became
//! of each row.
//!
//! [`export_sink!`](crate::export_sink) exports an implementation. A sink
//! answers the way a transform does: one call on its writer per row, in
//! order, packed as it goes (the codes of a transform, without `emit`). The
//! shared `types` and `host` interfaces are those of the `transform` world,
//! so a `Row` is one type for both.

#[doc(hidden)]
pub use crate::bindings::sink::Guest;
pub use crate::bindings::sink::{Batch, Delivered};

use weir_layout::outcome;

use crate::answer::Answer;
use crate::rows::Rows;
use crate::slot::Slot;

/// What became of one row: what [`Deliveries::push`] takes, and
/// [`Deliveries::decided`] reads back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// Delivered: the row is acked.
    Ok,
    /// Not delivered now: try again after this many milliseconds.
    Retry(u32),
    /// Never deliverable: dead-letter with this reason.
    DeadLetter(String),
}

/// The last step of a pipeline: it delivers rows somewhere.
pub trait Sink: Sized + 'static {
    /// As for a transform's `init`: called once per instance before any
    /// batch, with the plugin's settings as a JSON object; an error refuses
    /// the plugin.
    fn init(settings: String) -> Result<Self, String>;

    /// Delivers `rows` and writes what became of each, in order: one call on
    /// `out` per row ([`Deliveries::ok`], [`Deliveries::retry`],
    /// [`Deliveries::dead_letter`], or [`Deliveries::push`] of a
    /// [`Delivery`] decided earlier).
    fn deliver(&mut self, rows: &Rows, out: &mut Deliveries);
}

/// What a sink decided for each row of a batch, packed the way the host
/// reads it.
pub struct Deliveries {
    answer: Answer,
}

impl Deliveries {
    /// Room for the outcomes of `rows` rows.
    pub fn with_capacity(rows: usize) -> Deliveries {
        Deliveries {
            answer: Answer::with_capacity(rows),
        }
    }

    /// The row is delivered: it is acked.
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

    /// Records `delivery` for the next row: for a sink that decides its rows
    /// out of order and writes them in order afterwards.
    pub fn push(&mut self, delivery: Delivery) {
        match delivery {
            Delivery::Ok => self.ok(),
            Delivery::Retry(after_ms) => self.retry(after_ms),
            Delivery::DeadLetter(reason) => self.dead_letter(reason),
        }
    }

    /// How many rows have been decided.
    pub fn len(&self) -> usize {
        self.answer.len()
    }

    pub fn is_empty(&self) -> bool {
        self.answer.len() == 0
    }

    /// The decisions so far, readable: for a plugin's own tests.
    pub fn decided(&self) -> Vec<Delivery> {
        self.answer
            .records()
            .map(|decided| match decided.code {
                outcome::RETRY => Delivery::Retry(decided.argument),
                outcome::DEAD_LETTER => Delivery::DeadLetter(self.answer.reason(decided.argument)),
                _ => Delivery::Ok,
            })
            .collect()
    }

    fn into_delivered(self) -> Delivered {
        Delivered {
            outcomes: self.answer.outcomes,
            reasons: self.answer.reasons,
        }
    }
}

impl Extend<Delivery> for Deliveries {
    fn extend<I: IntoIterator<Item = Delivery>>(&mut self, deliveries: I) {
        for delivery in deliveries {
            self.push(delivery);
        }
    }
}

/// The `deliver` export: runs the instance's plugin on one batch.
#[doc(hidden)]
pub fn run<P: Sink>(slot: &'static Slot<P>, batch: Batch) -> Delivered {
    let rows = Rows::from_batch(batch);
    let mut out = Deliveries::with_capacity(rows.len());
    crate::slot::with(slot, |plugin: &mut P| plugin.deliver(&rows, &mut out));
    out.into_delivered()
}

/// Exports a [`Sink`] as the plugin's `sink` world.
#[macro_export]
macro_rules! export_sink {
    ($plugin:ty) => {
        const _: () = {
            ::std::thread_local! {
                static PLUGIN: $crate::slot::Cell<$plugin> = const { ::std::cell::RefCell::new(None) };
            }
            struct Export;
            impl $crate::bindings::sink::Guest for Export {
                fn init(settings: String) -> Result<(), String> {
                    $crate::slot::fill(&PLUGIN, <$plugin as $crate::sink::Sink>::init(settings))
                }
                fn deliver(rows: $crate::sink::Batch) -> $crate::sink::Delivered {
                    $crate::sink::run(&PLUGIN, rows)
                }
            }
            $crate::bindings::sink::export_world!(Export with_types_in $crate::bindings::sink);
        };
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliveries_pack_as_outcomes_with_reasons_by_index() {
        let mut out = Deliveries::with_capacity(4);
        out.ok();
        out.dead_letter("no");
        out.extend([Delivery::Retry(500), Delivery::DeadLetter("never".into())]);
        assert_eq!(out.len(), 4);
        assert_eq!(
            out.decided(),
            vec![
                Delivery::Ok,
                Delivery::DeadLetter("no".into()),
                Delivery::Retry(500),
                Delivery::DeadLetter("never".into()),
            ]
        );
        let delivered = out.into_delivered();
        let packed: Vec<u8> = [
            outcome::Record::ok(),
            outcome::Record::dead_letter(0),
            outcome::Record::retry(500),
            outcome::Record::dead_letter(1),
        ]
        .into_iter()
        .flat_map(outcome::Record::encode)
        .collect();
        assert_eq!(delivered.outcomes, packed);
        assert_eq!(delivered.reasons, vec!["no".to_string(), "never".into()]);
    }
}
