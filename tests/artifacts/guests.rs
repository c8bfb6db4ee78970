//! Building guest workspaces from a build script, shared by
//! `tests/artifacts` (the plugins tests load) and the peer bench (the
//! Extism guest): each guest workspace is built by a child cargo into
//! `plugins/target`, and each `.wasm` path is written as a constant.
//!
//! The child cargo gets its own target dir (`plugins/target`), so it never
//! waits on the outer build's lock, and a cleared environment, so none of the
//! outer build's settings (RUSTFLAGS, target, profile, cfgs, jobserver...)
//! leak into the guest build.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Variables passed through to the child cargo: where the toolchain and the
/// registry cache are, and how to reach the registry. Nothing else.
const PASSED: &[&str] = &[
    "PATH",
    "HOME",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "RUSTUP_AUTO_INSTALL",
    "TERM",
    "CARGO_NET_OFFLINE",
    "CARGO_NET_RETRY",
    "CARGO_HTTP_CAINFO",
    "CARGO_HTTP_PROXY",
    "CARGO_HTTP_TIMEOUT",
    "CARGO_REGISTRIES_CRATES_IO_PROTOCOL",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
];

/// One guest workspace to build: its manifest (relative to the repository
/// root), its target, and `(const name, file name)` of each `.wasm` it makes.
pub struct Guests {
    pub manifest: &'static str,
    pub target: &'static str,
    pub files: &'static [(&'static str, &'static str)],
}

/// Builds each guest workspace and writes `$OUT_DIR/<out_file>` with a
/// constant per `.wasm` path; `repo` is the repository root.
pub fn build_all(repo: &Path, guests: &[Guests], out_file: &str) {
    let plugins = repo.join("plugins");
    let target_dir = plugins.join("target");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));

    println!("cargo:rerun-if-changed={}", repo.join("wit").display());
    rerun_if_changed_under(&plugins);

    let mut consts = String::new();
    for guest in guests {
        build(&repo.join(guest.manifest), guest.target, &target_dir);
        let release = target_dir.join(guest.target).join("release");
        for (name, file) in guest.files {
            let path = release.join(file);
            assert!(
                path.is_file(),
                "the plugins built but {} is missing",
                path.display()
            );
            let path = path.to_str().expect("the repository path is UTF-8");
            consts.push_str(&format!(
                "/// Absolute path of `{file}`.\npub const {name}: &str = {path:?};\n"
            ));
        }
    }
    fs::write(out_dir.join(out_file), consts).expect("write the plugin paths to $OUT_DIR");
}

/// `cargo build --release` of one guest workspace for `target`.
fn build(manifest: &Path, target: &str, target_dir: &Path) {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(&cargo);
    command
        .env_clear()
        .envs(
            PASSED
                .iter()
                .filter_map(|name| Some((name, env::var_os(name)?))),
        )
        .current_dir(manifest.parent().expect("a manifest has a folder"))
        .args(["build", "--release", "--target", target, "--manifest-path"])
        .arg(manifest)
        .arg("--target-dir")
        .arg(target_dir);
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", Path::new(&cargo).display()));
    if !output.status.success() {
        panic!(
            "building the plugins failed ({status}): {command:?}\n\
             --- stdout ---\n{stdout}\n--- stderr ---\n{stderr}\n\
             hint: is the target installed? `rustup target add {target}`",
            status = output.status,
            stdout = String::from_utf8_lossy(&output.stdout),
            stderr = String::from_utf8_lossy(&output.stderr),
        );
    }
}

/// Emits `rerun-if-changed` for each entry of `dir` but `target`. Cargo
/// scans a listed directory whole, so a directory that holds (or will hold)
/// a `target` is never listed itself, or every guest build would make the
/// next outer build rerun this script.
fn rerun_if_changed_under(dir: &Path) {
    let entries = fs::read_dir(dir)
        .and_then(|entries| entries.collect::<Result<Vec<_>, _>>())
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.path();
        if entry.file_name() == "target" {
            continue;
        }
        if path.is_dir() && path.join("target").exists() {
            rerun_if_changed_under(&path);
        } else {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
