//! Claims in a sqlx transaction (feature `sqlx`): [`PostgresStore::claim_in_sqlx`].
//!
//! sqlx 0.8 (0.8.1 or later) is supported: your `sqlx::Transaction<'_, Postgres>` and
//! `PgConnection` are ours when your `Cargo.toml` asks for `sqlx = "0.8"`, as cargo then
//! builds one sqlx for both. The statement is the one the store's own
//! [`claim_in`](PostgresStore::claim_in) runs, its parameters bound as text, bytes and
//! integers, so no sqlx type feature (`uuid`, `json`, `chrono`) is needed, and none is
//! turned on for you.

use ::sqlx::PgExecutor;

use super::PostgresStore;
use crate::store::{Claim, ClaimParam, StoreError, StoreErrorKind};

impl PostgresStore {
    /// Writes `claim` through `executor`, inside the sqlx transaction that writes your
    /// business rows (`&mut *tx` for a `sqlx::Transaction<'_, Postgres>`, or a
    /// `&mut PgConnection` in a transaction you began), so the key is held exactly when those
    /// rows commit, and not at all if they roll back. Answers whether it wrote the claim:
    /// `false` when a live record already holds the key (a send under way or done, or
    /// another claim), which the layer's send then answers.
    ///
    /// It writes the row [`claim_in`](Self::claim_in) writes, and everything said there
    /// holds: after the commit, send the message through the
    /// [`IdempotencyLayer`](crate::IdempotencyLayer) that made the claim, and it goes once;
    /// after a crash between the commit and the send, [`claims`](Self::claims) lists the key
    /// and the next run sends the same message under it; another message under the key is
    /// `idempotency.key_reused`.
    ///
    /// ```no_run
    /// use tower_idempotency::{IdempotencyLayer, Message, PostgresStore};
    ///
    /// # async fn run(store: PostgresStore, layer: IdempotencyLayer, alert: Message,
    /// #     pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("UPDATE orders SET state = 'paid' WHERE id = $1")
    ///     .bind("ord_1")
    ///     .execute(&mut *tx)
    ///     .await?;
    /// if let Some(claim) = layer.claim(&alert)? {
    ///     store.claim_in_sqlx(&mut *tx, &claim).await?;
    /// }
    /// tx.commit().await?;
    /// // Now send `alert` through the layer's stack: it takes the claim and sends once.
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Unavailable`](StoreErrorKind::Unavailable) when the statement fails (your
    /// transaction is then aborted, as PostgreSQL does); a missing table says to run
    /// [`migrate`](Self::migrate).
    pub async fn claim_in_sqlx<'c, E>(&self, executor: E, claim: &Claim) -> Result<bool, StoreError>
    where
        E: PgExecutor<'c>,
    {
        let statement = self.claim_statement(claim);
        let mut query = ::sqlx::query(statement.sql());
        for param in statement.params() {
            query = match param {
                ClaimParam::Text(text) => query.bind(text.as_str()),
                ClaimParam::Bytes(bytes) => query.bind(bytes.as_slice()),
                ClaimParam::BigInt(n) => query.bind(*n),
            };
        }
        let done = query
            .execute(executor)
            .await
            .map_err(|e| sqlx_error(e, self.table_name()))?;
        Ok(done.rows_affected() == 1)
    }
}

/// The store error for a failed sqlx statement on `table`.
pub(crate) fn sqlx_error(error: ::sqlx::Error, table: &str) -> StoreError {
    // PostgreSQL's codes: undefined_table, query_canceled.
    let code = error
        .as_database_error()
        .and_then(|e| e.code())
        .map(|code| code.into_owned());
    let (kind, detail) = match code.as_deref() {
        Some("42P01") => (
            StoreErrorKind::Unavailable,
            format!("table {table:?} does not exist: run migrate"),
        ),
        Some("57014") => (
            StoreErrorKind::Timeout,
            "the server cancelled the statement".to_owned(),
        ),
        _ => (StoreErrorKind::Unavailable, "PostgreSQL failed".to_owned()),
    };
    StoreError::new(kind, detail).with_source(error)
}
