//! The transactional outbox on PostgreSQL (feature `postgres`) or MySQL 8 / MariaDB 10.6+
//! (feature `mysql`): commit a message with your business rows, and let a [`Worker`] send it.
//!
//! An [`Outbox`]'s `enqueue` (PostgreSQL) or `enqueue_mysql` (MySQL) writes the message into
//! the outbox table **inside a transaction you already hold**, so the alert commits or rolls back
//! with the order it is about. A [`Worker`] (any number of them, on any number of machines)
//! drains the table and sends each message through the `Service<Message>` stack you give it,
//! usually the [`IdempotencyLayer`](crate::IdempotencyLayer) stack of the README:
//!
//! - it claims waiting rows with `FOR UPDATE SKIP LOCKED`, so workers never take the same
//!   row, under a **lease** (`claimed_until`) rather than an open transaction: a worker that
//!   dies frees its rows when the lease passes, and no transaction stays open during a send;
//! - it sends the rows it claimed concurrently, up to its
//!   [`concurrency`](Worker::concurrency) ([`DEFAULT_CONCURRENCY`] by default), so one
//!   worker keeps pace with a provider that takes a while to answer, and records their
//!   answers in batches, each row fenced by the token of the claim that took it (a batch
//!   whose statement fails is recorded again, a few times over seconds, before its rows are
//!   left to their claims' end);
//! - a receipt marks the row `done` with the provider's id;
//! - a retryable failure puts the row back with a jittered exponential backoff, or the
//!   provider's `Retry-After` when longer; after [`max_attempts`](Worker::max_attempts) it is
//!   `dead`, as is a message the provider refused for good (permanent, validation) or whose
//!   delivery is unknown (the idempotency layer keeps its key: settle it by hand), with its
//!   last error;
//! - on PostgreSQL it wakes on `LISTEN`/`NOTIFY` (every enqueue notifies when its
//!   transaction commits), with polling as the fallback; MySQL has no notifications, so there
//!   an idle worker polls every [`poll_interval`](Worker::poll_interval) (a worker that finds
//!   rows claims again at once);
//! - told to stop, it lets the sends in flight answer and records them, and puts back the
//!   rows it claimed but did not hand to the stack.
//!
//! Every time (backoff, leases, lag, retention) is read on the database server's clock,
//! never the worker's.
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
//! On PostgreSQL:
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
//! On MySQL 8 and MariaDB 10.6+ (the times are UTC, by `UTC_TIMESTAMP(6)`, as
//! `MySqlStore` keeps them):
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS `idempotency_outbox` (
//!     id            BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
//!     `key`         VARBINARY(1024) NOT NULL,          -- the key, compared byte for byte
//!     message       JSON NOT NULL,                     -- the stored form, version 1
//!     state         VARCHAR(7) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'waiting',
//!     attempts      INT NOT NULL DEFAULT 0,
//!     available_at  DATETIME(6) NOT NULL,              -- UTC; not before: backoff
//!     claim_token   BINARY(16) NULL,                   -- the worker's claim, fencing its writes
//!     claimed_until DATETIME(6) NULL,                  -- UTC; the claim's lease
//!     enqueued_at   DATETIME(6) NOT NULL,
//!     finished_at   DATETIME(6) NULL,
//!     provider_id   TEXT NULL,
//!     transport     TEXT NULL,
//!     last_error    TEXT NULL,
//!     UNIQUE INDEX key_idx (`key`),
//!     INDEX waiting_idx (state, available_at, id),
//!     INDEX done_idx (state, finished_at)
//! ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin
//! ```
//!
//! `message` is `JSON`, as PostgreSQL's is `jsonb`: the server refuses a value that is not
//! JSON, and your queries can read it with the JSON functions. MySQL keeps it in a binary
//! form and gives back equivalent text (keys and spacing may move: the stored form is read by
//! field, never by its text); MariaDB's `JSON` is a checked `LONGTEXT` in the table's
//! character set, hence the table's `utf8mb4`, so a body in any script round-trips. The key
//! is bytes (`VARBINARY(1024)`, as `MySqlStore` keeps its keys), so
//! its unique index compares exactly and stays within InnoDB's 3,072-byte index limit.
//! Neither server has partial indexes: the indexes lead with `state`.
//!
//! The message's stored form is JSON with a version (`"v":1`), every field of a
//! [`Message`](crate::Message), attachment content in base64, pinned by a golden test; it is the same on
//! both databases.
//!
//! # Your driver
//!
//! As `PostgresStore`, the PostgreSQL outbox (feature `postgres`) runs on tokio-postgres 0.7
//! through a deadpool-postgres 0.14 pool: `Outbox::new` takes a `deadpool_postgres::Pool`,
//! `Outbox::listen` a `tokio_postgres::Config` and `Outbox::enqueue` a
//! `tokio_postgres::GenericClient`. Add those crates at the same versions to your dependencies
//! (`deadpool-postgres = "0.14"`, `tokio-postgres = "0.7"`) to hand them in. As `MySqlStore`,
//! the MySQL outbox (feature `mysql`) runs on mysql_async 0.37: `Outbox::mysql` takes a
//! `mysql_async::Pool` and `Outbox::enqueue_mysql` any `mysql_async::prelude::Queryable` (a
//! `Transaction`, a `Conn`). In a sqlx 0.8 transaction
//! (feature `sqlx`), `Outbox::enqueue_sqlx` writes on PostgreSQL and
//! `Outbox::enqueue_sqlx_mysql` (with `mysql` too) on MySQL. [`Outbox::connect`] needs none
//! of them, and picks the database by the URL's scheme.
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
//!
//! The same on MySQL, enqueued in a mysql_async transaction:
//!
//! ```no_run
//! use std::time::Duration;
//! use mysql_async::TxOpts;
//! use mysql_async::prelude::Queryable;
//! use tower_idempotency::outbox::Outbox;
//! use tower_idempotency::{BoxError, IdempotencyLayer, Message, MySqlStore, Receipt};
//!
//! # async fn run(alert: Message) -> Result<(), BoxError> {
//! let url = "mysql://app@localhost/app";
//! let outbox = Outbox::connect(url).await?;
//! outbox.migrate().await?;
//!
//! let pool = mysql_async::Pool::from_url(url)?;
//! let mut tx = pool.start_transaction(TxOpts::default()).await?;
//! tx.exec_drop("INSERT INTO orders (id) VALUES (?)", ("ord_1",)).await?;
//! outbox.enqueue_mysql(&mut tx, &alert).await?;
//! tx.commit().await?; // the order and its alert, together
//!
//! // In a worker process: no notifications on MySQL, so the poll interval is the wait of
//! // a message enqueued into an idle outbox.
//! let store = MySqlStore::connect(url).await?;
//! let provider = tower::service_fn(|_m: Message| async { Ok::<_, BoxError>(Receipt::new("id", "fake")) });
//! let stack = IdempotencyLayer::new(store).layer(provider);
//! # use tower::Layer;
//! let worker = outbox.worker(stack).poll_interval(Duration::from_millis(500));
//! let stats = worker.run(std::future::pending()).await?;
//! # let _ = stats; Ok(()) }
//! ```

use std::fmt;
use std::time::Duration;

use crate::store::StoreError;
use crate::store::millis::millis;

/// Runs `$call` with `$db` bound to the outbox's database, whichever it is: every backend
/// has the same methods, so the worker and the operations below are written once.
macro_rules! on_backend {
    ($backend:expr, $db:ident => $call:expr) => {
        match $backend {
            #[cfg(feature = "postgres")]
            $crate::outbox::Backend::Postgres($db) => $call,
            #[cfg(feature = "mysql")]
            $crate::outbox::Backend::MySql($db) => $call,
        }
    };
}

mod drain;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
mod rows;
mod settings;
mod stored;
mod worker;

pub use worker::{
    DEFAULT_BATCH, DEFAULT_CLAIM_LEASE, DEFAULT_CONCURRENCY, DEFAULT_MAX_ATTEMPTS,
    DEFAULT_POLL_INTERVAL, Worker, WorkerStats, WorkerStatsHandle,
};

/// The table an [`Outbox`] uses unless told otherwise.
pub const DEFAULT_OUTBOX_TABLE: &str = "idempotency_outbox";

/// The default bound on each outbox statement.
pub const DEFAULT_OUTBOX_TIMEOUT: Duration = Duration::from_secs(5);

/// DDL waits for locks: a `migrate` given much less could fail for no good reason.
const MIN_MIGRATE_TIMEOUT: Duration = Duration::from_secs(30);

/// An outbox table, on PostgreSQL or MySQL: `enqueue` (or `enqueue_mysql`) in your
/// transaction, drain with a [`Worker`]. See the [module docs](self). Cheap to clone: clones
/// share the pool.
#[derive(Clone)]
pub struct Outbox {
    backend: Backend,
    timeout: Duration,
}

/// The database an outbox's rows live in, and its statements on them. Each has the same
/// methods (see `on_backend!`), in a file of its own.
#[derive(Clone, Debug)]
enum Backend {
    #[cfg(feature = "postgres")]
    Postgres(postgres::Postgres),
    #[cfg(feature = "mysql")]
    MySql(mysql::MySql),
}

impl Backend {
    /// The database's name, for errors that say an operation belongs to the other one.
    #[cfg_attr(not(all(feature = "postgres", feature = "mysql")), allow(dead_code))]
    fn database(&self) -> &'static str {
        match self {
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => "PostgreSQL",
            #[cfg(feature = "mysql")]
            Backend::MySql(_) => "MySQL",
        }
    }
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("backend", &self.backend)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// What an [`Outbox`]'s `enqueue` (or `enqueue_mysql`, `enqueue_sqlx`) did.
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
    fn on(backend: Backend) -> Self {
        Self {
            backend,
            timeout: DEFAULT_OUTBOX_TIMEOUT,
        }
    }

    /// Connects to `url` and checks that a connection opens; the scheme picks the database:
    ///
    /// - `postgres://` or `postgresql://` (or tokio-postgres's `key=value` settings):
    ///   PostgreSQL without TLS, with a pool of deadpool's default size, and workers that
    ///   `LISTEN` on the same server (feature `postgres`);
    /// - `mysql://`: MySQL or MariaDB, with the pool `MySqlStore::connect` makes (feature
    ///   `mysql`).
    ///
    /// # Errors
    /// [`Misconfigured`](crate::store::StoreErrorKind::Misconfigured) for a URL that does not
    /// parse, another scheme, or a database whose feature this build leaves out;
    /// [`Unavailable`](crate::store::StoreErrorKind::Unavailable) or
    /// [`Timeout`](crate::store::StoreErrorKind::Timeout) when no connection opens.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let scheme = url.split_once("://").map(|(scheme, _)| scheme);
        let backend = match scheme {
            #[cfg(feature = "mysql")]
            Some("mysql") => Backend::MySql(mysql::MySql::connect(url).await?),
            #[cfg(feature = "postgres")]
            Some("postgres" | "postgresql") | None => {
                Backend::Postgres(postgres::Postgres::from_url(url, DEFAULT_OUTBOX_TIMEOUT)?)
            }
            #[cfg(not(feature = "mysql"))]
            Some("mysql") => return Err(feature_off("a MySQL", "mysql")),
            #[cfg(not(feature = "postgres"))]
            Some("postgres" | "postgresql") | None => {
                return Err(feature_off("a PostgreSQL", "postgres"));
            }
            Some(other) => {
                return Err(StoreError::misconfigured(format!(
                    "an outbox URL starts with postgres:// or mysql://, not {other}://"
                )));
            }
        };
        let outbox = Self::on(backend);
        outbox
            .bounded(async { on_backend!(&outbox.backend, db => db.ping().await) })
            .await?;
        Ok(outbox)
    }

    /// Uses the table `name` (`table` or `schema.table`), checked as the database's store
    /// checks its own (`PostgresStore::table`, `MySqlStore::table`).
    ///
    /// # Errors
    /// [`Misconfigured`](crate::store::StoreErrorKind::Misconfigured), its source the store's
    /// `InvalidTableName`, for a name that check refuses.
    pub fn table(mut self, name: &str) -> Result<Self, StoreError> {
        self.backend = match &self.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres(pg) => Backend::Postgres(pg.table(name)?),
            #[cfg(feature = "mysql")]
            Backend::MySql(my) => Backend::MySql(my.table(name)?),
        };
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
        on_backend!(&self.backend, db => db.name())
    }

    /// A worker that sends this outbox's messages through `service`; see [`Worker`].
    pub fn worker<S>(&self, service: S) -> Worker<S> {
        Worker::new(self.clone(), service)
    }

    /// Creates the table and its indexes when absent. Safe to run from several processes.
    ///
    /// Bounded by the statement timeout, or 30 s if that is shorter.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let work = async { on_backend!(&self.backend, db => db.migrate().await) };
        tokio::time::timeout(self.timeout.max(MIN_MIGRATE_TIMEOUT), work)
            .await
            .unwrap_or_else(|_| Err(StoreError::timeout()))
    }

    /// How long the oldest row that is ready to send has been waiting; `None` when none is.
    /// Alert on it: a growing lag means the workers do not keep up, or are down.
    pub async fn lag(&self) -> Result<Option<Duration>, StoreError> {
        let millis = self
            .bounded(async { on_backend!(&self.backend, db => db.lag_ms().await) })
            .await?;
        Ok(millis.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
    }

    /// How many rows are in each state.
    pub async fn counts(&self) -> Result<OutboxCounts, StoreError> {
        let rows = self
            .bounded(async { on_backend!(&self.backend, db => db.counts().await) })
            .await?;
        let mut counts = OutboxCounts::default();
        for (state, n) in rows {
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
        self.bounded(async { on_backend!(&self.backend, db => db.dead_letters(limit).await) })
            .await
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
        self.bounded(async { on_backend!(&self.backend, db => db.requeue(key).await) })
            .await
    }

    /// Deletes done rows finished more than `older_than` ago, in statements of at most
    /// `batch` rows, until none is left; answers how many went. Waiting and dead rows are
    /// never purged.
    pub async fn purge_done(&self, older_than: Duration, batch: u32) -> Result<u64, StoreError> {
        let batch = batch.max(1);
        let older_ms = millis(older_than);
        let mut purged = 0;
        loop {
            let deleted = self
                .bounded(async {
                    on_backend!(&self.backend, db => db.purge(older_ms, batch).await)
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
}

/// The error of a URL for a database this build leaves out.
#[cfg(not(all(feature = "postgres", feature = "mysql")))]
fn feature_off(database: &str, feature: &str) -> StoreError {
    StoreError::misconfigured(format!(
        "{database} URL, and tower-idempotency was built without its `{feature}` feature: turn it on to use this database"
    ))
}
