//! [`HttpTransport`]: a `Service<Message>` over an HTTP client.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderValue;
use tower_service::Service;

use super::codec::Codec;
use super::future::ResponseFuture;
use super::status::{NotSentFn, connection_refused};
use crate::message::Message;
use crate::outcome::{self, BoxError, Receipt, SendError};

/// The default bound on a provider's response body: 1 MiB.
pub const DEFAULT_MAX_RESPONSE_BODY: usize = 1024 * 1024;

/// The name of the header that carries the message's idempotency key to the provider.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// A provider client: sends a [`Message`] through an HTTP client `S` in the API a [`Codec`]
/// `C` describes, and answers a [`Receipt`] or a [`SendError`] of the right category.
///
/// `S` is any `Service<http::Request<Bytes>>` whose response body is an [`http_body::Body`]:
/// hyper-util's legacy client (behind a `map_request` that wraps the body in
/// `http_body_util::Full`), reqwest's `Client` behind a small adapter, or a test double. The
/// transport sets the `Idempotency-Key` header from [`Message::idempotency_key`] on every
/// request, so every attempt of a retried message carries the same key, reads the body up
/// to [`DEFAULT_MAX_RESPONSE_BODY`] bytes, and maps the status as the
/// [module docs](super) describe.
///
/// Readiness is the inner client's. `call` moves the ready client into the response future
/// and leaves a fresh clone in its place.
pub struct HttpTransport<S, C> {
    inner: S,
    codec: Arc<C>,
    max_response_body: usize,
    not_sent: NotSentFn,
}

impl<S, C> HttpTransport<S, C> {
    /// A transport that sends through `inner` in the API of `codec`.
    pub fn new(inner: S, codec: C) -> Self {
        Self {
            inner,
            codec: Arc::new(codec),
            max_response_body: DEFAULT_MAX_RESPONSE_BODY,
            not_sent: connection_refused,
        }
    }

    /// Sets the longest response body read, in bytes (default
    /// [`DEFAULT_MAX_RESPONSE_BODY`]). A 2xx answer with a longer body is of unknown
    /// delivery, code [`provider.bad_response`](super::codes::BAD_RESPONSE); a failure status
    /// with a longer body is mapped by its status alone.
    #[must_use]
    pub fn max_response_body(mut self, bytes: usize) -> Self {
        self.max_response_body = bytes;
        self
    }

    /// Sets the judge of inner-client errors that certainly did not send (retryable,
    /// [`provider.connect`](super::codes::CONNECT)); every other inner error is of unknown
    /// delivery. The default is [`connection_refused`](super::connection_refused).
    ///
    /// With hyper-util's legacy client, `is_connect()` also covers DNS failures and connect
    /// timeouts, none of which wrote the request:
    ///
    /// ```
    /// # use tower_idempotency::http::{HttpTransport, ResendCodec, connection_refused};
    /// fn never_connected(error: &(dyn std::error::Error + 'static)) -> bool {
    ///     let mut current = Some(error);
    ///     while let Some(e) = current {
    ///         if e.downcast_ref::<hyper_util::client::legacy::Error>().is_some_and(|e| e.is_connect()) {
    ///             return true;
    ///         }
    ///         current = e.source();
    ///     }
    ///     connection_refused(error)
    /// }
    /// # let client = tower::service_fn(|_: http::Request<bytes::Bytes>| async {
    /// #     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// # });
    /// let transport = HttpTransport::new(client, ResendCodec::new("re_123")).not_sent_if(never_connected);
    /// ```
    #[must_use]
    pub fn not_sent_if(mut self, not_sent: NotSentFn) -> Self {
        self.not_sent = not_sent;
        self
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
            not_sent: self.not_sent,
        }
    }
}

impl<S: fmt::Debug, C: fmt::Debug> fmt::Debug for HttpTransport<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpTransport")
            .field("inner", &self.inner)
            .field("codec", &self.codec)
            .field("max_response_body", &self.max_response_body)
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
            .and_then(|r| with_key(r, &message))
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
            self.not_sent,
        )
    }
}

/// Sets the `Idempotency-Key` header from the message's key; a message without a key goes
/// without the header.
fn with_key(
    mut request: http::Request<Bytes>,
    message: &Message,
) -> Result<http::Request<Bytes>, SendError> {
    let headers = request.headers_mut();
    headers.remove(IDEMPOTENCY_KEY);
    if let Some(key) = message.idempotency_key() {
        // Keys hold no control characters, so this only fails on a key the header grammar
        // cannot carry; report it rather than send without the provider's dedup.
        let value = HeaderValue::from_bytes(key.as_str().as_bytes()).map_err(|e| {
            SendError::validation(
                super::codes::INVALID_REQUEST,
                "the idempotency key cannot be sent as an HTTP header",
            )
            .with_source(e)
        })?;
        headers.insert(IDEMPOTENCY_KEY, value);
    }
    Ok(request)
}
