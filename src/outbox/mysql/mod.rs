//! The outbox's rows on MySQL 8 and MariaDB 10.6+ (feature `mysql`): mysql_async through its
//! pool, `enqueue_mysql` in the caller's `Queryable`. No notifications: the worker polls.
//!
//! A claim is a short `READ COMMITTED` transaction: a `SELECT … FOR UPDATE SKIP LOCKED` of
//! the rows to take, then an `UPDATE` writing the lease on them (MySQL has no `RETURNING`,
//! and refuses a `LIMIT` in the subquery PostgreSQL's one statement uses). The marks of a
//! batch are one transaction too: the rows are locked in id order and their tokens read, and
//! one `UPDATE` writes the answers of the rows whose claim is still the worker's, so the
//! worker knows which it recorded.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::{FromValue, Queryable};
use mysql_async::{IsolationLevel, Pool, Row as DbRow, TxOpts, Value};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::rows::{ClaimedRow, Mark, Row, Verdict};
use super::{Backend, DeadLetter, Enqueued, Outbox, stored};
use crate::MySqlStore;
use crate::message::Message;
use crate::store::{StoreError, StoreErrorKind};

mod sql;
#[cfg(feature = "sqlx")]
mod sqlx;

use sql::OutboxSql;

/// An outbox table on MySQL or MariaDB.
#[derive(Clone)]
pub(super) struct MySql {
    pool: Pool,
    sql: Arc<OutboxSql>,
}

impl fmt::Debug for MySql {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySql")
            .field("table", &self.sql.name)
            .finish_non_exhaustive()
    }
}

/// A duration in milliseconds as the microseconds of an SQL `INTERVAL`.
fn micros(ms: i64) -> Value {
    Value::Int(ms.saturating_mul(1000))
}

fn token_bytes(token: Uuid) -> Value {
    Value::Bytes(token.as_bytes().to_vec())
}

impl Outbox {
    /// An outbox on the MySQL or MariaDB `pool` (mysql_async 0.37, as
    /// [`MySqlStore::new`]'s), table [`DEFAULT_OUTBOX_TABLE`](super::DEFAULT_OUTBOX_TABLE).
    /// Its workers poll: MySQL has no notifications (see
    /// [`Worker::poll_interval`](super::Worker::poll_interval)).
    pub fn mysql(pool: Pool) -> Self {
        Self::on(Backend::MySql(MySql::with_pool(pool)))
    }

    /// Writes `message` into a MySQL outbox through `conn` (mysql_async 0.37): pass the
    /// `Transaction` that writes your business rows, so the message commits or rolls back
    /// with them. Workers find it at their next poll once it is committed.
    ///
    /// ```no_run
    /// use mysql_async::TxOpts;
    /// use mysql_async::prelude::Queryable;
    /// use tower_idempotency::Message;
    /// use tower_idempotency::outbox::{Enqueued, Outbox};
    ///
    /// # async fn run(outbox: Outbox, alert: Message, pool: mysql_async::Pool)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.start_transaction(TxOpts::default()).await?;
    /// tx.exec_drop("UPDATE orders SET state = 'paid' WHERE id = ?", ("ord_1",)).await?;
    /// if let Enqueued::AlreadyThere = outbox.enqueue_mysql(&mut tx, &alert).await? {
    ///     // This event's message was enqueued before: nothing changed.
    /// }
    /// tx.commit().await?; // the order and its alert, together
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`InvalidInput`](StoreErrorKind::InvalidInput) for a message without an idempotency
    /// key (or scheduled before 1970); [`Unavailable`](StoreErrorKind::Unavailable) when the
    /// statement fails (your transaction is then yours to roll back);
    /// [`Misconfigured`](StoreErrorKind::Misconfigured) on an outbox of another database.
    pub async fn enqueue_mysql<Q: Queryable>(
        &self,
        conn: &mut Q,
        message: &Message,
    ) -> Result<Enqueued, StoreError> {
        #[allow(irrefutable_let_patterns)] // with `postgres` off, MySQL is the only backend
        let Backend::MySql(my) = &self.backend else {
            return Err(StoreError::misconfigured(format!(
                "Outbox::enqueue_mysql writes to MySQL, and this outbox is on {}",
                self.backend.database()
            )));
        };
        let stored = stored::encode(message)?;
        let key = message.idempotency_key().map(|k| k.as_str()).unwrap_or("");
        let result = conn
            .exec_iter(&my.sql.enqueue, vec![Value::from(key), Value::from(stored)])
            .await
            .map_err(|e| my.db_error(e))?;
        let inserted = result.affected_rows() == 1;
        let id = result.last_insert_id();
        result.drop_result().await.map_err(|e| my.db_error(e))?;
        match (inserted, id.map(i64::try_from)) {
            (true, Some(Ok(id))) => Ok(Enqueued::New(id)),
            (true, _) => Err(StoreError::corrupt(
                "MySQL inserted an outbox row and gave no id for it",
            )),
            (false, _) => Ok(Enqueued::AlreadyThere),
        }
    }
}

impl MySql {
    /// Connects as [`MySqlStore::connect`] does: its URL options, its bound on the pool, its
    /// check that a connection opens.
    pub(super) async fn connect(url: &str) -> Result<Self, StoreError> {
        let store = MySqlStore::connect(url).await?;
        Ok(Self::with_pool(store.pool().clone()))
    }

    fn with_pool(pool: Pool) -> Self {
        Self {
            pool,
            sql: Arc::new(OutboxSql::new(super::DEFAULT_OUTBOX_TABLE)),
        }
    }

    /// The outbox on the table `name`, checked by [`MySqlStore::table`]'s rules.
    pub(super) fn table(&self, name: &str) -> Result<Self, StoreError> {
        MySqlStore::new(self.pool.clone())
            .table(name)
            .map_err(|e| {
                StoreError::misconfigured(format!("invalid outbox table name: {e}")).with_source(e)
            })?;
        Ok(Self {
            pool: self.pool.clone(),
            sql: Arc::new(OutboxSql::new(name)),
        })
    }

    pub(super) fn name(&self) -> &str {
        &self.sql.name
    }

    pub(super) async fn ping(&self) -> Result<(), StoreError> {
        self.pool
            .get_conn()
            .await
            .map(drop)
            .map_err(|e| self.db_error(e))
    }

    pub(super) async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        conn.query_drop(&self.sql.migrate)
            .await
            .map_err(|e| self.db_error(e))
    }

    pub(super) async fn lag_ms(&self) -> Result<Option<i64>, StoreError> {
        let rows = self.read(&self.sql.lag, Vec::new()).await?;
        match rows.first() {
            Some(row) => self.column(row, 0, "lag"),
            None => Ok(None),
        }
    }

    pub(super) async fn counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        let rows = self.read(&self.sql.counts, Vec::new()).await?;
        rows.iter()
            .map(|row| Ok((self.column(row, 0, "state")?, self.column(row, 1, "count")?)))
            .collect()
    }

    pub(super) async fn dead_letters(&self, limit: u32) -> Result<Vec<DeadLetter>, StoreError> {
        let rows = self
            .read(&self.sql.dead_letters, vec![Value::from(limit)])
            .await?;
        rows.iter()
            .map(|row| {
                let key: Vec<u8> = self.column(row, 1, "key")?;
                Ok(DeadLetter {
                    id: self.column(row, 0, "id")?,
                    key: String::from_utf8(key).map_err(|e| {
                        StoreError::corrupt("an outbox row's key is not UTF-8").with_source(e)
                    })?,
                    attempts: self.column(row, 2, "attempts")?,
                    last_error: self.column(row, 3, "last error")?,
                })
            })
            .collect()
    }

    pub(super) async fn requeue(&self, key: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn().await?;
        let requeued = self
            .write(&mut conn, &self.sql.requeue, vec![Value::from(key)])
            .await?;
        Ok(requeued == 1)
    }

    /// Deletes at most `batch` done rows finished `older_ms` ago or more.
    pub(super) async fn purge(&self, older_ms: i64, batch: u32) -> Result<u64, StoreError> {
        let mut conn = self.conn().await?;
        self.write(
            &mut conn,
            &self.sql.purge,
            vec![micros(older_ms), batch.into()],
        )
        .await
    }

    /// Claims up to `rows` waiting rows under `token` for `lease_ms`: locks them, skipping
    /// rows another claim is locking, and writes the lease, in one short transaction.
    pub(super) async fn claim(
        &self,
        token: Uuid,
        lease_ms: i64,
        rows: u32,
    ) -> Result<Vec<ClaimedRow>, StoreError> {
        let mut tx = self.transaction().await?;
        let locked = tx
            .exec(&self.sql.claim_lock, vec![Value::from(rows)])
            .await
            .map_err(|e| self.db_error(e))?;
        let claimed = locked
            .iter()
            .map(|row| {
                let attempts: i64 = self.column(row, 2, "attempts")?;
                Ok(ClaimedRow {
                    id: self.column(row, 0, "id")?,
                    message: self.column(row, 1, "message")?,
                    attempts: i32::try_from(attempts).unwrap_or(i32::MAX),
                    waited_ms: self.column(row, 3, "wait")?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        if claimed.is_empty() {
            // Nothing locked: the transaction ends with its connection's return to the pool.
            return Ok(claimed);
        }
        let mut params = vec![token_bytes(token), micros(lease_ms)];
        params.extend(claimed.iter().map(|row| Value::from(row.id)));
        self.write(&mut tx, &self.sql.claim(claimed.len()), params)
            .await?;
        tx.commit().await.map_err(|e| self.db_error(e))?;
        Ok(claimed)
    }

    /// Records `marks` in one transaction: locks the rows, keeps those whose claim is still
    /// the mark's, and writes their answers with one statement. Answers the claims recorded.
    pub(super) async fn mark(&self, marks: &[Mark]) -> Result<Vec<(i64, Uuid)>, StoreError> {
        let mut tx = self.transaction().await?;
        let locked = tx
            .exec(
                self.sql.lock_claims(marks.len()),
                marks
                    .iter()
                    .map(|m| Value::from(m.row.id))
                    .collect::<Vec<_>>(),
            )
            .await
            .map_err(|e| self.db_error(e))?;
        let mut holders = Vec::with_capacity(locked.len());
        for row in &locked {
            let id: i64 = self.column(row, 0, "id")?;
            let token: Option<Vec<u8>> = self.column(row, 1, "claim token")?;
            if let Some(token) = token.and_then(|t| Uuid::from_slice(&t).ok()) {
                holders.push((id, token));
            }
        }
        holders.sort_unstable();
        let held: Vec<&Mark> = marks
            .iter()
            .filter(|m| holders.binary_search(&(m.row.id, m.row.token)).is_ok())
            .collect();
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let id = |m: &Mark| Value::from(m.row.id);
        let mut params = Vec::with_capacity(held.len() * 13);
        // One `CASE` per column, in the order of `OutboxSql::mark`: available_at (a wait for
        // a row put back), finished_at (whether it finished), state, provider id, transport,
        // last error.
        let columns: [&dyn Fn(&Mark) -> Value; 6] = [
            &|m| match &m.verdict {
                Verdict::Retry { .. } => micros(m.verdict.after_ms()),
                _ => Value::NULL,
            },
            &|m| Value::from(!matches!(m.verdict, Verdict::Retry { .. })),
            &|m| Value::from(m.verdict.state()),
            &|m| match &m.verdict {
                Verdict::Done(receipt) => Value::from(receipt.id.as_str()),
                _ => Value::NULL,
            },
            &|m| match &m.verdict {
                Verdict::Done(receipt) => Value::from(receipt.transport.as_str()),
                _ => Value::NULL,
            },
            &|m| Value::from(m.verdict.last_error()),
        ];
        for column in columns {
            for m in &held {
                params.push(id(m));
                params.push(column(m));
            }
        }
        params.extend(held.iter().map(|m| id(m)));
        self.write(&mut tx, &self.sql.mark(held.len()), params)
            .await?;
        tx.commit().await.map_err(|e| self.db_error(e))?;
        Ok(held.iter().map(|m| (m.row.id, m.row.token)).collect())
    }

    /// Puts back `rows`, each fenced by its claim's token; answers how many went back.
    pub(super) async fn release(&self, rows: &[Row]) -> Result<u64, StoreError> {
        if rows.is_empty() {
            return Ok(0);
        }
        let mut params: Vec<Value> = rows.iter().map(|r| Value::from(r.id)).collect();
        for row in rows {
            params.push(Value::from(row.id));
            params.push(token_bytes(row.token));
        }
        let mut conn = self.conn().await?;
        self.write(&mut conn, &self.sql.release(rows.len()), params)
            .await
    }

    /// Nothing wakes a MySQL outbox's worker: MySQL has no notifications, so it polls.
    pub(super) fn listen(&self, _timeout: Duration, _wake: &Arc<Notify>) -> Option<JoinHandle<()>> {
        None
    }

    async fn conn(&self) -> Result<mysql_async::Conn, StoreError> {
        self.pool.get_conn().await.map_err(|e| self.db_error(e))
    }

    /// A transaction at `READ COMMITTED` on a pooled connection: no gap locks, so a claim
    /// locks only the rows it takes. Dropped unfinished, the pool rolls it back.
    async fn transaction(&self) -> Result<mysql_async::Transaction<'static>, StoreError> {
        let mut options = TxOpts::new();
        options.with_isolation_level(IsolationLevel::ReadCommitted);
        self.pool
            .start_transaction(options)
            .await
            .map_err(|e| self.db_error(e))
    }

    async fn read(&self, sql: &str, params: Vec<Value>) -> Result<Vec<DbRow>, StoreError> {
        let mut conn = self.conn().await?;
        conn.exec(sql, params).await.map_err(|e| self.db_error(e))
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

    /// Column `at` of `row`, of type `T` (an `Option` for a nullable column).
    fn column<T: FromValue>(&self, row: &DbRow, at: usize, what: &str) -> Result<T, StoreError> {
        let corrupt = || {
            StoreError::corrupt(format!(
                "a row of outbox table {:?} has no readable {what}",
                self.sql.name
            ))
        };
        match row.get_opt::<T, usize>(at) {
            Some(Ok(value)) => Ok(value),
            Some(Err(e)) => Err(corrupt().with_source(e)),
            None => Err(corrupt()),
        }
    }

    fn db_error(&self, error: mysql_async::Error) -> StoreError {
        let (kind, detail) = match &error {
            // ER_NO_SUCH_TABLE
            mysql_async::Error::Server(e) if e.code == 1146 => (
                StoreErrorKind::Unavailable,
                format!(
                    "outbox table {:?} does not exist: run Outbox::migrate",
                    self.sql.name
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
}
