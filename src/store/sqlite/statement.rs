//! Claim-then-send through any driver: [`SqliteStore::claim_statement`].

use super::{SqliteStore, sql};
use crate::store::millis::millis;
use crate::store::{Claim, ClaimParam, ClaimStatement, Token};

impl SqliteStore {
    /// The statement [`claim_in`](Self::claim_in) runs, with its parameters, for a
    /// transaction held by another driver on the same file: diesel's `sql_query` (see
    /// [`ClaimStatement`] for the binds), or any client that binds text, BLOB and integer
    /// parameters. Run it in the write transaction that writes your business rows; after the
    /// commit, the layer's send takes the claim as it takes `claim_in`'s. It claimed the key
    /// when it wrote one row (the count your driver's `execute` answers).
    ///
    /// The parameters: `?1` the key (text), `?2` the claim's token (a 16-byte BLOB), `?3` the
    /// fingerprint (a 32-byte BLOB), `?4` the ttl in milliseconds (integer).
    ///
    /// Your driver's SQLite must be the one linked into the process with ours (cargo allows
    /// one `libsqlite3-sys`): rusqlite 0.40's, libsqlite3-sys 0.38. diesel 2.4 accepts it
    /// (`libsqlite3-sys < 0.41`), as does sqlx 0.9; sqlx 0.8's SQLite driver needs
    /// libsqlite3-sys 0.30 and cannot be built beside this store.
    ///
    /// ```
    /// use rusqlite::{Connection, TransactionBehavior};
    /// use tower_idempotency::store::ClaimParam;
    /// use tower_idempotency::{IdempotencyLayer, Message, SqliteStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = std::env::temp_dir().join(format!("sqlite-statement-doc-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir)?;
    /// # let path = dir.join("app.sqlite3");
    /// let store = SqliteStore::open(&path).await?;
    /// let layer = IdempotencyLayer::builder().store(store.clone()).build()?;
    /// let alert = Message::builder().from("a@x.example").to("b@y.example").text("paid")
    ///     .idempotency_key("order.paid:ord_1").build()?;
    /// let claim = layer.claim(&alert)?.expect("a keyed message");
    /// let statement = store.claim_statement(&claim);
    ///
    /// // Any driver's transaction on the same file; rusqlite's here.
    /// let mut connection = Connection::open(&path)?;
    /// connection.busy_timeout(std::time::Duration::from_secs(5))?;
    /// let tx = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    /// let mut query = tx.prepare(statement.sql())?;
    /// for (at, param) in statement.params().iter().enumerate() {
    ///     match param {
    ///         ClaimParam::Text(text) => query.raw_bind_parameter(at + 1, text)?,
    ///         ClaimParam::Bytes(bytes) => query.raw_bind_parameter(at + 1, bytes)?,
    ///         ClaimParam::BigInt(n) => query.raw_bind_parameter(at + 1, n)?,
    ///         _ => unreachable!("a claim binds text, bytes and integers"),
    ///     }
    /// }
    /// assert_eq!(query.raw_execute()?, 1, "claimed");
    /// drop(query);
    /// tx.commit()?;
    /// assert!(store.claims(10).await?.iter().any(|w| w.is_claim_of(&claim)));
    /// # drop(store); drop(connection);
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(()) }
    /// ```
    pub fn claim_statement(&self, claim: &Claim) -> ClaimStatement {
        let token = Token::new();
        ClaimStatement::new(
            sql::CLAIM.to_owned(),
            [
                ClaimParam::Text(claim.key.clone()),
                ClaimParam::Bytes(token.as_bytes().to_vec()),
                ClaimParam::Bytes(claim.fingerprint.as_bytes().to_vec()),
                ClaimParam::BigInt(millis(claim.ttl)),
            ],
        )
    }
}
