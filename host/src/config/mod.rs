//! The weir TOML file: parsed strictly (unknown keys refused), then validated
//! into [`Config`], with every problem reported at once as `file:line:col`.
//!
//! One file per section (`top`, `nats`, `stream`, `delivery`,
//! `dead_letters`, `coordination`, `tenants`, `plugins`, `pipelines`,
//! `policies`, `tls`, `traces`): its raw form, its
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
mod dead_letters;
mod delivery;
pub(crate) mod keys;
use keys::{Key, Reload};
mod nats;
mod objects;
mod pipelines;
mod plugins;
mod policies;
mod stream;
mod tenants;
mod tls;
mod top;
mod traces;
mod units;

use crate::world::World;
// The crate reads every section's types; the outside only those named.
pub(crate) use coordination::*;
pub(crate) use dead_letters::*;
pub use delivery::DEFAULT_DRAIN_TIMEOUT;
pub(crate) use delivery::*;
pub(crate) use nats::*;
pub use nats::{NatsAuth, SyncPolicy};
pub use objects::{
    Column, ColumnType, DEFAULT_OBJECTS_REGION, Format, NdjsonCompression, ObjectsGrant,
    ObjectsTarget, ParquetCompression, Rolling,
};
pub use pipelines::{BadLines, Pipeline};
pub(crate) use plugins::*;
pub use plugins::{PluginConfig, PluginPlaces};
pub(crate) use policies::*;
pub(crate) use stream::*;
pub use stream::{DEFAULT_PARTITIONS, DEFAULT_PREFIX, DEFAULT_SHARDS};
pub(crate) use tenants::*;
pub use tls::{TlsFileError, TlsFiles, read_roots};
pub(crate) use top::*;
pub use top::{DEFAULT_COMPILE_CACHE_MAX_BYTES, user_compile_cache_dir};
pub use traces::TracesConfig;
pub use units::parse_size;

use checker::Checker;
use coordination::RawCoordination;
use dead_letters::RawDeadLetters;
use delivery::RawDelivery;
use nats::RawNats;
use pipelines::RawPipeline;
use plugins::RawPlugin;
use policies::RawPolicies;
use stream::RawStream;
use tenants::RawTenant;
use tls::RawTls;
use traces::RawTraces;
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

/// A position in a config file, for a problem found after it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
}

impl Place {
    /// `message` as a problem at this place.
    pub fn problem(&self, message: impl Into<String>) -> Problem {
        Problem {
            file: self.file.clone(),
            line: self.line,
            column: self.column,
            message: message.into(),
        }
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
    pub dead_letters: DeadLettersConfig,
    pub coordination: CoordinationConfig,
    pub tenants: Vec<Tenant>,
    pub plugins_dir: PathBuf,
    pub plugins: BTreeMap<String, PluginConfig>,
    /// Where each plugin is written, by name.
    pub plugin_places: BTreeMap<String, PluginPlaces>,
    pub pipelines: Vec<Pipeline>,
    pub policies: Policies,
    /// HTTPS for the front door and the operator endpoints; `None`: HTTP.
    pub tls: Option<TlsFiles>,
    /// Where OTLP traces go, if anywhere.
    pub traces: TracesConfig,
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
    dead_letters: RawDeadLetters,
    #[serde(default)]
    tls: RawTls,
    #[serde(default)]
    traces: RawTraces,
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
        match deserialize_all::<RawConfig>(&checker, text) {
            Some(raw) => checker.validate(raw, overrides),
            None => Err(ConfigError::Invalid(Problems(checker.take_problems()))),
        }
    }

    /// The pipeline that takes `table`, if any.
    pub fn pipeline_for(&self, table: &str) -> Option<&Pipeline> {
        self.pipelines
            .iter()
            .find(|pipeline| pipeline.tables.iter().any(|t| t == table))
    }
}

/// At most this many entries are taken out of a document: past that, the
/// file is not worth reading further.
const MAX_REMOVED_ENTRIES: usize = 100;

/// Deserializes `text`, every problem serde finds reported in `checker`:
/// serde stops at the first, so the entry it names is taken out of the
/// document and the rest deserialized again, until it passes. What follows
/// (validation) then runs on the rest, so one run names every problem.
/// `None`: the file is not TOML, or an entry could not be taken out.
fn deserialize_all<'i, T: serde::Deserialize<'i>>(checker: &Checker, text: &'i str) -> Option<T> {
    let mut document = match toml::de::DeTable::parse(text) {
        Ok(document) => document,
        Err(err) => {
            let offset = err.span().map_or(0, |span| span.start);
            checker.report(offset, err.message().trim_end());
            return None;
        }
    };
    // Entries taken out, by (table span, key): a required key taken out
    // makes its table fail as "missing field", which is no second problem.
    let mut removed: Vec<(Span, String)> = Vec::new();
    for _ in 0..MAX_REMOVED_ENTRIES {
        let err = match T::deserialize(toml::de::Deserializer::from(document.clone())) {
            Ok(value) => return Some(value),
            Err(err) => err,
        };
        let message = err.message().trim_end().to_string();
        let Some(span) = err.span() else {
            checker.report(0, message);
            return None;
        };
        let consequence = removed.iter().any(|(table, key)| {
            *table == span && message.starts_with(&format!("missing field `{key}`"))
        });
        if !consequence {
            checker.report(span.start, message);
        }
        let (whole, root) = (document.span(), document.get_mut());
        match take_out(root, whole, &span) {
            Some(taken) => removed.push(taken),
            None => return None,
        }
    }
    checker.report(0, "too many problems: stopped reading here");
    None
}

type Span = std::ops::Range<usize>;

/// Takes the entry of `table` (spanning `whole`, at any depth) whose key or
/// value is at `span` out of the document, else the innermost one holding
/// `span`; its table's span and key (empty for an array's item).
fn take_out(table: &mut toml::de::DeTable<'_>, whole: Span, span: &Span) -> Option<(Span, String)> {
    take_out_where(table, whole.clone(), &|at: &Span| at == span).or_else(|| {
        take_out_where(table, whole, &|at: &Span| {
            at.start <= span.start && span.end <= at.end
        })
    })
}

/// The first entry (depth first, innermost) at a span `matches` accepts,
/// taken out.
fn take_out_where(
    table: &mut toml::de::DeTable<'_>,
    whole: Span,
    matches: &dyn Fn(&Span) -> bool,
) -> Option<(Span, String)> {
    let mut target = None;
    for (key, value) in table.iter_mut() {
        let value_span = value.span();
        if let Some(inner) = take_out_of_value(value.get_mut(), value_span.clone(), matches) {
            return Some(inner);
        }
        if matches(&key.span()) || matches(&value_span) {
            target = Some(key.clone());
            break;
        }
    }
    let key = target?;
    // Keys compare by name, not span: this is the one entry of that name.
    table.remove(&key);
    Some((whole, key.get_ref().to_string()))
}

/// [`take_out_where`] within a table or an array value.
fn take_out_of_value(
    value: &mut toml::de::DeValue<'_>,
    whole: Span,
    matches: &dyn Fn(&Span) -> bool,
) -> Option<(Span, String)> {
    use toml::de::DeValue;
    match value {
        DeValue::Table(table) => take_out_where(table, whole, matches),
        DeValue::Array(array) => {
            for item in array.as_mut().iter_mut() {
                let item_span = item.span();
                if let DeValue::Table(table) = item.get_mut()
                    && let Some(inner) = take_out_where(table, item_span, matches)
                {
                    return Some(inner);
                }
            }
            let at = array.iter().position(|item| matches(&item.span()))?;
            *array = array
                .iter()
                .enumerate()
                .filter(|(index, _)| *index != at)
                .map(|(_, item)| item.clone())
                .collect();
            Some((whole, String::new()))
        }
        _ => None,
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
        let dead_letters = self.dead_letters(&raw.dead_letters);
        let tls = self.tls(&raw.tls);
        let traces = self.traces(&raw.traces);
        let coordination = self.coordination(&raw.coordination);
        let mut tenant_keys = HashSet::new();
        let tenants = self.tenants(raw.tenants, &mut tenant_keys, &nats);
        let admin_api_keys = self.admin_keys(
            raw.admin_api_keys,
            raw.admin_api_keys_file.as_ref(),
            &tenant_keys,
        );
        let (plugins, plugin_places) =
            self.plugins(raw.plugins, &places.plugins_dir, &stream.prefix);
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
            dead_letters,
            coordination,
            tenants,
            plugins_dir: places.plugins_dir,
            plugins,
            plugin_places,
            pipelines,
            policies,
            max_plugin_instances: limits.max_plugin_instances,
            tls,
            traces,
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
        dead_letters::KEYS,
        coordination::KEYS,
        tenants::KEYS,
        plugins::KEYS,
        plugins::grant_keys(),
        pipelines::KEYS,
        policies::KEYS,
        tls::KEYS,
        traces::KEYS,
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
