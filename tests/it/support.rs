//! Shared test helpers: a nats-server guard, a host started in-process from
//! a TOML written to a temp dir, and small waiting and reading helpers.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use weir::config::{Config, Overrides, SyncPolicy};
use weir::host::RunningHost;
use weir::nats::{EmbeddedNats, EmbeddedOptions};
use weir::ops::StatusReport;
use weir::topology::{Names, Unit};

/// The `weir` binary, for tests that run real processes.
pub const WEIR: &str = env!("CARGO_BIN_EXE_weir");

/// An API key of the test tenant `acme`.
pub const ACME_KEY: &str = "acme-key-123";

/// A nats-server of the test's own, stopped and its data removed on drop.
pub struct Nats {
    pub server: EmbeddedNats,
    _dir: tempfile::TempDir,
}

impl Nats {
    pub fn start() -> Nats {
        Nats::start_with("")
    }

    /// A server with more configuration (accounts, users…).
    pub fn start_with(extra_config: &str) -> Nats {
        let dir = tempfile::tempdir().expect("temp dir");
        let server = EmbeddedNats::start(&EmbeddedOptions {
            binary: None,
            data_dir: dir.path().to_path_buf(),
            // Tests need speed, not power-loss durability.
            sync: SyncPolicy::Periodic,
            port: None,
            extra_config: extra_config.to_string(),
            password: None,
        })
        .expect("nats-server >= 2.14 must be installed (bash .ci/setup does it)");
        Nats { server, _dir: dir }
    }

    pub fn url(&self) -> &str {
        self.server.url()
    }

    pub async fn client(&self) -> async_nats::Client {
        async_nats::connect(self.url())
            .await
            .expect("connect to test nats")
    }
}

/// A JetStream context that waits 30 s for an answer: an R3 stream's
/// creation on a busy machine can take longer than the client's default 5 s.
pub fn patient_jetstream(client: async_nats::Client) -> jetstream::Context {
    let mut js = jetstream::new(client);
    js.set_timeout(Duration::from_secs(30));
    js
}

/// A loopback port nobody listens on (for a process that binds it itself).
pub fn free_port() -> u16 {
    // Once its probe closes, a port can be handed to the next caller too:
    // the tests share one process, so none gets a port another was given.
    static HANDED_OUT: std::sync::Mutex<BTreeSet<u16>> = std::sync::Mutex::new(BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port")
            .port();
        if HANDED_OUT.lock().unwrap().insert(port) {
            return port;
        }
    }
}

/// The folder holding the built test plugins.
pub fn plugins_dir() -> PathBuf {
    Path::new(weir_test_artifacts::VALIDATOR)
        .parent()
        .expect("plugin path has a folder")
        .to_path_buf()
}

/// The config every test starts from: tenant `acme`, table `orders` through
/// the validator (requires `id`, masks `email`) into the NDJSON file sink.
/// `extra` is appended (more plugins and pipelines).
pub fn base_config(nats_url: &str, extra: &str) -> String {
    format!(
        r#"
listen = "127.0.0.1:0"
data_dir = "data"
compile_cache_dir = "{cache}"
plugins_dir = "{plugins}"
max_body_bytes = 1048576

[nats]
url = "{nats_url}"

[stream]
create = true

[delivery]
batch_wait_ms = 5
failure_delay_ms = 100
max_deliveries = 3

[[tenants]]
name = "acme"
api_keys = ["{ACME_KEY}"]

[plugins.validate]
wasm = "weir_validator.wasm"
world = "transform"
settings = {{ required = ["id"], mask = ["email"] }}

[plugins.files]
wasm = "weir_ndjson_sink.wasm"
world = "sink"
grants.dirs = [{{ host = "out", guest = "/out", writable = true }}]

[[pipelines]]
tables = ["orders"]
transforms = ["validate"]
sink = "files"
{extra}
"#,
        plugins = plugins_dir().display(),
        cache = compile_cache_dir().display(),
    )
}

/// The compiled cache the tests share: under `target/`, never the
/// user's own (`~/.cache/weir`), and warm across test runs.
pub fn compile_cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("compiled")
}

/// A plugin as a team built it for `weir:plugin@0.2.0`, the previous world
/// version (kept compressed in `tests/artifacts/served/0.2.0/`, whose
/// README says how each was built): `name` is `transform-LANG` (the
/// scaffold), `sink-rust` (the file sink), `budget-rust` or `router-rust`
/// (the policies). Unpacked once per run, under `target/`.
pub fn built_for_0_2_0(name: &str) -> PathBuf {
    static UNPACKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let wasm = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("served-0.2.0")
        .join(format!("{name}.wasm"));
    let _one_at_a_time = UNPACKING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if !wasm.is_file() {
        let packed = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/artifacts/served/0.2.0")
            .join(format!("{name}.wasm.zst"));
        let file =
            std::fs::File::open(&packed).unwrap_or_else(|e| panic!("{}: {e}", packed.display()));
        let bytes = zstd::decode_all(file).expect("a zstd stream");
        std::fs::create_dir_all(wasm.parent().expect("a folder")).expect("create the folder");
        let part = wasm.with_extension("part");
        std::fs::write(&part, bytes).expect("write the component");
        std::fs::rename(&part, &wasm).expect("move the component in place");
    }
    wasm
}

/// A host running in this process, with its own temp dir.
pub struct TestHost {
    pub host: RunningHost,
    pub dir: tempfile::TempDir,
    pub http: reqwest::Client,
}

impl TestHost {
    pub async fn start(config_text: &str) -> TestHost {
        // Logs only when asked for: WEIR_LOG=debug cargo test …
        if std::env::var_os("WEIR_LOG").is_some() {
            weir::telemetry::init_logging();
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("weir.toml");
        std::fs::write(&path, config_text).expect("write config");
        let config = Config::load(&path, &Overrides::default()).expect("valid config");
        let host = RunningHost::start(config).await.expect("host starts");
        TestHost {
            host,
            dir,
            http: reqwest::Client::new(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.host.http_addr())
    }

    /// The body of `GET path`, unauthenticated.
    pub async fn get_text(&self, path: &str) -> String {
        let response = self.http.get(self.url(path)).send().await;
        let response = response.unwrap_or_else(|err| panic!("GET {path}: {err}"));
        response.text().await.expect("a text body")
    }

    /// POSTs an NDJSON body to `/v1/ingest/{table}` as tenant `acme`.
    pub async fn ingest(&self, table: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.http
            .post(self.url(&format!("/v1/ingest/{table}")))
            .bearer_auth(ACME_KEY)
            .body(body)
            .send()
            .await
            .expect("front door answers")
    }

    /// The lines the file sink wrote for `acme`/`table`; a last line still
    /// being written (no newline yet) is left for the next read.
    pub fn sink_lines(&self, table: &str) -> Vec<String> {
        let path = self
            .dir
            .path()
            .join("out")
            .join("acme")
            .join(format!("{table}.ndjson"));
        std::fs::read_to_string(path)
            .map(|text| {
                text.split_inclusive('\n')
                    .filter_map(|line| line.strip_suffix('\n'))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The `id` of each row in the sink file of `table`, in file order.
    pub fn sink_ids(&self, table: &str) -> Vec<u64> {
        self.sink_lines(table)
            .iter()
            .map(|line| {
                serde_json::from_str::<serde_json::Value>(line).unwrap()["id"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    }

    /// The TOML the host was started from (operator commands read it too).
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("weir.toml")
    }

    /// The version `/v1/status` reports for plugin `name`.
    pub async fn running_version(&self, name: &str) -> Option<String> {
        let report = self.host.status().report().await;
        report
            .plugins
            .into_iter()
            .find(|plugin| plugin.name == name)
            .map(|plugin| plugin.version)
    }

    pub async fn shutdown(self) {
        self.host.shutdown().await;
    }
}

/// Waits until every host's status shows plugin `name` at `version` (any
/// version when `None`) with a canary or shadow running, or without.
pub async fn every_host_runs(
    hosts: &[&TestHost],
    what: &str,
    (name, version): (&str, Option<&str>),
    canary_running: bool,
) {
    for host in hosts {
        eventually(Duration::from_secs(10), what, || async {
            let report = host.host.status().report().await;
            report
                .plugins
                .iter()
                .any(|p| {
                    p.name == name
                        && version.is_none_or(|v| p.version == v)
                        && p.canary.is_some() == canary_running
                })
                .then_some(())
        })
        .await;
    }
}

/// Runs the operator command `weir GROUP COMMAND --config CONFIG ARGS…`
/// (e.g. `["plugin", "push"]`) to its end, whatever its exit status.
pub fn operator(config: &Path, command: [&str; 2], args: &[&str]) -> std::process::Output {
    Command::new(WEIR)
        .args(command)
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .expect("weir runs")
}

/// Polls `check` until it returns `Some`, or panics after `timeout` with `what`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every message stored in `stream` (read with a throwaway consumer).
pub async fn read_stream(
    client: &async_nats::Client,
    stream: &str,
) -> Vec<async_nats::jetstream::Message> {
    let js = jetstream::new(client.clone());
    let stream = js.get_stream(stream).await.expect("stream exists");
    let count = stream.get_info().await.expect("stream info").state.messages as usize;
    if count == 0 {
        return Vec::new();
    }
    let reader = stream
        .create_consumer(consumer::pull::Config {
            ack_policy: consumer::AckPolicy::None,
            deliver_policy: consumer::DeliverPolicy::All,
            inactive_threshold: Duration::from_secs(5),
            ..Default::default()
        })
        .await
        .expect("reader consumer");
    let mut messages = reader
        .fetch()
        .max_messages(count)
        .expires(Duration::from_secs(2))
        .messages()
        .await
        .expect("fetch");
    let mut found = Vec::new();
    while let Some(message) = messages.next().await {
        found.push(message.expect("message"));
    }
    found
}

/// Every partition stream (`weir_in_*`) of the server.
pub async fn partition_streams(client: &async_nats::Client) -> Vec<jetstream::stream::Stream> {
    let js = jetstream::new(client.clone());
    let mut names: Vec<String> = js
        .stream_names()
        .map(|name| name.expect("stream name"))
        .collect()
        .await;
    names.retain(|name| name.starts_with("weir_in_"));
    names.sort();
    let mut streams = Vec::new();
    for name in names {
        streams.push(js.get_stream(&name).await.expect("partition stream"));
    }
    streams
}

/// Every unit consumer's info, over every partition stream.
pub async fn unit_consumers(client: &async_nats::Client) -> Vec<jetstream::consumer::Info> {
    let mut found = Vec::new();
    for stream in partition_streams(client).await {
        let mut consumers = stream.consumers();
        while let Some(info) = consumers.next().await {
            found.push(info.expect("consumer info"));
        }
    }
    found
}

/// (undelivered, unacked, stored) rows summed over every unit of every
/// partition stream.
pub async fn backlog(client: &async_nats::Client) -> (u64, usize, u64) {
    let (mut pending, mut ack_pending) = (0, 0);
    for info in unit_consumers(client).await {
        pending += info.num_pending;
        ack_pending += info.num_ack_pending;
    }
    (pending, ack_pending, stored_rows(client).await)
}

/// Rows stored in every partition stream.
pub async fn stored_rows(client: &async_nats::Client) -> u64 {
    let mut stored = 0;
    for mut stream in partition_streams(client).await {
        stored += stream.info().await.expect("stream info").state.messages;
    }
    stored
}

/// The `Weir-Reason` of the first `count` dead letters, once there are that many.
pub async fn dead_letter_reasons(nats: &Nats, count: usize) -> Vec<String> {
    let client = nats.client().await;
    eventually(Duration::from_secs(30), "dead letters", || async {
        let letters = read_stream(&client, "weir_dlq").await;
        (letters.len() >= count).then(|| {
            letters
                .iter()
                .map(|letter| {
                    letter
                        .headers
                        .as_ref()
                        .and_then(|h| h.get(weir::delivery::headers::REASON))
                        .map(|v| v.to_string())
                        .unwrap_or_default()
                })
                .collect()
        })
    })
    .await
}

/// Why a host refuses to start with `config_text` (panics if it starts).
pub async fn start_error(config_text: &str) -> weir::host::StartError {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, config_text).expect("write config");
    let config = Config::load(&path, &Overrides::default()).expect("valid config");
    match RunningHost::start(config).await {
        Ok(host) => {
            host.shutdown().await;
            panic!("the host started");
        }
        Err(err) => err,
    }
}

/// NDJSON of `count` valid order rows with ids `start..start+count`.
pub fn orders(start: usize, count: usize) -> String {
    (start..start + count)
        .map(|id| {
            format!(
                "{{\"id\":{id},\"email\":\"user{id}@example.com\",\"amount\":{}}}\n",
                id % 97
            )
        })
        .collect()
}

impl Nats {
    /// Stops the server, waits `downtime`, then starts a new one on the same
    /// port with the same storage (not `start_with`'s extra configuration):
    /// what clients see when a server restarts. Blocks: call it through
    /// `tokio::task::block_in_place`.
    pub fn restart(&mut self, downtime: Duration) {
        let port = self.server.port();
        self.server.stop();
        std::thread::sleep(downtime);
        self.server = EmbeddedNats::start(&EmbeddedOptions {
            binary: None,
            data_dir: self._dir.path().to_path_buf(),
            sync: SyncPolicy::Periodic,
            port: Some(port),
            extra_config: String::new(),
            password: None,
        })
        .expect("nats-server restarts on its port");
    }
}

/// One `weir run` process with its own directory (config, data, sink output).
pub struct Host {
    pub id: &'static str,
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub url: String,
}

impl Host {
    pub fn spawn_with(id: &'static str, config: String) -> Host {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("weir.toml"), config).unwrap();
        let (child, url) = Host::run(dir.path());
        Host {
            id,
            child,
            dir,
            url,
        }
    }

    /// Runs `weir` on the config in `dir`, on a fresh port.
    pub fn run(dir: &Path) -> (Child, String) {
        let path = dir.join("weir.toml");
        let port = free_port();
        let config = std::fs::read_to_string(&path).unwrap();
        let listen = config
            .lines()
            .find(|line| line.starts_with("listen = "))
            .unwrap()
            .to_string();
        let config = config.replace(&listen, &format!("listen = \"127.0.0.1:{port}\""));
        std::fs::write(&path, config).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("weir.log"))
            .unwrap();
        let child = Command::new(WEIR)
            .args(["run", "--config"])
            .arg(&path)
            // `WEIR_TEST_HOST_LOG` sets the hosts' filter, to look closer
            // at a failure (`weir::delivery=debug`, say).
            .env(
                "WEIR_LOG",
                std::env::var("WEIR_TEST_HOST_LOG").unwrap_or_else(|_| {
                    "info,weir::coordination=debug,weir::delivery::pull=debug,wasmtime=warn,cranelift=warn"
                        .to_string()
                }),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        (child, format!("http://127.0.0.1:{port}"))
    }

    /// SIGKILL, then the same host (directory, id, config) again at once.
    pub fn crash_and_restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.start_again();
    }

    /// Runs the host again from its directory (its config as it is there
    /// now), on a fresh port; the last process must have ended.
    pub fn start_again(&mut self) {
        let (child, url) = Host::run(self.dir.path());
        self.child = child;
        self.url = url;
    }

    pub async fn status(&self) -> Option<StatusReport> {
        weir::client::fetch_status(&self.url, None).await.ok()
    }

    /// The status as `key` (an admin or a tenant key) sees it.
    pub async fn status_as(&self, key: &str) -> Option<StatusReport> {
        weir::client::fetch_status(&self.url, Some(key)).await.ok()
    }

    pub fn output(&self, table: &str) -> PathBuf {
        output(self.dir.path(), table)
    }

    pub fn terminate(&self) {
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("weir.log")).unwrap_or_default()
    }

    /// The last `lines` lines of the log that warn, fail or compile, under
    /// the host's id: what a stalled host was doing, without its debug lines.
    pub fn notes(&self, lines: usize) -> String {
        let log = self.log();
        let noted: Vec<&str> = log
            .lines()
            .filter(|line| {
                line.contains(" WARN ") || line.contains(" ERROR ") || line.contains("compil")
            })
            .collect();
        let tail = &noted[noted.len().saturating_sub(lines)..];
        format!("--- {} ---\n{}", self.id, tail.join("\n"))
    }

    /// The last `lines` lines of the log, under the host's id.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("--- {} ---\n{}", self.id, tail.join("\n"))
    }

    /// Waits until the host answers its status, or says why not with its
    /// log. The port picked for it can be taken by another process before
    /// the host binds it (after connecting and compiling, seconds later):
    /// such a host is started again on another port.
    pub async fn wait_up(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let mut this_run = 0;
        loop {
            if self.status().await.is_some() {
                return Ok(());
            }
            if let Ok(Some(exit)) = self.child.try_wait() {
                let log = self.log();
                let said = log.get(this_run..).unwrap_or_default();
                if !(said.contains("cannot listen on") && said.contains("in use")) {
                    return Err(format!(
                        "{} exited ({exit}) before it was up\n{}",
                        self.id,
                        self.log_tail(30)
                    ));
                }
                eprintln!(
                    "{}'s port was taken before it bound it; starting it again on another port",
                    self.id
                );
                this_run = log.len();
                self.start_again();
                continue;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} is not up after {timeout:?}\n{}",
                    self.id,
                    self.log_tail(30)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The file the NDJSON sink writes for `acme`/`table` under `dir`.
pub fn output(dir: &Path, table: &str) -> PathBuf {
    dir.join("out").join("acme").join(format!("{table}.ndjson"))
}

// A fleet of `weir` processes over 4 × 8 units and 64 tables, rows posted
// by producers with per-table sequence numbers, and what their sinks wrote.

pub const PARTITIONS: u32 = 4;
pub const SHARDS: u32 = 8;
pub const TABLES: usize = 64;

/// The base config over 4 × 8 units and 64 tables, as member `id`
/// listening on `port` (0: any).
pub fn fleet_config(nats_url: &str, id: &str, port: u16, ttl_secs: u64) -> String {
    let tables: Vec<String> = (0..TABLES).map(|t| format!("\"t{t}\"")).collect();
    base_config(
        nats_url,
        &format!("\n[coordination]\nhost_id = \"{id}\"\nmember_ttl_secs = {ttl_secs}\n"),
    )
    .replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    )
    .replace(
        "[stream]\ncreate = true\n",
        &format!("[stream]\ncreate = true\npartitions = {PARTITIONS}\nshards = {SHARDS}\n"),
    )
    .replace(
        "tables = [\"orders\"]",
        &format!("tables = [{}]", tables.join(", ")),
    )
}

/// Waits until `observer` sees exactly `members` members holding every
/// unit, with loads differing by at most one; returns each member's units.
/// The bound is generous: two freshly spawned hosts on a CI machine that
/// is also running the rest of the suite once took over 40 s to get there.
pub async fn balanced(observer: &Host, members: &[&str]) -> BTreeMap<String, Vec<String>> {
    balanced_among(observer, members, &[observer]).await
}

/// [`balanced`]; past its bound, the panic says what `observer` last saw
/// and what each of `hosts` last warned of or compiled (CI keeps a failed
/// test's message, not the hosts' logs).
pub async fn balanced_among(
    observer: &Host,
    members: &[&str],
    hosts: &[&Host],
) -> BTreeMap<String, Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last_seen = "no status answered".to_string();
    loop {
        if let Some(report) = observer.status().await {
            let ids: BTreeSet<&str> = report.fleet.members.iter().map(|m| m.id.as_str()).collect();
            let mut owned: BTreeMap<String, Vec<String>> = BTreeMap::new();
            let mut ownerless = report.fleet.unowned.len();
            for unit in &report.units {
                match &unit.owner {
                    Some(owner) => owned
                        .entry(owner.clone())
                        .or_default()
                        .push(unit.consumer.clone()),
                    None => ownerless += 1,
                }
            }
            let loads: BTreeMap<&str, usize> = owned
                .iter()
                .map(|(id, units)| (id.as_str(), units.len()))
                .collect();
            let (min, max) = (loads.values().min(), loads.values().max());
            if ids == members.iter().copied().collect()
                && ownerless == 0
                && owned.len() == members.len()
                && max.zip(min).is_some_and(|(max, min)| max - min <= 1)
            {
                return owned;
            }
            last_seen = format!("members {ids:?}, units held {loads:?}, {ownerless} unowned");
        }
        if Instant::now() >= deadline {
            let notes: Vec<String> = hosts.iter().map(|host| host.notes(12)).collect();
            panic!(
                "timed out after 90 s waiting for {members:?} to share every unit evenly; \
                 {} last saw {last_seen}\n{}",
                observer.id,
                notes.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every unit of the fleet's topology.
pub fn fleet_units() -> Vec<Unit> {
    Names::new("weir", PARTITIONS, SHARDS).units()
}

/// Tables whose unit's consumer is in `consumers`.
pub fn tables_of(consumers: &[String]) -> Vec<String> {
    let router = Names::new("weir", PARTITIONS, SHARDS);
    all_tables()
        .into_iter()
        .filter(|table| {
            let unit: Unit = router.route("acme", table);
            consumers.contains(&router.unit_consumer(unit))
        })
        .collect()
}

/// The size of a sink's output file (0 before its first row). Outputs only
/// grow, a killed host's too, so a larger size is a new row.
pub fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// How many bytes the hosts in `dirs` wrote for each of `tables`, summed
/// over the hosts.
pub fn sizes(dirs: &[&Path], tables: &[String]) -> Vec<u64> {
    tables
        .iter()
        .map(|table| dirs.iter().map(|dir| size(&output(dir, table))).sum())
        .collect()
}

/// Waits until each of `tables` got a new row in the outputs in `dirs`
/// since `before` (their `sizes` then): rows flow on every unit of those
/// tables.
pub async fn every_table_grows(dirs: &[&Path], tables: &[String], before: &[u64], what: &str) {
    eventually(Duration::from_secs(30), what, || async {
        let now = sizes(dirs, tables);
        now.iter()
            .zip(before)
            .all(|(now, before)| now > before)
            .then_some(())
    })
    .await
}

/// Every table of the fleet's tests.
pub fn all_tables() -> Vec<String> {
    (0..TABLES).map(|t| format!("t{t}")).collect()
}

/// A row a host's sink wrote.
#[derive(Debug, Clone, Copy)]
pub struct WrittenRow {
    pub id: u64,
    /// Its place in its table's sequence (as the producer posted it).
    pub seq: Option<u64>,
    pub host: &'static str,
    /// Where its line starts in the host's output file.
    pub offset: u64,
}

/// Every row each host's sink wrote (hosts named with their directory), by
/// table, each host's rows in the order written.
pub fn written_rows(hosts: &[(&'static str, &Path)]) -> BTreeMap<String, Vec<WrittenRow>> {
    let mut tables: BTreeMap<String, Vec<WrittenRow>> = BTreeMap::new();
    for (host, dir) in hosts {
        for table in all_tables() {
            let text = std::fs::read_to_string(output(dir, &table)).unwrap_or_default();
            let mut offset = 0;
            // A killed host may have left half a line.
            for line in text.split_inclusive('\n') {
                if let Ok(row) = serde_json::from_str::<serde_json::Value>(line)
                    && let Some(id) = row["id"].as_u64()
                {
                    let seq = row["seq"].as_u64();
                    let row = WrittenRow {
                        id,
                        seq,
                        host,
                        offset,
                    };
                    tables.entry(table.clone()).or_default().push(row);
                }
                offset += line.len() as u64;
            }
        }
    }
    tables
}

/// Every id each host's sink wrote, by table, in the order written.
pub fn written(hosts: &[(&'static str, &Path)]) -> BTreeMap<String, Vec<(u64, &'static str)>> {
    written_rows(hosts)
        .into_iter()
        .map(|(table, rows)| (table, rows.iter().map(|r| (r.id, r.host)).collect()))
        .collect()
}

/// Every id delivered, with the hosts that delivered it (once per delivery).
pub fn delivered(hosts: &[&Host]) -> BTreeMap<u64, Vec<&'static str>> {
    let dirs: Vec<(&'static str, &Path)> = hosts.iter().map(|h| (h.id, h.dir.path())).collect();
    by_id(&written(&dirs))
}

pub fn by_id(
    tables: &BTreeMap<String, Vec<(u64, &'static str)>>,
) -> BTreeMap<u64, Vec<&'static str>> {
    let mut seen: BTreeMap<u64, Vec<&'static str>> = BTreeMap::new();
    for rows in tables.values() {
        for (id, host) in rows {
            seen.entry(*id).or_default().push(host);
        }
    }
    seen
}

/// Producers posting concurrently, so every table gets rows often and a
/// moved unit's first row is not waiting for its turn.
pub const PRODUCERS: u64 = 4;

/// Posts rows to `url` round-robin over its share of the tables until
/// `stop`; returns every id the front door accepted. Each producer has
/// tables of its own and posts one request at a time, so a table's `seq`
/// field numbers its rows in the order they were stored.
pub async fn produce(url: String, producer: u64, stop: Arc<AtomicBool>) -> Vec<u64> {
    let http = reqwest::Client::new();
    let (mut accepted, mut request) = (Vec::new(), 0u64);
    let mut next_seq: BTreeMap<u64, u64> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        let table = (request * PRODUCERS + producer) % TABLES as u64;
        // Ids unique across producers: request number, producer, row.
        let first = (request * PRODUCERS + producer) * 20;
        request += 1;
        let ids: Vec<u64> = (first..first + 20).collect();
        let seq = next_seq.entry(table).or_default();
        let body: String = ids
            .iter()
            .map(|id| {
                *seq += 1;
                format!("{{\"id\":{id},\"seq\":{seq},\"email\":\"u{id}@example.com\"}}\n")
            })
            .collect();
        let response = http
            .post(format!("{url}/v1/ingest/t{table}"))
            .bearer_auth(ACME_KEY)
            .body(body)
            .send()
            .await;
        if response.is_ok_and(|r| r.status() == 202) {
            accepted.extend(ids);
        }
        // Pacing, not synchronisation: steady load that leaves the hosts CPU.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    accepted
}

/// A message's header `name` as text, empty when it has none.
pub fn header_of(message: &async_nats::Message, name: &str) -> String {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get(name))
        .map(|v| v.to_string())
        .unwrap_or_default()
}
