//! For the tests of stores on real servers: which server each test uses, fingerprints, names
//! no other test or run shares, and admin connections that go around the store.
//!
//! A backend test runs only when its server answered when the suite was built, and is
//! reported as ignored otherwise (build.rs, with the trade-off of a probe as old as the
//! build). It says so with an attribute, one per server:
//!
//! ```text
//! #[cfg_attr(not(backend_redis), ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379")]
//! #[cfg_attr(not(backend_redis_cluster), ignore = "no Redis Cluster at REDIS_CLUSTER_URLS or 127.0.0.1:7001-7003")]
//! // (set too when redis-server and redis-cli are installed: the tests then start their own)
//! #[cfg_attr(not(backend_postgres), ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test")]
//! #[cfg_attr(not(backend_mysql), ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test")]
//! #[cfg_attr(not(backend_redis_binaries), ignore = "no redis-server and redis-cli on PATH")]
//! #[cfg_attr(not(backend_postgres_binaries), ignore = "no PostgreSQL server binaries")]
//! ```

use std::time::Duration;

use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::store::Token;
use tower_idempotency::store::admin::{Expiry, Inspected, KeyState, StoreAdmin};

use super::probe::SERVERS;

/// The environment variable that makes every backend test run, and fail when its server is
/// missing, instead of being ignored (CI sets it; see build.rs).
pub const REQUIRE_BACKENDS_VAR: &str = "TOWER_IDEMPOTENCY_REQUIRE_BACKENDS";

/// The URL of the server that `var` names (`REDIS_URL`, `REDIS_CLUSTER_URLS`, `DATABASE_URL`):
/// the variable's, else the default local address where the build found one answering; for
/// a Redis Cluster with neither, the URLs of this test binary's own cluster
/// ([`super::servers::RedisCluster::shared`]), started on first use.
///
/// Always `Some`: the `Option` lets a test read `let Some(url) = backend_url(..) else
/// { return }`. A test whose server was not found is ignored, so it gets here only when it
/// lacks its `ignore` attribute (see the module docs) or was run with `--include-ignored`:
/// then it panics, saying which, rather than pass without running.
pub fn backend_url(var: &str) -> Option<String> {
    let server = SERVERS
        .iter()
        .find(|s| s.var == var)
        .unwrap_or_else(|| panic!("{var} names no backend server of tests/support/probe.rs"));
    // What build.rs found, by flag.
    let found = [
        ("backend_redis", cfg!(backend_redis)),
        ("backend_redis_cluster", cfg!(backend_redis_cluster)),
        ("backend_postgres", cfg!(backend_postgres)),
        ("backend_mysql", cfg!(backend_mysql)),
    ]
    .contains(&(server.cfg, true));
    // No cluster configured or running: the binary's own, started on first use.
    if found && server.own_instead() && !server.answers() {
        let cluster = super::servers::RedisCluster::shared()?;
        return Some(cluster.urls().join(","));
    }
    assert!(
        found,
        "no server answered at {} ({var}) when the suite was built: a test that needs it \
         carries `#[cfg_attr(not({}), ignore = \"...\")]`, so it is reported as ignored",
        server.url(),
        server.cfg
    );
    Some(server.url())
}

/// A distinct fingerprint per `n`.
pub fn fp(n: u8) -> Fingerprint {
    Fingerprint::from_bytes([n; 32])
}

/// `prefix` and a random suffix, a name no other test or run shares: usable as a table name,
/// a key namespace or part of a Redis key.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::from(Token::new()).simple())
}

/// A Redis key prefix no other test or run shares.
pub fn unique_prefix(test: &str) -> String {
    format!("test:{}:", unique(test))
}

/// Connections that go around the store, to plant values, read them raw and watch the server.
#[cfg(feature = "redis")]
pub mod redis_admin {
    use redis::aio::MultiplexedConnection;

    /// A connection of the test's own to the server at `url`.
    pub async fn admin(url: &str) -> MultiplexedConnection {
        redis::Client::open(url)
            .expect("valid REDIS_URL")
            .get_multiplexed_async_connection()
            .await
            .expect("admin connection")
    }
}

/// A session that goes around the store, to plant rows, hold locks and kill the store's sessions.
#[cfg(feature = "postgres")]
pub mod postgres_admin {
    use tokio_postgres::NoTls;

    /// A session of the test's own on the server at `url`.
    pub async fn admin(url: &str) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(url, NoTls)
            .await
            .expect("admin connection");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    }

    /// Drops the test's own `table` on the server at `url`, as the test's last step.
    pub async fn drop_table(url: &str, table: &str) {
        let sql = format!("DROP TABLE IF EXISTS \"{table}\"");
        admin(url).await.batch_execute(&sql).await.expect("drop");
    }
}

/// A pool that goes around the store, to plant rows and read them raw.
#[cfg(feature = "mysql")]
pub mod mysql_admin {
    use mysql_async::prelude::Queryable;

    /// A pool of the test's own on the server at `url`.
    pub fn admin(url: &str) -> mysql_async::Pool {
        mysql_async::Pool::from_url(url).expect("valid MYSQL_URL")
    }

    /// Drops the test's own `table` on the server at `url`, as the test's last step.
    pub async fn drop_table(url: &str, table: &str) {
        let pool = admin(url);
        let mut conn = pool.get_conn().await.expect("admin connection");
        conn.query_drop(format!("DROP TABLE IF EXISTS `{table}`"))
            .await
            .expect("drop");
        drop(conn);
        pool.disconnect().await.expect("disconnect");
    }
}

/// Records that decode but break the record rules of `store::record` (a pending record with an
/// outcome, a kept failure of category delivered): every store must answer them as corrupt.
/// A backend test writes them around the store, as something else would.
pub mod broken_records {
    /// A receipt: a valid outcome on its own.
    pub const RECEIPT: &str =
        r#"{"sent":{"id":"msg_1","transport":"fake","accepted":[],"replayed":false}}"#;
    /// A failure of unknown delivery: a valid outcome on its own.
    pub const UNKNOWN_FAILURE: &str = r#"{"failed":{"code":"provider.timeout","category":"unknown","retryable":false,"message":"timed out"}}"#;
    /// A failure of category delivered: a failure is no delivery.
    pub const DELIVERED_FAILURE: &str = r#"{"failed":{"code":"provider.accepted","category":"delivered","retryable":false,"message":"accepted"}}"#;

    /// Each broken record as (name, state, outcome), for a store that keeps the state and the
    /// outcome apart (PostgreSQL's columns).
    pub const PARTS: [(&str, &str, &str); 4] = [
        ("pending-with-receipt", "pending", RECEIPT),
        ("pending-with-failure", "pending", UNKNOWN_FAILURE),
        ("done-with-delivered-failure", "done", DELIVERED_FAILURE),
        (
            "pending-with-delivered-failure",
            "pending",
            DELIVERED_FAILURE,
        ),
    ];

    /// The same record whole, in the stored form of a record (version 2), for a store that
    /// keeps each key as one value (Redis); a pending one with its times.
    pub fn whole(state: &str, token: &str, fingerprint: &str, outcome: &str) -> String {
        let (state, times) = match state {
            "pending" => ('P', "60000,1"),
            _ => ('D', ","),
        };
        format!("\x02{state}{token}{fingerprint}{times}\n{outcome}")
    }
}

/// A fresh directory under the OS temp dir for a SQLite database file, named after `test`
/// and unique to this run; removed when the returned guard drops.
pub struct SqliteDir(pub std::path::PathBuf);

impl SqliteDir {
    pub fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(unique(&format!("tower-idempotency-{test}")));
        std::fs::create_dir_all(&dir).expect("a temp dir for the SQLite file");
        Self(dir)
    }

    /// The database file's path in it.
    pub fn file(&self) -> std::path::PathBuf {
        self.0.join("idempotency.sqlite3")
    }
}

impl Drop for SqliteDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How long [`until_expired`] asks before it fails the test: far past the short leases and
/// ttls the tests set, so only a store whose clock never ends them reaches it.
pub const EXPIRY_BOUND: Duration = Duration::from_secs(10);

/// Waits until the store's own clock has ended the lease or ttl of each of `keys`: asks
/// [`StoreAdmin::inspect`] until it answers the record expired (or gone), as the server
/// decides it, rather than sleeping for as long as the lease should last. Fails the test
/// after [`EXPIRY_BOUND`].
pub async fn until_expired<S: StoreAdmin + ?Sized>(store: &S, keys: &[&str]) {
    until_each(store, keys, "passes on the store's clock", |record| {
        record.is_none_or(|r| r.expires == Expiry::Passed)
    })
    .await;
}

/// Waits until the store holds each of `keys` settled: done, gone, or pending past its lease
/// (a send that never settled: the layer gives up retrying a settlement within the lease),
/// so a repeat is answered by what the store keeps, not by a send still under way. Asks
/// [`StoreAdmin::inspect`], again after an error (a connection a test's fault just killed);
/// fails the test after [`EXPIRY_BOUND`].
pub async fn until_settled<S: StoreAdmin + ?Sized>(store: &S, keys: &[&str]) {
    until_each(store, keys, "is settled, or its lease passed", |record| {
        record.is_none_or(|r| r.state == KeyState::Done || r.expires == Expiry::Passed)
    })
    .await;
}

/// Asks `inspect` for each of `keys` until `holds` of its record; an error is asked again.
async fn until_each<S: StoreAdmin + ?Sized>(
    store: &S,
    keys: &[&str],
    what: &str,
    holds: impl Fn(Option<Inspected>) -> bool,
) {
    for &key in keys {
        let holds = &holds;
        super::poll_until(&format!("{key} {what}"), EXPIRY_BOUND, || async move {
            store.inspect(key).await.is_ok_and(holds)
        })
        .await;
    }
    // `inspect` reads the time left in whole milliseconds, rounded: it may say passed up to a
    // millisecond before a reserve would take the key; a millisecond more on the same clock
    // rate covers that resolution, not a guess at how long anything takes.
    tokio::time::sleep(Duration::from_millis(1)).await;
}
