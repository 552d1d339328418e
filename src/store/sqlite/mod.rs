//! [`SqliteStore`] (feature `sqlite`): keys in one SQLite database file, shared by every
//! process on the host that opens it. No server: a cron job, a worker that restarts, or
//! several workers on one machine deduplicate through the file.
//!
//! # What it guarantees
//!
//! - **One host.** Every process that opens the same file shares its keys: two sends under
//!   one key never both hold it while its lease runs, in one process or many. The file must
//!   be on a local file system: SQLite's WAL mode keeps its lock state in shared memory
//!   (the `-shm` file beside the database), which a network file system (NFS, SMB) does not
//!   share between hosts, so such a file is **not supported**; neither is a file several
//!   hosts reach.
//! - **Crashes.** A process killed while it holds a key leaves a pending row behind; the key
//!   frees itself when the lease ends, by the database's clock, and the next send goes once.
//!   Commits are synced (`synchronous = FULL`): a kept outcome survives a power loss.
//! - **At-least-once with deduplication**, as with every store: a process that dies after
//!   the provider took a message but before the outcome was kept lets a retry send again
//!   once the lease ends, unless the provider deduplicates on the forwarded key.
//!
//! # How it runs
//!
//! [`SqliteStore::open`] starts one thread that owns the store's connection; every
//! operation is queued to it, so the async runtime never blocks on SQLite. The thread runs
//! whatever queued up meanwhile in one write transaction (`BEGIN IMMEDIATE`, one commit), as
//! SQLite lets one writer at a time write anyway: under load, many operations share a
//! commit. Clones of the store share the thread; it stops when the last clone is dropped.
//!
//! Each operation is **one statement** (an upsert with `RETURNING`, an `UPDATE` or a
//! `DELETE`), every expiry decided by SQLite's clock (`unixepoch('subsec')`, the host's),
//! never by a process's timers:
//!
//! - `reserve` is `INSERT … ON CONFLICT (key) DO UPDATE … RETURNING`: the `SET` keeps a live
//!   row as it is and replaces an expired one; whose token comes back says who holds the key.
//!   The row as it was is read first in the same write transaction, so a reserve that took
//!   the key from a pending row whose lease had passed (its holder crashed) answers
//!   [`TakenOver`](super::Reservation::TakenOver) with it, in `reserve_many` too.
//! - `retake` is `UPDATE … SET state = 'pending', token = ? … WHERE` the row is done, live, of
//!   the fingerprint, of unknown delivery, and its first attempt younger than the window.
//! - `complete` writes done only `WHERE token = ? OR expires_at <= now`, so a stale owner
//!   never overwrites a new owner's record; `release` deletes the holder's pending row;
//!   `extend` moves the lease of the holder's pending row whose lease has not passed.
//! - `reserve_many`, `complete_many` and `release_many` run the single statements, one per
//!   key, in one transaction. The keys of one call must be distinct: a repeated key fails the
//!   call with an [`InvalidInput`](super::StoreErrorKind::InvalidInput) error.
//!
//! Other processes' writes are waited for, in sleeps of 50 µs to 1.6 ms (a busy handler sized
//! for the store's short transactions, not SQLite's 1 to 100 ms steps), up to the timeout
//! ([`DEFAULT_TIMEOUT`]): a database locked for longer fails the operation with a
//! [`Timeout`](super::StoreErrorKind::Timeout) error, and the layer then sends nothing
//! (`idempotency.store_failed`). A path that cannot be a store (a directory, a file that is
//! not a database, a directory that does not exist or that the process may not write) fails
//! [`SqliteStore::open`] with a [`Misconfigured`](super::StoreErrorKind::Misconfigured) error,
//! which nothing retries.
//!
//! # Schema
//!
//! `open` creates the table when it is absent:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS idempotency_keys (
//!     key         TEXT    PRIMARY KEY NOT NULL,
//!     state       TEXT    NOT NULL,      -- 'pending', 'done' or 'claimed'
//!     token       BLOB    NOT NULL,      -- 16 bytes: the UUID that fences the reservation
//!     fingerprint BLOB    NOT NULL,      -- 32 bytes of SHA-256
//!     outcome     TEXT,                  -- the kept outcome, once done
//!     expires_at  INTEGER NOT NULL,      -- end of the lease or ttl, ms since the UNIX epoch
//!     first_attempt_at INTEGER           -- when the first attempt under the key began, ms
//! ) WITHOUT ROWID;
//! ```
//!
//! with an index on `expires_at` and a partial one on the rows of unknown delivery (for
//! [`StoreAdmin::list`](super::admin::StoreAdmin::list)). The outcome is the stored form of
//! [`store::record`](super::record) (version 1), as `PostgresStore` keeps it; no message
//! content is stored. Rows that do not decode or break the
//! [record rules](super::record#the-record-rules) are reported as
//! [`Corrupt`](super::StoreErrorKind::Corrupt) errors, never a panic.
//!
//! `first_attempt_at` is kept by a takeover of the same message, by `complete` of the same
//! token and by `retake`, and reported as [`Record::first_attempt_age`](super::Record::first_attempt_age);
//! NULL (unknown, never re-sent) in a claim not yet taken and in a row completed after its
//! own pending row was gone.
//!
//! # Expired rows
//!
//! An expired row is dead to the protocol at once but stays in the file until a reserve
//! takes the key again or a purge deletes it. A pending row whose lease passed is purged
//! only an hour later, so that the next send of a key whose holder crashed is told it takes
//! it over. The store's thread purges every
//! [`DEFAULT_PURGE_EVERY`] while it is idle (see [`SqliteStoreBuilder::purge_every`]), and
//! [`SqliteStore::purge_expired`] purges now.
//!
//! # Claim-then-send
//!
//! [`SqliteStore::claim_in`] writes a key as *claimed* through a `rusqlite` connection of
//! your own, inside the transaction that writes your rows in the same file; the layer's
//! send of the same message then takes the claim. [`SqliteStore::claims`] lists the claims
//! still waiting for their send. [`SqliteStore::claim_statement`] hands the same statement,
//! with its parameters, to a transaction of another driver (diesel's `sql_query`).
//!
//! The store runs on rusqlite 0.40 (with SQLite bundled), and `claim_in` takes a
//! `rusqlite::Connection` of that version: add `rusqlite = "0.40"` to your dependencies to
//! hand one in. Nothing else needs it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::Duration;

use futures_util::future::BoxFuture;
use rusqlite::{Connection, OptionalExtension};
use tokio::sync::oneshot;

use super::millis::millis;
use super::{Claim, Completion, Reservation, Store, StoreError, StoreErrorKind, Token, record};
use crate::fingerprint::Fingerprint;
use crate::outcome::Outcome;

mod admin;
mod purge;
mod row;
mod session;
mod sql;
mod statement;
mod writer;

use session::Session;
use writer::{Call, Job};

/// The default bound on each operation, including the wait for other processes' writes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the store's thread purges expired rows unless told otherwise.
pub const DEFAULT_PURGE_EVERY: Duration = Duration::from_secs(600);

/// The default number of rows one purge statement deletes.
pub const DEFAULT_PURGE_BATCH: u32 = 1_000;

/// An idempotency store in a SQLite database file, shared by the processes of one host.
///
/// Clones share one connection and its thread. See the [module docs](self) for what it
/// guarantees and how it runs.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::store::{Reservation, Store};
/// use tower_idempotency::{Fingerprint, SqliteStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("sqlite-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// # let path = dir.join("idempotency.sqlite3");
/// let store = SqliteStore::open(&path).await?;
///
/// let fingerprint = Fingerprint::from_bytes([7; 32]);
/// let reservation = store.reserve("welcome:42", fingerprint, Duration::from_secs(60)).await?;
/// // `token()` says whether we hold the key: `Reserved`, or `TakenOver` from a holder that
/// // crashed (which the layer may check with the provider first).
/// if let Some(token) = reservation.token() {
///     /* send, then complete or release under `token` */
/// } else if let Reservation::Held { record } = reservation {
///     /* in flight, or replay record.outcome */
/// }
/// # drop(store);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    timeout: Duration,
    purge_batch: u32,
    jobs: Sender<Box<dyn Job>>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

/// Options of a [`SqliteStore`], from [`SqliteStore::builder`].
#[derive(Clone, Debug)]
pub struct SqliteStoreBuilder {
    path: PathBuf,
    timeout: Duration,
    purge_every: Option<Duration>,
    purge_batch: u32,
}

impl SqliteStoreBuilder {
    /// Bounds each operation (default [`DEFAULT_TIMEOUT`]), the wait for other processes'
    /// writes included: an operation that takes longer fails with a
    /// [`Timeout`](StoreErrorKind::Timeout) error. An operation still queued then is not
    /// run; one already running may still finish, which the protocol allows (a reserve
    /// nobody heard of frees its key when its lease ends).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How often the store's thread deletes expired rows while it is idle (default
    /// [`DEFAULT_PURGE_EVERY`]); `None` never, for a file purged by
    /// [`purge_expired`](SqliteStore::purge_expired) or another process.
    #[must_use]
    pub fn purge_every(mut self, every: Option<Duration>) -> Self {
        self.purge_every = every.map(|every| every.max(Duration::from_millis(1)));
        self
    }

    /// How many rows one purge statement deletes (default [`DEFAULT_PURGE_BATCH`]; `0`
    /// counts as `1`). Each runs in a transaction of its own, so other writers get in
    /// between.
    #[must_use]
    pub fn purge_batch(mut self, rows: u32) -> Self {
        self.purge_batch = rows.max(1);
        self
    }

    /// Opens (or creates) the database file, switches it to WAL, creates the table when
    /// absent, and starts the store's thread.
    ///
    /// Fails with a [`Misconfigured`](StoreErrorKind::Misconfigured) error, naming the path,
    /// when it is a directory, is not a database, cannot be opened or written, or cannot use
    /// WAL (as on some network file systems); with a [`Timeout`](StoreErrorKind::Timeout)
    /// when the file stays locked longer than the timeout.
    pub async fn open(self) -> Result<SqliteStore, StoreError> {
        let (ready, opened) = oneshot::channel();
        let (jobs, queue) = std::sync::mpsc::channel::<Box<dyn Job>>();
        let Self {
            path,
            timeout,
            purge_every,
            purge_batch,
        } = self;
        let thread_path = path.clone();
        std::thread::Builder::new()
            .name("tower-idempotency-sqlite".to_owned())
            .spawn(move || match writer::open(&thread_path, timeout) {
                Ok(connection) => {
                    if ready.send(Ok(())).is_ok() {
                        writer::serve(connection, thread_path, queue, purge_every, purge_batch);
                    }
                }
                Err(error) => {
                    let _ = ready.send(Err(error));
                }
            })
            .map_err(|e| {
                StoreError::new(
                    StoreErrorKind::Unavailable,
                    "could not start the SQLite store's thread",
                )
                .with_source(e)
            })?;
        // Opening waits for the schema's write lock too: twice the timeout, at most.
        match tokio::time::timeout(timeout.saturating_mul(2), opened).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => return Err(error),
            Ok(Err(_)) => return Err(stopped()),
            Err(_) => return Err(StoreError::timeout()),
        }
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                timeout,
                purge_batch,
                jobs,
            }),
        })
    }
}

fn stopped() -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        "the SQLite store's thread stopped",
    )
}

impl SqliteStore {
    /// Opens (or creates) the database file at `path` with every option at its default;
    /// see [`SqliteStoreBuilder::open`].
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::builder(path).open().await
    }

    /// Options for the database file at `path`.
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            path: path.as_ref().to_owned(),
            timeout: DEFAULT_TIMEOUT,
            purge_every: Some(DEFAULT_PURGE_EVERY),
            purge_batch: DEFAULT_PURGE_BATCH,
        }
    }

    /// The database file's path, as given.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `work` on the store's thread, in a transaction, within the timeout.
    async fn call<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Session<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.inner
            .jobs
            .send(Box::new(Call::new(work, reply)))
            .map_err(|_| stopped())?;
        match tokio::time::timeout(self.inner.timeout, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(stopped()),
            Err(_) => Err(StoreError::timeout()),
        }
    }

    /// The store error for a failed statement.
    fn failure(&self, error: &rusqlite::Error) -> StoreError {
        session::failure(error, &self.inner.path)
    }

    /// Writes `claim` through `connection`, a connection of your own to the same file, inside
    /// the transaction that writes your rows, so the key is held exactly when those rows
    /// commit. Answers whether it wrote the claim: `false` when a live record already holds
    /// the key (a send under way or done, or another claim).
    ///
    /// After the commit, send the message through the
    /// [`IdempotencyLayer`](crate::IdempotencyLayer) that made the claim: its reserve takes
    /// the claim (same fingerprint) and the message goes once. Open `connection` with a busy
    /// timeout (`Connection::busy_timeout`) and start its transaction with
    /// `TransactionBehavior::Immediate`, as other processes write the file too.
    ///
    /// ```
    /// use rusqlite::{Connection, TransactionBehavior};
    /// use tower_idempotency::SqliteStore;
    /// use tower_idempotency::{IdempotencyLayer, Message};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = std::env::temp_dir().join(format!("sqlite-claim-doc-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir)?;
    /// # let path = dir.join("app.sqlite3");
    /// let store = SqliteStore::open(&path).await?;
    /// let layer = IdempotencyLayer::builder().store(store.clone()).build()?;
    /// let alert = Message::builder().from("a@x.example").to("b@y.example").text("paid")
    ///     .idempotency_key("order.paid:ord_1").build()?;
    ///
    /// let mut connection = Connection::open(&path)?;
    /// connection.busy_timeout(std::time::Duration::from_secs(5))?;
    /// connection.execute_batch("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, state TEXT)")?;
    /// let tx = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    /// tx.execute("INSERT INTO orders VALUES ('ord_1', 'paid')", [])?;
    /// if let Some(claim) = layer.claim(&alert)? {
    ///     assert!(store.claim_in(&tx, &claim)?);
    /// }
    /// tx.commit()?;
    /// assert_eq!(store.claims(10).await?.len(), 1);
    /// // Now send `alert` through the layer's stack: it takes the claim and sends once.
    /// # drop(store); drop(connection);
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The statement's failure (a locked file is a [`Timeout`](StoreErrorKind::Timeout)).
    pub fn claim_in(&self, connection: &Connection, claim: &Claim) -> Result<bool, StoreError> {
        let token = Token::new();
        // Your connection, not the store's: prepared here, per call, inside your transaction.
        connection
            .prepare(sql::CLAIM)
            .and_then(|mut statement| {
                statement.execute(rusqlite::params![
                    claim.key,
                    &token.as_bytes()[..],
                    &claim.fingerprint.as_bytes()[..],
                    millis(claim.ttl),
                ])
            })
            .map(|written| written == 1)
            .map_err(|e| self.failure(&e))
    }

    /// Up to `limit` claims not yet taken by a send, oldest first: after a crash, the
    /// messages the next run must send. Each holds the key as stored and the fingerprint of
    /// the message claimed; [`WaitingClaim::is_claim_of`](super::WaitingClaim::is_claim_of)
    /// maps one back to the message of your event, with hashed keys too.
    pub async fn claims(&self, limit: u32) -> Result<Vec<super::WaitingClaim>, StoreError> {
        let path = self.inner.path.clone();
        self.call(move |session| {
            let rows = session.statement(sql::CLAIMS).and_then(|statement| {
                statement
                    .query_map([i64::from(limit)], |row| {
                        Ok((row.get::<_, String>(0)?, row.get::<_, Vec<u8>>(1)?))
                    })?
                    .collect::<Result<Vec<_>, _>>()
            });
            let rows = rows.map_err(|e| session::failure(&e, &path))?;
            rows.into_iter()
                .map(|(key, fingerprint)| {
                    let fingerprint = <[u8; 32]>::try_from(fingerprint.as_slice())
                        .map(Fingerprint::from_bytes)
                        .map_err(|_| {
                            StoreError::corrupt(format!(
                                "the claim of {key:?} has a fingerprint that is not 32 bytes"
                            ))
                        })?;
                    Ok(super::WaitingClaim::new(key, fingerprint))
                })
                .collect()
        })
        .await
    }
}

/// Refuses a batch that names one key twice: its answers could not be told apart.
fn distinct<'k>(operation: &str, keys: impl Iterator<Item = &'k str>) -> Result<(), StoreError> {
    let mut seen = std::collections::HashSet::new();
    for (at, key) in keys.enumerate() {
        if !seen.insert(key) {
            return Err(StoreError::new(
                StoreErrorKind::InvalidInput,
                format!(
                    "{operation} was given the key at position {at} twice: the keys of one \
                     call must be distinct"
                ),
            ));
        }
    }
    Ok(())
}

/// One reserve, on the store's thread.
fn reserve(
    session: &mut Session<'_>,
    path: &Path,
    key: &str,
    fingerprint: Fingerprint,
    lease: i64,
) -> Result<Reservation, StoreError> {
    let token = Token::new();
    let before = session
        .statement(sql::BEFORE_RESERVE)
        .and_then(|statement| statement.query_row([key], row::Before::read).optional())
        .map_err(|e| session::failure(&e, path))?;
    let found = session
        .statement(sql::RESERVE)
        .and_then(|statement| {
            statement.query_row(
                rusqlite::params![
                    key,
                    &token.as_bytes()[..],
                    &fingerprint.as_bytes()[..],
                    lease
                ],
                row::Found::read,
            )
        })
        .map_err(|e| session::failure(&e, path))?;
    found.reservation(token, before, path)
}

/// One complete, on the store's thread: whether it wrote.
fn complete(
    session: &mut Session<'_>,
    path: &Path,
    key: &str,
    token: Token,
    fingerprint: Fingerprint,
    outcome: &str,
    ttl: i64,
) -> Result<bool, StoreError> {
    session
        .statement(sql::COMPLETE)
        .and_then(|statement| {
            statement.exists(rusqlite::params![
                key,
                &token.as_bytes()[..],
                &fingerprint.as_bytes()[..],
                outcome,
                ttl
            ])
        })
        .map_err(|e| session::failure(&e, path))
}

/// One release, on the store's thread: whether it deleted.
fn release(
    session: &mut Session<'_>,
    path: &Path,
    key: &str,
    token: Token,
) -> Result<bool, StoreError> {
    session
        .statement(sql::RELEASE)
        .and_then(|statement| statement.execute(rusqlite::params![key, &token.as_bytes()[..]]))
        .map(|deleted| deleted > 0)
        .map_err(|e| session::failure(&e, path))
}

impl Store for SqliteStore {
    fn reserve<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        let (key, path, lease) = (key.to_owned(), self.inner.path.clone(), millis(lease));
        Box::pin(self.call(move |session| reserve(session, &path, &key, fingerprint, lease)))
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let outcome = record::outcome_json(outcome)?;
            let (key, path, ttl) = (key.to_owned(), self.inner.path.clone(), millis(ttl));
            self.call(move |session| {
                complete(session, &path, &key, token, fingerprint, &outcome, ttl)
            })
            .await
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (key, path) = (key.to_owned(), self.inner.path.clone());
        Box::pin(self.call(move |session| release(session, &path, &key, token)))
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (key, path, lease) = (key.to_owned(), self.inner.path.clone(), millis(lease));
        Box::pin(self.call(move |session| {
            session
                .statement(sql::EXTEND)
                .and_then(|statement| {
                    statement.execute(rusqlite::params![key, &token.as_bytes()[..], lease])
                })
                .map(|moved| moved > 0)
                .map_err(|e| session::failure(&e, &path))
        }))
    }

    fn retake<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
        within: Duration,
    ) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        let (key, path) = (key.to_owned(), self.inner.path.clone());
        let (lease, within) = (millis(lease), millis(within));
        Box::pin(self.call(move |session| {
            let token = Token::new();
            session
                .statement(sql::RETAKE)
                .and_then(|statement| {
                    statement.exists(rusqlite::params![
                        key,
                        &token.as_bytes()[..],
                        &fingerprint.as_bytes()[..],
                        lease,
                        within
                    ])
                })
                .map(|taken| taken.then_some(token))
                .map_err(|e| session::failure(&e, &path))
        }))
    }

    fn reserve_many<'a>(
        &'a self,
        requests: &'a [(&'a str, Fingerprint)],
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<Result<Reservation, StoreError>>, StoreError>> {
        Box::pin(async move {
            distinct("reserve_many", requests.iter().map(|(key, _)| *key))?;
            if requests.is_empty() {
                return Ok(Vec::new());
            }
            let requests: Vec<(String, Fingerprint)> = requests
                .iter()
                .map(|(key, fingerprint)| ((*key).to_owned(), *fingerprint))
                .collect();
            let (path, lease) = (self.inner.path.clone(), millis(lease));
            self.call(move |session| {
                // A statement that fails outright (not one row that does not decode) fails
                // the call: no key may then be assumed reserved.
                let mut answers = Vec::with_capacity(requests.len());
                for (key, fingerprint) in &requests {
                    match reserve(session, &path, key, *fingerprint, lease) {
                        Err(e) if e.kind() != StoreErrorKind::Corrupt => return Err(e),
                        answer => answers.push(answer),
                    }
                }
                Ok(answers)
            })
            .await
        })
    }

    fn complete_many<'a>(
        &'a self,
        completions: &'a [Completion<'a>],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(async move {
            distinct("complete_many", completions.iter().map(|c| c.key))?;
            if completions.is_empty() {
                return Ok(Vec::new());
            }
            let completions = completions
                .iter()
                .map(|c| {
                    let outcome = record::outcome_json(c.outcome)?;
                    Ok((c.key.to_owned(), c.token, c.fingerprint, outcome))
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            let (path, ttl) = (self.inner.path.clone(), millis(ttl));
            self.call(move |session| {
                completions
                    .iter()
                    .map(|(key, token, fingerprint, outcome)| {
                        complete(session, &path, key, *token, *fingerprint, outcome, ttl)
                    })
                    .collect()
            })
            .await
        })
    }

    fn release_many<'a>(
        &'a self,
        releases: &'a [(&'a str, Token)],
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(async move {
            distinct("release_many", releases.iter().map(|(key, _)| *key))?;
            if releases.is_empty() {
                return Ok(Vec::new());
            }
            let releases: Vec<(String, Token)> = releases
                .iter()
                .map(|(key, token)| ((*key).to_owned(), *token))
                .collect();
            let path = self.inner.path.clone();
            self.call(move |session| {
                releases
                    .iter()
                    .map(|(key, token)| release(session, &path, key, *token))
                    .collect()
            })
            .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_naming_a_key_twice_is_refused() {
        let error = distinct("reserve_many", ["a", "b", "a"].into_iter()).unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::InvalidInput);
        assert!(distinct("reserve_many", ["a", "b"].into_iter()).is_ok());
    }
}
