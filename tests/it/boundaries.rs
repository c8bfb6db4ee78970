//! The architecture's boundaries, checked against the sources (as
//! rust-analyzer's tidy tests do): what each subsystem may import (an
//! allowlist), what it may never reach even through others, which
//! subsystems may talk to NATS or wasmtime, and no import cycle between
//! files or folders of `host/src` and `plugins/sdk/src`.
//! ARCHITECTURE.md states the same allowlist (checked here too); a rule
//! broken here fails the build.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// Subsystems (a folder of `host/src`, or a file beside them) that may use
/// the NATS client: the ones that talk to the server.
const MAY_USE_NATS: &[&str] = &[
    "nats",
    "topology",
    "coordination",
    "ingest",
    "delivery",
    // A sink granted `nats` publishes through the host's connection.
    "destination",
    "reload",
    "ops",
    "host",
    "main",
    "cli",
    // `weir send --nats`: requests to the NATS door on a connection the
    // CLI made as the tenant's producer.
    "client",
];
/// Subsystems that may use wasmtime: only the sandbox runs plugins.
const MAY_USE_WASMTIME: &[&str] = &["sandbox"];
/// What each subsystem imports (`crate::<name>`; `weir::<name>` in the
/// binary, `main.rs` and `cli/`), exactly: an import outside its list, or
/// an entry no file uses any more, fails. A subsystem not listed may not
/// exist. ARCHITECTURE.md's "Boundaries" section lists the same.
const MAY_IMPORT: &[(&str, &[&str])] = &[
    ("world", &[]),
    // What the row path sees of a unit's lease; coordination implements it.
    ("fence", &[]),
    // The capability table says which worlds import each capability.
    ("capability", &["world"]),
    ("config", &["world", "capability"]),
    ("telemetry", &[]),
    ("nats", &["config", "telemetry"]),
    ("topology", &["config", "nats"]),
    // Coordination decides who runs a unit; what running one means is
    // plugged in by the host (`UnitRunner`, `KeyFollower`).
    ("coordination", &["nats", "telemetry", "topology", "fence"]),
    // A stateful step writes only while its unit's lease holds (a `Fence`).
    (
        "state",
        &["config", "nats", "telemetry", "topology", "fence"],
    ),
    // A destination commits only under its unit's claim (a `Fence`).
    ("destination", &["config", "fence"]),
    // The sandbox runs plugins and nothing else: it never reaches NATS or
    // the row path around it. A plugin's state calls reach `state`'s
    // overlay, not its store; its statements, the call's transaction.
    (
        "sandbox",
        &[
            "config",
            "world",
            "capability",
            "telemetry",
            "state",
            "destination",
        ],
    ),
    (
        "ingest",
        &[
            "config",
            "nats",
            "topology",
            "telemetry",
            "sandbox",
            "coordination",
        ],
    ),
    (
        "reload",
        &[
            "config",
            "nats",
            "topology",
            "telemetry",
            "sandbox",
            "coordination",
            "ingest",
        ],
    ),
    (
        "delivery",
        &[
            "config",
            "nats",
            "topology",
            "telemetry",
            "state",
            "destination",
            "sandbox",
            "coordination",
            "reload",
            "fence",
        ],
    ),
    (
        "ops",
        &[
            "topology",
            "telemetry",
            "coordination",
            "ingest",
            "reload",
            "delivery",
        ],
    ),
    ("client", &["config", "ops", "telemetry"]),
    // Only the host (and the binary) assembles the subsystems.
    (
        "host",
        &[
            "config",
            "nats",
            "topology",
            "telemetry",
            "state",
            "sandbox",
            "coordination",
            "ingest",
            "reload",
            "delivery",
            "ops",
        ],
    ),
    ("main", &["config", "telemetry"]),
    (
        "cli",
        &[
            "world",
            "capability",
            "config",
            "nats",
            "coordination",
            "topology",
            "telemetry",
            "state",
            "sandbox",
            "ingest",
            "reload",
            "delivery",
            "ops",
            "client",
            "host",
        ],
    ),
    // The property tests feed every parser of outside input.
    (
        "fuzz",
        &[
            "config",
            "nats",
            "topology",
            "sandbox",
            "coordination",
            "ingest",
            "delivery",
        ],
    ),
];

/// How a [`NEVER_REACHES`] rule follows imports.
#[derive(Debug, Clone, Copy)]
enum Through {
    /// Each subsystem's imports as a whole (the graph MAY_IMPORT draws):
    /// no subsystem on the way may import the next, by any file.
    Subsystems,
    /// Only the files a chain's files name (a `crate::` or `super::` path,
    /// or a module file's path into its children, as `pub use store::…`),
    /// and the files those name: a subsystem may import one whose other
    /// files reach further.
    Files,
}

/// What a subsystem never reaches, by any chain of imports: neither
/// directly nor through others (the allowlist says only the first step).
/// ARCHITECTURE.md's Boundaries says the same.
const NEVER_REACHES: &[(&str, &str, Through)] = &[
    // Who owns a unit is coordination's: below the worker, only `fence`
    // says whether the lease holds.
    ("sandbox", "coordination", Through::Subsystems),
    ("destination", "coordination", Through::Subsystems),
    ("state", "coordination", Through::Subsystems),
    // The sandbox runs plugins with no NATS. `state` imports `nats` for its
    // store (`state/store.rs`), which the overlays the sandbox names
    // (`state/batch.rs`, `state/scope.rs`) do not reach: by files.
    ("sandbox", "nats", Through::Files),
];

#[test]
fn host_subsystems_keep_their_boundaries() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let crate_sources = Sources::read(&root);
    let problems = crate_sources.problems();
    assert!(
        problems.is_empty(),
        "host/src breaks ARCHITECTURE.md's rules:\n{}",
        problems.join("\n")
    );
}

/// ARCHITECTURE.md lists the same allowlist as `MAY_IMPORT`, so the two
/// cannot drift.
#[test]
fn architecture_md_states_the_same_allowlist() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    let documented = documented_allowlist(&text);
    let problems = allowlist_differences(&documented, &allowlist());
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md's Boundaries section and MAY_IMPORT in tests/it/boundaries.rs differ:\n{}",
        problems.join("\n")
    );
}

/// The allowlist itself is layered: each subsystem imports only from
/// those listed before it (so it has no cycle either).
#[test]
fn the_allowlist_is_layered() {
    for (at, (from, to)) in MAY_IMPORT.iter().enumerate() {
        let before: Vec<&str> = MAY_IMPORT[..at].iter().map(|(name, _)| *name).collect();
        for name in *to {
            assert!(
                before.contains(name),
                "MAY_IMPORT: {from} → {name}, but {name} is not listed before {from}"
            );
        }
    }
}

/// The allowlist itself makes no chain a [`NEVER_REACHES`] rule by
/// subsystems forbids (the code's imports are checked the same way, with
/// the chain they make), and each rule names listed subsystems.
#[test]
fn the_allowlist_reaches_nothing_never_reached() {
    let allowed = allowlist();
    for &(from, to, through) in NEVER_REACHES {
        assert!(
            allowed.contains_key(from) && allowed.contains_key(to),
            "NEVER_REACHES: {from} → {to} names a subsystem not in MAY_IMPORT"
        );
        if let Through::Subsystems = through {
            let chain = shortest_chain(&allowed, [from.to_string()], |at| at == to);
            assert!(
                chain.is_none(),
                "MAY_IMPORT lets {from} reach {to}: {}",
                chain.unwrap_or_default().join(" → ")
            );
        }
    }
}

#[test]
fn the_guest_sdk_has_no_import_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/sdk/src");
    let sources = Sources::read(&root);
    let cycles = sources.cycles(&sources.file_graph());
    assert!(
        cycles.is_empty(),
        "plugins/sdk has import cycles: {cycles:?}"
    );
}

/// `MAY_IMPORT` as sets.
fn allowlist() -> BTreeMap<String, BTreeSet<String>> {
    MAY_IMPORT
        .iter()
        .map(|(from, to)| {
            let to = to.iter().map(|name| name.to_string()).collect();
            (from.to_string(), to)
        })
        .collect()
}

/// The lines ``- `from` → a, b`` (or `→ nothing`) of the section of
/// ARCHITECTURE.md headed "Boundaries", up to the next heading.
fn documented_allowlist(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut lines = text
        .lines()
        .skip_while(|line| !(line.starts_with('#') && line.contains("Boundaries")));
    let heading = lines.next();
    assert!(
        heading.is_some(),
        "ARCHITECTURE.md has no Boundaries heading"
    );
    let mut documented = BTreeMap::new();
    for line in lines.take_while(|line| !line.starts_with('#')) {
        let Some((from, to)) = line
            .strip_prefix("- `")
            .and_then(|rest| rest.split_once("` → "))
        else {
            continue;
        };
        let to: BTreeSet<String> = to
            .split(',')
            .map(|name| name.trim().trim_end_matches('.').to_string())
            .filter(|name| !name.is_empty() && name != "nothing")
            .collect();
        let repeated = documented.insert(from.to_string(), to);
        assert!(repeated.is_none(), "ARCHITECTURE.md lists `{from}` twice");
    }
    documented
}

/// What one allowlist says that the other does not, a line each.
fn allowlist_differences(
    documented: &BTreeMap<String, BTreeSet<String>>,
    tested: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let names: BTreeSet<&String> = documented.keys().chain(tested.keys()).collect();
    for name in names {
        match (documented.get(name), tested.get(name)) {
            (Some(doc), Some(test)) if doc != test => problems.push(format!(
                "`{name}`: ARCHITECTURE.md says → {doc:?}, the test → {test:?}"
            )),
            (Some(_), None) => problems.push(format!(
                "`{name}` is in ARCHITECTURE.md but not in MAY_IMPORT"
            )),
            (None, Some(_)) => problems.push(format!(
                "`{name}` is in MAY_IMPORT but not in ARCHITECTURE.md"
            )),
            _ => {}
        }
    }
    problems
}

/// The checker itself, on made-up sources: each rule fails when broken.
#[test]
fn the_checker_finds_each_kind_of_break() {
    let sources = |files: &[(&str, &str)]| Sources {
        files: files
            .iter()
            .map(|(path, code)| (PathBuf::from(path), strip_comments_and_strings(code)))
            .collect(),
    };
    let clean = sources(&[
        ("lib.rs", "pub mod nats; pub mod coordination;"),
        ("nats/mod.rs", "pub mod kv; use async_nats::Client;"),
        (
            "nats/kv.rs",
            "// crate::coordination is only named here\nfn f() {}",
        ),
        ("coordination/mod.rs", "use crate::nats::kv::Watch;"),
    ]);
    assert_eq!(clean.problems(), Vec::<String>::new());

    let not_allowed = sources(&[
        (
            "coordination/mod.rs",
            "use crate::delivery::worker::UnitWorker;",
        ),
        ("delivery/worker.rs", "pub struct UnitWorker;"),
    ]);
    assert!(
        not_allowed.problems().iter().any(|p| p.contains(
            "coordination/mod.rs imports delivery::worker::UnitWorker: coordination → delivery is not in MAY_IMPORT"
        )),
        "{:?}",
        not_allowed.problems()
    );

    // The binary reaches the library as `weir::`.
    let binary = sources(&[
        ("main.rs", "use weir::ingest::front_door::FrontDoor;"),
        ("ingest/front_door.rs", "pub struct FrontDoor;"),
    ]);
    assert!(
        binary
            .problems()
            .iter()
            .any(|p| p.contains("main → ingest is not in MAY_IMPORT")),
        "{:?}",
        binary.problems()
    );

    let unlisted = sources(&[("cache/mod.rs", "use crate::config::Config;")]);
    assert!(
        unlisted
            .problems()
            .iter()
            .any(|p| p.contains("subsystem `cache` is not in MAY_IMPORT")),
        "{:?}",
        unlisted.problems()
    );

    // An allowance no file uses is stale; one of a subsystem not in the
    // sources (yet) is kept.
    let unused = sources(&[
        ("client.rs", "use crate::config::Config;"),
        ("config/mod.rs", "pub struct Config;"),
        ("ops/mod.rs", "pub struct Ops;"),
    ]);
    assert_eq!(
        unused.problems(),
        [
            "client → ops is in MAY_IMPORT, but no file of client imports ops: remove it there and in ARCHITECTURE.md"
        ]
    );

    // The allowlist in ARCHITECTURE.md, and what differs from the test's.
    let documented = documented_allowlist(
        "## Code map\n- `ops` → config\n#### Boundaries (checked)\n\n- Only `sandbox/` uses wasmtime.\n- `world` → nothing\n- `config` → world\n- `sandbox` → config, telemetry, state.\n### `host/benches/`\n- `host` → ops\n",
    );
    let expected: BTreeMap<String, BTreeSet<String>> = [
        ("world", vec![]),
        ("config", vec!["world"]),
        ("sandbox", vec!["config", "telemetry", "state"]),
    ]
    .into_iter()
    .map(|(from, to)| (from.into(), to.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(documented, expected);
    let mut tested = expected.clone();
    tested.remove("world");
    tested.insert("sandbox".into(), ["config".into()].into());
    tested.insert("ops".into(), BTreeSet::new());
    assert_eq!(
        allowlist_differences(&documented, &tested),
        [
            "`ops` is in MAY_IMPORT but not in ARCHITECTURE.md",
            "`sandbox`: ARCHITECTURE.md says → {\"config\", \"state\", \"telemetry\"}, the test → {\"config\"}",
            "`world` is in ARCHITECTURE.md but not in MAY_IMPORT",
        ]
    );

    let nats_in_sandbox = sources(&[("sandbox/mod.rs", "fn f(c: async_nats::Client) {}")]);
    assert!(
        nats_in_sandbox
            .problems()
            .iter()
            .any(|p| p.contains("async_nats"))
    );

    let wasmtime_in_delivery = sources(&[("delivery/batch.rs", "use wasmtime::Store;")]);
    assert!(
        wasmtime_in_delivery
            .problems()
            .iter()
            .any(|p| p.contains("wasmtime"))
    );

    let file_cycle = sources(&[
        ("ingest/a.rs", "use super::b::B; pub struct A;"),
        ("ingest/b.rs", "use crate::ingest::a::A; pub struct B;"),
    ]);
    assert!(
        file_cycle
            .problems()
            .iter()
            .any(|p| p.contains("ingest/a.rs → ingest/b.rs → ingest/a.rs")),
        "{:?}",
        file_cycle.problems()
    );

    let folder_cycle = sources(&[
        ("ingest/a.rs", "use crate::reload::c::C;"),
        ("reload/c.rs", "pub struct C;"),
        ("reload/d.rs", "use crate::ingest::e::E;"),
        ("ingest/e.rs", "pub struct E;"),
    ]);
    assert!(
        folder_cycle
            .problems()
            .iter()
            .any(|p| p.contains("folders import each other: ingest → reload → ingest")),
        "{:?}",
        folder_cycle.problems()
    );

    // A group of module paths is followed into each.
    let grouped = sources(&[
        (
            "destination/step.rs",
            "use crate::{config::Grant, coordination::{Lease, UnitEnd}};",
        ),
        ("config/mod.rs", "pub struct Grant;"),
        ("coordination/mod.rs", "pub struct Lease;"),
    ]);
    assert!(
        grouped.problems().iter().any(|p| p.contains(
            "destination/step.rs imports coordination::Lease: destination → coordination is not in MAY_IMPORT"
        )),
        "{:?}",
        grouped.problems()
    );

    // What a subsystem never reaches, it reaches through no other either.
    let through_destination = sources(&[
        ("sandbox/instance.rs", "use crate::destination::PgCall;"),
        ("destination/mod.rs", "mod step;\npub use step::PgCall;"),
        (
            "destination/step.rs",
            "use crate::coordination::Lease; pub struct PgCall;",
        ),
        ("coordination/mod.rs", "pub struct Lease;"),
    ]);
    assert!(
        through_destination.problems().iter().any(|p| p.contains(
            "sandbox reaches coordination: sandbox → destination (sandbox/instance.rs) → coordination (destination/step.rs)"
        )),
        "{:?}",
        through_destination.problems()
    );

    // By files: the overlays, not the store beside them in `state`.
    let store = [
        (
            "state/mod.rs",
            "pub mod scope;\nmod store;\npub use store::Store;",
        ),
        ("state/scope.rs", "pub struct Overlay;"),
        (
            "state/store.rs",
            "use crate::nats::kv::Kv; pub struct Store;",
        ),
        ("nats/kv.rs", "pub struct Kv;"),
    ];
    let overlays = [("sandbox/imports.rs", "use crate::state::scope::Overlay;")];
    let overlays_only = sources(&[&overlays[..], &store[..]].concat());
    assert_eq!(overlays_only.problems(), Vec::<String>::new());
    let the_store = [("sandbox/imports.rs", "use crate::state::Store;")];
    let through_the_store = sources(&[&the_store[..], &store[..]].concat());
    assert_eq!(
        through_the_store.problems(),
        [
            "sandbox reaches nats through the files it names: sandbox/imports.rs → state/mod.rs → state/store.rs → nats/kv.rs; it must not, by any chain (NEVER_REACHES, ARCHITECTURE.md's Boundaries)"
        ]
    );
}

/// Every `.rs` file under a crate's `src`, by path relative to it, with
/// comments and string literals blanked out (a doc link or a log message
/// is not a dependency).
struct Sources {
    files: BTreeMap<PathBuf, String>,
}

impl Sources {
    fn read(root: &Path) -> Sources {
        let mut files = BTreeMap::new();
        let mut dirs = vec![root.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            let entries = std::fs::read_dir(&dir)
                .unwrap_or_else(|err| panic!("cannot read {}: {err}", dir.display()));
            for entry in entries {
                let path = entry.expect("directory entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|ext| ext == "rs") {
                    let code = std::fs::read_to_string(&path)
                        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
                    let relative = path.strip_prefix(root).expect("under root").to_path_buf();
                    files.insert(relative, strip_comments_and_strings(&code));
                }
            }
        }
        assert!(!files.is_empty(), "no sources under {}", root.display());
        Sources { files }
    }

    fn problems(&self) -> Vec<String> {
        self.problems_with(&allowlist())
    }

    /// Every break of the rules, with `allowed` as the allowlist.
    fn problems_with(&self, allowed: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
        let mut problems = Vec::new();
        let subsystems: BTreeSet<String> = self.files.keys().map(|p| subsystem_of(p)).collect();
        let mut used: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        // The first file that makes each subsystem edge, for a chain's report.
        let mut made_by: BTreeMap<(String, String), String> = BTreeMap::new();
        for (path, code) in &self.files {
            let subsystem = subsystem_of(path);
            if mentions(code, "async_nats") && !MAY_USE_NATS.contains(&subsystem.as_str()) {
                problems.push(format!(
                    "{} uses async_nats; only {MAY_USE_NATS:?} talk to NATS",
                    path.display()
                ));
            }
            if mentions(code, "wasmtime") && !MAY_USE_WASMTIME.contains(&subsystem.as_str()) {
                problems.push(format!(
                    "{} uses wasmtime; only {MAY_USE_WASMTIME:?} run plugins",
                    path.display()
                ));
            }
            // The crate root declares the subsystems; it imports none.
            if subsystem == "lib" {
                continue;
            }
            let Some(may) = allowed.get(&subsystem) else {
                problems.push(format!(
                    "{}: subsystem `{subsystem}` is not in MAY_IMPORT: list what it may import (and in ARCHITECTURE.md's Boundaries)",
                    path.display()
                ));
                continue;
            };
            for target in crate_paths(path, code) {
                let to = &target[0];
                // Its own modules, or an item of the crate root.
                if *to == subsystem || !subsystems.contains(to) {
                    continue;
                }
                used.entry(subsystem.clone())
                    .or_default()
                    .insert(to.clone());
                made_by
                    .entry((subsystem.clone(), to.clone()))
                    .or_insert_with(|| path.display().to_string());
                if !may.contains(to) {
                    problems.push(format!(
                        "{} imports {}: {subsystem} → {to} is not in MAY_IMPORT (a new import is a decision: write it in ARCHITECTURE.md's Boundaries and in MAY_IMPORT)",
                        path.display(),
                        target.join("::")
                    ));
                }
            }
        }
        // The list says what the code does: an import nobody makes any more
        // goes (a subsystem not in these sources yet keeps its entries).
        for (from, may) in allowed {
            for to in may {
                let imports = used.get(from).is_some_and(|used| used.contains(to));
                if subsystems.contains(from) && subsystems.contains(to) && !imports {
                    problems.push(format!(
                        "{from} → {to} is in MAY_IMPORT, but no file of {from} imports {to}: remove it there and in ARCHITECTURE.md"
                    ));
                }
            }
        }
        problems.extend(self.reached(&used, &made_by));
        for cycle in self.cycles(&self.file_graph()) {
            problems.push(format!("files import each other: {cycle}"));
        }
        for cycle in self.cycles(&self.folder_graph()) {
            problems.push(format!("folders import each other: {cycle}"));
        }
        problems
    }

    /// Each [`NEVER_REACHES`] rule the code breaks, with the shortest chain
    /// that breaks it; `used` is what each subsystem imports, `made_by` the
    /// file making each such import first.
    fn reached(
        &self,
        used: &BTreeMap<String, BTreeSet<String>>,
        made_by: &BTreeMap<(String, String), String>,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        let named = self.named_graph();
        for &(from, to, through) in NEVER_REACHES {
            match through {
                Through::Subsystems => {
                    let Some(chain) = shortest_chain(used, [from.to_string()], |at| at == to)
                    else {
                        continue;
                    };
                    let mut shown = from.to_string();
                    for step in chain.windows(2) {
                        let file = made_by
                            .get(&(step[0].clone(), step[1].clone()))
                            .map_or("?", String::as_str);
                        shown.push_str(&format!(" → {} ({file})", step[1]));
                    }
                    problems.push(format!(
                        "{from} reaches {to}: {shown}; it must not, by any chain (NEVER_REACHES, ARCHITECTURE.md's Boundaries)"
                    ));
                }
                Through::Files => {
                    let starts = self
                        .files
                        .keys()
                        .filter(|path| subsystem_of(path) == from)
                        .map(|path| path.display().to_string());
                    let reaches = |file: &str| subsystem_of(Path::new(file)) == to;
                    if let Some(chain) = shortest_chain(&named, starts, reaches) {
                        problems.push(format!(
                            "{from} reaches {to} through the files it names: {}; it must not, by any chain (NEVER_REACHES, ARCHITECTURE.md's Boundaries)",
                            chain.join(" → ")
                        ));
                    }
                }
            }
        }
        problems
    }

    /// [`Sources::file_graph`] with what each module file names of its own
    /// children (`pub use store::StateStore` in `state/mod.rs`): a path into
    /// a module reaches the children it re-exports. (The cycle check keeps
    /// the file graph without them.)
    fn named_graph(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut graph = self.file_graph();
        for (path, code) in &self.files {
            let from = path.display().to_string();
            let module = module_of(path);
            let children: BTreeSet<String> = self
                .files
                .keys()
                .filter_map(|other| {
                    let rest = other.strip_prefix(module.join("/")).ok()?;
                    let mut parts = rest.components();
                    let child = parts.next()?.as_os_str().to_string_lossy().to_string();
                    match (parts.next(), child.strip_suffix(".rs")) {
                        // Not the module file itself.
                        (None, Some(name)) if name != "mod" => Some(name.to_string()),
                        (Some(file), None) if file.as_os_str() == "mod.rs" => Some(child),
                        _ => None,
                    }
                })
                .collect();
            for target in child_paths(&module, code, &children) {
                if let Some(file) = self.module_file(&target)
                    && file != from
                {
                    graph.entry(from.clone()).or_default().insert(file);
                }
            }
        }
        graph
    }

    /// Which file each file imports from (`crate::…` and `super::…` paths
    /// resolved to the module file that defines them).
    fn file_graph(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (path, code) in &self.files {
            let from = path.display().to_string();
            let edges = graph.entry(from.clone()).or_default();
            for target in crate_paths(path, code) {
                if let Some(file) = self.module_file(&target)
                    && file != from
                    && !is_ancestor_module(&file, &from)
                {
                    edges.insert(file);
                }
            }
        }
        graph
    }

    /// The same edges between subsystems (top-level folders and files).
    fn folder_graph(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, targets) in self.file_graph() {
            let from = subsystem_of(Path::new(&from));
            let edges = graph.entry(from.clone()).or_default();
            for target in targets {
                let target = subsystem_of(Path::new(&target));
                if target != from && target != "lib" {
                    edges.insert(target);
                }
            }
        }
        graph
    }

    /// The longest prefix of `segments` that names a module file.
    fn module_file(&self, segments: &[String]) -> Option<String> {
        (1..=segments.len()).rev().find_map(|len| {
            let base = segments[..len].join("/");
            [format!("{base}.rs"), format!("{base}/mod.rs")]
                .into_iter()
                .find(|candidate| self.files.contains_key(Path::new(candidate)))
        })
    }

    /// Each cycle once, as `a → b → a`.
    fn cycles(&self, graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
        let mut found = BTreeSet::new();
        for start in graph.keys() {
            let mut stack = vec![(start.clone(), vec![start.clone()])];
            let mut seen = BTreeSet::new();
            while let Some((node, path)) = stack.pop() {
                for next in graph.get(&node).into_iter().flatten() {
                    if next == start {
                        // Report each cycle from its smallest member.
                        if path.iter().min() == Some(start) {
                            let mut shown = path.clone();
                            shown.push(start.clone());
                            found.insert(shown.join(" → "));
                        }
                    } else if seen.insert(next.clone()) {
                        let mut longer = path.clone();
                        longer.push(next.clone());
                        stack.push((next.clone(), longer));
                    }
                }
            }
        }
        found.into_iter().collect()
    }
}

/// The shortest chain of `graph`'s edges from one of `starts` to a node
/// `is_end` accepts, as its nodes (start and end included).
fn shortest_chain(
    graph: &BTreeMap<String, BTreeSet<String>>,
    starts: impl IntoIterator<Item = String>,
    is_end: impl Fn(&str) -> bool,
) -> Option<Vec<String>> {
    let mut came_from: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut queue = VecDeque::new();
    for start in starts {
        if came_from.insert(start.clone(), None).is_none() {
            queue.push_back(start);
        }
    }
    while let Some(node) = queue.pop_front() {
        if is_end(&node) {
            let mut chain = vec![node.clone()];
            while let Some(Some(before)) = came_from.get(chain.last()?) {
                chain.push(before.clone());
            }
            chain.reverse();
            return Some(chain);
        }
        for next in graph.get(&node).into_iter().flatten() {
            if !came_from.contains_key(next) {
                came_from.insert(next.clone(), Some(node.clone()));
                queue.push_back(next.clone());
            }
        }
    }
    None
}

/// `delivery/worker.rs` → `delivery`; `host.rs` → `host`.
fn subsystem_of(path: &Path) -> String {
    let first = path
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().to_string());
    let first = first.unwrap_or_default();
    first.strip_suffix(".rs").unwrap_or(&first).to_string()
}

/// A parent module (`mod.rs`, `lib.rs`) declares its children; that is
/// not an import.
fn is_ancestor_module(file: &str, of: &str) -> bool {
    file == "lib.rs"
        || file == "main.rs"
        || file
            .strip_suffix("mod.rs")
            .is_some_and(|dir| of.starts_with(dir))
}

/// Whether `name` appears as a path root in the code (`name::`).
fn mentions(code: &str, name: &str) -> bool {
    code.match_indices(&format!("{name}::"))
        .any(|(at, _)| !code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
}

/// Every `crate::a::b…` and `super::…` path in the code (and `weir::…` in
/// the binary), as absolute module segments (`super` resolved against the
/// file's own module).
fn crate_paths(path: &Path, code: &str) -> Vec<Vec<String>> {
    let module = module_of(path);
    // The binary (`main.rs`, `cli/`) reaches the library as `weir::`.
    let binary = matches!(subsystem_of(path).as_str(), "main" | "cli");
    let roots: &[&str] = if binary {
        &["crate::", "super::", "weir::"]
    } else {
        &["crate::", "super::"]
    };
    let mut found = Vec::new();
    for &root in roots {
        for (at, _) in code.match_indices(root) {
            if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let prefix: Vec<String> = match root {
                "super::" => module[..module.len().saturating_sub(1)].to_vec(),
                _ => Vec::new(),
            };
            let paths = paths_at(prefix, &code[at + root.len()..]);
            found.extend(paths.into_iter().filter(|segments| !segments.is_empty()));
        }
    }
    found
}

/// The module a file is (`state/mod.rs` and `state.rs` → `state`; the
/// crate root → none), as segments.
fn module_of(path: &Path) -> Vec<String> {
    let mut module: Vec<String> = path
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .collect();
    if module
        .last()
        .is_some_and(|last| last == "mod" || last == "lib" || last == "main")
    {
        module.pop();
    }
    module
}

/// The paths that start `rest`, each after `segments`: `a::b::C` is one;
/// `a::{b::C, d}` is its prefix `a` and each entry (`a::b::C`, `a::d`), so
/// a group of module paths is followed into each.
fn paths_at(mut segments: Vec<String>, mut rest: &str) -> Vec<Vec<String>> {
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let mut found = vec![segments.clone()];
            for entry in group_entries(group) {
                found.extend(paths_at(segments.clone(), entry.trim()));
            }
            return found;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() || name == "super" {
            return vec![segments];
        }
        rest = &rest[name.len()..];
        segments.push(name);
        match rest.strip_prefix("::") {
            Some(after) => rest = after,
            None => return vec![segments],
        }
    }
}

/// The entries of the `{…}` group `group` starts inside (up to its `}`).
fn group_entries(group: &str) -> Vec<&str> {
    let (mut depth, mut start, mut entries) = (0usize, 0, Vec::new());
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                entries.push(&group[start..at]);
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                entries.push(&group[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    entries
}

/// The paths into its own child modules that the code of `module` names
/// (`store::StateStore` or `self::store::StateStore` in `state/mod.rs`,
/// `children` holding `store`), as absolute module segments.
fn child_paths(module: &[String], code: &str, children: &BTreeSet<String>) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let roots = children
        .iter()
        .map(|child| (format!("{child}::"), 0))
        .chain([("self::".to_string(), "self::".len())]);
    for (root, skip) in roots {
        for (at, _) in code.match_indices(&root) {
            if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let paths = paths_at(module.to_vec(), &code[at + skip..]);
            found.extend(paths.into_iter().filter(|path| path.len() > module.len()));
        }
    }
    found
}

/// The code with comments removed and string and char literals emptied
/// (raw strings and byte strings too; a lifetime is kept).
fn strip_comments_and_strings(code: &str) -> String {
    let bytes = code.as_bytes();
    let mut out = String::with_capacity(code.len());
    let mut at = 0;
    let ident = |i: usize| i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
    while at < bytes.len() {
        let rest = &code[at..];
        if rest.starts_with("//") {
            at += rest.find('\n').unwrap_or(rest.len());
        } else if let Some(body) = rest.strip_prefix("/*") {
            let len = body.find("*/").map_or(rest.len(), |end| end + 4);
            keep_newlines(&mut out, &rest[..len]);
            at += len;
        } else if (rest.starts_with("r\"") || rest.starts_with("r#"))
            && (!ident(at) || (at > 0 && bytes[at - 1] == b'b' && !ident(at - 1)))
        {
            let hashes = rest[1..].bytes().take_while(|b| *b == b'#').count();
            if rest.as_bytes().get(1 + hashes) != Some(&b'"') {
                out.push('r');
                at += 1;
                continue;
            }
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            let len = rest[body..]
                .find(&close)
                .map_or(rest.len(), |end| body + end + close.len());
            out.push_str("\"\"");
            keep_newlines(&mut out, &rest[..len]);
            at += len;
        } else if rest.starts_with('"') {
            let mut i = 1;
            while i < rest.len() {
                match rest.as_bytes()[i] {
                    b'\\' => i += 2,
                    b'"' => break,
                    _ => i += 1,
                }
            }
            let len = (i + 1).min(rest.len());
            out.push_str("\"\"");
            keep_newlines(&mut out, &rest[..len]);
            at += len;
        } else if let Some(quoted) = rest.strip_prefix('\'') {
            // A char literal ('x', '\n', '\u{..}'), or a lifetime ('a).
            let literal = if let Some(escaped) = quoted.strip_prefix('\\') {
                escaped.find('\'').map(|end| end + 3)
            } else {
                let mut chars = quoted.char_indices();
                match (chars.next(), chars.next()) {
                    (Some(_), Some((end, '\''))) => Some(end + 2),
                    _ => None,
                }
            };
            match literal {
                Some(len) => {
                    at += len;
                    out.push_str("' '");
                }
                None => {
                    out.push('\'');
                    at += 1;
                }
            }
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            at += c.len_utf8();
        }
    }
    out
}

/// Line breaks inside a skipped comment or literal, kept so that line
/// numbers in the stripped code are the file's.
fn keep_newlines(out: &mut String, skipped: &str) {
    out.extend(skipped.chars().filter(|c| *c == '\n'));
}

/// Files longer than this are split by concern.
const MAX_FILE_LINES: usize = 1_000;
/// Functions longer than this are split into named steps.
const MAX_FN_LINES: usize = 120;
/// Functions allowed to be longer: they render tables, one row per line.
const LONG_FNS_ALLOWED: &[(&str, &str)] = &[("cli/status.rs", "tables")];
/// The folders of a batch's path, read top to bottom by whoever follows a
/// batch: tighter bounds, a file's lines counted before its tests.
const ROW_PATH: &[&str] = &["delivery/", "destination/"];
const ROW_PATH_MAX_FILE_LINES: usize = 700;
const ROW_PATH_MAX_FN_LINES: usize = 80;

/// ARCHITECTURE.md's size bounds: no file in `host/src` over 1,000 lines,
/// no function over 120 but the table renderers; in `delivery/` and
/// `destination/`, no file over 700 lines before its tests and no
/// function over 80.
#[test]
fn files_and_functions_stay_within_their_sizes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut problems = Vec::new();
    for path in rust_files_under(&root) {
        let code = std::fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
        let file = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .display()
            .to_string();
        let row_path = ROW_PATH.iter().any(|folder| file.starts_with(folder));
        let (max_file, max_fn, lines) = match row_path {
            true => (
                ROW_PATH_MAX_FILE_LINES,
                ROW_PATH_MAX_FN_LINES,
                code.lines()
                    .take_while(|line| !line.starts_with("#[cfg(test)]"))
                    .count(),
            ),
            false => (MAX_FILE_LINES, MAX_FN_LINES, code.lines().count()),
        };
        if lines > max_file {
            problems.push(format!("{file}: {lines} lines (at most {max_file})"));
        }
        for (name, line, length) in long_functions(&code, max_fn) {
            if !LONG_FNS_ALLOWED.contains(&(file.as_str(), name.as_str())) {
                problems.push(format!(
                    "{file}:{line}: fn {name} is {length} lines (at most {max_fn})"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "too long:\n{}", problems.join("\n"));
}

#[test]
fn the_size_check_finds_a_long_function_and_ignores_braces_in_literals() {
    let body = "    let x = 1;\n".repeat(121);
    let code = format!(
        "//! a file\nfn short() {{ let s = \"{{\"; let c = '{{'; }}\n\npub async fn long() {{\n{body}}}\n"
    );
    assert_eq!(
        long_functions(&code, MAX_FN_LINES),
        vec![("long".to_string(), 4, 123)]
    );
    assert!(long_functions(&code, 200).is_empty());
}

/// The names declared in `code` (types, traits, aliases) by the modules
/// of a batch's path: one name, one thing.
fn declared_types(code: &str) -> Vec<String> {
    let stripped = strip_comments_and_strings(code);
    let mut names = Vec::new();
    for line in stripped.lines() {
        // An indented `type` is an impl's or a trait's associated type.
        let nested = line.starts_with(char::is_whitespace);
        let mut words = line.split_whitespace().peekable();
        while let Some(word) = words.next() {
            let declares =
                matches!(word, "struct" | "enum" | "trait") || (word == "type" && !nested);
            if declares && let Some(name) = words.peek() {
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if name.starts_with(|c: char| c.is_ascii_uppercase()) {
                    names.push(name);
                }
            }
        }
    }
    names
}

/// No two types, and no two modules, of `delivery/` and `destination/`
/// share a name: whoever follows a batch meets each name once.
#[test]
fn names_on_the_row_path_are_each_used_once() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut types: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut modules: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for folder in ROW_PATH {
        for path in rust_files_under(&root.join(folder)) {
            let file = path.strip_prefix(&root).unwrap_or(&path);
            let shown = file.display().to_string();
            let module = match file.file_stem().and_then(|stem| stem.to_str()) {
                Some("mod") | Some("tests") | None => None,
                Some(stem) => Some(stem.to_string()),
            };
            let module = module.or_else(|| {
                let parent = file.parent()?.file_name()?.to_str()?;
                (file.file_stem()? == "mod").then(|| parent.to_string())
            });
            if let Some(module) = module {
                modules.entry(module).or_default().push(shown.clone());
            }
            let code = std::fs::read_to_string(&path)
                .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
            for name in declared_types(&code) {
                types.entry(name).or_default().push(shown.clone());
            }
        }
    }
    let repeated: Vec<String> = types
        .iter()
        .map(|(name, files)| (format!("type {name}"), files))
        .chain(
            modules
                .iter()
                .map(|(name, files)| (format!("module {name}"), files)),
        )
        .filter(|(_, files)| files.len() > 1)
        .map(|(name, files)| format!("{name}: {}", files.join(", ")))
        .collect();
    assert!(
        repeated.is_empty(),
        "names used twice:\n{}",
        repeated.join("\n")
    );
}

#[test]
fn the_name_check_finds_types_but_not_words_in_comments_or_strings() {
    let code = "// struct Comment\npub(crate) struct Held { x: u8 }\nenum Next<'a> {}\nlet s = \"type Text\";\npub type RowVerdict = u8;\nimpl Iterator for Held {\n    type Item = u8;\n}\n";
    assert_eq!(declared_types(code), vec!["Held", "Next", "RowVerdict"]);
}

/// Every `.rs` file under `root`.
fn rust_files_under(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let entries = std::fs::read_dir(&folder)
            .unwrap_or_else(|err| panic!("cannot list {}: {err}", folder.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Functions longer than `max` lines, from `fn` to the closing brace: name,
/// first line (1-based) and length.
fn long_functions(code: &str, max: usize) -> Vec<(String, usize, usize)> {
    let stripped = strip_comments_and_strings(code);
    let lines: Vec<&str> = stripped.lines().collect();
    let mut found = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let Some(name) = fn_name(lines[at]) else {
            at += 1;
            continue;
        };
        let (mut depth, mut opened, mut end) = (0usize, false, None);
        'scan: for (offset, line) in lines[at..].iter().enumerate() {
            for c in line.chars() {
                match c {
                    '{' => (depth, opened) = (depth + 1, true),
                    '}' => depth = depth.saturating_sub(1),
                    // A declaration without a body (in a trait).
                    ';' if !opened => break 'scan,
                    _ => {}
                }
                if opened && depth == 0 {
                    end = Some(at + offset);
                    break 'scan;
                }
            }
        }
        match end {
            Some(end) => {
                if end - at + 1 > max {
                    found.push((name, at + 1, end - at + 1));
                }
                at = end + 1;
            }
            None => at += 1,
        }
    }
    found
}

/// The name a line declares as a function (`pub(crate) async fn name`).
fn fn_name(line: &str) -> Option<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|word| *word == "fn")?;
    let qualifiers = [
        "pub",
        "pub(crate)",
        "pub(super)",
        "async",
        "const",
        "unsafe",
    ];
    if !words[..at].iter().all(|word| qualifiers.contains(word)) {
        return None;
    }
    let name = words.get(at + 1)?;
    let name: String = name
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}
