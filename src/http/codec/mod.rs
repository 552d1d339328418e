//! What a provider's HTTP API looks like: the [`Codec`] and [`BatchCodec`] traits, and one
//! module per provider with its codec, its constants and what its provider's errors become
//! ([`resend`], [`twilio`], [`postmark`]). `http` re-exports them all.

pub mod postmark;
pub mod resend;
mod segments;
#[cfg(feature = "ses")]
pub mod ses;
pub mod twilio;
pub(crate) mod wire;

use bytes::Bytes;

use crate::message::Message;
use crate::outcome::{BoxError, Receipt, SendError};

/// Turns a [`Message`] into a provider's HTTP request, and the provider's answer into a
/// [`Receipt`].
///
/// A codec knows one provider's API: its URL, authentication, JSON shape and error bodies.
/// [`HttpTransport`](super::HttpTransport) owns everything common to providers: it sets the
/// `Idempotency-Key` header, reads the response body (bounded), and maps status codes to
/// outcomes (see the [module docs](super)). It asks the codec only for what differs:
///
/// - [`encode`](Self::encode) every message;
/// - [`idempotency_key`](Self::idempotency_key) fits the key to the provider's limits, or
///   says the provider takes none;
/// - [`decode`](Self::decode) the body of a 2xx answer;
/// - [`conflict`](Self::conflict) decides a 409, which providers use for their own
///   idempotency answers;
/// - [`error_detail`](Self::error_detail) picks the provider's error text out of a 4xx or
///   5xx body, to keep in the [`SendError`].
///
/// Codecs must not copy message content (bodies, addresses) into errors: errors are logged and
/// may be kept in the idempotency store.
///
/// ```
/// use bytes::Bytes;
/// use tower_idempotency::http::Codec;
/// use tower_idempotency::{BoxError, Message, Receipt, SendError};
///
/// /// A provider that takes the text body as `text/plain` and answers its id as the body.
/// struct PlainText;
///
/// impl Codec for PlainText {
///     fn encode(&self, message: &Message) -> Result<http::Request<Bytes>, SendError> {
///         http::Request::post("https://sms.example/send")
///             .header("x-to", message.to().join(","))
///             .body(Bytes::from(message.text().unwrap_or_default().to_owned()))
///             .map_err(|e| SendError::validation("provider.invalid_request", "bad request").with_source(e))
///     }
///
///     fn decode(&self, _: &Message, response: &http::Response<Bytes>) -> Result<Receipt, BoxError> {
///         let id = std::str::from_utf8(response.body())?.trim();
///         if id.is_empty() {
///             return Err("the provider answered no id".into());
///         }
///         Ok(Receipt::new(id, "plain-text"))
///     }
/// }
/// ```
pub trait Codec {
    /// The request for `message`: method, URI, headers (authentication, content type) and
    /// body. The transport adds the `Idempotency-Key` header afterwards.
    ///
    /// # Errors
    /// A [`SendError`] (usually [`validation`](SendError::validation)) when the message
    /// cannot be expressed in the provider's API; the message is not sent.
    fn encode(&self, message: &Message) -> Result<http::Request<Bytes>, SendError>;

    /// The receipt in a 2xx answer to `message`.
    ///
    /// # Errors
    /// Any error when the body is not what the provider documents. The transport turns it
    /// into an unknown-delivery [`SendError`] with code
    /// [`provider.bad_response`](crate::outcome::codes::BAD_RESPONSE): the provider said 2xx, so the
    /// message was probably accepted, and the key must not be freed.
    fn decode(
        &self,
        message: &Message,
        response: &http::Response<Bytes>,
    ) -> Result<Receipt, BoxError>;

    /// The `Idempotency-Key` header value for `key`, the message's
    /// [`provider_key`](Message::provider_key) (under the idempotency layer, the key its
    /// store holds), or `None` when the provider takes no idempotency key: the header is then
    /// not sent, and the idempotency store is the only net.
    ///
    /// The default fits it to 256 bytes of printable ASCII
    /// ([`fit_idempotency_key`](super::fit_idempotency_key)).
    fn idempotency_key(&self, key: &str) -> Option<String> {
        Some(super::fit_idempotency_key(key, 256))
    }

    /// What a 409 Conflict means, or `None` when the codec does not know; the transport then
    /// answers a permanent [`provider.conflict`](crate::outcome::codes::CONFLICT).
    fn conflict(&self, response: &http::Response<Bytes>) -> Option<SendError> {
        let _ = response;
        None
    }

    /// What a 4xx or 5xx other than 409 means, when the provider's body says more than the
    /// status (a quota, not a rate limit; a field error, not a rejection); `None` lets the
    /// transport map the status (see the [module docs](super)).
    fn failure(&self, response: &http::Response<Bytes>) -> Option<SendError> {
        let _ = response;
        None
    }

    /// The provider's own error text in a 4xx or 5xx body, kept in the error's message.
    ///
    /// Return only the provider's explanation, never the raw body (it may echo the message).
    /// The transport keeps at most 300 characters of it.
    fn error_detail(&self, response: &http::Response<Bytes>) -> Option<String> {
        let _ = response;
        None
    }
}

impl<C: Codec + ?Sized> Codec for std::sync::Arc<C> {
    fn encode(&self, message: &Message) -> Result<http::Request<Bytes>, SendError> {
        (**self).encode(message)
    }

    fn decode(
        &self,
        message: &Message,
        response: &http::Response<Bytes>,
    ) -> Result<Receipt, BoxError> {
        (**self).decode(message, response)
    }

    fn idempotency_key(&self, key: &str) -> Option<String> {
        (**self).idempotency_key(key)
    }

    fn conflict(&self, response: &http::Response<Bytes>) -> Option<SendError> {
        (**self).conflict(response)
    }

    fn failure(&self, response: &http::Response<Bytes>) -> Option<SendError> {
        (**self).failure(response)
    }

    fn error_detail(&self, response: &http::Response<Bytes>) -> Option<String> {
        (**self).error_detail(response)
    }
}

/// A [`Codec`] whose provider also takes many messages in one request: what
/// [`HttpTransport`](super::HttpTransport) needs to be a `Service<Batch<Message>>`.
///
/// The transport does the rest, as for single sends: it checks the batch size against
/// [`max_batch`](Self::max_batch), leaves out the messages [`batchable`](Self::batchable)
/// refuses (each answered with that error), derives one `Idempotency-Key` for the batch,
/// reads the body and maps the status to every message of the batch (see the
/// [module docs](super#batches)).
pub trait BatchCodec: Codec {
    /// The most messages one batch request may hold. A larger batch is a validation error,
    /// [`provider.batch_too_large`](crate::outcome::codes::BATCH_TOO_LARGE), for every message, and
    /// nothing is sent.
    fn max_batch(&self) -> usize;

    /// Whether `message` can go in a batch request.
    ///
    /// # Errors
    /// A [`SendError`] (usually [`validation`](SendError::validation), code
    /// [`provider.not_batchable`](crate::outcome::codes::NOT_BATCHABLE)) that becomes this message's
    /// outcome; it is left out of the request and the rest of the batch goes.
    fn batchable(&self, message: &Message) -> Result<(), SendError> {
        let _ = message;
        Ok(())
    }

    /// The request for `messages`, in order; each passed [`batchable`](Self::batchable). The
    /// transport adds the `Idempotency-Key` header afterwards.
    ///
    /// # Errors
    /// A [`SendError`] when the messages cannot be expressed in the provider's API; it becomes
    /// the outcome of every one of them, and nothing is sent.
    fn encode_batch(&self, messages: &[Message]) -> Result<http::Request<Bytes>, SendError>;

    /// The outcomes in a 2xx answer to `messages`: one per message, in order.
    ///
    /// # Errors
    /// Any error when the body is not what the provider documents. The transport turns it
    /// into an unknown-delivery [`SendError`] with code
    /// [`provider.bad_response`](crate::outcome::codes::BAD_RESPONSE) for every message, as it does
    /// when the answer holds a different number of outcomes than messages.
    fn decode_batch(
        &self,
        messages: &[Message],
        response: &http::Response<Bytes>,
    ) -> Result<Vec<Result<Receipt, SendError>>, BoxError>;
}

impl<C: BatchCodec + ?Sized> BatchCodec for std::sync::Arc<C> {
    fn max_batch(&self) -> usize {
        (**self).max_batch()
    }

    fn batchable(&self, message: &Message) -> Result<(), SendError> {
        (**self).batchable(message)
    }

    fn encode_batch(&self, messages: &[Message]) -> Result<http::Request<Bytes>, SendError> {
        (**self).encode_batch(messages)
    }

    fn decode_batch(
        &self,
        messages: &[Message],
        response: &http::Response<Bytes>,
    ) -> Result<Vec<Result<Receipt, SendError>>, BoxError> {
        (**self).decode_batch(messages, response)
    }
}
