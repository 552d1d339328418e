//! The [`Store`] shape the SQL stores share: each backend writes its single operations
//! ([`SqlOperations`]) and this one implementation wraps them in what every SQL store owes its
//! caller, the same way: the store's timeout around each operation, the [`Unanswered`] guard
//! around each reserve, and nothing asked of the server for an empty batch.

use std::future::Future;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::fingerprint::Fingerprint;
use crate::outcome::Outcome;
use crate::store::unanswered::Unanswered;
use crate::store::{Completion, Reservation, Store, StoreError, Token};

/// One SQL backend's operations, each one attempt on the server, neither bounded nor guarded:
/// the [`Store`] implementation below adds both.
pub(crate) trait SqlOperations: Clone + Send + Sync + 'static {
    /// The bound on each operation, the wait for a pooled connection included.
    fn timeout(&self) -> Duration;

    /// Reserves `key` for `token`, the token a caller learns from the answer.
    fn reserve_once(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
        token: Token,
    ) -> impl Future<Output = Result<Reservation, StoreError>> + Send;

    /// Takes back an expired pending `key` of the same fingerprint, under a new token.
    fn retake_once(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
        within: Duration,
    ) -> impl Future<Output = Result<Option<Token>, StoreError>> + Send;

    /// Reserves each of `requests` for the token at its position in `tokens`.
    fn reserve_many_once(
        &self,
        requests: &[(&str, Fingerprint)],
        lease: Duration,
        tokens: &[Token],
    ) -> impl Future<Output = Result<Vec<Result<Reservation, StoreError>>, StoreError>> + Send;

    /// Records `outcome` on `key` if `token` still holds it.
    fn complete_once(
        &self,
        key: &str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &Outcome,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Records each completion whose token still holds its key.
    fn complete_many_once(
        &self,
        completions: &[Completion<'_>],
        ttl: Duration,
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send;

    /// Frees `key` if `token` holds it pending.
    fn release_once(
        &self,
        key: &str,
        token: Token,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Frees each key its token holds pending.
    fn release_many_once(
        &self,
        releases: &[(&str, Token)],
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send;

    /// Moves the lease of `key` on if `token` holds it pending.
    fn extend_once(
        &self,
        key: &str,
        token: Token,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Runs the call `work` makes within the operation timeout, failing it as timed out past
    /// it: the store bounds its own calls, with the layer or without it.
    fn bounded<T, F>(
        &self,
        work: impl FnOnce() -> F + Send,
    ) -> impl Future<Output = Result<T, StoreError>> + Send
    where
        F: Future<Output = Result<T, StoreError>> + Send,
    {
        let timeout = self.timeout();
        async move {
            tokio::time::timeout(timeout, work())
                .await
                .unwrap_or_else(|_elapsed| Err(StoreError::timeout()))
        }
    }
}

impl<S: SqlOperations> Store for S {
    fn reserve<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        Box::pin(async move {
            let token = Token::new();
            let unanswered = Unanswered::arm(self, vec![(key, token)]);
            let reservation = self
                .bounded(move || self.reserve_once(key, fingerprint, lease, token))
                .await?;
            unanswered.answered();
            Ok(reservation)
        })
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.bounded(move || self.complete_once(key, token, fingerprint, outcome, ttl)))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.bounded(move || self.release_once(key, token)))
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.bounded(move || self.extend_once(key, token, lease)))
    }

    fn retake<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
        within: Duration,
    ) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        Box::pin(self.bounded(move || self.retake_once(key, fingerprint, lease, within)))
    }

    fn reserve_many<'a>(
        &'a self,
        requests: &'a [(&'a str, Fingerprint)],
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<Result<Reservation, StoreError>>, StoreError>> {
        Box::pin(async move {
            if requests.is_empty() {
                return Ok(Vec::new());
            }
            let tokens: Vec<Token> = requests.iter().map(|_| Token::new()).collect();
            let reserved = requests
                .iter()
                .map(|(key, _)| *key)
                .zip(tokens.iter().copied());
            let unanswered = Unanswered::arm(self, reserved.collect());
            let answers = self
                .bounded(|| self.reserve_many_once(requests, lease, &tokens))
                .await?;
            unanswered.answered();
            Ok(answers)
        })
    }

    fn complete_many<'a>(
        &'a self,
        completions: &'a [Completion<'a>],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(async move {
            if completions.is_empty() {
                return Ok(Vec::new());
            }
            self.bounded(move || self.complete_many_once(completions, ttl))
                .await
        })
    }

    fn release_many<'a>(
        &'a self,
        releases: &'a [(&'a str, Token)],
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(async move {
            if releases.is_empty() {
                return Ok(Vec::new());
            }
            self.bounded(move || self.release_many_once(releases)).await
        })
    }
}
