//! The outbox's rows on PostgreSQL (feature `postgres`): tokio-postgres through a
//! deadpool-postgres pool, a `LISTEN` connection of the worker's own, and `enqueue` in the
//! caller's `GenericClient`.

use std::fmt;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use futures_util::StreamExt;
use futures_util::future::{Either, select};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, GenericClient, NoTls};
use uuid::Uuid;

use super::rows::{ClaimedRow, Mark, Row, Verdict};
use super::{Backend, DeadLetter, Enqueued, Outbox, stored};
use crate::message::Message;
use crate::store::postgres::{pool_from_url, pooled};
use crate::store::{StoreError, StoreErrorKind};

mod sql;
#[cfg(feature = "sqlx")]
mod sqlx;

use sql::OutboxSql;

/// An outbox table on PostgreSQL.
#[derive(Clone)]
pub(super) struct Postgres {
    pool: Pool,
    sql: Arc<OutboxSql>,
    /// Where the worker opens its `LISTEN` connection; `None`: polling only. Shared, as the
    /// settings are large and every clone of the outbox carries them.
    listen: Option<Arc<tokio_postgres::Config>>,
}

impl fmt::Debug for Postgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Postgres")
            .field("table", &self.sql.name)
            .field("listen", &self.listen.is_some())
            .finish_non_exhaustive()
    }
}

impl Outbox {
    /// An outbox on the PostgreSQL `pool`, table
    /// [`DEFAULT_OUTBOX_TABLE`](super::DEFAULT_OUTBOX_TABLE), polling only (a pool cannot
    /// `LISTEN`: see [`listen`](Self::listen)).
    pub fn new(pool: Pool) -> Self {
        Self::on(Backend::Postgres(Postgres::with_pool(pool)))
    }

    /// Lets workers of a PostgreSQL outbox open a `LISTEN` connection with `config` (no
    /// TLS), so an enqueue wakes an idle worker at once instead of at its next poll. A MySQL
    /// outbox has nothing to listen to and ignores it.
    #[must_use]
    pub fn listen(mut self, config: tokio_postgres::Config) -> Self {
        #[allow(irrefutable_let_patterns)] // with `mysql` off, PostgreSQL is the only backend
        if let Backend::Postgres(pg) = &mut self.backend {
            pg.listen = Some(Arc::new(config));
        }
        self
    }

    /// Writes `message` into a PostgreSQL outbox through `client`: pass the transaction that
    /// writes your business rows (`&tx` for a `tokio_postgres::Transaction`, `&*tx` for a
    /// `deadpool_postgres` one), so the message commits or rolls back with them. Workers are
    /// notified when it commits.
    ///
    /// # Errors
    /// [`InvalidInput`](StoreErrorKind::InvalidInput) for a message without an idempotency
    /// key (or scheduled before 1970); [`Unavailable`](StoreErrorKind::Unavailable) when the
    /// statement fails (then your transaction is aborted too, as PostgreSQL does);
    /// [`Misconfigured`](StoreErrorKind::Misconfigured) on an outbox of another database.
    pub async fn enqueue<C: GenericClient>(
        &self,
        client: &C,
        message: &Message,
    ) -> Result<Enqueued, StoreError> {
        let pg = self.postgres("enqueue")?;
        let stored = stored::encode(message)?;
        let key = message.idempotency_key().map(|k| k.as_str()).unwrap_or("");
        let rows = client
            .query(
                &pg.sql.enqueue,
                &[&key, &stored.as_str(), &pg.sql.channel.as_str()],
            )
            .await
            .map_err(|e| pg.db_error(e))?;
        match rows.first() {
            Some(row) => Ok(Enqueued::New(row.try_get(0).map_err(|e| pg.db_error(e))?)),
            None => Ok(Enqueued::AlreadyThere),
        }
    }

    /// The PostgreSQL backend, or why `operation` does not apply to this outbox.
    fn postgres(&self, operation: &str) -> Result<&Postgres, StoreError> {
        #[allow(unreachable_patterns)] // with `mysql` off, PostgreSQL is the only backend
        match &self.backend {
            Backend::Postgres(pg) => Ok(pg),
            _ => Err(StoreError::misconfigured(format!(
                "Outbox::{operation} writes to PostgreSQL, and this outbox is on {}",
                self.backend.database()
            ))),
        }
    }
}

impl Postgres {
    fn with_pool(pool: Pool) -> Self {
        Self {
            pool,
            // The default name passes the check (see the tests).
            sql: Arc::new(match OutboxSql::new(super::DEFAULT_OUTBOX_TABLE) {
                Ok(sql) => sql,
                Err(_) => unreachable!("the default outbox table name is valid"),
            }),
            listen: None,
        }
    }

    /// Connects to `url` without TLS, with a pool of deadpool's default size, and keeps the
    /// settings for the worker's `LISTEN`.
    pub(super) fn from_url(url: &str, timeout: Duration) -> Result<Self, StoreError> {
        let (pool, config) = pool_from_url(url, timeout)?;
        Ok(Self {
            listen: Some(Arc::new(config)),
            ..Self::with_pool(pool)
        })
    }

    pub(super) fn table(&self, name: &str) -> Result<Self, StoreError> {
        let sql = OutboxSql::new(name).map_err(|e| {
            StoreError::misconfigured(format!("invalid outbox table name: {e}")).with_source(e)
        })?;
        Ok(Self {
            sql: Arc::new(sql),
            ..self.clone()
        })
    }

    pub(super) fn name(&self) -> &str {
        &self.sql.name
    }

    pub(super) async fn ping(&self) -> Result<(), StoreError> {
        self.client().await.map(drop)
    }

    pub(super) async fn migrate(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .batch_execute(&self.sql.migrate)
            .await
            .map_err(|e| self.db_error(e))
    }

    pub(super) async fn lag_ms(&self) -> Result<Option<i64>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(&self.sql.lag, &[])
            .await
            .map_err(|e| self.db_error(e))?;
        row.try_get(0).map_err(|e| self.db_error(e))
    }

    pub(super) async fn counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(&self.sql.counts, &[])
            .await
            .map_err(|e| self.db_error(e))?;
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get(0).map_err(|e| self.db_error(e))?,
                    row.try_get(1).map_err(|e| self.db_error(e))?,
                ))
            })
            .collect()
    }

    pub(super) async fn dead_letters(&self, limit: u32) -> Result<Vec<DeadLetter>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(&self.sql.dead_letters, &[&i64::from(limit)])
            .await
            .map_err(|e| self.db_error(e))?;
        rows.iter()
            .map(|row| {
                Ok(DeadLetter {
                    id: row.try_get(0).map_err(|e| self.db_error(e))?,
                    key: row.try_get(1).map_err(|e| self.db_error(e))?,
                    attempts: row.try_get(2).map_err(|e| self.db_error(e))?,
                    last_error: row.try_get(3).map_err(|e| self.db_error(e))?,
                })
            })
            .collect()
    }

    pub(super) async fn requeue(&self, key: &str) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(&self.sql.requeue, &[&key, &self.sql.channel.as_str()])
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(!rows.is_empty())
    }

    /// Deletes at most `batch` done rows finished `older_ms` ago or more.
    pub(super) async fn purge(&self, older_ms: i64, batch: u32) -> Result<u64, StoreError> {
        let client = self.client().await?;
        client
            .execute(&self.sql.purge, &[&older_ms, &i64::from(batch)])
            .await
            .map_err(|e| self.db_error(e))
    }

    /// Claims up to `rows` waiting rows under `token` for `lease_ms`: one statement.
    pub(super) async fn claim(
        &self,
        token: Uuid,
        lease_ms: i64,
        rows: u32,
    ) -> Result<Vec<ClaimedRow>, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.sql.claim)
            .await
            .map_err(|e| self.db_error(e))?;
        let rows = client
            .query(&statement, &[&token, &lease_ms, &i64::from(rows)])
            .await
            .map_err(|e| self.db_error(e))?;
        rows.iter()
            .map(|row| {
                Ok(ClaimedRow {
                    id: row.try_get(0).map_err(|e| self.db_error(e))?,
                    message: row.try_get(1).map_err(|e| self.db_error(e))?,
                    attempts: row.try_get(2).map_err(|e| self.db_error(e))?,
                    waited_ms: row.try_get(3).map_err(|e| self.db_error(e))?,
                })
            })
            .collect()
    }

    /// Records `marks` in one statement; answers the claims it recorded.
    pub(super) async fn mark(&self, marks: &[Mark]) -> Result<Vec<(i64, Uuid)>, StoreError> {
        let mut ids = Vec::with_capacity(marks.len());
        let mut tokens = Vec::with_capacity(marks.len());
        let mut states = Vec::with_capacity(marks.len());
        let mut provider_ids = Vec::with_capacity(marks.len());
        let mut transports = Vec::with_capacity(marks.len());
        let mut errors = Vec::with_capacity(marks.len());
        let mut after_ms = Vec::with_capacity(marks.len());
        for Mark { row, verdict } in marks {
            ids.push(row.id);
            tokens.push(row.token);
            let (provider_id, transport) = match verdict {
                Verdict::Done(receipt) => {
                    (Some(receipt.id.as_str()), Some(receipt.transport.as_str()))
                }
                _ => (None, None),
            };
            states.push(verdict.state());
            provider_ids.push(provider_id);
            transports.push(transport);
            errors.push(verdict.last_error());
            after_ms.push(verdict.after_ms());
        }
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.sql.mark)
            .await
            .map_err(|e| self.db_error(e))?;
        let rows = client
            .query(
                &statement,
                &[
                    &ids,
                    &tokens,
                    &states,
                    &provider_ids,
                    &transports,
                    &errors,
                    &after_ms,
                ],
            )
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(rows
            .iter()
            .filter_map(|row| Some((row.try_get(0).ok()?, row.try_get(1).ok()?)))
            .collect())
    }

    /// Puts back `rows`, each fenced by its claim's token; answers how many went back.
    pub(super) async fn release(&self, rows: &[Row]) -> Result<u64, StoreError> {
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let tokens: Vec<Uuid> = rows.iter().map(|r| r.token).collect();
        let client = self.client().await?;
        client
            .execute(&self.sql.release, &[&ids, &tokens])
            .await
            .map_err(|e| self.db_error(e))
    }

    /// Starts the `LISTEN` task, when the outbox has a connection to open: it wakes the
    /// worker on every notification, and once when it starts listening (for what was
    /// enqueued meanwhile). When the connection fails the task ends, the worker keeps
    /// polling, and its next poll starts it again.
    pub(super) fn listen(&self, timeout: Duration, wake: &Arc<Notify>) -> Option<JoinHandle<()>> {
        let config = self.listen.clone()?;
        let listen = format!("LISTEN \"{}\"", self.sql.channel);
        let wake = Arc::clone(wake);
        Some(tokio::spawn(async move {
            let Ok(Ok((client, mut connection))) =
                tokio::time::timeout(timeout, config.connect(NoTls)).await
            else {
                tracing::debug!("outbox LISTEN connection failed; polling");
                return;
            };
            // Polling the connection drives it: the LISTEN statement and every notification.
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            let mut listening = pin!(client.batch_execute(&listen));
            loop {
                match select(listening.as_mut(), messages.next()).await {
                    Either::Left((Ok(()), _)) => break,
                    Either::Left((Err(_), _)) | Either::Right((None | Some(Err(_)), _)) => {
                        return;
                    }
                    Either::Right((Some(Ok(_)), _)) => {}
                }
            }
            wake.notify_one();
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(_) = message {
                    wake.notify_one();
                }
            }
        }))
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        pooled(&self.pool).await
    }

    fn db_error(&self, error: tokio_postgres::Error) -> StoreError {
        let detail = match error.code() {
            Some(code) if *code == tokio_postgres::error::SqlState::UNDEFINED_TABLE => format!(
                "outbox table {:?} does not exist: run Outbox::migrate",
                self.sql.name
            ),
            _ => "PostgreSQL failed".to_owned(),
        };
        StoreError::new(StoreErrorKind::Unavailable, detail).with_source(error)
    }
}
