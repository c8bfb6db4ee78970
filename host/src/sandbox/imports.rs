//! The host functions a plugin may import, served from its store's
//! [`PluginState`]: WASI (empty-by-default context), `wasi:http` (through
//! the grant gate), `log`, `add-counter` and `json-members`.

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

    fn json_members(&mut self, names: Vec<String>) -> Result<Vec<u8>, String> {
        match &self.batch {
            Some(batch) => super::json_members::json_members(&batch.data, &batch.rows, &names),
            None => Err("json-members: there is no batch outside a transform or sink call".into()),
        }
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
            .set(key, value)
            .map_err(|err| err.to_string())
    }

    fn delete(&mut self, row: u32, key: Vec<u8>) -> Result<(), String> {
        self.state_of(row)?.delete(key);
        Ok(())
    }

    fn list(&mut self, row: u32, prefix: Vec<u8>) -> Result<Vec<(Vec<u8>, Vec<u8>)>, String> {
        Ok(self.state_of(row)?.list(&prefix))
    }
}

use super::bindings::sink::weir::plugin::postgres as postgres_api;

impl From<postgres_api::Value> for crate::destination::Param {
    fn from(value: postgres_api::Value) -> crate::destination::Param {
        use crate::destination::Param;
        match value {
            postgres_api::Value::Null => Param::Null,
            postgres_api::Value::Text(text) => Param::Text(text),
            postgres_api::Value::Int(int) => Param::Int(int),
            postgres_api::Value::Float(float) => Param::Float(float),
            postgres_api::Value::Boolean(boolean) => Param::Bool(boolean),
            postgres_api::Value::Bytes(bytes) => Param::Bytes(bytes),
        }
    }
}

impl From<crate::destination::StatementError> for postgres_api::Error {
    fn from(err: crate::destination::StatementError) -> postgres_api::Error {
        postgres_api::Error {
            code: err.code,
            message: err.message,
            detail: err.detail,
            constraint: err.constraint,
            table: err.table,
            column: err.column,
            retry: err.retry,
        }
    }
}

impl PluginState {
    /// The running call's transaction and when the call must end.
    fn postgres_call(&mut self) -> Option<(&mut crate::destination::PgCall, tokio::time::Instant)> {
        let ends = tokio::time::Instant::from_std(self.call_ends);
        self.postgres.as_mut().map(|call| (call, ends))
    }

    fn no_postgres(&self) -> postgres_api::Error {
        crate::destination::StatementError {
            message: format!(
                "plugin `{}` has no postgres outside a deliver call, or no `grants.postgres` in its TOML",
                self.plugin.name()
            ),
            ..Default::default()
        }
        .into()
    }
}

/// The `postgres` interface: every statement runs in the call's transaction
/// (see `crate::destination`).
impl postgres_api::Host for PluginState {
    async fn execute(
        &mut self,
        statement: String,
        params: Vec<postgres_api::Value>,
    ) -> Result<u64, postgres_api::Error> {
        let params: Vec<_> = params.into_iter().map(Into::into).collect();
        let Some((call, ends)) = self.postgres_call() else {
            return Err(self.no_postgres());
        };
        Ok(call.execute(ends, &statement, &params).await?)
    }

    async fn query(
        &mut self,
        statement: String,
        params: Vec<postgres_api::Value>,
    ) -> Result<Vec<Vec<Option<String>>>, postgres_api::Error> {
        let params: Vec<_> = params.into_iter().map(Into::into).collect();
        let Some((call, ends)) = self.postgres_call() else {
            return Err(self.no_postgres());
        };
        Ok(call.query(ends, &statement, &params).await?)
    }

    async fn copy_in(
        &mut self,
        statement: String,
        data: Vec<u8>,
    ) -> Result<u64, postgres_api::Error> {
        let Some((call, ends)) = self.postgres_call() else {
            return Err(self.no_postgres());
        };
        Ok(call.copy_in(ends, &statement, data).await?)
    }
}

use super::bindings::sink::weir::plugin::nats as nats_api;

/// The `nats` interface: a publish is checked against the grant and kept
/// until the call's rows have their verdicts (see `crate::destination`).
impl nats_api::Host for PluginState {
    fn publish(
        &mut self,
        row: u32,
        subject: String,
        headers: Vec<(String, String)>,
        payload: Vec<u8>,
    ) -> Result<(), String> {
        match &mut self.nats {
            Some(call) => call.publish(row, subject, headers, payload),
            None => Err(format!(
                "plugin `{}` has no nats outside a deliver call, or no `grants.nats` in its TOML",
                self.plugin.name()
            )),
        }
    }
}

use super::bindings::sink::weir::plugin::objects as objects_api;

/// The `objects` interface: a record is fitted to the grant's format and
/// kept until the call's rows have their verdicts (see `crate::destination`).
impl objects_api::Host for PluginState {
    fn append(&mut self, row: u32, path: String, record: Vec<u8>) -> Result<(), String> {
        match &mut self.objects {
            Some(call) => call.append(row, path, &record),
            None => Err(format!(
                "plugin `{}` has no objects outside a deliver call, or no `grants.objects` in its TOML",
                self.plugin.name()
            )),
        }
    }
}
