//! The plugin worlds weir hosts, each written down once in [`WORLDS`]: its
//! name (in WIT, TOML and on the command line), the functions its component
//! exports, where the host calls it, and what `weir plugin new` scaffolds
//! for it. The config, the sandbox (`sandbox/worlds.rs` links and
//! instantiates each), `weir plugin check`, `new` and `test` all read this
//! table: a new world is one entry here, its WIT, its sandbox line and its
//! SDK code.

use serde::Deserialize;

/// The WIT world a plugin implements.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum World {
    Transform,
    Sink,
    Budget,
    Router,
}

/// Where the host calls a world's plugins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A step of a pipeline: called with batches of rows, answering per row.
    Step,
    /// A front-door policy: asked about requests and tables, never given rows.
    Policy,
}

/// What `weir plugin new` writes for a world, per language: the plugin's
/// source (for Rust, with its tests appended), and, for a world that is
/// called with rows, each fixture row's expected outcome.
#[derive(Debug)]
pub struct Scaffold {
    pub rust: &'static str,
    pub rust_test: &'static str,
    pub python: &'static str,
    pub js: &'static str,
    /// `expected.ndjson` for `templates/fixtures/rows.ndjson`; `None` for a
    /// world given no rows (no fixtures, no `test.sh`).
    pub expected: Option<&'static str>,
}

/// One world, as every part of weir needs to know it.
#[derive(Debug)]
pub struct WorldSpec {
    pub world: World,
    /// As in `wit/types.wit`, `world = "…"` and `--world`.
    pub name: &'static str,
    /// The functions its component must export (`init` first).
    pub exports: &'static [&'static str],
    pub role: Role,
    pub scaffold: Scaffold,
}

/// Every world, in the order `weir plugin check` reports them.
pub const WORLDS: &[WorldSpec] = &[
    WorldSpec {
        world: World::Transform,
        name: "transform",
        exports: &["init", "transform"],
        role: Role::Step,
        scaffold: Scaffold {
            rust: include_str!("../templates/rust/transform.rs"),
            rust_test: include_str!("../templates/rust/transform_test.rs"),
            python: include_str!("../templates/python/transform.py"),
            js: include_str!("../templates/js/transform.js"),
            expected: Some(include_str!(
                "../templates/fixtures/transform.expected.ndjson"
            )),
        },
    },
    WorldSpec {
        world: World::Sink,
        name: "sink",
        exports: &["init", "deliver"],
        role: Role::Step,
        scaffold: Scaffold {
            rust: include_str!("../templates/rust/sink.rs"),
            rust_test: include_str!("../templates/rust/sink_test.rs"),
            python: include_str!("../templates/python/sink.py"),
            js: include_str!("../templates/js/sink.js"),
            expected: Some(include_str!("../templates/fixtures/sink.expected.ndjson")),
        },
    },
    WorldSpec {
        world: World::Budget,
        name: "budget",
        exports: &["init", "admit"],
        role: Role::Policy,
        scaffold: Scaffold {
            rust: include_str!("../templates/rust/budget.rs"),
            rust_test: "",
            python: include_str!("../templates/python/budget.py"),
            js: include_str!("../templates/js/budget.js"),
            expected: None,
        },
    },
    WorldSpec {
        world: World::Router,
        name: "router",
        exports: &["init", "route-table", "route-keys"],
        role: Role::Policy,
        scaffold: Scaffold {
            rust: include_str!("../templates/rust/router.rs"),
            rust_test: "",
            python: include_str!("../templates/python/router.py"),
            js: include_str!("../templates/js/router.js"),
            expected: None,
        },
    },
];

impl World {
    /// This world's entry of [`WORLDS`].
    pub fn spec(self) -> &'static WorldSpec {
        // Every variant has an entry: `every_world_has_one_entry` checks it.
        WORLDS
            .iter()
            .find(|spec| spec.world == self)
            .unwrap_or(&WORLDS[0])
    }

    pub fn as_str(self) -> &'static str {
        self.spec().name
    }

    pub fn exports(self) -> &'static [&'static str] {
        self.spec().exports
    }

    pub fn role(self) -> Role {
        self.spec().role
    }

    /// Every world, in the table's order.
    pub fn all() -> impl Iterator<Item = World> {
        WORLDS.iter().map(|spec| spec.world)
    }

    /// The world named `name` (as in WIT and TOML).
    pub fn named(name: &str) -> Option<World> {
        WORLDS
            .iter()
            .find(|spec| spec.name == name)
            .map(|spec| spec.world)
    }

    /// The names of every world, for a message listing what is possible.
    pub fn names() -> String {
        let names: Vec<&str> = WORLDS.iter().map(|spec| spec.name).collect();
        names.join(", ")
    }
}

impl std::fmt::Display for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum as _;

    #[test]
    fn every_world_has_one_entry() {
        for world in World::value_variants() {
            let entries = WORLDS.iter().filter(|spec| spec.world == *world).count();
            assert_eq!(entries, 1, "{world:?} has {entries} entries");
            assert_eq!(World::named(world.as_str()), Some(*world));
        }
        assert_eq!(WORLDS.len(), World::value_variants().len());
    }

    #[test]
    fn names_agree_with_clap_serde_and_the_wit() {
        let wit = include_str!("../../wit/types.wit");
        for spec in WORLDS {
            let world = spec.world;
            let clap_name = world.to_possible_value().map(|v| v.get_name().to_string());
            assert_eq!(clap_name.as_deref(), Some(spec.name));
            let serde: World =
                serde_json::from_value(serde_json::json!(spec.name)).expect("serde name");
            assert_eq!(serde, world);
            let start = wit
                .find(&format!("world {} {{", spec.name))
                .unwrap_or_else(|| panic!("wit/types.wit has no world {}", spec.name));
            let block = &wit[start..];
            let block = &block[..block.find("\n}").unwrap_or(block.len())];
            let exported: Vec<&str> = block
                .lines()
                .filter_map(|line| line.trim().strip_prefix("export "))
                .filter_map(|rest| rest.split(':').next())
                .collect();
            assert_eq!(exported, spec.exports, "world {}'s exports", spec.name);
            assert_eq!(spec.exports.first(), Some(&"init"));
            assert_eq!(spec.scaffold.expected.is_some(), spec.role == Role::Step);
        }
    }
}
