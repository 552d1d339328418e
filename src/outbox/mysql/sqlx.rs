//! Enqueue in a sqlx transaction on MySQL (features `sqlx` and `mysql`):
//! [`Outbox::enqueue_sqlx_mysql`].

use ::sqlx::{Executor, MySqlConnection};

use super::super::{Backend, Enqueued, Outbox, stored};
use crate::message::Message;
use crate::store::StoreError;
use crate::store::mysql::sqlx::sqlx_error;

impl Outbox {
    /// Writes `message` into the MySQL outbox through `conn`, inside the sqlx transaction
    /// that writes your business rows (`&mut *tx` for a `sqlx::Transaction<'_, MySql>`, or a
    /// `&mut MySqlConnection` in a transaction you began), so the message commits or rolls
    /// back with them. sqlx 0.8 (0.8.1 or later), as
    /// [`MySqlStore::claim_in_sqlx`](crate::MySqlStore::claim_in_sqlx).
    ///
    /// It runs the statement [`enqueue_mysql`](Self::enqueue_mysql) runs: a worker sends the
    /// row once after the commit (at its next poll: MySQL has no notifications), and a
    /// second enqueue of the key changes nothing ([`Enqueued::AlreadyThere`]). On PostgreSQL,
    /// [`enqueue_sqlx`](Self::enqueue_sqlx) is the same for a sqlx PostgreSQL transaction.
    ///
    /// ```no_run
    /// use tower_idempotency::Message;
    /// use tower_idempotency::outbox::Outbox;
    ///
    /// # async fn run(outbox: Outbox, alert: Message, pool: sqlx::MySqlPool)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("INSERT INTO orders (id) VALUES (?)")
    ///     .bind("ord_1")
    ///     .execute(&mut *tx)
    ///     .await?;
    /// outbox.enqueue_sqlx_mysql(&mut *tx, &alert).await?;
    /// tx.commit().await?; // the order and its alert, together
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`InvalidInput`](crate::store::StoreErrorKind::InvalidInput) for a message without an
    /// idempotency key (or scheduled before 1970);
    /// [`Unavailable`](crate::store::StoreErrorKind::Unavailable) when the statement fails
    /// (your transaction is then yours to roll back; a missing table says to run
    /// [`migrate`](Self::migrate));
    /// [`Misconfigured`](crate::store::StoreErrorKind::Misconfigured) on an outbox of another
    /// database.
    pub async fn enqueue_sqlx_mysql(
        &self,
        conn: &mut MySqlConnection,
        message: &Message,
    ) -> Result<Enqueued, StoreError> {
        #[allow(irrefutable_let_patterns)] // with `postgres` off, MySQL is the only backend
        let Backend::MySql(my) = &self.backend else {
            return Err(StoreError::misconfigured(format!(
                "Outbox::enqueue_sqlx_mysql writes to MySQL, and this outbox is on {}",
                self.backend.database()
            )));
        };
        let stored = stored::encode(message)?;
        let key = message.idempotency_key().map(|k| k.as_str()).unwrap_or("");
        let done = conn
            .execute(
                ::sqlx::query(&my.sql.enqueue)
                    .bind(key)
                    .bind(stored.as_str()),
            )
            .await
            .map_err(|e| sqlx_error(e, self.table_name(), "Outbox::migrate"))?;
        // `INSERT IGNORE` counts a row only when it wrote one, found rows or not.
        match (done.rows_affected(), i64::try_from(done.last_insert_id())) {
            (1, Ok(id)) if id > 0 => Ok(Enqueued::New(id)),
            (1, _) => Err(StoreError::corrupt(
                "MySQL inserted an outbox row and gave no id for it",
            )),
            _ => Ok(Enqueued::AlreadyThere),
        }
    }
}
