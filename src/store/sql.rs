//! The [`Store`] shape the SQL stores share: each backend writes its single operations
//! ([`SqlOperations`]) and the functions here wrap them in what every SQL store owes its
//! caller, the same way: the store's timeout around each operation, the [`Unanswered`] guard
//! around each reserve, and nothing asked of the server for an empty batch. [`impl_store!`]
//! writes a backend's `impl Store` over them.

use std::future::Future;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::fingerprint::Fingerprint;
use crate::outcome::Outcome;
use crate::store::admin::{AdminOutcome, Cursor, Force, Inspected, Page, Resolution};
use crate::store::unanswered::Unanswered;
use crate::store::{Completion, Reservation, Store, StoreError, StoreErrorKind, Token};

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
        let timeout = self.timeout();
        async move {
            tokio::time::timeout(timeout, work())
                .await
                .unwrap_or_else(|_elapsed| Err(StoreError::timeout()))
        }
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
        let unanswered = Unanswered::arm(store, vec![(key, token)]);
        let reservation = store
            .bounded(move || store.reserve_once(key, fingerprint, lease, token))
            .await?;
        unanswered.answered();
        Ok(reservation)
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
        let reserved = requests
            .iter()
            .map(|(key, _)| *key)
            .zip(tokens.iter().copied());
        let unanswered = Unanswered::arm(store, reserved.collect());
        let answers = store
            .bounded(|| store.reserve_many_once(requests, lease, &tokens))
            .await?;
        unanswered.answered();
        Ok(answers)
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

/// One SQL backend's purge statement; [`purge_expired`] and [`spawn_purge`] run it.
pub(crate) trait SqlPurge: SqlOperations {
    /// The most rows one purge statement deletes.
    fn purge_rows(&self) -> u32;

    /// The table's name, for the background purge's logs.
    fn table_name(&self) -> &str;

    /// Deletes at most [`purge_rows`](Self::purge_rows) expired rows, answering how many went.
    fn purge_once(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// A SQL store's `purge_expired`: purge statements, each bounded by the operation timeout,
/// until one finds fewer rows than it may delete.
pub(crate) async fn purge_expired<S: SqlPurge>(store: &S) -> Result<u64, StoreError> {
    let batch = u64::from(store.purge_rows());
    let mut purged = 0;
    loop {
        let deleted = store.bounded(|| store.purge_once()).await?;
        purged += deleted;
        if deleted < batch {
            return Ok(purged);
        }
    }
}

/// A SQL store's `spawn_purge`: [`purge_expired`] now and then every `every` (at least 1 ms)
/// on the current Tokio runtime, a failure logged and tried again next time.
pub(crate) fn spawn_purge<S: SqlPurge>(
    store: &S,
    every: Duration,
) -> Result<tokio::task::JoinHandle<()>, StoreError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
        StoreError::new(
            StoreErrorKind::Unavailable,
            "spawn_purge must be called within a Tokio runtime",
        )
        .with_source(e)
    })?;
    let store = store.clone();
    let every = every.max(Duration::from_millis(1));
    Ok(runtime.spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match purge_expired(&store).await {
                Ok(0) => {}
                Ok(purged) => tracing::debug!(
                    table = %store.table_name(),
                    purged,
                    "purged expired idempotency keys"
                ),
                Err(error) => tracing::warn!(
                    table = %store.table_name(),
                    error = %error,
                    "purging expired idempotency keys failed"
                ),
            }
        }
    }))
}

/// One SQL backend's operator operations, each one attempt on the server, unbounded:
/// [`impl_store_admin!`] bounds each by the store's timeout.
pub(crate) trait SqlAdmin: SqlOperations {
    /// Reads the record that holds `key`.
    fn inspect_once(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Inspected>, StoreError>> + Send;

    /// Deletes the record of `key` unless a live send holds it (or `force`).
    fn forget_once(
        &self,
        key: &str,
        force: Force,
    ) -> impl Future<Output = Result<AdminOutcome, StoreError>> + Send;

    /// Settles `key` as `resolution` says unless a live send holds it (or `force`).
    fn resolve_once(
        &self,
        key: &str,
        resolution: &Resolution,
        force: Force,
    ) -> impl Future<Output = Result<AdminOutcome, StoreError>> + Send;

    /// Reads the page of records after `after`, at most `limit` of them.
    fn list_once(
        &self,
        after: Option<&Cursor>,
        limit: usize,
    ) -> impl Future<Output = Result<Page, StoreError>> + Send;
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

/// Writes `impl StoreAdmin` for a [`SqlAdmin`] backend, each operation bounded by the store's
/// timeout; the attributes given (the impl's doc comment) go on the impl.
macro_rules! impl_store_admin {
    ($(#[$attr:meta])* $store:ty) => {
        const _: () = {
            use futures_util::future::BoxFuture;

            use $crate::store::StoreError;
            use $crate::store::admin::{
                AdminOutcome, Cursor, Force, Inspected, Page, Resolution, StoreAdmin,
            };
            use $crate::store::sql::{SqlAdmin, SqlOperations};

            $(#[$attr])*
            impl StoreAdmin for $store {
                fn inspect<'a>(
                    &'a self,
                    key: &'a str,
                ) -> BoxFuture<'a, Result<Option<Inspected>, StoreError>> {
                    Box::pin(self.bounded(move || self.inspect_once(key)))
                }

                fn forget<'a>(
                    &'a self,
                    key: &'a str,
                    force: Force,
                ) -> BoxFuture<'a, Result<AdminOutcome, StoreError>> {
                    Box::pin(self.bounded(move || self.forget_once(key, force)))
                }

                fn resolve<'a>(
                    &'a self,
                    key: &'a str,
                    resolution: &'a Resolution,
                    force: Force,
                ) -> BoxFuture<'a, Result<AdminOutcome, StoreError>> {
                    Box::pin(self.bounded(move || self.resolve_once(key, resolution, force)))
                }

                fn list<'a>(
                    &'a self,
                    after: Option<&'a Cursor>,
                    limit: usize,
                ) -> BoxFuture<'a, Result<Page, StoreError>> {
                    Box::pin(self.bounded(move || self.list_once(after, limit)))
                }
            }
        };
    };
}

pub(crate) use impl_store_admin;
