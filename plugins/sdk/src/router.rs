//! Bindings of the `router` world: the [`Guest`] trait a routing policy
//! implements (`init`, `route-table`, `route-keys`) and the policy types it sees.
//!
//! [`export_router!`](crate::export_router) exports an implementation. The
//! policy types are those of [`crate::budget`].

// The generated export glue flattens records into many arguments.
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({
    path: "../../wit",
    world: "weir:plugin/router",
    pub_export_macro: true,
    export_macro_name: "export_router",
    default_bindings_module: "weir_plugin::router",
    with: {
        "weir:plugin/host@0.2.0": crate::transform::weir::plugin::host,
        "weir:plugin/policy@0.2.0": crate::budget::weir::plugin::policy,
    },
});

pub use crate::budget::weir::plugin::policy::Unit;
