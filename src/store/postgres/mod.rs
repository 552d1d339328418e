//! [`PostgresStore`] (feature `postgres`): keys in a PostgreSQL table, shared by every process
//! that uses the table.
//!
//! # Schema
//!
//! [`PostgresStore::migrate`] creates the table (default name [`DEFAULT_TABLE`]) and its
//! index when they are absent:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "idempotency_keys" (
//!     key         text        PRIMARY KEY,
//!     state       text        NOT NULL,      -- 'pending' or 'done'
//!     token       uuid        NOT NULL,      -- fences the reservation
//!     fingerprint bytea       NOT NULL,      -- 32 bytes of SHA-256
//!     outcome     jsonb,                     -- the kept outcome, once done
//!     expires_at  timestamptz NOT NULL       -- end of the lease, or of the ttl once done
//! );
//! CREATE INDEX IF NOT EXISTS "idempotency_keys_expires_at_idx"
//!     ON "idempotency_keys" (expires_at);
//! ```
//!
//! The table holds the key, state, token, fingerprint and outcome only: no message content.
//! Run the migration from a deploy step or at start-up; it takes an advisory lock, so several
//! processes may run it at once.
//!
//! # How each operation runs
//!
//! Each operation, single or batch, is **one autocommit statement**, so one round trip once
//! prepared, meant for the default `READ COMMITTED` isolation, and every expiry is decided by
//! the server's `now()`, never by the client's clock:
//!
//! - `reserve` is one `INSERT … ON CONFLICT (key) DO UPDATE` whose `SET` keeps the live row
//!   as it is and replaces an expired one with the new reservation. An `ON CONFLICT` update
//!   always locks the latest version of the row and always returns it, so of any number of
//!   racing reserves exactly one finds its own new token in the answer (it reserved) and the
//!   others find the winner's row (held). No retry loop is needed. The price: a reserve that
//!   finds the key held rewrites the row unchanged (a cheap HOT update).
//! - `complete` is an upsert whose `DO UPDATE` applies only `WHERE token = $token OR
//!   expires_at <= now()`, so a stale owner never overwrites a new owner's record.
//! - `release` is `DELETE … WHERE key = $1 AND token = $2 AND state = 'pending'`.
//!
//! The batch operations are one statement each too, whatever the number of keys: the keys,
//! tokens, fingerprints (and outcomes) travel as arrays and `unnest` turns them back into
//! rows, so every row gets exactly the single operation's treatment:
//!
//! - `reserve_many` is the reserve upsert over `SELECT … FROM unnest($1::text[], $2::uuid[],
//!   $3::bytea[]) ORDER BY key`, returning the key with each row. The rows are matched back to
//!   the requests by key; an entry whose row does not decode is a
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
//! A row that does not decode (unknown state, an outcome that is not a kept [`Outcome`], a
//! done row without an outcome, a fingerprint that is not 32 bytes) is reported as a
//! [`Corrupt`](super::StoreErrorKind::Corrupt) error, never a panic.
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

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod};
use futures_util::future::BoxFuture;
use tokio_postgres::error::SqlState;
use tokio_postgres::{NoTls, Row};
use uuid::Uuid;

use super::{
    Completion, Record, RecordState, Reservation, Store, StoreError, StoreErrorKind, Token, record,
};
use crate::fingerprint::Fingerprint;
use crate::outcome::Outcome;

pub use deadpool_postgres;

/// The table a [`PostgresStore`] uses unless told otherwise.
pub const DEFAULT_TABLE: &str = "idempotency_keys";

/// The default bound on each store operation, including the wait for a pooled connection.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// The default number of rows one purge statement deletes.
pub const DEFAULT_PURGE_BATCH: u32 = 1_000;

/// The `application_name` [`PostgresStore::connect`] sets when the URL names none, so the
/// store's sessions are easy to find in `pg_stat_activity`.
pub const DEFAULT_APPLICATION_NAME: &str = "tower-idempotency";

/// The longest lease or ttl written: a century, far enough to mean "never" while staying
/// within PostgreSQL's interval and timestamp range.
const FOREVER_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

/// PostgreSQL's limit on identifier length, in bytes.
const MAX_IDENTIFIER_LEN: usize = 63;

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
/// use tower_idempotency::{Fingerprint, store::{PostgresStore, Reservation, Store}};
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
/// match store.reserve("welcome:42", fingerprint, Duration::from_secs(600)).await? {
///     Reservation::Reserved { token } => { /* send, then complete or release */ }
///     Reservation::Held { record } => { /* in flight, or replay record.outcome */ }
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

/// A validated table name and the statements that use it.
struct Table {
    name: String,
    sql: Sql,
}

struct Sql {
    migrate: String,
    reserve: String,
    complete: String,
    release: String,
    reserve_many: String,
    complete_many: String,
    release_many: String,
    purge: String,
}

impl Table {
    fn new(name: &str) -> Result<Self, InvalidTableName> {
        let invalid = |reason| InvalidTableName {
            name: name.to_owned(),
            reason,
        };
        let mut parts = name.split('.');
        let (schema, table) = match (parts.next(), parts.next(), parts.next()) {
            (Some(table), None, _) => (None, table),
            (Some(schema), Some(table), None) => (Some(schema), table),
            _ => return Err(invalid("at most one dot, between schema and table")),
        };
        for part in schema.iter().chain([&table]) {
            check_identifier(part).map_err(invalid)?;
        }
        Ok(Self::checked(name, schema, table))
    }

    /// The statements for a name whose parts passed [`check_identifier`].
    fn checked(name: &str, schema: Option<&str>, table: &str) -> Self {
        // Names are checked to need no escaping; quoting still keeps keywords such as
        // `user` or `order` usable as table names.
        let quoted = match schema {
            Some(schema) => format!("\"{schema}\".\"{table}\""),
            None => format!("\"{table}\""),
        };
        // An index lives in its table's schema, so its name is never qualified. PostgreSQL
        // truncates names over 63 bytes, the same way every time.
        let index = format!("\"{table}_expires_at_idx\"");
        let sql = Sql {
            migrate: format!(
                "SELECT pg_advisory_xact_lock(hashtext('tower_idempotency.migrate'));
                 CREATE TABLE IF NOT EXISTS {quoted} (
                     key text PRIMARY KEY,
                     state text NOT NULL,
                     token uuid NOT NULL,
                     fingerprint bytea NOT NULL,
                     outcome jsonb,
                     expires_at timestamptz NOT NULL
                 );
                 CREATE INDEX IF NOT EXISTS {index} ON {quoted} (expires_at);"
            ),
            // Every SET expression sees the row as it was before this statement, so the live
            // row is written back unchanged and an expired one becomes the new reservation.
            reserve: format!(
                "INSERT INTO {quoted} AS r (key, state, token, fingerprint, outcome, expires_at)
                 VALUES ($1, 'pending', $2, $3, NULL, now() + $4::bigint * interval '1 millisecond')
                 ON CONFLICT (key) DO UPDATE SET
                     state = CASE WHEN r.expires_at <= now() THEN excluded.state ELSE r.state END,
                     token = CASE WHEN r.expires_at <= now() THEN excluded.token ELSE r.token END,
                     fingerprint = CASE WHEN r.expires_at <= now()
                         THEN excluded.fingerprint ELSE r.fingerprint END,
                     outcome = CASE WHEN r.expires_at <= now() THEN NULL ELSE r.outcome END,
                     expires_at = CASE WHEN r.expires_at <= now()
                         THEN excluded.expires_at ELSE r.expires_at END
                 RETURNING r.state, r.token, r.fingerprint, r.outcome::text"
            ),
            complete: format!(
                "INSERT INTO {quoted} AS r (key, state, token, fingerprint, outcome, expires_at)
                 VALUES ($1, 'done', $2, $3, $4::text::jsonb,
                         now() + $5::bigint * interval '1 millisecond')
                 ON CONFLICT (key) DO UPDATE SET
                     state = excluded.state, token = excluded.token,
                     fingerprint = excluded.fingerprint, outcome = excluded.outcome,
                     expires_at = excluded.expires_at
                 WHERE r.token = excluded.token OR r.expires_at <= now()"
            ),
            release: format!(
                "DELETE FROM {quoted} WHERE key = $1 AND token = $2 AND state = 'pending'"
            ),
            // The batch statements feed the single statements' logic from arrays, one row per
            // key. `ORDER BY key` makes every batch lock its rows in one global order, so
            // overlapping batches wait on each other instead of deadlocking.
            reserve_many: format!(
                "INSERT INTO {quoted} AS r (key, state, token, fingerprint, outcome, expires_at)
                 SELECT i.key, 'pending', i.token, i.fingerprint, NULL,
                        now() + $4::bigint * interval '1 millisecond'
                 FROM unnest($1::text[], $2::uuid[], $3::bytea[]) AS i(key, token, fingerprint)
                 ORDER BY i.key
                 ON CONFLICT (key) DO UPDATE SET
                     state = CASE WHEN r.expires_at <= now() THEN excluded.state ELSE r.state END,
                     token = CASE WHEN r.expires_at <= now() THEN excluded.token ELSE r.token END,
                     fingerprint = CASE WHEN r.expires_at <= now()
                         THEN excluded.fingerprint ELSE r.fingerprint END,
                     outcome = CASE WHEN r.expires_at <= now() THEN NULL ELSE r.outcome END,
                     expires_at = CASE WHEN r.expires_at <= now()
                         THEN excluded.expires_at ELSE r.expires_at END
                 RETURNING r.state, r.token, r.fingerprint, r.outcome::text, r.key"
            ),
            // Rows the WHERE leaves alone are not returned: the keys returned were written.
            complete_many: format!(
                "INSERT INTO {quoted} AS r (key, state, token, fingerprint, outcome, expires_at)
                 SELECT i.key, 'done', i.token, i.fingerprint, i.outcome::jsonb,
                        now() + $5::bigint * interval '1 millisecond'
                 FROM unnest($1::text[], $2::uuid[], $3::bytea[], $4::text[])
                     AS i(key, token, fingerprint, outcome)
                 ORDER BY i.key
                 ON CONFLICT (key) DO UPDATE SET
                     state = excluded.state, token = excluded.token,
                     fingerprint = excluded.fingerprint, outcome = excluded.outcome,
                     expires_at = excluded.expires_at
                 WHERE r.token = excluded.token OR r.expires_at <= now()
                 RETURNING r.key"
            ),
            // A DELETE cannot be ordered, so the rows are first locked in key order (a locking
            // SELECT locks in its ORDER BY order, and under READ COMMITTED rechecks the token
            // and state on a row changed meanwhile); the DELETE then only meets rows it holds.
            release_many: format!(
                "WITH doomed AS MATERIALIZED (
                     SELECT r.key, r.token FROM {quoted} AS r
                     JOIN unnest($1::text[], $2::uuid[]) AS i(key, token)
                         ON r.key = i.key AND r.token = i.token AND r.state = 'pending'
                     ORDER BY r.key
                     FOR UPDATE OF r
                 )
                 DELETE FROM {quoted} AS r USING doomed AS d
                 WHERE r.key = d.key AND r.token = d.token AND r.state = 'pending'
                 RETURNING r.key"
            ),
            // SKIP LOCKED keeps concurrent purges (and reserves of those keys) from waiting
            // on each other; the outer condition is checked again on the row as it is when
            // deleted, so a key taken again meanwhile is never purged.
            purge: format!(
                "DELETE FROM {quoted} WHERE ctid = ANY(ARRAY(
                     SELECT ctid FROM {quoted} WHERE expires_at <= now()
                     LIMIT $1::bigint FOR UPDATE SKIP LOCKED))
                 AND expires_at <= now()"
            ),
        };
        Self {
            name: name.to_owned(),
            sql,
        }
    }
}

fn check_identifier(part: &str) -> Result<(), &'static str> {
    let mut chars = part.chars();
    match chars.next() {
        None => return Err("empty name"),
        Some(c) if !(c.is_ascii_lowercase() || c == '_') => {
            return Err("a name starts with a lowercase ASCII letter or an underscore");
        }
        Some(_) => {}
    }
    if !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
        return Err("a name holds lowercase ASCII letters, digits and underscores only");
    }
    if part.len() > MAX_IDENTIFIER_LEN {
        return Err("a name is at most 63 bytes long");
    }
    Ok(())
}

/// A table name [`PostgresStore::table`] refused.
///
/// A name is `table` or `schema.table`, each part of lowercase ASCII letters, digits and
/// underscores, starting with a letter or underscore, at most 63 bytes: a name PostgreSQL
/// would fold to the same thing quoted or not, and one that cannot carry SQL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidTableName {
    name: String,
    reason: &'static str,
}

impl InvalidTableName {
    /// The name that was refused.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Why it was refused.
    pub fn reason(&self) -> &str {
        self.reason
    }
}

impl fmt::Display for InvalidTableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid table name {:?}: {}", self.name, self.reason)
    }
}

impl std::error::Error for InvalidTableName {}

impl PostgresStore {
    /// A store on `pool`, using the table [`DEFAULT_TABLE`].
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
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            StoreError::new(StoreErrorKind::Unavailable, "invalid PostgreSQL URL").with_source(e)
        })?;
        if config.get_application_name().is_none() {
            config.application_name(DEFAULT_APPLICATION_NAME);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_TIMEOUT);
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager).build().map_err(|e| {
            StoreError::new(StoreErrorKind::Unavailable, "could not build the pool").with_source(e)
        })?;
        let store = Self::new(pool);
        store
            .bounded(async { store.client().await.map(drop) })
            .await?;
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

    /// Deletes every expired row, in statements of at most
    /// [`purge_batch`](Self::purge_batch) rows, until a statement finds fewer; answers how
    /// many rows went. Live rows are never touched. Each statement is bounded by the
    /// operation timeout.
    pub async fn purge_expired(&self) -> Result<u64, StoreError> {
        let batch = u64::from(self.purge_batch);
        let mut purged = 0;
        loop {
            let deleted = self
                .bounded(async {
                    let client = self.client().await?;
                    let statement = client
                        .prepare_cached(&self.table.sql.purge)
                        .await
                        .map_err(|e| self.db_error(e))?;
                    client
                        .execute(&statement, &[&i64::from(self.purge_batch)])
                        .await
                        .map_err(|e| self.db_error(e))
                })
                .await?;
            purged += deleted;
            if deleted < batch {
                return Ok(purged);
            }
        }
    }

    /// Runs [`purge_expired`](Self::purge_expired) now and then every `every` (at least
    /// 1 ms) on the current Tokio runtime, until the returned [`PurgeTask`] is dropped or
    /// aborted. A failed purge is logged with `tracing::warn!` and tried again next time.
    ///
    /// Fails when called outside a Tokio runtime.
    pub fn spawn_purge(&self, every: Duration) -> Result<PurgeTask, StoreError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            StoreError::new(
                StoreErrorKind::Unavailable,
                "spawn_purge must be called within a Tokio runtime",
            )
            .with_source(e)
        })?;
        let store = self.clone();
        let every = every.max(Duration::from_millis(1));
        let handle = runtime.spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                match store.purge_expired().await {
                    Ok(0) => {}
                    Ok(purged) => tracing::debug!(
                        table = %store.table.name,
                        purged,
                        "purged expired idempotency keys"
                    ),
                    Err(error) => tracing::warn!(
                        table = %store.table.name,
                        error = %error,
                        "purging expired idempotency keys failed"
                    ),
                }
            }
        });
        Ok(PurgeTask { handle })
    }

    /// Runs `work` within the operation timeout.
    async fn bounded<T>(
        &self,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, work)
            .await
            .unwrap_or_else(|_| Err(StoreError::timeout()))
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool.get().await.map_err(|e| match e {
            PoolError::Timeout(_) => StoreError::timeout().with_source(e),
            e => StoreError::new(
                StoreErrorKind::Unavailable,
                "could not get a PostgreSQL connection",
            )
            .with_source(e),
        })
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

    fn corrupt(&self, what: &str) -> StoreError {
        StoreError::corrupt(format!("a row of table {:?} {what}", self.table.name))
    }

    /// Decodes a row of (state, token, fingerprint, outcome text).
    fn record(&self, row: &Row) -> Result<Record, StoreError> {
        let state: &str = row
            .try_get(0)
            .map_err(|e| self.corrupt("has no readable state").with_source(e))?;
        let fingerprint: &[u8] = row
            .try_get(2)
            .map_err(|e| self.corrupt("has no readable fingerprint").with_source(e))?;
        let fingerprint = <[u8; 32]>::try_from(fingerprint)
            .map(Fingerprint::from_bytes)
            .map_err(|_| self.corrupt("has a fingerprint that is not 32 bytes"))?;
        let outcome: Option<&str> = row
            .try_get(3)
            .map_err(|e| self.corrupt("has no readable outcome").with_source(e))?;
        let (state, outcome) = match (state, outcome) {
            ("pending", None) => (RecordState::Pending, None),
            ("pending", Some(_)) => return Err(self.corrupt("is pending with an outcome")),
            ("done", Some(json)) => {
                let outcome = record::decode_outcome(json.as_bytes())
                    .map_err(|e| self.corrupt("holds an unreadable outcome").with_source(e))?;
                (RecordState::Done, Some(outcome))
            }
            ("done", None) => return Err(self.corrupt("is done without an outcome")),
            (_, _) => return Err(self.corrupt("has an unknown state")),
        };
        Ok(Record {
            state,
            fingerprint,
            outcome,
        })
    }

    async fn try_reserve(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.reserve)
            .await
            .map_err(|e| self.db_error(e))?;
        let token = Token::new();
        let fingerprint = &fingerprint.as_bytes()[..];
        let row = client
            .query_opt(
                &statement,
                &[&key, token.as_uuid(), &fingerprint, &millis(lease)],
            )
            .await
            .map_err(|e| self.db_error(e))?
            .ok_or_else(|| {
                StoreError::new(StoreErrorKind::Unavailable, "reserve answered no row")
            })?;
        self.reservation(&row, token)
    }

    /// What a reserve found, from the row it returned: ours when it holds our `token`.
    fn reservation(&self, row: &Row, token: Token) -> Result<Reservation, StoreError> {
        let holder: Uuid = row
            .try_get(1)
            .map_err(|e| self.corrupt("has no readable token").with_source(e))?;
        if holder == *token.as_uuid() {
            return Ok(Reservation::Reserved { token });
        }
        self.record(row).map(|record| Reservation::Held { record })
    }

    /// Where the key a batch statement returned in `column` was asked, marking it answered.
    ///
    /// A key nobody asked for, or one returned twice, means the answer cannot be matched to
    /// the requests, so the whole call fails rather than guess.
    fn position(
        &self,
        positions: &HashMap<&str, usize>,
        row: &Row,
        column: usize,
        answered: &mut [bool],
    ) -> Result<usize, StoreError> {
        let mismatch = |detail: &str| {
            StoreError::new(
                StoreErrorKind::Unavailable,
                format!("a batch statement on table {:?} {detail}", self.table.name),
            )
        };
        let key: &str = row
            .try_get(column)
            .map_err(|e| mismatch("answered a row without a readable key").with_source(e))?;
        let at = *positions
            .get(key)
            .ok_or_else(|| mismatch("answered a key that was not asked for"))?;
        if std::mem::replace(&mut answered[at], true) {
            return Err(mismatch("answered a key twice"));
        }
        Ok(at)
    }

    async fn try_reserve_many(
        &self,
        requests: &[(&str, Fingerprint)],
        lease: Duration,
    ) -> Result<Vec<Result<Reservation, StoreError>>, StoreError> {
        let positions = positions("reserve_many", requests.iter().map(|(key, _)| *key))?;
        let tokens: Vec<Token> = requests.iter().map(|_| Token::new()).collect();
        let keys: Vec<&str> = requests.iter().map(|(key, _)| *key).collect();
        let uuids: Vec<Uuid> = tokens.iter().map(|token| *token.as_uuid()).collect();
        let fingerprints: Vec<&[u8]> = requests
            .iter()
            .map(|(_, fingerprint)| &fingerprint.as_bytes()[..])
            .collect();
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.reserve_many)
            .await
            .map_err(|e| self.db_error(e))?;
        let rows = client
            .query(&statement, &[&keys, &uuids, &fingerprints, &millis(lease)])
            .await
            .map_err(|e| self.db_error(e))?;
        let mut answered = vec![false; requests.len()];
        let mut answers: Vec<Option<Result<Reservation, StoreError>>> =
            requests.iter().map(|_| None).collect();
        for row in &rows {
            let at = self.position(&positions, row, 4, &mut answered)?;
            answers[at] = Some(self.reservation(row, tokens[at]));
        }
        Ok(answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(StoreError::new(
                        StoreErrorKind::Unavailable,
                        "reserve_many answered no row for this key",
                    ))
                })
            })
            .collect())
    }

    async fn try_complete(
        &self,
        key: &str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let outcome = record::outcome_json(outcome)?;
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.complete)
            .await
            .map_err(|e| self.db_error(e))?;
        let fingerprint = &fingerprint.as_bytes()[..];
        let written = client
            .execute(
                &statement,
                &[&key, token.as_uuid(), &fingerprint, &outcome, &millis(ttl)],
            )
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(written > 0)
    }

    async fn try_complete_many(
        &self,
        completions: &[Completion<'_>],
        ttl: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        let positions = positions("complete_many", completions.iter().map(|c| c.key))?;
        let outcomes = completions
            .iter()
            .map(|c| record::outcome_json(c.outcome))
            .collect::<Result<Vec<String>, _>>()?;
        let keys: Vec<&str> = completions.iter().map(|c| c.key).collect();
        let uuids: Vec<Uuid> = completions.iter().map(|c| *c.token.as_uuid()).collect();
        let fingerprints: Vec<&[u8]> = completions
            .iter()
            .map(|c| &c.fingerprint.as_bytes()[..])
            .collect();
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.complete_many)
            .await
            .map_err(|e| self.db_error(e))?;
        let rows = client
            .query(
                &statement,
                &[&keys, &uuids, &fingerprints, &outcomes, &millis(ttl)],
            )
            .await
            .map_err(|e| self.db_error(e))?;
        let mut written = vec![false; completions.len()];
        for row in &rows {
            self.position(&positions, row, 0, &mut written)?;
        }
        Ok(written)
    }

    async fn try_release_many(&self, releases: &[(&str, Token)]) -> Result<Vec<bool>, StoreError> {
        let positions = positions("release_many", releases.iter().map(|(key, _)| *key))?;
        let keys: Vec<&str> = releases.iter().map(|(key, _)| *key).collect();
        let uuids: Vec<Uuid> = releases.iter().map(|(_, token)| *token.as_uuid()).collect();
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.release_many)
            .await
            .map_err(|e| self.db_error(e))?;
        let rows = client
            .query(&statement, &[&keys, &uuids])
            .await
            .map_err(|e| self.db_error(e))?;
        let mut deleted = vec![false; releases.len()];
        for row in &rows {
            self.position(&positions, row, 0, &mut deleted)?;
        }
        Ok(deleted)
    }

    async fn try_release(&self, key: &str, token: Token) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.release)
            .await
            .map_err(|e| self.db_error(e))?;
        let deleted = client
            .execute(&statement, &[&key, token.as_uuid()])
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(deleted > 0)
    }
}

/// The position of each key of a batch call; refuses a key given twice, which one statement
/// could not answer for separately (and PostgreSQL would refuse to upsert twice).
fn positions<'k>(
    operation: &str,
    keys: impl Iterator<Item = &'k str>,
) -> Result<HashMap<&'k str, usize>, StoreError> {
    let mut positions = HashMap::new();
    for (at, key) in keys.enumerate() {
        if let Some(first) = positions.insert(key, at) {
            return Err(StoreError::new(
                StoreErrorKind::InvalidInput,
                format!(
                    "{operation} was given one key at positions {first} and {at}: \
                     the keys of one call must be distinct"
                ),
            ));
        }
    }
    Ok(positions)
}

/// A duration as whole milliseconds for an interval, rounded up so a short lease never
/// becomes none, and capped at a century so no duration overflows the server's arithmetic.
fn millis(duration: Duration) -> i64 {
    let ms = duration.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX).min(FOREVER_MS)
}

impl Store for PostgresStore {
    fn reserve<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        Box::pin(self.bounded(self.try_reserve(key, fingerprint, lease)))
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.bounded(self.try_complete(key, token, fingerprint, outcome, ttl)))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.bounded(self.try_release(key, token)))
    }

    fn reserve_many<'a>(
        &'a self,
        requests: &'a [(&'a str, Fingerprint)],
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<Result<Reservation, StoreError>>, StoreError>> {
        Box::pin(async move {
            if requests.is_empty() {
                return Ok(Vec::new());
            }
            self.bounded(self.try_reserve_many(requests, lease)).await
        })
    }

    fn complete_many<'a>(
        &'a self,
        completions: &'a [Completion<'a>],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(async move {
            if completions.is_empty() {
                return Ok(Vec::new());
            }
            self.bounded(self.try_complete_many(completions, ttl)).await
        })
    }

    fn release_many<'a>(
        &'a self,
        releases: &'a [(&'a str, Token)],
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(async move {
            if releases.is_empty() {
                return Ok(Vec::new());
            }
            self.bounded(self.try_release_many(releases)).await
        })
    }
}

/// The background purge started by [`PostgresStore::spawn_purge`]; dropping it stops the
/// task.
#[derive(Debug)]
pub struct PurgeTask {
    handle: tokio::task::JoinHandle<()>,
}

impl PurgeTask {
    /// Stops the task (as dropping the handle does).
    pub fn abort(&self) {
        self.handle.abort();
    }

    /// Whether the task has stopped.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

impl Drop for PurgeTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_table_name_is_valid() {
        assert!(Table::new(DEFAULT_TABLE).is_ok());
    }

    #[test]
    fn table_names_are_plain_or_schema_qualified_identifiers() {
        for good in [
            "keys",
            "_keys",
            "app.idempotency_keys",
            "k1",
            &"a".repeat(63),
        ] {
            assert!(Table::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            ".",
            "a.",
            ".a",
            "a.b.c",
            "Keys",
            "1keys",
            "keys; DROP TABLE users",
            "keys\"",
            "ke ys",
            "kéys",
            &"a".repeat(64),
        ] {
            let error = Table::new(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(error.name(), bad);
        }
    }

    #[test]
    fn durations_become_bounded_milliseconds() {
        assert_eq!(millis(Duration::ZERO), 0);
        assert_eq!(millis(Duration::from_nanos(1)), 1);
        assert_eq!(millis(Duration::from_millis(300)), 300);
        assert_eq!(millis(Duration::MAX), FOREVER_MS);
        assert_eq!(millis(Duration::from_secs(u64::MAX / 2)), FOREVER_MS);
    }
}
