//! The Rust guest SDK for weir plugins: the WIT bindings of every world plus logging, counter and settings helpers.
//!
//! A plugin is a `cdylib` crate built for `wasm32-wasip2`. It implements the
//! `Guest` trait of its world and exports it with the world's macro:
//!
//! ```ignore
//! use weir_plugin::transform::{Guest, Outcome, Row};
//!
//! #[derive(serde::Deserialize)]
//! struct Settings {
//!     field: String,
//! }
//!
//! static SETTINGS: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();
//!
//! struct Example;
//!
//! impl Guest for Example {
//!     fn init(settings: String) -> Result<(), String> {
//!         let settings: Settings = weir_plugin::settings(&settings)?;
//!         weir_plugin::log::info(&format!("watching `{}`", settings.field));
//!         SETTINGS.set(settings).map_err(|_| "init called twice".to_string())
//!     }
//!
//!     fn transform(rows: Vec<Row>) -> Vec<Outcome> {
//!         weir_plugin::counter("rows_seen", rows.len() as u64);
//!         rows.iter().map(|_| Outcome::Ok).collect()
//!     }
//! }
//!
//! weir_plugin::export_transform!(Example);
//! ```
//!
//! A sink does the same with [`sink::Guest`] (`init` and `deliver`) and
//! [`export_sink!`]; a per-tenant budget with [`budget::Guest`] and
//! [`export_budget!`]; a routing policy with [`router::Guest`] and
//! [`export_router!`].

pub mod budget;
pub mod log;
pub mod router;
pub mod sink;
pub mod transform;

mod settings;

#[doc(inline)]
pub use budget::export_budget;
#[doc(inline)]
pub use router::export_router;
pub use settings::settings;
#[doc(inline)]
pub use sink::export_sink;
#[doc(inline)]
pub use transform::export_transform;

/// Adds `delta` to this plugin's counter `name`; the host exports it as a metric.
pub fn counter(name: &str, delta: u64) {
    transform::weir::plugin::host::add_counter(name, delta);
}
