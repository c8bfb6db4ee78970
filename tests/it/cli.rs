//! The `weir` binary: exits cleanly on SIGTERM taking its embedded
//! nats-server with it, and refuses bad configs with file:line:col.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use weir::config::{Config, Overrides};
use weir::host::{RunningHost, StartError};

use crate::support::{ACME_KEY, base_config, eventually, free_port, plugins_dir};

const WEIR: &str = env!("CARGO_BIN_EXE_weir");

/// Child processes of `pid` (Linux /proc).
fn children(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
                found.extend(
                    text.split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                );
            }
        }
    }
    found
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.contains(") Z "))
        .unwrap_or(false)
}

/// The base config with the embedded default (no [nats] url) on `port`.
fn embedded_config(dir: &Path, port: u16) -> std::path::PathBuf {
    let text = base_config("REMOVED", "")
        .replace(
            "[nats]\nurl = \"REMOVED\"\n",
            "[nats]\nsync = \"periodic\"\n",
        )
        .replace(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{port}\""),
        );
    let path = dir.join("weir.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `weir run` (as `command` starts it) on the embedded default in `dir`,
/// once its front door is ready; and the front door's base URL.
async fn run_embedded(dir: &Path, mut command: Command) -> (Child, String) {
    let port = free_port();
    let config = embedded_config(dir, port);
    let weir = command
        .args(["run", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    eventually(Duration::from_secs(60), "weir to be ready", || async {
        let ready = http.get(format!("{base}/readyz")).send().await.ok()?;
        ready.status().is_success().then_some(())
    })
    .await;
    (weir, base)
}

/// How `weir` exited after `signal`, within 30 s.
async fn exit_of(weir: &mut Child, signal: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = weir.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "weir did not exit after {signal}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_weir_cleanly_and_its_embedded_nats_server_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut weir, base) = run_embedded(dir.path(), Command::new(WEIR)).await;
    let http = reqwest::Client::new();
    let servers = children(weir.id());
    assert_eq!(
        servers.len(),
        1,
        "weir runs one nats-server child: {servers:?}"
    );

    // Rows flow through the embedded server too.
    let response = http
        .post(format!("{base}/v1/ingest/orders"))
        .bearer_auth(ACME_KEY)
        .body("{\"id\":7}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    eventually(Duration::from_secs(20), "the row in the sink", || async {
        std::fs::read_to_string(dir.path().join("out/acme/orders.ndjson"))
            .ok()
            .filter(|t| t == "{\"id\":7}\n")
    })
    .await;

    // SAFETY: signalling our own child.
    unsafe { libc::kill(weir.id() as libc::pid_t, libc::SIGTERM) };
    let status = exit_of(&mut weir, "SIGTERM").await;
    let mut log = String::new();
    std::io::Read::read_to_string(&mut weir.stderr.take().unwrap(), &mut log).unwrap();
    assert!(status.success(), "clean exit: {status:?}\n{log}");
    assert!(!alive(servers[0]), "the embedded nats-server is gone");
    let warnings: Vec<&str> = log.lines().filter(|line| line.contains("WARN")).collect();
    assert!(warnings.is_empty(), "a clean stop warns of nothing:\n{log}");
}

/// The process group of `pid` (field 5 of /proc/<pid>/stat).
fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count from its `)`.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(2)?.parse().ok()
}

/// Ctrl-C in a terminal signals the whole foreground process group. The
/// embedded server must not get it: it has to outlive weir's handover.
#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_in_a_terminal_stops_weir_before_its_embedded_nats_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut job = Command::new(WEIR);
    // A job of its own, as a shell starts a foreground command.
    std::os::unix::process::CommandExt::process_group(&mut job, 0);
    let (mut weir, _) = run_embedded(dir.path(), job).await;
    let servers = children(weir.id());
    assert_eq!(servers.len(), 1, "one nats-server child: {servers:?}");
    assert_ne!(
        process_group(servers[0]),
        Some(weir.id()),
        "the embedded server is in weir's process group: Ctrl-C would stop it first"
    );

    // SAFETY: signalling the group of our own child, as a terminal does.
    unsafe { libc::kill(-(weir.id() as libc::pid_t), libc::SIGINT) };
    let status = exit_of(&mut weir, "Ctrl-C").await;
    let mut log = String::new();
    std::io::Read::read_to_string(&mut weir.stderr.take().unwrap(), &mut log).unwrap();
    assert!(status.success(), "clean exit: {status:?}\n{log}");
    assert!(
        !log.contains("not handed over in time"),
        "units were handed over before the server stopped:\n{log}"
    );
    assert!(!alive(servers[0]), "the embedded nats-server is gone");
}

/// Two hosts on one data dir would run two nats-servers on one store under
/// one member id: the second is refused, naming the dir, until the first
/// has stopped.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_host_on_the_same_data_dir_is_refused_until_the_first_stops() {
    let dir = tempfile::tempdir().unwrap();
    let config = embedded_config(dir.path(), free_port());
    let load = || Config::load(&config, &Overrides::default()).unwrap();
    let first = RunningHost::start(load())
        .await
        .expect("the first host starts");

    let second = RunningHost::start(load()).await;
    let Err(err) = second else {
        panic!("a second host started on the same data dir");
    };
    assert!(
        matches!(&err, StartError::DataDirInUse { holder, .. } if *holder == std::process::id().to_string()),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(&dir.path().join("data").display().to_string()),
        "{err}"
    );

    first.shutdown().await;
    let again = RunningHost::start(load())
        .await
        .expect("starts once the first has stopped");
    again.shutdown().await;
}

#[test]
fn an_invalid_config_exits_non_zero_naming_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(
        &path,
        "listen = \"127.0.0.1:0\"\n[delivery]\nbatch_rows = \"many\"\n",
    )
    .unwrap();
    let output = Command::new(WEIR)
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:3:14: invalid type: string \"many\", expected usize",
            path.display()
        )),
        "{stderr}"
    );
}

#[test]
fn a_missing_wasm_is_named_by_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    let text =
        base_config("nats://127.0.0.1:1", "").replace("weir_validator.wasm", "weir_nothing.wasm");
    std::fs::write(&path, text).unwrap();
    let output = Command::new(WEIR)
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let expected = format!(
        "plugin `validate`: wasm file {} does not exist",
        plugins_dir().join("weir_nothing.wasm").display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(stderr.contains(&format!("{}:", path.display())), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn weir_send_posts_a_file_in_chunks_and_names_the_file_line_it_was_refused_at() {
    let nats = crate::support::Nats::start();
    let host = crate::support::TestHost::start(&base_config(nats.url(), "")).await;
    let file = host.dir.path().join("rows.ndjson");
    let send = |file: &Path| {
        Command::new(WEIR)
            .args([
                "send",
                "--table",
                "orders",
                "--chunk-rows",
                "1000",
                "--key",
                ACME_KEY,
                "--url",
            ])
            .arg(host.url(""))
            .arg(file)
            .output()
            .unwrap()
    };

    std::fs::write(&file, crate::support::orders(0, 2500)).unwrap();
    let output = tokio::task::block_in_place(|| send(&file));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.starts_with("2500 rows accepted, 0 duplicates, in "),
        "{stdout}"
    );

    let mut text = crate::support::orders(10_000, 2500);
    text.push_str("{\"id\": broken\n");
    std::fs::write(&file, text).unwrap();
    let output = tokio::task::block_in_place(|| send(&file));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:2501: refused (400): invalid JSON",
            file.display()
        )),
        "{stderr}"
    );
    // The rest of the file still went: only the refused chunk is missing.
    assert!(stderr.contains("lines 2001-2501 not stored"), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.starts_with(
            "2000 rows accepted, 0 duplicates, 1 chunk refused (501 rows not stored), in "
        ),
        "{stdout}"
    );
    host.shutdown().await;
}

/// `weir check` runs every check `weir run` does before it connects: a
/// plugin configured for the wrong world, or a file that is not
/// WebAssembly, fails the check, naming the plugin.
#[test]
fn weir_check_compiles_and_links_every_plugin_against_its_world() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    let check = |text: String| {
        std::fs::write(&path, text).unwrap();
        Command::new(WEIR)
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .unwrap()
    };
    let valid = check(base_config("nats://127.0.0.1:1", ""));
    assert!(
        valid.status.success(),
        "{}",
        String::from_utf8_lossy(&valid.stderr)
    );

    let sink_as_transform = check(base_config("nats://127.0.0.1:1", "").replace(
        "wasm = \"weir_validator.wasm\"",
        "wasm = \"weir_ndjson_sink.wasm\"",
    ));
    let stderr = String::from_utf8_lossy(&sink_as_transform.stderr);
    assert!(!sink_as_transform.status.success(), "{stderr}");
    assert!(stderr.contains("validate"), "{stderr}");
    assert!(stderr.contains("transform"), "{stderr}");
    // At the plugin's `world` key.
    let world = at(&path, "world = \"transform\"", 8);
    assert!(
        stderr.contains(&format!("{world}: plugin `validate`")),
        "not at {world}:\n{stderr}"
    );

    // A grant's missing directory, at the grant's `host`.
    let missing_dir = check(base_config("nats://127.0.0.1:1", "").replace(
        "grants.dirs = [{ host = \"out\", guest = \"/out\", writable = true }]",
        "grants.dirs = [{ host = \"does-not-exist\", guest = \"/out\" }]",
    ));
    let stderr = String::from_utf8_lossy(&missing_dir.stderr);
    assert!(!missing_dir.status.success(), "{stderr}");
    let host = at(&path, "\"does-not-exist\"", 0);
    assert!(
        stderr.contains(&format!("{host}: plugin `files`: grant of")),
        "not at {host}:\n{stderr}"
    );

    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(
        plugins_dir().join("weir_ndjson_sink.wasm"),
        plugins.join("weir_ndjson_sink.wasm"),
    )
    .unwrap();
    std::fs::write(plugins.join("weir_validator.wasm"), b"not webassembly").unwrap();
    let not_wasm = check(base_config("nats://127.0.0.1:1", "").replace(
        &plugins_dir().display().to_string(),
        &plugins.display().to_string(),
    ));
    let stderr = String::from_utf8_lossy(&not_wasm.stderr);
    assert!(!not_wasm.status.success(), "{stderr}");
    // At the plugin's `wasm` key.
    let wasm = at(&path, "\"weir_validator.wasm\"", 0);
    assert!(
        stderr.contains(&format!("{wasm}: plugin `validate`")),
        "not at {wasm}:\n{stderr}"
    );
    assert!(
        stderr.contains("not a valid WebAssembly component"),
        "{stderr}"
    );
}

/// `path:line:col` of the first line of the file at `path` holding
/// `needle`, at `skip` characters into it.
fn at(path: &Path, needle: &str, skip: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let (number, line) = text
        .lines()
        .enumerate()
        .find(|(_, line)| line.contains(needle))
        .unwrap_or_else(|| panic!("`{needle}` is not in the config"));
    let column = line[..line.find(needle).unwrap_or(0)].chars().count() + skip + 1;
    format!("{}:{}:{column}", path.display(), number + 1)
}

/// `weir run` with two plugins that cannot run names both, each at its
/// line, as `weir check` does, and exits 5.
#[tokio::test(flavor = "multi_thread")]
async fn weir_run_names_every_plugin_that_cannot_run_at_its_line() {
    let nats = crate::support::Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    let text = base_config(nats.url(), "")
        .replace(
            "wasm = \"weir_validator.wasm\"",
            "wasm = \"weir_ndjson_sink.wasm\"",
        )
        .replace(
            "wasm = \"weir_ndjson_sink.wasm\"\nworld = \"sink\"",
            &format!("wasm = \"{}\"\nworld = \"sink\"", path.display()),
        );
    std::fs::write(&path, text).unwrap();
    let output = tokio::task::spawn_blocking({
        let path = path.clone();
        move || {
            Command::new(WEIR)
                .args(["run", "--config"])
                .arg(&path)
                .current_dir(path.parent().unwrap())
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(5), "{stderr}");
    let world = at(&path, "world = \"transform\"", 8);
    let wasm = at(&path, &format!("wasm = \"{}", path.display()), 7);
    for (position, what) in [
        (world, "plugin `validate`"),
        (wasm, "not a valid WebAssembly component"),
    ] {
        assert!(
            stderr
                .lines()
                .any(|line| line.starts_with(&format!("{position}: ")) && line.contains(what)),
            "no `{what}` at {position}:\n{stderr}"
        );
    }
    assert!(stderr.contains("2 of 2 plugins cannot run"), "{stderr}");
}

/// A file with four mistakes — a bad duration, an unknown key, a bad size,
/// an unknown plugin — and an unknown world: one `weir check` names all
/// five, each at its position, and nothing else.
#[test]
fn weir_check_reports_every_mistake_of_a_file_in_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    let text = base_config("nats://127.0.0.1:1", "")
        .replace("max_body_bytes = 1048576", "max_body_bytes = \"a lot\"")
        .replace(
            "batch_wait_ms = 5\n",
            "batch_wait = \"soon\"\nbatch_rowz = 100\n",
        )
        .replace("world = \"sink\"", "world = \"sinkk\"")
        .replace("transforms = [\"validate\"]", "transforms = [\"ghost\"]");
    std::fs::write(&path, text).unwrap();
    let output = Command::new(WEIR)
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stderr}");
    assert!(!output.status.success(), "{stderr}");
    for (needle, skip, what) in [
        ("max_body_bytes = ", 17, "`a lot` is not a size"),
        ("batch_wait = ", 13, "`soon` is not a duration"),
        ("batch_rowz", 0, "unknown field `batch_rowz`"),
        ("world = \"sinkk\"", 8, "unknown world `sinkk`"),
        ("transforms = [\"ghost\"]", 14, "unknown plugin `ghost`"),
    ] {
        let position = at(&path, needle, skip);
        assert!(
            stderr
                .lines()
                .any(|line| line.starts_with(&format!("{position}: ")) && line.contains(what)),
            "no `{what}` at {position}:\n{stderr}"
        );
    }
    let problems = stderr
        .lines()
        .filter(|line| line.starts_with(&path.display().to_string()))
        .count();
    assert_eq!(problems, 5, "one line per problem:\n{stderr}");
}

/// The embedded nats-server lets in only weir: a client without the
/// password generated at start is refused (no forged rows, no plugin
/// pushes from other local users); the URL with it is left in the data
/// dir, readable by weir's user only, for operator commands.
#[tokio::test(flavor = "multi_thread")]
async fn the_embedded_server_refuses_clients_without_weirs_generated_password() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (mut weir, _) = run_embedded(dir.path(), Command::new(WEIR)).await;
    let url_file = weir::host::embedded_url_file(&dir.path().join("data"));
    let mode = std::fs::metadata(&url_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", url_file.display());
    let conf = dir.path().join("data/nats/nats-server.conf");
    let mode = std::fs::metadata(&conf).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", conf.display());

    let url = std::fs::read_to_string(&url_file).unwrap();
    let (_, address) = url
        .rsplit_once('@')
        .expect("the URL carries the credentials");
    let anonymous = tokio::time::timeout(
        Duration::from_secs(10),
        async_nats::connect(format!("nats://{address}")),
    )
    .await;
    assert!(
        !matches!(anonymous, Ok(Ok(_))),
        "a client without credentials got in"
    );
    let login = |password: String| {
        let address = address.to_string();
        async move {
            tokio::time::timeout(
                Duration::from_secs(10),
                async_nats::ConnectOptions::with_user_and_password("weir".into(), password)
                    .connect(address),
            )
            .await
        }
    };
    assert!(
        !matches!(login("guessed".into()).await, Ok(Ok(_))),
        "a wrong password got in"
    );
    let password = url
        .strip_prefix("nats://weir:")
        .and_then(|rest| rest.split_once('@'))
        .map(|(password, _)| password.to_string())
        .unwrap();
    assert!(
        matches!(login(password).await, Ok(Ok(_))),
        "weir's own password gets in"
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(weir.id() as libc::pid_t, libc::SIGTERM) };
    assert!(exit_of(&mut weir, "SIGTERM").await.success());
}

/// A password in the NATS URL never reaches the log: the start line shows
/// the URL redacted.
#[tokio::test(flavor = "multi_thread")]
async fn a_nats_password_never_reaches_the_log() {
    let nats =
        crate::support::Nats::start_with("authorization { user: weir, password: hunter2-pw }");
    let url = nats.url().replace("nats://", "nats://weir:hunter2-pw@");
    let host = crate::support::Host::spawn_with("secret", base_config(&url, ""));
    let log = eventually(Duration::from_secs(60), "weir running", || async {
        let log = host.log();
        log.contains("weir is running").then_some(log)
    })
    .await;
    assert!(!log.contains("hunter2-pw"), "{log}");
    assert!(log.contains("weir:***@"), "{log}");
}
