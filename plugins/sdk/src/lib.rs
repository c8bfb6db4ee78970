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
//! A sink does the same with [`Sink`] and [`export_sink!`], writing what
//! became of each row to [`Deliveries`] as a transform writes to
//! [`Outcomes`]. A per-tenant budget implements [`Budget`] and exports it
//! with [`export_budget!`]; a routing policy [`Router`] with
//! [`export_router!`]. Every kind is a value made by `init` and kept per
//! instance, each call getting it as `&mut self`. [`stable_hash64`] is a
//! hash that never changes, for what a plugin stores or sends: a sink
//! dropping replays keys a row by its tenant, table and
//! [`sequence`](Row::sequence), and may compare a hash of its payload.
//! A sink granted PostgreSQL writes through [`postgres`], in the host's
//! transaction of the call; one granted NATS subjects publishes through
//! [`nats`], sent once its rows are delivered; one granted an object store
//! adds each row to the object of its path through [`objects`]. A transform or sink granted
//! HTTP authorities sends many requests at once with [`http::fetch_all`]
//! (an enrichment's lookups), waiting for all of them in one call.
//!
//! Modules import one another without a cycle: `bindings` (the generated
//! WIT bindings), `slot`, `settings`, `packed`, `answer` and `hash` import
//! no other module; `log` and `rows` build on them; the world modules
//! (`transform`, `sink`, `budget`, `router`) on those; `state`, `http`,
//! `postgres`, `nats` and `objects` wrap imports of `bindings` alone.

pub mod budget;
pub mod http;
pub mod log;
pub mod nats;
pub mod objects;
pub mod postgres;
pub mod router;
pub mod rows;
pub mod sink;
pub mod state;
pub mod transform;

#[doc(hidden)]
pub mod bindings;
#[doc(hidden)]
pub mod slot;

mod answer;
mod hash;
mod packed;
mod settings;

pub use budget::Budget;
pub use hash::stable_hash64;
pub use router::Router;
pub use rows::{Row, RowData, Rows};
pub use settings::settings;
pub use sink::{Deliveries, Delivery, Sink};
pub use transform::{Emitted, Outcomes, Transform};

/// Adds `delta` to this plugin's counter `name`; the host exports it as a metric.
/// Outside wasm (a plugin's own tests) it does nothing.
pub fn counter(name: &str, delta: u64) {
    #[cfg(target_family = "wasm")]
    bindings::host::add_counter(name, delta);
    #[cfg(not(target_family = "wasm"))]
    let _ = (name, delta);
}
