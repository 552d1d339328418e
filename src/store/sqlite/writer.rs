//! The thread that owns a [`SqliteStore`](super::SqliteStore)'s connection: it runs every
//! operation, so the async runtime never blocks on SQLite, and it commits the operations
//! that queued up meanwhile in one transaction, as SQLite has one writer at a time anyway.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, OpenFlags};
use tokio::sync::oneshot;

use super::session::{Session, failure};
use super::sql;
use crate::store::{StoreError, StoreErrorKind};

/// At most this many operations share one transaction, so one commit never waits on an
/// unbounded queue.
const MAX_BATCH: usize = 256;

/// One operation queued for the thread.
pub(super) trait Job: Send {
    /// Whether its caller stopped waiting (timed out or dropped): it is then not run.
    fn abandoned(&self) -> bool;
    /// Runs its statements in the open transaction, keeping its answer; nothing when its
    /// caller stopped waiting meanwhile.
    fn run(&mut self, session: &mut Session<'_>);
    /// Sends its answer when the transaction committed, or the error `failed` makes.
    fn answer(self: Box<Self>, failed: Option<&dyn Fn() -> StoreError>);
}

/// A job made of a closure and the channel its answer goes back on.
pub(super) struct Call<T, F> {
    work: Option<F>,
    answer: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Call<T, F> {
    pub(super) fn new(work: F, reply: oneshot::Sender<Result<T, StoreError>>) -> Self {
        Self {
            work: Some(work),
            answer: None,
            reply,
        }
    }
}

impl<T, F> Job for Call<T, F>
where
    T: Send,
    F: FnOnce(&mut Session<'_>) -> Result<T, StoreError> + Send,
{
    fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }

    fn run(&mut self, session: &mut Session<'_>) {
        // Checked again here: the wait for the write lock may have outlasted the caller,
        // and a reserve nobody hears of would hold its key for the whole lease.
        if self.abandoned() {
            return;
        }
        if let Some(work) = self.work.take() {
            self.answer = Some(work(session));
        }
    }

    fn answer(self: Box<Self>, failed: Option<&dyn Fn() -> StoreError>) {
        let answer = match (failed, self.answer) {
            (None, Some(answer)) => answer,
            (Some(failed), _) => Err(failed()),
            (None, None) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "the SQLite thread answered an operation it did not run",
            )),
        };
        // The caller may have stopped waiting meanwhile; nobody is left to tell.
        let _ = self.reply.send(answer);
    }
}

/// Opens the database at `path` as the store uses it: WAL, the busy handler, full sync, the
/// schema in place.
pub(super) fn open(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if path.is_dir() {
        return Err(StoreError::misconfigured(format!(
            "the SQLite database {} is a directory: give the path of a database file (it is \
             created when absent)",
            path.display()
        )));
    }
    let connection =
        Connection::open_with_flags(path, flags).map_err(|e| opening_failure(&e, path))?;
    let setup = |connection: &Connection| -> rusqlite::Result<String> {
        BUSY_BOUND.with(|bound| bound.set(busy_timeout));
        connection.busy_handler(Some(wait_for_the_lock))?;
        let mode: String =
            connection.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
        // With WAL, FULL syncs the log at every commit: a kept outcome survives a power
        // loss, not only a crash of the process.
        connection.pragma_update(None, "synchronous", "FULL")?;
        connection.execute_batch("BEGIN IMMEDIATE")?;
        match connection.execute_batch(sql::SCHEMA) {
            Ok(()) => connection.execute_batch("COMMIT")?,
            Err(error) => {
                let _ = connection.execute_batch("ROLLBACK");
                return Err(error);
            }
        }
        Ok(mode)
    };
    let mode = setup(&connection).map_err(|e| opening_failure(&e, path))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::new(
            StoreErrorKind::Misconfigured,
            format!(
                "the SQLite database {} cannot use WAL (journal mode {mode:?}): the store needs \
                 a file on a local file system",
                path.display()
            ),
        ));
    }
    Ok(connection)
}

/// The store error for a database that could not be opened: a file that is no database, or
/// a path the process cannot open or write, stays so until someone changes the path or the
/// file's permissions, so it is [`Misconfigured`](StoreErrorKind::Misconfigured); a lock held
/// too long is still a timeout.
fn opening_failure(error: &rusqlite::Error, path: &Path) -> StoreError {
    let failure = failure(error, path);
    let set_up_wrong = matches!(
        error.sqlite_error_code(),
        Some(
            ErrorCode::NotADatabase
                | ErrorCode::CannotOpen
                | ErrorCode::PermissionDenied
                | ErrorCode::ReadOnly
        )
    );
    if set_up_wrong {
        StoreError {
            kind: StoreErrorKind::Misconfigured,
            ..failure
        }
    } else {
        failure
    }
}

thread_local! {
    /// How long the store's thread waits for another connection's lock, in all (its
    /// timeout); set once when the thread opens its connection.
    static BUSY_BOUND: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    /// How long the current wait has slept so far.
    static BUSY_SLEPT: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// The busy handler of the store's connection: waits for another connection's write lock
/// in short sleeps, up to the timeout in all. SQLite's own (`busy_timeout`) sleeps 1, 2, 5,
/// 10 ... 100 ms, sized for locks held long; a store's transactions take a millisecond or
/// two, so short sleeps hand the lock over between processes far sooner.
fn wait_for_the_lock(attempt: i32) -> bool {
    if attempt == 0 {
        BUSY_SLEPT.with(|slept| slept.set(Duration::ZERO));
    }
    let slept = BUSY_SLEPT.with(Cell::get);
    if slept >= BUSY_BOUND.with(Cell::get) {
        return false;
    }
    // 50 µs, doubling to at most 1.6 ms.
    let step = Duration::from_micros(50 << attempt.clamp(0, 5));
    std::thread::sleep(step);
    BUSY_SLEPT.with(|total| total.set(slept + step));
    true
}

/// The thread's loop: runs queued jobs in transactions until every store handle is dropped,
/// purging expired rows every `purge_every` when set.
pub(super) fn serve(
    connection: Connection,
    path: PathBuf,
    jobs: Receiver<Box<dyn Job>>,
    purge_every: Option<Duration>,
    purge_batch: u32,
) {
    let mut session = Session::new(&connection);
    let mut next_purge = purge_every.map(|every| Instant::now() + every);
    let mut batch: Vec<Box<dyn Job>> = Vec::new();
    loop {
        let first = match next_purge {
            None => jobs.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(at) => jobs.recv_timeout(at.saturating_duration_since(Instant::now())),
        };
        match first {
            Ok(job) => batch.push(job),
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                match super::purge::purge_all(&mut session, purge_batch) {
                    Ok(0) => {}
                    Ok(purged) => tracing::debug!(
                        path = %path.display(), purged, "purged expired idempotency keys"
                    ),
                    Err(error) => tracing::warn!(
                        path = %path.display(),
                        error = %failure(&error, &path),
                        "purging expired idempotency keys failed"
                    ),
                }
                next_purge = purge_every.map(|every| Instant::now() + every);
                continue;
            }
        }
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        batch.retain(|job| !job.abandoned());
        if !batch.is_empty() {
            run(&mut session, &path, &mut batch);
        }
        batch.clear();
    }
}

/// Runs `batch` in one write transaction and answers every job: each its own answer once
/// the transaction committed, all the same error when it did not.
fn run(session: &mut Session<'_>, path: &Path, batch: &mut Vec<Box<dyn Job>>) {
    let connection = session.connection();
    // IMMEDIATE takes the write lock first (waiting up to the timeout), so no statement
    // inside can fail to upgrade a read to a write.
    if let Err(error) = connection.execute_batch("BEGIN IMMEDIATE") {
        let failed = || failure(&error, path);
        for job in batch.drain(..) {
            job.answer(Some(&failed));
        }
        return;
    }
    for job in batch.iter_mut() {
        job.run(session);
    }
    // A statement that failed badly enough (disk full, I/O error) makes SQLite roll the
    // whole transaction back: then no answer of this batch stands.
    let committed = if connection.is_autocommit() {
        Err(None)
    } else {
        connection.execute_batch("COMMIT").map_err(Some)
    };
    match committed {
        Ok(()) => {
            for job in batch.drain(..) {
                job.answer(None);
            }
        }
        Err(error) => {
            if !connection.is_autocommit() {
                let _ = connection.execute_batch("ROLLBACK");
            }
            let failed = || match &error {
                Some(error) => failure(error, path),
                None => StoreError::new(
                    StoreErrorKind::Unavailable,
                    format!(
                        "SQLite rolled back a transaction on {}: nothing it held was kept",
                        path.display()
                    ),
                ),
            };
            for job in batch.drain(..) {
                job.answer(Some(&failed));
            }
        }
    }
}
