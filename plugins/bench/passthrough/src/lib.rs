//! A weir transform that answers `ok` for every row and does nothing else, so a benchmark sees the cost of the boundary alone.
//!
//! It takes no settings (any are ignored), logs nothing and keeps no counter:
//! each of those would be a host call that the boundary figure must not include.

use weir_plugin::{Outcomes, Rows, Transform};

struct Passthrough;

impl Transform for Passthrough {
    fn init(_settings: String) -> Result<Self, String> {
        Ok(Passthrough)
    }

    fn transform(&mut self, rows: &Rows, out: &mut Outcomes) {
        for _ in 0..rows.len() {
            out.ok();
        }
    }
}

weir_plugin::export_transform!(Passthrough);
