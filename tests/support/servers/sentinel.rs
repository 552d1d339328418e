//! A Redis primary with replicas, watched by three sentinels, of one test's own: for what a
//! failover does to a store that follows the primary through Sentinel.
//!
//! The sentinels (`redis-server <conf> --sentinel`, quorum 2) deem the primary down after
//! [`DOWN_AFTER`] without an answer, so a failover takes a few seconds: the tests wait for
//! each state they need by polling, bounded by [`START_BOUND`](super::START_BOUND).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use super::super::probe::on_path;
use super::super::stores::unique;
use super::{Watchdog, free_port, missing, poll_server, spawn_redis};

/// How long the sentinels wait for an answer before they deem a server down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);

/// The name the sentinels know the primary by.
pub const PRIMARY_NAME: &str = "idem-primary";

/// One test's primary, replicas and three sentinels on free loopback ports; every process is
/// killed when dropped (and when the test binary exits, however it exits).
pub struct SentinelGroup {
    /// Every data server by port, the primary among them; `None` once killed.
    servers: Vec<(u16, Option<Child>)>,
    sentinels: Vec<(u16, Child)>,
    dir: PathBuf,
}

/// A connection to the server on `port`, each step bounded so a dead server answers `None`.
async fn connect(port: u16) -> Option<MultiplexedConnection> {
    let bound = Duration::from_millis(500);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(bound))
        .set_response_timeout(Some(bound));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .ok()
}

/// `cmd` sent to the server on `port`; `None` when it does not answer in time or fails.
pub async fn ask<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Option<T> {
    let mut connection = connect(port).await?;
    cmd.query_async(&mut connection).await.ok()
}

/// The fields of `INFO replication` on the server on `port`.
pub async fn replication(port: u16) -> Option<HashMap<String, String>> {
    let info: String = ask(port, redis::cmd("INFO").arg("replication")).await?;
    Some(
        info.lines()
            .filter_map(|line| line.split_once(':'))
            .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
            .collect(),
    )
}

/// How many replicas the server on `port` counts as connected.
async fn connected_replicas(port: u16) -> Option<usize> {
    replication(port)
        .await?
        .get("connected_slaves")?
        .parse()
        .ok()
}

/// Stops the replica on `replica` from receiving its primary's writes, for good until
/// [`restore_replication`]: it must log in as a user that does not exist, and its link is cut.
/// The primary then counts `remaining` replicas. Deterministic, unlike a race with the
/// replication stream: every write after this is on the primary alone.
pub async fn cut_replication(replica: u16, primary: u16, remaining: usize) {
    for (name, value) in [("masteruser", "nobody"), ("masterauth", "none")] {
        let () = ask(
            replica,
            redis::cmd("CONFIG").arg("SET").arg(name).arg(value),
        )
        .await
        .expect("CONFIG SET on the replica");
    }
    let _: Option<i64> = ask(
        replica,
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("master"),
    )
    .await;
    poll_server("the primary counts the replica gone", || async {
        connected_replicas(primary).await == Some(remaining)
    })
    .await;
}

/// Undoes [`cut_replication`]: the replica logs in as before and catches up.
pub async fn restore_replication(replica: u16) {
    for name in ["masteruser", "masterauth"] {
        let () = ask(replica, redis::cmd("CONFIG").arg("SET").arg(name).arg(""))
            .await
            .expect("CONFIG SET on the replica");
    }
    link_up(replica).await;
}

/// Waits until the replica on `port` has its link to its primary up.
pub async fn link_up(port: u16) {
    poll_server("the replica's link to its primary", || async {
        replication(port)
            .await
            .is_some_and(|info| info.get("master_link_status").map(String::as_str) == Some("up"))
    })
    .await;
}

impl SentinelGroup {
    /// A primary, `replicas` replicas of it, and three sentinels that know them all and each
    /// other (a second or a few); `None` when `redis-server` is not installed and backends
    /// are not required.
    pub async fn start(replicas: usize) -> Option<Self> {
        on_path("redis-server").or_else(|| missing("redis-server"))?;
        let dir = std::env::temp_dir().join(unique("tower-idempotency-sentinel"));
        std::fs::create_dir_all(&dir).expect("the sentinels' directory");
        Watchdog::at_exit(&format!("rm -rf '{}'", dir.display()));
        let mut group = Self {
            servers: Vec::new(),
            sentinels: Vec::new(),
            dir,
        };
        let primary = free_port(0);
        group.spawn_server(primary, None);
        poll_server("the primary answers", || async {
            ask::<String>(primary, &redis::cmd("PING")).await.is_some()
        })
        .await;
        for _ in 0..replicas {
            let port = free_port(0);
            group.spawn_server(port, Some(primary));
            link_up(port).await;
        }
        for _ in 0..3 {
            group.spawn_sentinel(primary);
        }
        // A sentinel learns the replicas from the primary at once, the other sentinels from
        // their hello messages (every two seconds): a failover needs them to vote.
        for &(port, _) in &group.sentinels {
            poll_server("a sentinel knows the group", || async {
                let Some(primary) = ask::<HashMap<String, String>>(
                    port,
                    redis::cmd("SENTINEL").arg("MASTER").arg(PRIMARY_NAME),
                )
                .await
                else {
                    return false;
                };
                let field = |name: &str| primary.get(name).map(String::as_str);
                field("num-slaves") == Some(&replicas.to_string())
                    && field("num-other-sentinels") == Some("2")
                    && field("flags") == Some("master")
            })
            .await;
        }
        Some(group)
    }

    fn spawn_server(&mut self, port: u16, replica_of: Option<u16>) {
        let primary = replica_of.map(|p| p.to_string());
        let extra: Vec<&str> = match &primary {
            Some(p) => vec!["--replicaof", "127.0.0.1", p],
            None => Vec::new(),
        };
        let child = spawn_redis(port, &extra);
        Watchdog::at_exit(&format!("kill -9 {} 2>/dev/null", child.id()));
        match self.servers.iter_mut().find(|(p, _)| *p == port) {
            Some((_, slot)) => *slot = Some(child),
            None => self.servers.push((port, Some(child))),
        }
    }

    fn spawn_sentinel(&mut self, primary: u16) {
        let port = free_port(0);
        let conf = self.dir.join(format!("sentinel-{port}.conf"));
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {PRIMARY_NAME} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {PRIMARY_NAME} {down}\n\
                 sentinel failover-timeout {PRIMARY_NAME} 2000\n",
                dir = self.dir.display(),
                down = DOWN_AFTER.as_millis(),
            ),
        )
        .expect("write a sentinel's configuration");
        // A sentinel rewrites its configuration file, so each has one of its own.
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server --sentinel");
        Watchdog::at_exit(&format!("kill -9 {} 2>/dev/null", child.id()));
        self.sentinels.push((port, child));
    }

    /// `redis://127.0.0.1:<port>` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|(port, _)| format!("redis://127.0.0.1:{port}"))
            .collect()
    }

    /// A store that follows the group's primary through its sentinels.
    #[cfg(feature = "redis-sentinel")]
    pub async fn store(
        &self,
        prefix: impl Into<String>,
        timeout: Duration,
    ) -> tower_idempotency::RedisStore {
        tower_idempotency::RedisStore::connect_sentinel(self.sentinel_urls(), PRIMARY_NAME)
            .await
            .expect("connect through the sentinels")
            .key_prefix(prefix)
            .timeout(timeout)
    }

    /// The port of the server the sentinels name the primary.
    pub async fn primary(&self) -> u16 {
        for &(port, _) in &self.sentinels {
            let named: Option<(String, u16)> = ask(
                port,
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(PRIMARY_NAME),
            )
            .await;
            if let Some((_, primary)) = named {
                return primary;
            }
        }
        panic!("no sentinel names the primary")
    }

    /// The ports of the live servers other than the primary.
    pub async fn replicas(&self) -> Vec<u16> {
        let primary = self.primary().await;
        self.servers
            .iter()
            .filter(|(port, child)| *port != primary && child.is_some())
            .map(|(port, _)| *port)
            .collect()
    }

    /// Waits until every live replica has every write the primary made so far.
    pub async fn synced(&self) {
        let primary = self.primary().await;
        let written: u64 = replication(primary)
            .await
            .and_then(|info| info.get("master_repl_offset")?.parse().ok())
            .expect("the primary's replication offset");
        for replica in self.replicas().await {
            poll_server("a replica catches up", || async {
                replication(replica)
                    .await
                    .and_then(|info| info.get("slave_repl_offset")?.parse::<u64>().ok())
                    .is_some_and(|offset| offset >= written)
            })
            .await;
        }
    }

    /// Kills the server on `port` (SIGKILL: no goodbye to its clients or replicas).
    pub fn kill(&mut self, port: u16) {
        let (_, slot) = self
            .servers
            .iter_mut()
            .find(|(p, _)| *p == port)
            .expect("a server of the group");
        if let Some(mut child) = slot.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Puts an empty replica of the current primary in the place of the killed server on
    /// `port`, and waits until its link is up. It listens on a fresh port: the killed
    /// server's may have been taken meanwhile by another test's server or connection.
    pub async fn restart_as_replica(&mut self, port: u16) {
        let primary = self.primary().await;
        let fresh = free_port(0);
        if let Some(entry) = self.servers.iter_mut().find(|(p, _)| *p == port) {
            entry.0 = fresh;
        }
        self.spawn_server(fresh, Some(primary));
        link_up(fresh).await;
        // The replica's link is up a moment before the primary counts it online, and a
        // `WAIT` in between counts no replica.
        let online = format!("port={fresh},state=online");
        poll_server("the primary counting the replica online", || async {
            replication(primary)
                .await
                .is_some_and(|info| info.values().any(|v| v.contains(&online)))
        })
        .await;
    }

    /// Makes the server on `port` hold every command it is sent (`CLIENT PAUSE ... ALL`) for
    /// longer than any test: a primary that hangs, its connections open. The sentinels' own
    /// pings go unanswered too, so they fail it over.
    pub async fn hang(&self, port: u16) {
        let () = ask(
            port,
            redis::cmd("CLIENT").arg("PAUSE").arg(600_000).arg("ALL"),
        )
        .await
        .expect("CLIENT PAUSE");
    }

    /// Asks a sentinel for a failover now (`SENTINEL FAILOVER`), as an operator does.
    pub async fn failover(&self) {
        let (port, _) = self.sentinels[0];
        let () = ask(
            port,
            redis::cmd("SENTINEL").arg("FAILOVER").arg(PRIMARY_NAME),
        )
        .await
        .expect("SENTINEL FAILOVER");
    }

    /// Waits until the sentinels name a primary other than `old`, that server says it is one,
    /// and `old` is gone or says it is a replica; answers the new primary's port. Until the
    /// sentinels demote a live old primary it takes writes that its new role then drops,
    /// which no client can tell: a test that sends before that would race with them.
    pub async fn new_primary(&self, old: u16) -> u16 {
        let is_primary = |port: u16| async move {
            let role: Option<Vec<redis::Value>> = ask(port, &redis::cmd("ROLE")).await;
            role.map(|r| matches!(r.first(), Some(redis::Value::BulkString(b)) if b == b"master"))
        };
        poll_server("the sentinels fail over", || async {
            let named = self.primary().await;
            named != old
                && is_primary(named).await == Some(true)
                && is_primary(old).await != Some(true)
        })
        .await;
        self.primary().await
    }
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        let children = self
            .servers
            .iter_mut()
            .filter_map(|(_, child)| child.as_mut())
            .chain(self.sentinels.iter_mut().map(|(_, child)| child));
        for child in children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
