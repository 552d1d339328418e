//! [`Idempotency`]: the service the layer makes, and the send flow.

use std::borrow::Cow;
use std::fmt;
use std::future::{Future, poll_fn};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use sha2::{Digest, Sha256};
use tower_service::Service;

use super::classify::classify;
use super::future::ResponseFuture;
use super::layer::Config;
use super::stats::bump;
use crate::fingerprint::{Fingerprint, Fingerprinted};
use crate::message::{KeyError, Message, RawMessage, validate_key};
use crate::outcome::{BoxError, Outcome, Receipt, SendError, codes};
use crate::store::{RecordState, Reservation, StoreError, Token};

/// The service made by [`IdempotencyLayer`](super::IdempotencyLayer): it wraps a provider
/// client and sends each keyed message once.
///
/// It serves [`Message`] and [`RawMessage`] (any [`IdempotentRequest`]) when the inner
/// service does, and answers with a [`SendError`].
///
/// Readiness is the inner service's: `poll_ready` forwards to it, and `call` moves the ready
/// inner service into the response future (cloning a fresh one in its place), so a service
/// that holds a permit while ready (a concurrency limit) keeps it for that send.
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> Idempotency<S> {
    pub(crate) fn from_parts(inner: S, config: Arc<Config>) -> Self {
        Self { inner, config }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::Message {}
    impl Sealed for crate::RawMessage {}
}

/// A request the layer can deduplicate: [`Message`] and [`RawMessage`].
///
/// Sealed: the key rules and fingerprints are the crate's.
pub trait IdempotentRequest: Fingerprinted + Send + 'static + sealed::Sealed {
    /// The request's key under the layer's options: `None` when it has none, an error when
    /// the key function gave an invalid one.
    #[doc(hidden)]
    fn key_in<'a>(&'a self, config: &LayerOptions<'_>) -> Option<Result<Cow<'a, str>, KeyError>>;
}

/// The options a request's key depends on (opaque).
#[doc(hidden)]
#[allow(missing_debug_implementations)]
pub struct LayerOptions<'c>(&'c Config);

fn checked(key: Option<String>) -> Option<Result<Cow<'static, str>, KeyError>> {
    key.map(|key| validate_key(&key).map(|()| Cow::Owned(key)))
}

impl IdempotentRequest for Message {
    fn key_in<'a>(&'a self, options: &LayerOptions<'_>) -> Option<Result<Cow<'a, str>, KeyError>> {
        match &options.0.key {
            Some(key) => checked(key(self)),
            None => self
                .idempotency_key()
                .map(|key| Ok(Cow::Borrowed(key.as_str()))),
        }
    }
}

impl IdempotentRequest for RawMessage {
    fn key_in<'a>(&'a self, options: &LayerOptions<'_>) -> Option<Result<Cow<'a, str>, KeyError>> {
        options
            .0
            .raw_key
            .as_ref()
            .and_then(|key| checked(key(self)))
    }
}

impl<S, R> Service<R> for Idempotency<S>
where
    R: IdempotentRequest,
    S: Service<R, Response = Receipt> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Receipt;
    type Error = SendError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| classify(&self.config, e.into()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        // The ready service goes into the future; a fresh clone waits for the next poll_ready.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(send(Arc::clone(&self.config), inner, request).boxed())
    }
}

/// A short, stable hash of a key for logs: keys often hold an address, so the raw key is
/// never logged.
pub(crate) fn key_hash(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

async fn send<S, R>(config: Arc<Config>, mut inner: S, request: R) -> Result<Receipt, SendError>
where
    R: IdempotentRequest,
    S: Service<R, Response = Receipt>,
    S::Error: Into<BoxError>,
{
    let counters = &config.counters;
    let store_key: Arc<str> = match request.key_in(&LayerOptions(&config)) {
        None => {
            bump(&counters.unkeyed);
            return inner
                .call(request)
                .await
                .map_err(|e| classify(&config, e.into()));
        }
        Some(Err(error)) => {
            bump(&counters.invalid_key);
            tracing::warn!(
                namespace = %config.namespace,
                code = codes::INVALID_KEY,
                error = %error,
                "idempotency key refused"
            );
            return Err(SendError::invalid_key(error));
        }
        Some(Ok(key)) => Arc::from(format!("{}:{key}", config.namespace)),
    };
    let fingerprint = request.fingerprint();

    let token = match reserve(&config, &store_key, fingerprint).await {
        Ok(Reservation::Reserved { token }) => token,
        Ok(Reservation::Held { record }) => {
            return answer_held(&config, &store_key, fingerprint, record);
        }
        Err(error) => {
            bump(&counters.store_failed);
            tracing::warn!(
                namespace = %config.namespace,
                key_hash = %key_hash(&store_key),
                code = codes::STORE_FAILED,
                error = %error,
                "idempotency store failed to reserve; message not sent"
            );
            return Err(SendError::store_failed(error));
        }
    };

    // From here the message may go: a drop must never free the key.
    let mut settle = Settle {
        config: Arc::clone(&config),
        key: Arc::clone(&store_key),
        token,
        fingerprint,
        finish: None,
        done: false,
    };
    bump(&counters.sent);
    let result = inner
        .call(request)
        .await
        .map_err(|e| classify(&config, e.into()));
    settle.finish = Some(match &result {
        Ok(receipt) => Finish::Complete(Outcome::Sent(receipt.clone())),
        Err(error) if error.delivery_unknown() => Finish::Complete(Outcome::Failed(error.clone())),
        Err(_) => Finish::Release,
    });
    settle.run().await;
    result
}

fn answer_held(
    config: &Config,
    store_key: &str,
    fingerprint: Fingerprint,
    record: crate::store::Record,
) -> Result<Receipt, SendError> {
    let counters = &config.counters;
    if record.fingerprint != fingerprint {
        bump(&counters.key_reused);
        tracing::warn!(
            namespace = %config.namespace,
            key_hash = %key_hash(store_key),
            code = codes::KEY_REUSED,
            "idempotency key reused for a different message; not sent"
        );
        return Err(SendError::key_reused());
    }
    match (record.state, record.outcome) {
        (RecordState::Pending, _) => {
            bump(&counters.in_flight);
            tracing::info!(
                namespace = %config.namespace,
                key_hash = %key_hash(store_key),
                code = codes::IN_FLIGHT,
                "send under this idempotency key is in flight; not sent"
            );
            Err(SendError::in_flight())
        }
        (RecordState::Done, Some(outcome)) => {
            bump(&counters.replayed);
            tracing::debug!(
                namespace = %config.namespace,
                key_hash = %key_hash(store_key),
                "answered from the idempotency store"
            );
            outcome.replay()
        }
        (RecordState::Done, None) => {
            bump(&counters.store_failed);
            tracing::warn!(
                namespace = %config.namespace,
                key_hash = %key_hash(store_key),
                code = codes::STORE_FAILED,
                "idempotency store answered a done record without an outcome; not sent"
            );
            Err(SendError::store_failed(StoreError::corrupt(
                "a done record has no outcome",
            )))
        }
    }
}

/// Reserves with the configured timeout. If the caller drops the send, or the timeout fires,
/// while the store is still answering, the reservation is finished in the background and
/// released at once, so the key is not held for a whole lease by a send that never happened.
async fn reserve(
    config: &Arc<Config>,
    store_key: &Arc<str>,
    fingerprint: Fingerprint,
) -> Result<Reservation, StoreError> {
    let store = Arc::clone(&config.store);
    let key = Arc::clone(store_key);
    let lease = config.lease;
    let mut pending = PendingReserve {
        future: Some(async move { store.reserve(&key, fingerprint, lease).await }.boxed()),
        config: Arc::clone(config),
        key: Arc::clone(store_key),
    };
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

struct PendingReserve {
    future: Option<BoxFuture<'static, Result<Reservation, StoreError>>>,
    config: Arc<Config>,
    key: Arc<str>,
}

impl PendingReserve {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<Reservation, StoreError>> {
        let Some(future) = self.future.as_mut() else {
            return Poll::Ready(Err(StoreError::new(
                crate::store::StoreErrorKind::Unavailable,
                "reservation polled after it finished",
            )));
        };
        let result = std::task::ready!(future.poll_unpin(cx));
        self.future = None;
        Poll::Ready(result)
    }
}

impl Drop for PendingReserve {
    fn drop(&mut self) {
        let Some(future) = self.future.take() else {
            return;
        };
        let store = Arc::clone(&self.config.store);
        let key = Arc::clone(&self.key);
        spawn_detached(async move {
            if let Ok(Reservation::Reserved { token }) = future.await {
                // Nothing was sent under this reservation; failing to free it only costs the
                // lease, so the error is not worth a warning.
                let _ = store.release(&key, token).await;
            }
        });
    }
}

enum Finish {
    Complete(Outcome),
    Release,
}

/// Keeps or frees a reserved key once the send is over, and, when the caller drops the send
/// first, keeps it with an `idempotency.aborted` outcome from a background task.
struct Settle {
    config: Arc<Config>,
    key: Arc<str>,
    token: Token,
    fingerprint: Fingerprint,
    finish: Option<Finish>,
    done: bool,
}

impl Settle {
    async fn run(&mut self) {
        if let Some(finish) = &self.finish {
            apply(
                &self.config,
                &self.key,
                self.token,
                self.fingerprint,
                finish,
            )
            .await;
        }
        self.done = true;
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let finish = self.finish.take().unwrap_or_else(|| {
            bump(&self.config.counters.aborted);
            Finish::Complete(Outcome::Failed(SendError::aborted()))
        });
        let config = Arc::clone(&self.config);
        let key = Arc::clone(&self.key);
        let (token, fingerprint) = (self.token, self.fingerprint);
        spawn_detached(async move {
            apply(&config, &key, token, fingerprint, &finish).await;
        });
    }
}

async fn apply(
    config: &Config,
    key: &str,
    token: Token,
    fingerprint: Fingerprint,
    finish: &Finish,
) {
    let (result, action) = match finish {
        Finish::Complete(outcome) => (
            config
                .store
                .complete(key, token, fingerprint, outcome, config.ttl)
                .await,
            "keep the outcome",
        ),
        Finish::Release => (config.store.release(key, token).await, "free the key"),
    };
    match result {
        Ok(true) => {}
        Ok(false) => {
            bump(&config.counters.lease_lost);
            tracing::warn!(
                namespace = %config.namespace,
                key_hash = %key_hash(key),
                code = codes::STORE_FAILED_WARNING,
                "the lease passed before the send finished and another send holds the key; \
                 make the lease longer than a send with all its retries"
            );
        }
        Err(error) => {
            bump(&config.counters.store_failed_after_send);
            tracing::warn!(
                namespace = %config.namespace,
                key_hash = %key_hash(key),
                code = codes::STORE_FAILED_WARNING,
                error = %error,
                "idempotency store failed to {action} after the send; the caller got the real outcome"
            );
        }
    }
}

/// Runs `future` on the current tokio runtime, if there is one. Without one it is dropped:
/// an aborted send's key then stays pending until its lease ends (see the crate docs).
fn spawn_detached<F>(future: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        drop(handle.spawn(future));
    }
}
