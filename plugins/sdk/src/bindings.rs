//! The guest bindings of `wit/types.wit`, generated once per world. Every
//! world reuses the `types` and `host` interfaces of `transform` and the
//! `policy` interface of `budget`, so a `Batch` or a `Unit` is one Rust type
//! whichever world a plugin exports. The world modules (`transform`, `sink`,
//! `budget`, `router`) re-export what a plugin sees.

// The generated export glue flattens records into many arguments.
#![allow(clippy::too_many_arguments)]

pub mod transform {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "weir:plugin/transform",
        pub_export_macro: true,
        export_macro_name: "export_world",
        default_bindings_module: "weir_plugin::bindings::transform",
    });
}

pub mod sink {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "weir:plugin/sink",
        pub_export_macro: true,
        export_macro_name: "export_world",
        default_bindings_module: "weir_plugin::bindings::sink",
        with: {
            "weir:plugin/types@0.3.0": crate::bindings::transform::weir::plugin::types,
            "weir:plugin/host@0.3.0": crate::bindings::transform::weir::plugin::host,
            "weir:plugin/state@0.3.0": crate::bindings::transform::weir::plugin::state,
            "weir:plugin/http-batch@0.3.0": crate::bindings::transform::weir::plugin::http_batch,
        },
    });
}

pub mod budget {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "weir:plugin/budget",
        pub_export_macro: true,
        export_macro_name: "export_world",
        default_bindings_module: "weir_plugin::bindings::budget",
        with: {
            "weir:plugin/host@0.3.0": crate::bindings::transform::weir::plugin::host,
        },
    });
}

pub mod router {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "weir:plugin/router",
        pub_export_macro: true,
        export_macro_name: "export_world",
        default_bindings_module: "weir_plugin::bindings::router",
        with: {
            "weir:plugin/host@0.3.0": crate::bindings::transform::weir::plugin::host,
            "weir:plugin/policy@0.3.0": crate::bindings::budget::weir::plugin::policy,
        },
    });
}

/// NATS subjects, objects and PostgreSQL, imported by the `sink` world alone.
pub use sink::weir::plugin::nats;
pub use sink::weir::plugin::objects;
pub use sink::weir::plugin::postgres;
/// The host's imports, shared by every world.
pub use transform::weir::plugin::host;
