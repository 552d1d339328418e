//! The [`Store`](crate::store::Store) operations of [`MySqlStore`], single and batch (see the
//! [module docs](super)); the SQL stores' shared [`Store`](crate::store::Store) implementation
//! bounds each by the store's timeout ([`SqlOperations`]).

use std::time::Duration;

use mysql_async::{Conn, Value};
use uuid::Uuid;

use super::row::positions;
use super::{MySqlStore, check_key, micros, token_bytes};
use crate::fingerprint::Fingerprint;
use crate::outcome::Outcome;
use crate::store::sql::{SqlOperations, impl_store};
use crate::store::{Completion, Reservation, StoreError, StoreErrorKind, Token, record};

/// How often a reserve asks again when the row changed between its statements.
const RESERVE_ATTEMPTS: usize = 3;

impl_store!(MySqlStore);

impl SqlOperations for MySqlStore {
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
        check_key(key)?;
        let mut conn = self.conn().await?;
        self.reserve_on(&mut conn, key, fingerprint, lease, token)
            .await
    }

    async fn retake_once(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
        within: Duration,
    ) -> Result<Option<Token>, StoreError> {
        check_key(key)?;
        let mut conn = self.conn().await?;
        let token = Token::new();
        let taken = self
            .write(
                &mut conn,
                &self.table.sql.retake,
                vec![
                    token_bytes(token),
                    micros(lease).into(),
                    key.into(),
                    fingerprint.as_bytes().to_vec().into(),
                    micros(within).into(),
                ],
            )
            .await?;
        Ok((taken == 1).then_some(token))
    }

    async fn reserve_many_once(
        &self,
        requests: &[(&str, Fingerprint)],
        lease: Duration,
        tokens: &[Token],
    ) -> Result<Vec<Result<Reservation, StoreError>>, StoreError> {
        let positions = positions("reserve_many", requests.iter().map(|(key, _)| *key))?;
        for (key, _) in requests {
            check_key(key)?;
        }
        let mut order: Vec<usize> = (0..requests.len()).collect();
        order.sort_by_key(|&at| requests[at].0);
        let mut params = Vec::with_capacity(requests.len() * 4);
        for &at in &order {
            let (key, fingerprint) = requests[at];
            params.push(key.into());
            params.push(token_bytes(tokens[at]));
            params.push(fingerprint.as_bytes().to_vec().into());
            params.push(micros(lease).into());
        }
        let mut conn = self.conn().await?;
        self.write(&mut conn, &self.table.insert_many(requests.len()), params)
            .await?;
        let keys = order.iter().map(|&at| requests[at].0.into()).collect();
        let rows = self
            .read(&mut conn, &self.table.peek_many(requests.len()), keys)
            .await?;
        let mut answers: Vec<Option<Result<Reservation, StoreError>>> =
            requests.iter().map(|_| None).collect();
        let mut answered = vec![false; requests.len()];
        for row in &rows {
            let at = self.position(&positions, row, &mut answered)?;
            let token = tokens[at];
            let fp = requests[at].1.as_bytes();
            let answer = self.peeked(row, 1).and_then(|peeked| {
                if peeked.token == Uuid::from(token).as_bytes() {
                    Ok(Some(Reservation::Reserved { token }))
                } else if peeked.takeable_by(fp) {
                    // Taken by the single reserve's compare-and-set, below.
                    Ok(None)
                } else {
                    self.record(row, 1)
                        .map(|record| Some(Reservation::Held { record }))
                }
            });
            answers[at] = answer.transpose();
        }
        // Takeable rows, and keys whose row went between the two statements.
        for at in order {
            if answers[at].is_none() {
                let (key, fingerprint) = requests[at];
                let answer = self
                    .reserve_on(&mut conn, key, fingerprint, lease, tokens[at])
                    .await;
                match answer {
                    Err(e) if e.kind() != StoreErrorKind::Corrupt => return Err(e),
                    answer => answers[at] = Some(answer),
                }
            }
        }
        Ok(answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(StoreError::new(
                        StoreErrorKind::Unavailable,
                        "reserve_many left this key unanswered",
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
        check_key(key)?;
        let outcome = record::outcome_json(outcome)?;
        let fp = fingerprint.as_bytes().to_vec();
        let mut conn = self.conn().await?;
        let written = self
            .write(
                &mut conn,
                &self.table.sql.complete,
                vec![
                    fp.clone().into(),
                    outcome.as_str().into(),
                    micros(ttl).into(),
                    token_bytes(token),
                    token_bytes(token),
                    key.into(),
                    token_bytes(token),
                ],
            )
            .await?;
        if written > 0 {
            return Ok(true);
        }
        // No row of this token, nor an expired one: a key with no row gets the done row; a
        // key another token holds is left alone.
        let inserted = self
            .write(
                &mut conn,
                &self.table.sql.complete_insert,
                vec![
                    key.into(),
                    token_bytes(token),
                    fp.into(),
                    outcome.into(),
                    micros(ttl).into(),
                ],
            )
            .await?;
        Ok(inserted == 1)
    }

    async fn complete_many_once(
        &self,
        completions: &[Completion<'_>],
        ttl: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        let positions = positions("complete_many", completions.iter().map(|c| c.key))?;
        for c in completions {
            check_key(c.key)?;
        }
        let outcomes = completions
            .iter()
            .map(|c| record::outcome_json(c.outcome))
            .collect::<Result<Vec<String>, _>>()?;
        let mut order: Vec<usize> = (0..completions.len()).collect();
        order.sort_by_key(|&at| completions[at].key);
        let mut tx = self.transaction().await?;
        let keys: Vec<Value> = order.iter().map(|&at| completions[at].key.into()).collect();
        let rows = self
            .read(&mut tx, &self.table.lock_many(keys.len()), keys)
            .await?;
        // Each key's row, locked: written when it holds this token or expired; a key with no
        // row gets one.
        let mut found = vec![false; completions.len()];
        let mut writable = Vec::new();
        for row in &rows {
            let at = self.position(&positions, row, &mut found)?;
            let locked = self.locked(row)?;
            if locked.token == Uuid::from(completions[at].token).as_bytes() || locked.expired {
                writable.push(at);
            }
        }
        writable.sort_by_key(|&at| completions[at].key);
        let mut written = vec![false; completions.len()];
        if !writable.is_empty() {
            // In the statement's order: fingerprints, outcomes, the ttl, tokens twice.
            let mut params = Vec::new();
            for value in 0..4 {
                if value == 2 {
                    params.push(micros(ttl).into());
                }
                for &at in &writable {
                    let c = &completions[at];
                    params.push(c.key.into());
                    params.push(match value {
                        0 => c.fingerprint.as_bytes().to_vec().into(),
                        1 => outcomes[at].as_str().into(),
                        _ => token_bytes(c.token),
                    });
                }
            }
            params.extend(writable.iter().map(|&at| completions[at].key.into()));
            self.write(&mut tx, &self.table.complete_many(writable.len()), params)
                .await?;
            for &at in &writable {
                written[at] = true;
            }
        }
        let missing: Vec<usize> = order.iter().copied().filter(|&at| !found[at]).collect();
        if !missing.is_empty() {
            let mut params = Vec::new();
            for &at in &missing {
                let c = &completions[at];
                params.push(c.key.into());
                params.push(token_bytes(c.token));
                params.push(c.fingerprint.as_bytes().to_vec().into());
                params.push(outcomes[at].as_str().into());
                params.push(micros(ttl).into());
            }
            self.write(
                &mut tx,
                &self.table.complete_insert_many(missing.len()),
                params,
            )
            .await?;
            // A key inserted by another session meanwhile was ignored: its row holds
            // another token.
            let keys = missing
                .iter()
                .map(|&at| completions[at].key.into())
                .collect();
            let rows = self
                .read(&mut tx, &self.table.tokens_many(missing.len()), keys)
                .await?;
            let mut seen = vec![false; completions.len()];
            for row in &rows {
                let at = self.position(&positions, row, &mut seen)?;
                let holder: Option<Vec<u8>> = row.get_opt(1).and_then(Result::ok);
                written[at] =
                    holder.as_deref() == Some(Uuid::from(completions[at].token).as_bytes());
            }
        }
        tx.commit().await.map_err(|e| self.db_error(e))?;
        Ok(written)
    }

    async fn release_once(&self, key: &str, token: Token) -> Result<bool, StoreError> {
        check_key(key)?;
        let mut conn = self.conn().await?;
        let deleted = self
            .write(
                &mut conn,
                &self.table.sql.release,
                vec![key.into(), token_bytes(token)],
            )
            .await?;
        Ok(deleted > 0)
    }

    async fn release_many_once(&self, releases: &[(&str, Token)]) -> Result<Vec<bool>, StoreError> {
        let positions = positions("release_many", releases.iter().map(|(key, _)| *key))?;
        for (key, _) in releases {
            check_key(key)?;
        }
        let mut keys: Vec<&str> = releases.iter().map(|(key, _)| *key).collect();
        keys.sort_unstable();
        let mut tx = self.transaction().await?;
        let rows = self
            .read(
                &mut tx,
                &self.table.lock_many(keys.len()),
                keys.iter().map(|&key| key.into()).collect(),
            )
            .await?;
        let mut found = vec![false; releases.len()];
        let mut doomed = Vec::new();
        for row in &rows {
            let at = self.position(&positions, row, &mut found)?;
            let locked = self.locked(row)?;
            if locked.state == "pending" && locked.token == Uuid::from(releases[at].1).as_bytes() {
                doomed.push(at);
            }
        }
        let mut deleted = vec![false; releases.len()];
        if !doomed.is_empty() {
            let keys = doomed.iter().map(|&at| releases[at].0.into()).collect();
            self.write(&mut tx, &self.table.delete_many(doomed.len()), keys)
                .await?;
            for at in doomed {
                deleted[at] = true;
            }
        }
        tx.commit().await.map_err(|e| self.db_error(e))?;
        Ok(deleted)
    }

    async fn extend_once(
        &self,
        key: &str,
        token: Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        check_key(key)?;
        let mut conn = self.conn().await?;
        let moved = self
            .write(
                &mut conn,
                &self.table.sql.extend,
                vec![micros(lease).into(), key.into(), token_bytes(token)],
            )
            .await?;
        Ok(moved > 0)
    }
}

impl MySqlStore {
    /// The single reserve's statements on `conn`; see the [module docs](self).
    async fn reserve_on(
        &self,
        conn: &mut Conn,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
        token: Token,
    ) -> Result<Reservation, StoreError> {
        let fp = fingerprint.as_bytes().to_vec();
        for _ in 0..RESERVE_ATTEMPTS {
            let inserted = self
                .write(
                    conn,
                    &self.table.sql.insert,
                    vec![
                        key.into(),
                        token_bytes(token),
                        fp.clone().into(),
                        micros(lease).into(),
                    ],
                )
                .await?;
            if inserted == 1 {
                return Ok(Reservation::Reserved { token });
            }
            // A row is there, most often a live one: a repeat, answered from the row as read.
            let rows = self
                .read(conn, &self.table.sql.peek, vec![key.into()])
                .await?;
            let Some(row) = rows.first() else {
                // Deleted since the insert (released, purged): insert again.
                continue;
            };
            let peeked = self.peeked(row, 0)?;
            if !peeked.takeable_by(&fp) {
                return self
                    .record(row, 0)
                    .map(|record| Reservation::Held { record });
            }
            let taken = self
                .write(
                    conn,
                    &self.table.sql.take,
                    vec![
                        fp.clone().into(),
                        fp.clone().into(),
                        token_bytes(token),
                        micros(lease).into(),
                        key.into(),
                        peeked.token.clone().into(),
                        fp.clone().into(),
                    ],
                )
                .await?;
            if taken == 1 {
                return self.taken(row, &peeked, token);
            }
            // Another session changed the row after the peek: read it again.
        }
        Err(StoreError::new(
            StoreErrorKind::Unavailable,
            "reserve found the key changing under it on every attempt",
        ))
    }
}
