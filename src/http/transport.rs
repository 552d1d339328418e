//! [`HttpTransport`]: a `Service<Message>`, and a `Service<Batch<Message>>` when its codec
//! takes batches, over an HTTP client.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderValue;
use tower_service::Service;

use sha2::{Digest, Sha256};

use super::codec::{BatchCodec, Codec};
use super::future::{BatchResponseFuture, Exchange, ResponseFuture};
use crate::batch::{Batch, BatchOutcomes};
use crate::classify::Classifier;
use crate::message::Message;
use crate::outcome::{self, BoxError, Category, Receipt, SendError};

/// The default bound on a provider's response body: 1 MiB.
pub const DEFAULT_MAX_RESPONSE_BODY: usize = 1024 * 1024;

/// The name of the header that carries the message's
/// [`provider_key`](Message::provider_key) to the provider.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// A provider client: sends a [`Message`] through an HTTP client `S` in the API a [`Codec`]
/// `C` describes, and answers a [`Receipt`] or a [`SendError`] of the right category.
///
/// `S` is any `Service<http::Request<Bytes>>` whose response body is an [`http_body::Body`]:
/// hyper-util's legacy client (behind a `map_request` that wraps the body in
/// `http_body_util::Full`), reqwest's `Client` behind a small adapter, or a test double. The
/// transport sets the `Idempotency-Key` header from [`Message::provider_key`] (the key the
/// idempotency layer holds) on every request, so every attempt of a retried message carries
/// the same key, reads the body up
/// to [`DEFAULT_MAX_RESPONSE_BODY`] bytes, and maps the status as the
/// [module docs](super) describe.
///
/// With a [`BatchCodec`] (such as [`ResendCodec`](super::resend::ResendCodec)) it is also a
/// `Service<Batch<Message>>` that sends a batch as one request and answers one outcome per
/// message, in order ([`BatchOutcomes`]); see [Batches](super#batches).
///
/// Readiness is the inner client's. `call` moves the ready client into the response future
/// and leaves a fresh clone in its place.
pub struct HttpTransport<S, C> {
    inner: S,
    codec: Arc<C>,
    max_response_body: usize,
    classifier: Classifier,
}

impl<S, C> HttpTransport<S, C> {
    /// A transport that sends through `inner` in the API of `codec`.
    pub fn new(inner: S, codec: C) -> Self {
        Self {
            inner,
            codec: Arc::new(codec),
            max_response_body: DEFAULT_MAX_RESPONSE_BODY,
            classifier: Classifier::default(),
        }
    }

    /// Sets the longest response body read, in bytes (default
    /// [`DEFAULT_MAX_RESPONSE_BODY`]). A 2xx answer with a longer body is of unknown
    /// delivery, code [`provider.bad_response`](crate::outcome::codes::BAD_RESPONSE); a failure status
    /// with a longer body is mapped by its status alone.
    #[must_use]
    pub fn max_response_body(mut self, bytes: usize) -> Self {
        self.max_response_body = bytes;
        self
    }

    /// Sets the judge of inner-client errors that are neither a
    /// [`SendError`] nor a timeout; see [`crate::classify`]. A not-sent category makes the
    /// error retryable ([`provider.connect`](crate::outcome::codes::CONNECT)), anything else is of
    /// unknown delivery. The default is
    /// [`default_classifier`](crate::classify::default_classifier): an error whose chain shows
    /// the request never left ([`never_connected`](crate::classify::never_connected)) did not
    /// send.
    ///
    /// A judge of your own can add a client's errors and fall back to the default:
    ///
    /// ```
    /// # use tower_idempotency::http::{HttpTransport, resend::ResendCodec};
    /// use tower_idempotency::classify::{Classifier, default_classifier};
    /// use tower_idempotency::outcome::Category;
    ///
    /// #[derive(Debug)]
    /// struct CircuitOpen;
    /// impl std::fmt::Display for CircuitOpen {
    ///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("open") }
    /// }
    /// impl std::error::Error for CircuitOpen {}
    ///
    /// fn mine(error: &(dyn std::error::Error + 'static)) -> Category {
    ///     if error.is::<CircuitOpen>() {
    ///         return Category::Retryable;
    ///     }
    ///     default_classifier(error)
    /// }
    /// # let client = tower::service_fn(|_: http::Request<bytes::Bytes>| async {
    /// #     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// # });
    /// let transport = HttpTransport::new(client, ResendCodec::new("re_123"))
    ///     .classifier(Classifier::new(mine));
    /// ```
    #[must_use]
    pub fn classifier(mut self, classifier: Classifier) -> Self {
        self.classifier = classifier;
        self
    }

    /// Shorthand for a [`classifier`](Self::classifier) that answers
    /// [`Retryable`](crate::Category::Retryable) when `not_sent` says the error certainly did
    /// not send, and [`Unknown`](crate::Category::Unknown) otherwise. It replaces the default
    /// judge: include [`never_connected`](crate::classify::never_connected) if you want it too.
    #[must_use]
    pub fn not_sent_if<F>(self, not_sent: F) -> Self
    where
        F: Fn(&(dyn Error + 'static)) -> bool + Send + Sync + 'static,
    {
        self.classifier(Classifier::new(move |error| {
            if not_sent(error) {
                Category::Retryable
            } else {
                Category::Unknown
            }
        }))
    }

    /// The codec.
    pub fn codec(&self) -> &C {
        &self.codec
    }

    /// The inner client.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner client, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner client.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, C> Clone for HttpTransport<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            codec: Arc::clone(&self.codec),
            max_response_body: self.max_response_body,
            classifier: self.classifier.clone(),
        }
    }
}

impl<S: fmt::Debug, C: fmt::Debug> fmt::Debug for HttpTransport<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpTransport")
            .field("inner", &self.inner)
            .field("codec", &self.codec)
            .field("max_response_body", &self.max_response_body)
            .field("classifier", &self.classifier)
            .finish_non_exhaustive()
    }
}

impl<S, C, B> Service<Message> for HttpTransport<S, C>
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>> + Clone,
    S::Error: Into<BoxError>,
    B: http_body::Body,
    B::Error: Into<BoxError>,
    C: Codec,
{
    type Response = Receipt;
    type Error = SendError;
    type Future = ResponseFuture<S::Future, B, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // No request exists yet, so a client that cannot become ready sent nothing.
        self.inner.poll_ready(cx).map_err(|e| {
            SendError::retryable(
                outcome::codes::NOT_SENT,
                "the HTTP client is not ready; not sent",
            )
            .with_source(e)
        })
    }

    fn call(&mut self, message: Message) -> Self::Future {
        let request = match self
            .codec
            .encode(&message)
            .and_then(|r| with_key(&*self.codec, r, message.provider_key()))
        {
            Ok(request) => request,
            // The client stays ready and untouched: nothing was sent.
            Err(error) => return ResponseFuture::rejected(error, Arc::clone(&self.codec), message),
        };
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(
            inner.call(request),
            Arc::clone(&self.codec),
            message,
            self.max_response_body,
            self.classifier.clone(),
        )
    }
}

/// Sets the `Idempotency-Key` header from the message's
/// [`provider_key`](Message::provider_key) as the codec fits it
/// ([`Codec::idempotency_key`]); an unkeyed message, or a codec whose provider takes no key,
/// goes without the header.
fn with_key<C: Codec + ?Sized>(
    codec: &C,
    request: http::Request<Bytes>,
    key: Option<&str>,
) -> Result<http::Request<Bytes>, SendError> {
    let key = key.and_then(|key| codec.idempotency_key(key));
    set_key(request, key.as_deref())
}

fn set_key(
    mut request: http::Request<Bytes>,
    key: Option<&str>,
) -> Result<http::Request<Bytes>, SendError> {
    let headers = request.headers_mut();
    headers.remove(IDEMPOTENCY_KEY);
    if let Some(key) = key {
        // A fitted key is visible ASCII, so this only fails for a codec that fits keys its
        // own way; report it rather than send without the provider's dedup.
        let value = HeaderValue::from_str(key).map_err(|e| {
            SendError::validation(
                outcome::codes::INVALID_REQUEST,
                "the idempotency key cannot be sent as an HTTP header",
            )
            .with_source(e)
        })?;
        headers.insert(IDEMPOTENCY_KEY, value);
    }
    Ok(request)
}

/// `key` as an `Idempotency-Key` header value of at most `max_len` bytes: as it is when it is
/// printable ASCII (spaces inside only) and short enough, else `sha256-` and the 64 hex digits
/// of its SHA-256. The same key always gives the same value, so every attempt carries the same
/// header; two keys give two values, short of a SHA-256 collision or a key that is itself
/// `sha256-` and the digest of another (a stored key starts with the layer's namespace).
///
/// The default of [`Codec::idempotency_key`], with the 256 bytes Resend and most providers
/// take.
///
/// ```
/// use tower_idempotency::http::fit_idempotency_key;
///
/// assert_eq!(fit_idempotency_key("emails:order.created:42", 256), "emails:order.created:42");
/// let long = fit_idempotency_key(&"k".repeat(300), 256);
/// assert!(long.starts_with("sha256-") && long.len() == 71);
/// assert!(fit_idempotency_key("emails:bestellung:größe", 256).starts_with("sha256-"));
/// ```
pub fn fit_idempotency_key(key: &str, max_len: usize) -> String {
    let fits = key.len() <= max_len
        && !key.is_empty()
        && key.bytes().all(|b| (0x20..=0x7e).contains(&b))
        && !key.starts_with(' ')
        && !key.ends_with(' ');
    if fits {
        return key.to_owned();
    }
    let digest = Sha256::digest(key.as_bytes());
    let mut fitted = String::with_capacity(71);
    fitted.push_str("sha256-");
    for b in digest {
        fitted.push_str(&format!("{b:02x}"));
    }
    fitted
}

/// One batch request: answers one outcome per message, in order; see
/// [Batches](super#batches). The call itself fails only when the client cannot become ready.
impl<S, C, B> Service<Batch<Message>> for HttpTransport<S, C>
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>> + Clone,
    S::Error: Into<BoxError>,
    B: http_body::Body,
    B::Error: Into<BoxError>,
    C: BatchCodec,
{
    type Response = BatchOutcomes;
    type Error = SendError;
    type Future = BatchResponseFuture<S::Future, B, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<Message>::poll_ready(self, cx)
    }

    fn call(&mut self, batch: Batch<Message>) -> Self::Future {
        let codec = Arc::clone(&self.codec);
        let messages = batch.into_vec();
        let max = codec.max_batch();
        if messages.len() > max {
            let error = SendError::validation(
                outcome::codes::BATCH_TOO_LARGE,
                format!(
                    "the batch holds {} messages and the provider takes at most {max}; \
                     none was sent",
                    messages.len()
                ),
            );
            let answers = vec![Some(Err(error)); messages.len()];
            return BatchResponseFuture::answered(codec, answers);
        }
        let mut answers = vec![None; messages.len()];
        let mut sent = Vec::with_capacity(messages.len());
        let mut positions = Vec::with_capacity(messages.len());
        for (i, message) in messages.into_iter().enumerate() {
            match codec.batchable(&message) {
                Ok(()) => {
                    sent.push(message);
                    positions.push(i);
                }
                Err(error) => answers[i] = Some(Err(error)),
            }
        }
        if sent.is_empty() {
            return BatchResponseFuture::answered(codec, answers);
        }
        let request = match codec
            .encode_batch(&sent)
            .and_then(|r| with_key(&*codec, r, batch_idempotency_key(&sent).as_deref()))
        {
            Ok(request) => request,
            // The client stays ready and untouched: nothing was sent.
            Err(error) => {
                for &i in &positions {
                    answers[i] = Some(Err(error.clone()));
                }
                return BatchResponseFuture::answered(codec, answers);
            }
        };
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        BatchResponseFuture::new(
            Exchange::new(inner.call(request), self.max_response_body),
            codec,
            sent,
            positions,
            answers,
            self.classifier.clone(),
        )
    }
}

/// The `Idempotency-Key` of a batch request holding `messages`, in order, or `None` when one
/// of them has no key.
///
/// It is derived from each message's [`provider_key`](Message::provider_key): under the
/// idempotency layer the key the layer's store holds for it, else the message's own key.
/// The key is `batch-` and 32 hex digits: the first 16 bytes of the SHA-256 of a domain
/// prefix (`tower-idempotency/http-batch/v1\0`) and those keys, each as its length
/// (little-endian `u64`) then its bytes, so no two lists of keys share an encoding. It is
/// therefore:
///
/// - the same on every attempt of the same batch, wherever it is computed, so a provider that
///   deduplicates by key sends a retried batch once;
/// - different for any other list of keys (another message, one fewer, another order);
/// - never equal to a single message's key, so a message sent alone and then in a batch is
///   not mistaken by the provider for the same request.
///
/// A batch with an unkeyed message carries no key: the caller did not ask for that message to
/// be deduplicated, and alone it goes without the header. A key made from its content would
/// make the provider drop a deliberate second send of the same text (a repeated code, say)
/// within its key window. Key every message of a batch to have the provider deduplicate it.
///
/// ```
/// use tower_idempotency::Message;
/// use tower_idempotency::http::batch_idempotency_key;
///
/// let m = |key: &str| Message::builder().from("a@example.com").to("b@example.com")
///     .text("hi").idempotency_key(key).build();
/// let ab = batch_idempotency_key(&[m("a")?, m("b")?]).unwrap();
/// assert!(ab.starts_with("batch-") && ab.len() == 38);
/// assert_eq!(batch_idempotency_key(&[m("a")?, m("b")?]).as_deref(), Some(&*ab));
/// assert_ne!(batch_idempotency_key(&[m("b")?, m("a")?]).as_deref(), Some(&*ab));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn batch_idempotency_key(messages: &[Message]) -> Option<String> {
    const DOMAIN: &[u8] = b"tower-idempotency/http-batch/v1\0";
    let mut digest = Sha256::new();
    digest.update(DOMAIN);
    digest.update((messages.len() as u64).to_le_bytes());
    for message in messages {
        let key = message.provider_key()?.as_bytes();
        digest.update((key.len() as u64).to_le_bytes());
        digest.update(key);
    }
    let digest = digest.finalize();
    let mut key = String::with_capacity(38);
    key.push_str("batch-");
    for b in &digest[..16] {
        key.push_str(&format!("{b:02x}"));
    }
    Some(key)
}
