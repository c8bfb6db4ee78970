//! The top-level keys: the listener, the data dir and the compiled cache,
//! request bodies, admin keys and the plugin instance pool.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use toml::Spanned;

use super::checker::Checker;
use super::keys::{Fallback, Key, Reload, keep};
use super::units::Size;
use super::{Config, Overrides, Pipeline};

/// Default HTTP listen address of the front door.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// weir's state, relative to the config file's folder.
pub const DEFAULT_DATA_DIR: &str = "data";
/// Where `wasm` paths are looked up, relative to the config file's folder.
pub const DEFAULT_PLUGINS_DIR: &str = "plugins";
/// Largest ingest body accepted by default (16 MiB): big enough for thousands
/// of rows, small enough that one request cannot hog a host's memory.
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 << 20;
/// Largest `max_body_bytes`: 4 GiB.
const MAX_BODY_BYTES: u64 = 1 << 32;
/// The smallest plugin instance pool a host sizes for itself.
pub const DEFAULT_PLUGIN_INSTANCES: u32 = 256;
/// The largest plugin instance pool: its slots are address space reserved
/// up front (two 4 GiB memories each), and 64-bit Linux gives a process 128 TiB.
pub const MAX_PLUGIN_INSTANCES: u32 = 8_192;
/// Instances of each front-door policy kept for concurrent requests.
const POLICY_INSTANCES: u32 = 64;
/// The compiled cache's bound when the config sets none: room for many
/// interpreter-sized (Python, JS) plugins, and far more Rust ones.
pub const DEFAULT_COMPILE_CACHE_MAX_BYTES: u64 = 2 << 30;
/// A smaller cache could not hold one interpreter-sized plugin.
const MIN_COMPILE_CACHE_MAX_BYTES: u64 = 1 << 20;
/// Overrides where the compiled cache is by default
/// (`compile_cache_dir` in the TOML wins).
pub const COMPILE_CACHE_DIR_ENV: &str = "WEIR_CACHE_DIR";
/// Shortest admin or tenant api key.
pub(super) const MIN_API_KEY_CHARS: usize = 8;

/// The top-level keys (the sections' tables aside).
pub(super) const KEYS: &[Key] = &[
    Key::new(
        "",
        "listen",
        Fallback::Text(DEFAULT_LISTEN),
        Reload::Restart(|n, r| keep(&mut n.listen, &r.listen)),
    ),
    Key::new(
        "",
        "data_dir",
        Fallback::Text(DEFAULT_DATA_DIR),
        Reload::Restart(|n, r| keep(&mut n.data_dir, &r.data_dir)),
    ),
    // The sandbox, which holds the cache, lives as long as the process.
    Key::new(
        "",
        "compile_cache_dir",
        Fallback::Derived,
        Reload::Restart(|n, r| keep(&mut n.compile_cache_dir, &r.compile_cache_dir)),
    ),
    Key::new(
        "",
        "compile_cache_max_bytes",
        Fallback::Bytes(DEFAULT_COMPILE_CACHE_MAX_BYTES),
        Reload::Restart(|n, r| keep(&mut n.compile_cache_max_bytes, &r.compile_cache_max_bytes)),
    ),
    Key::new(
        "",
        "plugins_dir",
        Fallback::Text(DEFAULT_PLUGINS_DIR),
        Reload::Hot,
    ),
    Key::new(
        "",
        "max_body_bytes",
        Fallback::Bytes(DEFAULT_MAX_BODY_BYTES as u64),
        Reload::Hot,
    ),
    Key::new("", "idempotency_field", Fallback::Off, Reload::Hot),
    Key::new("", "admin_api_keys", Fallback::Empty, Reload::Hot),
    Key::new("", "admin_api_keys_file", Fallback::Off, Reload::Hot),
    Key::new(
        "",
        "max_plugin_instances",
        Fallback::Derived,
        Reload::Restart(|n, r| keep(&mut n.max_plugin_instances, &r.max_plugin_instances)),
    ),
];

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

/// Where the host keeps its files: the data dir and the compiled cache.
pub(super) struct Places {
    pub data_dir: PathBuf,
    pub compile_cache_dir: PathBuf,
    pub plugins_dir: PathBuf,
}

/// The limits set at the top level, validated.
pub(super) struct Limits {
    pub max_body_bytes: usize,
    pub compile_cache_max_bytes: u64,
    pub max_plugin_instances: Option<u32>,
}

impl Checker<'_> {
    /// The listener: the command line's, else the file's, else the default.
    pub(super) fn listen(
        &self,
        raw: Option<&Spanned<String>>,
        overrides: &Overrides,
    ) -> SocketAddr {
        let default = || DEFAULT_LISTEN.parse().expect("constant address parses");
        match (&overrides.listen, raw) {
            (Some(addr), _) => *addr,
            (None, Some(text)) => text.get_ref().parse().unwrap_or_else(|err| {
                self.report(
                    text.span().start,
                    format!("listen `{}` is not an address: {err}", text.get_ref()),
                );
                default()
            }),
            (None, None) => default(),
        }
    }

    pub(super) fn places(
        &self,
        data_dir: Option<&str>,
        compile_cache_dir: Option<&str>,
        plugins_dir: Option<&str>,
        overrides: &Overrides,
    ) -> Places {
        let data_dir = overrides
            .data_dir
            .clone()
            .unwrap_or_else(|| self.resolve(data_dir.unwrap_or(DEFAULT_DATA_DIR)));
        let compile_cache_dir = match compile_cache_dir {
            Some(dir) => self.resolve(dir),
            None => default_compile_cache_dir(&data_dir),
        };
        Places {
            data_dir,
            compile_cache_dir,
            plugins_dir: self.resolve(plugins_dir.unwrap_or(DEFAULT_PLUGINS_DIR)),
        }
    }

    /// The admin keys, from the file and the keys file; none may be a
    /// tenant's (`tenant_keys`).
    pub(super) fn admin_keys(
        &self,
        mut keys: Vec<Spanned<String>>,
        file: Option<&Spanned<String>>,
        tenant_keys: &HashSet<String>,
    ) -> Vec<String> {
        keys.extend(self.keys_from_file(file));
        let mut admin_api_keys = Vec::new();
        for key in keys {
            self.check_key_whitespace("this admin api key", &key);
            if key.get_ref().len() < MIN_API_KEY_CHARS {
                self.report(
                    key.span().start,
                    "an admin api key must be at least 8 characters",
                );
            }
            if tenant_keys.contains(key.get_ref()) {
                self.report(
                    key.span().start,
                    "this admin api key is also a tenant's api key: a tenant would be an admin",
                );
            }
            admin_api_keys.push(key.into_inner());
        }
        admin_api_keys
    }

    pub(super) fn limits(
        &self,
        max_body_bytes: &Option<Spanned<Size>>,
        compile_cache_max_bytes: &Option<Spanned<Size>>,
        max_plugin_instances: Option<Spanned<u32>>,
    ) -> Limits {
        let max_body_bytes = usize::try_from(self.size(
            "max_body_bytes",
            max_body_bytes,
            1,
            MAX_BODY_BYTES,
            DEFAULT_MAX_BODY_BYTES as u64,
        ))
        .unwrap_or(usize::MAX);
        let compile_cache_max_bytes = self.size(
            "compile_cache_max_bytes",
            compile_cache_max_bytes,
            MIN_COMPILE_CACHE_MAX_BYTES,
            u64::MAX,
            DEFAULT_COMPILE_CACHE_MAX_BYTES,
        );
        if let Some(set) = &max_plugin_instances
            && !(1..=MAX_PLUGIN_INSTANCES).contains(set.get_ref())
        {
            self.report(
                set.span().start,
                format!("max_plugin_instances must be between 1 and {MAX_PLUGIN_INSTANCES}"),
            );
        }
        Limits {
            max_body_bytes,
            compile_cache_max_bytes,
            max_plugin_instances: max_plugin_instances.map(Spanned::into_inner),
        }
    }
}
