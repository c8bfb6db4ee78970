//! A real PostgreSQL for the tests: a cluster of the test's own, made with
//! Debian's `initdb` in a temp dir and run by `pg_ctl` on a free loopback
//! port, stopped and removed on drop. `.ci/setup` installs the package.

use std::os::unix::fs::chown;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use crate::support::free_port;

/// The PostgreSQL user and database every test cluster has.
pub const PG_USER: &str = "weir";
pub const PG_DATABASE: &str = "weir";

/// A PostgreSQL server of the test's own.
pub struct PgServer {
    bin: PathBuf,
    port: u16,
    /// The account the server runs as, when the tests run as root
    /// (PostgreSQL refuses to): its uid and gid.
    account: Option<(u32, u32)>,
    running: bool,
    dir: tempfile::TempDir,
}

impl PgServer {
    /// A new cluster, started, with the database `weir` owned by `weir`.
    /// Blocks (a second or two): in an async test, call it through
    /// `tokio::task::block_in_place`, as `stop`, `kill` and `start_again`.
    pub fn start() -> PgServer {
        let bin = pg_bin();
        let account = server_account();
        // Root's temp dir may be out of the server account's reach; /tmp is not.
        let dir = match account {
            Some(_) => tempfile::Builder::new()
                .prefix("weir-pg")
                .tempdir_in("/tmp"),
            None => tempfile::Builder::new().prefix("weir-pg").tempdir(),
        }
        .expect("temp dir");
        if let Some((uid, gid)) = account {
            chown(dir.path(), Some(uid), Some(gid))
                .expect("hand the temp dir to the server account");
        }
        let mut server = PgServer {
            bin,
            port: free_port(),
            account,
            running: false,
            dir,
        };
        // No sync: a test cluster need not survive a power cut, only a crash.
        let mut initdb = server.command("initdb");
        initdb.arg("-D").arg(server.data_dir()).args([
            "-A",
            "trust",
            "-U",
            PG_USER,
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        ]);
        server.run(initdb);
        std::fs::create_dir(server.socket_dir()).expect("socket dir");
        if let Some((uid, gid)) = account {
            chown(server.socket_dir(), Some(uid), Some(gid)).expect("hand the socket dir over");
        }
        server.start_again();
        let mut createdb = server.command("createdb");
        let port = server.port.to_string();
        createdb.args(["-h", "127.0.0.1", "-p", &port, "-U", PG_USER, PG_DATABASE]);
        server.run(createdb);
        server
    }

    /// `postgres://weir@127.0.0.1:PORT/weir`: no password (trust).
    pub fn url(&self) -> String {
        format!("postgres://{PG_USER}@127.0.0.1:{}/{PG_DATABASE}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A client of database `weir`, its connection driven by a task of its
    /// own (which ends when the server goes away).
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect to test PostgreSQL at {}: {e}", self.url()));
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    }

    /// A clean shutdown (`pg_ctl stop -m fast`): clients are disconnected.
    /// Blocks: call it through `tokio::task::block_in_place`.
    pub fn stop(&mut self) {
        self.stop_with("fast");
    }

    /// An immediate stop, as a crash: no checkpoint, every backend gone at
    /// once; the next start recovers from the WAL. Blocks.
    pub fn kill(&mut self) {
        self.stop_with("immediate");
    }

    /// Starts the server again: the same data and port. Blocks until it
    /// accepts connections.
    pub fn start_again(&mut self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.socket_dir().display()
        );
        let mut pg_ctl = self.command("pg_ctl");
        // -l: without a log file the server would keep our stdout pipe open.
        pg_ctl
            .args(["start", "-w", "-t", "120", "-D"])
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.log_file())
            .args(["-o", &options]);
        self.run(pg_ctl);
        self.running = true;
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_file()).unwrap_or_default()
    }

    fn stop_with(&mut self, mode: &str) {
        let mut pg_ctl = self.command("pg_ctl");
        pg_ctl
            .args(["stop", "-w", "-m", mode, "-D"])
            .arg(self.data_dir());
        self.run(pg_ctl);
        self.running = false;
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// `program` of the PostgreSQL binaries, as the server account.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.account {
            command.uid(uid).gid(gid);
        }
        command.current_dir(self.dir.path());
        command
    }

    /// Runs `command` to its end; a failure panics with its output and the
    /// server's log.
    fn run(&self, mut command: Command) {
        let program = command.get_program().to_string_lossy().into_owned();
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("{program} runs: {e}"));
        assert!(
            output.status.success(),
            "{program} failed ({}): {}{}\nserver log:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            self.log()
        );
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.running {
            // Never a panic in a drop: a failed stop leaves a process, no more.
            let _ = self
                .command("pg_ctl")
                .args(["stop", "-w", "-m", "immediate", "-D"])
                .arg(self.data_dir())
                .output();
        }
    }
}

/// The newest PostgreSQL's binaries under /usr/lib/postgresql (Debian's
/// layout), unless `WEIR_PG_BIN` names a folder.
fn pg_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("WEIR_PG_BIN") {
        return PathBuf::from(bin);
    }
    let versions = std::fs::read_dir("/usr/lib/postgresql").ok();
    let newest = versions
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version);
    match newest {
        Some((_, bin)) => bin,
        None => panic!(
            "PostgreSQL's initdb is not under /usr/lib/postgresql/*/bin: install Debian's \
             `postgresql` (bash .ci/setup does it) or set WEIR_PG_BIN"
        ),
    }
}

/// As root, the account to run the server as: Debian's `postgres`, or
/// `nobody`. None for anyone else, who runs it as themselves.
fn server_account() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let account = |name: &str| {
        passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            match fields.as_slice() {
                [user, _, uid, gid, ..] if *user == name => {
                    Some((uid.parse().ok()?, gid.parse().ok()?))
                }
                _ => None,
            }
        })
    };
    let found = account("postgres").or_else(|| account("nobody"));
    assert!(
        found.is_some(),
        "running as root, and neither `postgres` nor `nobody` is in /etc/passwd to run PostgreSQL as"
    );
    found
}

/// `count(*)` of `table`.
pub async fn count(client: &tokio_postgres::Client, table: &str) -> i64 {
    let row = client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap_or_else(|e| panic!("count {table}: {e}"));
    row.get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_postgres_starts_and_answers() {
    let mut pg = tokio::task::block_in_place(PgServer::start);
    let client = pg.client().await;
    client
        .batch_execute("CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric NOT NULL)")
        .await
        .expect("create table");
    let inserted = client
        .execute(
            "INSERT INTO orders SELECT i, i * 1.5 FROM generate_series(1, $1::int) AS i",
            &[&100_i32],
        )
        .await
        .expect("insert");
    assert_eq!(inserted, 100);
    assert_eq!(count(&client, "orders").await, 100);

    // A clean restart: the old connection is gone, the rows are not.
    tokio::task::block_in_place(|| {
        pg.stop();
        pg.start_again();
    });
    assert!(client.query_one("SELECT 1", &[]).await.is_err());
    let client = pg.client().await;
    assert_eq!(count(&client, "orders").await, 100);

    // A crash: what was committed is recovered from the WAL.
    client
        .execute("INSERT INTO orders VALUES (101, 2)", &[])
        .await
        .expect("insert");
    tokio::task::block_in_place(|| {
        pg.kill();
        pg.start_again();
    });
    let client = pg.client().await;
    assert_eq!(count(&client, "orders").await, 101);
    let port = pg.port();
    assert_eq!(pg.url(), format!("postgres://weir@127.0.0.1:{port}/weir"));
}
