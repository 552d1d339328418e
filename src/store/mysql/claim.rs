//! Claim-then-send: [`MySqlStore::claim_in`] writes a key as *claimed* in a transaction of
//! the caller's own, and [`MySqlStore::claims`] lists the claims still waiting for their send.

use mysql_async::prelude::Queryable;

use super::{MySqlStore, check_key, micros, token_bytes};
use crate::fingerprint::Fingerprint;
use crate::store::{Claim, StoreError, StoreErrorKind, Token, WaitingClaim};

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
    /// expired), each taking the row's lock until your transaction ends.
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
        check_key(&claim.key)?;
        let token = Token::new();
        let fp = claim.fingerprint.as_bytes().to_vec();
        for _ in 0..CLAIM_ATTEMPTS {
            let inserted = self
                .write(
                    conn,
                    &self.table.sql.claim_insert,
                    vec![
                        claim.key.as_str().into(),
                        token_bytes(token),
                        fp.clone().into(),
                        micros(claim.ttl).into(),
                    ],
                )
                .await?;
            if inserted == 1 {
                return Ok(true);
            }
            let taken = self
                .write(
                    conn,
                    &self.table.sql.claim_take,
                    vec![
                        token_bytes(token),
                        fp.clone().into(),
                        micros(claim.ttl).into(),
                        claim.key.as_str().into(),
                    ],
                )
                .await?;
            if taken == 1 {
                return Ok(true);
            }
            // A live row holds the key, unless it went between the statements: ask again.
            let live = self
                .read(
                    conn,
                    &self.table.sql.lock_one,
                    vec![claim.key.as_str().into()],
                )
                .await?;
            if !live.is_empty() {
                return Ok(false);
            }
        }
        Err(StoreError::new(
            StoreErrorKind::Unavailable,
            "claim found the key changing under it on every attempt",
        ))
    }

    /// Up to `limit` claims not yet taken by a send, oldest first: after a crash, the messages
    /// the next run must send. Each is the key as stored (`namespace:key`, or
    /// `namespace:h1:<digest>` with hashed keys) and the message's fingerprint:
    /// [`WaitingClaim::is_claim_of`] with the layer's claim of a message you rebuilt tells
    /// whether it is that message's claim, hashed keys included (as
    /// [`PostgresStore::claims`](crate::PostgresStore::claims) shows).
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
