//! The [`Store`] shape the SQL stores share: each backend writes its single operations
//! ([`SqlOperations`]) and the functions here wrap them in what every SQL store owes its
//! caller, the same way: the store's timeout around each operation, the [`Unanswered`] guard
//! around each reserve, and nothing asked of the server for an empty batch. [`impl_store!`]
//! writes a backend's `impl Store` over them; [`purge`] and [`admin`] do the same for the
//! purge loop and the operator operations.

use std::future::Future;
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};

use crate::fingerprint::Fingerprint;
use crate::outcome::Outcome;
use crate::store::unanswered::{self, Unanswered};
use crate::store::{Completion, Reservation, Store, StoreError, Token};

mod admin;
mod purge;

pub(crate) use admin::{SqlAdmin, impl_store_admin};
pub(crate) use purge::{SqlPurge, purge_expired, spawn_purge};

/// One SQL backend's operations, each one attempt on the server, neither bounded nor guarded:
/// the functions below add both.
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
        tokio::time::timeout(self.timeout(), work())
            .map(|bounded| bounded.unwrap_or_else(|_elapsed| Err(StoreError::timeout())))
    }
}

/// [`Store::reserve`]: under a new token, guarded until its answer is read.
pub(crate) fn reserve<'a, S: SqlOperations + Store>(
    store: &'a S,
    key: &'a str,
    fingerprint: Fingerprint,
    lease: Duration,
) -> BoxFuture<'a, Result<Reservation, StoreError>> {
    Box::pin(async move {
        let token = Token::new();
        let reserved = [(key, token)];
        let guard = Unanswered::arm(store, &reserved);
        let answer = store
            .bounded(move || store.reserve_once(key, fingerprint, lease, token))
            .await;
        guard.answered(answer)
    })
}

/// [`Store::complete`].
pub(crate) fn complete<'a, S: SqlOperations>(
    store: &'a S,
    key: &'a str,
    token: Token,
    fingerprint: Fingerprint,
    outcome: &'a Outcome,
    ttl: Duration,
) -> BoxFuture<'a, Result<bool, StoreError>> {
    Box::pin(store.bounded(move || store.complete_once(key, token, fingerprint, outcome, ttl)))
}

/// [`Store::release`].
pub(crate) fn release<'a, S: SqlOperations>(
    store: &'a S,
    key: &'a str,
    token: Token,
) -> BoxFuture<'a, Result<bool, StoreError>> {
    Box::pin(store.bounded(move || store.release_once(key, token)))
}

/// [`Store::extend`].
pub(crate) fn extend<'a, S: SqlOperations>(
    store: &'a S,
    key: &'a str,
    token: Token,
    lease: Duration,
) -> BoxFuture<'a, Result<bool, StoreError>> {
    Box::pin(store.bounded(move || store.extend_once(key, token, lease)))
}

/// [`Store::retake`].
pub(crate) fn retake<'a, S: SqlOperations>(
    store: &'a S,
    key: &'a str,
    fingerprint: Fingerprint,
    lease: Duration,
    within: Duration,
) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
    Box::pin(store.bounded(move || store.retake_once(key, fingerprint, lease, within)))
}

/// [`Store::reserve_many`]: under a new token each, guarded until their answers are read.
pub(crate) fn reserve_many<'a, S: SqlOperations + Store>(
    store: &'a S,
    requests: &'a [(&'a str, Fingerprint)],
    lease: Duration,
) -> BoxFuture<'a, Result<Vec<Result<Reservation, StoreError>>, StoreError>> {
    Box::pin(async move {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let tokens: Vec<Token> = requests.iter().map(|_| Token::new()).collect();
        let reserved = unanswered::pairs(requests, &tokens);
        let guard = Unanswered::arm(store, &reserved);
        let answer = store
            .bounded(|| store.reserve_many_once(requests, lease, &tokens))
            .await;
        guard.answered(answer)
    })
}

/// [`Store::complete_many`]: nothing asked for no completions.
pub(crate) fn complete_many<'a, S: SqlOperations>(
    store: &'a S,
    completions: &'a [Completion<'a>],
    ttl: Duration,
) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
    Box::pin(async move {
        if completions.is_empty() {
            return Ok(Vec::new());
        }
        store
            .bounded(move || store.complete_many_once(completions, ttl))
            .await
    })
}

/// [`Store::release_many`]: nothing asked for no releases.
pub(crate) fn release_many<'a, S: SqlOperations>(
    store: &'a S,
    releases: &'a [(&'a str, Token)],
) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
    Box::pin(async move {
        if releases.is_empty() {
            return Ok(Vec::new());
        }
        store
            .bounded(move || store.release_many_once(releases))
            .await
    })
}

/// Writes `impl Store` for a [`SqlOperations`] backend, each method one of the functions
/// above. A macro rather than a blanket impl, so that the docs list each store among the
/// implementors of `Store`.
macro_rules! impl_store {
    ($store:ty) => {
        const _: () = {
            use std::time::Duration;

            use futures_util::future::BoxFuture;

            use $crate::fingerprint::Fingerprint;
            use $crate::outcome::Outcome;
            use $crate::store::sql;
            use $crate::store::{Completion, Reservation, Store, StoreError, Token};

            impl Store for $store {
                fn reserve<'a>(
                    &'a self,
                    key: &'a str,
                    fingerprint: Fingerprint,
                    lease: Duration,
                ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
                    sql::reserve(self, key, fingerprint, lease)
                }

                /// Every call is bounded by the store's operation timeout.
                fn call_timeout(&self) -> Option<Duration> {
                    Some(sql::SqlOperations::timeout(self))
                }

                fn complete<'a>(
                    &'a self,
                    key: &'a str,
                    token: Token,
                    fingerprint: Fingerprint,
                    outcome: &'a Outcome,
                    ttl: Duration,
                ) -> BoxFuture<'a, Result<bool, StoreError>> {
                    sql::complete(self, key, token, fingerprint, outcome, ttl)
                }

                fn release<'a>(
                    &'a self,
                    key: &'a str,
                    token: Token,
                ) -> BoxFuture<'a, Result<bool, StoreError>> {
                    sql::release(self, key, token)
                }

                fn extend<'a>(
                    &'a self,
                    key: &'a str,
                    token: Token,
                    lease: Duration,
                ) -> BoxFuture<'a, Result<bool, StoreError>> {
                    sql::extend(self, key, token, lease)
                }

                fn retake<'a>(
                    &'a self,
                    key: &'a str,
                    fingerprint: Fingerprint,
                    lease: Duration,
                    within: Duration,
                ) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
                    sql::retake(self, key, fingerprint, lease, within)
                }

                fn reserve_many<'a>(
                    &'a self,
                    requests: &'a [(&'a str, Fingerprint)],
                    lease: Duration,
                ) -> BoxFuture<'a, Result<Vec<Result<Reservation, StoreError>>, StoreError>>
                {
                    sql::reserve_many(self, requests, lease)
                }

                fn complete_many<'a>(
                    &'a self,
                    completions: &'a [Completion<'a>],
                    ttl: Duration,
                ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
                    sql::complete_many(self, completions, ttl)
                }

                fn release_many<'a>(
                    &'a self,
                    releases: &'a [(&'a str, Token)],
                ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
                    sql::release_many(self, releases)
                }
            }
        };
    };
}

pub(crate) use impl_store;
