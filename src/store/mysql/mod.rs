//! [`MySqlStore`] (feature `mysql`): keys in a MySQL 8 or MariaDB 10.6+ table, shared by every
//! process that uses the table.
//!
//! # Your driver
//!
//! The store runs on [mysql_async](https://docs.rs/mysql_async) 0.37: tokio-native, with its
//! own pool and per-connection statement cache, maintained since 2016, and independent of any
//! other database driver of this crate (sqlx's MySQL driver would tie the store to sqlx's
//! release train and bring sqlx-core whether or not the service uses sqlx). Where you hand it
//! your own, [`MySqlStore::new`] takes a `mysql_async::Pool` and [`MySqlStore::claim_in`] any
//! `mysql_async::prelude::Queryable` (a `Transaction`, a `Conn`): add `mysql_async = "0.37"`
//! to your dependencies, so your types are the store's. [`MySqlStore::connect`] needs none.
//!
//! With the features `sqlx` and `mysql` together, `MySqlStore::claim_in_sqlx` writes a claim
//! in a sqlx 0.8 (0.8.1 or later) MySQL transaction: the `mysql` feature turns on sqlx's
//! MySQL driver only when `sqlx` is on. Any other driver (diesel's `sql_query`) runs
//! [`MySqlStore::claim_statement`], the claim as one statement with its parameters.
//!
//! # Schema
//!
//! [`MySqlStore::migrate`] creates the table (default name [`DEFAULT_TABLE`]) when it is
//! absent:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS `idempotency_keys` (
//!     `key`            VARBINARY(1024) NOT NULL,   -- the key, compared byte for byte
//!     state            VARCHAR(7) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
//!                                                  -- 'pending', 'done' or 'claimed'
//!     token            BINARY(16) NOT NULL,        -- fences the reservation
//!     fingerprint      VARBINARY(64) NOT NULL,     -- 32 bytes of SHA-256
//!     outcome          JSON NULL,                  -- the kept outcome, once done
//!     expires_at       DATETIME(6) NOT NULL,       -- UTC: end of the lease, or of the ttl
//!     first_attempt_at DATETIME(6) NULL,           -- UTC: when the first attempt began
//!     unknown_delivery TINYINT AS (IFNULL(state = 'done' AND
//!         JSON_UNQUOTE(JSON_EXTRACT(outcome, '$.failed.category')) = 'unknown', 0)) STORED,
//!     PRIMARY KEY (`key`),
//!     INDEX expires_at_idx (expires_at),
//!     INDEX unknown_idx (unknown_delivery, expires_at, `key`)
//! ) ENGINE = InnoDB
//! ```
//!
//! `unknown_delivery` (a generated column the server keeps) and its index serve the listing
//! of [`StoreAdmin`](super::admin::StoreAdmin); neither server has partial indexes.
//! The table holds the key, state, token, fingerprint and outcome only: no message content. A
//! `claimed` row is a key claimed in the caller's own transaction ([`MySqlStore::claim_in`]);
//! a reserve of the same message takes it. The outcome is the JSON of the stored form in
//! [`store::record`](super::record) (version 1).
//!
//! # How each operation runs
//!
//! Every expiry is decided by the server's clock, `UTC_TIMESTAMP(6)`, never the client's;
//! UTC, so neither a session's `time_zone` nor a daylight-saving change moves an expiry (the
//! columns are `DATETIME` in UTC, not `TIMESTAMP`, which ends in 2038 on MySQL). Each single
//! operation is autocommit statements, at most a few, each fenced on its own so that no
//! interleaving lets two holders in:
//!
//! - `reserve` first runs `INSERT IGNORE`: a key with no row (what most sends find) is taken
//!   by that plain insert. When a row is there it reads it (`SELECT`, no lock): a live row,
//!   or a kept outcome, answers the reserve with nothing written. A row that can be taken (it
//!   expired, or it is a claim of the same message) is taken by an `UPDATE … WHERE token =
//!   <the token read>` and the condition again: a compare-and-set, so of racing reserves
//!   exactly one takes it, and the one that did knows which row it replaced (a pending row
//!   past its lease answers [`TakenOver`](super::Reservation::TakenOver)). A reserve whose
//!   row changed between its statements asks again (at most three times).
//! - `complete` is `UPDATE … WHERE key = ? AND (token = ? OR expires_at <= now)`, then, when
//!   no row was there, `INSERT IGNORE` of the done row: a stale owner never overwrites a new
//!   owner's record.
//! - `release` is `DELETE … WHERE key = ? AND token = ? AND state = 'pending'`; `extend` and
//!   `retake` one `UPDATE` each, fenced the same way as PostgreSQL's.
//!
//! The batch operations take as many round trips whatever the number of keys:
//! `reserve_many` is one multi-row `INSERT IGNORE` (in key order) and one `SELECT … WHERE key
//! IN (…)`; rows it finds takeable go through the single reserve's compare-and-set.
//! `complete_many` and `release_many` run in one `READ COMMITTED` transaction that locks the
//! rows in key order (`SELECT … ORDER BY key FOR UPDATE`), decides on the locked rows, and
//! writes them with one statement (`UPDATE … CASE`, `DELETE … IN`, and an `INSERT IGNORE` for
//! keys with no row). Overlapping batches therefore wait for each other instead of
//! deadlocking; a deadlock the server still reports fails the call as
//! [`Unavailable`](super::StoreErrorKind::Unavailable), and the layer retries a settlement.
//! The keys of one call must be distinct: a repeated key fails the call with an
//! [`InvalidInput`](super::StoreErrorKind::InvalidInput) error before any statement is sent.
//!
//! Whether an `UPDATE` wrote is read from the affected-row count. Without the
//! `CLIENT_FOUND_ROWS` flag (mysql_async's default) a matched row whose values stay the same
//! counts as unaffected; every fenced update here moves `expires_at` to a new `now()`, so only
//! a repeat of the same call within one microsecond could be miscounted. With the flag, the
//! count is exact. `INSERT IGNORE` counts the same either way.
//!
//! Every operation, including the wait for a pooled connection, is bounded by a timeout
//! ([`DEFAULT_TIMEOUT`]) and fails with a [`Timeout`](super::StoreErrorKind::Timeout) error. A
//! row that does not decode or breaks the [record rules](super::record#the-record-rules) is
//! a [`Corrupt`](super::StoreErrorKind::Corrupt) error, never a panic. Keys longer than
//! 1,024 bytes are refused with [`InvalidInput`](super::StoreErrorKind::InvalidInput)
//! before any statement is sent (the layer's keys are at most 256 bytes).
//!
//! # MySQL 8 and MariaDB
//!
//! The statements use only what both servers run the same way, and avoid what differs:
//! `RETURNING` (MariaDB only), `VALUES()` in `ON DUPLICATE KEY UPDATE` (deprecated by MySQL
//! 8.0.20) and the row alias that replaces it (MySQL only), `CREATE INDEX IF NOT EXISTS`
//! (MariaDB only), and `ON DUPLICATE KEY UPDATE` itself, whose affected-row count depends on
//! `CLIENT_FOUND_ROWS`. `JSON` is a checked `LONGTEXT` on MariaDB and a binary type on MySQL;
//! the store reads either as JSON text. The tests run against MariaDB (10.11 on our
//! machines); MySQL 8 is not run here, so everything this page says of the statements'
//! behaviour, the claims through mysql_async and sqlx, and the counts of
//! [`claim_statement`](MySqlStore::claim_statement) under either `CLIENT_FOUND_ROWS`
//! setting was checked on MariaDB only. [`claim_statement`](MySqlStore::claim_statement) is
//! the one statement here with `ON DUPLICATE KEY UPDATE`: a driver runs one statement, and
//! its count is documented there.
//!
//! # Expired rows
//!
//! An expired row is dead to the protocol at once, but stays on disk until a reserve takes
//! the key again or a purge deletes it: call [`MySqlStore::purge_expired`] from a scheduled
//! job, or let [`MySqlStore::spawn_purge`] run it. Purge rarely (hourly): a reserve after a
//! purge can no longer report a takeover.
//!
//! # Guarantee
//!
//! At-least-once with deduplication, not exactly-once, as for every store: two sends under
//! one key never both hold it while its lease runs; a crash after the provider took a
//! message but before its outcome was kept lets it go again after the lease, unless the
//! provider deduplicates on the forwarded `Idempotency-Key` header.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{
    Conn, DEFAULT_POOL_CONSTRAINTS, IsolationLevel, Opts, OptsBuilder, Pool, PoolConstraints, Row,
    TxOpts, Value,
};
use uuid::Uuid;

use super::millis::millis;
use super::sql::SqlOperations;
use super::{StoreError, StoreErrorKind, Token};

mod admin;
mod claim;
mod ops;
mod purge;
mod row;
mod sql;
#[cfg(feature = "sqlx")]
pub(crate) mod sqlx;

pub use purge::PurgeTask;
pub use sql::InvalidTableName;

use sql::Table;

/// The table a [`MySqlStore`] uses unless told otherwise.
pub const DEFAULT_TABLE: &str = "idempotency_keys";

/// The default bound on each store operation, including the wait for a pooled connection.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// The most connections [`MySqlStore::connect`]'s pool keeps, unless the URL says otherwise.
pub const DEFAULT_POOL_MAX: usize = 16;

/// How long [`MySqlStore::connect`]'s pool keeps a connection open while nothing uses it.
pub const DEFAULT_POOL_IDLE: Duration = Duration::from_secs(60);

/// No connection kept open once idle for [`DEFAULT_POOL_IDLE`], at most [`DEFAULT_POOL_MAX`].
const STORE_POOL_CONSTRAINTS: PoolConstraints = match PoolConstraints::new(0, DEFAULT_POOL_MAX) {
    Some(constraints) => constraints,
    None => DEFAULT_POOL_CONSTRAINTS,
};

/// The default number of rows one purge statement deletes.
pub const DEFAULT_PURGE_BATCH: u32 = 1_000;

/// DDL waits for metadata locks: a `migrate` given much less could fail for no good reason.
const MIN_MIGRATE_TIMEOUT: Duration = Duration::from_secs(30);

/// A duration as the microseconds of an SQL `INTERVAL`, bounded as [`millis`] bounds it.
fn micros(duration: Duration) -> i64 {
    millis(duration) * 1000
}

/// A token as the table keeps it.
fn token_bytes(token: Token) -> Value {
    Value::Bytes(Uuid::from(token).as_bytes().to_vec())
}

/// An idempotency store on a MySQL 8 or MariaDB 10.6+ table, reached through a
/// `mysql_async` pool.
///
/// Clones share the pool. See the [module docs](self) for the schema, the statements and the
/// differences between the servers.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_idempotency::store::{Reservation, Store};
/// use tower_idempotency::{Fingerprint, MySqlStore};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MySqlStore::connect("mysql://app@db.internal/app")
///     .await?
///     .table("idempotency_keys")?
///     .timeout(Duration::from_secs(1));
/// store.migrate().await?;
/// // Deletes expired rows every ten minutes until `purge` is dropped.
/// let purge = store.spawn_purge(Duration::from_secs(600))?;
///
/// let fingerprint = Fingerprint::from_bytes([7; 32]);
/// match store.reserve("welcome:42", fingerprint, Duration::from_secs(600)).await? {
///     Reservation::Reserved { token } => { /* send, then complete or release */ }
///     Reservation::Held { record } => { /* in flight, or replay record.outcome */ }
///     _ => { /* taken over from a crashed holder, or an answer of a later release */ }
/// }
/// # drop(purge);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MySqlStore {
    pool: Pool,
    table: Arc<Table>,
    timeout: Duration,
    purge_batch: u32,
}

impl fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlStore")
            .field("table", &self.table.name)
            .field("timeout", &self.timeout)
            .field("purge_batch", &self.purge_batch)
            .finish_non_exhaustive()
    }
}

impl MySqlStore {
    /// A store on `pool` (mysql_async 0.37, see [Your driver](self#your-driver)), using the
    /// table [`DEFAULT_TABLE`]. The pool decides connections, TLS and size.
    pub fn new(pool: Pool) -> Self {
        Self {
            pool,
            // The default name passes the check (see the unit tests).
            table: Arc::new(Table::checked(DEFAULT_TABLE, None, DEFAULT_TABLE)),
            timeout: DEFAULT_TIMEOUT,
            purge_batch: DEFAULT_PURGE_BATCH,
        }
    }

    /// Connects to the server at `url` (`mysql://user:password@host:port/db?…`, with
    /// mysql_async's URL options), and checks that one connection opens.
    ///
    /// Unless the URL sets them, the pool:
    /// - keeps at most [`DEFAULT_POOL_MAX`] connections (`pool_min`/`pool_max`): mysql_async's
    ///   own default (up to 100 a pool) lets a few processes take all of a server's
    ///   connections (151 by default);
    /// - keeps a connection that comes back open for [`DEFAULT_POOL_IDLE`] of idleness
    ///   (`inactive_connection_ttl`): without an idle time, mysql_async keeps only `pool_min`
    ///   idle connections and closes the others as they come back, so each operation beyond
    ///   them would open a connection of its own;
    /// - does not reset a connection that comes back (`reset_connection`): the reset costs a
    ///   round trip and drops the connection's prepared statements, which the next operation
    ///   would prepare again. The store leaves nothing in a session to reset: no session
    ///   variable, no temporary table, and its transactions end before the connection goes
    ///   back (mysql_async rolls back one a timeout cut short).
    ///
    /// A pool of your own ([`new`](Self::new)) is used as you built it; the same three
    /// settings are worth giving it.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let opts = Opts::from_url(url)
            .map_err(|e| StoreError::misconfigured("invalid MySQL URL").with_source(e))?;
        let mut pool = opts.pool_opts().clone();
        if pool.constraints() == DEFAULT_POOL_CONSTRAINTS {
            pool = pool.with_constraints(STORE_POOL_CONSTRAINTS);
        }
        if !url_sets(url, "inactive_connection_ttl") {
            pool = pool.with_inactive_connection_ttl(DEFAULT_POOL_IDLE);
        }
        if !url_sets(url, "reset_connection") {
            pool = pool.with_reset_connection(false);
        }
        let store = Self::new(Pool::new(OptsBuilder::from_opts(opts).pool_opts(pool)));
        store
            .bounded(|| async { store.conn().await.map(drop) })
            .await?;
        Ok(store)
    }

    /// Uses the table `name` (`table` or `database.table`) instead of [`DEFAULT_TABLE`].
    ///
    /// The name is checked, never pasted into SQL as given: see [`InvalidTableName`].
    pub fn table(mut self, name: &str) -> Result<Self, InvalidTableName> {
        self.table = Arc::new(Table::new(name)?);
        Ok(self)
    }

    /// Bounds each operation, including the wait for a pooled connection (default
    /// [`DEFAULT_TIMEOUT`]). An operation that takes longer fails with a
    /// [`Timeout`](StoreErrorKind::Timeout) error; its statement may still finish on the
    /// server, which the protocol allows (a reserve nobody heard of expires with its lease).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets how many rows one purge statement deletes (default [`DEFAULT_PURGE_BATCH`];
    /// `0` counts as `1`). Smaller batches hold fewer locks at a time.
    #[must_use]
    pub fn purge_batch(mut self, rows: u32) -> Self {
        self.purge_batch = rows.max(1);
        self
    }

    /// The table name, as given.
    pub fn table_name(&self) -> &str {
        &self.table.name
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Creates the table with its indexes when it is absent (see the [module docs](self) for
    /// the schema). Safe to run from several processes at once.
    ///
    /// Bounded by the operation timeout, or 30 s if that is shorter.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let timeout = self.timeout.max(MIN_MIGRATE_TIMEOUT);
        let work = async {
            let mut conn = self.conn().await?;
            conn.query_drop(&self.table.sql.migrate)
                .await
                .map_err(|e| self.db_error(e))
        };
        tokio::time::timeout(timeout, work)
            .await
            .unwrap_or_else(|_| Err(StoreError::timeout()))
    }

    async fn conn(&self) -> Result<Conn, StoreError> {
        self.pool.get_conn().await.map_err(|e| {
            StoreError::new(
                StoreErrorKind::Unavailable,
                "could not get a MySQL connection",
            )
            .with_source(e)
        })
    }

    /// A transaction at `READ COMMITTED` on a pooled connection: no gap locks, so batches
    /// lock only the rows they name. Dropped unfinished, the pool rolls it back.
    async fn transaction(&self) -> Result<mysql_async::Transaction<'static>, StoreError> {
        let mut options = TxOpts::new();
        options.with_isolation_level(IsolationLevel::ReadCommitted);
        self.pool
            .start_transaction(options)
            .await
            .map_err(|e| self.db_error(e))
    }

    fn db_error(&self, error: mysql_async::Error) -> StoreError {
        let (kind, detail) = match &error {
            // ER_NO_SUCH_TABLE
            mysql_async::Error::Server(e) if e.code == 1146 => (
                StoreErrorKind::Unavailable,
                format!(
                    "table {:?} does not exist: run MySqlStore::migrate",
                    self.table.name
                ),
            ),
            // MariaDB's max_statement_time, MySQL's max_execution_time.
            mysql_async::Error::Server(e) if e.code == 1969 || e.code == 3024 => (
                StoreErrorKind::Timeout,
                "the server stopped the statement".to_owned(),
            ),
            _ => (StoreErrorKind::Unavailable, "MySQL failed".to_owned()),
        };
        StoreError::new(kind, detail).with_source(error)
    }

    /// Runs a statement that returns no rows; answers how many rows it changed.
    async fn write<Q: Queryable>(
        &self,
        conn: &mut Q,
        sql: &str,
        params: Vec<Value>,
    ) -> Result<u64, StoreError> {
        let result = conn
            .exec_iter(sql, params)
            .await
            .map_err(|e| self.db_error(e))?;
        let changed = result.affected_rows();
        result.drop_result().await.map_err(|e| self.db_error(e))?;
        Ok(changed)
    }

    async fn read<Q: Queryable>(
        &self,
        conn: &mut Q,
        sql: &str,
        params: Vec<Value>,
    ) -> Result<Vec<Row>, StoreError> {
        conn.exec(sql, params).await.map_err(|e| self.db_error(e))
    }
}

/// Whether the query of `url` names the option `name`, whatever its value.
fn url_sets(url: &str, name: &str) -> bool {
    url.split_once('?').is_some_and(|(_, query)| {
        query
            .split('&')
            .any(|pair| pair.split('=').next() == Some(name))
    })
}

/// Refuses a key longer than the table's column, which a server in a non-strict `sql_mode`
/// would truncate (two long keys becoming one).
fn check_key(key: &str) -> Result<(), StoreError> {
    if key.len() > sql::MAX_KEY_LEN {
        return Err(StoreError::new(
            StoreErrorKind::InvalidInput,
            format!(
                "a key of {} bytes: MySqlStore keeps keys of at most {} bytes",
                key.len(),
                sql::MAX_KEY_LEN
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::url_sets;

    #[test]
    fn a_pool_option_counts_as_set_only_when_the_urls_query_names_it() {
        let url = "mysql://app:pw@db/app?pool_max=4&reset_connection=true";
        assert!(url_sets(url, "reset_connection"));
        assert!(url_sets(url, "pool_max"));
        assert!(!url_sets(url, "inactive_connection_ttl"));
        assert!(!url_sets(
            "mysql://reset_connection@db/app",
            "reset_connection"
        ));
        assert!(!url_sets(
            "mysql://db/app?xreset_connection=1",
            "reset_connection"
        ));
    }
}
