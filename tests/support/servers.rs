//! Servers of the tests' own, for the tests that kill connections: a `redis-server` per test
//! (or a primary, replicas and sentinels: [`sentinel::SentinelGroup`]), and one Redis Cluster
//! and one PostgreSQL cluster per test binary, on free loopback ports.
//! Killing connections on the shared servers of `REDIS_URL`, `REDIS_CLUSTER_URLS` and
//! `DATABASE_URL` would fail the other tests that use them.
//!
//! The server binaries come from the machine (`redis-server` and `redis-cli` on `PATH`,
//! PostgreSQL's from `pg_config --bindir` or `/usr/lib/postgresql/*/bin`), found by
//! [`super::probe`]. When one is missing, the tests that need it are ignored (they carry
//! `#[cfg_attr(not(backend_redis_binaries), ignore = "...")]` or its PostgreSQL twin; see
//! build.rs).
//!
//! A per-test server is killed when dropped. The per-binary clusters live in statics, which
//! are never dropped: a watchdog process stops them when the test binary exits, however it
//! exits (it waits for its stdin, which only this process holds, to close).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::probe::{on_path, postgres_bindir, running_as_root};
use super::stores::unique;

#[cfg(feature = "redis")]
pub mod sentinel;

/// How long a server may take to come up before the test fails.
const START_BOUND: Duration = Duration::from_secs(20);

/// Fails the test that needs `what`, which is missing: such a test is ignored by its
/// attribute, so it gets here only without one or when run with `--include-ignored`.
fn missing<T>(what: &str) -> Option<T> {
    panic!(
        "{what} is missing: a test that needs it carries \
         `#[cfg_attr(not(backend_redis_binaries), ignore = \"...\")]` (or \
         `backend_postgres_binaries`), so it is reported as ignored"
    )
}

/// A loopback port nothing listens on, and (for a cluster node's bus) nothing on
/// `port + offset` either.
fn free_port(offset: u16) -> u16 {
    if offset == 0 {
        // The kernel's pick: bound, then freed for the server.
        if let Ok(port) = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
            return port.port();
        }
    }
    let seed = RandomState::new().build_hasher().finish();
    for i in 0..1000u64 {
        let port = 20_000 + ((seed.wrapping_add(i * 7919)) % 10_000) as u16;
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && (offset == 0 || free(port + offset)) {
            return port;
        }
    }
    panic!("no free loopback port found")
}

/// Sends one inline command to a Redis server and answers its first reply line, within a
/// short bound. Plain TCP, so the per-binary clusters start outside any async runtime.
fn redis_line(port: u16, command: &str) -> Option<String> {
    let bound = Duration::from_millis(500);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, bound).ok()?;
    stream.set_read_timeout(Some(bound)).ok()?;
    stream.write_all(format!("{command}\r\n").as_bytes()).ok()?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    // Enough for the replies read here (PING, CLUSTER INFO): read until the reply is whole.
    loop {
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
        if reply_complete(&reply) {
            break;
        }
    }
    Some(String::from_utf8_lossy(&reply).into_owned())
}

/// Whether `reply` holds a whole simple or bulk reply.
fn reply_complete(reply: &[u8]) -> bool {
    let Some(end) = reply.windows(2).position(|w| w == b"\r\n") else {
        return false;
    };
    match reply.first() {
        Some(b'$') => {
            let len: usize = std::str::from_utf8(&reply[1..end])
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            reply.len() >= end + 2 + len + 2
        }
        _ => true,
    }
}

fn pong(port: u16) -> bool {
    redis_line(port, "PING").is_some_and(|r| r.starts_with("+PONG"))
}

/// Polls `ready` until it holds, for at most [`START_BOUND`]; waits for a process to come up,
/// nothing in a test's logic depends on its timing.
fn wait_ready(what: &str, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < START_BOUND,
            "{what} was not ready within {START_BOUND:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn_redis(port: u16, extra: &[&str]) -> Child {
    Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        // A replica's full sync writes the primary's data to a file: not in the repository,
        // and one per server, as replicas that share a file load each other's syncs.
        .arg("--dir")
        .arg(redis_dir())
        .args(["--dbfilename", &format!("dump-{port}.rdb")])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server")
}

/// The working directory of this binary's own `redis-server`s, removed when it exits.
fn redis_dir() -> &'static Path {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(unique("tower-idempotency-redis"));
        std::fs::create_dir_all(&dir).expect("a directory for the private redis-servers");
        Watchdog::at_exit(&format!("rm -rf '{}'", dir.display()));
        dir
    })
}

/// A `redis-server` of one test's own on a free loopback port, killed when dropped.
pub struct RedisServer {
    child: Child,
    /// `redis://127.0.0.1:<port>`.
    pub url: String,
}

impl RedisServer {
    /// Starts one and waits (bounded) until it answers PING; `None` when `redis-server` is
    /// not installed and backends are not required.
    pub async fn start() -> Option<Self> {
        on_path("redis-server").or_else(|| missing("redis-server"))?;
        let port = free_port(0);
        let server = Self {
            child: spawn_redis(port, &[]),
            url: format!("redis://127.0.0.1:{port}"),
        };
        tokio::task::spawn_blocking(move || {
            wait_ready("the private redis-server", || pong(port));
        })
        .await
        .expect("wait for redis-server");
        Some(server)
    }

    /// Starts a replica of `primary` (`--replicaof`) and waits (bounded) until its link to
    /// the primary is up (`master_link_status:up` in `INFO replication`); `None` as
    /// [`start`](Self::start).
    pub async fn start_replica_of(primary: &RedisServer) -> Option<Self> {
        on_path("redis-server").or_else(|| missing("redis-server"))?;
        let primary_port = primary.port().to_string();
        let port = free_port(0);
        let server = Self {
            child: spawn_redis(port, &["--replicaof", "127.0.0.1", &primary_port]),
            url: format!("redis://127.0.0.1:{port}"),
        };
        tokio::task::spawn_blocking(move || {
            wait_ready("the private replica's link to its primary", || {
                redis_line(port, "INFO replication")
                    .is_some_and(|info| info.contains("master_link_status:up"))
            });
        })
        .await
        .expect("wait for the replica");
        Some(server)
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a redis://127.0.0.1:<port> URL")
    }
}

#[cfg(feature = "redis")]
impl RedisServer {
    /// A store on this server under `prefix`, each operation bounded by `timeout`.
    pub async fn store(
        &self,
        prefix: impl Into<String>,
        timeout: Duration,
    ) -> tower_idempotency::RedisStore {
        tower_idempotency::RedisStore::connect(&self.url)
            .await
            .expect("connect to the private redis-server")
            .key_prefix(prefix)
            .timeout(timeout)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the shell commands it is given when this process exits: it waits for EOF on its
/// stdin, which only this process holds, so it also cleans up after a crash.
struct Watchdog(Mutex<ChildStdin>);

impl Watchdog {
    fn get() -> &'static Watchdog {
        static WATCHDOG: OnceLock<Watchdog> = OnceLock::new();
        WATCHDOG.get_or_init(|| {
            let mut child = Command::new("sh")
                .arg("-c")
                .arg(r#"cmds=""; while IFS= read -r line; do cmds="$cmds$line;"; done; eval "$cmds""#)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start the cleanup watchdog");
            let stdin = child.stdin.take().expect("piped stdin");
            // Not waited for: it outlives this process by design.
            drop(child);
            Watchdog(Mutex::new(stdin))
        })
    }

    /// Runs `command` (one line of shell) when this process exits.
    fn at_exit(command: &str) {
        let mut stdin = Self::get()
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        writeln!(stdin, "{command}").expect("register a cleanup with the watchdog");
        stdin.flush().expect("register a cleanup with the watchdog");
    }
}

/// A 3-node Redis Cluster of this test binary's own, on free loopback ports (each node's bus
/// on its port + 10000), stopped when the binary exits. Tests share it: each kills only the
/// connections of its own ACL user ([`RedisCluster::user`]).
pub struct RedisCluster {
    ports: Vec<u16>,
    /// The node processes, never waited for: the watchdog kills them when this process exits.
    _nodes: Vec<Child>,
}

impl RedisCluster {
    /// The binary's cluster, started on first use (about two seconds); `None` when
    /// `redis-server` or `redis-cli` is not installed and backends are not required.
    pub fn shared() -> Option<&'static RedisCluster> {
        static CLUSTER: OnceLock<Result<RedisCluster, String>> = OnceLock::new();
        on_path("redis-server").or_else(|| missing("redis-server"))?;
        on_path("redis-cli").or_else(|| missing("redis-cli"))?;
        match CLUSTER.get_or_init(Self::start) {
            Ok(cluster) => Some(cluster),
            Err(e) => panic!("the private Redis Cluster did not start: {e}"),
        }
    }

    fn start() -> Result<Self, String> {
        let dir = std::env::temp_dir().join(unique("tower-idempotency-cluster"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Watchdog::at_exit(&format!("rm -rf '{}'", dir.display()));
        let mut ports = Vec::new();
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let port = free_port(10_000);
            let conf = dir.join(format!("nodes-{port}.conf"));
            let child = spawn_redis(
                port,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &conf.display().to_string(),
                    "--cluster-node-timeout",
                    "5000",
                    "--dir",
                    &dir.display().to_string(),
                ],
            );
            Watchdog::at_exit(&format!("kill -9 {}", child.id()));
            nodes.push(child);
            ports.push(port);
            wait_ready("a private cluster node", || pong(port));
        }
        let addresses: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut create = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-cli: {e}"))?;
        let mut status = None;
        wait_ready("redis-cli --cluster create", || {
            status = create.try_wait().ok().flatten();
            status.is_some()
        });
        if !status.is_some_and(|s| s.success()) {
            return Err(format!("redis-cli --cluster create failed: {status:?}"));
        }
        // Every node must see every slot served before a client can rely on it.
        wait_ready("the private Redis Cluster", || {
            ports.iter().all(|&p| {
                redis_line(p, "CLUSTER INFO").is_some_and(|info| {
                    info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
                })
            })
        });
        Ok(Self {
            ports,
            _nodes: nodes,
        })
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// A new ACL user on every node, whose connections a test may kill without touching
    /// those of the other tests on this cluster.
    #[cfg(feature = "redis")]
    pub async fn user(&self) -> ClusterUser {
        let name = unique("faults");
        let password = unique("pw");
        let mut nodes = Vec::new();
        for url in self.urls() {
            let mut admin = super::stores::redis_admin::admin(&url).await;
            let () = redis::cmd("ACL")
                .arg("SETUSER")
                .arg(&name)
                .arg("on")
                .arg(format!(">{password}"))
                .arg("~*")
                .arg("&*")
                .arg("+@all")
                .query_async(&mut admin)
                .await
                .expect("ACL SETUSER");
            nodes.push(admin);
        }
        let urls = self
            .urls()
            .iter()
            .map(|u| u.replacen("redis://", &format!("redis://{name}:{password}@"), 1))
            .collect();
        ClusterUser { name, urls, nodes }
    }
}

/// A user of the private Redis Cluster: the URLs to connect as it, and admin connections
/// (as the default user) to every node, to kill its connections.
#[cfg(feature = "redis")]
pub struct ClusterUser {
    pub name: String,
    /// Every node's URL with this user's credentials.
    pub urls: Vec<String>,
    nodes: Vec<redis::aio::MultiplexedConnection>,
}

#[cfg(feature = "redis")]
impl ClusterUser {
    /// Kills every connection of this user on every node; answers how many there were.
    pub async fn kill_connections(&mut self) -> Result<i64, redis::RedisError> {
        let mut killed = 0;
        for node in &mut self.nodes {
            let n: i64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("USER")
                .arg(&self.name)
                .arg("SKIPME")
                .arg("yes")
                .query_async(node)
                .await?;
            killed += n;
        }
        Ok(killed)
    }
}

/// Kills every normal connection of the server `admin` is on but `admin`'s own; answers how
/// many there were. Only on a server of the test's own.
#[cfg(feature = "redis")]
pub async fn kill_redis_connections(
    admin: &mut redis::aio::MultiplexedConnection,
) -> Result<i64, redis::RedisError> {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(admin)
        .await
}

/// A PostgreSQL cluster of this test binary's own (initdb in a temporary directory, on a free
/// loopback port, trust authentication, user `postgres`), stopped and removed when the binary
/// exits. Tests share it, each in a database of its own ([`PostgresCluster::database`]).
pub struct PostgresCluster {
    port: u16,
}

impl PostgresCluster {
    /// The binary's cluster, started on first use (a second or two); `None` when PostgreSQL's
    /// binaries are not installed and backends are not required.
    pub fn shared() -> Option<&'static PostgresCluster> {
        static CLUSTER: OnceLock<Result<PostgresCluster, String>> = OnceLock::new();
        let Some(bin) = postgres_bindir() else {
            return missing("PostgreSQL (initdb, pg_ctl)");
        };
        let as_postgres = running_as_root();
        if as_postgres && on_path("runuser").is_none() {
            return missing("runuser (PostgreSQL refuses to run as root)");
        }
        match CLUSTER.get_or_init(|| Self::start(&bin, as_postgres)) {
            Ok(cluster) => Some(cluster),
            Err(e) => panic!("the private PostgreSQL cluster did not start: {e}"),
        }
    }

    fn start(bin: &Path, as_postgres: bool) -> Result<Self, String> {
        let pg = PgBin { bin, as_postgres };
        let dir = pg.private_dir("tower-idempotency-pg")?;
        let data = dir.join("data");
        pg.init(&data)?;
        let port = pg.start(
            &data,
            &dir,
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off \
             -c max_connections=200",
        )?;
        Ok(Self { port })
    }

    /// The URL of the database `name` on this cluster.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a database no other test uses and answers its URL: a test may then kill every
    /// session of its database and no other.
    #[cfg(feature = "postgres")]
    pub async fn database(&self) -> String {
        let name = unique("faults");
        let admin = super::stores::postgres_admin::admin(&self.url("postgres")).await;
        // Concurrent CREATE DATABASE from template1 can fail while another copies it.
        static CREATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let _one_at_a_time = CREATING.lock().await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("CREATE DATABASE");
        self.url(&name)
    }
}

/// Kills every session of the database `admin` is on but `admin`'s own; answers how many there
/// were. Only on a cluster of the test's own.
#[cfg(feature = "postgres")]
pub async fn terminate_postgres_sessions(
    admin: &tokio_postgres::Client,
) -> Result<usize, tokio_postgres::Error> {
    let rows = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND datname = current_database()",
            &[],
        )
        .await?;
    Ok(rows.iter().filter(|r| r.get::<_, bool>(0)).count())
}

/// PostgreSQL's server programs, run as the `postgres` user when this process is root
/// (PostgreSQL refuses to run as root; that user then owns the directories).
struct PgBin<'a> {
    bin: &'a Path,
    as_postgres: bool,
}

impl PgBin<'_> {
    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        let mut c = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        c.stdin(Stdio::null());
        c
    }

    /// A new directory under the temporary one, removed (with every server whose data
    /// directory is under it stopped) when this process exits.
    fn private_dir(&self, prefix: &str) -> Result<std::path::PathBuf, String> {
        let dir = std::env::temp_dir().join(unique(prefix));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Watchdog::at_exit(&format!(
            "for d in '{dir}'/*/; do {runuser}'{pg_ctl}' -D \"$d\" -m immediate stop \
             >/dev/null 2>&1; done; rm -rf '{dir}'",
            dir = dir.display(),
            runuser = if self.as_postgres {
                "runuser -u postgres -- "
            } else {
                ""
            },
            pg_ctl = self.bin.join("pg_ctl").display(),
        ));
        if self.as_postgres {
            let mut chown = Command::new("chown");
            chown.arg("postgres").arg(&dir);
            run(chown, "chown postgres")?;
        }
        Ok(dir)
    }

    fn init(&self, data: &Path) -> Result<(), String> {
        let mut initdb = self.command("initdb");
        initdb
            .arg("-D")
            .arg(data)
            .args(["-A", "trust", "-U", "postgres", "--no-sync"]);
        run(initdb, "initdb")
    }

    /// Starts the server of `data` on a free loopback port with `settings` (`-c` options),
    /// its socket and log in `dir`; answers the port.
    fn start(&self, data: &Path, dir: &Path, settings: &str) -> Result<u16, String> {
        let log = data.with_extension("log");
        // The port may be taken between the pick and the start: try a few.
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port(0);
            let mut start = self.command("pg_ctl");
            start
                .arg("-D")
                .arg(data)
                .arg("-l")
                .arg(&log)
                .arg("-o")
                .arg(format!(
                    "-p {port} -k {} -c listen_addresses=127.0.0.1 {settings}",
                    dir.display()
                ))
                .args(["-w", "-t", "20", "start"])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            match run(start, "pg_ctl start") {
                Ok(()) => return Ok(port),
                Err(e) => last = e,
            }
        }
        Err(format!(
            "{last}; log: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        ))
    }
}

fn run(mut c: Command, what: &str) -> Result<(), String> {
    let out = c.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A PostgreSQL primary streaming to one standby, of one test's own (a second or two to start):
/// for what a failover keeps and loses. With `synchronous`, the primary names the standby in
/// `synchronous_standby_names`, so a commit waits for the standby to have it on disk
/// (`synchronous_commit = on`, the default); without, replication is asynchronous, the
/// default too. Both servers stop when the test binary exits.
pub struct PrimaryAndStandby {
    primary: u16,
    standby: u16,
}

impl PrimaryAndStandby {
    /// `None` when PostgreSQL's binaries are not installed and backends are not required.
    pub fn start(synchronous: bool) -> Option<Self> {
        let Some(bin) = postgres_bindir() else {
            return missing("PostgreSQL (initdb, pg_ctl, pg_basebackup)");
        };
        let as_postgres = running_as_root();
        if as_postgres && on_path("runuser").is_none() {
            return missing("runuser (PostgreSQL refuses to run as root)");
        }
        let pg = PgBin {
            bin: &bin,
            as_postgres,
        };
        match Self::start_with(&pg, synchronous) {
            Ok(pair) => Some(pair),
            Err(e) => panic!("the primary and standby did not start: {e}"),
        }
    }

    fn start_with(pg: &PgBin<'_>, synchronous: bool) -> Result<Self, String> {
        let dir = pg.private_dir("tower-idempotency-standby")?;
        let (primary_data, standby_data) = (dir.join("primary"), dir.join("standby"));
        pg.init(&primary_data)?;
        let sync = if synchronous {
            "-c synchronous_standby_names='*'"
        } else {
            ""
        };
        let primary = pg.start(&primary_data, &dir, &format!("-c fsync=off {sync}"))?;
        // A copy of the primary that follows it (`-R` writes its `primary_conninfo`).
        let mut backup = pg.command("pg_basebackup");
        backup
            .arg("-D")
            .arg(&standby_data)
            .args(["-h", "127.0.0.1", "-U", "postgres", "-R", "-X", "stream"])
            .args(["--no-sync", "-p", &primary.to_string()]);
        run(backup, "pg_basebackup")?;
        let standby = pg.start(&standby_data, &dir, "-c fsync=off")?;
        Ok(Self { primary, standby })
    }

    pub fn primary_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.primary)
    }

    pub fn standby_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.standby)
    }
}

#[cfg(feature = "postgres")]
impl PrimaryAndStandby {
    /// Waits until the standby has replayed everything the primary has written so far.
    pub async fn caught_up(&self) {
        let primary = super::stores::postgres_admin::admin(&self.primary_url()).await;
        let standby = super::stores::postgres_admin::admin(&self.standby_url()).await;
        let written: String = primary
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .expect("the primary's position")
            .get(0);
        poll_server("the standby replays the primary's writes", || async {
            standby
                .query_one(
                    "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
                    &[&written],
                )
                .await
                .is_ok_and(|row| row.get::<_, bool>(0))
        })
        .await;
    }

    /// Cuts replication: the standby stops receiving, and the primary sees no standby.
    pub async fn cut(&self) {
        let standby = super::stores::postgres_admin::admin(&self.standby_url()).await;
        // Two statements: ALTER SYSTEM refuses to run in the transaction a batch would be.
        for statement in [
            "ALTER SYSTEM SET primary_conninfo = ''",
            "SELECT pg_reload_conf()",
        ] {
            standby
                .batch_execute(statement)
                .await
                .expect("stop the standby's WAL receiver");
        }
        let primary = super::stores::postgres_admin::admin(&self.primary_url()).await;
        poll_server("the primary sees no standby", || async {
            primary
                .query_one("SELECT count(*) FROM pg_stat_replication", &[])
                .await
                .is_ok_and(|row| row.get::<_, i64>(0) == 0)
        })
        .await;
    }

    /// Promotes the standby to a primary, as a failover does, and waits until it takes writes.
    pub async fn promote(&self) {
        let standby = super::stores::postgres_admin::admin(&self.standby_url()).await;
        let promoted: bool = standby
            .query_one("SELECT pg_promote(true, 20)", &[])
            .await
            .expect("promote the standby")
            .get(0);
        assert!(promoted, "the standby was not promoted within 20 s");
    }
}

/// Asks `ready` until it holds, for at most [`START_BOUND`]: waits for a server to reach a
/// state; nothing in a test's logic depends on how long it takes.
#[cfg(any(feature = "postgres", feature = "redis"))]
async fn poll_server<F, Fut>(what: &str, ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    super::poll_until(what, START_BOUND, ready).await;
}
