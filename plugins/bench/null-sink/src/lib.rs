//! A weir sink that answers `ok` for every row and writes nothing, so a delivery benchmark measures weir and not a destination.
//!
//! It takes no settings (any are ignored) and makes no host call.

use weir_plugin::{Delivery, Rows, Sink};

struct NullSink;

impl Sink for NullSink {
    fn init(_settings: String) -> Result<Self, String> {
        Ok(NullSink)
    }

    fn deliver(&mut self, rows: &Rows) -> Vec<Delivery> {
        vec![Delivery::Ok; rows.len()]
    }
}

weir_plugin::export_sink!(NullSink);
