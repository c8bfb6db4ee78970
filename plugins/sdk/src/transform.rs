//! Bindings of the `transform` world: the [`Guest`] trait a transform implements and the types it sees.
//!
//! [`export_transform!`](crate::export_transform) exports an implementation.

wit_bindgen::generate!({
    path: "../../wit",
    world: "weir:plugin/transform",
    pub_export_macro: true,
    export_macro_name: "export_transform",
    default_bindings_module: "weir_plugin::transform",
});

pub use self::weir::plugin::types::EmittedRow;
