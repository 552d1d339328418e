//! For the tests of stores on real servers: which server each test uses and when it is
//! skipped, fingerprints, names no other test or run shares, and admin connections that go
//! around the store.

use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::store::Token;

/// The environment variable that turns a skipped backend test into a failure (CI sets it).
pub const REQUIRE_BACKENDS_VAR: &str = "TOWER_IDEMPOTENCY_REQUIRE_BACKENDS";

/// Reads the server URL a backend test needs from `var`.
///
/// When it is unset, says once per test binary that its tests are skipped and answers `None`,
/// unless [`REQUIRE_BACKENDS_VAR`] is set, in which case it panics: a CI run must not pass on
/// skipped backends.
pub fn backend_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var_os(REQUIRE_BACKENDS_VAR).is_none(),
                "{var} is not set but {REQUIRE_BACKENDS_VAR} requires every backend test to run"
            );
            announce_skip(var);
            None
        }
    }
}

/// Says once per test binary and variable that its tests are skipped. Written to the
/// process's stderr directly, not through `eprintln!`, which the test harness captures and
/// hides for passing tests.
fn announce_skip(var: &str) {
    use std::io::Write;
    static ANNOUNCED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut announced = ANNOUNCED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !announced.iter().any(|v| v == var) {
        announced.push(var.to_owned());
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {var} is not set, so the tests that need it pass without running"
        );
    }
}

/// A distinct fingerprint per `n`.
pub fn fp(n: u8) -> Fingerprint {
    Fingerprint::from_bytes([n; 32])
}

/// `prefix` and a random suffix, a name no other test or run shares: usable as a table name,
/// a key namespace or part of a Redis key.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", Token::new().as_uuid().simple())
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
    use tower_idempotency::store::postgres::deadpool_postgres::tokio_postgres::{self, NoTls};

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

    /// The same record whole, for a store that keeps each key as one value (Redis).
    pub fn whole(state: &str, token: &str, fingerprint: &str, outcome: &str) -> String {
        format!(
            r#"{{"state":"{state}","token":"{token}","fingerprint":"{fingerprint}","outcome":{outcome}}}"#
        )
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
