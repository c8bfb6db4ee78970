//! A weir sink that answers `ok` for every row and writes nothing, so a delivery benchmark measures weir and not a destination.
//!
//! It takes no settings (any are ignored) and makes no host call.

use weir_plugin::{Deliveries, Rows, Sink};

struct NullSink;

impl Sink for NullSink {
    fn init(_settings: String) -> Result<Self, String> {
        Ok(NullSink)
    }

    fn deliver(&mut self, rows: &Rows, out: &mut Deliveries) {
        for _ in 0..rows.len() {
            out.ok();
        }
    }
}

weir_plugin::export_sink!(NullSink);
