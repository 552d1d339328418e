//! [`StoreAdmin`] for [`PostgresStore`]: each operation one statement on the table; the
//! listing reads the partial index on unknown outcomes and the index on `expires_at`.
//!
//! [`StoreAdmin`]: crate::store::admin::StoreAdmin

use std::time::Duration;

use tokio_postgres::Row;
use uuid::Uuid;

use super::{PostgresStore, millis};
use crate::outcome::Outcome;
use crate::store::admin::{
    AdminOutcome, Cursor, Expiry, Force, Inspected, KeyState, Page, Resolution, page, parse_cursor,
};
use crate::store::sql::{SqlAdmin, impl_store_admin};
use crate::store::{StoreError, StoreErrorKind, Token, record};

/// The cursor of the first page: before any row (the year 1).
const START: (i64, &str) = (-62_135_596_800_000_000, "");

impl PostgresStore {
    /// Decodes a row of [`ADMIN_COLUMNS`](super::sql): key, state, fingerprint, outcome, ms
    /// left, position; with the position.
    fn inspected(&self, row: &Row) -> Result<(Inspected, i64), StoreError> {
        let key: String = row
            .try_get(0)
            .map_err(|e| self.corrupt("has no readable key").with_source(e))?;
        let state: &str = row
            .try_get(1)
            .map_err(|e| self.corrupt("has no readable state").with_source(e))?;
        let state = match state {
            "pending" => KeyState::Pending,
            "claimed" => KeyState::Claimed,
            "done" => KeyState::Done,
            _ => return Err(self.corrupt("has an unknown state")),
        };
        // The same record rules as every other read (a pending row with an outcome, a done
        // one without, is corrupt).
        let shape = if state == KeyState::Done {
            crate::store::RecordState::Done
        } else {
            crate::store::RecordState::Pending
        };
        let checked = self.checked(row, shape, 2, 3)?;
        let left: i64 = row
            .try_get(4)
            .map_err(|e| self.corrupt("has no readable expiry").with_source(e))?;
        let expires = match u64::try_from(left) {
            Ok(ms) if ms > 0 => Expiry::In(Duration::from_millis(ms)),
            _ => Expiry::Passed,
        };
        let position: i64 = row
            .try_get(5)
            .map_err(|e| self.corrupt("has no readable expiry").with_source(e))?;
        Ok((
            Inspected::new(key, state, checked.fingerprint, checked.outcome, expires),
            position,
        ))
    }

    /// Reads the answer of the forget and resolve statements: no row, or (live, changed).
    fn admin_outcome(&self, row: Option<Row>) -> Result<AdminOutcome, StoreError> {
        let Some(row) = row else {
            return Ok(AdminOutcome::NothingThere);
        };
        let read = |i| {
            row.try_get::<_, bool>(i).map_err(|e| {
                StoreError::new(
                    StoreErrorKind::Unavailable,
                    "an admin statement answered garbage",
                )
                .with_source(e)
            })
        };
        let (live, changed) = (read(0)?, read(1)?);
        Ok(match (changed, live) {
            (true, _) => AdminOutcome::Done,
            (false, true) => AdminOutcome::HeldByLiveSend,
            (false, false) => {
                return Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    "an admin statement changed nothing on a row no live send holds",
                ));
            }
        })
    }
}

impl SqlAdmin for PostgresStore {
    async fn inspect_once(&self, key: &str) -> Result<Option<Inspected>, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.inspect)
            .await
            .map_err(|e| self.db_error(e))?;
        let row = client
            .query_opt(&statement, &[&key])
            .await
            .map_err(|e| self.db_error(e))?;
        row.map(|row| self.inspected(&row).map(|(record, _)| record))
            .transpose()
    }

    async fn forget_once(&self, key: &str, force: Force) -> Result<AdminOutcome, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.forget)
            .await
            .map_err(|e| self.db_error(e))?;
        let row = client
            .query_opt(&statement, &[&key, &force.is_forced()])
            .await
            .map_err(|e| self.db_error(e))?;
        self.admin_outcome(row)
    }

    async fn resolve_once(
        &self,
        key: &str,
        resolution: &Resolution,
        force: Force,
    ) -> Result<AdminOutcome, StoreError> {
        let (receipt, ttl) = match resolution {
            Resolution::Delivered { receipt, ttl } => (receipt, *ttl),
            Resolution::NotSent => return self.forget_once(key, force).await,
        };
        let outcome = record::outcome_json(&Outcome::sent(receipt.clone()))?;
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.resolve)
            .await
            .map_err(|e| self.db_error(e))?;
        // A new token fences out a forced-out holder's late settlement.
        let token = Token::new();
        let row = client
            .query_opt(
                &statement,
                &[
                    &key,
                    &force.is_forced(),
                    &Uuid::from(token),
                    &outcome,
                    &millis(ttl),
                ],
            )
            .await
            .map_err(|e| self.db_error(e))?;
        self.admin_outcome(row)
    }

    async fn list_once(&self, after: Option<&Cursor>, limit: usize) -> Result<Page, StoreError> {
        let (at, after_key) = match after {
            None => (START.0, START.1),
            Some(cursor) => parse_cursor::<i64>(cursor)?,
        };
        if limit == 0 {
            return Ok(Page::new(Vec::new(), after.cloned()));
        }
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.list)
            .await
            .map_err(|e| self.db_error(e))?;
        let rows = client
            .query(
                &statement,
                &[&at, &after_key, &i64::try_from(limit).unwrap_or(i64::MAX)],
            )
            .await
            .map_err(|e| self.db_error(e))?;
        page(&rows, limit, |row| self.inspected(row))
    }
}

impl_store_admin!(
    /// Each operation is one statement: `forget` and `resolve` lock the row, decide on the
    /// locked version whether a live send holds it, and change it in the same statement.
    PostgresStore
);
