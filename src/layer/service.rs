//! [`Idempotency`]: the service the layer makes, and the send flow.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use sha2::{Digest, Sha256};
use tower_service::Service;

use super::classify::classify;
use super::future::ResponseFuture;
use super::layer::Config;
use super::settle::{Finish, Held, Settle, reserve_one};
use super::stats::bump;
use crate::fingerprint::{Fingerprint, Fingerprinted};
use crate::message::{KeyError, Message, RawMessage, validate_key};
use crate::outcome::{BoxError, Receipt, SendError, codes};
use crate::store::{RecordState, Reservation, StoreError};

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

    pub(crate) fn config(&self) -> &Arc<Config> {
        &self.config
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
pub trait IdempotentRequest:
    Fingerprinted + Clone + Send + Sync + 'static + sealed::Sealed
{
    /// The request's key under the layer's options: `None` when it has none, an error when
    /// the key function gave an invalid one.
    #[doc(hidden)]
    fn key_in<'a>(&'a self, config: &LayerOptions<'_>) -> Option<Result<Cow<'a, str>, KeyError>>;

    /// Every recipient, in a fixed order: what a kept receipt's accepted recipients point into.
    #[doc(hidden)]
    fn recipient_list(&self) -> Vec<&str>;
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

    fn recipient_list(&self) -> Vec<&str> {
        self.recipients().collect()
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

    fn recipient_list(&self) -> Vec<&str> {
        self.envelope().to().iter().map(String::as_str).collect()
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

/// What the layer makes of a request's key.
pub(crate) enum KeyOf {
    /// No key: sent as it is, the store untouched.
    Unkeyed,
    /// A key the rules refuse: answered `idempotency.invalid_key`, not sent.
    Invalid(SendError),
    /// The key as stored: `namespace:key`.
    Keyed(Arc<str>),
}

/// The request's key in the store, counting and logging what is not one.
pub(crate) fn store_key<R: IdempotentRequest>(config: &Config, request: &R) -> KeyOf {
    match request.key_in(&LayerOptions(config)) {
        None => {
            bump(&config.counters.unkeyed);
            KeyOf::Unkeyed
        }
        Some(Err(error)) => {
            bump(&config.counters.invalid_key);
            tracing::warn!(
                namespace = %config.namespace,
                code = codes::INVALID_KEY,
                error = %error,
                "idempotency key refused"
            );
            KeyOf::Invalid(SendError::invalid_key(error))
        }
        Some(Ok(key)) => KeyOf::Keyed(Arc::from(format!("{}:{key}", config.namespace))),
    }
}

async fn send<S, R>(config: Arc<Config>, mut inner: S, request: R) -> Result<Receipt, SendError>
where
    R: IdempotentRequest,
    S: Service<R, Response = Receipt>,
    S::Error: Into<BoxError>,
{
    let counters = &config.counters;
    let store_key = match store_key(&config, &request) {
        KeyOf::Unkeyed => {
            return inner
                .call(request)
                .await
                .map_err(|e| classify(&config, e.into()));
        }
        KeyOf::Invalid(error) => return Err(error),
        KeyOf::Keyed(key) => key,
    };
    let fingerprint = request.fingerprint();

    let token = match reserve_one(&config, &store_key, fingerprint).await {
        Ok(Reservation::Reserved { token }) => token,
        Ok(Reservation::Held { record }) => {
            return answer_held(&config, &store_key, fingerprint, record, &request);
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

    let mut settle = Settle::new(
        Arc::clone(&config),
        vec![Held {
            key: store_key,
            token,
            fingerprint,
        }],
    );
    bump(&counters.sent);
    let kept = request.clone();
    let result = inner
        .call(request)
        .await
        .map_err(|e| classify(&config, e.into()));
    settle
        .run(vec![Finish::for_result(&result, &kept.recipient_list())])
        .await;
    result
}

pub(crate) fn answer_held<R: IdempotentRequest>(
    config: &Config,
    store_key: &str,
    fingerprint: Fingerprint,
    record: crate::store::Record,
    request: &R,
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
            outcome.into_replay_for(&request.recipient_list())
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
