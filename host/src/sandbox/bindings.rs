//! Host bindings generated from `wit/` by `wasmtime::component::bindgen!`:
//! the types in them are the ones that cross the plugin boundary. Their own
//! module, so what packs a batch (delivery) needs only these types, not the
//! sandbox that runs it. [`v0_2_0`] is the previous world version, still
//! served (`wit/served/`): only its exports are bound here, since its
//! imports are served by today's host functions (`sandbox/capabilities.rs`).

pub mod transform {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "weir:plugin/transform",
        exports: { default: async },
        // A batch of requests waits on the network without blocking the executor.
        imports: { "weir:plugin/http-batch": async },
    });
}
pub mod sink {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "weir:plugin/sink",
        exports: { default: async },
        // A statement waits on the database without blocking the executor.
        imports: { "weir:plugin/postgres": async },
        with: {
            "weir:plugin/types": super::transform::weir::plugin::types,
            "weir:plugin/host": super::transform::weir::plugin::host,
            "weir:plugin/state": super::transform::weir::plugin::state,
            "weir:plugin/http-batch": super::transform::weir::plugin::http_batch,
        },
    });
}
pub mod budget {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "weir:plugin/budget",
        exports: { default: async },
        with: {
            "weir:plugin/host": super::transform::weir::plugin::host,
        },
    });
}
pub mod router {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "weir:plugin/router",
        exports: { default: async },
        with: {
            "weir:plugin/host": super::transform::weir::plugin::host,
            "weir:plugin/policy": super::budget::weir::plugin::policy,
        },
    });
}
pub use budget::weir::plugin::policy::{
    Admission, Decision, Route, TableRoute, Topology, Unit as RouteUnit, Usage,
};
pub use sink::weir::plugin::types::Delivered;
pub use transform::weir::plugin::types::{Batch, Transformed};

/// `weir:plugin@0.2.0`'s transform and sink exports: a batch's numbers as
/// `list<u32>` (`list<u64>` sequences), where 0.3.0 packs them as bytes.
pub mod v0_2_0 {
    pub mod transform {
        wasmtime::component::bindgen!({
            path: "../wit/served/0.2.0",
            world: "weir:plugin/transform",
            exports: { default: async },
        });
    }
    pub mod sink {
        wasmtime::component::bindgen!({
            path: "../wit/served/0.2.0",
            world: "weir:plugin/sink",
            exports: { default: async },
            with: {
                "weir:plugin/types": super::transform::weir::plugin::types,
                "weir:plugin/host": super::transform::weir::plugin::host,
                "weir:plugin/state": super::transform::weir::plugin::state,
                "weir:plugin/http-batch": super::transform::weir::plugin::http_batch,
            },
        });
    }
}
