//! The store thread's connection with its statements, each prepared once: SQLite compiles a
//! statement's text into a program, and the thread runs the same dozen programs all its life.
//! And what a failed call on a connection means to the store's caller ([`failure`]).

use std::path::Path;

use rusqlite::{Connection, ErrorCode, Statement};

use crate::store::{StoreError, StoreErrorKind};

/// The connection the store's thread owns, and the statements it prepared on it so far.
///
/// Statements are found by their SQL text, which is one of the `sql` module's constants:
/// a store prepares at most one statement per constant, so the list stays that short.
pub(super) struct Session<'c> {
    connection: &'c Connection,
    prepared: Vec<(&'static str, Statement<'c>)>,
}

impl<'c> Session<'c> {
    pub(super) fn new(connection: &'c Connection) -> Self {
        Self {
            connection,
            prepared: Vec::new(),
        }
    }

    /// The connection, for what is run once (transactions, pragmas).
    pub(super) fn connection(&self) -> &'c Connection {
        self.connection
    }

    /// The statement for `sql`, prepared on its first use. Running a statement resets it
    /// (rusqlite does when a step ends or its rows are dropped), and each use binds every
    /// parameter again, so nothing carries over from one use to the next.
    pub(super) fn statement(&mut self, sql: &'static str) -> rusqlite::Result<&mut Statement<'c>> {
        let at = match self
            .prepared
            .iter()
            .position(|(known, _)| std::ptr::eq(*known, sql) || *known == sql)
        {
            Some(at) => at,
            None => {
                self.prepared.push((sql, self.connection.prepare(sql)?));
                self.prepared.len() - 1
            }
        };
        Ok(&mut self.prepared[at].1)
    }
}

/// The store error for a failed SQLite call on the database at `path`.
pub(super) fn failure(error: &rusqlite::Error, path: &Path) -> StoreError {
    let (kind, detail) = match error.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => (
            StoreErrorKind::Timeout,
            "stayed locked by another connection for longer than the timeout",
        ),
        // Replaced under the store by a file that is no database: no retry mends it.
        Some(ErrorCode::NotADatabase) => (StoreErrorKind::Misconfigured, "is not a database"),
        Some(ErrorCode::DatabaseCorrupt) => (StoreErrorKind::Corrupt, "is damaged"),
        Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied | ErrorCode::ReadOnly) => {
            (StoreErrorKind::Unavailable, "cannot be written")
        }
        _ => (StoreErrorKind::Unavailable, "failed"),
    };
    StoreError::new(
        kind,
        format!("the SQLite database {} {detail}", path.display()),
    )
    .with_source(error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_is_prepared_once_and_reused() {
        let connection = Connection::open_in_memory().unwrap();
        connection
            .execute_batch("CREATE TABLE t (n INTEGER)")
            .unwrap();
        let mut session = Session::new(&connection);
        const INSERT: &str = "INSERT INTO t (n) VALUES (?1)";
        for n in 0..3 {
            session.statement(INSERT).unwrap().execute([n]).unwrap();
        }
        // The same text from another place is the same statement.
        let copy: &'static str = Box::leak(INSERT.to_owned().into_boxed_str());
        session.statement(copy).unwrap().execute([3]).unwrap();
        assert_eq!(session.prepared.len(), 1);
        let count: i64 = session
            .statement("SELECT count(*) FROM t")
            .unwrap()
            .query_row([], |row| row.get(0))
            .unwrap();
        assert_eq!(count, 4);
        assert_eq!(session.prepared.len(), 2);
    }
}
