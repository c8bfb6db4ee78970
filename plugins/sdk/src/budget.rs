//! Bindings of the `budget` world: the [`Guest`] trait a per-tenant budget
//! implements (`init`, `admit`) and the policy types it sees.
//!
//! [`export_budget!`](crate::export_budget) exports an implementation.

// The generated export glue flattens records into many arguments.
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({
    path: "../../wit",
    world: "weir:plugin/budget",
    pub_export_macro: true,
    export_macro_name: "export_budget",
    default_bindings_module: "weir_plugin::budget",
    with: {
        "weir:plugin/host@0.2.0": crate::transform::weir::plugin::host,
    },
});

pub use weir::plugin::policy::Usage;
