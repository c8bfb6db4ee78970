//! Sinks: the [`Sink`] trait the last step of a pipeline implements to
//! deliver rows somewhere.
//!
//! [`export_sink!`](crate::export_sink) exports an implementation. The shared
//! `types` and `host` interfaces are those of [`crate::transform`], so a
//! [`Row`](crate::Row) is one type for both worlds.

// The generated export glue flattens a batch into many arguments.
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({
    path: "../../wit",
    world: "weir:plugin/sink",
    pub_export_macro: true,
    export_macro_name: "export_world",
    default_bindings_module: "weir_plugin::sink",
    with: {
        "weir:plugin/types@0.2.0": crate::transform::weir::plugin::types,
        "weir:plugin/host@0.2.0": crate::transform::weir::plugin::host,
    },
});

use std::thread::LocalKey;

#[doc(hidden)]
pub use crate::slot::Slot;

use crate::rows::Rows;

/// What a sink decided for one row.
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
    /// As for [`Transform::init`](crate::Transform::init).
    fn init(settings: String) -> Result<Self, String>;

    /// One delivery result per row of `rows`, in the same order.
    fn deliver(&mut self, rows: &Rows) -> Vec<Delivery>;
}

#[doc(hidden)]
pub fn init<P: Sink>(slot: &'static LocalKey<Slot<P>>, settings: String) -> Result<(), String> {
    crate::slot::fill(slot, P::init(settings))
}

#[doc(hidden)]
pub fn run<P: Sink>(slot: &'static LocalKey<Slot<P>>, batch: Batch) -> Delivered {
    let rows = Rows::from_batch(batch);
    pack(crate::slot::with(slot, |plugin: &mut P| {
        plugin.deliver(&rows)
    }))
}

/// Packs a sink's answer (see `delivered` in `wit/types.wit`).
fn pack(deliveries: Vec<Delivery>) -> Delivered {
    use crate::transform::{DEAD_LETTER, OK, RETRY};
    let mut delivered = Delivered {
        outcomes: Vec::with_capacity(deliveries.len() * 2),
        reasons: Vec::new(),
    };
    for delivery in deliveries {
        let pair = match delivery {
            Delivery::Ok => [OK, 0],
            Delivery::Retry(ms) => [RETRY, ms],
            Delivery::DeadLetter(reason) => {
                delivered.reasons.push(reason);
                [
                    DEAD_LETTER,
                    crate::rows::number(delivered.reasons.len() - 1),
                ]
            }
        };
        delivered.outcomes.extend(pair);
    }
    delivered
}

/// Exports a [`Sink`] as the plugin's `sink` world.
#[macro_export]
macro_rules! export_sink {
    ($plugin:ty) => {
        const _: () = {
            ::std::thread_local! {
                static PLUGIN: $crate::sink::Slot<$plugin> = const { ::std::cell::RefCell::new(None) };
            }
            struct Export;
            impl $crate::sink::Guest for Export {
                fn init(settings: String) -> Result<(), String> {
                    $crate::sink::init(&PLUGIN, settings)
                }
                fn deliver(
                    rows: $crate::sink::Batch,
                ) -> $crate::sink::Delivered {
                    $crate::sink::run(&PLUGIN, rows)
                }
            }
            $crate::sink::export_world!(Export with_types_in $crate::sink);
        };
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliveries_pack_as_codes_with_reasons_by_index() {
        let delivered = pack(vec![
            Delivery::Ok,
            Delivery::DeadLetter("no".into()),
            Delivery::Retry(500),
        ]);
        assert_eq!(delivered.outcomes, vec![0, 0, 3, 0, 2, 500]);
        assert_eq!(delivered.reasons, vec!["no".to_string()]);
    }
}
