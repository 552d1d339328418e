//! The transactional outbox on PostgreSQL (feature `postgres`): commit a message with your
//! business rows, and let a [`Worker`] send it.
//!
//! [`Outbox::enqueue`] writes the message into the outbox table **inside a transaction you
//! already hold**, so the alert commits or rolls back with the order it is about. A
//! [`Worker`] (any number of them, on any number of machines) drains the table and sends each
//! message through the `Service<Message>` stack you give it, usually the
//! [`IdempotencyLayer`](crate::IdempotencyLayer) stack of the README:
//!
//! - it claims waiting rows with `FOR UPDATE SKIP LOCKED`, so workers never take the same
//!   row, under a **lease** (`claimed_until`) rather than an open transaction: a worker that
//!   dies frees its rows when the lease passes, and no transaction stays open during a send;
//! - it sends the rows it claimed concurrently, up to its
//!   [`concurrency`](Worker::concurrency) ([`DEFAULT_CONCURRENCY`] by default), so one
//!   worker keeps pace with a provider that takes a while to answer, and records their
//!   answers in batches, each row fenced by the token of the claim that took it;
//! - a receipt marks the row `done` with the provider's id;
//! - a retryable failure puts the row back with a jittered exponential backoff, or the
//!   provider's `Retry-After` when longer; after [`max_attempts`](Worker::max_attempts) it is
//!   `dead`, as is a message the provider refused for good (permanent, validation) or whose
//!   delivery is unknown (the idempotency layer keeps its key: settle it by hand), with its
//!   last error;
//! - it wakes on `LISTEN`/`NOTIFY` (every enqueue notifies when its transaction commits),
//!   with polling as the fallback;
//! - told to stop, it lets the sends in flight answer and records them, and puts back the
//!   rows it claimed but did not hand to the stack.
//!
//! # The guarantee
//!
//! At least once, by construction: the worker will be killed mid-flight sooner or later, and
//! a row whose worker died is sent again when its lease passes. Put the
//! [`IdempotencyLayer`](crate::IdempotencyLayer) in the worker's stack, with a shared store:
//! the repeat of a message the provider already took is then answered from the layer's store
//! (or, for a crash between the provider's answer and the layer's record, by the provider's
//! own `Idempotency-Key` window). Every row is keyed: `enqueue` refuses a message without an
//! idempotency key, and a second `enqueue` of a key changes nothing.
//!
//! # Message content
//!
//! **The outbox holds message content by nature**: addresses, subjects, bodies and
//! attachments, as JSON in the `message` column (see the stored form below), until the row
//! is purged. Grant access to the table accordingly, and purge done rows with
//! [`Outbox::purge_done`] on a retention you choose. The crate never writes message content
//! to logs: its events name the row id only.
//!
//! # Schema
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "idempotency_outbox" (
//!     id            bigserial   PRIMARY KEY,
//!     key           text        NOT NULL UNIQUE,      -- the message's idempotency key
//!     message       jsonb       NOT NULL,             -- the stored form, version 1
//!     state         text        NOT NULL DEFAULT 'waiting', -- waiting, done or dead
//!     attempts      integer     NOT NULL DEFAULT 0,
//!     available_at  timestamptz NOT NULL DEFAULT now(), -- not before: backoff
//!     claim_token   uuid,                             -- the worker's claim, fencing its writes
//!     claimed_until timestamptz,                      -- the claim's lease
//!     enqueued_at   timestamptz NOT NULL DEFAULT now(),
//!     finished_at   timestamptz,
//!     provider_id   text,                             -- the receipt's id, once done
//!     transport     text,
//!     last_error    text                              -- code and text, never content
//! );
//! ```
//!
//! The message's stored form is JSON with a version (`"v":1`), every field of a
//! [`Message`], attachment content in base64, pinned by a golden test.
//!
//! # Your driver
//!
//! As [`PostgresStore`](crate::PostgresStore), the outbox runs on tokio-postgres 0.7 through
//! a deadpool-postgres 0.14 pool: [`Outbox::new`] takes a `deadpool_postgres::Pool`,
//! [`Outbox::listen`] a `tokio_postgres::Config` and [`Outbox::enqueue`] a
//! `tokio_postgres::GenericClient`. Add those crates at the same versions to your
//! dependencies (`deadpool-postgres = "0.14"`, `tokio-postgres = "0.7"`) to hand them in;
//! [`Outbox::connect`] needs neither.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_idempotency::outbox::Outbox;
//! use tower_idempotency::store::postgres::PostgresStore;
//! use tower_idempotency::{BoxError, IdempotencyLayer, Message, Receipt};
//!
//! # async fn run() -> Result<(), BoxError> {
//! let url = "postgres://app@localhost/app";
//! let outbox = Outbox::connect(url).await?;
//! outbox.migrate().await?;
//!
//! // In the order's transaction:
//! let (mut client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
//! tokio::spawn(connection);
//! let tx = client.transaction().await?;
//! tx.execute("INSERT INTO orders (id) VALUES ($1)", &[&"ord_1"]).await?;
//! let alert = Message::builder()
//!     .from("orders@shop.example").to("seller@example.com")
//!     .subject("New order").text("ord_1 sold.")
//!     .idempotency_key("order.created:ord_1:email")
//!     .build()?;
//! outbox.enqueue(&tx, &alert).await?;
//! tx.commit().await?; // the order and its alert, together
//!
//! // In a worker process:
//! let store = PostgresStore::connect(url).await?;
//! let provider = tower::service_fn(|_m: Message| async { Ok::<_, BoxError>(Receipt::new("id", "fake")) });
//! let stack = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(store))
//!     .service(provider);
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let worker = tokio::spawn(outbox.worker(stack).run(async { let _ = stopped.await; }));
//! // … on shutdown:
//! let _ = stop.send(());
//! let stats = worker.await??;
//! # let _ = stats; Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_postgres::GenericClient;

use crate::message::Message;
use crate::store::postgres::InvalidTableName;
use crate::store::postgres::{pool_from_url, pooled};
use crate::store::{StoreError, StoreErrorKind};

mod drain;
mod rows;
mod sql;
#[cfg(feature = "sqlx")]
mod sqlx;
mod stored;
mod worker;

pub use worker::{
    DEFAULT_BATCH, DEFAULT_CLAIM_LEASE, DEFAULT_CONCURRENCY, DEFAULT_MAX_ATTEMPTS,
    DEFAULT_POLL_INTERVAL, Worker, WorkerStats, WorkerStatsHandle,
};

use sql::OutboxSql;

/// The table an [`Outbox`] uses unless told otherwise.
pub const DEFAULT_OUTBOX_TABLE: &str = "idempotency_outbox";

/// The default bound on each outbox statement.
pub const DEFAULT_OUTBOX_TIMEOUT: Duration = Duration::from_secs(5);

/// A PostgreSQL outbox table: [`enqueue`](Self::enqueue) in your transaction, drain with a
/// [`Worker`]. See the [module docs](self). Cheap to clone: clones share the pool.
#[derive(Clone)]
pub struct Outbox {
    pool: Pool,
    sql: Arc<OutboxSql>,
    /// Where the worker opens its `LISTEN` connection; `None`: polling only.
    listen: Option<tokio_postgres::Config>,
    timeout: Duration,
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("table", &self.sql.name)
            .field("listen", &self.listen.is_some())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What [`Outbox::enqueue`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Enqueued {
    /// A new row, with its id; it becomes visible to workers when the transaction commits.
    New(i64),
    /// A row under this key already exists (waiting, sent or dead): nothing changed.
    AlreadyThere,
}

/// How many rows are in each state; see [`Outbox::counts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxCounts {
    /// Waiting to be sent (including rows a worker holds right now, and rows in backoff).
    pub waiting: u64,
    /// Sent.
    pub done: u64,
    /// Given up: refused, of unknown delivery, or out of attempts.
    pub dead: u64,
}

/// A row in the dead-letter state; see [`Outbox::dead_letters`]. It carries no content.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The row id.
    pub id: i64,
    /// The message's idempotency key.
    pub key: String,
    /// How many attempts were made.
    pub attempts: i32,
    /// The last error's code and text.
    pub last_error: Option<String>,
}

impl Outbox {
    /// An outbox on `pool`, table [`DEFAULT_OUTBOX_TABLE`], polling only (a pool cannot
    /// `LISTEN`: see [`listen`](Self::listen)).
    pub fn new(pool: Pool) -> Self {
        Self {
            pool,
            // The default name passes the check (see the tests).
            sql: Arc::new(match OutboxSql::new(DEFAULT_OUTBOX_TABLE) {
                Ok(sql) => sql,
                Err(_) => unreachable!("the default outbox table name is valid"),
            }),
            listen: None,
            timeout: DEFAULT_OUTBOX_TIMEOUT,
        }
    }

    /// Connects to `url` without TLS, with a pool of deadpool's default size, checks that a
    /// connection opens, and lets workers `LISTEN` on the same server.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let (pool, config) = pool_from_url(url, DEFAULT_OUTBOX_TIMEOUT)?;
        let outbox = Self::new(pool).listen(config);
        outbox
            .bounded(async { outbox.client().await.map(drop) })
            .await?;
        Ok(outbox)
    }

    /// Lets workers open a `LISTEN` connection with `config` (no TLS), so an enqueue wakes an
    /// idle worker at once instead of at its next poll.
    #[must_use]
    pub fn listen(mut self, config: tokio_postgres::Config) -> Self {
        self.listen = Some(config);
        self
    }

    /// Uses the table `name` (`table` or `schema.table`, checked like
    /// [`PostgresStore::table`](crate::store::postgres::PostgresStore::table)).
    pub fn table(mut self, name: &str) -> Result<Self, InvalidTableName> {
        self.sql = Arc::new(OutboxSql::new(name)?);
        Ok(self)
    }

    /// Bounds each statement, including the wait for a pooled connection (default
    /// [`DEFAULT_OUTBOX_TIMEOUT`]).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The table name, as given.
    pub fn table_name(&self) -> &str {
        &self.sql.name
    }

    /// A worker that sends this outbox's messages through `service`; see [`Worker`].
    pub fn worker<S>(&self, service: S) -> Worker<S> {
        Worker::new(self.clone(), service)
    }

    /// Creates the table and its indexes when absent. Safe to run from several processes.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let work = async {
            let client = self.client().await?;
            client
                .batch_execute(&self.sql.migrate)
                .await
                .map_err(|e| self.db_error(e))
        };
        tokio::time::timeout(self.timeout.max(Duration::from_secs(30)), work)
            .await
            .unwrap_or_else(|_| Err(StoreError::timeout()))
    }

    /// Writes `message` into the outbox through `client`: pass the transaction that writes
    /// your business rows (`&tx` for a `tokio_postgres::Transaction`, `&*tx` for a
    /// `deadpool_postgres` one), so the message commits or rolls back with them. Workers are
    /// notified when it commits.
    ///
    /// # Errors
    /// [`InvalidInput`](StoreErrorKind::InvalidInput) for a message without an idempotency
    /// key (or scheduled before 1970); [`Unavailable`](StoreErrorKind::Unavailable) when the
    /// statement fails (then your transaction is aborted too, as PostgreSQL does).
    pub async fn enqueue<C: GenericClient>(
        &self,
        client: &C,
        message: &Message,
    ) -> Result<Enqueued, StoreError> {
        let stored = stored::encode(message)?;
        let key = message.idempotency_key().map(|k| k.as_str()).unwrap_or("");
        let rows = client
            .query(
                &self.sql.enqueue,
                &[&key, &stored.as_str(), &self.sql.channel.as_str()],
            )
            .await
            .map_err(|e| self.db_error(e))?;
        match rows.first() {
            Some(row) => Ok(Enqueued::New(row.try_get(0).map_err(|e| self.db_error(e))?)),
            None => Ok(Enqueued::AlreadyThere),
        }
    }

    /// How long the oldest row that is ready to send has been waiting; `None` when none is.
    /// Alert on it: a growing lag means the workers do not keep up, or are down.
    pub async fn lag(&self) -> Result<Option<Duration>, StoreError> {
        let row = self
            .bounded(async {
                let client = self.client().await?;
                client
                    .query_one(&self.sql.lag, &[])
                    .await
                    .map_err(|e| self.db_error(e))
            })
            .await?;
        let millis: Option<i64> = row.try_get(0).map_err(|e| self.db_error(e))?;
        Ok(millis.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
    }

    /// How many rows are in each state.
    pub async fn counts(&self) -> Result<OutboxCounts, StoreError> {
        let rows = self
            .bounded(async {
                let client = self.client().await?;
                client
                    .query(&self.sql.counts, &[])
                    .await
                    .map_err(|e| self.db_error(e))
            })
            .await?;
        let mut counts = OutboxCounts::default();
        for row in rows {
            let state: String = row.try_get(0).map_err(|e| self.db_error(e))?;
            let n: i64 = row.try_get(1).map_err(|e| self.db_error(e))?;
            let n = u64::try_from(n).unwrap_or(0);
            match state.as_str() {
                "waiting" => counts.waiting = n,
                "done" => counts.done = n,
                "dead" => counts.dead = n,
                other => {
                    return Err(StoreError::corrupt(format!(
                        "an outbox row has the unknown state {other:?}"
                    )));
                }
            }
        }
        Ok(counts)
    }

    /// Up to `limit` dead rows, oldest first, without their content.
    pub async fn dead_letters(&self, limit: u32) -> Result<Vec<DeadLetter>, StoreError> {
        let rows = self
            .bounded(async {
                let client = self.client().await?;
                client
                    .query(&self.sql.dead_letters, &[&i64::from(limit)])
                    .await
                    .map_err(|e| self.db_error(e))
            })
            .await?;
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

    /// Puts the dead row of the message whose idempotency key is `key` back to waiting, with
    /// its attempts reset, after you fixed the cause; answers whether there was such a dead
    /// row (`false` for a key whose row is waiting, done, or absent). The key is the message's
    /// own, as [`DeadLetter::key`] shows it. Sending it again goes through the worker's stack,
    /// so the idempotency layer still answers a message that was delivered.
    ///
    /// ```no_run
    /// # async fn run(outbox: tower_idempotency::outbox::Outbox) -> Result<(), tower_idempotency::store::StoreError> {
    /// for dead in outbox.dead_letters(100).await? {
    ///     if dead.last_error.as_deref().is_some_and(|e| e.starts_with("provider.unavailable")) {
    ///         outbox.requeue(&dead.key).await?;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn requeue(&self, key: &str) -> Result<bool, StoreError> {
        let rows = self
            .bounded(async {
                let client = self.client().await?;
                client
                    .query(&self.sql.requeue, &[&key, &self.sql.channel.as_str()])
                    .await
                    .map_err(|e| self.db_error(e))
            })
            .await?;
        Ok(!rows.is_empty())
    }

    /// Deletes done rows finished more than `older_than` ago, in statements of at most
    /// `batch` rows, until none is left; answers how many went. Waiting and dead rows are
    /// never purged.
    pub async fn purge_done(&self, older_than: Duration, batch: u32) -> Result<u64, StoreError> {
        let batch = batch.max(1);
        let older_ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
        let mut purged = 0;
        loop {
            let deleted = self
                .bounded(async {
                    let client = self.client().await?;
                    client
                        .execute(&self.sql.purge, &[&older_ms, &i64::from(batch)])
                        .await
                        .map_err(|e| self.db_error(e))
                })
                .await?;
            purged += deleted;
            if deleted < u64::from(batch) {
                return Ok(purged);
            }
        }
    }

    pub(crate) async fn bounded<T>(
        &self,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, work)
            .await
            .unwrap_or_else(|_| Err(StoreError::timeout()))
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        pooled(&self.pool).await
    }

    pub(crate) fn db_error(&self, error: tokio_postgres::Error) -> StoreError {
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
