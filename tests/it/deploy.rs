//! The deployment recipes in `examples/deploy/` work as written: the
//! systemd unit passes `systemd-analyze verify` (with the unit's own
//! arguments accepted by `weir run`), and `examples/deploy/run.sh` builds
//! the container image, runs it (non-root, read-only root filesystem),
//! delivers rows sent from outside it and stops it with SIGTERM, where
//! podman or docker works. Each is skipped, saying so, on a machine
//! without the tool.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{WEIR, free_port};

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

/// run.sh's exit code when no container engine works here.
const NO_ENGINE: i32 = 77;
/// A base image from Debian's mirror the first time, the plugins' build if
/// they are stale, the run itself: well within this on a busy 2-core box.
const DEPLOY_TIMEOUT: Duration = Duration::from_secs(900);

#[test]
fn the_container_image_runs_as_non_root_on_a_read_only_root_and_delivers_rows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (stdout, stderr) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = Command::new("bash")
        .arg(recipe("run.sh"))
        // This test's weir goes into the image: no release build.
        .env("WEIR_DEPLOY_BIN", WEIR)
        .env("WEIR_DEPLOY_PORT", free_port().to_string())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        // Its own group, so a timeout can stop the script and the engine
        // commands it runs (its trap then removes the container).
        .process_group(0)
        .spawn()
        .expect("bash runs");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for run.sh") {
            break Some(status);
        }
        if started.elapsed() > DEPLOY_TIMEOUT {
            let _ = Command::new("kill")
                .args(["-TERM", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let out = std::fs::read_to_string(&stdout).unwrap_or_default();
    let err = std::fs::read_to_string(&stderr).unwrap_or_default();
    let Some(status) = status else {
        panic!("run.sh did not finish in {DEPLOY_TIMEOUT:?}:\n{out}\n{err}");
    };
    if status.code() == Some(NO_ENGINE) {
        eprintln!("skipped: {}", err.trim());
        return;
    }
    eprintln!("{out}");
    assert!(status.success(), "run.sh: {status}\n{out}\n{err}");
    // Every row the validator passes is in the sink's file on the host,
    // and the stop was SIGTERM's, not a kill.
    for expected in [
        "the sink in the container wrote 36 rows",
        "summary: accepted 40, delivered 36, dead-lettered 4, backlog 0;",
        "delivered 36 of 40 rows (4 dead-lettered)",
        "SIGTERM stopped it cleanly",
    ] {
        assert!(
            out.contains(expected),
            "no {expected:?} in run.sh's output:\n{out}\n{err}"
        );
    }
    let uid = out
        .lines()
        .find_map(|line| line.strip_prefix("id: uid="))
        .expect("run.sh shows `id` from inside");
    assert!(!uid.starts_with("0("), "the container runs as root: {uid}");
    assert!(
        out.contains("touch /x: ") && out.contains("Read-only file system"),
        "no failed write to the root filesystem:\n{out}"
    );
}
