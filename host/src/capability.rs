//! The host capabilities a plugin may import, each written down once in
//! [`CAPABILITIES`]: its name, the imports it serves (WIT interfaces of
//! `weir:plugin`, or WASI's), the worlds that import it, the TOML keys that
//! grant and bound it with their defaults, when the sandbox links it, what
//! `weir plugin check` says a component importing it needs, the SDK module
//! `weir plugin new` copies for it, and its line in plugins/README.md. The
//! config (its grant keys, which worlds a grant is for), the sandbox
//! (`sandbox/capabilities.rs` links each, `inspect.rs` reports the
//! grants), `weir plugin new` and the docs all read this table: a new
//! capability is one entry here, its WIT, its line in
//! `sandbox/capabilities.rs`, its host side and its SDK code.

use std::time::Duration;

use crate::world::World;

/// What a plugin may reach beyond itself, as the host serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Capability {
    /// `log` and `add-counter`: every world, no grant.
    Host,
    /// Outbound HTTP through `wasi:http`.
    WasiHttp,
    /// Many HTTP requests at once (`fetch-all`).
    HttpBatch,
    /// Durable state per tenant and table.
    State,
    /// A sink's PostgreSQL transaction.
    Postgres,
    /// A sink's NATS publishes.
    Nats,
    /// A sink's objects in an object store (S3).
    Objects,
    /// WASI itself (clocks, random, stdio, filesystem, environment,
    /// sockets): every std guest imports it, with an empty context.
    Wasi,
}

/// When the sandbox links a capability into a plugin's linker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linked {
    /// In the linker every plugin gets: served to all (a grant decides
    /// what a call may do, not whether the import resolves).
    Always,
    /// In a second linker, only for a plugin that imports it or holds its
    /// grant (`wasi:http`: its hooks hold a connection pool).
    WhenImported,
}

/// What a key is when the TOML leaves it out (`config::keys::Fallback`
/// has the same cases, and turns these into its own).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDefault {
    /// The key must be set (within its grant).
    Required,
    /// Unset: the grant is off.
    Off,
    /// An empty list or table.
    Empty,
    Text(&'static str),
    Count(u64),
    Bool(bool),
    Bytes(u64),
    Time(Duration),
}

/// One key of `[plugins.NAME]` that grants or bounds a capability.
#[derive(Debug, Clone, Copy)]
pub struct GrantKey {
    /// As the TOML writes it within `[plugins.NAME]`: `grants.state.max_keys`.
    pub name: &'static str,
    pub default: KeyDefault,
}

const fn key(name: &'static str, default: KeyDefault) -> GrantKey {
    GrantKey { name, default }
}

/// What `weir plugin check` says about a component importing one of `imports`.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    /// The TOML key that grants it, or what is never granted.
    pub grant: &'static str,
    /// Import names or prefixes, in the order the report prefers to name one.
    pub imports: &'static [&'static str],
    /// What happens without the grant.
    pub without: &'static str,
}

/// One capability, as every part of weir needs to know it.
#[derive(Debug)]
pub struct CapabilitySpec {
    pub capability: Capability,
    /// As plugins/README.md names it.
    pub name: &'static str,
    /// The component imports it serves: `weir:plugin/<interface>` (as in
    /// `wit/types.wit`), or a WASI prefix (`wasi:http/`).
    pub interfaces: &'static [&'static str],
    /// The worlds that may import it (every world, for WASI's).
    pub worlds: &'static [World],
    /// The key that grants it (`None`: served to every plugin that imports it).
    pub grant: Option<&'static str>,
    /// Why a grant of it is refused to a plugin of another world (`None`:
    /// it is not refused, it just serves nothing there).
    pub only_for_its_worlds: Option<&'static str>,
    /// The `[plugins.NAME]` keys this capability owns (each key is one
    /// entry's), with their defaults.
    pub keys: &'static [GrantKey],
    pub linked: Linked,
    /// What `weir plugin check` reports for a component importing it.
    pub checks: &'static [Check],
    /// `weir plugin new`'s JavaScript module for it (path in the project,
    /// source): imported on its own, since componentize-js refuses an
    /// import its world lacks.
    pub js_module: Option<(&'static str, &'static str)>,
    /// Its row in plugins/README.md's table of grants: what it gives.
    pub docs: &'static str,
}

/// Default of `grants.state.max_keys`: keys per scope.
pub const DEFAULT_STATE_KEYS: u64 = 10_000;
/// Default of `grants.state.max_bytes`: bytes of keys and values per
/// scope. A scope is one KV value, so its bytes stay well under a NATS message.
pub const DEFAULT_STATE_BYTES: u64 = 256 * 1024;
/// Default of `http_max_in_flight`: `http-batch` requests of one plugin
/// version in flight at once, across its instances.
pub const DEFAULT_HTTP_MAX_IN_FLIGHT: u64 = 16;
/// Default of `grants.postgres.max_connections`: connections one plugin
/// version may hold at once.
pub const DEFAULT_POSTGRES_CONNECTIONS: u64 = 4;
/// Default of `grants.postgres.idle_in_transaction`: a session idle inside
/// a transaction this long is ended by the server, so a host frozen
/// mid-transaction holds its locks no longer than this.
pub const DEFAULT_POSTGRES_IDLE_IN_TRANSACTION: Duration = Duration::from_secs(30);

/// Default of `grants.objects.max_rows`: rows per object.
pub const DEFAULT_OBJECT_MAX_ROWS: u64 = 10_000;
/// Most `grants.objects.max_rows`: an object's rows wait unacked until it
/// commits, and a unit's consumer holds at most 20,000 unacked (its
/// `max_ack_pending`), with room left for the rows of the next pulls.
pub const MAX_OBJECT_ROWS: u64 = 15_000;
/// Default of `grants.objects.max_bytes`: an object is held in memory
/// until its one create-only PUT.
pub const DEFAULT_OBJECT_MAX_BYTES: u64 = 128 << 20;
/// Default of `grants.objects.max_age`: how long a row waits at most
/// for its object.
pub const DEFAULT_OBJECT_MAX_AGE: Duration = Duration::from_secs(60);

const ALL_WORLDS: &[World] = &[World::Transform, World::Sink, World::Budget, World::Router];
const STEPS: &[World] = &[World::Transform, World::Sink];
const SINKS: &[World] = &[World::Sink];

/// The same words for both ways out over HTTP: one grant, one gate.
const HTTP_WITHOUT: &str = "it loads, and every request it makes is refused (HttpRequestDenied, or http-batch's `refused`)";

/// Every capability, in the order `weir plugin check` reports their grants.
pub const CAPABILITIES: &[CapabilitySpec] = &[
    CapabilitySpec {
        capability: Capability::Host,
        name: "host",
        interfaces: &["weir:plugin/host"],
        worlds: ALL_WORLDS,
        grant: None,
        only_for_its_worlds: None,
        keys: &[],
        linked: Linked::Always,
        checks: &[],
        js_module: None,
        docs: "`log` (lines cut at 4 KiB, control characters escaped), `add-counter` (at most 64 names per plugin version, exported as metrics) and `json-members` (where a batch's rows keep the top-level JSON members an SDK reads, found natively once per batch)",
    },
    CapabilitySpec {
        capability: Capability::WasiHttp,
        name: "wasi:http",
        interfaces: &["wasi:http/"],
        worlds: ALL_WORLDS,
        grant: Some("grants.http"),
        only_for_its_worlds: None,
        keys: &[
            key("grants.http", KeyDefault::Empty),
            key("http_keep_alive", KeyDefault::Bool(true)),
            key("http_ca", KeyDefault::Off),
        ],
        linked: Linked::WhenImported,
        checks: &[Check {
            grant: "grants.http",
            imports: &["wasi:http/outgoing-handler", "wasi:http/"],
            without: HTTP_WITHOUT,
        }],
        js_module: None,
        docs: "outbound HTTP requests, each to a granted `host:port` within the call's deadline; without the grant every request is refused (`HttpRequestDenied`)",
    },
    CapabilitySpec {
        capability: Capability::HttpBatch,
        name: "http-batch",
        interfaces: &["weir:plugin/http-batch"],
        worlds: STEPS,
        grant: Some("grants.http"),
        only_for_its_worlds: None,
        keys: &[key(
            "http_max_in_flight",
            KeyDefault::Count(DEFAULT_HTTP_MAX_IN_FLIGHT),
        )],
        linked: Linked::Always,
        checks: &[Check {
            grant: "grants.http",
            imports: &["weir:plugin/http-batch"],
            without: HTTP_WITHOUT,
        }],
        js_module: Some((
            "weir/http.js",
            include_str!("../../plugins/js/weir/http.js"),
        )),
        docs: "`fetch-all`: many HTTP requests sent at once through the same gate, at most `http_max_in_flight` in flight; without the grant each is `refused`",
    },
    CapabilitySpec {
        capability: Capability::State,
        name: "state",
        interfaces: &["weir:plugin/state"],
        worlds: STEPS,
        grant: Some("grants.state"),
        only_for_its_worlds: None,
        keys: &[
            key("grants.state", KeyDefault::Off),
            key(
                "grants.state.max_keys",
                KeyDefault::Count(DEFAULT_STATE_KEYS),
            ),
            key(
                "grants.state.max_bytes",
                KeyDefault::Bytes(DEFAULT_STATE_BYTES),
            ),
        ],
        linked: Linked::Always,
        checks: &[Check {
            grant: "grants.state",
            imports: &["weir:plugin/state"],
            without: "it loads, and every state call returns an error",
        }],
        js_module: Some((
            "weir/state.js",
            include_str!("../../plugins/js/weir/state.js"),
        )),
        docs: "durable keys and values per tenant and table, committed with the rows' acks; without the grant every call returns an error",
    },
    CapabilitySpec {
        capability: Capability::Postgres,
        name: "postgres",
        interfaces: &["weir:plugin/postgres"],
        worlds: SINKS,
        grant: Some("grants.postgres"),
        only_for_its_worlds: Some("the postgres interface commits with a sink's deliveries"),
        keys: &[
            key("grants.postgres", KeyDefault::Off),
            key("grants.postgres.url", KeyDefault::Required),
            key("grants.postgres.password_file", KeyDefault::Off),
            key(
                "grants.postgres.max_connections",
                KeyDefault::Count(DEFAULT_POSTGRES_CONNECTIONS),
            ),
            key("grants.postgres.tls", KeyDefault::Text("disable")),
            key("grants.postgres.ca_file", KeyDefault::Off),
            key(
                "grants.postgres.idle_in_transaction",
                KeyDefault::Time(DEFAULT_POSTGRES_IDLE_IN_TRANSACTION),
            ),
        ],
        linked: Linked::Always,
        checks: &[Check {
            grant: "grants.postgres",
            imports: &["weir:plugin/postgres"],
            without: "it loads, and every statement returns an error",
        }],
        js_module: None,
        docs: "statements in one transaction per `deliver` call, committed with the rows it applied under the unit's claim; without the grant every statement returns an error",
    },
    CapabilitySpec {
        capability: Capability::Nats,
        name: "nats",
        interfaces: &["weir:plugin/nats"],
        worlds: SINKS,
        grant: Some("grants.nats"),
        only_for_its_worlds: Some("its publishes are sent with a sink's deliveries"),
        keys: &[
            key("grants.nats", KeyDefault::Off),
            key("grants.nats.publish", KeyDefault::Required),
            key("grants.nats.jetstream", KeyDefault::Bool(true)),
        ],
        linked: Linked::Always,
        checks: &[Check {
            grant: "grants.nats",
            imports: &["weir:plugin/nats"],
            without: "it loads, and every publish is refused",
        }],
        js_module: None,
        docs: "publishes to granted subjects through the host's connection, sent after the call for the rows it delivered; without the grant every publish is refused",
    },
    CapabilitySpec {
        capability: Capability::Objects,
        name: "objects",
        interfaces: &["weir:plugin/objects"],
        worlds: SINKS,
        grant: Some("grants.objects"),
        only_for_its_worlds: Some("its objects commit with a sink's deliveries"),
        keys: &[
            key("grants.objects", KeyDefault::Off),
            key("grants.objects.bucket", KeyDefault::Required),
            key("grants.objects.endpoint", KeyDefault::Off),
            key("grants.objects.region", KeyDefault::Text("us-east-1")),
            key("grants.objects.prefix", KeyDefault::Text("")),
            key("grants.objects.credentials_file", KeyDefault::Off),
            key("grants.objects.format", KeyDefault::Required),
            key("grants.objects.compression", KeyDefault::Off),
            key("grants.objects.columns", KeyDefault::Empty),
            key("grants.objects.row_group_rows", KeyDefault::Count(100_000)),
            key(
                "grants.objects.max_rows",
                KeyDefault::Count(DEFAULT_OBJECT_MAX_ROWS),
            ),
            key(
                "grants.objects.max_bytes",
                KeyDefault::Bytes(DEFAULT_OBJECT_MAX_BYTES),
            ),
            key(
                "grants.objects.max_age",
                KeyDefault::Time(DEFAULT_OBJECT_MAX_AGE),
            ),
        ],
        linked: Linked::Always,
        checks: &[Check {
            grant: "grants.objects",
            imports: &["weir:plugin/objects"],
            without: "it loads, and every append is refused",
        }],
        js_module: None,
        docs: "rows into Parquet or NDJSON objects in an S3 bucket, one object per path the sink names, committed at `max_rows`, `max_bytes` or `max_age`; the rows are acked once their object stands; without the grant every append is refused",
    },
    CapabilitySpec {
        capability: Capability::Wasi,
        name: "wasi",
        interfaces: &[
            "wasi:cli/",
            "wasi:clocks/",
            "wasi:filesystem/",
            "wasi:io/",
            "wasi:random/",
            "wasi:sockets/",
        ],
        worlds: ALL_WORLDS,
        grant: None,
        only_for_its_worlds: None,
        keys: &[
            key("grants.dirs", KeyDefault::Empty),
            key("grants.env", KeyDefault::Empty),
        ],
        linked: Linked::Always,
        checks: &[
            Check {
                grant: "grants.dirs",
                imports: &["wasi:filesystem/"],
                without: "only if it opens files: it sees no directory, so opening fails",
            },
            Check {
                grant: "grants.env",
                imports: &["wasi:cli/environment"],
                without: "only if it reads variables: it sees none",
            },
            Check {
                grant: "(never granted)",
                imports: &["wasi:sockets/"],
                without: "sockets are never granted: every connection fails",
            },
        ],
        js_module: None,
        docs: "clocks, random, stderr (quoted when a call traps); directories only from `grants.dirs`, variables only from `grants.env`, sockets never",
    },
];

impl Capability {
    /// This capability's entry of [`CAPABILITIES`].
    pub fn spec(self) -> &'static CapabilitySpec {
        // Every variant has an entry: `every_capability_has_one_entry` checks it.
        CAPABILITIES
            .iter()
            .find(|spec| spec.capability == self)
            .unwrap_or(&CAPABILITIES[0])
    }
}

impl CapabilitySpec {
    /// Whether a component import named `import` is this capability's.
    pub fn serves(&self, import: &str) -> bool {
        self.interfaces.iter().any(|interface| {
            import.strip_prefix(interface).is_some_and(|rest| {
                interface.ends_with('/') || rest.is_empty() || rest.starts_with('@')
            })
        })
    }

    /// The worlds it is for, as a message says them: `sinks`, `transforms and sinks`.
    pub fn worlds_in_words(&self) -> String {
        let names: Vec<String> = self
            .worlds
            .iter()
            .map(|world| format!("{world}s"))
            .collect();
        match names.as_slice() {
            [] => String::new(),
            [one] => one.clone(),
            [init @ .., last] => format!("{} and {last}", init.join(", ")),
        }
    }

    /// Its row of plugins/README.md's table of grants.
    pub fn docs_row(&self) -> String {
        let worlds = if self.worlds == ALL_WORLDS {
            "all".to_string()
        } else {
            self.worlds_in_words()
        };
        let grant = match self.grant {
            Some(grant) => format!("`{grant}`"),
            None if self.keys.is_empty() => "none needed".to_string(),
            None => {
                let keys: Vec<String> = self.keys.iter().map(|k| format!("`{}`", k.name)).collect();
                keys.join(", ")
            }
        };
        format!("| `{}` | {} | {grant} | {} |", self.name, worlds, self.docs)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const WIT: &str = include_str!("../../wit/types.wit");

    /// Each `world NAME { … }` block of the WIT, with the interfaces it imports.
    fn wit_world_imports() -> BTreeMap<String, Vec<String>> {
        let mut worlds = BTreeMap::new();
        let mut rest = WIT;
        while let Some(start) = rest.find("\nworld ") {
            let block = &rest[start + 1..];
            let end = block.find("\n}").unwrap_or(block.len());
            let (block, after) = block.split_at(end);
            let name = block
                .trim_start_matches("world ")
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
            let imports = block
                .lines()
                .filter_map(|line| line.trim().strip_prefix("import "))
                .map(|rest| rest.trim_end_matches(';').trim().to_string())
                .collect();
            worlds.insert(name, imports);
            rest = after;
        }
        worlds
    }

    /// Each `interface NAME { … }` of the WIT, and whether it has a function.
    fn wit_interfaces() -> BTreeMap<String, bool> {
        let mut interfaces = BTreeMap::new();
        let mut rest = WIT;
        while let Some(start) = rest.find("\ninterface ") {
            let block = &rest[start + 1..];
            let end = block.find("\n}").unwrap_or(block.len());
            let (block, after) = block.split_at(end);
            let name = block
                .trim_start_matches("interface ")
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
            let has_func = block.contains(": func(");
            interfaces.insert(name, has_func);
            rest = after;
        }
        interfaces
    }

    #[test]
    fn every_capability_has_one_entry() {
        for spec in CAPABILITIES {
            let entries = CAPABILITIES
                .iter()
                .filter(|other| other.capability == spec.capability)
                .count();
            assert_eq!(entries, 1, "{:?} has {entries} entries", spec.capability);
            assert_eq!(spec.capability.spec().name, spec.name);
        }
    }

    /// A capability added to the WIT but not to the table (or to the table
    /// with the wrong worlds) fails here.
    #[test]
    fn every_import_of_every_world_is_one_entrys() {
        let worlds = wit_world_imports();
        assert_eq!(
            worlds.len(),
            crate::world::WORLDS.len(),
            "the WIT's worlds: {worlds:?}"
        );
        for (world_name, imports) in &worlds {
            let world = World::named(world_name)
                .unwrap_or_else(|| panic!("WIT world {world_name} is not in WORLDS"));
            for interface in imports {
                let import = format!("weir:plugin/{interface}");
                let serving: Vec<&str> = CAPABILITIES
                    .iter()
                    .filter(|spec| spec.serves(&import))
                    .map(|spec| spec.name)
                    .collect();
                assert_eq!(
                    serving.len(),
                    1,
                    "world {world_name} imports {interface}, served by {serving:?}: add it to CAPABILITIES once"
                );
                let spec = CAPABILITIES
                    .iter()
                    .find(|spec| spec.serves(&import))
                    .expect("one entry");
                assert!(
                    spec.worlds.contains(&world),
                    "world {world_name} imports {interface}, but its entry is only for {:?}",
                    spec.worlds
                );
            }
        }
        // The other way: an entry's weir worlds are exactly those importing it.
        for spec in CAPABILITIES {
            for interface in spec.interfaces {
                let Some(name) = interface.strip_prefix("weir:plugin/") else {
                    continue;
                };
                let importing: Vec<World> = worlds
                    .iter()
                    .filter(|(_, imports)| imports.iter().any(|i| i == name))
                    .filter_map(|(world, _)| World::named(world))
                    .collect();
                let mut listed = spec.worlds.to_vec();
                listed.sort();
                let mut importing = importing;
                importing.sort();
                assert_eq!(listed, importing, "the worlds importing {interface}");
            }
        }
    }

    /// Every WIT interface with functions is a capability's: one that no
    /// world imports yet still needs its entry (and its linking).
    #[test]
    fn every_wit_interface_with_functions_is_an_entrys() {
        for (interface, has_func) in wit_interfaces() {
            let import = format!("weir:plugin/{interface}");
            let served = CAPABILITIES
                .iter()
                .filter(|spec| spec.serves(&import))
                .count();
            assert_eq!(
                served,
                usize::from(has_func),
                "interface {interface}: served by {served} entries"
            );
        }
    }

    #[test]
    fn each_key_is_one_entrys_and_each_grant_a_key() {
        let mut owners: BTreeMap<&str, &str> = BTreeMap::new();
        for spec in CAPABILITIES {
            for key in spec.keys {
                assert!(
                    owners.insert(key.name, spec.name).is_none(),
                    "{} is declared twice",
                    key.name
                );
            }
        }
        for spec in CAPABILITIES {
            if let Some(grant) = spec.grant {
                assert!(owners.contains_key(grant), "{}'s grant {grant}", spec.name);
            }
            for check in spec.checks {
                assert!(
                    check.grant.starts_with('(') || owners.contains_key(check.grant),
                    "{}'s check names {}",
                    spec.name,
                    check.grant
                );
                for import in check.imports {
                    assert!(spec.serves(import), "{}'s check import {import}", spec.name);
                }
            }
        }
    }

    #[test]
    fn an_import_is_served_by_its_interface_not_a_longer_name() {
        let state = Capability::State.spec();
        assert!(state.serves("weir:plugin/state@0.3.0"));
        assert!(state.serves("weir:plugin/state"));
        assert!(!state.serves("weir:plugin/statements@0.3.0"));
        assert!(Capability::WasiHttp.spec().serves("wasi:http/types@0.2.3"));
        assert!(!Capability::Wasi.spec().serves("wasi:http/types@0.2.3"));
        assert_eq!(Capability::Postgres.spec().worlds_in_words(), "sinks");
        assert_eq!(
            Capability::State.spec().worlds_in_words(),
            "transforms and sinks"
        );
    }

    /// plugins/README.md's table of grants is the table's rows.
    #[test]
    fn plugins_readme_lists_every_capability() {
        let readme = include_str!("../../plugins/README.md");
        let documented: Vec<&str> = readme
            .lines()
            .skip_while(|line| !line.starts_with("| Capability |"))
            .skip(2)
            .take_while(|line| line.starts_with('|'))
            .collect();
        let rows: Vec<String> = CAPABILITIES.iter().map(CapabilitySpec::docs_row).collect();
        assert_eq!(
            documented,
            rows,
            "plugins/README.md's table of grants (under `| Capability |`) should read:\n{}",
            rows.join("\n")
        );
    }
}
