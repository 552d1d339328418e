//! The HTTP provider transport: [`HttpTransport`] sends a [`Message`](crate::Message) through
//! any HTTP client that is a `tower::Service<http::Request<Bytes>>`, in the API a [`Codec`]
//! describes. Each provider's codec is in a module of its own, with its limits and what its
//! errors become: [`ResendCodec`](resend::ResendCodec) and
//! [`PostmarkCodec`](postmark::PostmarkCodec) (email), [`TwilioCodec`](twilio::TwilioCodec)
//! (SMS). The codes of the errors the transport and the codecs make are in
//! [`outcome::codes`](crate::outcome::codes), with every other code of the crate.
//!
//! Enabled by the `http` feature.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_idempotency::http::HttpTransport;
//! use tower_idempotency::http::resend::ResendCodec;
//! use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message};
//!
//! # #[tokio::main] async fn main() -> Result<(), BoxError> {
//! // hyper-util's client takes a body type; `Full` wraps the codec's bytes.
//! // (Resend is https: build the client over an HTTPS connector such as hyper-rustls.)
//! let client = ServiceBuilder::new()
//!     .map_request(|request: http::Request<Bytes>| request.map(Full::new))
//!     .service(Client::builder(TokioExecutor::new()).build_http());
//! let api_key = std::env::var("RESEND_API_KEY")?;
//!
//! let resend = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::builder().store(MemoryStore::new()).namespace("resend").build()?)
//!     // Retry and a circuit breaker go here: every attempt carries the same Idempotency-Key.
//!     .timeout(Duration::from_secs(10))
//!     .service(HttpTransport::new(client, ResendCodec::new(api_key)));
//!
//! let message = Message::builder()
//!     .from("orders@marketplace.example")
//!     .to("seller@example.com")
//!     .subject("New order ord_20481")
//!     .text("Vintage Nikon FM2 just sold.")
//!     .idempotency_key("order.created:ord_20481:email")
//!     .build()?;
//! let receipt = resend.oneshot(message).await?;
//! println!("sent as {}", receipt.id);
//! # Ok(()) }
//! ```
//!
//! # What the transport does on every send
//!
//! 1. The codec encodes the message ([`Codec::encode`]); a message it cannot express fails
//!    as a validation error and the client is not called.
//! 2. The transport sets `Idempotency-Key` to the message's
//!    [`provider_key`](crate::Message::provider_key): under
//!    [`IdempotencyLayer`](crate::IdempotencyLayer) the very key the layer's store holds
//!    (after its key function and namespace, so two namespaces on one provider account never
//!    share a key), else the message's own key; the codec fits it to the provider's limits
//!    ([`Codec::idempotency_key`]: a digest when too long or not ASCII) or says the provider
//!    takes none. An unkeyed message goes without the header. Every attempt of a retried
//!    message carries the same key, and the provider can deduplicate too: the second net
//!    behind the idempotency store.
//! 3. The client sends it. The response body is read up to [`DEFAULT_MAX_RESPONSE_BODY`]
//!    bytes ([`HttpTransport::max_response_body`]).
//! 4. The answer is mapped to an outcome:
//!
//! | answer | outcome | category | code |
//! |---|---|---|---|
//! | 2xx, body decodes | the codec's [`Receipt`](crate::Receipt) | delivered | |
//! | 2xx, body does not decode, is cut off or too long | error | unknown (the provider said yes) | `provider.bad_response` |
//! | 4xx/5xx the codec reads from the body ([`Codec::failure`]; Resend: a quota, a 422) | the codec's error | the codec's | the codec's |
//! | 408 Request Timeout | error | retryable | `provider.request_timeout` |
//! | 409 Conflict | [`Codec::conflict`] decides; when it does not know | permanent | `provider.conflict` |
//! | 429 Too Many Requests | error, with `Retry-After` | retryable | `provider.rate_limited` |
//! | other 4xx | error, with the provider's error text | permanent | `provider.rejected` |
//! | 502, 503, 504 | error, with `Retry-After` when given | retryable | `provider.unavailable` |
//! | 500 and other 5xx | error | unknown | `provider.server_error` |
//! | any other status: 1xx as the final answer, 3xx (redirects are not followed), 600 to 999 | error | unknown (the key is kept) | `provider.unexpected_status` |
//! | client error that certainly did not send (default: [`never_connected`](crate::classify::never_connected): an unresolvable host, a URL or scheme the client's connector refuses, a failed TLS handshake, a refused or reset connect) | error | retryable | `provider.connect` |
//! | client error carrying a provider's status (reqwest's `error_for_status`) | error | as the status rows above | as above |
//! | client error: `tower` or `tokio` timeout `Elapsed` | error | unknown | `provider.timeout` |
//! | any other client error (the request may have been written) | error | unknown | `provider.unknown` |
//! | the client's `poll_ready` fails | error | retryable | `provider.not_sent` |
//!
//! Each codec documents how it reads its provider's error names, next to the limits it
//! checks: [`resend`](resend#limits), [`postmark`](postmark#limits),
//! [`twilio`](twilio#limits).
//!
//! Decisions:
//! - **408** is retryable under its own code, `provider.request_timeout`, not the
//!   `provider.timeout` of a client-side timeout: a 408 is the server saying it gave up
//!   waiting for the request, so it did not act on it, while a client-side timeout leaves
//!   delivery unknown.
//! - **500** is of unknown delivery, while 502/503/504 are retryable: a gateway or an
//!   overloaded front refuses before the application runs, but a 500 may come after the
//!   provider queued the message.
//! - **A status the transport cannot place** is of unknown delivery, never permanent: a
//!   permanent error frees the key, which is only safe when the message certainly did not
//!   go, and no such status says that. A 3xx may come after the provider acted on the
//!   request (a 303 See Other after a POST says exactly that), a 1xx is no final answer at
//!   all, and a status of 600 or more is outside HTTP's classes. The key is kept, repeats are
//!   replayed this error, and the provider is not called again under it; fix the base URL or
//!   the proxy that answered and send under a new key once you know the first did not go.
//! - **`Retry-After`** is read as delta-seconds or an HTTP-date ([`parse_retry_after`]); a
//!   date in the past is zero, anything else is ignored.
//! - **Connect errors.** A client error is retryable, and frees the key, only when its chain
//!   shows the request never left; by default that is
//!   [`never_connected`](crate::classify::never_connected), read from the errors' types:
//!   hyper-util's and reqwest's `is_connect()` (their connector failed: DNS, a scheme it does
//!   not take, TLS, a refused or reset connect, a connect timeout) and an `io::Error` of kind
//!   `ConnectionRefused` from any client. A typo in the base URL therefore costs one failed
//!   send, not the key. A reset after the connection was up stays of unknown delivery: the
//!   request may have been written. [`not_sent_if`](HttpTransport::not_sent_if) replaces the
//!   judge.
//! - **One status table.** The statuses a codec does not read map through one table, which
//!   the `reqwest` feature also applies to a `reqwest::Error` from `error_for_status()`, so
//!   the same status gives the same code and category through either client.
//! - **Logs and errors** never hold message content: the transport logs nothing, error texts
//!   hold the status and the provider's own explanation (at most 300 characters), never the
//!   body that was sent.
//!
//! # Batches
//!
//! With a [`BatchCodec`] ([`ResendCodec`](resend::ResendCodec): `POST /emails/batch`), the
//! transport is also a `Service<Batch<Message>>` whose answer holds one outcome per message,
//! in the batch's order ([`BatchOutcomes`](crate::batch::BatchOutcomes)). Under
//! [`IdempotencyLayer`](crate::IdempotencyLayer) the batch it receives holds only the messages
//! the store let through. On every call:
//!
//! 1. A batch larger than [`BatchCodec::max_batch`] (Resend:
//!    [`RESEND_MAX_BATCH`](resend::RESEND_MAX_BATCH), 100) is a validation error for every
//!    message, [`provider.batch_too_large`](crate::outcome::codes::BATCH_TOO_LARGE), and
//!    nothing is sent: split it before, so no half of it goes by surprise.
//! 2. A message the codec cannot put in a batch ([`BatchCodec::batchable`]; Resend: one that
//!    breaks a documented limit, or has attachments or a `send_at`) is answered a validation
//!    error ([`provider.invalid_request`](crate::outcome::codes::INVALID_REQUEST),
//!    [`provider.not_batchable`](crate::outcome::codes::NOT_BATCHABLE)), and left out; the
//!    rest go. The error lands on the message at fault and says what to do (send it alone);
//!    failing its neighbours too would only make the caller find which one was at fault.
//! 3. The rest go as **one** request ([`BatchCodec::encode_batch`]), with one
//!    `Idempotency-Key` derived from their provider keys in order ([`batch_idempotency_key`]): the
//!    same on every attempt of the same batch, different for any other. A batch holding a
//!    message without a key goes without the header, as that message would alone.
//! 4. The answer maps as in the table above, to **every** message of the request: a 429 makes
//!    each retryable with the `Retry-After` wait, a 500 each of unknown delivery, and so on.
//!    A 2xx is decoded by [`BatchCodec::decode_batch`]; a body that does not decode, or one
//!    with a different number of outcomes than messages, is `provider.bad_response`, of
//!    unknown delivery, for every message (any of them may have gone; no outcome is matched
//!    to a message by guesswork).
//!
//! Messages left out (2.) and an empty batch send no request. The call fails as a whole only
//! when the client cannot become ready (`provider.not_sent`).
//!
//! A transport with a batch codec is a `Service` of two request types, and so is a stack over
//! it: `ready()` must be told which one (`ServiceExt::<Batch>::ready(&mut service)`, as with
//! axum's `Router`); `oneshot` and `call` infer it from their argument.
//!
//! ```
//! use tower::{Service, ServiceExt};
//! use tower_idempotency::batch::Batch;
//! use tower_idempotency::http::HttpTransport;
//! use tower_idempotency::http::resend::ResendCodec;
//! use tower_idempotency::outcome::codes;
//! use tower_idempotency::{Attachment, BoxError, Message};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), BoxError> {
//! # let client = tower::service_fn(|request: http::Request<bytes::Bytes>| async move {
//! #     assert_eq!(request.uri().path(), "/emails/batch");
//! #     let body = r#"{"data":[{"id":"id-1"},{"id":"id-2"}]}"#.to_owned();
//! #     Ok::<_, std::convert::Infallible>(http::Response::new(body))
//! # });
//! let mut resend = HttpTransport::new(client, ResendCodec::new("re_123"));
//! let m = |to: &str| Message::builder().from("hello@shop.example").to(to).subject("Hi").text("Welcome!");
//! let batch = Batch::from(vec![
//!     m("a@example.com").idempotency_key("welcome:a").build()?,
//!     m("b@example.com").idempotency_key("invoice:b")
//!         .attachment(Attachment::new("invoice.pdf", "application/pdf", &b"%PDF"[..]))
//!         .build()?,
//!     m("c@example.com").idempotency_key("welcome:c").build()?,
//! ]);
//! let outcomes = ServiceExt::<Batch>::ready(&mut resend).await?.call(batch).await?;
//! assert_eq!(outcomes[0].as_ref().unwrap().id, "id-1");
//! // Resend's batch endpoint takes no attachments: send that one on its own.
//! assert_eq!(outcomes[1].as_ref().unwrap_err().code(), codes::NOT_BATCHABLE);
//! assert_eq!(outcomes[2].as_ref().unwrap().id, "id-2");
//! # Ok(()) }
//! ```
//!
//! # Clients
//!
//! - **hyper-util**'s legacy `Client` needs a body type: put
//!   `map_request(|r: http::Request<Bytes>| r.map(http_body_util::Full::new))` in front of it,
//!   as above.
//! - **reqwest** (0.13): `reqwest::Client` is a `Service<reqwest::Request>`; adapt it with
//!   `reqwest::Request::try_from(request)` and `http::Response::from(response)`. Turn its own
//!   retries off (`ClientBuilder::retry(reqwest::retry::never())`) so a retry is always one
//!   the stack chose, and its redirects (`redirect::Policy::none()`), which turn a POST into a
//!   GET.
//!
//! # Delivery truth
//!
//! What the provider knows settles what the client could not tell: each codec marks what it
//! sends with a digest of the stored key ([`mark`]); the [`lookup`]s answer the
//! [`Reconciler`](crate::reconcile::Reconciler) and
//! [`verify_takeovers`](crate::IdempotencyLayerBuilder::verify_takeovers) from the provider's
//! listing, and the [`webhook`] receivers settle keys from the provider's signed events.

pub(crate) mod codec;
mod future;
pub mod lookup;
pub mod mark;
#[cfg(feature = "ses")]
mod sigv4;
mod status;
mod transport;
pub mod webhook;

#[cfg(feature = "ses")]
pub use codec::ses;
pub use codec::{BatchCodec, Codec, postmark, resend, twilio};
pub use future::{BatchResponseFuture, ResponseFuture};
pub use status::parse_retry_after;
pub use transport::{
    DEFAULT_MAX_RESPONSE_BODY, HttpTransport, IDEMPOTENCY_KEY, batch_idempotency_key,
    fit_idempotency_key,
};
