//! `weir plugin new`: writes a plugin project (Rust, Python or JavaScript)
//! that builds outside weir's repository, with fixture rows, their expected
//! outcomes and a test. The templates live in `host/templates/`; Python and
//! JavaScript projects get a copy of their SDK and of weir's WIT, so they
//! build with nothing but their language's componentizer.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use weir::capability::CAPABILITIES;
use weir::world::{Role, World};

/// The language of a new plugin.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

#[derive(clap::Args)]
pub struct NewArgs {
    /// The plugin's name: lowercase letters, digits, `-` and `_`, starting
    /// with a letter. It names the project folder and the `.wasm`.
    name: String,
    /// The world it implements.
    #[arg(long, value_enum, default_value = "transform")]
    world: World,
    /// Its language.
    #[arg(long, value_enum, default_value = "rust")]
    lang: Lang,
    /// Where to write it (default: ./NAME). It must not exist, or be empty.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// For `--lang rust`: the path of weir's Rust SDK (`plugins/sdk` in a
    /// checkout of weir). Default: the one this weir was built from.
    #[arg(long, value_name = "PATH")]
    sdk: Option<PathBuf>,
}

const WIT: &str = include_str!("../../../wit/types.wit");
const README: &str = include_str!("../../templates/README.md");
const ROWS: &str = include_str!("../../templates/fixtures/rows.ndjson");

/// A file of a project: its path in the project, its text, and whether it
/// is a script to mark executable.
type File = (&'static str, String, bool);

impl NewArgs {
    pub fn run(self) -> anyhow::Result<()> {
        check_name(&self.name)?;
        let dir = self
            .dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(&self.name));
        let files = self.files()?;
        write_project(&dir, &files)?;
        println!(
            "wrote the {} {} plugin {} in {}",
            lang_name(self.lang),
            self.world.as_str(),
            self.name,
            dir.display()
        );
        println!("  build: cd {} && ./build.sh", dir.display());
        if self.world.role() == Role::Step {
            println!("  test:  ./test.sh");
        }
        Ok(())
    }

    /// Every file of the project, placeholders filled in.
    fn files(&self) -> anyhow::Result<Vec<File>> {
        let world = self.world;
        let mut files: Vec<File> = match self.lang {
            Lang::Python => python(world),
            Lang::Js => js(world),
            Lang::Rust => rust(world),
        };
        let (build, needs) = match self.lang {
            Lang::Python => ("./build.sh", "It needs `pip install componentize-py`."),
            Lang::Js => (
                "npm install\n./build.sh",
                "It needs Node 18 or later; `npm install` fetches componentize-js.",
            ),
            Lang::Rust => (
                "./build.sh",
                "It needs `rustup target add wasm32-wasip2`, and weir's Rust SDK \
                 at the path in `Cargo.toml`.",
            ),
        };
        match world.spec().scaffold.expected {
            Some(expected) => {
                files.push(("rows.ndjson", ROWS.to_string(), false));
                files.push(("expected.ndjson", expected.to_string(), false));
            }
            // A policy is asked about requests and tables, not rows: no
            // row fixtures, so no test to run on them.
            None => files.retain(|(path, _, _)| *path != "test.sh"),
        }
        let mut table = String::new();
        for (path, _, _) in &files {
            let what = describe(path);
            if !what.is_empty() {
                table.push_str(&format!("| `{path}` | {what} |\n"));
            }
        }
        files.push((
            "README.md",
            README
                .replace("{{files}}", &table)
                .replace("{{build}}", build)
                .replace("{{needs}}", needs)
                .replace("{{language}}", lang_name(self.lang)),
            false,
        ));
        let sdk = match self.lang {
            Lang::Rust => sdk_path(self.sdk.as_deref())?,
            Lang::Python | Lang::Js => String::new(),
        };
        let crate_name = self.name.replace('-', "_");
        Ok(files
            .into_iter()
            .map(|(path, text, script)| {
                let text = text
                    .replace("{{name}}", &self.name)
                    .replace("{{crate}}", &crate_name)
                    .replace("{{world}}", world.as_str())
                    .replace("{{sdk}}", &sdk);
                (path, text, script)
            })
            .collect())
    }
}

fn lang_name(lang: Lang) -> &'static str {
    match lang {
        Lang::Rust => "Rust",
        Lang::Python => "Python",
        Lang::Js => "JavaScript",
    }
}

fn describe(path: &str) -> &'static str {
    match path {
        "app.py" | "plugin.js" | "src/lib.rs" => "the plugin: edit this",
        "build.sh" => "builds the `.wasm`",
        "test.sh" => "runs the test",
        "Cargo.toml" => "the crate, in a workspace of its own",
        "Cargo.lock" => "the crate versions weir's own plugins use",
        "package.json" => "the build tool (componentize-js)",
        "wit/types.wit" => "weir's WIT, `weir:plugin@0.3.0`",
        "rows.ndjson" => "fixture rows, one payload a line",
        "expected.ndjson" => "each fixture row's expected outcome, in order",
        p if p.starts_with("weir_plugin/") || p.starts_with("weir/") => "weir's SDK (a copy)",
        _ => "",
    }
}

/// Plugin names become file, crate and config names: keep them plain.
fn check_name(name: &str) -> anyhow::Result<()> {
    let mut chars = name.chars();
    let plain = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !plain {
        bail!(
            "`{name}` is not a plugin name: use lowercase letters, digits, `-` and `_`, starting with a letter"
        );
    }
    Ok(())
}

/// The Rust SDK's path for a new project's `Cargo.toml`.
fn sdk_path(given: Option<&Path>) -> anyhow::Result<String> {
    // The SDK this weir was built from, when it is still there: the common
    // case of a weir built from a checkout.
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/sdk");
    let path = given.map_or(built_from, Path::to_path_buf);
    let path = path.canonicalize().with_context(|| {
        format!(
            "weir's Rust SDK is not at {}: give the path of `plugins/sdk` in a checkout of weir with --sdk",
            path.display()
        )
    })?;
    if !path.join("Cargo.toml").is_file() {
        bail!(
            "{} is not weir's Rust SDK (no Cargo.toml): give the path of `plugins/sdk` with --sdk",
            path.display()
        );
    }
    Ok(path.display().to_string().replace('\\', "/"))
}

/// Writes `files` under `dir`, which must not exist or be empty.
fn write_project(dir: &Path, files: &[File]) -> anyhow::Result<()> {
    if let Ok(mut entries) = std::fs::read_dir(dir)
        && entries.next().is_some()
    {
        bail!("{} exists and is not empty", dir.display());
    }
    for (path, text, script) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        if *script {
            make_executable(&path)?;
        }
    }
    Ok(())
}

#[cfg(unix)]
fn make_executable(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", path.display()))
}

#[cfg(not(unix))]
fn make_executable(_: &Path) -> anyhow::Result<()> {
    Ok(())
}

fn python(world: World) -> Vec<File> {
    let app = world.spec().scaffold.python;
    vec![
        ("app.py", app.to_string(), false),
        (
            "weir_plugin/__init__.py",
            include_str!("../../../plugins/python/weir_plugin/__init__.py").to_string(),
            false,
        ),
        (
            "weir_plugin/testing.py",
            include_str!("../../../plugins/python/weir_plugin/testing.py").to_string(),
            false,
        ),
        ("wit/types.wit", WIT.to_string(), false),
        (".gitignore", "*.wasm\n__pycache__/\n".to_string(), false),
        (
            "build.sh",
            include_str!("../../templates/python/build.sh").to_string(),
            true,
        ),
        (
            "test.sh",
            include_str!("../../templates/python/test.sh").to_string(),
            true,
        ),
    ]
}

fn js(world: World) -> Vec<File> {
    let plugin = world.spec().scaffold.js;
    // Each capability's own module (`weir/state.js`, `weir/http.js`), from
    // the capability table, after the SDK's core.
    let modules = CAPABILITIES
        .iter()
        .filter_map(|spec| spec.js_module)
        .map(|(path, source)| (path, source.to_string(), false));
    let mut files = vec![
        ("plugin.js", plugin.to_string(), false),
        (
            "weir/index.js",
            include_str!("../../../plugins/js/weir/index.js").to_string(),
            false,
        ),
        (
            "weir/core.js",
            include_str!("../../../plugins/js/weir/core.js").to_string(),
            false,
        ),
        (
            "weir/test.mjs",
            include_str!("../../../plugins/js/weir/test.mjs").to_string(),
            false,
        ),
        (
            "weir/node-host.mjs",
            include_str!("../../../plugins/js/weir/node-host.mjs").to_string(),
            false,
        ),
        ("wit/types.wit", WIT.to_string(), false),
        (".gitignore", "*.wasm\nnode_modules/\n".to_string(), false),
        (
            "package.json",
            include_str!("../../templates/js/package.json").to_string(),
            false,
        ),
        (
            "build.sh",
            include_str!("../../templates/js/build.sh").to_string(),
            true,
        ),
        (
            "test.sh",
            include_str!("../../templates/js/test.sh").to_string(),
            true,
        ),
    ];
    // Right after the SDK's own modules (`weir/index.js`, `weir/core.js`).
    files.splice(3..3, modules);
    files
}

fn rust(world: World) -> Vec<File> {
    let scaffold = &world.spec().scaffold;
    let lib = [scaffold.rust, scaffold.rust_test].concat();
    vec![
        ("src/lib.rs", lib, false),
        (
            "Cargo.toml",
            include_str!("../../templates/rust/Cargo.toml").to_string(),
            false,
        ),
        // weir's own lock file: the same crate versions as weir's plugins,
        // so that a machine that built weir builds this offline.
        (
            "Cargo.lock",
            include_str!("../../../plugins/Cargo.lock").to_string(),
            false,
        ),
        (".gitignore", "/target\n*.wasm\n".to_string(), false),
        (
            "build.sh",
            include_str!("../../templates/rust/build.sh").to_string(),
            true,
        ),
        (
            "test.sh",
            include_str!("../../templates/rust/test.sh").to_string(),
            true,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_only() {
        assert!(check_name("enrich-orders_2").is_ok());
        for bad in ["", "Enrich", "2fast", "a b", "../x", "é"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn no_placeholder_is_left_in_any_project() {
        for lang in [Lang::Rust, Lang::Python, Lang::Js] {
            for world in World::all() {
                let args = NewArgs {
                    name: "p".into(),
                    world,
                    lang,
                    dir: None,
                    sdk: None,
                };
                for (path, text, _) in args.files().expect("files") {
                    assert!(!text.contains("{{"), "{path} keeps a placeholder");
                }
            }
        }
    }
}
