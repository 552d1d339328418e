//! [`StoreAdmin`] for [`SqliteStore`]: each operation runs on the store's thread inside its
//! write transaction, so deciding whether a live send holds a key and changing the row are
//! one atomic step; the listing reads the partial index on unknown outcomes and the index on
//! `expires_at`.

use std::path::Path;
use std::time::Duration;

use futures_util::future::BoxFuture;
use rusqlite::{OptionalExtension, Row, Statement};

use super::row::{bytes, key_state, record, text};
use super::session::{Session, failure};
use super::{SqliteStore, millis, sql};
use crate::outcome::Outcome;
use crate::store::admin::{
    AdminOutcome, Cursor, Expiry, Force, Inspected, Page, Resolution, StoreAdmin, page,
    parse_cursor,
};
use crate::store::{StoreError, StoreErrorKind, Token, record as stored};

/// A row of the admin columns as read: key, state, fingerprint, outcome, ms left, position.
struct AdminRow {
    key: Option<String>,
    state: Option<String>,
    fingerprint: Option<Vec<u8>>,
    outcome: Option<Vec<u8>>,
    left: Option<i64>,
    position: Option<i64>,
}

impl AdminRow {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            key: text(row, 0),
            state: text(row, 1),
            fingerprint: bytes(row, 2),
            outcome: bytes(row, 3),
            left: row.get::<_, i64>(4).ok(),
            position: row.get::<_, i64>(5).ok(),
        })
    }

    /// The record, checked as every read is, with its position in the listing's order.
    fn inspected(self, path: &Path) -> Result<(Inspected, i64), StoreError> {
        let corrupt = |what| super::row::corrupt(path, what);
        let key = self.key.ok_or_else(|| corrupt("has no readable key"))?;
        let state = key_state(self.state.as_deref(), path)?;
        let checked = record(
            state,
            self.fingerprint.as_deref(),
            self.outcome.as_deref(),
            None,
            path,
        )?;
        let left = self.left.ok_or_else(|| corrupt("has no readable expiry"))?;
        let position = self
            .position
            .ok_or_else(|| corrupt("has no readable expiry"))?;
        let expires = match u64::try_from(left) {
            Ok(ms) if ms > 0 => Expiry::In(Duration::from_millis(ms)),
            _ => Expiry::Passed,
        };
        Ok((
            Inspected::new(key, state, checked.fingerprint, checked.outcome, expires),
            position,
        ))
    }
}

/// Whether a live send holds `key`: `None` when no record does.
fn live(session: &mut Session<'_>, key: &str) -> rusqlite::Result<Option<bool>> {
    session
        .statement(sql::LIVE)?
        .query_row([key], |row| row.get::<_, bool>(0))
        .optional()
}

/// Changes the record of `key` with `change` unless a live send holds it and `force` is no;
/// inside the thread's transaction, so nothing changes between the look and the change.
fn settle(
    session: &mut Session<'_>,
    key: &str,
    force: Force,
    change: impl FnOnce(&mut Statement<'_>) -> rusqlite::Result<usize>,
    change_sql: &'static str,
) -> rusqlite::Result<AdminOutcome> {
    Ok(match live(session, key)? {
        None => AdminOutcome::NothingThere,
        Some(true) if !force.is_forced() => AdminOutcome::HeldByLiveSend,
        Some(_) => {
            change(session.statement(change_sql)?)?;
            AdminOutcome::Done
        }
    })
}

impl SqliteStore {
    async fn try_forget(&self, key: &str, force: Force) -> Result<AdminOutcome, StoreError> {
        let (key, path) = (key.to_owned(), self.inner.path.clone());
        self.call(move |session| {
            settle(
                session,
                &key,
                force,
                |forget| forget.execute([&key]),
                sql::FORGET,
            )
            .map_err(|e| failure(&e, &path))
        })
        .await
    }

    async fn try_resolve(
        &self,
        key: &str,
        resolution: &Resolution,
        force: Force,
    ) -> Result<AdminOutcome, StoreError> {
        let (receipt, ttl) = match resolution {
            Resolution::Delivered { receipt, ttl } => (receipt, millis(*ttl)),
            Resolution::NotSent => return self.try_forget(key, force).await,
            #[allow(unreachable_patterns)]
            _ => {
                return Err(StoreError::new(
                    StoreErrorKind::Unsupported,
                    "this store does not know that resolution",
                ));
            }
        };
        let outcome = stored::outcome_json(&Outcome::sent(receipt.clone()))?;
        let (key, path) = (key.to_owned(), self.inner.path.clone());
        // A new token fences out a forced-out holder's late settlement.
        let token = Token::new();
        self.call(move |session| {
            settle(
                session,
                &key,
                force,
                |resolve| {
                    resolve.execute(rusqlite::params![key, &token.as_bytes()[..], outcome, ttl])
                },
                sql::RESOLVE,
            )
            .map_err(|e| failure(&e, &path))
        })
        .await
    }

    async fn try_inspect(&self, key: &str) -> Result<Option<Inspected>, StoreError> {
        let (key, path) = (key.to_owned(), self.inner.path.clone());
        self.call(move |session| {
            let row = session
                .statement(sql::INSPECT)
                .and_then(|statement| statement.query_row([&key], AdminRow::read).optional())
                .map_err(|e| failure(&e, &path))?;
            row.map(|row| row.inspected(&path).map(|(record, _)| record))
                .transpose()
        })
        .await
    }

    async fn try_list(&self, after: Option<&Cursor>, limit: usize) -> Result<Page, StoreError> {
        let (at, after_key) = match after {
            None => (i64::MIN, String::new()),
            Some(cursor) => {
                let (at, key) = parse_cursor::<i64>(cursor)?;
                (at, key.to_owned())
            }
        };
        if limit == 0 {
            return Ok(Page::new(Vec::new(), after.cloned()));
        }
        let path = self.inner.path.clone();
        let rows = self
            .call(move |session| {
                session
                    .statement(sql::LIST)
                    .and_then(|statement| {
                        statement
                            .query_map(
                                rusqlite::params![
                                    at,
                                    after_key,
                                    i64::try_from(limit).unwrap_or(i64::MAX)
                                ],
                                AdminRow::read,
                            )?
                            .collect::<Result<Vec<_>, _>>()
                    })
                    .map_err(|e| failure(&e, &path))
            })
            .await?;
        page(rows, limit, |row| row.inspected(&self.inner.path))
    }
}

/// Each operation runs inside one write transaction on the store's thread: `forget` and
/// `resolve` look at the row and change it with nothing in between.
impl StoreAdmin for SqliteStore {
    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Inspected>, StoreError>> {
        Box::pin(self.try_inspect(key))
    }

    fn forget<'a>(
        &'a self,
        key: &'a str,
        force: Force,
    ) -> BoxFuture<'a, Result<AdminOutcome, StoreError>> {
        Box::pin(self.try_forget(key, force))
    }

    fn resolve<'a>(
        &'a self,
        key: &'a str,
        resolution: &'a Resolution,
        force: Force,
    ) -> BoxFuture<'a, Result<AdminOutcome, StoreError>> {
        Box::pin(self.try_resolve(key, resolution, force))
    }

    fn list<'a>(
        &'a self,
        after: Option<&'a Cursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Page, StoreError>> {
        Box::pin(self.try_list(after, limit))
    }
}
