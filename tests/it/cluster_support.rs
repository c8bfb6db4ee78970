//! The harness of `cluster.rs` (issue #19): nats-server nodes on loopback
//! (one, or three in a cluster), a fleet of `weir` processes on them, a
//! steady multi-tenant load through every front door, a tailer that reads
//! every host's sink files as they grow, and the account of one scenario:
//! rows accepted, lost, delivered twice, out of order, and how long the
//! fault took to heal.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_nats::ServerAddr;
use weir::config::SyncPolicy;
use weir::nats::{EmbeddedNats, EmbeddedOptions};
use weir::topology::Names;

use crate::support::{Host, eventually, free_port, plugins_dir};

/// Tenants of the load, with their API keys.
pub const TENANTS: [(&str, &str); 3] = [
    ("acme", "acme-key-123"),
    ("globex", "globex-key-456"),
    ("initech", "initech-key-789"),
];
/// Tables every tenant of the steady load posts to.
pub const TABLES: [&str; 2] = ["orders", "events"];
/// The table the flood of the full-partition scenario posts big rows to.
pub const BULK: (&str, &str) = ("acme", "bulk");
pub const PARTITIONS: u32 = 2;
pub const SHARDS: u32 = 2;
/// Rows per request of the steady load.
const ROWS_PER_REQUEST: u64 = 5;
/// One request per table per tick: 6 tables × 5 rows × 10 ticks/s = 300
/// rows/s at most, a steady load that leaves two cores for the fleet.
const TICK: Duration = Duration::from_millis(100);
/// How often a refused request is sent again (to the next front door).
const RETRY: Duration = Duration::from_millis(100);
/// How long a producer waits for a front door's answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the tailer reads the sink files.
const TAIL_EVERY: Duration = Duration::from_millis(50);

/// `tenant/table`, the key every figure is kept by.
pub fn table_key(tenant: &str, table: &str) -> String {
    format!("{tenant}/{table}")
}

/// Every table of the steady load.
pub fn steady_tables() -> Vec<String> {
    TENANTS
        .iter()
        .flat_map(|(tenant, _)| TABLES.iter().map(move |table| table_key(tenant, table)))
        .collect()
}

// ---- NATS ----

/// One nats-server node: its ports and store survive a restart.
pub struct Node {
    pub name: String,
    pub port: u16,
    monitor: u16,
    extra: String,
    dir: tempfile::TempDir,
    server: Option<EmbeddedNats>,
}

impl Node {
    fn options(&self) -> EmbeddedOptions {
        EmbeddedOptions {
            binary: None,
            data_dir: self.dir.path().to_path_buf(),
            // Tests need speed, not power-loss durability; a SIGKILLed
            // server loses nothing the kernel already has.
            sync: SyncPolicy::Periodic,
            port: Some(self.port),
            extra_config: self.extra.clone(),
            password: None,
        }
    }
}

/// Starts of a cluster tried before a taken port fails the test.
const START_ATTEMPTS: usize = 3;

/// One nats-server, or three in a cluster, on loopback.
pub struct NatsNodes {
    pub nodes: Vec<Node>,
    http: reqwest::Client,
}

impl NatsNodes {
    /// `size` nodes (1 or 3), started and ready: JetStream enabled on each
    /// and, for a cluster, a meta leader every node agrees on.
    pub async fn start(size: usize) -> NatsNodes {
        // A free port can be taken by another process between the pick and
        // nats-server's bind (tests run beside others): pick again.
        for _ in 1..START_ATTEMPTS {
            match NatsNodes::try_start(size).await {
                Ok(nodes) => return nodes,
                Err(err) if err.contains("address already in use") => {
                    eprintln!(
                        "a nats-server's port was taken before it bound it; starting the nodes again on other ports"
                    );
                }
                Err(err) => panic!("nats-server >= 2.14 starts: {err}"),
            }
        }
        NatsNodes::try_start(size)
            .await
            .unwrap_or_else(|err| panic!("nats-server >= 2.14 starts: {err}"))
    }

    async fn try_start(size: usize) -> Result<NatsNodes, String> {
        let ports: Vec<(u16, u16, u16)> = (0..size)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let nodes = (0..size)
            .map(|i| {
                let (port, route, monitor) = ports[i];
                let name = format!("n{}", i + 1);
                let mut extra = format!("server_name: {name}\nhttp: \"127.0.0.1:{monitor}\"\n");
                if size > 1 {
                    let routes: Vec<String> = ports
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| *j != i)
                        .map(|(_, (_, route, _))| format!("\"nats-route://127.0.0.1:{route}\""))
                        .collect();
                    extra.push_str(&format!(
                        "cluster {{\n  name: weir\n  listen: \"127.0.0.1:{route}\"\n  routes: [{}]\n}}\n",
                        routes.join(", ")
                    ));
                }
                Node {
                    name,
                    port,
                    monitor,
                    extra,
                    dir: tempfile::tempdir().expect("temp dir"),
                    server: None,
                }
            })
            .collect();
        let mut nats = NatsNodes {
            nodes,
            http: reqwest::Client::new(),
        };
        // Started together: a clustered node waits for its peers to elect.
        let starts: Vec<_> = nats
            .nodes
            .iter()
            .map(|node| {
                let options = node.options();
                tokio::task::spawn_blocking(move || EmbeddedNats::start(&options))
            })
            .collect();
        let mut failed = None;
        for (node, start) in nats.nodes.iter_mut().zip(starts) {
            match start.await.unwrap() {
                Ok(server) => node.server = Some(server),
                Err(err) => failed = Some(format!("{err:?}")),
            }
        }
        // The nodes that did start stop as `nats` drops.
        if let Some(err) = failed {
            return Err(err);
        }
        nats.wait_healthy().await;
        Ok(nats)
    }

    /// A client of the test's own, on the seed list (it follows the cluster).
    pub async fn client(&self) -> async_nats::Client {
        let seeds: Vec<ServerAddr> = self
            .nodes
            .iter()
            .map(|node| format!("nats://127.0.0.1:{}", node.port).parse().unwrap())
            .collect();
        async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(seeds)
            .await
            .expect("connect to the test's nats")
    }

    fn index(&self, name: &str) -> usize {
        self.nodes
            .iter()
            .position(|node| node.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Waits until every running node reports itself healthy (`/healthz`:
    /// JetStream enabled and every stream and consumer it holds current)
    /// and, in a cluster, all of them name the same meta leader.
    pub async fn wait_healthy(&self) {
        let monitors: Vec<u16> = self
            .nodes
            .iter()
            .filter(|node| node.server.is_some())
            .map(|node| node.monitor)
            .collect();
        let clustered = self.nodes.len() > 1;
        eventually(Duration::from_secs(60), "healthy nats nodes", || async {
            let mut leaders = BTreeSet::new();
            for monitor in &monitors {
                let health = self
                    .http
                    .get(format!("http://127.0.0.1:{monitor}/healthz"))
                    .send()
                    .await
                    .ok()?;
                if !health.status().is_success() {
                    return None;
                }
                if clustered {
                    let jsz: serde_json::Value = self
                        .http
                        .get(format!("http://127.0.0.1:{monitor}/jsz"))
                        .send()
                        .await
                        .ok()?
                        .json()
                        .await
                        .ok()?;
                    leaders.insert(jsz["meta_cluster"]["leader"].as_str()?.to_string());
                }
            }
            (!clustered || (leaders.len() == 1 && !leaders.contains(""))).then_some(())
        })
        .await;
    }

    /// SIGKILL: the node dies without a word to its peers.
    pub async fn kill(&mut self, name: &str) {
        let index = self.index(name);
        let mut server = self.nodes[index].server.take().expect("node runs");
        // SAFETY: kill(2) on our own child, not reaped yet (stop reaps it).
        unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGKILL) };
        tokio::task::spawn_blocking(move || server.stop())
            .await
            .unwrap();
    }

    /// SIGTERM: the node shuts down as it would for an upgrade.
    pub async fn stop(&mut self, name: &str) {
        let index = self.index(name);
        let mut server = self.nodes[index].server.take().expect("node runs");
        tokio::task::spawn_blocking(move || server.stop())
            .await
            .unwrap();
    }

    /// Starts a stopped node again: same name, ports and store.
    pub async fn restart(&mut self, name: &str) {
        let index = self.index(name);
        let options = self.nodes[index].options();
        let server = tokio::task::spawn_blocking(move || EmbeddedNats::start(&options))
            .await
            .unwrap()
            .expect("nats-server restarts on its port");
        self.nodes[index].server = Some(server);
    }

    /// The node leading `stream`'s replicas (`$JS.API.STREAM.INFO`), once
    /// it has one.
    pub async fn stream_leader(&self, client: &async_nats::Client, stream: &str) -> String {
        let js = async_nats::jetstream::new(client.clone());
        eventually(Duration::from_secs(30), "a stream leader", || async {
            let mut stream = js.get_stream(stream).await.ok()?;
            let info = stream.info().await.ok()?;
            info.cluster.as_ref()?.leader.clone()
        })
        .await
    }
}

// ---- the fleet ----

// ---- the network between a host and NATS ----

/// One host's network to the NATS nodes: a TCP proxy per node that the
/// test can cut. A cut stops forwarding both ways, as a network that drops
/// packets does (bytes wait in the sockets, as TCP would retransmit them;
/// new connections get no answer); healing resumes every connection where
/// it stood. The server may give up on a connection meanwhile, as it would
/// on a real partition; then the host reconnects once healed.
pub struct Link {
    cut: tokio::sync::watch::Sender<bool>,
    /// The seed list the host is configured with: one proxy per node.
    pub seeds: String,
    listeners: Vec<tokio::task::JoinHandle<()>>,
}

impl Link {
    /// Proxies to the NATS nodes on `ports`, on fresh loopback ports.
    pub fn start(ports: &[u16]) -> Link {
        let (cut, _) = tokio::sync::watch::channel(false);
        let mut seeds = Vec::new();
        let mut listeners = Vec::new();
        for &upstream in ports {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a proxy");
            listener.set_nonblocking(true).unwrap();
            seeds.push(format!("nats://{}", listener.local_addr().unwrap()));
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let cut = cut.subscribe();
            listeners.push(tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    tokio::spawn(forward(client, upstream, cut.clone()));
                }
            }));
        }
        Link {
            cut,
            seeds: seeds.join(","),
            listeners,
        }
    }

    /// Partitions the host from every node.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        for listener in &self.listeners {
            listener.abort();
        }
    }
}

/// Waits while the link is cut.
async fn while_cut(cut: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = cut.wait_for(|cut| !*cut).await;
}

/// One connection through the proxy: nothing moves while the link is cut.
async fn forward(
    client: tokio::net::TcpStream,
    upstream: u16,
    mut cut: tokio::sync::watch::Receiver<bool>,
) {
    while_cut(&mut cut).await;
    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        _ = pipe(client_read, server_write, cut.clone()) => {}
        _ = pipe(server_read, client_write, cut) => {}
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        while_cut(&mut cut).await;
        let read = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        // Read just before a cut: held until it heals, as in flight.
        while_cut(&mut cut).await;
        if to.write_all(&buf[..read]).await.is_err() {
            return;
        }
    }
}

/// What every host of one fleet is configured with.
#[derive(Clone)]
pub struct FleetSettings {
    /// The client ports of the NATS nodes (each host reaches them through
    /// a [`Link`] of its own).
    pub node_ports: Vec<u16>,
    pub replicas: u32,
    /// Byte limit of each partition stream.
    pub max_bytes: &'static str,
}

/// A host's config: three tenants, their tables through the validator into
/// the NDJSON file sink, the topology created with `replicas` copies.
pub fn host_config(settings: &FleetSettings, id: &str, seeds: &str) -> String {
    let tenants: String = TENANTS
        .iter()
        .map(|(name, key)| format!("[[tenants]]\nname = \"{name}\"\napi_keys = [\"{key}\"]\n\n"))
        .collect();
    format!(
        r#"listen = "127.0.0.1:0"
data_dir = "data"
compile_cache_dir = "{cache}"
plugins_dir = "{plugins}"
max_body_bytes = 1048576
# A row's id is its message id: a producer's retry after a refusal or a
# lost answer stores nothing twice. Producers of tables other than
# `orders` send an Idempotency-Key per request instead (their rows carry
# `rid`), so both ways the front door stores rows are under every fault.
idempotency_field = "id"

[nats]
url = "{seeds}"

[stream]
create = true
partitions = {PARTITIONS}
shards = {SHARDS}
replicas = {replicas}
max_bytes = "{max_bytes}"

[delivery]
batch_wait_ms = 5
# A row whose ack went down with a server comes back within the scenario,
# not 30 s later.
ack_wait = "10s"

[coordination]
host_id = "{id}"

{tenants}[plugins.validate]
wasm = "weir_validator.wasm"
world = "transform"
settings = {{ required = ["seq", "scenario"] }}

[plugins.files]
wasm = "weir_ndjson_sink.wasm"
world = "sink"
grants.dirs = [{{ host = "out", guest = "/out", writable = true }}]

[[pipelines]]
tables = ["orders", "events", "bulk"]
transforms = ["validate"]
sink = "files"
"#,
        plugins = plugins_dir().display(),
        cache = crate::support::compile_cache_dir().display(),
        replicas = settings.replicas,
        max_bytes = settings.max_bytes,
    )
}

/// `weir` processes sharing the units. A host stopped for good stays in
/// `hosts` (its sink files are part of the account).
pub struct Fleet {
    pub settings: FleetSettings,
    pub hosts: Vec<Host>,
    /// Each host's network to NATS, by index.
    pub links: Vec<Link>,
    running: Vec<bool>,
    /// The front doors the load posts to, updated as hosts come and go
    /// (what a load balancer's health check does).
    pub front_doors: Arc<RwLock<Vec<String>>>,
    /// Every host's directory, read by the tailer.
    dirs: Arc<RwLock<Vec<PathBuf>>>,
    router: Names,
}

const IDS: [&str; 5] = ["h1", "h2", "h3", "h4", "h5"];

impl Fleet {
    /// `size` hosts, started and sharing every unit. Started `together`,
    /// as a deployment starts them, every host creates the same replicated
    /// streams at once; otherwise the first host creates the topology and
    /// the others start once it is up (a shorter boot on a cluster).
    pub async fn start(settings: FleetSettings, size: usize, together: bool) -> Fleet {
        let mut fleet = Fleet {
            settings,
            hosts: Vec::new(),
            links: Vec::new(),
            running: Vec::new(),
            front_doors: Arc::default(),
            dirs: Arc::default(),
            router: Names::new("weir", PARTITIONS, SHARDS),
        };
        fleet.spawn();
        if !together {
            fleet.wait_up(0).await;
        }
        for _ in 1..size {
            fleet.spawn();
        }
        for index in usize::from(!together)..size {
            fleet.wait_up(index).await;
        }
        fleet.balanced().await;
        fleet
    }

    /// Waits until host `index` answers (started again on another port if
    /// its own was taken), or fails the test with its log.
    pub async fn wait_up(&mut self, index: usize) {
        let up = self.hosts[index].wait_up(Duration::from_secs(120)).await;
        self.publish_front_doors();
        if let Err(why) = up {
            panic!("{why}");
        }
    }

    /// Starts the next host (h1, h2, …); returns its index.
    pub fn spawn(&mut self) -> usize {
        let id = IDS[self.hosts.len()];
        let link = Link::start(&self.settings.node_ports);
        let host = Host::spawn_with(id, host_config(&self.settings, id, &link.seeds));
        self.links.push(link);
        self.dirs
            .write()
            .unwrap()
            .push(host.dir.path().to_path_buf());
        self.hosts.push(host);
        self.running.push(true);
        self.publish_front_doors();
        self.hosts.len() - 1
    }

    fn publish_front_doors(&self) {
        *self.front_doors.write().unwrap() = self
            .hosts
            .iter()
            .zip(&self.running)
            .filter(|(_, running)| **running)
            .map(|(host, _)| host.url.clone())
            .collect();
    }

    pub fn running_ids(&self) -> Vec<&'static str> {
        self.hosts
            .iter()
            .zip(&self.running)
            .filter(|(_, running)| **running)
            .map(|(host, _)| host.id)
            .collect()
    }

    /// A running host other than `index`.
    pub fn other_than(&self, index: usize) -> &Host {
        let other = (0..self.hosts.len())
            .find(|&i| i != index && self.running[i])
            .expect("another running host");
        &self.hosts[other]
    }

    fn observer(&self) -> &Host {
        let index = self
            .running
            .iter()
            .position(|r| *r)
            .expect("a running host");
        &self.hosts[index]
    }

    /// SIGKILL host `index`; its front door leaves the load's list.
    pub fn kill(&mut self, index: usize) {
        self.running[index] = false;
        self.publish_front_doors();
        self.hosts[index].child.kill().unwrap();
        self.hosts[index].child.wait().unwrap();
    }

    /// SIGTERM host `index` (a planned stop: it hands its units over); the
    /// stop itself is awaited by [`Fleet::wait_exit`].
    pub fn terminate(&mut self, index: usize) {
        self.running[index] = false;
        self.publish_front_doors();
        self.hosts[index].terminate();
    }

    /// SIGSTOP host `index` (a VM stall, a GC pause of the whole process);
    /// its front door leaves the load's list, as a load balancer's health
    /// check would take it out.
    pub fn freeze(&mut self, index: usize) {
        self.running[index] = false;
        self.publish_front_doors();
        // SAFETY: kill(2) on our own child, which has not been reaped.
        unsafe { libc::kill(self.hosts[index].child.id() as libc::pid_t, libc::SIGSTOP) };
    }

    /// SIGCONT host `index`, back in the load's list.
    pub fn thaw(&mut self, index: usize) {
        // SAFETY: as in `freeze`.
        unsafe { libc::kill(self.hosts[index].child.id() as libc::pid_t, libc::SIGCONT) };
        self.running[index] = true;
        self.publish_front_doors();
    }

    /// Waits until host `index`'s process has exited.
    pub async fn wait_exit(&mut self, index: usize) {
        let host = &mut self.hosts[index];
        let what = format!("{} exits", host.id);
        eventually(Duration::from_secs(60), &what, || {
            let exited = host.child.try_wait().unwrap().is_some();
            async move { exited.then_some(()) }
        })
        .await;
    }

    /// Starts stopped host `index` again (same id, directory and config),
    /// and waits until it answers.
    pub async fn restart(&mut self, index: usize) {
        self.hosts[index].start_again();
        self.running[index] = true;
        self.wait_up(index).await;
    }

    /// Waits until the running hosts, and only they, are members holding
    /// every unit, loads within one of each other.
    pub async fn balanced(&self) -> BTreeMap<String, Vec<String>> {
        self.balanced_seen_by(self.observer()).await
    }

    /// The same, as `observer` sees it (not a host whose view may be
    /// stale: one just cut off from NATS).
    pub async fn balanced_seen_by(&self, observer: &Host) -> BTreeMap<String, Vec<String>> {
        let ids: BTreeSet<&str> = self.running_ids().into_iter().collect();
        let what = format!("{ids:?} share every unit evenly");
        let last = Mutex::new(None);
        let balanced = tokio::time::timeout(
            Duration::from_secs(60),
            eventually(Duration::from_secs(61), &what, || async {
                let report = observer.status().await?;
                *last.lock().unwrap() = Some(format!("{:?} {:?}", report.fleet, report.units));
                let members: BTreeSet<&str> =
                    report.fleet.members.iter().map(|m| m.id.as_str()).collect();
                if members != ids || !report.fleet.unowned.is_empty() {
                    return None;
                }
                // Every member counts, one holding nothing too (a host back
                // from a partition that has not taken its share yet).
                let mut owned: BTreeMap<String, Vec<String>> =
                    ids.iter().map(|id| (id.to_string(), Vec::new())).collect();
                for unit in &report.units {
                    owned
                        .entry(unit.owner.clone()?)
                        .or_default()
                        .push(unit.consumer.clone());
                }
                let loads: Vec<usize> = owned.values().map(Vec::len).collect();
                let (min, max) = (loads.iter().min()?, loads.iter().max()?);
                (max - min <= 1).then_some(owned)
            }),
        )
        .await;
        match balanced {
            Ok(owned) => owned,
            Err(_) => {
                println!("{}", self.logs());
                panic!(
                    "timed out waiting for {what}; last status {:?}",
                    last.lock().unwrap()
                )
            }
        }
    }

    /// The steady load's tables each member's units hold, by member.
    pub async fn tables_by_owner(&self) -> BTreeMap<String, Vec<String>> {
        let owned = self.balanced().await;
        owned
            .into_iter()
            .map(|(owner, consumers)| {
                let tables = steady_tables()
                    .into_iter()
                    .filter(|key| {
                        let (tenant, table) = key.split_once('/').unwrap();
                        consumers
                            .contains(&self.router.unit_consumer(self.router.route(tenant, table)))
                    })
                    .collect();
                (owner, tables)
            })
            .collect()
    }

    /// The running host whose units hold the most of the load's tables,
    /// with those tables: the victim whose fault shows the most.
    pub async fn busiest(&self) -> (usize, Vec<String>) {
        let by_owner = self.tables_by_owner().await;
        let (owner, tables) = by_owner
            .into_iter()
            .max_by_key(|(_, tables)| tables.len())
            .expect("an owner");
        let index = self.hosts.iter().position(|h| h.id == owner).unwrap();
        (index, tables)
    }

    /// The partition `tenant/table` lives in.
    /// Every host's log lines naming the units of `tables` (`tenant/table`
    /// keys) or its membership, for a failure.
    pub fn unit_logs(&self, tables: &[&str]) -> String {
        let mut words = vec!["stepping down".to_string(), "member".to_string()];
        for key in tables {
            let Some((tenant, table)) = key.split_once('/') else {
                continue;
            };
            let unit = self.router.route(tenant, table);
            words.push(self.router.unit_consumer(unit));
            words.push(format!("owners.{}.{}", unit.partition, unit.shard));
        }
        // A name, not the start of a longer one (`weir_in_1_1` in `weir_in_1_10`).
        let names = |line: &str, word: &str| {
            line.match_indices(word)
                .any(|(at, _)| !line[at + word.len()..].starts_with(|c: char| c.is_ascii_digit()))
        };
        self.hosts
            .iter()
            .flat_map(|host| {
                host.log()
                    .lines()
                    .filter(|line| words.iter().any(|word| names(line, word)))
                    .map(|line| format!("{}: {line}", host.id))
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn partition_of(&self, key: &str) -> u32 {
        let (tenant, table) = key.split_once('/').unwrap();
        self.router.route(tenant, table).partition
    }

    /// Waits until the fleet has delivered everything (every unit's
    /// backlog empty, nothing in flight).
    pub async fn drained(&self) {
        let observer = self.observer();
        eventually(Duration::from_secs(90), "every row settled", || async {
            observer.status().await.filter(|r| r.drained()).map(|_| ())
        })
        .await;
    }

    /// The last lines of every host's log, for a failure message.
    pub fn logs(&self) -> String {
        self.hosts
            .iter()
            .map(|host| host.log_tail(30))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

// ---- the load ----

/// One request as its producer sent it.
#[derive(Debug, Clone)]
pub struct Request {
    pub seqs: std::ops::Range<u64>,
    /// When it was first sent (retries keep this).
    pub sent: Instant,
    /// When a front door answered 202, if one did.
    pub accepted: Option<Instant>,
}

/// A front door's refusal (or no answer).
#[derive(Debug, Clone)]
pub struct Refusal {
    pub table: String,
    /// The status, 0 when the front door could not be reached.
    pub status: u16,
    pub body: String,
    pub at: Instant,
}

#[derive(Default)]
pub struct LoadLog {
    pub requests: BTreeMap<String, Vec<Request>>,
    pub refusals: Vec<Refusal>,
}

/// A row's id: the scenario in the high half, so rows of two scenarios on
/// the same streams never share a message id within the duplicate window.
pub fn row_id(scenario: u32, seq: u64) -> u64 {
    (u64::from(scenario) << 32) | seq
}

/// Producers posting to every front door until stopped: one per table,
/// each with its own sequence, one request in flight at a time, a refused
/// request sent again (same rows, same ids) to the next front door.
pub struct Load {
    pub scenario: u32,
    pub started: Instant,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    pub log: Arc<Mutex<LoadLog>>,
    /// The flood's big rows instead of the steady ones (full partition).
    flood: Option<Arc<AtomicBool>>,
}

impl Load {
    pub fn start(scenario: u32, front_doors: Arc<RwLock<Vec<String>>>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(LoadLog::default()));
        let tasks = TENANTS
            .iter()
            .flat_map(|(tenant, key)| TABLES.iter().map(move |table| (*tenant, *key, *table)))
            .enumerate()
            .map(|(producer, (tenant, key, table))| {
                let producer = Producer {
                    tenant,
                    key,
                    table,
                    scenario,
                    offset: producer,
                    rows: ROWS_PER_REQUEST,
                    pad: 64,
                    front_doors: front_doors.clone(),
                    log: log.clone(),
                };
                tokio::spawn(producer.run(stop.clone(), Some(TICK)))
            })
            .collect();
        Load {
            scenario,
            started: Instant::now(),
            stop,
            tasks,
            log,
            flood: None,
        }
    }

    /// Adds a producer posting big rows to [`BULK`] back to back until
    /// [`Load::end_flood`]: faster than delivery, so its partition fills.
    pub fn flood(&mut self, front_doors: Arc<RwLock<Vec<String>>>, rows: u64, pad: usize) {
        let flood_stop = Arc::new(AtomicBool::new(false));
        let producer = Producer {
            tenant: BULK.0,
            key: TENANTS[0].1,
            table: BULK.1,
            scenario: self.scenario,
            offset: 0,
            rows,
            pad,
            front_doors,
            log: self.log.clone(),
        };
        self.tasks
            .push(tokio::spawn(producer.run(flood_stop.clone(), None)));
        self.flood = Some(flood_stop);
    }

    pub fn end_flood(&self) {
        if let Some(flood) = &self.flood {
            flood.store(true, Ordering::Relaxed);
        }
    }

    /// Stops every producer; returns how long the load ran.
    pub async fn stop(&mut self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        self.end_flood();
        for task in self.tasks.drain(..) {
            task.await.unwrap();
        }
        self.started.elapsed()
    }

    /// How long after `at` every one of `tables` had a request sent at or
    /// after `at` accepted: when the front doors stored rows again.
    pub fn accepting_again(&self, tables: &[String], at: Instant) -> Option<Duration> {
        let log = self.log.lock().unwrap();
        tables.iter().try_fold(Duration::ZERO, |slowest, table| {
            let accepted = log
                .requests
                .get(table)?
                .iter()
                .filter(|request| request.sent >= at)
                .find_map(|request| request.accepted)?;
            Some(slowest.max(accepted.duration_since(at)))
        })
    }

    /// [`Self::accepting_again`], once every table has an answered request
    /// sent after `at`: delivery can heal before the first such answer
    /// arrives on a loaded machine.
    pub async fn wait_accepting_again(&self, tables: &[String], at: Instant) -> Duration {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(took) = self.accepting_again(tables, at) {
                return took;
            }
            assert!(
                Instant::now() < deadline,
                "a table accepted no request sent after the fault within 90 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The first sequence of `table` sent at or after `at`, once there is one.
    pub fn first_seq_sent_after(&self, table: &str, at: Instant) -> Option<u64> {
        let log = self.log.lock().unwrap();
        log.requests
            .get(table)?
            .iter()
            .find(|request| request.sent >= at)
            .map(|request| request.seqs.start)
    }
}

struct Producer {
    tenant: &'static str,
    key: &'static str,
    table: &'static str,
    scenario: u32,
    offset: usize,
    rows: u64,
    pad: usize,
    front_doors: Arc<RwLock<Vec<String>>>,
    log: Arc<Mutex<LoadLog>>,
}

impl Producer {
    async fn run(self, stop: Arc<AtomicBool>, tick: Option<Duration>) {
        // A front door that does not answer within this (a frozen host, one
        // cut off from NATS) is given up on, as a load balancer would, and
        // the request sent to the next: its ids store nothing twice.
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .unwrap();
        let key = table_key(self.tenant, self.table);
        let pad = "x".repeat(self.pad);
        let request_keys = self.table != "orders";
        let id_field = if request_keys { "rid" } else { "id" };
        let mut ticker = tick.map(|tick| {
            let mut ticker = tokio::time::interval(tick);
            // Steady load: a tick missed while a request was retried is
            // not made up for with a burst.
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker
        });
        let (mut next_seq, mut door) = (0u64, self.offset);
        while !stop.load(Ordering::Relaxed) {
            if let Some(ticker) = &mut ticker {
                ticker.tick().await;
            }
            let seqs = next_seq..next_seq + self.rows;
            next_seq = seqs.end;
            // The same key on every retry of this request, a new one after.
            let request_key = format!("s{}-{}-{}", self.scenario, self.table, seqs.start);
            let body: String = seqs
                .clone()
                .map(|seq| {
                    let id = row_id(self.scenario, seq);
                    format!(
                        "{{\"{id_field}\":{id},\"seq\":{seq},\"scenario\":{},\"pad\":\"{pad}\"}}\n",
                        self.scenario
                    )
                })
                .collect();
            let sent = Instant::now();
            let index = {
                let mut log = self.log.lock().unwrap();
                let requests = log.requests.entry(key.clone()).or_default();
                requests.push(Request {
                    seqs,
                    sent,
                    accepted: None,
                });
                requests.len() - 1
            };
            // Until accepted, or the load stops (then the request is simply
            // not accepted: rows a partial store kept may still arrive).
            while !stop.load(Ordering::Relaxed) {
                let url = {
                    let doors = self.front_doors.read().unwrap();
                    door += 1;
                    doors.get(door % doors.len().max(1)).cloned()
                };
                let Some(url) = url else {
                    tokio::time::sleep(RETRY).await;
                    continue;
                };
                let mut post = http
                    .post(format!("{url}/v1/ingest/{}", self.table))
                    .bearer_auth(self.key)
                    .body(body.clone());
                if request_keys {
                    post = post.header("Idempotency-Key", request_key.as_str());
                }
                let response = post.send().await;
                let (status, text) = match response {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        (status, response.text().await.unwrap_or_default())
                    }
                    Err(err) => (0, err.to_string()),
                };
                {
                    let mut log = self.log.lock().unwrap();
                    if status == 202 {
                        log.requests.get_mut(&key).unwrap()[index].accepted = Some(Instant::now());
                        break;
                    }
                    log.refusals.push(Refusal {
                        table: key.clone(),
                        status,
                        body: text.chars().take(200).collect(),
                        at: Instant::now(),
                    });
                }
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

// ---- the tailer ----

/// One row a sink wrote, as the tailer saw it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub table: String,
    pub seq: u64,
    pub scenario: u32,
    /// The host whose sink wrote it (index in the fleet).
    pub host: usize,
    /// The tailer's pass that read it: rows of one host are in the order
    /// written; rows of two hosts are ordered only across passes.
    pub pass: u64,
    pub seen: Instant,
}

/// Reads every host's sink files as they grow, in passes every 50 ms.
pub struct Tailer {
    pub deliveries: Arc<Mutex<Vec<Delivery>>>,
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Tailer {
    pub fn start(fleet: &Fleet) -> Tailer {
        let deliveries = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(tail(fleet.dirs.clone(), deliveries.clone(), stop.clone()));
        Tailer {
            deliveries,
            stop,
            task: Some(task),
        }
    }

    /// Waits for one more full pass, so every line written before now is read.
    pub async fn settle(&self) {
        tokio::time::sleep(TAIL_EVERY * 3).await;
    }

    pub async fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

async fn tail(
    dirs: Arc<RwLock<Vec<PathBuf>>>,
    deliveries: Arc<Mutex<Vec<Delivery>>>,
    stop: Arc<AtomicBool>,
) {
    // Per file: bytes read so far and the unfinished last line.
    let mut files: HashMap<PathBuf, (u64, Vec<u8>)> = HashMap::new();
    let mut pass = 0u64;
    let all_tables: Vec<(&str, &str)> = TENANTS
        .iter()
        .flat_map(|(tenant, _)| TABLES.iter().map(move |table| (*tenant, *table)))
        .chain([BULK])
        .collect();
    while !stop.load(Ordering::Relaxed) {
        pass += 1;
        let dirs = dirs.read().unwrap().clone();
        let mut found = Vec::new();
        for (host, dir) in dirs.iter().enumerate() {
            for (tenant, table) in &all_tables {
                let path = dir.join("out").join(tenant).join(format!("{table}.ndjson"));
                let (offset, partial) = files.entry(path.clone()).or_default();
                let Ok(mut file) = std::fs::File::open(&path) else {
                    continue;
                };
                if file.seek(SeekFrom::Start(*offset)).is_err() {
                    continue;
                }
                let mut fresh = Vec::new();
                let Ok(read) = file.read_to_end(&mut fresh) else {
                    continue;
                };
                *offset += read as u64;
                partial.extend_from_slice(&fresh);
                let Some(end) = partial.iter().rposition(|b| *b == b'\n') else {
                    continue;
                };
                let complete: Vec<u8> = partial.drain(..=end).collect();
                let seen = Instant::now();
                for line in complete.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                    if let Some((seq, scenario)) = parse_row(line) {
                        found.push(Delivery {
                            table: table_key(tenant, table),
                            seq,
                            scenario,
                            host,
                            pass,
                            seen,
                        });
                    }
                }
            }
        }
        deliveries.lock().unwrap().extend(found);
        tokio::time::sleep(TAIL_EVERY).await;
    }
}

/// A row's sequence and scenario. A host SIGKILLed mid-write leaves
/// half a line that its restart appends to: the row is the last object on
/// the line (rows hold no nested objects).
fn parse_row(line: &[u8]) -> Option<(u64, u32)> {
    let text = std::str::from_utf8(line).ok()?;
    let row: serde_json::Value = match serde_json::from_str(text) {
        Ok(row) => row,
        Err(_) => serde_json::from_str(&text[text.rfind('{')?..]).ok()?,
    };
    Some((
        row["seq"].as_u64()?,
        u32::try_from(row["scenario"].as_u64()?).ok()?,
    ))
}

// ---- the account ----

/// What one scenario did to the rows.
pub struct Account {
    pub accepted: usize,
    /// Accepted rows no sink wrote, by table (sequences).
    pub lost: BTreeMap<String, Vec<u64>>,
    /// Deliveries beyond the first of a row.
    pub duplicated: usize,
    /// First deliveries of a row after a later row of its table (seen
    /// before it on the same host, or in an earlier pass on any host).
    pub order_violations: usize,
    /// The first few of them: table, sequence, and how long after the next
    /// row of its table it came.
    pub late: Vec<String>,
    pub rows_per_sec: f64,
}

impl Account {
    pub fn lost_count(&self) -> usize {
        self.lost.values().map(Vec::len).sum()
    }
}

/// One table's order so far: past the highest sequence (plus one) first
/// delivered in earlier passes, in this pass, and in this pass per host.
#[derive(Default)]
struct Order {
    pass: u64,
    before: u64,
    this_pass: u64,
    by_host: HashMap<usize, u64>,
}

/// The account of `scenario` from the load's log and what the sinks wrote.
pub fn account(
    scenario: u32,
    log: &LoadLog,
    deliveries: &[Delivery],
    load_ran: Duration,
) -> Account {
    let mine: Vec<&Delivery> = deliveries
        .iter()
        .filter(|d| d.scenario == scenario)
        .collect();
    let mut delivered: HashMap<&str, HashSet<u64>> = HashMap::new();
    let mut duplicated = 0;
    let mut order_violations = 0;
    let mut order: HashMap<&str, Order> = HashMap::new();
    let mut late = Vec::new();
    let first_seen: HashMap<(&str, u64), Instant> = mine
        .iter()
        .rev()
        .map(|d| ((d.table.as_str(), d.seq), d.seen))
        .collect();
    for delivery in &mine {
        let first = delivered
            .entry(&delivery.table)
            .or_default()
            .insert(delivery.seq);
        if !first {
            duplicated += 1;
            continue;
        }
        let order = order.entry(&delivery.table).or_default();
        if order.pass != delivery.pass {
            order.pass = delivery.pass;
            order.before = order.before.max(order.this_pass);
            order.this_pass = 0;
            order.by_host.clear();
        }
        let host_max = order.by_host.entry(delivery.host).or_insert(0);
        if delivery.seq < order.before.max(*host_max) {
            order_violations += 1;
            if late.len() < 5 {
                let next = first_seen.get(&(delivery.table.as_str(), delivery.seq + 1));
                late.push(format!(
                    "{} seq {} came {} after seq {}",
                    delivery.table,
                    delivery.seq,
                    next.map_or("?".into(), |next| secs(delivery.seen.duration_since(*next))),
                    delivery.seq + 1
                ));
            }
        }
        *host_max = (*host_max).max(delivery.seq + 1);
        order.this_pass = order.this_pass.max(delivery.seq + 1);
    }
    let mut accepted = 0;
    let mut lost: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (table, requests) in &log.requests {
        for request in requests.iter().filter(|r| r.accepted.is_some()) {
            accepted += request.seqs.clone().count();
            for seq in request.seqs.clone() {
                if !delivered
                    .get(table.as_str())
                    .is_some_and(|seqs| seqs.contains(&seq))
                {
                    lost.entry(table.clone()).or_default().push(seq);
                }
            }
        }
    }
    Account {
        accepted,
        lost,
        duplicated,
        order_violations,
        late,
        rows_per_sec: accepted as f64 / load_ran.as_secs_f64(),
    }
}

/// Whether every accepted row of the load is in `deliveries`.
pub fn all_delivered(scenario: u32, log: &LoadLog, deliveries: &[Delivery]) -> bool {
    let delivered: HashSet<(&str, u64)> = deliveries
        .iter()
        .filter(|d| d.scenario == scenario)
        .map(|d| (d.table.as_str(), d.seq))
        .collect();
    log.requests.iter().all(|(table, requests)| {
        requests.iter().filter(|r| r.accepted.is_some()).all(|r| {
            r.seqs
                .clone()
                .all(|seq| delivered.contains(&(table.as_str(), seq)))
        })
    })
}

/// The table's header line.
pub fn header() -> String {
    format!(
        "{:<34} | {:>8} | {:>4} | {:>10} | {:>16} | {:>7} | recovery",
        "scenario", "accepted", "lost", "duplicated", "order violations", "rows/s"
    )
}

/// One line of the table.
pub fn line(name: &str, account: &Account, recovery: &str) -> String {
    format!(
        "{name:<34} | {:>8} | {:>4} | {:>10} | {:>16} | {:>7.0} | {recovery}",
        account.accepted,
        account.lost_count(),
        account.duplicated,
        account.order_violations,
        account.rows_per_sec
    )
}

/// A duration as the table prints it.
pub fn secs(duration: Duration) -> String {
    format!("{:.2}s", duration.as_secs_f64())
}
