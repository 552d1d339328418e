//! [`WebhookReceiver`]: the service every provider's receiver is, and what it counts.

use std::collections::{HashSet, VecDeque};
use std::convert::Infallible;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Limited};
use tower_service::Service;

use super::settle::{Event, EventKind, Settled, Settler};
use super::verifier::{Remembered, WebhookVerifier};
use crate::outcome::BoxError;
use crate::reconcile::DEFAULT_DELIVERED_TTL;
use crate::store::admin::StoreAdmin;

/// The longest webhook body read unless told otherwise: 256 KiB, far above any provider's
/// event.
pub const DEFAULT_MAX_BODY: usize = 256 * 1024;

/// The most delivery ids (`svix-id`) remembered to answer a redelivery without acting twice.
const MAX_SEEN: usize = 100_000;

/// Why a request's authenticity was refused (answered 401).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    /// The signature or credentials are missing or wrong.
    BadSignature,
    /// The signed timestamp is outside the tolerance: an old request replayed, or a clock far
    /// off.
    StaleTimestamp,
    /// Signed, but for another source than the one configured (an SNS topic of another).
    WrongTopic,
    /// Signed with the key of a configured certificate that is outside its validity period
    /// now (SNS's certificate expired since it was configured): configure SNS's current one.
    ExpiredCertificate,
}

/// What a provider's webhook looks like: how its requests prove they come from it, and what
/// their events say. [`ResendEvents`](super::resend::ResendEvents),
/// [`TwilioEvents`](super::twilio::TwilioEvents),
/// [`PostmarkEvents`](super::postmark::PostmarkEvents).
pub trait Provider {
    /// The transport name of the receipts it settles (`resend`, `twilio`, `postmark`).
    fn transport(&self) -> &'static str;

    /// Checks that the request comes from the provider, before anything else reads it, and
    /// answers the request's delivery id when the provider gives one (a redelivery carries
    /// the same), so it is acted on once.
    ///
    /// # Errors
    /// [`Refused`] when it does not prove that: answered 401, nothing else is read.
    fn authenticate(
        &self,
        parts: &http::request::Parts,
        body: &[u8],
    ) -> Result<Option<String>, Refused>;

    /// The event in an authenticated request: `None` when it is of no interest (an event
    /// type that settles nothing, a message without the mark).
    ///
    /// # Errors
    /// When the body is not what the provider documents: answered 400.
    fn event(&self, parts: &http::request::Parts, body: &[u8]) -> Result<Option<Event>, BoxError>;
}

/// The counts of a receiver's answers, shared by its clones.
#[derive(Clone, Debug, Default)]
pub struct WebhookStats(Arc<Counts>);

#[derive(Debug, Default)]
struct Counts {
    delivered: AtomicU64,
    freed: AtomicU64,
    ignored: AtomicU64,
    replayed: AtomicU64,
    unauthorized: AtomicU64,
    too_large: AtomicU64,
    malformed: AtomicU64,
    store_errors: AtomicU64,
}

impl WebhookStats {
    /// Keys settled as delivered.
    pub fn delivered(&self) -> u64 {
        self.0.delivered.load(Ordering::Relaxed)
    }
    /// Keys freed by a "failed before sending" event.
    pub fn freed(&self) -> u64 {
        self.0.freed.load(Ordering::Relaxed)
    }
    /// Events of no interest, about no unsettled key, or about a key a live send holds.
    pub fn ignored(&self) -> u64 {
        self.0.ignored.load(Ordering::Relaxed)
    }
    /// Redeliveries of an event already handled.
    pub fn replayed(&self) -> u64 {
        self.0.replayed.load(Ordering::Relaxed)
    }
    /// Requests refused for their signature or timestamp (401).
    pub fn unauthorized(&self) -> u64 {
        self.0.unauthorized.load(Ordering::Relaxed)
    }
    /// Requests refused for their size (413).
    pub fn too_large(&self) -> u64 {
        self.0.too_large.load(Ordering::Relaxed)
    }
    /// Authenticated requests whose body did not parse, and requests not `POST` (400, 405).
    pub fn malformed(&self) -> u64 {
        self.0.malformed.load(Ordering::Relaxed)
    }
    /// Events the store failed to settle (503).
    pub fn store_errors(&self) -> u64 {
        self.0.store_errors.load(Ordering::Relaxed)
    }

    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

struct Inner<S, P> {
    settler: Settler<S>,
    remembered: Arc<Mutex<Remembered>>,
    provider: P,
    stats: WebhookStats,
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    ids: HashSet<String>,
    order: VecDeque<String>,
}

impl Seen {
    fn insert(&mut self, id: String) {
        if self.ids.insert(id.clone()) {
            self.order.push_back(id);
            while self.order.len() > MAX_SEEN {
                if let Some(old) = self.order.pop_front() {
                    self.ids.remove(&old);
                }
            }
        }
    }
}

/// A webhook endpoint of one provider (`P`) that settles the keys of a store (`S`); see the
/// [module docs](super) for what it answers. Clones share the store, the counts and the
/// delivery ids seen.
pub struct WebhookReceiver<S, P> {
    inner: Arc<Inner<S, P>>,
    max_body: usize,
    delivered_ttl: Duration,
}

impl<S: StoreAdmin, P: Provider> WebhookReceiver<S, P> {
    /// A receiver of `provider`'s events that settles the keys of `store`.
    pub fn new(store: S, provider: P) -> Self {
        let transport = provider.transport();
        Self {
            inner: Arc::new(Inner {
                settler: Settler::new(store, transport),
                remembered: Arc::default(),
                provider,
                stats: WebhookStats::default(),
                seen: Mutex::new(Seen::default()),
            }),
            max_body: DEFAULT_MAX_BODY,
            delivered_ttl: DEFAULT_DELIVERED_TTL,
        }
    }
}

impl<S, P> WebhookReceiver<S, P> {
    /// The longest body read (default [`DEFAULT_MAX_BODY`]); a longer one is answered 413.
    #[must_use]
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// How long a key settled as delivered stays done (default 24 h); keep it at least the
    /// layer's ttl.
    #[must_use]
    pub fn delivered_ttl(mut self, ttl: Duration) -> Self {
        self.delivered_ttl = ttl;
        self
    }

    /// The counts of its answers.
    pub fn stats(&self) -> WebhookStats {
        self.inner.stats.clone()
    }

    /// The provider.
    pub fn provider(&self) -> &P {
        &self.inner.provider
    }

    /// A [`Service<Verify>`](crate::verify::Verify) answering from the events this receiver
    /// (and its clones) received that prove the provider took a message: see
    /// [`WebhookVerifier`].
    pub fn verifier(&self) -> WebhookVerifier
    where
        P: Provider,
    {
        WebhookVerifier {
            remembered: Arc::clone(&self.inner.remembered),
            transport: self.inner.provider.transport(),
        }
    }
}

impl<S, P> Clone for WebhookReceiver<S, P> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            max_body: self.max_body,
            delivered_ttl: self.delivered_ttl,
        }
    }
}

impl<S, P: fmt::Debug> fmt::Debug for WebhookReceiver<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookReceiver")
            .field("provider", &self.inner.provider)
            .field("max_body", &self.max_body)
            .field("delivered_ttl", &self.delivered_ttl)
            .field("stats", &self.inner.stats)
            .finish_non_exhaustive()
    }
}

fn answer(status: StatusCode, text: &'static str) -> http::Response<String> {
    let mut response = http::Response::new(text.to_owned());
    *response.status_mut() = status;
    response
}

impl<S, P, B> Service<http::Request<B>> for WebhookReceiver<S, P>
where
    S: StoreAdmin + Send + Sync + 'static,
    P: Provider + Send + Sync + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<String>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<String>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let inner = Arc::clone(&self.inner);
        let (max_body, ttl) = (self.max_body, self.delivered_ttl);
        Box::pin(async move { Ok(receive(&inner, request, max_body, ttl).await) })
    }
}

async fn receive<S, P, B>(
    inner: &Inner<S, P>,
    request: http::Request<B>,
    max_body: usize,
    ttl: Duration,
) -> http::Response<String>
where
    S: StoreAdmin,
    P: Provider,
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let stats = &inner.stats.0;
    let (parts, body) = request.into_parts();
    if parts.method != Method::POST {
        WebhookStats::add(&stats.malformed);
        return answer(StatusCode::METHOD_NOT_ALLOWED, "POST only");
    }
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > max_body) {
        WebhookStats::add(&stats.too_large);
        return answer(StatusCode::PAYLOAD_TOO_LARGE, "body too large");
    }
    let body: Bytes = match Limited::new(body, max_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            if error.is::<http_body_util::LengthLimitError>() {
                WebhookStats::add(&stats.too_large);
                return answer(StatusCode::PAYLOAD_TOO_LARGE, "body too large");
            }
            WebhookStats::add(&stats.malformed);
            return answer(StatusCode::BAD_REQUEST, "the body could not be read");
        }
    };
    let delivery = match inner.provider.authenticate(&parts, &body) {
        Ok(delivery) => delivery,
        Err(why) => {
            WebhookStats::add(&stats.unauthorized);
            tracing::debug!(target: "tower_idempotency::webhook", ?why, "webhook refused");
            return answer(StatusCode::UNAUTHORIZED, "unauthorized");
        }
    };
    if let Some(id) = &delivery {
        let seen = inner
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.ids.contains(id) {
            WebhookStats::add(&stats.replayed);
            return answer(StatusCode::OK, "already handled");
        }
    }
    let event = match inner.provider.event(&parts, &body) {
        Ok(Some(event)) => event,
        Ok(None) => {
            WebhookStats::add(&stats.ignored);
            remember(inner, delivery);
            return answer(StatusCode::OK, "ignored");
        }
        Err(_) => {
            WebhookStats::add(&stats.malformed);
            return answer(StatusCode::BAD_REQUEST, "the event does not parse");
        }
    };
    if event.kind == EventKind::Took {
        inner
            .remembered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .took(&event.digest, &event.message_id);
    }
    match inner.settler.settle(&event, ttl).await {
        Ok(settled) => {
            let counter = match settled {
                Settled::Delivered => &stats.delivered,
                Settled::Freed => &stats.freed,
                Settled::UnknownKey | Settled::Left => &stats.ignored,
            };
            WebhookStats::add(counter);
            remember(inner, delivery);
            answer(StatusCode::OK, "ok")
        }
        Err(error) => {
            WebhookStats::add(&stats.store_errors);
            tracing::warn!(target: "tower_idempotency::webhook", %error, "webhook: the store failed; the provider will deliver it again");
            answer(StatusCode::SERVICE_UNAVAILABLE, "try again")
        }
    }
}

/// Remembers a handled delivery, so a redelivery of it changes nothing.
fn remember<S, P>(inner: &Inner<S, P>, delivery: Option<String>) {
    if let Some(id) = delivery {
        inner
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id);
    }
}
