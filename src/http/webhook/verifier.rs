//! What the webhooks said, as a [`Service<Verify>`](Verify): an event that arrives while a
//! send still holds its key cannot settle it (the send settles its own outcome), and if that
//! send then ends of unknown delivery, the event is what proves the provider took it.
//! [`WebhookVerifier`] remembers such events and answers the reconciler and
//! `verify_takeovers` from them; [`FirstKnown`] asks it first and a lookup after.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use tower::ServiceExt;
use tower_service::Service;

use crate::http::mark::key_digest;
use crate::outcome::{BoxError, Receipt};
use crate::verify::{Verified, Verify};

/// The most "took it" events remembered.
const MAX_REMEMBERED: usize = 100_000;

/// "The provider took the message marked `digest`, as `message_id`": the only events kept.
/// A "failed before sending" event is never kept: a later send under the same key may have
/// gone, and an old failure must not free it.
#[derive(Default)]
pub(crate) struct Remembered {
    took: HashMap<String, String>,
    order: VecDeque<String>,
}

impl Remembered {
    pub(crate) fn took(&mut self, digest: &str, message_id: &str) {
        if self
            .took
            .insert(digest.to_owned(), message_id.to_owned())
            .is_none()
        {
            self.order.push_back(digest.to_owned());
            while self.order.len() > MAX_REMEMBERED {
                if let Some(old) = self.order.pop_front() {
                    self.took.remove(&old);
                }
            }
        }
    }
}

/// Answers [`Verify`] questions from the "took it" events a
/// [`WebhookReceiver`](super::WebhookReceiver) received: [`Verified::Delivered`] with the
/// provider's id for a key one of them named, [`Verified::Unknown`] otherwise (never
/// [`Verified::NotSent`]: a missing event proves nothing). From
/// [`WebhookReceiver::verifier`](super::WebhookReceiver::verifier).
#[derive(Clone)]
pub struct WebhookVerifier {
    pub(crate) remembered: Arc<Mutex<Remembered>>,
    pub(crate) transport: &'static str,
}

impl fmt::Debug for WebhookVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookVerifier")
            .field("transport", &self.transport)
            .finish_non_exhaustive()
    }
}

impl Service<Verify> for WebhookVerifier {
    type Response = Verified;
    type Error = BoxError;
    type Future = futures_util::future::Ready<Result<Verified, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, question: Verify) -> Self::Future {
        let digest = key_digest(&question.stored_key);
        let remembered = self
            .remembered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let answer = match remembered.took.get(&digest) {
            Some(id) => Verified::Delivered(Receipt::new(id.clone(), self.transport)),
            None => Verified::Unknown,
        };
        futures_util::future::ready(Ok(answer))
    }
}

/// Asks `first`, and `then` when `first` answers [`Verified::Unknown`] or fails: a
/// [`WebhookVerifier`] before a lookup, so what the webhooks already said costs no request.
///
/// ```
/// use tower_idempotency::http::webhook::FirstKnown;
/// use tower_idempotency::verify::{Verified, Verify};
/// use tower_idempotency::BoxError;
///
/// let unknown = tower::service_fn(|_: Verify| async { Ok::<_, BoxError>(Verified::Unknown) });
/// let not_sent = tower::service_fn(|_: Verify| async { Ok::<_, BoxError>(Verified::NotSent) });
/// let verify = FirstKnown::new(unknown, not_sent);
/// # let _ = verify;
/// ```
#[derive(Clone, Debug)]
pub struct FirstKnown<A, B> {
    first: A,
    then: B,
}

impl<A, B> FirstKnown<A, B> {
    /// Asks `first`, then `then`.
    pub fn new(first: A, then: B) -> Self {
        Self { first, then }
    }
}

impl<A, B> Service<Verify> for FirstKnown<A, B>
where
    A: Service<Verify, Response = Verified> + Clone + Send + 'static,
    A::Future: Send,
    A::Error: Into<BoxError>,
    B: Service<Verify, Response = Verified> + Clone + Send + 'static,
    B::Future: Send,
    B::Error: Into<BoxError>,
{
    type Response = Verified;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Verified, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Each is made ready in the call, on a clone of its own.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, question: Verify) -> Self::Future {
        let (first, then) = (self.first.clone(), self.then.clone());
        Box::pin(async move {
            let known = match first.oneshot(question.clone()).await {
                Ok(Verified::Unknown) | Err(_) => None,
                Ok(answer) => Some(answer),
            };
            match known {
                Some(answer) => Ok(answer),
                None => then.oneshot(question).await.map_err(Into::into),
            }
        })
    }
}
