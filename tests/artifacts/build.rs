//! Builds weir's plugins (the separate `plugins/` workspace) for
//! wasm32-wasip2 and writes `$OUT_DIR/plugins.rs` with each `.wasm` path
//! (see `guests.rs`, which the peer bench's build script shares).

mod guests;

use std::env;
use std::path::PathBuf;

use guests::Guests;

fn main() {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let repo = manifest_dir
        .join("../..")
        .canonicalize()
        .expect("tests/artifacts sits two levels below the repository root");
    let plugins = Guests {
        manifest: "plugins/Cargo.toml",
        target: "wasm32-wasip2",
        // Every plugin the tests and benches use.
        files: &[
            ("VALIDATOR", "weir_validator.wasm"),
            ("NDJSON_SINK", "weir_ndjson_sink.wasm"),
            ("CHAOS", "weir_chaos.wasm"),
            ("PASSTHROUGH", "weir_bench_passthrough.wasm"),
            ("NULL_SINK", "weir_bench_null_sink.wasm"),
            ("NAIVE_MASK", "weir_bench_naive_mask.wasm"),
            ("HTTP_SINK", "weir_http_sink.wasm"),
            ("ENRICH", "weir_enrich.wasm"),
            ("TENANT_BUDGET", "weir_tenant_budget.wasm"),
            ("HOT_TENANT_ROUTER", "weir_hot_tenant_router.wasm"),
            ("WINDOW", "weir_window.wasm"),
            ("POSTGRES_SINK", "weir_postgres_sink.wasm"),
            ("NATS_SINK", "weir_nats_sink.wasm"),
            ("LAKE_SINK", "weir_lake_sink.wasm"),
        ],
    };
    guests::build_all(&repo, &[plugins], "plugins.rs");
}
