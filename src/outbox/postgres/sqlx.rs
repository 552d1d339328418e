//! Enqueue in a sqlx transaction (feature `sqlx`): [`Outbox::enqueue_sqlx`].

use ::sqlx::{PgExecutor, Row};

use crate::message::Message;
use crate::outbox::{Enqueued, Outbox, stored};
use crate::store::StoreError;
use crate::store::postgres::sqlx::sqlx_error;

impl Outbox {
    /// Writes `message` into the outbox through `executor`, inside the sqlx transaction that
    /// writes your business rows (`&mut *tx` for a `sqlx::Transaction<'_, Postgres>`, or a
    /// `&mut PgConnection` in a transaction you began), so the message commits or rolls back
    /// with them. sqlx 0.8 (0.8.1 or later), as
    /// [`PostgresStore::claim_in_sqlx`](crate::PostgresStore::claim_in_sqlx).
    ///
    /// It writes the row [`enqueue`](Self::enqueue) writes, by the same statement: workers
    /// are notified when it commits, send it once, and a second enqueue of the key changes
    /// nothing ([`Enqueued::AlreadyThere`]).
    ///
    /// ```no_run
    /// use tower_idempotency::Message;
    /// use tower_idempotency::outbox::Outbox;
    ///
    /// # async fn run(outbox: Outbox, alert: Message, pool: sqlx::PgPool)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("INSERT INTO orders (id) VALUES ($1)")
    ///     .bind("ord_1")
    ///     .execute(&mut *tx)
    ///     .await?;
    /// outbox.enqueue_sqlx(&mut *tx, &alert).await?;
    /// tx.commit().await?; // the order and its alert, together
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`InvalidInput`](crate::store::StoreErrorKind::InvalidInput) for a message without an
    /// idempotency key (or scheduled before 1970);
    /// [`Unavailable`](crate::store::StoreErrorKind::Unavailable) when the statement fails
    /// (then your transaction is aborted too, as PostgreSQL does);
    /// [`Misconfigured`](crate::store::StoreErrorKind::Misconfigured) on an outbox of another
    /// database.
    pub async fn enqueue_sqlx<'c, E>(
        &self,
        executor: E,
        message: &Message,
    ) -> Result<Enqueued, StoreError>
    where
        E: PgExecutor<'c>,
    {
        let pg = self.postgres("enqueue_sqlx")?;
        let stored = stored::encode(message)?;
        let key = message.idempotency_key().map(|k| k.as_str()).unwrap_or("");
        let row = ::sqlx::query(&pg.sql.enqueue)
            .bind(key)
            .bind(stored.as_str())
            .bind(pg.sql.channel.as_str())
            .fetch_optional(executor)
            .await
            .map_err(|e| sqlx_error(e, self.table_name()))?;
        match row {
            Some(row) => Ok(Enqueued::New(
                row.try_get::<i64, _>(0)
                    .map_err(|e| sqlx_error(e, self.table_name()))?,
            )),
            None => Ok(Enqueued::AlreadyThere),
        }
    }
}
