//! A weir sink that answers `ok` for every row and writes nothing, so a delivery benchmark measures weir and not a destination.
//!
//! It takes no settings (any are ignored) and makes no host call.

use weir_plugin::sink::{Delivery, Guest, Row};

struct NullSink;

impl Guest for NullSink {
    fn init(_settings: String) -> Result<(), String> {
        Ok(())
    }

    fn deliver(rows: Vec<Row>) -> Vec<Delivery> {
        rows.iter().map(|_| Delivery::Ok).collect()
    }
}

weir_plugin::export_sink!(NullSink);
