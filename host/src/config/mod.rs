//! The weir TOML file: parsed strictly (unknown keys refused), then validated
//! into [`Config`], with every problem reported at once as `file:line:col`.
//!
//! One file per section (`top`, `nats`, `stream`, `delivery`, `coordination`,
//! `tenants`, `plugins`, `pipelines`, `policies`): its raw form, its
//! validated type, its named defaults and its keys with their reload class
//! ([`keys`]). `checker` holds what the sections share.
//!
//! Exported: `Config`, `ConfigError`, `Overrides`, and of the sections only
//! what the binary, tests and benches name (`Pipeline`, `PluginConfig`,
//! `NatsAuth`, `SyncPolicy`, three defaults, `user_compile_cache_dir`,
//! `parse_size`); the rest is the crate's.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

mod checker;
mod coordination;
mod delivery;
pub(crate) mod keys;
use keys::{Key, Reload};
mod nats;
mod pipelines;
mod plugins;
mod policies;
mod stream;
mod tenants;
mod top;
mod units;

use crate::world::World;
// The crate reads every section's types; the outside only those named.
pub(crate) use coordination::*;
pub(crate) use delivery::*;
pub(crate) use nats::*;
pub use nats::{NatsAuth, SyncPolicy};
pub use pipelines::{BadLines, Pipeline};
pub use plugins::PluginConfig;
pub(crate) use plugins::*;
pub(crate) use policies::*;
pub(crate) use stream::*;
pub use stream::{DEFAULT_PARTITIONS, DEFAULT_SHARDS};
pub(crate) use tenants::*;
pub(crate) use top::*;
pub use top::{DEFAULT_COMPILE_CACHE_MAX_BYTES, user_compile_cache_dir};
pub use units::parse_size;

use checker::Checker;
use coordination::RawCoordination;
use delivery::RawDelivery;
use nats::RawNats;
use pipelines::RawPipeline;
use plugins::RawPlugin;
use policies::RawPolicies;
use stream::RawStream;
use tenants::RawTenant;
use units::Size;

/// Why a configuration was refused. `Invalid` lists every problem found.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(Problems),
}

/// Every problem found in one config file, each with its position.
#[derive(Debug)]
pub struct Problems(pub Vec<Problem>);

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for problem in &self.0 {
            if !first {
                writeln!(f)?;
            }
            first = false;
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// One problem in a config file: `file:line:col: message`.
#[derive(Debug, Clone)]
pub struct Problem {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file.display(),
            self.line,
            self.column,
            self.message
        )
    }
}

/// The validated configuration a host runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this came from; relative paths in it are relative to its folder.
    pub source: PathBuf,
    /// What the command line and the environment set over the file: a
    /// reload reads the file again under the same ones.
    pub overrides: Overrides,
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Compiled plugins, shared by every data dir of the user.
    pub compile_cache_dir: PathBuf,
    /// The compiled cache's bound; least recently used entries go first.
    pub compile_cache_max_bytes: u64,
    pub max_body_bytes: usize,
    /// A top-level row field whose value dedupes the row (its message id).
    pub idempotency_field: Option<String>,
    /// Bearer keys of the admin API (`POST /v1/admin/reload`); none: off.
    pub admin_api_keys: Vec<String>,
    pub nats: NatsConfig,
    pub stream: StreamConfig,
    pub delivery: DeliveryConfig,
    pub coordination: CoordinationConfig,
    pub tenants: Vec<Tenant>,
    pub plugins_dir: PathBuf,
    pub plugins: BTreeMap<String, PluginConfig>,
    pub pipelines: Vec<Pipeline>,
    pub policies: Policies,
    /// The plugin instance pool's size as the operator set it; `None`: sized
    /// from the topology and pipelines ([`Config::plugin_instances`]).
    pub max_plugin_instances: Option<u32>,
}

/// The whole file as written: the top-level keys and each section's raw form.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<Spanned<String>>,
    data_dir: Option<String>,
    compile_cache_dir: Option<String>,
    compile_cache_max_bytes: Option<Spanned<Size>>,
    max_body_bytes: Option<Spanned<Size>>,
    max_plugin_instances: Option<Spanned<u32>>,
    idempotency_field: Option<String>,
    #[serde(default)]
    admin_api_keys: Vec<Spanned<String>>,
    admin_api_keys_file: Option<Spanned<String>>,
    #[serde(default)]
    nats: RawNats,
    #[serde(default)]
    stream: RawStream,
    #[serde(default)]
    delivery: RawDelivery,
    #[serde(default)]
    coordination: RawCoordination,
    #[serde(default)]
    tenants: Vec<RawTenant>,
    plugins_dir: Option<String>,
    #[serde(default)]
    plugins: BTreeMap<Spanned<String>, RawPlugin>,
    #[serde(default)]
    pipelines: Vec<RawPipeline>,
    #[serde(default)]
    policies: RawPolicies,
}

/// Overrides that come from the command line or `WEIR_*` variables; they win
/// over the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    pub nats_url: Option<String>,
    /// Wins, setting by setting, over `[nats]` in the file.
    pub nats_auth: NatsAuth,
    pub data_dir: Option<PathBuf>,
    /// Create (or update) streams and consumers against an operator's NATS.
    pub create_topology: bool,
}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(path, &text, overrides)
    }

    /// Parses and validates config text; `path` names it in errors and anchors
    /// relative paths.
    pub fn parse(path: &Path, text: &str, overrides: &Overrides) -> Result<Config, ConfigError> {
        let checker = Checker::new(path, text);
        let raw: RawConfig = toml::from_str(text).map_err(|err| {
            let offset = err.span().map(|span| span.start).unwrap_or(0);
            ConfigError::Invalid(Problems(vec![
                checker.problem(offset, err.message().trim_end().to_string()),
            ]))
        })?;
        checker.validate(raw, overrides)
    }

    /// The pipeline that takes `table`, if any.
    pub fn pipeline_for(&self, table: &str) -> Option<&Pipeline> {
        self.pipelines
            .iter()
            .find(|pipeline| pipeline.tables.iter().any(|t| t == table))
    }
}

impl Checker<'_> {
    /// Each section in the order its problems are reported, then the whole.
    fn validate(self, raw: RawConfig, overrides: &Overrides) -> Result<Config, ConfigError> {
        let listen = self.listen(raw.listen.as_ref(), overrides);
        let places = self.places(
            raw.data_dir.as_deref(),
            raw.compile_cache_dir.as_deref(),
            raw.plugins_dir.as_deref(),
            overrides,
        );
        let nats = self.nats(raw.nats, overrides, raw.stream.replicas.as_ref());
        let stream = self.stream(&raw.stream, overrides);
        let delivery = self.delivery(&raw.delivery);
        let coordination = self.coordination(&raw.coordination);
        let mut tenant_keys = HashSet::new();
        let tenants = self.tenants(raw.tenants, &mut tenant_keys);
        let admin_api_keys = self.admin_keys(
            raw.admin_api_keys,
            raw.admin_api_keys_file.as_ref(),
            &tenant_keys,
        );
        let plugins = self.plugins(raw.plugins, &places.plugins_dir, &stream.prefix);
        let pipelines = self.pipelines(raw.pipelines, &plugins);
        let policies = self.policies(raw.policies, &plugins);
        let limits = self.limits(
            &raw.max_body_bytes,
            &raw.compile_cache_max_bytes,
            raw.max_plugin_instances,
        );

        let problems = self.take_problems();
        if !problems.is_empty() {
            return Err(ConfigError::Invalid(Problems(problems)));
        }
        Ok(Config {
            source: self.file,
            overrides: overrides.clone(),
            listen,
            data_dir: places.data_dir,
            compile_cache_dir: places.compile_cache_dir,
            compile_cache_max_bytes: limits.compile_cache_max_bytes,
            max_body_bytes: limits.max_body_bytes,
            idempotency_field: raw.idempotency_field,
            admin_api_keys,
            nats,
            stream,
            delivery,
            coordination,
            tenants,
            plugins_dir: places.plugins_dir,
            plugins,
            pipelines,
            policies,
            max_plugin_instances: limits.max_plugin_instances,
        })
    }
}

/// Every key, top level first, in the order of docs/configuration.md.
pub fn all_keys() -> impl Iterator<Item = &'static Key> {
    [
        top::KEYS,
        nats::KEYS,
        stream::KEYS,
        delivery::KEYS,
        coordination::KEYS,
        tenants::KEYS,
        plugins::KEYS,
        pipelines::KEYS,
        policies::KEYS,
    ]
    .into_iter()
    .flatten()
}

/// Whether every key of `section` needs a restart: a reload then names the
/// section (`[stream]`), not each key.
pub fn restarts_as_a_whole(section: &str) -> bool {
    !section.is_empty()
        && all_keys()
            .filter(|key| key.section == section)
            .all(|key| matches!(key.reload, Reload::Restart(_)))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod docs_tests;
