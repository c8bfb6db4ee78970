//! Paths of weir's plugins built for wasm32-wasip2, for the host's tests and
//! benches: one `&str` constant per `.wasm` (see `PLUGINS` in `build.rs`).
//!
//! The build script builds the `plugins/` workspace in release mode into
//! `plugins/target` and checks that each file exists.

include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
