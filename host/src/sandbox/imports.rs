//! The host functions a plugin may import, served from its store's
//! [`PluginState`]: WASI (empty-by-default context), `wasi:http` (through
//! the grant gate), `log` and `add-counter`.

use wasmtime_wasi::{WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtxView, WasiHttpView};

use crate::telemetry::PluginCounterLabels;

use super::bindings::transform::weir::plugin::host::{self as host_api, Level};
use super::bindings::transform::weir::plugin::state as state_api;
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
        // A newline or an escape sequence would forge host log lines.
        let message = escape_controls(&message);
        let (plugin, version) = (self.plugin.name(), self.plugin.version.as_str());
        match level {
            Level::Trace => tracing::trace!(plugin, version, "{message}"),
            Level::Debug => tracing::debug!(plugin, version, "{message}"),
            Level::Info => tracing::info!(plugin, version, "{message}"),
            Level::Warn => tracing::warn!(plugin, version, "{message}"),
            Level::Error => tracing::error!(plugin, version, "{message}"),
        }
    }

    /// Bounded: at most `MAX_COUNTERS` names of at most
    /// `MAX_COUNTER_NAME_BYTES` letters, digits, `_`, `-` and `.` per
    /// plugin version; anything else is dropped and counted as refused.
    fn add_counter(&mut self, name: String, delta: u64) {
        let well_formed = (1..=MAX_COUNTER_NAME_BYTES).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        let admitted = well_formed
            && self.plugin.counter_names.lock().is_ok_and(|mut names| {
                names.contains(&name) || (names.len() < MAX_COUNTERS && names.insert(name.clone()))
            });
        let metrics = &self.plugin.metrics;
        if !admitted {
            metrics
                .plugin_counter_refusals
                .get_or_create(&self.plugin.labels)
                .inc();
            return;
        }
        let labels = PluginCounterLabels {
            plugin: self.plugin.name().to_string(),
            name,
        };
        metrics.plugin_counters.get_or_create(&labels).inc_by(delta);
    }
}

/// `text` with control characters (newlines, escapes) written as escapes.
fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            escaped.extend(c.escape_default());
        } else {
            escaped.push(c);
        }
    }
    std::borrow::Cow::Owned(escaped)
}

impl bindings::transform::weir::plugin::types::Host for PluginState {}

impl PluginState {
    fn state_of(&mut self, row: u32) -> Result<&mut crate::state::scope::Overlay, String> {
        match &mut self.state {
            Some(state) => state.scope_of(row),
            None => Err(format!(
                "plugin `{}` has no state outside a batch, or no `grants.state` in its TOML",
                self.plugin.name()
            )),
        }
    }
}

/// The `state` interface: every call names a row of the running batch,
/// whose scope it reads or writes (see `crate::state`).
impl state_api::Host for PluginState {
    fn get(&mut self, row: u32, key: Vec<u8>) -> Result<Option<Vec<u8>>, String> {
        Ok(self.state_of(row)?.get(&key).map(<[u8]>::to_vec))
    }

    fn set(&mut self, row: u32, key: Vec<u8>, value: Vec<u8>) -> Result<(), String> {
        self.state_of(row)?
            .set(&key, &value)
            .map_err(|err| err.to_string())
    }

    fn delete(&mut self, row: u32, key: Vec<u8>) -> Result<(), String> {
        self.state_of(row)?.delete(&key);
        Ok(())
    }

    fn list(&mut self, row: u32, prefix: Vec<u8>) -> Result<Vec<(Vec<u8>, Vec<u8>)>, String> {
        Ok(self.state_of(row)?.list(&prefix))
    }
}
