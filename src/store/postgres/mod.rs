//! [`PostgresStore`] (feature `postgres`): keys in a PostgreSQL table, shared by every process
//! that uses the table.
//!
//! # Your driver
//!
//! The store runs on tokio-postgres 0.7 through a deadpool-postgres 0.14 pool. Where you hand
//! it your own, [`PostgresStore::new`] takes a `deadpool_postgres::Pool` and
//! [`PostgresStore::claim_in`] a `tokio_postgres::GenericClient`: add those crates at the same
//! versions to your dependencies (`deadpool-postgres = "0.14"`, `tokio-postgres = "0.7"`), so
//! your types are the store's. [`PostgresStore::connect`] needs neither.
//!
//! # Schema
//!
//! [`PostgresStore::migrate`] creates the table (default name [`DEFAULT_TABLE`]) and its
//! index when they are absent:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "idempotency_keys" (
//!     key         text        PRIMARY KEY,
//!     state       text        NOT NULL,      -- 'pending', 'done' or 'claimed'
//!     token       uuid        NOT NULL,      -- fences the reservation
//!     fingerprint bytea       NOT NULL,      -- 32 bytes of SHA-256
//!     outcome     jsonb,                     -- the kept outcome, once done
//!     expires_at  timestamptz NOT NULL,      -- end of the lease, or of the ttl once done
//!     first_attempt_at timestamptz           -- when the first attempt under the key began
//! );
//! CREATE INDEX IF NOT EXISTS "idempotency_keys_expires_at_idx"
//!     ON "idempotency_keys" (expires_at);
//! CREATE INDEX IF NOT EXISTS "idempotency_keys_unknown_idx"
//!     ON "idempotency_keys" (expires_at, key)
//!     WHERE state = 'done' AND (outcome -> 'failed' ->> 'category') = 'unknown';
//! ```
//!
//! The second index (a partial one: rows of unknown delivery only, so it stays small) serves
//! the listing of [`StoreAdmin`](super::admin::StoreAdmin).
//!
//! `first_attempt_at` (by the server's `now()`) serves re-sends inside the provider's window
//! ([`Store::retake`](super::Store::retake)) and takeovers that check first. It is NULL
//! where the first attempt is unknown: a claim not yet taken, or a row completed after its
//! own pending row was gone; such a row is never re-sent.
//!
//! The table holds the key, state, token, fingerprint and outcome only: no message content.
//! A `claimed` row is a key claimed in the caller's own transaction
//! ([`PostgresStore::claim_in`], claim-then-send): a reserve of the same message takes it.
//! The outcome is the JSON of the stored form in [`store::record`](super::record) (version 1).
//! Run the migration from a deploy step or at start-up; it takes an advisory lock, so several
//! processes may run it at once.
//!
//! # How each operation runs
//!
//! Each operation, single or batch, is **one autocommit statement**, so one round trip once
//! prepared (a reserve that finds a row there takes two, three when it takes the row), meant for the default `READ
//! COMMITTED` isolation, and every expiry is decided by the server's `now()`, never by the
//! client's clock:
//!
//! - `reserve` first tries `INSERT … ON CONFLICT (key) DO NOTHING`: a key with no row (what
//!   most sends find) is taken by that plain insert, the cheapest statement that can take
//!   it. When a row is there, that insert neither writes nor locks it, and the reserve reads
//!   the row with a plain `SELECT`: a live row, or a kept outcome, answers the reserve (a
//!   repeat) with nothing written and nothing locked (a row lock would be a WAL record and
//!   a commit to disk per repeat). A row that can be taken, and only such a row, goes on to
//!   one `INSERT … ON CONFLICT (key) DO UPDATE … WHERE` the row expired (or is a claim of
//!   the same message): it writes only a row it takes, so a reserve that finds the key
//!   held by then writes no new row version and answers that row as its snapshot saw it (a
//!   CTE of the same statement). An `ON CONFLICT` update locks
//!   the latest version of the row, so of any number of racing reserves exactly one takes
//!   the key; a reserve whose key changed between its snapshot and its upsert gets no row
//!   back and asks again (at most three statements). A reserve that took over a pending row
//!   past its lease answers [`TakenOver`](super::Reservation::TakenOver) with it. Such rows
//!   stay until [`purge_expired`](PostgresStore::purge_expired) deletes them; a reserve after
//!   the purge answers `Reserved`, so purge rarely (hourly) to keep takeovers reported.
//!   `reserve_many` reports takeovers as `Reserved`.
//! - `retake` is `UPDATE … SET state = 'pending', token = $2 … WHERE` the row is done, live,
//!   of the fingerprint, of unknown delivery, and `first_attempt_at > now() - window`.
//! - `complete` is an upsert whose `DO UPDATE` applies only `WHERE token = $token OR
//!   expires_at <= now()`, so a stale owner never overwrites a new owner's record.
//! - `release` is `DELETE … WHERE key = $1 AND token = $2 AND state = 'pending'`.
//! - `extend` is `UPDATE … SET expires_at = now() + lease WHERE key = $1 AND token = $2 AND
//!   state = 'pending' AND expires_at > now()`: only the holder moves its lease, and a row
//!   whose lease passed (dead, though still on disk until purged) is never revived.
//!
//! The batch operations are one statement each too, whatever the number of keys: the keys,
//! tokens, fingerprints (and outcomes) travel as arrays and `unnest` turns them back into
//! rows, so every row gets exactly the single operation's treatment:
//!
//! - `reserve_many` is the reserve statement over `SELECT … FROM unnest($1::text[],
//!   $2::uuid[], $3::bytea[]) ORDER BY key`, returning the key with each row: like the single
//!   reserve it writes only the rows it takes and answers held keys from its snapshot, and
//!   asks again for the keys that changed under it. The rows are matched back to the
//!   requests by key; an entry whose row does not decode is a
//!   [`Corrupt`](super::StoreErrorKind::Corrupt) error for that entry alone.
//! - `complete_many` is the complete upsert over `unnest`, with the same token-or-expired
//!   `WHERE`; `RETURNING key` names the rows it wrote.
//! - `release_many` locks the matching pending rows (`JOIN unnest … FOR UPDATE`) and deletes
//!   them, returning their keys.
//!
//! Every batch takes its row locks in key order (`ORDER BY key`), so overlapping batches
//! running at once wait for each other instead of deadlocking. The keys of one call must be
//! distinct: a repeated key fails the call with an
//! [`InvalidInput`](super::StoreErrorKind::InvalidInput) error before any statement is sent. An empty call sends nothing. A failed batch statement
//! (a timeout included) fails the whole call; keys it may have reserved free themselves when
//! their lease ends, as with a single reserve that timed out.
//!
//! Statements are prepared once per pooled connection (deadpool's statement cache). Every
//! operation, including the wait for a pooled connection, is bounded by a timeout
//! ([`DEFAULT_TIMEOUT`]) and fails with a [`Timeout`](super::StoreErrorKind::Timeout) error.
//! A row that does not decode (unknown state, an outcome that is not a kept
//! [`Outcome`](crate::outcome::Outcome), a fingerprint that is not 32 bytes) or breaks the
//! [record rules](super::record#the-record-rules) (a pending row with an outcome, a done row
//! without, a failure of category `delivered`: the same damage every store reports) is
//! reported as a [`Corrupt`](super::StoreErrorKind::Corrupt) error, never a panic.
//!
//! Keys are stored as given. The layer's key rules (at most 256 bytes, no control characters)
//! keep them well inside what PostgreSQL accepts; called directly, a key with a NUL byte or
//! longer than the index allows (about 2,700 bytes) fails as
//! [`Unavailable`](super::StoreErrorKind::Unavailable).
//!
//! Broken connections (a restarted server, `pg_terminate_backend`) fail the operations that
//! were using them with an [`Unavailable`](super::StoreErrorKind::Unavailable) error; the pool
//! drops them and later operations open new ones, with nothing to do on your side.
//!
//! # Settling a key by hand
//!
//! [`StoreAdmin`](super::admin::StoreAdmin): `inspect` reads the row (with the time left by
//! `now()`); `forget` and `resolve` are one statement each that locks the row (`FOR
//! UPDATE`), decides on the locked version whether a live send holds it (pending or claimed,
//! within its lease) and deletes or updates it; a resolved row keeps its fingerprint and
//! gets a new token. `list` merges two ordered, limited scans: done rows of unknown delivery
//! (the partial index) and pending rows whose lease passed (the index on `expires_at`; they
//! linger until purged), by `(expires_at, key)` after the cursor. An expired claim is not
//! listed: its message was never sent.
//!
//! # Expired rows
//!
//! An expired row is dead to the protocol at once (every statement compares `expires_at` with
//! `now()`), but it stays on disk until a reserve takes the key again or a purge deletes it.
//! Call [`PostgresStore::purge_expired`] from a scheduled job, or let
//! [`PostgresStore::spawn_purge`] run it in the background.
//!
//! # Guarantee
//!
//! At-least-once with deduplication, not exactly-once. Two sends under one key never both
//! hold it while its lease runs, in one process or many. If a process crashes after the
//! provider took a message but before the outcome was kept, the key frees itself when the
//! lease ends and a retry sends again, unless the provider also deduplicates on the forwarded
//! `Idempotency-Key` header. The server's isolation level should stay `READ COMMITTED` (the
//! default): under `SERIALIZABLE`, racing reserves may fail with serialization errors (they
//! fail as [`Unavailable`](super::StoreErrorKind::Unavailable), never as a double send).
//!
//! # Failover
//!
//! PostgreSQL replicates asynchronously by default: a commit returns before any standby has
//! it. A failover to a standby that had not received the last commits loses them, and with
//! them the reservations and outcomes they held: a repeat of such a message sends again.
//! Name the standby in `synchronous_standby_names` (with `synchronous_commit = on`, the
//! default, or `remote_apply`) and every write of the store waits for it: a reservation the
//! standby did not confirm within the store's [`timeout`](PostgresStore::timeout) fails, and
//! the layer sends nothing; each write costs a round trip to the standby, and with no
//! standby connected every send fails until one is back (or the setting is cleared).
//! `tests/failover.rs` shows both on a primary and a standby of its own.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

// `millis` is imported here so the submodules name it `super::millis`.
use super::millis::millis;
use super::sql::SqlOperations;
use super::{StoreError, StoreErrorKind};

mod admin;
mod claim;
mod ops;
mod purge;
mod row;
pub(crate) mod sql;
#[cfg(feature = "sqlx")]
pub(crate) mod sqlx;

pub use purge::PurgeTask;
pub use sql::InvalidTableName;

use sql::Table;

/// The table a [`PostgresStore`] uses unless told otherwise.
pub const DEFAULT_TABLE: &str = "idempotency_keys";

/// The default bound on each store operation, including the wait for a pooled connection.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// The default number of rows one purge statement deletes.
pub const DEFAULT_PURGE_BATCH: u32 = 1_000;

/// The `application_name` [`PostgresStore::connect`] sets when the URL names none, so the
/// store's sessions are easy to find in `pg_stat_activity`.
pub const DEFAULT_APPLICATION_NAME: &str = "tower-idempotency";

/// A `migrate` given much less time than this could fail on a busy server for no good
/// reason; DDL waits for locks.
const MIN_MIGRATE_TIMEOUT: Duration = Duration::from_secs(30);

/// An idempotency store on a PostgreSQL table, reached through a `deadpool-postgres` pool.
///
/// Clones share the pool. See the [module docs](self) for the schema, the statements and the
/// guarantee.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_idempotency::store::{Reservation, Store};
/// use tower_idempotency::{Fingerprint, PostgresStore};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PostgresStore::connect("postgres://app@db.internal/app")
///     .await?
///     .table("idempotency.keys")?
///     .timeout(Duration::from_secs(1));
/// store.migrate().await?;
/// // Deletes expired rows every ten minutes until `purge` is dropped.
/// let purge = store.spawn_purge(Duration::from_secs(600))?;
///
/// let fingerprint = Fingerprint::from_bytes([7; 32]);
/// let reservation = store.reserve("welcome:42", fingerprint, Duration::from_secs(600)).await?;
/// // `token()` says whether we hold the key: `Reserved`, or `TakenOver` from a holder that
/// // crashed (which the layer may check with the provider first).
/// if let Some(token) = reservation.token() {
///     /* send, then complete or release under `token` */
/// } else if let Reservation::Held { record } = reservation {
///     /* in flight, or replay record.outcome */
/// }
/// # drop(purge);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    table: Arc<Table>,
    timeout: Duration,
    purge_batch: u32,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.table.name)
            .field("timeout", &self.timeout)
            .field("purge_batch", &self.purge_batch)
            .field("pool", &self.pool.status())
            .finish()
    }
}

impl PostgresStore {
    /// A store on `pool` (deadpool-postgres 0.14, see [Your driver](self#your-driver)),
    /// using the table [`DEFAULT_TABLE`].
    ///
    /// The pool decides connections, TLS and size. Prefer a manager with
    /// [`RecyclingMethod::Fast`] (deadpool's default): every statement here fails cleanly on
    /// a broken connection, and the pool then drops it.
    pub fn new(pool: Pool) -> Self {
        Self {
            pool,
            // The default name passes the check (see the unit tests).
            table: Arc::new(Table::checked(DEFAULT_TABLE, None, DEFAULT_TABLE)),
            timeout: DEFAULT_TIMEOUT,
            purge_batch: DEFAULT_PURGE_BATCH,
        }
    }

    /// Connects to the server at `url` (`postgres://user:password@host:port/db?…`) without
    /// TLS, with a pool of deadpool's default size, and checks that one connection opens.
    ///
    /// Sets `application_name` to [`DEFAULT_APPLICATION_NAME`] and the connect timeout to the
    /// operation timeout when the URL sets neither. For TLS or another pool size, build a
    /// pool and use [`new`](Self::new).
    ///
    /// Fails with an [`Unavailable`](StoreErrorKind::Unavailable) error naming the address
    /// and the cause when the first connection fails, a [`Timeout`](StoreErrorKind::Timeout)
    /// naming the address when it does not open within the timeout, and a
    /// [`Misconfigured`](StoreErrorKind::Misconfigured) error for a URL that is not one.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let (pool, config) = pool_from_url(url, DEFAULT_TIMEOUT)?;
        let store = Self::new(pool);
        let first = store
            .bounded(|| async { store.client().await.map(drop) })
            .await;
        if let Err(error) = first {
            // The URL may hold a password: name the address only.
            let ports = config.get_ports();
            let address = config
                .get_hosts()
                .iter()
                .enumerate()
                .map(|(i, host)| {
                    // One port serves every host; none is PostgreSQL's.
                    let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                    match host {
                        tokio_postgres::config::Host::Tcp(host) => format!("{host}:{port}"),
                        #[cfg(unix)]
                        tokio_postgres::config::Host::Unix(dir) => {
                            format!("{}/.s.PGSQL.{port}", dir.display())
                        }
                    }
                })
                .collect::<Vec<_>>()
                .join(", ");
            let detail = match error.kind() {
                StoreErrorKind::Timeout => {
                    format!("PostgreSQL at {address} did not answer within {DEFAULT_TIMEOUT:?}")
                }
                _ => format!("cannot connect to PostgreSQL at {address}"),
            };
            return Err(StoreError { detail, ..error });
        }
        Ok(store)
    }

    /// Uses the table `name` (`table` or `schema.table`) instead of [`DEFAULT_TABLE`].
    ///
    /// The name is checked, never pasted into SQL as given: see [`InvalidTableName`].
    pub fn table(mut self, name: &str) -> Result<Self, InvalidTableName> {
        self.table = Arc::new(Table::new(name)?);
        Ok(self)
    }

    /// Bounds each operation, including the wait for a pooled connection (default
    /// [`DEFAULT_TIMEOUT`]). An operation that takes longer fails with a
    /// [`Timeout`](StoreErrorKind::Timeout) error; the statement may still finish on the
    /// server, which the protocol allows (a reserve nobody heard of expires with its lease).
    ///
    /// The bound includes opening a connection when the pool has none ready: deadpool opens
    /// it inside the waiting call. After a failover or `pg_terminate_backend` every call may
    /// have to open one, so keep the timeout well above connection setup under load (the
    /// default 2 s is); with a shorter one, calls can keep timing out while the pool refills.
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

    /// Creates the table and its index on `expires_at` when they are absent (see the
    /// [module docs](self) for the schema). Safe to run from several processes at once.
    ///
    /// Bounded by the operation timeout, or 30 s if that is shorter.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let timeout = self.timeout.max(MIN_MIGRATE_TIMEOUT);
        let work = async {
            let client = self.client().await?;
            client
                .batch_execute(&self.table.sql.migrate)
                .await
                .map_err(|e| self.db_error(e))
        };
        tokio::time::timeout(timeout, work)
            .await
            .unwrap_or_else(|_| Err(StoreError::timeout()))
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        pooled(&self.pool).await
    }

    fn db_error(&self, error: tokio_postgres::Error) -> StoreError {
        let (kind, detail) = match error.code() {
            Some(code) if *code == SqlState::UNDEFINED_TABLE => (
                StoreErrorKind::Unavailable,
                format!(
                    "table {:?} does not exist: run PostgresStore::migrate",
                    self.table.name
                ),
            ),
            Some(code) if *code == SqlState::QUERY_CANCELED => (
                StoreErrorKind::Timeout,
                "the server cancelled the statement".to_owned(),
            ),
            _ => (StoreErrorKind::Unavailable, "PostgreSQL failed".to_owned()),
        };
        StoreError::new(kind, detail).with_source(error)
    }
}

/// A connection from `pool`: a pool timeout is a [`Timeout`](StoreErrorKind::Timeout), any
/// other failure [`Unavailable`](StoreErrorKind::Unavailable). Shared with the outbox.
pub(crate) async fn pooled(pool: &Pool) -> Result<deadpool_postgres::Client, StoreError> {
    pool.get().await.map_err(|e| match e {
        PoolError::Timeout(_) => StoreError::timeout().with_source(e),
        e => StoreError::new(
            StoreErrorKind::Unavailable,
            "could not get a PostgreSQL connection",
        )
        .with_source(e),
    })
}

/// A pool on `url` without TLS, of deadpool's default size, recycling connections the fast
/// way, with `application_name` and the connect timeout set when the URL sets neither; and
/// the connection settings, for a connection of one's own (the outbox's `LISTEN`).
pub(crate) fn pool_from_url(
    url: &str,
    connect_timeout: Duration,
) -> Result<(Pool, tokio_postgres::Config), StoreError> {
    let mut config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| StoreError::misconfigured("invalid PostgreSQL URL").with_source(e))?;
    if config.get_application_name().is_none() {
        config.application_name(DEFAULT_APPLICATION_NAME);
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(connect_timeout);
    }
    let manager = Manager::from_config(
        config.clone(),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager).build().map_err(|e| {
        StoreError::new(StoreErrorKind::Unavailable, "could not build the pool").with_source(e)
    })?;
    Ok((pool, config))
}
