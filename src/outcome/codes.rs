//! Every stable code of the errors the crate makes, in one list: what
//! [`SendError::code`](super::SendError::code) answers, and what an alert, a dashboard or a
//! `match` reads. A released code keeps its meaning; later releases may add codes.
//!
//! By who makes them:
//!
//! | who | codes |
//! |---|---|
//! | the idempotency layer, answering for the provider (`idempotency.*`) | [`IN_FLIGHT`], [`KEY_REUSED`], [`ABORTED`], [`MAX_HOLD`], [`UNVERIFIED`], [`STORE_FAILED`], [`STORE_MISCONFIGURED`], [`INVALID_KEY`]; its warning's code, [`STORE_FAILED_WARNING`] |
//! | the crate, judging an inner error without a provider's answer (`provider.*`) | [`TIMEOUT`], [`UNKNOWN`], [`NOT_SENT`] (the [classifier](crate::classify)), [`BATCH_MISMATCH`] (a batch provider's answer of the wrong length) |
//! | the HTTP transport (feature `http`), from the status of a provider's answer | [`RATE_LIMITED`], [`UNAVAILABLE`], [`CONNECT`], [`REQUEST_TIMEOUT`], [`SERVER_ERROR`], [`BAD_RESPONSE`], [`CONFLICT`], [`REJECTED`], [`UNEXPECTED_STATUS`] |
//! | the HTTP transport and every codec, for a message the provider's API cannot take | [`INVALID_REQUEST`], [`BATCH_TOO_LARGE`], [`NOT_BATCHABLE`] |
//! | a provider's codec, from the provider's own error names | [`VALIDATION_ERROR`] (Resend, Postmark, Twilio), [`IDEMPOTENCY_IN_FLIGHT`], [`IDEMPOTENCY_KEY_REUSED`], [`QUOTA_EXCEEDED`] (Resend), [`INACTIVE_RECIPIENT`] (Postmark), [`RECIPIENT_UNSUBSCRIBED`] (Twilio) |
//! | a circuit breaker, through [`SendError::circuit_open`](super::SendError::circuit_open) | [`CIRCUIT_OPEN`] |
//!
//! The HTTP transport's module maps each status to its code, and each provider's module
//! says which of its provider's answers gets which code (feature `http`: `http::resend`,
//! `http::postmark`, `http::twilio`). A code of your own transport may be any string; keep
//! it out of the prefixes above, or give it the meaning the code here has.
//!
//! A code that starts with [`PROVIDER_IDEMPOTENCY_PREFIX`] (`provider.idempotency_`) is the
//! provider's answer about an earlier request under the same idempotency key (still in
//! flight, or another message): it says nothing of the provider's health, so
//! [`counts_against_provider`](super::SendError::counts_against_provider) never counts it.

/// How the codes of a provider's answers about an earlier request under the same
/// idempotency key begin, such as Resend's [`IDEMPOTENCY_IN_FLIGHT`]: answers a circuit
/// breaker does not count.
pub const PROVIDER_IDEMPOTENCY_PREFIX: &str = "provider.idempotency_";

// The idempotency layer's own answers.

/// A send under the key is still in flight; this one was not sent. Category unknown.
pub const IN_FLIGHT: &str = "idempotency.in_flight";
/// The key was used before for a different message. Category validation.
pub const KEY_REUSED: &str = "idempotency.key_reused";
/// The caller dropped the send after the provider was called. Category unknown.
pub const ABORTED: &str = "idempotency.aborted";
/// The send ran longer than the layer's maximum hold and was given up; the provider may
/// have taken it. Category unknown.
pub const MAX_HOLD: &str = "idempotency.max_hold";
/// A send took over a key whose previous holder never settled it (a crashed process),
/// and the layer's verification service could not tell whether the provider took that
/// message: the key is kept, this one was not sent. Category unknown.
pub const UNVERIFIED: &str = "idempotency.unverified";
/// The store could not reserve the key; the message was not sent. Category unknown,
/// retryable.
pub const STORE_FAILED: &str = "idempotency.store_failed";
/// The store is set up wrong ([`StoreErrorKind::Misconfigured`](crate::store::StoreErrorKind::Misconfigured):
/// an invalid URL, a SQLite path that is no database): the key could not be reserved and the
/// message was not sent. Category permanent, not retryable: it fails again until the store's
/// configuration changes.
pub const STORE_MISCONFIGURED: &str = "idempotency.store_misconfigured";
/// The key given by the key function breaks the key rules. Category validation.
pub const INVALID_KEY: &str = "idempotency.invalid_key";
/// The code of the `tracing` warning emitted when the store fails after a send went.
pub const STORE_FAILED_WARNING: &str = "IDEMPOTENCY_STORE_FAILED";

// Inner errors the crate judged without a provider's answer.

/// An inner service timed out (`tower::timeout`); the message may have gone.
pub const TIMEOUT: &str = "provider.timeout";
/// An inner error the classifier judged of unknown delivery.
pub const UNKNOWN: &str = "provider.unknown";
/// An inner error the classifier judged not sent, retryable; also the HTTP transport's
/// client that could not become ready.
pub const NOT_SENT: &str = "provider.not_sent";
/// A batch provider answered a different number of outcomes than messages; any of them
/// may have gone. Category unknown.
pub const BATCH_MISMATCH: &str = "provider.batch_mismatch";

// The HTTP transport's, from the status of the provider's answer.

/// 429: the provider is rate limiting. Retryable, with the `Retry-After` wait.
pub const RATE_LIMITED: &str = "provider.rate_limited";
/// 502, 503, 504: the provider is unavailable. Retryable.
pub const UNAVAILABLE: &str = "provider.unavailable";
/// The client could not connect: the request never left
/// ([`never_connected`](crate::classify::never_connected) by default). Retryable.
pub const CONNECT: &str = "provider.connect";
/// 408: the provider timed out waiting for the request. Retryable.
pub const REQUEST_TIMEOUT: &str = "provider.request_timeout";
/// 500 and 5xx other than 502/503/504. Unknown delivery.
pub const SERVER_ERROR: &str = "provider.server_error";
/// A 2xx whose body does not decode, is cut off or is too long. Unknown delivery.
pub const BAD_RESPONSE: &str = "provider.bad_response";
/// 409 that the codec does not know. Permanent.
pub const CONFLICT: &str = "provider.conflict";
/// 4xx other than 408, 409 and 429. Permanent.
pub const REJECTED: &str = "provider.rejected";
/// A status the transport cannot place: 1xx as the final answer, 3xx, or 600 to 999.
/// Unknown delivery: the key is kept, since the provider may have taken the message.
pub const UNEXPECTED_STATUS: &str = "provider.unexpected_status";

// The HTTP transport's and every codec's, for a message the provider's API cannot take.

/// The message cannot be expressed as the provider's request (the codec's `encode`): it
/// breaks one of the provider's documented limits (the text says which), or its key cannot
/// go in the `Idempotency-Key` header. Validation; nothing is sent.
pub const INVALID_REQUEST: &str = "provider.invalid_request";
/// The batch holds more messages than the provider takes in one request (the codec's
/// `max_batch`). Validation, for every message; nothing is sent.
pub const BATCH_TOO_LARGE: &str = "provider.batch_too_large";
/// The message cannot go in a batch request (the codec's `batchable`; with Resend: it has
/// attachments or a schedule). Validation, for that message; the rest of the batch goes.
pub const NOT_BATCHABLE: &str = "provider.not_batchable";

// A provider's codec's, from the provider's own error names.

/// The provider found the message invalid: Resend's 422 or 400 `validation_error`,
/// Postmark's `ErrorCode` 300, 402, 403, 409, 410 or 411, Twilio's 400 other than its policy
/// refusals. Validation.
pub const VALIDATION_ERROR: &str = "provider.validation_error";
/// Resend is still handling a request under this idempotency key (its 409
/// `concurrent_idempotent_requests`). Unknown delivery, retryable under the same key; not
/// counted against the provider.
pub const IDEMPOTENCY_IN_FLIGHT: &str = "provider.idempotency_in_flight";
/// Resend holds this idempotency key for a different request (its 409
/// `invalid_idempotent_request`). Validation.
pub const IDEMPOTENCY_KEY_REUSED: &str = "provider.idempotency_key_reused";
/// The account's daily or monthly sending quota is used up (Resend's 429
/// `daily_quota_exceeded` / `monthly_quota_exceeded`). Permanent: not sent, not retried,
/// not a provider failure.
pub const QUOTA_EXCEEDED: &str = "provider.quota_exceeded";
/// A recipient is inactive at Postmark (`ErrorCode` 406: a hard bounce, a spam complaint
/// or a manual suppression). Permanent, for that message alone.
pub const INACTIVE_RECIPIENT: &str = "provider.inactive_recipient";
/// The recipient opted out (replied STOP; Twilio error 21610). Permanent.
pub const RECIPIENT_UNSUBSCRIBED: &str = "provider.recipient_unsubscribed";
/// The account may not send now: Amazon SES's `AccountSuspendedException` or
/// `SendingPausedException`. Permanent: not sent, and no retry within seconds can help.
pub const SENDING_PAUSED: &str = "provider.sending_paused";
/// The sender's identity or MAIL FROM domain is not verified (Amazon SES's
/// `MailFromDomainNotVerifiedException`, `MessageRejected` for an unverified address).
/// Permanent.
pub const IDENTITY_NOT_VERIFIED: &str = "provider.identity_not_verified";
/// An SMTP server answered a 4xx (other than 421): it did not take the message this time.
/// Retryable.
pub const DEFERRED: &str = "provider.deferred";
/// The connection to an SMTP server was lost while the message's body or its final `.` was
/// written, or before the server answered it: the server may have taken the message. Unknown
/// delivery.
pub const CONNECTION_LOST: &str = "provider.connection_lost";

// A circuit breaker's.

/// A circuit breaker refused the call: not sent, retryable.
pub const CIRCUIT_OPEN: &str = "breaker.open";
