//! Batch sends: [`Batch`], its outcomes and its future. The layer is a `Service<Batch<R>>`
//! (the flow is in the layer's own `batch` module).
//!
//! Providers take batches (Resend's `/emails/batch`, SES bulk); a batch gets the same
//! guarantee as single sends, message by message. Over an inner service that sends a batch
//! and answers one outcome per message, in order ([`BatchOutcomes`]), the layer:
//!
//! 1. reserves every keyed message's key in one store call
//!    ([`Store::reserve_many`](crate::Store::reserve_many));
//! 2. with [`wait_for_in_flight`](crate::IdempotencyLayerBuilder::wait_for_in_flight), waits
//!    for the keys in flight under the same message, polling them together in one store call
//!    per poll (and stops waiting as soon as one is reserved: it must be sent);
//! 3. answers in place the messages found in the store (replayed, in flight, key reused,
//!    store failed) and those whose key is invalid; a key taken over from a holder that never
//!    settled it (a crashed process) is decided as a single send decides it, all such keys
//!    at once, before anything is sent: sent again inside the
//!    [`provider_window`](crate::IdempotencyLayerBuilder::provider_window), else asked of the
//!    [`verify_takeovers`](crate::IdempotencyLayerBuilder::verify_takeovers) service when
//!    one is set (delivered or unknown answered in place, not sent), else sent;
//! 4. answers a key that appears again in the same batch: same fingerprint as its first
//!    occurrence, the first one's outcome (marked replayed); another fingerprint, what a
//!    single send would get after the first occurrence: replayed when the store kept this
//!    very message, else `idempotency.key_reused` (or in flight, or store failed, by the
//!    store's answer for the key);
//! 5. sends the rest (the newly reserved and the unkeyed) as **one** inner batch, in input
//!    order, renewing the leases of its keys while it runs;
//! 6. keeps or frees each key by its own outcome, in one call each for the kept and the freed,
//!    retried on transient store errors like a single send's.
//!
//! The answer has one outcome per input message, in input order. An inner batch that fails as
//! a whole gives every sent message that error (and keeps or frees their keys by it); an
//! inner answer with a different number of outcomes than messages is the error
//! `provider.batch_mismatch`, of unknown delivery, and every key sent in it is kept, not
//! freed, as any of those messages may have gone.
//!
//! ```
//! use tower::{Service, ServiceExt};
//! use tower_idempotency::batch::{Batch, BatchOutcomes};
//! use tower_idempotency::{BoxError, IdempotencyLayer, Message, Receipt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), BoxError> {
//! // A provider that takes batches.
//! let provider = tower::service_fn(|batch: Batch| async move {
//!     let outcomes: BatchOutcomes = batch
//!         .iter()
//!         .enumerate()
//!         .map(|(i, _)| Ok(Receipt::new(format!("msg-{i}"), "bulk")))
//!         .collect();
//!     Ok::<_, BoxError>(outcomes)
//! });
//! let mut service = tower::Layer::layer(&IdempotencyLayer::in_memory(), provider);
//!
//! let m = |key: &str| Message::builder().from("a@example.com").to("b@example.com")
//!     .text("hi").idempotency_key(key).build();
//! let first = service.ready().await?.call(Batch::from(vec![m("k1")?, m("k2")?])).await?;
//! assert!(first.iter().all(|o| o.as_ref().is_ok_and(|r| !r.replayed)));
//! // k1 again, plus k3 twice: k1 is replayed, k3 sent once and its repeat answered in place.
//! let second = service.ready().await?.call(Batch::from(vec![m("k1")?, m("k3")?, m("k3")?])).await?;
//! assert!(second[0].as_ref().unwrap().replayed);
//! assert!(!second[1].as_ref().unwrap().replayed);
//! assert!(second[2].as_ref().unwrap().replayed);
//! # Ok(()) }
//! ```

use std::task::{Context, Poll};

use futures_util::future::BoxFuture;

use crate::classify::{Classifier, into_send_error};
use crate::message::Message;
use crate::outcome::{Receipt, SendError};

/// The outcomes of a batch: one per message, in the batch's order.
pub type BatchOutcomes = Vec<Result<Receipt, SendError>>;

/// A list of messages sent together. Cheap to build from a `Vec`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch<R = Message> {
    items: Vec<R>,
}

impl<R> Batch<R> {
    /// A batch of `items`, in order.
    pub fn new(items: Vec<R>) -> Self {
        Self { items }
    }

    /// The messages, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, R> {
        self.items.iter()
    }

    /// The messages, in order.
    pub fn as_slice(&self) -> &[R] {
        &self.items
    }

    /// The messages, in order.
    pub fn into_vec(self) -> Vec<R> {
        self.items
    }

    /// How many messages.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether it has no message.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl<R> From<Vec<R>> for Batch<R> {
    fn from(items: Vec<R>) -> Self {
        Self::new(items)
    }
}

impl<R> FromIterator<R> for Batch<R> {
    fn from_iter<I: IntoIterator<Item = R>>(iter: I) -> Self {
        Self::new(iter.into_iter().collect())
    }
}

impl<R> IntoIterator for Batch<R> {
    type Item = R;
    type IntoIter = std::vec::IntoIter<R>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

impl<'a, R> IntoIterator for &'a Batch<R> {
    type Item = &'a R;
    type IntoIter = std::slice::Iter<'a, R>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

/// The future of a batch send through the layer.
///
/// Dropping it is as safe as dropping a single send's
/// [`ResponseFuture`](crate::layer::ResponseFuture): each key is freed or kept as the send
/// stood.
pub struct BatchFuture {
    inner: BoxFuture<'static, Result<BatchOutcomes, SendError>>,
}

impl BatchFuture {
    pub(crate) fn new(inner: BoxFuture<'static, Result<BatchOutcomes, SendError>>) -> Self {
        Self { inner }
    }
}

impl std::future::Future for BatchFuture {
    type Output = Result<BatchOutcomes, SendError>;
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl std::fmt::Debug for BatchFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchFuture").finish_non_exhaustive()
    }
}

/// A batch API over a service that sends one message at a time (Amazon SES, SMTP): each
/// message of a [`Batch`] goes as its own call, one after another, and has its own outcome.
///
/// `PerMessage<S>` is a `Service<Batch<Message>>` (and `Service<Batch<RawMessage>>`) when `S`
/// sends that request alone, and passes single requests through. Under the idempotency layer
/// the batch keeps the batch guarantees (one store call to reserve the keys, repeats answered
/// in place), and each message's key is kept or freed by its own outcome: a message SES
/// rejected frees its key while its neighbours keep theirs. The batch call itself never
/// fails; a message whose call failed, or whose turn found the service not ready, carries
/// that error.
///
/// ```
/// use tower::{Service, ServiceExt};
/// use tower_idempotency::batch::{Batch, PerMessage};
/// use tower_idempotency::{BoxError, Message, Receipt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), BoxError> {
/// let one_at_a_time = tower::service_fn(|m: Message| async move {
///     Ok::<_, BoxError>(Receipt::new(format!("to-{}", m.to()[0]), "smtp"))
/// });
/// let mut service = PerMessage::new(one_at_a_time);
/// let m = |to: &str| Message::builder().from("a@example.com").to(to).text("hi").build();
/// let outcomes = ServiceExt::<Batch>::ready(&mut service)
///     .await?
///     .call(Batch::from(vec![m("b@example.com")?, m("c@example.com")?]))
///     .await?;
/// assert_eq!(outcomes[1].as_ref().unwrap().id, "to-c@example.com");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PerMessage<S> {
    inner: S,
}

impl<S> PerMessage<S> {
    /// Sends the messages of each batch through `inner`, one call each.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

macro_rules! per_message {
    ($request:ty) => {
        impl<S> tower_service::Service<$request> for PerMessage<S>
        where
            S: tower_service::Service<$request, Response = Receipt>,
        {
            type Response = Receipt;
            type Error = S::Error;
            type Future = S::Future;

            fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                self.inner.poll_ready(cx)
            }

            fn call(&mut self, request: $request) -> Self::Future {
                self.inner.call(request)
            }
        }

        impl<S> tower_service::Service<Batch<$request>> for PerMessage<S>
        where
            S: tower_service::Service<$request, Response = Receipt> + Clone + Send + 'static,
            S::Error: Into<crate::BoxError>,
            S::Future: Send + 'static,
        {
            type Response = BatchOutcomes;
            type Error = SendError;
            type Future = BatchFuture;

            fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                self.inner
                    .poll_ready(cx)
                    .map_err(|e| into_send_error(&Classifier::default(), e.into()))
            }

            fn call(&mut self, batch: Batch<$request>) -> Self::Future {
                // The ready clone goes into the future; the first message uses its readiness.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                BatchFuture::new(Box::pin(async move {
                    let mut outcomes = Vec::with_capacity(batch.len());
                    for (i, request) in batch.into_iter().enumerate() {
                        if i > 0 {
                            let ready = futures_util::future::poll_fn(|cx| inner.poll_ready(cx));
                            if let Err(e) = ready.await {
                                let error = into_send_error(&Classifier::default(), e.into());
                                outcomes.push(Err(error));
                                continue;
                            }
                        }
                        let outcome = inner
                            .call(request)
                            .await
                            .map_err(|e| into_send_error(&Classifier::default(), e.into()));
                        outcomes.push(outcome);
                    }
                    Ok(outcomes)
                }))
            }
        }
    };
}

per_message!(Message);
per_message!(crate::message::RawMessage);
