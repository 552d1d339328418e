//! Claim-then-send: [`MySqlStore::claim_in`] writes a key as *claimed* in a transaction of
//! the caller's own, [`MySqlStore::claim_statement`] hands a claim to any other driver as one
//! statement, and [`MySqlStore::claims`] lists the claims still waiting for their send.

use mysql_async::Value;
use mysql_async::prelude::Queryable;
use uuid::Uuid;

use super::{MySqlStore, check_key, micros};
use crate::fingerprint::Fingerprint;
use crate::store::millis::millis;
use crate::store::sql::SqlOperations;
use crate::store::{
    Claim, ClaimParam, ClaimStatement, StoreError, StoreErrorKind, Token, WaitingClaim,
};

/// How often a claim asks again when the row it found was deleted before it could replace it.
const CLAIM_ATTEMPTS: usize = 3;

impl MySqlStore {
    /// Writes `claim` through `conn` (mysql_async 0.37, see [Your driver](super#your-driver)):
    /// pass the `Transaction` that writes your business rows, so the key is held exactly when
    /// those rows commit, and not at all if they roll back. Answers whether it wrote the
    /// claim: `false` when a live record already holds the key (a send under way or done, or
    /// another claim), which the layer's send then answers.
    ///
    /// After the commit, send the message through the
    /// [`IdempotencyLayer`](crate::IdempotencyLayer) that made the claim: its reserve takes
    /// the claim (same fingerprint) and the message goes once; a message with another
    /// fingerprint under the key is `idempotency.key_reused`. If the process dies between the
    /// commit and the send, the claim waits (for the claim's ttl): [`claims`](Self::claims)
    /// lists it, and the next run sends the same message under the same key.
    ///
    /// Two statements (an `INSERT IGNORE`, and when a row is there an `UPDATE` of it if it
    /// expired), each taking the row's lock until your transaction ends; the answer is exact
    /// whether your connection counts changed or matched rows (`CLIENT_FOUND_ROWS`).
    ///
    /// ```no_run
    /// use mysql_async::TxOpts;
    /// use mysql_async::prelude::Queryable;
    /// use tower_idempotency::{IdempotencyLayer, Message, MySqlStore};
    ///
    /// # async fn run(store: MySqlStore, layer: IdempotencyLayer, alert: Message,
    /// #     pool: mysql_async::Pool) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.start_transaction(TxOpts::default()).await?;
    /// tx.exec_drop("UPDATE orders SET state = 'paid' WHERE id = ?", ("ord_1",)).await?;
    /// if let Some(claim) = layer.claim(&alert)? {
    ///     store.claim_in(&mut tx, &claim).await?;
    /// }
    /// tx.commit().await?;
    /// // Now send `alert` through the layer's stack: it takes the claim and sends once.
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Unavailable`](crate::store::StoreErrorKind::Unavailable) when a statement fails (your
    /// transaction is then yours to roll back), [`InvalidInput`](StoreErrorKind::InvalidInput)
    /// for a key longer than the table keeps.
    pub async fn claim_in<Q: Queryable>(
        &self,
        conn: &mut Q,
        claim: &Claim,
    ) -> Result<bool, StoreError> {
        self.claim_on(&mut AsyncConnection(conn), claim).await
    }

    /// The claim's statements on `conn`, whichever driver holds it: an `INSERT IGNORE`, and
    /// when a row is there an `UPDATE` of it if it expired. Both count exactly whether
    /// `CLIENT_FOUND_ROWS` is on or off (the update always writes a new token), so drivers
    /// that turn it on (sqlx's) read the same answer as mysql_async.
    pub(super) async fn claim_on(
        &self,
        conn: &mut impl ClaimConnection,
        claim: &Claim,
    ) -> Result<bool, StoreError> {
        check_key(&claim.key)?;
        let key = ClaimParam::Text(claim.key.clone());
        let token = ClaimParam::Bytes(Uuid::from(Token::new()).as_bytes().to_vec());
        let fp = ClaimParam::Bytes(claim.fingerprint.as_bytes().to_vec());
        let ttl = ClaimParam::BigInt(micros(claim.ttl));
        let take = [token.clone(), fp.clone(), ttl.clone(), key.clone()];
        let insert = [key, token, fp, ttl];
        let sql = &self.table.sql;
        for _ in 0..CLAIM_ATTEMPTS {
            if conn.execute(self, &sql.claim_insert, &insert).await? == 1 {
                return Ok(true);
            }
            if conn.execute(self, &sql.claim_take, &take).await? == 1 {
                return Ok(true);
            }
            // A live row holds the key, unless it went between the statements: ask again.
            if conn.exists(self, &sql.lock_one, &insert[..1]).await? {
                return Ok(false);
            }
        }
        Err(StoreError::new(
            StoreErrorKind::Unavailable,
            "claim found the key changing under it on every attempt",
        ))
    }

    /// The claim as one statement with its parameters, for a transaction held by another
    /// driver: diesel's `sql_query` (see [`ClaimStatement`] for the binds), or any client that
    /// binds text, bytes and integer parameters. Run it in the transaction that writes your
    /// business rows; after the commit, the layer's send takes the claim as it takes
    /// [`claim_in`](Self::claim_in)'s: it writes the same row, and replaces only an expired
    /// one.
    ///
    /// One `INSERT … ON DUPLICATE KEY UPDATE`, whose every assignment keeps a live row as
    /// it is. The parameters, in the order of its `?` placeholders: the key (text), the
    /// claim's token (16 bytes), the fingerprint (bytes), the ttl in milliseconds (integer),
    /// then the token, fingerprint and ttl again (the update names them a second time: the
    /// `VALUES()` that would spare it is deprecated on MySQL 8).
    ///
    /// The count your driver answers depends on the connection's `CLIENT_FOUND_ROWS` flag,
    /// as MySQL counts `ON DUPLICATE KEY UPDATE`: 1 when it wrote a new row, 2 when it
    /// replaced an expired one; a live record (a send under way or done, or another claim)
    /// counts 0 with the flag off (mysql_async's default) and 1 with it on (diesel's
    /// `MysqlConnection`, sqlx). With the flag on, read [`claims`](Self::claims) after the
    /// commit if you need to know whether this statement claimed the key: either way, the
    /// layer's send answers for the key.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::store::{Claim, ClaimParam};
    /// use tower_idempotency::{Fingerprint, MySqlStore};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = mysql_async::Pool::new("mysql://app@db.internal/app");
    /// let store = MySqlStore::new(pool);
    /// let claim = Claim::new("alerts:order.paid:ord_1", Fingerprint::from_bytes([7; 32]),
    ///     Duration::from_secs(3600));
    /// let statement = store.claim_statement(&claim);
    /// assert!(statement.sql().starts_with("INSERT INTO `idempotency_keys`"));
    /// assert_eq!(statement.params().len(), 7);
    /// assert_eq!(statement.params()[3], ClaimParam::BigInt(3_600_000));
    /// assert_eq!(statement.params()[1], statement.params()[4], "the token, twice");
    /// # Ok(()) }
    /// ```
    pub fn claim_statement(&self, claim: &Claim) -> ClaimStatement {
        let token = ClaimParam::Bytes(Uuid::from(Token::new()).as_bytes().to_vec());
        let fp = ClaimParam::Bytes(claim.fingerprint.as_bytes().to_vec());
        let ttl = ClaimParam::BigInt(millis(claim.ttl));
        ClaimStatement::new(
            self.table.sql.claim_upsert.clone(),
            vec![
                ClaimParam::Text(claim.key.clone()),
                token.clone(),
                fp.clone(),
                ttl.clone(),
                token,
                fp,
                ttl,
            ],
        )
    }

    /// Up to `limit` claims not yet taken by a send, oldest first: after a crash, the messages
    /// the next run must send. Each is the key as stored (`namespace:key`, or
    /// `namespace:h1:<digest>` with hashed keys) and the message's fingerprint:
    /// [`WaitingClaim::is_claim_of`] with the layer's claim of a message you rebuilt tells
    /// whether it is that message's claim, hashed keys included (as [`WaitingClaim`]'s example
    /// shows).
    pub async fn claims(&self, limit: u32) -> Result<Vec<WaitingClaim>, StoreError> {
        let rows = self
            .bounded(|| async {
                let mut conn = self.conn().await?;
                self.read(&mut conn, &self.table.sql.claims, vec![limit.into()])
                    .await
            })
            .await?;
        rows.iter()
            .map(|row| {
                let key: Vec<u8> = self.column(row, 0, "has no readable key")?;
                let key = String::from_utf8(key)
                    .map_err(|e| self.corrupt("has a key that is not UTF-8").with_source(e))?;
                let fingerprint: Vec<u8> = self.column(row, 1, "has no readable fingerprint")?;
                let fingerprint = <[u8; 32]>::try_from(fingerprint.as_slice())
                    .map(Fingerprint::from_bytes)
                    .map_err(|_| self.corrupt("has a fingerprint that is not 32 bytes"))?;
                Ok(WaitingClaim::new(key, fingerprint))
            })
            .collect()
    }
}

/// A connection a claim's statements run on: mysql_async's, or sqlx's (feature `sqlx`).
pub(super) trait ClaimConnection: Send {
    /// Runs `sql`, which returns no rows; answers how many rows it changed.
    fn execute(
        &mut self,
        store: &MySqlStore,
        sql: &str,
        params: &[ClaimParam],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Runs `sql`, a query; answers whether it returned a row.
    fn exists(
        &mut self,
        store: &MySqlStore,
        sql: &str,
        params: &[ClaimParam],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// A mysql_async connection or transaction.
struct AsyncConnection<'a, Q>(&'a mut Q);

/// A claim's parameter as mysql_async sends it.
fn value(param: &ClaimParam) -> Value {
    match param {
        ClaimParam::Text(text) => Value::Bytes(text.as_bytes().to_vec()),
        ClaimParam::Bytes(bytes) => Value::Bytes(bytes.clone()),
        ClaimParam::BigInt(n) => Value::Int(*n),
    }
}

impl<Q: Queryable> ClaimConnection for AsyncConnection<'_, Q> {
    async fn execute(
        &mut self,
        store: &MySqlStore,
        sql: &str,
        params: &[ClaimParam],
    ) -> Result<u64, StoreError> {
        let params = params.iter().map(value).collect();
        store.write(self.0, sql, params).await
    }

    async fn exists(
        &mut self,
        store: &MySqlStore,
        sql: &str,
        params: &[ClaimParam],
    ) -> Result<bool, StoreError> {
        let params = params.iter().map(value).collect();
        Ok(!store.read(self.0, sql, params).await?.is_empty())
    }
}
