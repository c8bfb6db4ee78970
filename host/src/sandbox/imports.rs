//! The host functions a plugin may import, served from its store's
//! [`PluginState`]: WASI (empty-by-default context), `wasi:http` (through
//! the grant gate), `log` and `add-counter`.

use wasmtime_wasi::{WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtxView, WasiHttpView};

use crate::telemetry::PluginCounterLabels;

use super::bindings::transform::weir::plugin::host::{self as host_api, Level};
use super::*;

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for PluginState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.gate,
        }
    }
}

impl host_api::Host for PluginState {
    fn log(&mut self, level: Level, mut message: String) {
        if message.len() > MAX_LOG_BYTES {
            let mut cut = MAX_LOG_BYTES;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        let (plugin, version) = (self.plugin.name(), self.plugin.version.as_str());
        match level {
            Level::Trace => tracing::trace!(plugin, version, "{message}"),
            Level::Debug => tracing::debug!(plugin, version, "{message}"),
            Level::Info => tracing::info!(plugin, version, "{message}"),
            Level::Warn => tracing::warn!(plugin, version, "{message}"),
            Level::Error => tracing::error!(plugin, version, "{message}"),
        }
    }

    fn add_counter(&mut self, name: String, delta: u64) {
        let labels = PluginCounterLabels {
            plugin: self.plugin.name().to_string(),
            name,
        };
        self.plugin
            .metrics
            .plugin_counters
            .get_or_create(&labels)
            .inc_by(delta);
    }
}

impl bindings::transform::weir::plugin::types::Host for PluginState {}
