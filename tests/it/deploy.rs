//! The deployment recipes in `examples/deploy/` work as written: the
//! systemd unit passes `systemd-analyze verify` (with the unit's own
//! arguments accepted by `weir run`), and the container image builds and
//! runs `weir` where a docker daemon answers. Each is skipped, saying so,
//! on a machine without the tool.

use std::path::Path;
use std::process::Command;

use crate::support::WEIR;

fn recipe(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/deploy")
        .join(name)
}

#[test]
fn the_systemd_unit_verifies_and_its_command_line_is_weirs() {
    let unit = std::fs::read_to_string(recipe("weir.service")).expect("read the unit");
    let exec = unit
        .lines()
        .find_map(|line| line.strip_prefix("ExecStart="))
        .expect("the unit has an ExecStart");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/weir"), "{exec}");
    let args: Vec<&str> = words.collect();
    // The unit's own arguments, with a config that is not there: weir says
    // it cannot read it (exit 3), not that the command line is wrong (2).
    let mut run = Command::new(WEIR);
    for arg in &args {
        run.arg(arg.replace("/etc/weir/weir.toml", "/nonexistent/weir.toml"));
    }
    let output = run.output().expect("weir runs");
    assert_eq!(
        output.status.code(),
        Some(3),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );

    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: no systemd-analyze on this machine");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("weir.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/weir", WEIR)).expect("write the unit");
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Unknown keys are only warnings: any message is a failure here.
    assert!(
        output.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {stderr}"
    );
}

#[test]
fn the_container_image_builds_and_runs_weir_where_docker_answers() {
    let docker_answers = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !docker_answers {
        eprintln!("skipped: no docker daemon answers on this machine");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tag = "weir-deploy-test";
    let build = Command::new("docker")
        .args(["build", "-f"])
        .arg(recipe("Containerfile"))
        .args(["-t", tag])
        .arg(&root)
        .output()
        .expect("docker build runs");
    assert!(
        build.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&build.stderr)
    );
    let version = Command::new("docker")
        .args(["run", "--rm", tag, "--version"])
        .output()
        .expect("docker run runs");
    assert!(
        String::from_utf8_lossy(&version.stdout).starts_with("weir "),
        "{}",
        String::from_utf8_lossy(&version.stderr)
    );
}
