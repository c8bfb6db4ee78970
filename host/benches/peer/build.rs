//! Builds the Extism peer plugin (`plugins/bench/extism-mask`, a core
//! module in its own workspace, for wasm32-unknown-unknown) and writes
//! `$OUT_DIR/peer_plugins.rs` with its path. Only this bench needs it, so
//! neither that target nor its build is part of the tests.

#[path = "../../../tests/artifacts/guests.rs"]
mod guests;

use std::env;
use std::path::PathBuf;

use guests::Guests;

fn main() {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let repo = manifest_dir
        .join("../../..")
        .canonicalize()
        .expect("host/benches/peer sits three levels below the repository root");
    let extism = Guests {
        manifest: "plugins/bench/extism-mask/Cargo.toml",
        target: "wasm32-unknown-unknown",
        files: &[("EXTISM_MASK", "weir_bench_extism_mask.wasm")],
    };
    guests::build_all(&repo, &[extism], "peer_plugins.rs");
}
