//! Bindings of the `sink` world: the [`Guest`] trait a sink implements and the types it sees.
//!
//! [`export_sink!`](crate::export_sink) exports an implementation. The shared
//! `types` and `host` interfaces are those of [`crate::transform`], so a
//! [`Row`] is one type for both worlds.

wit_bindgen::generate!({
    path: "../../wit",
    world: "weir:plugin/sink",
    pub_export_macro: true,
    export_macro_name: "export_sink",
    default_bindings_module: "weir_plugin::sink",
    with: {
        "weir:plugin/types@0.1.0": crate::transform::weir::plugin::types,
        "weir:plugin/host@0.1.0": crate::transform::weir::plugin::host,
    },
});
