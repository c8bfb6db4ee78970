//! `[plugins.NAME]`: each plugin's component, world, settings, limits and
//! grants.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::Place;
use super::World;
use super::checker::{Checker, Legacy};
use super::keys::{Fallback, Key, Reload};
use super::units::{HumanDuration, Size};
use crate::capability::{
    CAPABILITIES, Capability, DEFAULT_HTTP_MAX_IN_FLIGHT, DEFAULT_POSTGRES_CONNECTIONS,
    DEFAULT_POSTGRES_IDLE_IN_TRANSACTION, DEFAULT_STATE_BYTES, DEFAULT_STATE_KEYS,
};

/// Default memory cap of one plugin instance (64 MiB of linear memory).
pub const DEFAULT_PLUGIN_MEMORY_MB: u32 = 64;
/// The pooling allocator reserves this much address space per memory, so no
/// plugin may ask for more.
pub const MAX_PLUGIN_MEMORY_MB: u32 = 4_096;
/// Default CPU deadline of one plugin call.
pub const DEFAULT_PLUGIN_DEADLINE_MS: u64 = 2_000;
const MIN_PLUGIN_DEADLINE: Duration = Duration::from_millis(1);
/// A warm instance is replaced after this many batches by default.
pub const DEFAULT_RECYCLE_AFTER_BATCHES: u64 = 1_000;
/// A warm instance whose linear memory grew this much since `init` is
/// replaced: linear memory never shrinks, so a leak would otherwise stay.
pub const DEFAULT_RECYCLE_AFTER_GROWTH_MB: u32 = 16;
/// Most keys and bytes `grants.state` may allow one scope: a scope is one
/// KV value, so its bytes stay well under a NATS message.
pub const MAX_STATE_KEYS: u64 = 100_000;
pub const MAX_STATE_BYTES: u64 = 768 * 1024;
/// Most `http_max_in_flight` and `grants.postgres.max_connections`.
pub const MAX_HTTP_MAX_IN_FLIGHT: u64 = 1_024;
pub const MAX_POSTGRES_CONNECTIONS: u64 = 256;

const MIB: u64 = 1 << 20;

/// `[plugins.NAME]`: a reload loads again each plugin whose entry changed.
/// The keys of grants are the capabilities' ([`grant_keys`]).
pub(super) const KEYS: &[Key] = &[
    Key::new("plugins.NAME", "wasm", Fallback::Required, Reload::Hot),
    Key::new("plugins.NAME", "world", Fallback::Required, Reload::Hot),
    Key::new("plugins.NAME", "settings", Fallback::Empty, Reload::Hot),
    Key::new(
        "plugins.NAME",
        "memory",
        Fallback::Bytes(DEFAULT_PLUGIN_MEMORY_MB as u64 * MIB),
        Reload::Hot,
    )
    .or_legacy("memory_mb"),
    Key::new(
        "plugins.NAME",
        "deadline",
        Fallback::Time(Duration::from_millis(DEFAULT_PLUGIN_DEADLINE_MS)),
        Reload::Hot,
    )
    .or_legacy("deadline_ms"),
    Key::new(
        "plugins.NAME",
        "recycle_after_batches",
        Fallback::Count(DEFAULT_RECYCLE_AFTER_BATCHES),
        Reload::Hot,
    ),
    Key::new(
        "plugins.NAME",
        "recycle_after_growth",
        Fallback::Bytes(DEFAULT_RECYCLE_AFTER_GROWTH_MB as u64 * MIB),
        Reload::Hot,
    )
    .or_legacy("recycle_after_growth_mb"),
];

/// The `[plugins.NAME]` keys of every capability of
/// [`crate::capability::CAPABILITIES`], in the table's order.
pub(super) fn grant_keys() -> &'static [Key] {
    static KEYS: std::sync::LazyLock<Vec<Key>> = std::sync::LazyLock::new(|| {
        CAPABILITIES
            .iter()
            .flat_map(|spec| spec.keys)
            .map(|key| Key::new("plugins.NAME", key.name, key.default.into(), Reload::Hot))
            .collect()
    });
    &KEYS
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
    /// Whether its `grants.http` requests reuse pooled keep-alive
    /// connections; `false`: a fresh connection per request, closed after.
    pub http_keep_alive: bool,
    /// A PEM file of root certificates its HTTPS requests trust besides the
    /// public ones (a private CA).
    pub http_ca: Option<PathBuf>,
    /// Its `http-batch` requests in flight at once, across its instances.
    pub http_max_in_flight: usize,
    pub grants: Grants,
}

/// Where a plugin's table and keys are written: a problem found when the
/// plugin is loaded (not a component, the wrong world, a grant's missing
/// directory) is reported at its line. Kept apart from [`PluginConfig`],
/// which a reload compares: moving a line reloads nothing.
#[derive(Debug, Clone)]
pub struct PluginPlaces {
    /// The `[plugins.NAME]` table's name.
    pub table: Place,
    pub wasm: Place,
    pub world: Place,
    /// Each `grants.dirs` entry's `host`, in order.
    pub dirs: Vec<Place>,
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
    /// A PostgreSQL database a sink writes through the host (the WIT
    /// `postgres` interface); `None`: every statement is refused.
    pub postgres: Option<PostgresGrant>,
    /// NATS subjects a sink publishes to through the host's connection
    /// (the WIT `nats` interface); `None`: every publish is refused.
    pub nats: Option<NatsGrant>,
    /// An object store a sink's rows go to (the WIT `objects` interface);
    /// `None`: every append is refused.
    pub objects: Option<super::objects::ObjectsGrant>,
}

/// `grants.nats`: the subjects a sink may publish to, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsGrant {
    /// Subject patterns (`*` and `>` wildcards), none reaching weir's own
    /// subjects, `$` system subjects or `_INBOX`.
    pub publish: Vec<String>,
    /// Await a JetStream PubAck per message (true), or publish on core
    /// NATS and flush (false: at most once to absent subscribers).
    pub jetstream: bool,
}

impl NatsGrant {
    /// Whether `subject` (a publish subject, no wildcards) is granted.
    pub fn allows(&self, subject: &str) -> bool {
        self.publish
            .iter()
            .any(|pattern| subject_matches(pattern, subject))
    }
}

/// Whether the NATS `pattern` (`*` one token, `>` the rest) matches `subject`.
pub fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut tokens = subject.split('.');
    for wanted in pattern.split('.') {
        match (wanted, tokens.next()) {
            (">", Some(_)) => return true,
            (_, None) => return false,
            ("*", Some(_)) => {}
            (wanted, Some(token)) if wanted == token => {}
            _ => return false,
        }
    }
    tokens.next().is_none()
}

/// Why `text` is not a NATS subject: empty tokens, whitespace, or (unless
/// `wildcards`) a `*` or `>`; `>` only as the last token.
pub fn subject_problem(text: &str, wildcards: bool) -> Option<&'static str> {
    if text.is_empty() {
        return Some("is empty");
    }
    let tokens: Vec<&str> = text.split('.').collect();
    for (index, token) in tokens.iter().enumerate() {
        if token.is_empty() {
            return Some("has an empty token (a leading, trailing or doubled `.`)");
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Some("holds whitespace");
        }
        let wildcard = *token == "*" || *token == ">";
        if wildcard && !wildcards {
            return Some("holds a wildcard (`*` or `>`): a message goes to one subject");
        }
        if !wildcard && (token.contains('*') || token.contains('>')) {
            return Some("holds `*` or `>` inside a token (a wildcard is a whole token)");
        }
        if *token == ">" && index + 1 != tokens.len() {
            return Some("has `>` before its last token");
        }
    }
    None
}

/// `grants.postgres`: where the host connects for a sink, and how.
#[derive(Clone, PartialEq)]
pub struct PostgresGrant {
    /// The connection URL as written (it may hold a password: never shown;
    /// see [`PostgresGrant::shown_url`]).
    pub url: String,
    /// A file holding the password, read at each load (so a reload picks
    /// up a rotated one).
    pub password_file: Option<PathBuf>,
    pub max_connections: usize,
    pub tls: PostgresTls,
    /// PEM certificates trusted for `tls = "verify-full"`, besides the system's.
    pub ca_file: Option<PathBuf>,
    pub idle_in_transaction: Duration,
}

/// How a granted PostgreSQL connection is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PostgresTls {
    /// Plain TCP (or a Unix socket): for a database on the same host or network.
    Disable,
    /// TLS required, the server's certificate verified (its name included)
    /// against `ca_file` and the system's roots.
    VerifyFull,
}

impl PostgresGrant {
    /// The URL with any password replaced by `***`: what logs and errors show.
    pub fn shown_url(&self) -> String {
        redact_url(&self.url)
    }
}

impl std::fmt::Debug for PostgresGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresGrant")
            .field("url", &self.shown_url())
            .field("password_file", &self.password_file)
            .field("max_connections", &self.max_connections)
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`; a
/// `password=` parameter of a URL or key-value string is masked too.
pub fn redact_url(url: &str) -> String {
    let mut shown = url.to_string();
    if let Some(scheme_end) = shown.find("://") {
        let rest_start = scheme_end + 3;
        let authority_end = shown[rest_start..]
            .find(['/', '?'])
            .map_or(shown.len(), |end| rest_start + end);
        if let Some(at) = shown[rest_start..authority_end].rfind('@') {
            let userinfo = &shown[rest_start..rest_start + at];
            if let Some(colon) = userinfo.find(':') {
                shown.replace_range(rest_start + colon + 1..rest_start + at, "***");
            }
        }
    }
    let mut out = String::with_capacity(shown.len());
    let mut rest = shown.as_str();
    while let Some(found) = rest.find("password=") {
        let value_start = found + "password=".len();
        out.push_str(&rest[..value_start]);
        out.push_str("***");
        let value_end = rest[value_start..]
            .find(['&', ' '])
            .map_or(rest.len(), |end| value_start + end);
        rest = &rest[value_end..];
    }
    out.push_str(rest);
    out
}

/// A host directory preopened for a plugin under a guest path.
#[derive(Debug, Clone, PartialEq)]
pub struct DirGrant {
    pub host: PathBuf,
    pub guest: String,
    pub writable: bool,
}

/// One `[plugins.NAME]` table as written in the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlugin {
    wasm: Spanned<String>,
    /// Checked here, not by serde: an unknown world is one problem among
    /// the others, at its position.
    world: Spanned<String>,
    #[serde(default)]
    settings: Option<toml::Table>,
    memory: Option<Spanned<Size>>,
    memory_mb: Option<Spanned<u32>>,
    deadline: Option<Spanned<HumanDuration>>,
    deadline_ms: Option<Spanned<u64>>,
    recycle_after_batches: Option<u64>,
    recycle_after_growth: Option<Spanned<Size>>,
    recycle_after_growth_mb: Option<Spanned<u32>>,
    http_keep_alive: Option<bool>,
    http_ca: Option<Spanned<String>>,
    http_max_in_flight: Option<Spanned<u64>>,
    #[serde(default)]
    grants: RawGrants,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGrants {
    #[serde(default)]
    dirs: Vec<RawDirGrant>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    http: Vec<Spanned<String>>,
    state: Option<RawStateGrant>,
    postgres: Option<RawPostgresGrant>,
    nats: Option<RawNatsGrant>,
    objects: Option<super::objects::RawObjectsGrant>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNatsGrant {
    publish: Spanned<Vec<Spanned<String>>>,
    jetstream: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPostgresGrant {
    url: Spanned<String>,
    password_file: Option<Spanned<String>>,
    max_connections: Option<Spanned<u64>>,
    tls: Option<PostgresTls>,
    ca_file: Option<Spanned<String>>,
    idle_in_transaction: Option<Spanned<HumanDuration>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStateGrant {
    max_keys: Option<Spanned<u64>>,
    max_bytes: Option<Spanned<Size>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDirGrant {
    host: Spanned<String>,
    guest: Spanned<String>,
    #[serde(default)]
    writable: bool,
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

impl Checker<'_> {
    /// The plugins by name, each `wasm` looked up in `plugins_dir`.
    /// `prefix` is weir's own subjects' (`[stream] prefix`), out of any grant's reach.
    pub(super) fn plugins(
        &self,
        raw: BTreeMap<Spanned<String>, RawPlugin>,
        plugins_dir: &Path,
        prefix: &str,
    ) -> (
        BTreeMap<String, PluginConfig>,
        BTreeMap<String, PluginPlaces>,
    ) {
        let mut plugins = BTreeMap::new();
        let mut places = BTreeMap::new();
        for (name, plugin) in raw {
            let at = PluginPlaces {
                table: self.place(name.span().start),
                wasm: self.place(plugin.wasm.span().start),
                world: self.place(plugin.world.span().start),
                dirs: plugin
                    .grants
                    .dirs
                    .iter()
                    .map(|dir| self.place(dir.host.span().start))
                    .collect(),
            };
            let plugin = self.plugin(name, plugin, plugins_dir, prefix);
            places.insert(plugin.name.clone(), at);
            plugins.insert(plugin.name.clone(), plugin);
        }
        (plugins, places)
    }

    fn plugin(
        &self,
        name: Spanned<String>,
        plugin: RawPlugin,
        plugins_dir: &Path,
        prefix: &str,
    ) -> PluginConfig {
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
            u64::from(DEFAULT_PLUGIN_MEMORY_MB) * MIB,
            u64::from(MAX_PLUGIN_MEMORY_MB) * MIB,
        );
        let recycle_after_growth_bytes = self.megabytes(
            "recycle_after_growth",
            &plugin.recycle_after_growth,
            &plugin.recycle_after_growth_mb,
            u64::from(DEFAULT_RECYCLE_AFTER_GROWTH_MB) * MIB,
            u64::from(MAX_PLUGIN_MEMORY_MB) * MIB,
        );
        let deadline = self.duration(
            "deadline",
            &plugin.deadline,
            (Legacy::Millis, &plugin.deadline_ms),
            MIN_PLUGIN_DEADLINE,
            Duration::from_millis(DEFAULT_PLUGIN_DEADLINE_MS),
        );
        let http_max_in_flight = match &plugin.http_max_in_flight {
            Some(count) if !(1..=MAX_HTTP_MAX_IN_FLIGHT).contains(count.get_ref()) => {
                self.report(
                    count.span().start,
                    format!(
                        "plugin `{}`: http_max_in_flight must be between 1 and {MAX_HTTP_MAX_IN_FLIGHT}",
                        name.get_ref()
                    ),
                );
                DEFAULT_HTTP_MAX_IN_FLIGHT
            }
            Some(count) => *count.get_ref(),
            None => DEFAULT_HTTP_MAX_IN_FLIGHT,
        };
        let http_max_in_flight = usize::try_from(http_max_in_flight).unwrap_or(usize::MAX);
        let http_ca = plugin.http_ca.as_ref().and_then(|file| {
            let path = self.resolve(file.get_ref());
            match crate::config::read_roots(&path) {
                Ok(_) => Some(path),
                Err(err) => {
                    self.report(
                        file.span().start,
                        format!("plugin `{}`: http_ca: {err}", name.get_ref()),
                    );
                    None
                }
            }
        });
        let world = self.world(&name, &plugin.world);
        let grants = self.grants(name.get_ref(), world, plugin.grants, prefix);
        let settings = serde_json::to_value(plugin.settings.unwrap_or_default())
            .unwrap_or(serde_json::Value::Object(Default::default()));
        let recycle_after_batches = plugin
            .recycle_after_batches
            .unwrap_or(DEFAULT_RECYCLE_AFTER_BATCHES)
            .max(1);
        PluginConfig {
            name: name.into_inner(),
            wasm,
            world,
            settings,
            memory_bytes: usize::try_from(memory_bytes).unwrap_or(usize::MAX),
            deadline,
            recycle_after_batches,
            recycle_after_growth_bytes: usize::try_from(recycle_after_growth_bytes)
                .unwrap_or(usize::MAX),
            http_keep_alive: plugin.http_keep_alive.unwrap_or(true),
            http_ca,
            http_max_in_flight,
            grants,
        }
    }

    /// The world `written` names; an unknown one is reported at its position
    /// and the plugin's uses are not checked against it (no second problem).
    fn world(&self, name: &Spanned<String>, written: &Spanned<String>) -> World {
        World::named(written.get_ref()).unwrap_or_else(|| {
            self.report(
                written.span().start,
                format!(
                    "plugin `{}`: unknown world `{}` (one of: {})",
                    name.get_ref(),
                    written.get_ref(),
                    World::names()
                ),
            );
            self.unknown_world
                .borrow_mut()
                .insert(name.get_ref().clone());
            World::Transform
        })
    }

    fn grants(&self, plugin: &str, world: World, raw: RawGrants, prefix: &str) -> Grants {
        let mut dirs = Vec::new();
        for dir in raw.dirs {
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
        for authority in &raw.http {
            match parse_authority(authority.get_ref()) {
                Ok(normalized) => http.push(normalized),
                Err(reason) => self.report(
                    authority.span().start,
                    format!(
                        "plugin `{plugin}`: grants.http entry `{}` {reason}",
                        authority.get_ref()
                    ),
                ),
            }
        }
        Grants {
            dirs,
            env: raw.env,
            http,
            state: raw.state.as_ref().map(|grant| self.state_limits(grant)),
            postgres: raw
                .postgres
                .map(|grant| self.postgres_grant(plugin, world, grant)),
            nats: raw
                .nats
                .map(|grant| self.nats_grant(plugin, world, grant, prefix)),
            objects: raw
                .objects
                .map(|grant| self.objects_grant(plugin, world, grant)),
        }
    }

    /// A grant of `capability` given to a plugin of a world that does not
    /// import it is refused, if its entry says why it cannot serve there.
    pub(super) fn grant_for_its_worlds(
        &self,
        capability: Capability,
        plugin: &str,
        world: World,
        at: usize,
    ) {
        let spec = capability.spec();
        if let (Some(why), Some(grant)) = (spec.only_for_its_worlds, spec.grant)
            && !spec.worlds.contains(&world)
        {
            self.report(
                at,
                format!(
                    "plugin `{plugin}`: {grant} is for {} ({why}), and this plugin is a {}",
                    spec.worlds_in_words(),
                    world.as_str()
                ),
            );
        }
    }

    /// Each pattern must be a valid subject (wildcards allowed) out of
    /// weir's own subjects, the system's (`$…`) and replies (`_INBOX`): a
    /// grant reaches the subjects it names, never weir's streams.
    fn nats_grant(&self, plugin: &str, world: World, raw: RawNatsGrant, prefix: &str) -> NatsGrant {
        self.grant_for_its_worlds(Capability::Nats, plugin, world, raw.publish.span().start);
        if raw.publish.get_ref().is_empty() {
            self.report(
                raw.publish.span().start,
                format!("plugin `{plugin}`: grants.nats.publish names no subject"),
            );
        }
        let mut publish = Vec::new();
        for pattern in raw.publish.into_inner() {
            let text = pattern.get_ref();
            let first = text.split('.').next().unwrap_or_default();
            let problem = subject_problem(text, true).map(str::to_string).or_else(|| {
                (first.starts_with('$') || first == "_INBOX")
                    .then(|| "reaches NATS's own subjects (`$…`, `_INBOX`)".to_string())
                    .or_else(|| {
                        matches!(first, "*" | ">")
                            .then(|| format!("reaches weir's own subjects (`{prefix}.…`): begin it with a literal token"))
                    })
                    .or_else(|| {
                        (first == prefix)
                            .then(|| format!("reaches weir's own subjects (`{prefix}.…`)"))
                    })
            });
            match problem {
                Some(problem) => self.report(
                    pattern.span().start,
                    format!("plugin `{plugin}`: grants.nats.publish entry `{text}` {problem}"),
                ),
                None => publish.push(pattern.into_inner()),
            }
        }
        NatsGrant {
            publish,
            jetstream: raw.jetstream.unwrap_or(true),
        }
    }

    /// The URL must parse (its problem is told without the password); the
    /// files must exist; only a sink holds a transaction to commit.
    fn postgres_grant(&self, plugin: &str, world: World, raw: RawPostgresGrant) -> PostgresGrant {
        self.grant_for_its_worlds(Capability::Postgres, plugin, world, raw.url.span().start);
        if let Err(err) = raw.url.get_ref().parse::<tokio_postgres::Config>() {
            self.report(
                raw.url.span().start,
                format!(
                    "plugin `{plugin}`: grants.postgres.url `{}` is not a PostgreSQL connection URL: {err}",
                    redact_url(raw.url.get_ref())
                ),
            );
        }
        let file = |key: &str, path: &Option<Spanned<String>>| {
            path.as_ref().map(|path| {
                let resolved = self.resolve(path.get_ref());
                if !resolved.is_file() {
                    self.report(
                        path.span().start,
                        format!(
                            "plugin `{plugin}`: grants.postgres.{key} {} is not a file",
                            resolved.display()
                        ),
                    );
                }
                resolved
            })
        };
        let max_connections = match &raw.max_connections {
            Some(count) if !(1..=MAX_POSTGRES_CONNECTIONS).contains(count.get_ref()) => {
                self.report(
                    count.span().start,
                    format!(
                        "grants.postgres.max_connections must be between 1 and {MAX_POSTGRES_CONNECTIONS}"
                    ),
                );
                DEFAULT_POSTGRES_CONNECTIONS
            }
            Some(count) => *count.get_ref(),
            None => DEFAULT_POSTGRES_CONNECTIONS,
        };
        let idle_in_transaction = self.duration(
            "grants.postgres.idle_in_transaction",
            &raw.idle_in_transaction,
            (Legacy::Millis, &None),
            Duration::from_secs(1),
            DEFAULT_POSTGRES_IDLE_IN_TRANSACTION,
        );
        PostgresGrant {
            password_file: file("password_file", &raw.password_file),
            ca_file: file("ca_file", &raw.ca_file),
            url: raw.url.into_inner(),
            max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
            tls: raw.tls.unwrap_or(PostgresTls::Disable),
            idle_in_transaction,
        }
    }

    /// One scope is one KV value: it must fit a NATS message.
    fn state_limits(&self, grant: &RawStateGrant) -> StateLimits {
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
    }
}
