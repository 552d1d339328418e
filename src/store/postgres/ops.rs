//! The [`Store`](crate::store::Store) operations of [`PostgresStore`], each one statement (see
//! the [module docs](super#how-each-operation-runs)), single and batch; the SQL stores' shared
//! [`Store`](crate::store::Store) implementation bounds them by the store's timeout
//! ([`SqlOperations`]).

use std::time::Duration;

use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::row::positions;
use super::{PostgresStore, millis};
use crate::fingerprint::Fingerprint;
use crate::outcome::Outcome;
use crate::store::sql::{SqlOperations, impl_store};
use crate::store::{Completion, Reservation, StoreError, StoreErrorKind, Token, record};

/// How often a reserve asks again when the key changed under its statement (each time
/// another session wrote it between the snapshot and the upsert).
const RESERVE_ATTEMPTS: usize = 3;

impl_store!(PostgresStore);

impl SqlOperations for PostgresStore {
    fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn reserve_once(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
        token: Token,
    ) -> Result<Reservation, StoreError> {
        let client = self.client().await?;
        let fingerprint = &fingerprint.as_bytes()[..];
        let params: [&(dyn ToSql + Sync); 4] =
            [&key, &Uuid::from(token), &fingerprint, &millis(lease)];
        // Most sends find no row: one plain insert takes the key.
        let insert = client
            .prepare_cached(&self.table.sql.insert)
            .await
            .map_err(|e| self.db_error(e))?;
        let inserted = client
            .execute(&insert, &params)
            .await
            .map_err(|e| self.db_error(e))?;
        if inserted == 1 {
            return Ok(Reservation::Reserved { token });
        }
        // A row is there, most often a live one: a repeat, answered from the row as read,
        // with nothing written. A row that can be taken goes on to the upsert, which decides
        // on the row's latest version.
        let peek = client
            .prepare_cached(&self.table.sql.peek)
            .await
            .map_err(|e| self.db_error(e))?;
        let row = client
            .query_opt(&peek, &[&key])
            .await
            .map_err(|e| self.db_error(e))?;
        if let Some(Some(record)) = row.map(|row| self.held(&row, fingerprint)).transpose()? {
            return Ok(Reservation::Held { record });
        }
        let statement = client
            .prepare_cached(&self.table.sql.reserve)
            .await
            .map_err(|e| self.db_error(e))?;
        // No row: the row changed after the statement's snapshot and before its upsert (a
        // race with another session); the next statement's snapshot sees it.
        for _ in 0..RESERVE_ATTEMPTS {
            let row = client
                .query_opt(&statement, &params)
                .await
                .map_err(|e| self.db_error(e))?;
            if let Some(row) = row {
                return self.reported_reservation(&row, token);
            }
        }
        Err(StoreError::new(
            StoreErrorKind::Unavailable,
            "reserve answered no row: the key kept changing under it",
        ))
    }

    async fn retake_once(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
        within: Duration,
    ) -> Result<Option<Token>, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.retake)
            .await
            .map_err(|e| self.db_error(e))?;
        let token = Token::new();
        let fingerprint = &fingerprint.as_bytes()[..];
        let row = client
            .query_opt(
                &statement,
                &[
                    &key,
                    &Uuid::from(token),
                    &fingerprint,
                    &millis(lease),
                    &millis(within),
                ],
            )
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(row.map(|_| token))
    }

    async fn reserve_many_once(
        &self,
        requests: &[(&str, Fingerprint)],
        lease: Duration,
        tokens: &[Token],
    ) -> Result<Vec<Result<Reservation, StoreError>>, StoreError> {
        let positions = positions("reserve_many", requests.iter().map(|(key, _)| *key))?;
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.reserve_many)
            .await
            .map_err(|e| self.db_error(e))?;
        let mut answered = vec![false; requests.len()];
        let mut answers: Vec<Option<Result<Reservation, StoreError>>> =
            requests.iter().map(|_| None).collect();
        // The positions still without an answer: all at first; after that, the keys that
        // changed under the statement (see `Sql::reserve_many`), asked again.
        let mut asked: Vec<usize> = (0..requests.len()).collect();
        for _ in 0..RESERVE_ATTEMPTS {
            let keys: Vec<&str> = asked.iter().map(|&at| requests[at].0).collect();
            let uuids: Vec<Uuid> = asked.iter().map(|&at| Uuid::from(tokens[at])).collect();
            let fingerprints: Vec<&[u8]> = asked
                .iter()
                .map(|&at| &requests[at].1.as_bytes()[..])
                .collect();
            let rows = client
                .query(&statement, &[&keys, &uuids, &fingerprints, &millis(lease)])
                .await
                .map_err(|e| self.db_error(e))?;
            for row in &rows {
                let at = self.position(&positions, row, 4, &mut answered)?;
                answers[at] = Some(self.reservation(row, tokens[at]));
            }
            asked.retain(|&at| !answered[at]);
            if asked.is_empty() {
                break;
            }
        }
        Ok(answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(StoreError::new(
                        StoreErrorKind::Unavailable,
                        "reserve_many answered no row for this key: it kept changing under it",
                    ))
                })
            })
            .collect())
    }

    async fn complete_once(
        &self,
        key: &str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let outcome = record::outcome_json(outcome)?;
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.complete)
            .await
            .map_err(|e| self.db_error(e))?;
        let fingerprint = &fingerprint.as_bytes()[..];
        let written = client
            .execute(
                &statement,
                &[
                    &key,
                    &Uuid::from(token),
                    &fingerprint,
                    &outcome,
                    &millis(ttl),
                ],
            )
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(written > 0)
    }

    async fn complete_many_once(
        &self,
        completions: &[Completion<'_>],
        ttl: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        let positions = positions("complete_many", completions.iter().map(|c| c.key))?;
        let outcomes = completions
            .iter()
            .map(|c| record::outcome_json(c.outcome))
            .collect::<Result<Vec<String>, _>>()?;
        let keys: Vec<&str> = completions.iter().map(|c| c.key).collect();
        let uuids: Vec<Uuid> = completions.iter().map(|c| Uuid::from(c.token)).collect();
        let fingerprints: Vec<&[u8]> = completions
            .iter()
            .map(|c| &c.fingerprint.as_bytes()[..])
            .collect();
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.complete_many)
            .await
            .map_err(|e| self.db_error(e))?;
        let rows = client
            .query(
                &statement,
                &[&keys, &uuids, &fingerprints, &outcomes, &millis(ttl)],
            )
            .await
            .map_err(|e| self.db_error(e))?;
        let mut written = vec![false; completions.len()];
        for row in &rows {
            self.position(&positions, row, 0, &mut written)?;
        }
        Ok(written)
    }

    async fn release_many_once(&self, releases: &[(&str, Token)]) -> Result<Vec<bool>, StoreError> {
        let positions = positions("release_many", releases.iter().map(|(key, _)| *key))?;
        let keys: Vec<&str> = releases.iter().map(|(key, _)| *key).collect();
        let uuids: Vec<Uuid> = releases
            .iter()
            .map(|(_, token)| Uuid::from(*token))
            .collect();
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.release_many)
            .await
            .map_err(|e| self.db_error(e))?;
        let rows = client
            .query(&statement, &[&keys, &uuids])
            .await
            .map_err(|e| self.db_error(e))?;
        let mut deleted = vec![false; releases.len()];
        for row in &rows {
            self.position(&positions, row, 0, &mut deleted)?;
        }
        Ok(deleted)
    }

    async fn release_once(&self, key: &str, token: Token) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.release)
            .await
            .map_err(|e| self.db_error(e))?;
        let deleted = client
            .execute(&statement, &[&key, &Uuid::from(token)])
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(deleted > 0)
    }

    async fn extend_once(
        &self,
        key: &str,
        token: Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.extend)
            .await
            .map_err(|e| self.db_error(e))?;
        let row = client
            .query_opt(&statement, &[&key, &Uuid::from(token), &millis(lease)])
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(row.is_some())
    }
}
