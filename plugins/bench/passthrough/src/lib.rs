//! A weir transform that answers `ok` for every row and does nothing else, so a benchmark sees the cost of the boundary alone.
//!
//! It takes no settings (any are ignored), logs nothing and keeps no counter:
//! each of those would be a host call that the boundary figure must not include.

use weir_plugin::transform::{Guest, Outcome, Row};

struct Passthrough;

impl Guest for Passthrough {
    fn init(_settings: String) -> Result<(), String> {
        Ok(())
    }

    fn transform(rows: Vec<Row>) -> Vec<Outcome> {
        rows.iter().map(|_| Outcome::Ok).collect()
    }
}

weir_plugin::export_transform!(Passthrough);
