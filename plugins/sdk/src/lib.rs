//! The Rust guest SDK for weir plugins: batches of rows read in place,
//! outcomes written in place, plus logging, counter and settings helpers.
//!
//! A plugin is a `cdylib` crate built for `wasm32-wasip2`. A transform
//! implements [`Transform`] and exports it with [`export_transform!`]:
//!
//! ```no_run
//! use weir_plugin::{Outcomes, Rows, Transform};
//!
//! #[derive(serde::Deserialize)]
//! struct Example {
//!     field: String,
//! }
//!
//! impl Transform for Example {
//!     fn init(settings: String) -> Result<Self, String> {
//!         let example: Example = weir_plugin::settings(&settings)?;
//!         weir_plugin::log::info(&format!("watching `{}`", example.field));
//!         Ok(example)
//!     }
//!
//!     fn transform(&mut self, rows: &Rows, out: &mut Outcomes) {
//!         weir_plugin::counter("rows_seen", rows.len() as u64);
//!         for row in rows.iter() {
//!             if row.payload.is_empty() {
//!                 out.dead_letter("empty row");
//!             } else {
//!                 out.ok();
//!             }
//!         }
//!     }
//! }
//!
//! weir_plugin::export_transform!(Example);
//! ```
//!
//! The host hands a batch over as one packed buffer ([`Rows`]); a [`Row`]
//! borrows its tenant, table, payload and headers from it, and [`Outcomes`]
//! packs what the plugin emits the same way, so a batch crosses the
//! boundary in a few copies whatever its size.
//!
//! A sink does the same with [`Sink`] and [`export_sink!`]; a per-tenant
//! budget implements [`budget::Guest`] and exports it with
//! [`export_budget!`]; a routing policy [`router::Guest`] with
//! [`export_router!`].

pub mod budget;
pub mod log;
pub mod router;
pub mod rows;
pub mod sink;
pub mod transform;

mod settings;
mod slot;

#[doc(inline)]
pub use budget::export_budget;
#[doc(inline)]
pub use router::export_router;
pub use rows::{Row, RowData, Rows};
pub use settings::settings;
pub use sink::{Delivery, Sink};
pub use transform::{Emitted, Outcomes, Transform};

/// Adds `delta` to this plugin's counter `name`; the host exports it as a metric.
/// Outside wasm (a plugin's own tests) it does nothing.
pub fn counter(name: &str, delta: u64) {
    #[cfg(target_family = "wasm")]
    transform::weir::plugin::host::add_counter(name, delta);
    #[cfg(not(target_family = "wasm"))]
    let _ = (name, delta);
}
