//! How the sandbox links each capability of
//! [`crate::capability::CAPABILITIES`] into a plugin's `Linker`: one arm per
//! capability in [`link`] (a match, so a capability added to the table and
//! not here does not compile), under the name of every world version
//! served (`served.rs`). What each serves is `imports.rs`,
//! `http.rs` and `http_batch.rs`; the table says which linker it goes in.

use wasmtime::component::{HasSelf, Linker, LinkerInstance};

use super::bindings::sink::weir::plugin::{nats, objects, postgres};
use super::bindings::transform::weir::plugin::{host, http_batch, state};
use super::instance::PluginState;
use super::served::SERVED_WIT_VERSIONS;
use crate::capability::{CAPABILITIES, Capability, Linked};

/// Each store's [`PluginState`] serves the host functions itself.
fn own(state: &mut PluginState) -> &mut PluginState {
    state
}

/// Adds `capability`'s host functions to `linker`, served from each
/// store's [`PluginState`].
fn link(capability: Capability, linker: &mut Linker<PluginState>) -> wasmtime::Result<()> {
    type Own = HasSelf<PluginState>;
    match capability {
        Capability::Host => link_versions(linker, "host", |instance| {
            host::add_to_linker_instance::<PluginState, Own>(instance, own)
        }),
        Capability::WasiHttp => wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker),
        Capability::HttpBatch => link_versions(linker, "http-batch", |instance| {
            http_batch::add_to_linker_instance::<PluginState, Own>(instance, own)
        }),
        Capability::State => link_versions(linker, "state", |instance| {
            state::add_to_linker_instance::<PluginState, Own>(instance, own)
        }),
        Capability::Postgres => link_versions(linker, "postgres", |instance| {
            postgres::add_to_linker_instance::<PluginState, Own>(instance, own)
        }),
        Capability::Nats => link_versions(linker, "nats", |instance| {
            nats::add_to_linker_instance::<PluginState, Own>(instance, own)
        }),
        Capability::Objects => link_versions(linker, "objects", |instance| {
            objects::add_to_linker_instance::<PluginState, Own>(instance, own)
        }),
        Capability::Wasi => wasmtime_wasi::p2::add_to_linker_async(linker),
    }
}

/// Defines `weir:plugin/{interface}` at every served version in `linker`,
/// each with today's host functions (`add`).
fn link_versions(
    linker: &mut Linker<PluginState>,
    interface: &str,
    add: impl Fn(&mut LinkerInstance<'_, PluginState>) -> wasmtime::Result<()>,
) -> wasmtime::Result<()> {
    for version in SERVED_WIT_VERSIONS {
        add(&mut linker.instance(&format!("weir:plugin/{interface}@{version}"))?)?;
    }
    Ok(())
}

/// Links every capability the table links as `linked` (every plugin's
/// linker takes the `Always` ones; the HTTP linker then the others).
pub(super) fn link_all(linker: &mut Linker<PluginState>, linked: Linked) -> wasmtime::Result<()> {
    for spec in CAPABILITIES.iter().filter(|spec| spec.linked == linked) {
        link(spec.capability, linker)?;
    }
    Ok(())
}
