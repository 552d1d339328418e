//! Claim-then-send: [`PostgresStore::claim_in`] writes a key as *claimed* in a transaction
//! of the caller's own ([`PostgresStore::claim_statement`] hands the same statement to any
//! other driver), and [`PostgresStore::claims`] lists the claims still waiting for their send.

use tokio_postgres::GenericClient;
use uuid::Uuid;

use super::{PostgresStore, millis};
use crate::fingerprint::Fingerprint;
use crate::store::sql::SqlOperations;
use crate::store::{Claim, ClaimParam, ClaimStatement, StoreError, WaitingClaim};

impl PostgresStore {
    /// Writes `claim` through `client` (tokio-postgres 0.7, see
    /// [Your driver](super#your-driver)), inside the transaction that writes your business
    /// rows (`&tx` for a `tokio_postgres::Transaction`, `&*tx` for a `deadpool_postgres`
    /// one), so the key is held exactly when those rows commit, and not at all if they roll
    /// back. Answers whether it wrote the claim: `false` when a live record already holds the
    /// key (a send under way or done, or another claim), which the layer's send then answers.
    ///
    /// After the commit, send the message through the
    /// [`IdempotencyLayer`](crate::IdempotencyLayer) that made the claim: its reserve takes
    /// the claim (same fingerprint) and the message goes once; a message with another
    /// fingerprint under the key is `idempotency.key_reused`. If the process dies between the
    /// commit and the send, the claim waits (for the claim's ttl): [`claims`](Self::claims)
    /// lists it, and the next run sends the same message under the same key (with hashed keys
    /// too: see [`WaitingClaim`]).
    ///
    /// A send that certainly did not go (refused, rate limited) frees the key, claim
    /// included, like any reservation: retry it, or claim again.
    ///
    /// ```no_run
    /// use tower_idempotency::store::postgres::PostgresStore;
    /// use tower_idempotency::{IdempotencyLayer, Message};
    ///
    /// # async fn run(store: PostgresStore, layer: IdempotencyLayer, alert: Message,
    /// #     client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let tx = client.transaction().await?;
    /// tx.execute("UPDATE orders SET state = 'paid' WHERE id = $1", &[&"ord_1"]).await?;
    /// if let Some(claim) = layer.claim(&alert)? {
    ///     store.claim_in(&tx, &claim).await?;
    /// }
    /// tx.commit().await?;
    /// // Now send `alert` through the layer's stack: it takes the claim and sends once.
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Unavailable`](crate::store::StoreErrorKind::Unavailable) when the statement fails;
    /// your transaction is then aborted, as PostgreSQL does.
    pub async fn claim_in<C: GenericClient>(
        &self,
        client: &C,
        claim: &Claim,
    ) -> Result<bool, StoreError> {
        let token = crate::store::Token::new();
        let fingerprint = &claim.fingerprint.as_bytes()[..];
        let written = client
            .execute(
                &self.table.sql.claim,
                &[
                    &claim.key,
                    &Uuid::from(token),
                    &fingerprint,
                    &millis(claim.ttl),
                ],
            )
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(written == 1)
    }

    /// The statement [`claim_in`](Self::claim_in) runs, with its parameters, for a
    /// transaction held by another driver: diesel's `sql_query` (see [`ClaimStatement`] for
    /// the binds), or any client that binds text, `bytea` and `bigint` parameters. Run it in
    /// the transaction that writes your business rows; after the commit, the layer's send
    /// takes the claim as it takes `claim_in`'s. It claimed the key when it wrote one row
    /// (the count your driver's `execute` answers).
    ///
    /// The parameters: `$1` the key (text), `$2` the claim's token (text, a UUID the
    /// statement casts), `$3` the fingerprint (`bytea`), `$4` the ttl in milliseconds
    /// (`bigint`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::store::{Claim, ClaimParam};
    /// use tower_idempotency::{Fingerprint, PostgresStore};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut config = deadpool_postgres::Config::new();
    /// # config.dbname = Some("app".to_owned());
    /// # let pool = config.create_pool(None, tokio_postgres::NoTls)?;
    /// let store = PostgresStore::new(pool);
    /// let claim = Claim::new("alerts:order.paid:ord_1", Fingerprint::from_bytes([7; 32]),
    ///     Duration::from_secs(3600));
    /// let statement = store.claim_statement(&claim);
    /// assert!(statement.sql().starts_with("INSERT INTO \"idempotency_keys\""));
    /// assert_eq!(statement.params()[3], ClaimParam::BigInt(3_600_000));
    /// # Ok(()) }
    /// ```
    pub fn claim_statement(&self, claim: &Claim) -> ClaimStatement {
        let token = crate::store::Token::new();
        ClaimStatement::new(
            self.table.sql.claim.clone(),
            [
                ClaimParam::Text(claim.key.clone()),
                ClaimParam::Text(token.to_string()),
                ClaimParam::Bytes(claim.fingerprint.as_bytes().to_vec()),
                ClaimParam::BigInt(millis(claim.ttl)),
            ],
        )
    }

    /// Up to `limit` claims not yet taken by a send, oldest first: after a crash, the
    /// messages the next run must send. Each holds the key as stored (`namespace:key`, or
    /// `namespace:h1:<digest>` with hashed keys) and the fingerprint of the message claimed;
    /// [`WaitingClaim::is_claim_of`] maps one back to the message of your event in either
    /// key form.
    ///
    /// ```no_run
    /// use tower_idempotency::store::postgres::PostgresStore;
    /// use tower_idempotency::{IdempotencyLayer, Message};
    ///
    /// # async fn run(store: PostgresStore, layer: IdempotencyLayer,
    /// #     recent_alerts: Vec<Message>) -> Result<(), Box<dyn std::error::Error>> {
    /// // The alerts of the orders of the last day, rebuilt from your rows.
    /// let waiting = store.claims(1000).await?;
    /// for alert in recent_alerts {
    ///     let Some(claim) = layer.claim(&alert)? else { continue };
    ///     if waiting.iter().any(|w| w.is_claim_of(&claim)) {
    ///         // Send `alert` through the layer's stack: it takes the claim and sends once.
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn claims(&self, limit: u32) -> Result<Vec<WaitingClaim>, StoreError> {
        let rows = self
            .bounded(|| async {
                let client = self.client().await?;
                let statement = client
                    .prepare_cached(&self.table.sql.claims)
                    .await
                    .map_err(|e| self.db_error(e))?;
                client
                    .query(&statement, &[&i64::from(limit)])
                    .await
                    .map_err(|e| self.db_error(e))
            })
            .await?;
        rows.iter()
            .map(|row| {
                let key: String = row
                    .try_get(0)
                    .map_err(|e| self.corrupt("has no readable key").with_source(e))?;
                let fingerprint: &[u8] = row
                    .try_get(1)
                    .map_err(|e| self.corrupt("has no readable fingerprint").with_source(e))?;
                let fingerprint = <[u8; 32]>::try_from(fingerprint)
                    .map(Fingerprint::from_bytes)
                    .map_err(|_| self.corrupt("has a fingerprint that is not 32 bytes"))?;
                Ok(WaitingClaim::new(key, fingerprint))
            })
            .collect()
    }
}
