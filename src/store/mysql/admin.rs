//! [`StoreAdmin`] for [`MySqlStore`]: `forget` and `resolve` lock the row in a transaction
//! and decide on the locked version; the listing reads the index on unknown outcomes and the
//! index on `expires_at`.
//!
//! [`StoreAdmin`]: crate::store::admin::StoreAdmin

use std::time::Duration;

use mysql_async::Row;

use super::{MySqlStore, check_key, micros, token_bytes};
use crate::outcome::Outcome;
use crate::store::admin::{
    AdminOutcome, Cursor, Expiry, Force, Inspected, KeyState, Page, Resolution, page, parse_cursor,
};
use crate::store::sql::{SqlAdmin, impl_store_admin};
use crate::store::{RecordState, StoreError, Token, record};

impl MySqlStore {
    /// Decodes a row of the admin columns (see `sql.rs`): key, state, fingerprint, outcome,
    /// ms left, position; with the position.
    fn inspected(&self, row: &Row) -> Result<(Inspected, i64), StoreError> {
        let key: Vec<u8> = self.column(row, 0, "has no readable key")?;
        let key = String::from_utf8(key)
            .map_err(|e| self.corrupt("has a key that is not UTF-8").with_source(e))?;
        let state: String = self.column(row, 1, "has no readable state")?;
        let state = match state.as_str() {
            "pending" => KeyState::Pending,
            "claimed" => KeyState::Claimed,
            "done" => KeyState::Done,
            _ => return Err(self.corrupt("has an unknown state")),
        };
        // The same record rules as every other read.
        let shape = if state == KeyState::Done {
            RecordState::Done
        } else {
            RecordState::Pending
        };
        let checked = self.checked(row, shape, 2, 3)?;
        let left: i64 = self.column(row, 4, "has no readable expiry")?;
        let expires = match u64::try_from(left) {
            Ok(ms) if ms > 0 => Expiry::In(Duration::from_millis(ms)),
            _ => Expiry::Passed,
        };
        let position: i64 = self.column(row, 5, "has no readable expiry")?;
        Ok((
            Inspected::new(key, state, checked.fingerprint, checked.outcome, expires),
            position,
        ))
    }

    /// Locks the row of `key`, and when no live send holds it (or `force`), applies the
    /// change `sql` with `params`; all in one transaction.
    async fn settle(
        &self,
        key: &str,
        force: Force,
        sql: &str,
        params: Vec<mysql_async::Value>,
    ) -> Result<AdminOutcome, StoreError> {
        check_key(key)?;
        let mut tx = self.transaction().await?;
        let rows = self
            .read(&mut tx, &self.table.sql.lock_one, vec![key.into()])
            .await?;
        let Some(row) = rows.first() else {
            return Ok(AdminOutcome::NothingThere);
        };
        let live: i64 = self.column(row, 0, "has no readable state")?;
        if live != 0 && !force.is_forced() {
            return Ok(AdminOutcome::HeldByLiveSend);
        }
        self.write(&mut tx, sql, params).await?;
        tx.commit().await.map_err(|e| self.db_error(e))?;
        Ok(AdminOutcome::Done)
    }
}

impl SqlAdmin for MySqlStore {
    async fn inspect_once(&self, key: &str) -> Result<Option<Inspected>, StoreError> {
        check_key(key)?;
        let mut conn = self.conn().await?;
        let rows = self
            .read(&mut conn, &self.table.sql.inspect, vec![key.into()])
            .await?;
        rows.first()
            .map(|row| self.inspected(row).map(|(record, _)| record))
            .transpose()
    }

    async fn forget_once(&self, key: &str, force: Force) -> Result<AdminOutcome, StoreError> {
        self.settle(key, force, &self.table.sql.delete_one, vec![key.into()])
            .await
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
        // A new token fences out a forced-out holder's late settlement.
        let params = vec![
            token_bytes(Token::new()),
            outcome.into(),
            micros(ttl).into(),
            key.into(),
        ];
        self.settle(key, force, &self.table.sql.resolve, params)
            .await
    }

    async fn list_once(&self, after: Option<&Cursor>, limit: usize) -> Result<Page, StoreError> {
        // The first page starts before any row: every `expires_at` is after the epoch.
        let (at, after_key) = match after {
            None => (0, ""),
            Some(cursor) => parse_cursor::<i64>(cursor)?,
        };
        if limit == 0 {
            return Ok(Page::new(Vec::new(), after.cloned()));
        }
        let limit_value = u64::try_from(limit).unwrap_or(u64::MAX);
        let mut params = Vec::new();
        for _ in 0..2 {
            params.extend([at.into(), at.into(), after_key.into(), limit_value.into()]);
        }
        params.push(limit_value.into());
        let mut conn = self.conn().await?;
        let rows = self.read(&mut conn, &self.table.sql.list, params).await?;
        page(&rows, limit, |row| self.inspected(row))
    }
}

impl_store_admin!(
    /// `forget` and `resolve` lock the row, decide on the locked version whether a live send
    /// holds it, and change it in the same transaction.
    MySqlStore
);
