//! The machinery around a send that makes it drop-safe: reservations that finish in the
//! background when abandoned, and settlements that keep or free keys even when the caller
//! drops the send.

use std::future::{Future, poll_fn};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;

use super::layer::Config;
use super::service::key_hash;
use super::stats::bump;
use crate::fingerprint::Fingerprint;
use crate::outcome::{Outcome, SendError, codes};
use crate::store::{Completion, Reservation, StoreError, StoreErrorKind, Token};

/// Awaits a store call under the reserve timeout. If the caller drops the send, or the
/// timeout fires, while the store is still answering, `abandon` gets the unfinished call to
/// finish in the background (so reservations it makes are freed at once, not after a lease).
pub(crate) async fn bounded<T: Send + 'static>(
    config: &Config,
    future: BoxFuture<'static, Result<T, StoreError>>,
    abandon: impl FnOnce(BoxFuture<'static, Result<T, StoreError>>) + Send + 'static,
) -> Result<T, StoreError> {
    let mut pending = Pending {
        future: Some(future),
        abandon: Some(Box::new(abandon)),
    };
    // An in-process store answers at once: take that answer without arming a timer.
    if let Some(result) = poll_fn(|cx| pending.poll(cx)).now_or_never() {
        return result;
    }
    let answer = poll_fn(|cx| pending.poll(cx));
    if tokio::runtime::Handle::try_current().is_ok() {
        match tokio::time::timeout(config.reserve_timeout, answer).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::timeout()),
        }
    } else {
        answer.await
    }
}

type Abandon<T> = Box<dyn FnOnce(BoxFuture<'static, Result<T, StoreError>>) + Send>;

struct Pending<T> {
    future: Option<BoxFuture<'static, Result<T, StoreError>>>,
    abandon: Option<Abandon<T>>,
}

impl<T> Pending<T> {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<T, StoreError>> {
        let Some(future) = self.future.as_mut() else {
            return Poll::Ready(Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "store call polled after it finished",
            )));
        };
        let result = std::task::ready!(future.poll_unpin(cx));
        self.future = None;
        Poll::Ready(result)
    }
}

impl<T> Drop for Pending<T> {
    fn drop(&mut self) {
        if let (Some(future), Some(abandon)) = (self.future.take(), self.abandon.take()) {
            abandon(future);
        }
    }
}

/// Reserves one key, freeing it in the background if the reservation is abandoned.
pub(crate) async fn reserve_one(
    config: &Arc<Config>,
    key: &Arc<str>,
    fingerprint: Fingerprint,
) -> Result<Reservation, StoreError> {
    let store = Arc::clone(&config.store);
    let owned = Arc::clone(key);
    let lease = config.lease;
    let future = async move { store.reserve(&owned, fingerprint, lease).await }.boxed();
    let store = Arc::clone(&config.store);
    let owned = Arc::clone(key);
    bounded(config, future, move |unfinished| {
        spawn_detached(async move {
            if let Ok(Reservation::Reserved { token }) = unfinished.await {
                // Nothing was sent under it; failing to free it only costs the lease.
                let _ = store.release(&owned, token).await;
            }
        });
    })
    .await
}

/// Reserves many distinct keys in one store call, freeing in the background whatever an
/// abandoned call reserves.
pub(crate) async fn reserve_many(
    config: &Arc<Config>,
    requests: Arc<[(Arc<str>, Fingerprint)]>,
) -> Result<Vec<Result<Reservation, StoreError>>, StoreError> {
    let store = Arc::clone(&config.store);
    let lease = config.lease;
    let asked = Arc::clone(&requests);
    let future = async move {
        let borrowed: Vec<(&str, Fingerprint)> =
            asked.iter().map(|(k, f)| (k.as_ref(), *f)).collect();
        store.reserve_many(&borrowed, lease).await
    }
    .boxed();
    let store = Arc::clone(&config.store);
    bounded(config, future, move |unfinished| {
        spawn_detached(async move {
            if let Ok(answers) = unfinished.await {
                let reserved: Vec<(&str, Token)> = requests
                    .iter()
                    .zip(answers)
                    .filter_map(|((key, _), answer)| match answer {
                        Ok(Reservation::Reserved { token }) => Some((key.as_ref(), token)),
                        _ => None,
                    })
                    .collect();
                let _ = store.release_many(&reserved).await;
            }
        });
    })
    .await
}

/// What to do with a reserved key once its send is over.
pub(crate) enum Finish {
    /// Keep it done with this outcome.
    Complete(Outcome),
    /// Free it: the message certainly did not go.
    Release,
}

impl Finish {
    /// The finish for a send's result: keep what may have gone, free what certainly did not.
    /// `recipients` are the message's, by which a receipt's accepted addresses are kept.
    pub(crate) fn for_result(
        result: &Result<crate::Receipt, SendError>,
        recipients: &[&str],
    ) -> Self {
        match result {
            Err(error) if !error.delivery_unknown() => Self::Release,
            _ => Self::Complete(Outcome::kept(result, recipients)),
        }
    }
}

/// A key this send reserved.
pub(crate) struct Held {
    pub(crate) key: Arc<str>,
    pub(crate) token: Token,
    pub(crate) fingerprint: Fingerprint,
}

/// Keeps or frees the keys a send reserved once it is over, and, when the caller drops the
/// send first, keeps them with an `idempotency.aborted` outcome from a background task. From
/// the moment it exists the message may go: a drop must never free a key.
pub(crate) struct Settle {
    config: Arc<Config>,
    held: Vec<Held>,
    finishes: Option<Vec<Finish>>,
    done: bool,
}

impl Settle {
    pub(crate) fn new(config: Arc<Config>, held: Vec<Held>) -> Self {
        Self {
            config,
            held,
            finishes: None,
            done: false,
        }
    }

    /// Settles each held key by its finish (one per key, in order).
    pub(crate) async fn run(&mut self, finishes: Vec<Finish>) {
        let finishes = self.finishes.insert(finishes);
        apply(&self.config, &self.held, finishes).await;
        self.done = true;
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        if self.done || self.held.is_empty() {
            return;
        }
        let finishes = self.finishes.take().unwrap_or_else(|| {
            self.held
                .iter()
                .map(|_| {
                    bump(&self.config.counters.aborted);
                    Finish::Complete(Outcome::Failed(SendError::aborted()))
                })
                .collect()
        });
        let config = Arc::clone(&self.config);
        let held = std::mem::take(&mut self.held);
        spawn_detached(async move {
            apply(&config, &held, &finishes).await;
        });
    }
}

async fn apply(config: &Config, held: &[Held], finishes: &[Finish]) {
    if let ([one], [finish]) = (held, finishes) {
        // The single send: one plain call, no batch bookkeeping on the hot path.
        let result = match finish {
            Finish::Complete(outcome) => {
                config
                    .store
                    .complete(&one.key, one.token, one.fingerprint, outcome, config.ttl)
                    .await
            }
            Finish::Release => config.store.release(&one.key, one.token).await,
        };
        report(
            config,
            std::iter::once(one),
            finish_name(finish),
            result.map(|w| vec![w]),
        );
        return;
    }
    let mut completions = Vec::new();
    let mut completed = Vec::new();
    let mut releases = Vec::new();
    let mut released = Vec::new();
    for (h, finish) in held.iter().zip(finishes) {
        match finish {
            Finish::Complete(outcome) => {
                completions.push(Completion {
                    key: &h.key,
                    token: h.token,
                    fingerprint: h.fingerprint,
                    outcome,
                });
                completed.push(h);
            }
            Finish::Release => {
                releases.push((h.key.as_ref(), h.token));
                released.push(h);
            }
        }
    }
    if !completions.is_empty() {
        let result = config.store.complete_many(&completions, config.ttl).await;
        report(config, completed.into_iter(), "keep the outcome", result);
    }
    if !releases.is_empty() {
        let result = config.store.release_many(&releases).await;
        report(config, released.into_iter(), "free the key", result);
    }
}

fn finish_name(finish: &Finish) -> &'static str {
    match finish {
        Finish::Complete(_) => "keep the outcome",
        Finish::Release => "free the key",
    }
}

/// Turns the store's answers after a send into warnings and counters; the caller already has
/// the real outcome.
fn report<'h>(
    config: &Config,
    held: impl ExactSizeIterator<Item = &'h Held>,
    action: &str,
    result: Result<Vec<bool>, StoreError>,
) {
    match result {
        Ok(written) => {
            for (h, written) in held.zip(written.into_iter().chain(std::iter::repeat(false))) {
                if !written {
                    bump(&config.counters.lease_lost);
                    tracing::warn!(
                        namespace = %config.namespace,
                        key_hash = %key_hash(&h.key),
                        code = codes::STORE_FAILED_WARNING,
                        "the lease passed before the send finished and another send holds the \
                         key; make the lease longer than a send with all its retries"
                    );
                }
            }
        }
        Err(error) => {
            for h in held {
                bump(&config.counters.store_failed_after_send);
                tracing::warn!(
                    namespace = %config.namespace,
                    key_hash = %key_hash(&h.key),
                    code = codes::STORE_FAILED_WARNING,
                    error = %error,
                    "idempotency store failed to {action} after the send; the caller got the \
                     real outcome"
                );
            }
        }
    }
}

/// Runs `future` on the current tokio runtime, if there is one. Without one it is dropped:
/// an aborted send's key then stays pending until its lease ends (see the crate docs).
pub(crate) fn spawn_detached<F>(future: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        drop(handle.spawn(future));
    }
}
