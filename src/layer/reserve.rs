//! Reserving keys in the store, drop-safe: a reservation abandoned while the store is still
//! answering (the caller dropped the send, or the reserve timeout fired) finishes in the
//! background and frees what it reserved at once, not after a lease.

use std::future::{Future, poll_fn};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;

use super::config::Config;
use crate::fingerprint::Fingerprint;
use crate::store::{Reservation, StoreError, StoreErrorKind, Token};

/// Awaits a store call under the reserve timeout. If the caller drops the send, or the
/// timeout fires, while the store is still answering, `abandon` gets the unfinished call to
/// finish in the background (so reservations it makes are freed at once, not after a lease).
/// A store that bounds its own calls within the timeout gets no second timer
/// ([`Store::call_timeout`](crate::store::Store::call_timeout)). Without a tokio runtime there
/// is no timer, and the call is awaited unbounded (the layer's timeouts need a runtime, as
/// documented).
async fn bounded<T, A>(
    config: &Config,
    future: BoxFuture<'static, Result<T, StoreError>>,
    abandon: A,
) -> Result<T, StoreError>
where
    T: Send + 'static,
    A: FnOnce(BoxFuture<'static, Result<T, StoreError>>),
{
    let mut pending = Pending {
        future: Some(future),
        abandon: Some(abandon),
    };
    let call = poll_fn(|cx| pending.poll(cx));
    if config.store_bounds_calls() || tokio::runtime::Handle::try_current().is_err() {
        return call.await;
    }
    tokio::time::timeout(config.reserve_timeout, call)
        .await
        .unwrap_or_else(|_elapsed| Err(StoreError::timeout()))
}

/// A store call and what to do with it if it is dropped unfinished. The closure is kept as
/// it is (not boxed): a reserve that answers at once never calls it, and should not
/// allocate for it.
struct Pending<T, A: FnOnce(BoxFuture<'static, Result<T, StoreError>>)> {
    future: Option<BoxFuture<'static, Result<T, StoreError>>>,
    abandon: Option<A>,
}

impl<T, A: FnOnce(BoxFuture<'static, Result<T, StoreError>>)> Pending<T, A> {
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

impl<T, A: FnOnce(BoxFuture<'static, Result<T, StoreError>>)> Drop for Pending<T, A> {
    fn drop(&mut self) {
        if let (Some(future), Some(abandon)) = (self.future.take(), self.abandon.take()) {
            abandon(future);
        }
    }
}

/// Reserves one key, bounded by the reserve timeout, freeing it in the background if the
/// reservation is abandoned.
pub(crate) async fn reserve_one(
    config: &Arc<Config>,
    key: &Arc<str>,
    fingerprint: Fingerprint,
) -> Result<Reservation, StoreError> {
    // A store that answers at once needs no future, no bound and nothing to abandon.
    if let Some(answer) = config.store.reserve_now(key, fingerprint, config.lease) {
        return answer;
    }
    let store = Arc::clone(&config.store);
    let owned = Arc::clone(key);
    let lease = config.lease;
    let future = async move { store.reserve(&owned, fingerprint, lease).await }.boxed();
    // The store and key are cloned for the background only when a call is abandoned: the
    // store's count is shared by every send, and each clone is a write to it.
    bounded(config, future, move |unfinished| {
        let store = Arc::clone(&config.store);
        let owned = Arc::clone(key);
        spawn_detached(async move {
            // A takeover stays held: freeing it would forget that its earlier attempt may
            // have sent, and once its lease passes the next reserve takes it over again.
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
                        // Not a takeover: see `reserve_one`.
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
