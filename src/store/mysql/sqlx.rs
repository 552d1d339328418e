//! Claims in a sqlx transaction (features `sqlx` and `mysql`): [`MySqlStore::claim_in_sqlx`].
//!
//! sqlx 0.8 (0.8.1 or later) is supported: your `sqlx::Transaction<'_, MySql>` and
//! `MySqlConnection` are ours when your `Cargo.toml` asks for `sqlx = "0.8"` with its `mysql`
//! feature, as cargo then builds one sqlx for both. The statements are the ones the store's
//! own [`claim_in`](MySqlStore::claim_in) runs, their parameters bound as text, bytes and
//! integers, so no sqlx type feature is needed, and none is turned on for you.

use ::sqlx::{Executor, MySqlConnection};

use super::MySqlStore;
use super::claim::ClaimConnection;
use crate::store::{Claim, ClaimParam, StoreError, StoreErrorKind};

impl MySqlStore {
    /// Writes `claim` through `conn`, inside the sqlx transaction that writes your business
    /// rows (`&mut *tx` for a `sqlx::Transaction<'_, MySql>`, or a `&mut MySqlConnection` in
    /// a transaction you began), so the key is held exactly when those rows commit, and not
    /// at all if they roll back. Answers whether it wrote the claim: `false` when a live
    /// record already holds the key (a send under way or done, or another claim), which the
    /// layer's send then answers.
    ///
    /// It runs the statements [`claim_in`](Self::claim_in) runs, and everything said there
    /// holds: after the commit, send the message through the
    /// [`IdempotencyLayer`](crate::IdempotencyLayer) that made the claim, and it goes once;
    /// after a crash between the commit and the send, [`claims`](Self::claims) lists the key
    /// and the next run sends the same message under it; another message under the key is
    /// `idempotency.key_reused`. The answer is exact although sqlx's connections count
    /// matched rather than changed rows (`CLIENT_FOUND_ROWS`): see [`claim_in`](Self::claim_in).
    ///
    /// ```no_run
    /// use tower_idempotency::{IdempotencyLayer, Message, MySqlStore};
    ///
    /// # async fn run(store: MySqlStore, layer: IdempotencyLayer, alert: Message,
    /// #     pool: sqlx::MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("UPDATE orders SET state = 'paid' WHERE id = ?")
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
    /// [`Unavailable`](StoreErrorKind::Unavailable) when a statement fails (your transaction
    /// is then yours to roll back; a missing table says to run [`migrate`](Self::migrate)),
    /// [`InvalidInput`](StoreErrorKind::InvalidInput) for a key longer than the table keeps.
    pub async fn claim_in_sqlx(
        &self,
        conn: &mut MySqlConnection,
        claim: &Claim,
    ) -> Result<bool, StoreError> {
        self.claim_on(&mut SqlxConnection(conn), claim).await
    }
}

/// A sqlx MySQL connection, or the one a sqlx transaction holds.
struct SqlxConnection<'a>(&'a mut MySqlConnection);

/// `sql` with `params` bound as sqlx binds them.
fn query<'q>(
    sql: &'q str,
    params: &'q [ClaimParam],
) -> ::sqlx::query::Query<'q, ::sqlx::MySql, ::sqlx::mysql::MySqlArguments> {
    let mut query = ::sqlx::query(sql);
    for param in params {
        query = match param {
            ClaimParam::Text(text) => query.bind(text.as_str()),
            ClaimParam::Bytes(bytes) => query.bind(bytes.as_slice()),
            ClaimParam::BigInt(n) => query.bind(*n),
        };
    }
    query
}

impl ClaimConnection for SqlxConnection<'_> {
    async fn execute(
        &mut self,
        store: &MySqlStore,
        sql: &str,
        params: &[ClaimParam],
    ) -> Result<u64, StoreError> {
        let done = self
            .0
            .execute(query(sql, params))
            .await
            .map_err(|e| sqlx_error(e, store.table_name(), "MySqlStore::migrate"))?;
        Ok(done.rows_affected())
    }

    async fn exists(
        &mut self,
        store: &MySqlStore,
        sql: &str,
        params: &[ClaimParam],
    ) -> Result<bool, StoreError> {
        let row = self
            .0
            .fetch_optional(query(sql, params))
            .await
            .map_err(|e| sqlx_error(e, store.table_name(), "MySqlStore::migrate"))?;
        Ok(row.is_some())
    }
}

/// The store error for a failed sqlx statement on `table`, whose missing table `migrate`
/// (the function that creates it) would create.
pub(crate) fn sqlx_error(error: ::sqlx::Error, table: &str, migrate: &str) -> StoreError {
    // The servers' error numbers: ER_NO_SUCH_TABLE; MariaDB's max_statement_time and MySQL's
    // max_execution_time.
    let number = error
        .as_database_error()
        .and_then(|e| e.try_downcast_ref::<::sqlx::mysql::MySqlDatabaseError>())
        .map(|e| e.number());
    let (kind, detail) = match number {
        Some(1146) => (
            StoreErrorKind::Unavailable,
            format!("table {table:?} does not exist: run {migrate}"),
        ),
        Some(1969 | 3024) => (
            StoreErrorKind::Timeout,
            "the server stopped the statement".to_owned(),
        ),
        _ => (StoreErrorKind::Unavailable, "MySQL failed".to_owned()),
    };
    StoreError::new(kind, detail).with_source(error)
}
