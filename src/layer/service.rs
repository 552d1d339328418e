//! [`Idempotency`]: the service the layer makes, and the flow of a single send.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use tokio::time::Instant;
use tower_service::Service;

use super::config::Config;
use super::future::ResponseFuture;
use super::key::{KeyOf, key_hash, raw_key, store_key};
use super::renew::{Held, Lease, given_up};
use super::repeat::answer_held;
use super::request::IdempotentRequest;
use super::resend::take_back;
use super::reserve::reserve_one;
use super::settle::{Finish, Settle};
use super::stats::bump;
use super::takeover::{Takeover, after_takeover};
use super::wait::wait_one;
use crate::classify::into_send_error;
use crate::outcome::{BoxError, Receipt, SendError};
use crate::store::Reservation;

/// The service made by [`IdempotencyLayer`](super::IdempotencyLayer): it wraps a provider
/// client and sends each keyed request once.
///
/// It serves any [`IdempotentRequest`] ([`Message`](crate::Message),
/// [`RawMessage`](crate::RawMessage), your own) and [`Batch`](crate::batch::Batch)es of them
/// when the inner service does, and answers with a [`SendError`].
///
/// Readiness is the inner service's: `poll_ready` forwards to it, and `call` moves the ready
/// inner service into the response future (cloning a fresh one in its place), so a service
/// that holds a permit while ready (a concurrency limit) keeps it for that send.
#[derive(Clone)]
pub struct Idempotency<S> {
    pub(super) inner: S,
    pub(super) config: Arc<Config>,
}

impl<S> Idempotency<S> {
    pub(super) fn new(inner: S, config: Arc<Config>) -> Self {
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

    /// Takes the ready inner service for one call, leaving a fresh clone to be polled ready
    /// for the next.
    pub(super) fn take_ready(&mut self) -> S
    where
        S: Clone,
    {
        let clone = self.inner.clone();
        std::mem::replace(&mut self.inner, clone)
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
            .map_err(|e| into_send_error(&self.config.classifier, e.into()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        let inner = self.take_ready();
        ResponseFuture::new(send(Arc::clone(&self.config), inner, request).boxed())
    }
}

/// One request: reserve its key, answer a repeat from the store, or send it and settle the
/// key by the outcome.
async fn send<S, R>(config: Arc<Config>, mut inner: S, request: R) -> Result<Receipt, SendError>
where
    R: IdempotentRequest,
    S: Service<R, Response = Receipt>,
    S::Error: Into<BoxError>,
{
    let counters = &config.counters;
    let store_key = match store_key(&config, &request) {
        KeyOf::Unkeyed => {
            // Unkeyed for the layer, so for the provider too.
            return inner
                .call(request.with_stored_key(None))
                .await
                .map_err(|e| into_send_error(&config.classifier, e.into()));
        }
        KeyOf::Invalid(error) => return Err(error),
        KeyOf::Keyed(key) => key,
    };
    let fingerprint = request.fingerprint();

    let mut asked_at = Instant::now();
    // A held key may yet be sent: after waiting for its send in flight, or taken back inside
    // the provider's window. Each is an option, off by default, and asked only when set, so a
    // replay does not carry its record through two steps that would hand it back unchanged.
    // Their futures, and a takeover's below, are boxed: held inline, the largest of them would
    // set the size of every send's future, which is allocated and moved on every call.
    let mut reservation = reserve_one(&config, &store_key, fingerprint).await;
    if config.wait_for_in_flight.is_some()
        && let Ok(Reservation::Held { record }) = reservation
    {
        let waited = wait_one(&config, &store_key, fingerprint, record, &mut asked_at);
        reservation = Box::pin(waited).await;
    }
    if config.provider_window.is_some() {
        let taken = take_back(&config, &store_key, fingerprint, reservation, &mut asked_at);
        reservation = Box::pin(taken).await;
    }
    let token = match reservation {
        Ok(Reservation::Reserved { token }) => token,
        Ok(Reservation::TakenOver { token, previous }) => {
            let raw = raw_key(&config, &request);
            let recipients = request.recipients();
            let held = Held {
                key: Arc::clone(&store_key),
                token,
                fingerprint,
            };
            let decided = Box::pin(after_takeover(
                &config,
                held,
                previous,
                raw,
                &recipients,
                asked_at,
            ))
            .await;
            match decided {
                Takeover::Send => token,
                Takeover::Answered(answer) => return answer,
            }
        }
        Ok(Reservation::Held { record }) => {
            return answer_held(&config, &store_key, fingerprint, record, &request);
        }
        Err(error) => {
            bump(&counters.store_failed);
            let answer = SendError::store_failed(error);
            tracing::warn!(
                namespace = %config.namespace,
                key_hash = %key_hash(&store_key),
                code = answer.code(),
                error = %answer,
                "idempotency store failed to reserve; message not sent"
            );
            return Err(answer);
        }
    };

    // The provider sees the key the store holds.
    let request = request.with_stored_key(Some(&store_key));
    let held = Held {
        key: store_key,
        token,
        fingerprint,
    };
    let lease = Lease::new(&config, asked_at);
    let mut settle = Settle::new(Arc::clone(&config), vec![held], lease);
    bump(&counters.sent);
    let kept = request.clone();
    let result = match settle.hold(inner.call(request)).await {
        Some(result) => result.map_err(|e| into_send_error(&config.classifier, e.into())),
        None => Err(given_up(&config, 1)),
    };
    // A receipt's accepted recipients are kept by position in the request's list: only then
    // is that list needed.
    let recipients = match &result {
        Ok(receipt) if !receipt.accepted.is_empty() => kept.recipients(),
        _ => Vec::new(),
    };
    let finish = Finish::for_result(&result, &recipients);
    settle.run(vec![finish]).await;
    result
}
