//! The weir TOML file: parsed strictly (unknown keys refused), then validated
//! into [`Config`], with every problem reported at once as `file:line:col`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

pub mod units;

use crate::world::World;
use units::{HumanDuration, Size, show_duration, show_size};

/// Default HTTP listen address of the front door.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Largest ingest body accepted by default (16 MiB): big enough for thousands
/// of rows, small enough that one request cannot hog a host's memory.
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 << 20;
/// Default memory cap of one plugin instance (64 MiB of linear memory).
pub const DEFAULT_PLUGIN_MEMORY_MB: u32 = 64;
/// Default CPU deadline of one plugin call.
pub const DEFAULT_PLUGIN_DEADLINE_MS: u64 = 2_000;
/// `grants.state` limits per scope: keys, and bytes of keys and values. A
/// scope is one KV value, so its bytes stay well under a NATS message.
pub const DEFAULT_STATE_KEYS: u64 = 10_000;
pub const MAX_STATE_KEYS: u64 = 100_000;
pub const DEFAULT_STATE_BYTES: u64 = 256 * 1024;
pub const MAX_STATE_BYTES: u64 = 768 * 1024;
/// A warm instance whose linear memory grew this much since `init` is
/// replaced: linear memory never shrinks, so a leak would otherwise stay.
pub const DEFAULT_RECYCLE_AFTER_GROWTH_MB: u32 = 16;
/// Longest tenant or table name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// Default partitions: four units (one shard each), enough to spread a few
/// hosts' work. Separate streams deliver at the raw limit, where four
/// shards of one stream reach ~0.6 of it (ARCHITECTURE.md, "Topology").
pub const DEFAULT_PARTITIONS: u32 = 4;
/// Default shards per partition.
pub const DEFAULT_SHARDS: u32 = 1;
/// A crashed host's units are taken over within about this long.
const DEFAULT_MEMBER_TTL_SECS: u64 = 5;
const MIN_MEMBER_TTL_SECS: u64 = 3;
/// Partition streams a topology may have.
pub const MAX_PARTITIONS: u32 = 64;
/// Shards per partition; below the per-stream consumer limit weir sets.
pub const MAX_SHARDS: u32 = 200;
/// The pooling allocator reserves this much address space per memory, so no
/// plugin may ask for more.
pub const MAX_PLUGIN_MEMORY_MB: u32 = 4_096;

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

/// The smallest plugin instance pool a host sizes for itself.
pub const DEFAULT_PLUGIN_INSTANCES: u32 = 256;

/// The compiled cache's bound when the config sets none: room for many
/// interpreter-sized (Python, JS) plugins, and far more Rust ones.
pub const DEFAULT_COMPILE_CACHE_MAX_BYTES: u64 = 2 << 30;
/// Overrides where the compiled cache is by default
/// (`compile_cache_dir` in the TOML wins).
pub const COMPILE_CACHE_DIR_ENV: &str = "WEIR_CACHE_DIR";

/// Where compiled plugins are kept when the config does not say:
/// [`user_compile_cache_dir`], else (no home) `<data_dir>/compiled`.
pub fn default_compile_cache_dir(data_dir: &Path) -> PathBuf {
    user_compile_cache_dir().unwrap_or_else(|| data_dir.join("compiled"))
}

/// The user's compiled cache, shared by all their data dirs:
/// `$WEIR_CACHE_DIR`, else `$XDG_CACHE_HOME/weir/compiled`, else
/// `~/.cache/weir/compiled`.
pub fn user_compile_cache_dir() -> Option<PathBuf> {
    let set = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
    if let Some(dir) = set(COMPILE_CACHE_DIR_ENV) {
        return Some(PathBuf::from(dir));
    }
    if let Some(cache) = set("XDG_CACHE_HOME") {
        return Some(PathBuf::from(cache).join("weir/compiled"));
    }
    set("HOME").map(|home| PathBuf::from(home).join(".cache/weir/compiled"))
}
/// The largest plugin instance pool: its slots are address space reserved
/// up front (two 4 GiB memories each), and 64-bit Linux gives a process 128 TiB.
pub const MAX_PLUGIN_INSTANCES: u32 = 8_192;
/// Instances of each front-door policy kept for concurrent requests.
const POLICY_INSTANCES: u32 = 64;

impl Config {
    /// How many plugin instances this host may hold at once. Each unit may
    /// run every step of every pipeline on an instance of its own; up to
    /// `isolating_units` units at once isolate rows that ran into their
    /// deadline on `isolation_lanes` more instances of one pipeline; a hot
    /// reload briefly holds the old and the new generation; the front door
    /// holds instances of its policies.
    pub fn plugin_instances(&self, isolation_lanes: u32, isolating_units: u32) -> u32 {
        if let Some(set) = self.max_plugin_instances {
            return set;
        }
        let units = self.stream.partitions.saturating_mul(self.stream.shards);
        let steps = |p: &Pipeline| p.transforms.len() + usize::from(p.sink.is_some());
        let all_steps: usize = self.pipelines.iter().map(steps).sum();
        let longest = self.pipelines.iter().map(steps).max().unwrap_or(0);
        let to_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let isolation = units
            .min(isolating_units)
            .saturating_mul(isolation_lanes)
            .saturating_mul(to_u32(longest));
        let policies = [&self.policies.budget, &self.policies.router]
            .iter()
            .filter(|policy| policy.is_some())
            .count() as u32;
        units
            .saturating_mul(to_u32(all_steps))
            .saturating_add(isolation)
            .saturating_add(policies * POLICY_INSTANCES)
            .saturating_mul(2)
            .clamp(DEFAULT_PLUGIN_INSTANCES, MAX_PLUGIN_INSTANCES)
    }
}

/// The per-tenant policies the front door asks (plugins of the `budget`
/// and `router` worlds). None: no budget, the default route.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policies {
    pub budget: Option<String>,
    pub router: Option<String>,
    /// A top-level row field whose value is the row's routing key.
    pub routing_field: Option<String>,
}

/// Where NATS is. `url: None` means weir starts its own nats-server.
#[derive(Debug, Clone, PartialEq)]
pub struct NatsConfig {
    /// A URL or a comma-separated seed list.
    pub url: Option<String>,
    pub auth: NatsAuth,
    pub embedded: EmbeddedConfig,
}

/// How weir proves who it is to an operator's NATS, as the `nats` CLI
/// takes it: at most one of creds, nkey, token or user/password, plus TLS.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NatsAuth {
    /// A `.creds` file (user JWT and nkey seed).
    pub creds: Option<PathBuf>,
    /// A file holding an nkey seed.
    pub nkey: Option<PathBuf>,
    pub token: Option<String>,
    pub user: Option<String>,
    pub password: Option<String>,
    /// PEM CA bundle that signs the server's certificate.
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate and its key, for servers that verify clients.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

impl NatsAuth {
    /// Each setting of `self`, else the one of `fallback`.
    pub fn or(self, fallback: NatsAuth) -> NatsAuth {
        NatsAuth {
            creds: self.creds.or(fallback.creds),
            nkey: self.nkey.or(fallback.nkey),
            token: self.token.or(fallback.token),
            user: self.user.or(fallback.user),
            password: self.password.or(fallback.password),
            tls_ca: self.tls_ca.or(fallback.tls_ca),
            tls_cert: self.tls_cert.or(fallback.tls_cert),
            tls_key: self.tls_key.or(fallback.tls_key),
        }
    }

    /// Problems no server could fix: two ways to log in, half a pair.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let ways: Vec<&str> = [
            ("creds", self.creds.is_some()),
            ("nkey", self.nkey.is_some()),
            ("token", self.token.is_some()),
            ("user", self.user.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        if ways.len() > 1 {
            problems.push(format!(
                "[nats] sets {}: use one way to log in",
                ways.join(" and ")
            ));
        }
        if self.password.is_some() && self.user.is_none() {
            problems.push("[nats] password is set without user".to_string());
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            problems
                .push("[nats] a client certificate needs both tls_cert and tls_key".to_string());
        }
        problems
    }

    /// Whether any setting asks for TLS.
    pub fn wants_tls(&self) -> bool {
        self.tls_ca.is_some() || self.tls_cert.is_some()
    }
}

/// How the embedded nats-server runs when no URL is configured.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddedConfig {
    /// The nats-server binary; `None` looks at `WEIR_NATS_SERVER`, then PATH.
    pub binary: Option<PathBuf>,
    pub sync: SyncPolicy,
}

/// When the embedded server makes a write durable before acknowledging it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncPolicy {
    /// fsync every write before the PubAck: a 2xx survives power loss.
    /// About 30× slower on the project's machines (NATS-NOTES.md).
    Always,
    /// nats-server's default: flush every two minutes. A weir or nats-server
    /// crash loses nothing; an OS crash or power loss can lose acknowledged rows.
    Periodic,
}

/// The partition stream(s) rows are stored in.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamConfig {
    /// Prefix of every subject and stream name weir uses.
    pub prefix: String,
    /// N: partition streams.
    pub partitions: u32,
    /// V: shards per partition; a unit is one shard's durable consumer.
    pub shards: u32,
    /// Create the topology instead of only verifying it. Always on for the
    /// embedded server, which is weir's own.
    pub create: bool,
    /// Byte limit of a partition stream; past it, publishes are refused.
    pub max_bytes: i64,
    /// Window in which a repeated message id is stored only once.
    pub duplicate_window: Duration,
    /// Copies of every stream, bucket and store weir uses (1, 3 or 5).
    pub replicas: u32,
}

/// How rows are fetched and handed to pipelines.
#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    pub batch_rows: usize,
    /// Rows asked for per pull request (at least `batch_rows`): the server
    /// sends the next batches' rows while one runs, in fewer requests.
    pub pull_rows: usize,
    pub batch_bytes: usize,
    /// How long a batch may go on filling after its first row.
    pub batch_wait: Duration,
    /// A batch also closes once no row arrived for this long (zero: as
    /// soon as none is waiting), so a lone request's rows need not wait
    /// out `batch_wait`. Defaults to `batch_wait`: no early close.
    pub batch_idle: Duration,
    /// Time JetStream waits for an ack before redelivering a row.
    pub ack_wait: Duration,
    /// After this many deliveries a row that still asks for a retry is dead-lettered.
    pub max_deliveries: u32,
    /// Delay before a row whose plugin call failed is redelivered the first
    /// time; it doubles with each delivery up to `failure_delay_cap`.
    pub failure_delay: Duration,
    pub failure_delay_cap: Duration,
    /// How long a planned stop (or handover) waits for a unit's last rows
    /// and for the server to confirm their acks applied.
    pub drain_timeout: Duration,
}

impl DeliveryConfig {
    /// Delay before the retry of a failing row at its `attempt`-th delivery:
    /// doubling from `failure_delay` up to `failure_delay_cap`, with ±20%
    /// jitter (from the row's sequence) so rows that failed together do not
    /// all come back at once.
    pub fn backoff(&self, attempt: i64, sequence: u64) -> Duration {
        let doublings = attempt.saturating_sub(1).clamp(0, 20) as u32;
        let delay = self
            .failure_delay
            .saturating_mul(1 << doublings)
            .min(self.failure_delay_cap);
        let mixed =
            (sequence ^ (attempt as u64).rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let permille = (mixed >> 54) % 401;
        delay.mul_f64(0.8 + permille as f64 / 1000.0)
    }
}

/// How this host takes part in a fleet sharing the units.
#[derive(Debug, Clone, PartialEq)]
pub struct CoordinationConfig {
    /// This host's member name; `None` keeps a generated one in the data
    /// directory, so a restarted process is recognised as the same member.
    pub host_id: Option<String>,
    /// How long a member key lives without renewal: a crashed host's units
    /// are taken over within about this long.
    pub member_ttl: Duration,
}

#[derive(Debug, Clone)]
pub struct Tenant {
    pub name: String,
    pub api_keys: Vec<String>,
}

/// One plugin as named in the TOML. Compared on reload: a changed entry
/// reloads its plugin.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    pub name: String,
    /// Absolute path of the component.
    pub wasm: PathBuf,
    pub world: World,
    /// The settings table, as the JSON object handed to `init`.
    pub settings: serde_json::Value,
    pub memory_bytes: usize,
    pub deadline: Duration,
    /// After this many batches an instance is replaced by a fresh one, so its
    /// linear memory cannot grow without bound.
    pub recycle_after_batches: u64,
    /// ... or once its linear memory has grown this much since `init`.
    pub recycle_after_growth_bytes: usize,
    pub grants: Grants,
}

/// What `grants.state` allows one scope (a plugin's state of one tenant's
/// table) to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateLimits {
    pub max_keys: usize,
    /// Keys and values together.
    pub max_bytes: usize,
}

/// What a plugin may reach. Nothing by default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Grants {
    pub dirs: Vec<DirGrant>,
    /// Environment variables the plugin sees (it sees none otherwise).
    pub env: BTreeMap<String, String>,
    /// `host:port` authorities the plugin may reach over outbound HTTP
    /// (`wasi:http`), lowercased; empty: every request is refused.
    pub http: Vec<String>,
    /// Durable state per (plugin, tenant, table), within these limits;
    /// `None`: every `state` call is refused.
    pub state: Option<StateLimits>,
}

/// A host directory preopened for a plugin under a guest path.
#[derive(Debug, Clone, PartialEq)]
pub struct DirGrant {
    pub host: PathBuf,
    pub guest: String,
    pub writable: bool,
}

/// Which tables go through which plugins, in order.
#[derive(Debug, Clone)]
pub struct Pipeline {
    pub tables: Vec<String>,
    pub transforms: Vec<String>,
    pub sink: Option<String>,
}

// ---- raw form, exactly as written in the file ----

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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicies {
    budget: Option<Spanned<String>>,
    router: Option<Spanned<String>>,
    routing_field: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNats {
    url: Option<String>,
    creds: Option<String>,
    nkey: Option<String>,
    token: Option<String>,
    user: Option<String>,
    password: Option<String>,
    tls_ca: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
    server_binary: Option<String>,
    sync: Option<SyncPolicy>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStream {
    prefix: Option<Spanned<String>>,
    partitions: Option<Spanned<u32>>,
    shards: Option<Spanned<u32>>,
    create: Option<bool>,
    max_bytes: Option<Spanned<Size>>,
    duplicate_window: Option<Spanned<HumanDuration>>,
    duplicate_window_secs: Option<Spanned<u64>>,
    replicas: Option<Spanned<u32>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDelivery {
    batch_rows: Option<Spanned<usize>>,
    pull_rows: Option<Spanned<usize>>,
    batch_bytes: Option<Spanned<Size>>,
    batch_wait: Option<Spanned<HumanDuration>>,
    batch_wait_ms: Option<Spanned<u64>>,
    batch_idle: Option<Spanned<HumanDuration>>,
    ack_wait: Option<Spanned<HumanDuration>>,
    ack_wait_secs: Option<Spanned<u64>>,
    max_deliveries: Option<Spanned<u32>>,
    failure_delay: Option<Spanned<HumanDuration>>,
    failure_delay_ms: Option<Spanned<u64>>,
    failure_delay_cap: Option<Spanned<HumanDuration>>,
    failure_delay_cap_ms: Option<Spanned<u64>>,
    drain_timeout: Option<Spanned<HumanDuration>>,
    drain_timeout_secs: Option<Spanned<u64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCoordination {
    host_id: Option<Spanned<String>>,
    member_ttl: Option<Spanned<HumanDuration>>,
    member_ttl_secs: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    name: Spanned<String>,
    #[serde(default)]
    api_keys: Vec<Spanned<String>>,
    /// A file of more keys, one per line (`#` comments): secrets kept out
    /// of the TOML, rotated by a reload.
    api_keys_file: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlugin {
    wasm: Spanned<String>,
    world: World,
    #[serde(default)]
    settings: Option<toml::Table>,
    memory: Option<Spanned<Size>>,
    memory_mb: Option<Spanned<u32>>,
    deadline: Option<Spanned<HumanDuration>>,
    deadline_ms: Option<Spanned<u64>>,
    recycle_after_batches: Option<u64>,
    recycle_after_growth: Option<Spanned<Size>>,
    recycle_after_growth_mb: Option<Spanned<u32>>,
    #[serde(default)]
    grants: RawGrants,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGrants {
    #[serde(default)]
    dirs: Vec<RawDirGrant>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    http: Vec<Spanned<String>>,
    state: Option<RawStateGrant>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStateGrant {
    max_keys: Option<Spanned<u64>>,
    max_bytes: Option<Spanned<Size>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDirGrant {
    host: Spanned<String>,
    guest: Spanned<String>,
    #[serde(default)]
    writable: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPipeline {
    tables: Vec<Spanned<String>>,
    #[serde(default)]
    transforms: Vec<Spanned<String>>,
    sink: Option<Spanned<String>>,
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

/// The unit of an older integer duration key.
#[derive(Clone, Copy)]
enum Legacy {
    Secs,
    Millis,
}

impl Legacy {
    fn suffix(self) -> &'static str {
        match self {
            Legacy::Secs => "secs",
            Legacy::Millis => "ms",
        }
    }

    fn of(self, value: u64) -> Duration {
        match self {
            Legacy::Secs => Duration::from_secs(value),
            Legacy::Millis => Duration::from_millis(value),
        }
    }
}

/// Turns byte offsets into positions and collects problems.
struct Checker<'a> {
    file: PathBuf,
    base_dir: PathBuf,
    text: &'a str,
    problems: std::cell::RefCell<Vec<Problem>>,
}

impl<'a> Checker<'a> {
    fn new(file: &Path, text: &'a str) -> Self {
        let base_dir = file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Checker {
            file: file.to_path_buf(),
            base_dir,
            text,
            problems: Default::default(),
        }
    }

    fn problem(&self, offset: usize, message: String) -> Problem {
        let before = &self.text[..offset.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rfind('\n').map_or(before.chars().count(), |nl| {
            before[nl + 1..].chars().count()
        }) + 1;
        Problem {
            file: self.file.clone(),
            line,
            column,
            message,
        }
    }

    /// The keys in a keys file (one per line; blank lines and `#` comments
    /// skipped), each spanned at the file setting so problems point there.
    fn keys_from_file(&self, file: Option<&Spanned<String>>) -> Vec<Spanned<String>> {
        let Some(file) = file else {
            return Vec::new();
        };
        let path = self.resolve(file.get_ref());
        match std::fs::read_to_string(&path) {
            Ok(text) => text
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with('#'))
                .map(|key| Spanned::new(file.span(), key.to_string()))
                .collect(),
            Err(err) => {
                self.report(
                    file.span().start,
                    format!("cannot read keys file {}: {err}", path.display()),
                );
                Vec::new()
            }
        }
    }

    /// An optional number's value, or `default`; one below `min` is
    /// reported where it is written (nothing is clamped silently).
    fn at_least<T: PartialOrd + Copy + std::fmt::Display>(
        &self,
        name: &str,
        value: &Option<Spanned<T>>,
        min: T,
        default: T,
    ) -> T {
        match value {
            Some(set) if *set.get_ref() < min => {
                self.report(set.span().start, format!("{name} must be at least {min}"));
                default
            }
            Some(set) => *set.get_ref(),
            None => default,
        }
    }

    /// A duration written as `key = "30s"` or as its older integer key
    /// (`key_secs`, `key_ms`); `default` when absent, and one below `min`
    /// reported where it is written.
    fn duration(
        &self,
        key: &str,
        human: &Option<Spanned<HumanDuration>>,
        (unit, legacy): (Legacy, &Option<Spanned<u64>>),
        min: Duration,
        default: Duration,
    ) -> Duration {
        let name = key.split(' ').next().unwrap_or(key);
        let legacy_key = format!("{name}_{}", unit.suffix());
        let set = match (human, legacy) {
            (Some(human), Some(old)) => {
                self.report(
                    old.span().start,
                    format!("{legacy_key} and {name} are the same setting: keep one"),
                );
                Some((human.span().start, human.get_ref().0))
            }
            (Some(human), None) => Some((human.span().start, human.get_ref().0)),
            (None, Some(old)) => Some((old.span().start, unit.of(*old.get_ref()))),
            (None, None) => None,
        };
        match set {
            Some((at, value)) if value < min => {
                self.report(at, format!("{key} must be at least {}", show_duration(min)));
                default
            }
            Some((_, value)) => value,
            None => default,
        }
    }

    /// A size in `min..=max` bytes; `default` when absent.
    fn size(
        &self,
        key: &str,
        value: &Option<Spanned<Size>>,
        min: u64,
        max: u64,
        default: u64,
    ) -> u64 {
        match value {
            Some(set) if !(min..=max).contains(&set.get_ref().0) => {
                let range = if max == u64::MAX || max >= i64::MAX as u64 {
                    format!("at least {}", show_size(min))
                } else {
                    format!("between {} and {}", show_size(min), show_size(max))
                };
                self.report(set.span().start, format!("{key} must be {range}"));
                default
            }
            Some(set) => set.get_ref().0,
            None => default,
        }
    }

    /// A size written as `key = "64MiB"` or as its older `key_mb` integer.
    fn megabytes(
        &self,
        key: &str,
        human: &Option<Spanned<Size>>,
        legacy: &Option<Spanned<u32>>,
        default: u64,
        max: u64,
    ) -> u64 {
        let legacy = legacy
            .as_ref()
            .map(|mb| Spanned::new(mb.span(), Size(u64::from(*mb.get_ref()) << 20)));
        if let (Some(_), Some(old)) = (human, &legacy) {
            self.report(
                old.span().start,
                format!("{key}_mb and {key} are the same setting: keep one"),
            );
        }
        self.size(key, &human.clone().or(legacy), 1 << 20, max, default)
    }

    fn report(&self, offset: usize, message: impl Into<String>) {
        let problem = self.problem(offset, message.into());
        self.problems.borrow_mut().push(problem);
    }

    fn resolve(&self, path: &str) -> PathBuf {
        let path = Path::new(path);
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }

    /// Tenant and table names are encoded into subject tokens, so any
    /// printable text will do; only emptiness, control characters and
    /// absurd lengths are refused.
    fn check_name(&self, what: &str, name: &Spanned<String>) {
        let value = name.get_ref();
        if value.is_empty() || value.len() > MAX_NAME_BYTES || value.chars().any(char::is_control) {
            self.report(
                name.span().start,
                format!("{what} `{value}` must be 1 to {MAX_NAME_BYTES} bytes without control characters"),
            );
        }
    }

    /// A count in `1..=max`, `default` when absent.
    fn check_count(&self, what: &str, value: Option<&Spanned<u32>>, default: u32, max: u32) -> u32 {
        let Some(value) = value else { return default };
        if !(1..=max).contains(value.get_ref()) {
            self.report(
                value.span().start,
                format!("{what} must be between 1 and {max}"),
            );
            return default;
        }
        *value.get_ref()
    }

    fn coordination(&self, raw: &RawCoordination) -> CoordinationConfig {
        if let Some(id) = &raw.host_id {
            self.check_token("host_id", id);
        }
        // A member renews three times per TTL and steps down a second
        // before it runs out: below 3 s that leaves no time to renew.
        let member_ttl = self.duration(
            "member_ttl",
            &raw.member_ttl,
            (Legacy::Secs, &raw.member_ttl_secs),
            Duration::from_secs(MIN_MEMBER_TTL_SECS),
            Duration::from_secs(DEFAULT_MEMBER_TTL_SECS),
        );
        CoordinationConfig {
            host_id: raw.host_id.as_ref().map(|id| id.get_ref().clone()),
            member_ttl,
        }
    }

    /// Names used verbatim in stream and consumer names: a safe alphabet.
    fn check_token(&self, what: &str, name: &Spanned<String>) {
        let value = name.get_ref();
        let ok = !value.is_empty()
            && value.len() <= 64
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok {
            self.report(
                name.span().start,
                format!("{what} `{value}` must be 1 to 64 characters of A-Z, a-z, 0-9, `_` or `-`"),
            );
        }
    }

    fn validate(self, raw: RawConfig, overrides: &Overrides) -> Result<Config, ConfigError> {
        let listen = match (&overrides.listen, &raw.listen) {
            (Some(addr), _) => *addr,
            (None, Some(text)) => text.get_ref().parse().unwrap_or_else(|err| {
                self.report(
                    text.span().start,
                    format!("listen `{}` is not an address: {err}", text.get_ref()),
                );
                DEFAULT_LISTEN.parse().expect("constant address parses")
            }),
            (None, None) => DEFAULT_LISTEN.parse().expect("constant address parses"),
        };
        let data_dir = overrides
            .data_dir
            .clone()
            .unwrap_or_else(|| self.resolve(raw.data_dir.as_deref().unwrap_or("data")));
        let compile_cache_dir = match raw.compile_cache_dir.as_deref() {
            Some(dir) => self.resolve(dir),
            None => default_compile_cache_dir(&data_dir),
        };

        let n = &raw.nats;
        let path = |value: &Option<String>| value.as_deref().map(|p| self.resolve(p));
        let file_auth = NatsAuth {
            creds: path(&n.creds),
            nkey: path(&n.nkey),
            token: n.token.clone(),
            user: n.user.clone(),
            password: n.password.clone(),
            tls_ca: path(&n.tls_ca),
            tls_cert: path(&n.tls_cert),
            tls_key: path(&n.tls_key),
        };
        let auth = overrides.nats_auth.clone().or(file_auth);
        for problem in auth.problems() {
            self.report(0, problem);
        }
        let url = overrides.nats_url.clone().or(raw.nats.url);
        if url.is_none() && auth != NatsAuth::default() {
            self.report(
                0,
                "[nats] has a login or TLS setting but no url (or NATS_URL): the embedded server needs neither",
            );
        }
        if url.is_none()
            && let Some(set) = raw.stream.replicas.as_ref().filter(|r| *r.get_ref() > 1)
        {
            self.report(
                set.span().start,
                "replicas above 1 need a NATS cluster (set [nats] url): the embedded server is one node",
            );
        }
        let nats = NatsConfig {
            url,
            auth,
            embedded: EmbeddedConfig {
                binary: raw.nats.server_binary.as_deref().map(|b| self.resolve(b)),
                sync: raw.nats.sync.unwrap_or(SyncPolicy::Always),
            },
        };

        let prefix = raw
            .stream
            .prefix
            .clone()
            .unwrap_or_else(|| Spanned::new(0..0, "weir".to_string()));
        self.check_token("stream prefix", &prefix);
        let partitions = self.check_count(
            "partitions",
            raw.stream.partitions.as_ref(),
            DEFAULT_PARTITIONS,
            MAX_PARTITIONS,
        );
        let shards = self.check_count(
            "shards",
            raw.stream.shards.as_ref(),
            DEFAULT_SHARDS,
            MAX_SHARDS,
        );
        let stream = StreamConfig {
            prefix: prefix.into_inner(),
            partitions,
            shards,
            create: overrides.create_topology || raw.stream.create.unwrap_or(false),
            max_bytes: i64::try_from(self.size(
                "max_bytes",
                &raw.stream.max_bytes,
                1,
                i64::MAX as u64,
                1 << 30,
            ))
            .unwrap_or(i64::MAX),
            duplicate_window: self.duration(
                "duplicate_window",
                &raw.stream.duplicate_window,
                (Legacy::Secs, &raw.stream.duplicate_window_secs),
                Duration::from_secs(1),
                Duration::from_secs(120),
            ),
            replicas: match &raw.stream.replicas {
                Some(set) if ![1, 3, 5].contains(set.get_ref()) => {
                    self.report(set.span().start, "replicas must be 1, 3 or 5");
                    1
                }
                Some(set) => *set.get_ref(),
                None => 1,
            },
        };

        let d = &raw.delivery;
        let batch_rows = self.at_least("batch_rows", &d.batch_rows, 1, 256);
        let failure_delay = self.duration(
            "failure_delay",
            &d.failure_delay,
            (Legacy::Millis, &d.failure_delay_ms),
            Duration::from_millis(1),
            Duration::from_secs(1),
        );
        let failure_delay_cap = self.duration(
            "failure_delay_cap (the retry delay's cap, at least failure_delay)",
            &d.failure_delay_cap,
            (Legacy::Millis, &d.failure_delay_cap_ms),
            failure_delay,
            Duration::from_secs(60).max(failure_delay),
        );
        let batch_wait = self.duration(
            "batch_wait",
            &d.batch_wait,
            (Legacy::Millis, &d.batch_wait_ms),
            Duration::ZERO,
            Duration::from_millis(5),
        );
        let delivery = DeliveryConfig {
            batch_rows,
            pull_rows: self.at_least(
                "pull_rows (at least batch_rows)",
                &d.pull_rows,
                batch_rows,
                1000.max(batch_rows),
            ),
            batch_bytes: usize::try_from(self.size(
                "batch_bytes",
                &d.batch_bytes,
                1,
                1 << 32,
                1 << 20,
            ))
            .unwrap_or(usize::MAX),
            batch_wait,
            batch_idle: self.duration(
                "batch_idle",
                &d.batch_idle,
                (Legacy::Millis, &None),
                Duration::ZERO,
                batch_wait,
            ),
            ack_wait: self.duration(
                "ack_wait",
                &d.ack_wait,
                (Legacy::Secs, &d.ack_wait_secs),
                Duration::from_secs(1),
                Duration::from_secs(30),
            ),
            max_deliveries: self.at_least("max_deliveries", &d.max_deliveries, 1, 10),
            failure_delay,
            failure_delay_cap,
            drain_timeout: self.duration(
                "drain_timeout",
                &d.drain_timeout,
                (Legacy::Secs, &d.drain_timeout_secs),
                Duration::from_secs(1),
                Duration::from_secs(30),
            ),
        };
        let coordination = self.coordination(&raw.coordination);

        let mut tenants = Vec::new();
        let mut seen_keys: HashSet<String> = HashSet::new();
        let mut seen_tenants: HashSet<String> = HashSet::new();
        for tenant in raw.tenants {
            self.check_name("tenant", &tenant.name);
            if !seen_tenants.insert(tenant.name.get_ref().clone()) {
                self.report(
                    tenant.name.span().start,
                    format!("tenant `{}` is defined twice", tenant.name.get_ref()),
                );
            }
            let mut keys: Vec<Spanned<String>> = tenant.api_keys;
            keys.extend(self.keys_from_file(tenant.api_keys_file.as_ref()));
            if keys.is_empty() {
                self.report(
                    tenant.name.span().start,
                    format!("tenant `{}` has no api_keys", tenant.name.get_ref()),
                );
            }
            for key in &keys {
                if key.get_ref().len() < 8 {
                    self.report(key.span().start, "an api key must be at least 8 characters");
                }
                if !seen_keys.insert(key.get_ref().clone()) {
                    self.report(key.span().start, "this api key is used twice");
                }
            }
            tenants.push(Tenant {
                name: tenant.name.into_inner(),
                api_keys: keys.into_iter().map(Spanned::into_inner).collect(),
            });
        }

        let mut admin_api_keys = Vec::new();
        let mut admin_keys = raw.admin_api_keys;
        admin_keys.extend(self.keys_from_file(raw.admin_api_keys_file.as_ref()));
        for key in admin_keys {
            if key.get_ref().len() < 8 {
                self.report(
                    key.span().start,
                    "an admin api key must be at least 8 characters",
                );
            }
            if seen_keys.contains(key.get_ref()) {
                self.report(
                    key.span().start,
                    "this admin api key is also a tenant's api key: a tenant would be an admin",
                );
            }
            admin_api_keys.push(key.into_inner());
        }

        let plugins_dir = self.resolve(raw.plugins_dir.as_deref().unwrap_or("plugins"));
        let mut plugins = BTreeMap::new();
        for (name, plugin) in raw.plugins {
            self.check_token("plugin", &name);
            let wasm = plugins_dir.join(plugin.wasm.get_ref());
            if !wasm.is_file() {
                self.report(
                    plugin.wasm.span().start,
                    format!(
                        "plugin `{}`: wasm file {} does not exist",
                        name.get_ref(),
                        wasm.display()
                    ),
                );
            }
            let memory_bytes = self.megabytes(
                "memory",
                &plugin.memory,
                &plugin.memory_mb,
                u64::from(DEFAULT_PLUGIN_MEMORY_MB) << 20,
                u64::from(MAX_PLUGIN_MEMORY_MB) << 20,
            );
            let recycle_after_growth_bytes = self.megabytes(
                "recycle_after_growth",
                &plugin.recycle_after_growth,
                &plugin.recycle_after_growth_mb,
                u64::from(DEFAULT_RECYCLE_AFTER_GROWTH_MB) << 20,
                u64::from(MAX_PLUGIN_MEMORY_MB) << 20,
            );
            let deadline = self.duration(
                "deadline",
                &plugin.deadline,
                (Legacy::Millis, &plugin.deadline_ms),
                Duration::from_millis(1),
                Duration::from_millis(DEFAULT_PLUGIN_DEADLINE_MS),
            );
            let mut dirs = Vec::new();
            for dir in plugin.grants.dirs {
                let host = self.resolve(dir.host.get_ref());
                if !dir.guest.get_ref().starts_with('/') {
                    self.report(dir.guest.span().start, "a guest path must be absolute");
                }
                dirs.push(DirGrant {
                    host,
                    guest: dir.guest.into_inner(),
                    writable: dir.writable,
                });
            }
            let mut http = Vec::new();
            for authority in &plugin.grants.http {
                match parse_authority(authority.get_ref()) {
                    Ok(normalized) => http.push(normalized),
                    Err(reason) => self.report(
                        authority.span().start,
                        format!(
                            "plugin `{}`: grants.http entry `{}` {reason}",
                            name.get_ref(),
                            authority.get_ref()
                        ),
                    ),
                }
            }
            // One scope is one KV value: it must fit a NATS message.
            let state = plugin.grants.state.as_ref().map(|grant| {
                let max_keys = match &grant.max_keys {
                    Some(keys) if !(1..=MAX_STATE_KEYS).contains(keys.get_ref()) => {
                        self.report(
                            keys.span().start,
                            format!("grants.state.max_keys must be between 1 and {MAX_STATE_KEYS}"),
                        );
                        DEFAULT_STATE_KEYS
                    }
                    Some(keys) => *keys.get_ref(),
                    None => DEFAULT_STATE_KEYS,
                };
                let max_bytes = self.size(
                    "grants.state.max_bytes",
                    &grant.max_bytes,
                    1,
                    MAX_STATE_BYTES,
                    DEFAULT_STATE_BYTES,
                );
                StateLimits {
                    max_keys: usize::try_from(max_keys).unwrap_or(usize::MAX),
                    max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
                }
            });
            let settings = serde_json::to_value(plugin.settings.unwrap_or_default())
                .unwrap_or(serde_json::Value::Object(Default::default()));
            let name_text = name.into_inner();
            plugins.insert(
                name_text.clone(),
                PluginConfig {
                    name: name_text,
                    wasm,
                    world: plugin.world,
                    settings,
                    memory_bytes: usize::try_from(memory_bytes).unwrap_or(usize::MAX),
                    deadline,
                    recycle_after_batches: plugin.recycle_after_batches.unwrap_or(1_000).max(1),
                    recycle_after_growth_bytes: usize::try_from(recycle_after_growth_bytes)
                        .unwrap_or(usize::MAX),
                    grants: Grants {
                        dirs,
                        env: plugin.grants.env,
                        http,
                        state,
                    },
                },
            );
        }

        let mut pipelines = Vec::new();
        let mut table_owner: HashMap<String, usize> = HashMap::new();
        for (index, pipeline) in raw.pipelines.into_iter().enumerate() {
            if pipeline.tables.is_empty() {
                self.report(0, format!("pipeline #{} takes no tables", index + 1));
            }
            for table in &pipeline.tables {
                self.check_name("table", table);
                if let Some(other) = table_owner.insert(table.get_ref().clone(), index) {
                    self.report(
                        table.span().start,
                        format!(
                            "table `{}` is already taken by pipeline #{}",
                            table.get_ref(),
                            other + 1
                        ),
                    );
                }
            }
            let uses = pipeline
                .transforms
                .iter()
                .map(|t| (t, World::Transform))
                .chain(pipeline.sink.iter().map(|s| (s, World::Sink)));
            let mut stateful: Option<&String> = None;
            for (used, world) in uses {
                self.check_plugin_world(&plugins, used, world, "pipeline");
                let keeps_state = plugins
                    .get(used.get_ref())
                    .is_some_and(|p| p.grants.state.is_some());
                match stateful {
                    // One scope per row and pipeline: two plugins' writes
                    // could not be committed together with the row's ack.
                    Some(first) if keeps_state => self.report(
                        used.span().start,
                        format!(
                            "pipeline #{} has two plugins granted state, `{first}` and `{}`: \
                             at most one step of a pipeline keeps state",
                            index + 1,
                            used.get_ref()
                        ),
                    ),
                    None if keeps_state => stateful = Some(used.get_ref()),
                    _ => {}
                }
            }
            pipelines.push(Pipeline {
                tables: pipeline
                    .tables
                    .into_iter()
                    .map(Spanned::into_inner)
                    .collect(),
                transforms: pipeline
                    .transforms
                    .into_iter()
                    .map(Spanned::into_inner)
                    .collect(),
                sink: pipeline.sink.map(Spanned::into_inner),
            });
        }

        let policy_uses = [
            (&raw.policies.budget, World::Budget),
            (&raw.policies.router, World::Router),
        ];
        for (used, world) in policy_uses {
            if let Some(used) = used {
                self.check_plugin_world(&plugins, used, world, "policies");
            }
        }
        let policies = Policies {
            budget: raw.policies.budget.map(Spanned::into_inner),
            router: raw.policies.router.map(Spanned::into_inner),
            routing_field: raw.policies.routing_field,
        };

        let max_body_bytes = usize::try_from(self.size(
            "max_body_bytes",
            &raw.max_body_bytes,
            1,
            1 << 32,
            DEFAULT_MAX_BODY_BYTES as u64,
        ))
        .unwrap_or(usize::MAX);
        let compile_cache_max_bytes = self.size(
            "compile_cache_max_bytes",
            &raw.compile_cache_max_bytes,
            1 << 20,
            u64::MAX,
            DEFAULT_COMPILE_CACHE_MAX_BYTES,
        );
        if let Some(set) = &raw.max_plugin_instances
            && !(1..=MAX_PLUGIN_INSTANCES).contains(set.get_ref())
        {
            self.report(
                set.span().start,
                format!("max_plugin_instances must be between 1 and {MAX_PLUGIN_INSTANCES}"),
            );
        }

        let problems = self.problems.into_inner();
        if !problems.is_empty() {
            return Err(ConfigError::Invalid(Problems(problems)));
        }
        Ok(Config {
            source: self.file,
            listen,
            data_dir,
            compile_cache_dir,
            compile_cache_max_bytes,
            max_body_bytes,
            idempotency_field: raw.idempotency_field,
            admin_api_keys,
            nats,
            stream,
            delivery,
            coordination,
            tenants,
            plugins_dir,
            plugins,
            pipelines,
            policies,
            max_plugin_instances: raw.max_plugin_instances.map(Spanned::into_inner),
        })
    }

    /// `used` names a plugin of `world`.
    fn check_plugin_world(
        &self,
        plugins: &BTreeMap<String, PluginConfig>,
        used: &Spanned<String>,
        world: World,
        user: &str,
    ) {
        match plugins.get(used.get_ref()) {
            None => self.report(
                used.span().start,
                format!("{user} uses unknown plugin `{}`", used.get_ref()),
            ),
            Some(plugin) if plugin.world != world => self.report(
                used.span().start,
                format!(
                    "plugin `{}` is a {} but is used here as a {}",
                    used.get_ref(),
                    plugin.world.as_str(),
                    world.as_str()
                ),
            ),
            Some(_) => {}
        }
    }
}

/// A `grants.http` entry: `host:port` with a DNS name, an IPv4 address or a
/// bracketed IPv6 address, and a port in 1..=65535. Lowercased, because the
/// sandbox compares it with the authority of each request.
pub fn parse_authority(text: &str) -> Result<String, String> {
    let (host, port) = text
        .rsplit_once(':')
        .ok_or("is not `host:port` (the port is required)")?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|port| *port != 0)
        .ok_or("has no port in 1..=65535")?;
    let host_ok = if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        inner.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            })
    };
    if !host_ok {
        return Err(
            "has no valid host (a DNS name, an IPv4 address or a [bracketed] IPv6 address)".into(),
        );
    }
    Ok(format!("{}:{port}", host.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(
            Path::new("/etc/weir/weir.toml"),
            text,
            &Overrides::default(),
        )
    }

    fn problems(text: &str) -> Vec<String> {
        match parse(text) {
            Err(ConfigError::Invalid(Problems(list))) => {
                list.iter().map(ToString::to_string).collect()
            }
            other => panic!("expected problems, got {other:?}"),
        }
    }

    #[test]
    fn unknown_key_is_refused_with_its_position() {
        let found = problems("listen = \"127.0.0.1:1\"\n\n[delivery]\nbatch_rowz = 3\n");
        assert_eq!(found.len(), 1);
        assert!(
            found[0].starts_with("/etc/weir/weir.toml:4:1: unknown field `batch_rowz`"),
            "{found:?}"
        );
    }

    #[test]
    fn syntax_error_names_line_and_column() {
        let found = problems(
            "listen = \"127.0.0.1:1\"\ntenants = [\n  { name = \"a\" api_keys = [] },\n]\n",
        );
        assert!(found[0].starts_with("/etc/weir/weir.toml:3:"), "{found:?}");
    }

    #[test]
    fn every_semantic_problem_is_reported_at_once() {
        let found = problems(concat!(
            "[[tenants]]\nname = \"bad\ttenant\"\napi_keys = [\"short\"]\n",
            "[[pipelines]]\ntables = [\"orders\"]\ntransforms = [\"nope\"]\n",
        ));
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].contains(":2:8: tenant `bad\ttenant`"), "{found:?}");
        assert!(found[1].contains(":3:13: an api key must be"), "{found:?}");
        assert!(
            found[2].contains(":6:15: pipeline uses unknown plugin `nope`"),
            "{found:?}"
        );
    }

    #[test]
    fn the_instance_pool_is_sized_from_units_steps_and_isolation() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        for wasm in ["v.wasm", "s.wasm"] {
            std::fs::write(dir.path().join("plugins").join(wasm), b"").unwrap();
        }
        let text = |top: &str| {
            format!(
                "{top}\n[stream]\npartitions = 1\nshards = 120\n\
                 [plugins.v]\nwasm = \"v.wasm\"\nworld = \"transform\"\n\
                 [plugins.s]\nwasm = \"s.wasm\"\nworld = \"sink\"\n\
                 [[pipelines]]\ntables = [\"a\"]\ntransforms = [\"v\", \"v\"]\nsink = \"s\"\n"
            )
        };
        let load = |top: &str| {
            Config::parse(
                &dir.path().join("weir.toml"),
                &text(top),
                &Overrides::default(),
            )
        };
        // 120 units × 3 steps, and 8 lanes × 3 steps for 8 units, twice.
        let sized = load("").unwrap();
        assert_eq!(sized.plugin_instances(8, 8), 2 * (360 + 8 * 8 * 3));
        // Never below the old fixed pool, never past the ceiling.
        assert_eq!(load("").unwrap().plugin_instances(0, 0), 2 * 360);
        assert_eq!(sized.plugin_instances(1000, 1000), MAX_PLUGIN_INSTANCES);
        let set = load("max_plugin_instances = 300").unwrap();
        assert_eq!(set.plugin_instances(8, 8), 300);
        let Err(ConfigError::Invalid(Problems(found))) = load("max_plugin_instances = 9000") else {
            panic!("a pool past the ceiling is refused");
        };
        assert!(
            found[0]
                .to_string()
                .contains(":1:24: max_plugin_instances must be between 1 and 8192"),
            "{found:?}"
        );
    }

    #[test]
    fn limits_out_of_range_are_reported_where_they_are_written() {
        let found = problems(concat!(
            "max_body_bytes = 0\n",
            "admin_api_keys = [\"x\", \"tenant-key-1\"]\n",
            "[stream]\nmax_bytes = 0\n",
            "[delivery]\nbatch_rows = 0\nmax_deliveries = 0\nack_wait_secs = 0\n",
            "failure_delay_ms = 5000\nfailure_delay_cap_ms = 100\n",
            "[[tenants]]\nname = \"t\"\napi_keys = [\"tenant-key-1\"]\n",
        ));
        let expected = [
            ":1:18: max_body_bytes must be between 1 byte and 4 GiB",
            ":4:13: max_bytes must be at least 1 byte",
            ":6:14: batch_rows must be at least 1",
            ":10:24: failure_delay_cap (the retry delay's cap, at least failure_delay) must be at least 5s",
            ":8:17: ack_wait must be at least 1s",
            ":7:18: max_deliveries must be at least 1",
            ":2:19: an admin api key must be at least 8 characters",
            ":2:24: this admin api key is also a tenant's api key",
        ];
        for want in expected {
            assert!(
                found.iter().any(|p| p.contains(want)),
                "no `{want}` in {found:#?}"
            );
        }
    }

    #[test]
    fn durations_and_sizes_take_units_and_the_older_keys_still_work() {
        let config = parse(concat!(
            "max_body_bytes = \"4MiB\"\n",
            "[nats]\nurl = \"nats://a:4222,nats://b:4222\"\n",
            "[stream]\nmax_bytes = \"500GB\"\nduplicate_window = \"5m\"\nreplicas = 3\n",
            "[delivery]\nack_wait = \"1m30s\"\nfailure_delay_ms = 250\ndrain_timeout = \"10s\"\n",
            "[coordination]\nmember_ttl_secs = 7\n",
        ))
        .unwrap();
        assert_eq!(config.max_body_bytes, 4 << 20);
        assert_eq!(config.stream.max_bytes, 500 << 30);
        assert_eq!(config.stream.duplicate_window, Duration::from_secs(300));
        assert_eq!(config.stream.replicas, 3);
        assert_eq!(config.delivery.ack_wait, Duration::from_secs(90));
        assert_eq!(config.delivery.failure_delay, Duration::from_millis(250));
        assert_eq!(config.delivery.drain_timeout, Duration::from_secs(10));
        assert_eq!(config.coordination.member_ttl, Duration::from_secs(7));
        // No early close unless asked: the idle gap is the whole wait.
        assert_eq!(config.delivery.batch_idle, config.delivery.batch_wait);
        let eager = parse("[delivery]\nbatch_wait = \"20ms\"\nbatch_idle = \"1ms\"\n").unwrap();
        assert_eq!(eager.delivery.batch_wait, Duration::from_millis(20));
        assert_eq!(eager.delivery.batch_idle, Duration::from_millis(1));
        // The default topology: four partitions of one shard.
        assert_eq!((config.stream.partitions, config.stream.shards), (4, 1));

        let found = problems(concat!(
            "[stream]\nreplicas = 2\n",
            "[delivery]\nack_wait = \"30s\"\nack_wait_secs = 30\n",
        ));
        assert!(
            found
                .iter()
                .any(|p| p.contains(":2:12: replicas must be 1, 3 or 5")),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|p| p.contains(":5:17: ack_wait_secs and ack_wait are the same setting")),
            "{found:?}"
        );
        for (text, position) in [
            ("[delivery]\nack_wait = \"soon\"\n", ":2:12:"),
            ("[stream]\nmax_bytes = \"5XB\"\n", ":2:13:"),
            ("[stream]\nmax_bytes = -5\n", ":2:13:"),
        ] {
            let found = problems(text);
            assert!(found[0].contains(position), "{text}: {found:?}");
        }
    }

    #[test]
    fn api_keys_can_come_from_files_kept_out_of_the_toml() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("acme.keys"),
            "# rotated by a reload\nacme-key-from-file\n\nsecond-acme-key\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("admin.keys"), "admin-key-from-file\n").unwrap();
        let text = "admin_api_keys_file = \"admin.keys\"\n\
                    [[tenants]]\nname = \"acme\"\napi_keys_file = \"acme.keys\"\n";
        let path = dir.path().join("weir.toml");
        let config = Config::parse(&path, text, &Overrides::default()).unwrap();
        assert_eq!(
            config.tenants[0].api_keys,
            vec!["acme-key-from-file", "second-acme-key"]
        );
        assert_eq!(config.admin_api_keys, vec!["admin-key-from-file"]);

        let missing = text.replace("acme.keys", "nowhere.keys");
        let Err(ConfigError::Invalid(Problems(found))) =
            Config::parse(&path, &missing, &Overrides::default())
        else {
            panic!("a missing keys file is refused");
        };
        assert!(
            found[0]
                .to_string()
                .contains(":4:17: cannot read keys file"),
            "{found:?}"
        );
    }

    #[test]
    fn missing_wasm_names_the_path() {
        let found = problems("[plugins.v]\nwasm = \"v.wasm\"\nworld = \"transform\"\n");
        assert!(
            found[0].contains("/etc/weir/plugins/v.wasm does not exist"),
            "{found:?}"
        );
        assert!(
            found[0].starts_with("/etc/weir/weir.toml:2:8:"),
            "{found:?}"
        );
    }

    #[test]
    fn policies_name_plugins_of_their_world() {
        let found = problems(concat!(
            "[plugins.s]\nwasm = \"s.wasm\"\nworld = \"sink\"\n",
            "[policies]\nbudget = \"s\"\nrouter = \"nope\"\n",
        ));
        let policy: Vec<&String> = found
            .iter()
            .filter(|p| !p.contains("does not exist"))
            .collect();
        assert_eq!(policy.len(), 2, "{found:?}");
        assert!(
            policy[0].starts_with(
                "/etc/weir/weir.toml:5:10: plugin `s` is a sink but is used here as a budget"
            ),
            "{found:?}"
        );
        assert!(
            policy[1].starts_with("/etc/weir/weir.toml:6:10: policies uses unknown plugin `nope`"),
            "{found:?}"
        );
    }

    #[test]
    fn a_pipeline_has_at_most_one_plugin_granted_state() {
        let found = problems(concat!(
            "[plugins.w]\nwasm = \"w.wasm\"\nworld = \"transform\"\ngrants.state = {}\n",
            "[plugins.x]\nwasm = \"w.wasm\"\nworld = \"transform\"\ngrants.state = {}\n",
            "[[pipelines]]\ntables = [\"t\"]\ntransforms = [\"w\", \"x\"]\n",
        ));
        assert!(
            found.iter().any(|p| p.starts_with(
                "/etc/weir/weir.toml:11:20: pipeline #1 has two \
                 plugins granted state, `w` and `x`"
            )),
            "{found:?}"
        );
    }

    #[test]
    fn state_grants_have_limits_in_range() {
        let found = problems(concat!(
            "[plugins.w]\nwasm = \"w.wasm\"\nworld = \"transform\"\n",
            "grants.state = { max_keys = 0, max_bytes = \"2MiB\" }\n",
        ));
        let state: Vec<&String> = found
            .iter()
            .filter(|p| p.contains("grants.state"))
            .collect();
        assert_eq!(state.len(), 2, "{found:?}");
        assert!(
            state[0].starts_with("/etc/weir/weir.toml:4:29:")
                && state[0].contains("max_keys must be between 1 and 100000"),
            "{found:?}"
        );
        assert!(
            state[1].starts_with(
                "/etc/weir/weir.toml:4:44: grants.state.max_bytes must be between 1 byte and 768 KiB"
            ),
            "{found:?}"
        );
    }

    #[test]
    fn http_grants_are_host_port_authorities() {
        let found = problems(concat!(
            "[plugins.h]\nwasm = \"h.wasm\"\nworld = \"sink\"\n",
            "grants.http = [\"127.0.0.1:8123\", \"API.example.com:443\", \"[::1]:80\",\n",
            "  \"no-port.example.com\", \"bad host:80\", \"x:0\"]\n",
        ));
        let http: Vec<&String> = found.iter().filter(|p| p.contains("grants.http")).collect();
        assert_eq!(http.len(), 3, "{found:?}");
        assert!(
            http[0].starts_with("/etc/weir/weir.toml:5:3: plugin `h`: grants.http entry `no-port.example.com` is not `host:port`"),
            "{found:?}"
        );
        assert!(
            http[1].contains("`bad host:80` has no valid host"),
            "{found:?}"
        );
        assert!(http[2].contains("`x:0` has no port"), "{found:?}");
        assert_eq!(
            parse_authority("API.example.com:443").as_deref(),
            Ok("api.example.com:443")
        );
        assert_eq!(parse_authority("[::1]:80").as_deref(), Ok("[::1]:80"));
    }

    #[test]
    fn unknown_grant_is_refused() {
        let found = problems("[plugins.h]\nwasm = \"h.wasm\"\nworld = \"sink\"\ngrants.htp = []\n");
        assert!(found[0].contains("unknown field `htp`"), "{found:?}");
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_with_bounded_jitter() {
        let config =
            parse("[delivery]\nfailure_delay_ms = 100\nfailure_delay_cap_ms = 1000\n").unwrap();
        let delivery = &config.delivery;
        for (attempt, nominal) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1000),
            (40, 1000),
        ] {
            for sequence in 0..50 {
                let delay = delivery.backoff(attempt, sequence).as_millis() as u64;
                assert!(
                    (nominal * 8 / 10..=nominal * 12 / 10).contains(&delay),
                    "attempt {attempt}: {delay} ms"
                );
            }
        }
        let spread: std::collections::HashSet<_> =
            (0..50).map(|s| delivery.backoff(3, s)).collect();
        assert!(spread.len() > 10, "jitter spreads retries");
    }

    #[test]
    fn defaults_and_overrides() {
        let overrides = Overrides {
            nats_url: Some("nats://127.0.0.1:4222".into()),
            ..Default::default()
        };
        let config = Config::parse(Path::new("w.toml"), "", &overrides).unwrap();
        assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(config.nats.url.as_deref(), Some("nats://127.0.0.1:4222"));
        assert_eq!(config.nats.embedded.sync, SyncPolicy::Always);
        assert_eq!(config.data_dir, Path::new("./data"));
        assert_eq!(config.stream.prefix, "weir");
    }
}
