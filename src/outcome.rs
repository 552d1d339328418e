//! What a send produced: a [`Receipt`], or a [`SendError`] with a stable code and a
//! [`Category`] that says whether the message may have gone.
//!
//! The category is what retry policies and circuit breakers read:
//!
//! | category | meaning | the layer does with the key |
//! |---|---|---|
//! | [`Delivered`](Category::Delivered) | the provider took it | keeps it done with the receipt |
//! | [`Retryable`](Category::Retryable) | certainly not sent, may work later | releases it |
//! | [`Permanent`](Category::Permanent) | certainly not sent, will not work as is | releases it |
//! | [`Validation`](Category::Validation) | refused before sending | releases it |
//! | [`Unknown`](Category::Unknown) | may have gone | keeps it done with this outcome |
//!
//! Every answer the idempotency layer makes itself (in flight, replayed, aborted, store failed)
//! is of category `Unknown` except `key_reused`, a validation error. Use
//! [`counts_against_provider`](crate::classify::counts_against_provider) to keep those answers
//! out of a circuit breaker's count.

use std::borrow::Cow;
use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::message::KeyError;

/// The error type of inner services: any error that is `Send + Sync`.
pub type BoxError = Box<dyn Error + Send + Sync>;

pub mod codes;

/// What an outcome says about delivery; see the [module docs](self).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Category {
    /// The provider accepted the message.
    Delivered,
    /// Not sent; a later attempt may succeed (rate limits, 5xx that refused the request).
    Retryable,
    /// Not sent; the same message will fail again (rejected by the provider).
    Permanent,
    /// Not sent; the message or its key is invalid.
    Validation,
    /// It may have been sent: a timeout after the request left, an abort, an answer of the
    /// idempotency layer.
    Unknown,
}

impl Category {
    /// Whether a message with this outcome may have reached the provider.
    pub fn may_have_sent(self) -> bool {
        matches!(self, Self::Delivered | Self::Unknown)
    }
}

/// The provider's acknowledgement of a sent message.
///
/// ```
/// use tower_idempotency::{outcome::Category, Receipt};
///
/// let receipt = Receipt::new("msg_123", "resend").with_accepted(["seller@example.com"]);
/// assert_eq!(receipt.id, "msg_123");
/// assert!(!receipt.replayed);
/// assert_eq!(receipt.category(), Category::Delivered);
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Receipt {
    /// The provider's id of the message.
    pub id: String,
    /// The name of the transport that sent it.
    pub transport: String,
    /// The recipients the provider accepted.
    pub accepted: Vec<String>,
    /// True when this receipt was answered from the store, not by a send.
    pub replayed: bool,
}

/// The public fields only, by name: a field the crate keeps for itself stays out of logs.
///
/// ```
/// use tower_idempotency::Receipt;
///
/// assert_eq!(
///     format!("{:?}", Receipt::new("msg_1", "resend")),
///     r#"Receipt { id: "msg_1", transport: "resend", accepted: [], replayed: false }"#
/// );
/// ```
impl fmt::Debug for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receipt")
            .field("id", &self.id)
            .field("transport", &self.transport)
            .field("accepted", &self.accepted)
            .field("replayed", &self.replayed)
            .finish()
    }
}

impl Receipt {
    /// A receipt from the provider's message id and the transport's name.
    pub fn new(id: impl Into<String>, transport: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            transport: transport.into(),
            accepted: Vec::new(),
            replayed: false,
        }
    }

    /// Sets the accepted recipients.
    #[must_use]
    pub fn with_accepted<I, S>(mut self, accepted: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.accepted = accepted.into_iter().map(Into::into).collect();
        self
    }

    /// [`Category::Unknown`] for a replayed receipt (the layer's own answer), else
    /// [`Category::Delivered`].
    pub fn category(&self) -> Category {
        if self.replayed {
            Category::Unknown
        } else {
            Category::Delivered
        }
    }
}

/// Why a send failed, with a stable [`code`](Self::code) and a [`Category`].
///
/// Transports build it with the constructor of the category; the idempotency layer makes its
/// own answers ([`in_flight`](Self::in_flight), …). The source error is kept.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::{outcome::Category, SendError};
///
/// let err = SendError::retryable("provider.rate_limited", "429 Too Many Requests")
///     .with_retry_after(Duration::from_secs(2));
/// assert_eq!(err.code(), "provider.rate_limited");
/// assert_eq!(err.category(), Category::Retryable);
/// assert!(err.is_retryable());
/// assert!(!err.delivery_unknown());
/// assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));
/// ```
#[derive(Clone)]
pub struct SendError {
    code: Cow<'static, str>,
    category: Category,
    retryable: bool,
    message: String,
    retry_after: Option<Duration>,
    replayed: bool,
    source: Option<Arc<dyn Error + Send + Sync>>,
}

impl SendError {
    /// An error of `category`; crate-internal so the stored form
    /// ([`store::record`](crate::store::record)) can rebuild a kept error.
    pub(crate) fn new(
        code: impl Into<Cow<'static, str>>,
        category: Category,
        retryable: bool,
        message: impl Into<String>,
    ) -> Self {
        Self {
            code: code.into(),
            category,
            retryable,
            message: message.into(),
            retry_after: None,
            replayed: false,
            source: None,
        }
    }

    /// Not sent; a later attempt may succeed.
    pub fn retryable(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(code, Category::Retryable, true, message)
    }

    /// Not sent; the provider refused the message and will refuse it again.
    pub fn permanent(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(code, Category::Permanent, false, message)
    }

    /// Not sent; the message is invalid.
    pub fn validation(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(code, Category::Validation, false, message)
    }

    /// It may have been sent: the layer keeps the key, so a repeat is answered from the store.
    pub fn unknown_delivery(
        code: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        Self::new(code, Category::Unknown, false, message)
    }

    /// The layer's answer when a send under the key is still in flight.
    pub fn in_flight() -> Self {
        Self::new(
            codes::IN_FLIGHT,
            Category::Unknown,
            true,
            "a send under this idempotency key is in flight; this one was not sent",
        )
    }

    /// A circuit breaker refused the call: not sent, so the layer frees the key. Map the
    /// breaker's open-circuit error to it, as its own error type hides what it means:
    ///
    /// ```
    /// use tower_idempotency::{BoxError, SendError};
    /// use tower_resilience_circuitbreaker::CircuitBreakerError;
    ///
    /// fn breaker_error(e: CircuitBreakerError<BoxError>) -> BoxError {
    ///     match e {
    ///         CircuitBreakerError::OpenCircuit => SendError::circuit_open().into(),
    ///         CircuitBreakerError::Inner(e) => e,
    ///     }
    /// }
    /// # let _ = breaker_error;
    /// ```
    pub fn circuit_open() -> Self {
        Self::new(
            codes::CIRCUIT_OPEN,
            Category::Retryable,
            true,
            "the circuit breaker is open; the message was not sent",
        )
    }

    /// The layer's answer when the key was used for a different message.
    pub fn key_reused() -> Self {
        Self::new(
            codes::KEY_REUSED,
            Category::Validation,
            false,
            "the idempotency key was used before for a different message",
        )
    }

    /// The outcome kept when the caller dropped a send after the provider was called.
    pub fn aborted() -> Self {
        Self::new(
            codes::ABORTED,
            Category::Unknown,
            false,
            "the send was dropped after the provider was called; it may have gone",
        )
    }

    /// The outcome kept, and answered, when a send ran longer than the layer's maximum hold:
    /// the inner future was dropped, and the message may have gone.
    pub fn max_hold() -> Self {
        Self::new(
            codes::MAX_HOLD,
            Category::Unknown,
            false,
            "the send ran longer than the idempotency layer's maximum hold and was given up; \
             it may have gone",
        )
    }

    /// The outcome kept, and answered, when a send took over a key from a holder that never
    /// settled it and the verification service could not tell whether the provider took the
    /// message: it was not sent again.
    pub fn unverified() -> Self {
        Self::new(
            codes::UNVERIFIED,
            Category::Unknown,
            false,
            "a previous send under this key was cut off and the provider could not confirm \
             whether it took the message; not sent again",
        )
    }

    /// The layer's answer when a key from the key function breaks the key rules.
    pub fn invalid_key(error: KeyError) -> Self {
        Self::new(
            codes::INVALID_KEY,
            Category::Validation,
            false,
            "the idempotency key is invalid; the message was not sent",
        )
        .with_source(error)
    }

    /// Keeps `source` as the cause.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(Arc::from(source.into()));
        self
    }

    /// Sets how long the provider asked to wait before the next attempt.
    #[must_use]
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = Some(retry_after);
        self
    }

    /// Marks this error as answered from the store rather than by a send.
    #[must_use]
    pub(crate) fn replayed(mut self) -> Self {
        self.replayed = true;
        self
    }

    /// The stable code, such as `idempotency.in_flight`; see [`codes`].
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The category.
    pub fn category(&self) -> Category {
        self.category
    }

    /// Whether the same message may be sent again later and succeed.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// Whether the message may have reached the provider.
    pub fn delivery_unknown(&self) -> bool {
        self.category == Category::Unknown
    }

    /// How long the provider asked to wait before the next attempt.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// True when this error was answered from the store (the kept outcome of an earlier send).
    pub fn is_replayed(&self) -> bool {
        self.replayed
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether this error was made by the idempotency layer rather than by a provider.
    pub fn is_idempotency_answer(&self) -> bool {
        self.replayed || self.code.starts_with("idempotency.")
    }

    /// Whether a circuit breaker should count this error against the provider: a retryable or
    /// unknown-delivery failure that came from the provider, not an answer of the idempotency
    /// layer or of an open breaker, not the provider's answer about an earlier request under
    /// the same key (a code starting with
    /// [`PROVIDER_IDEMPOTENCY_PREFIX`](codes::PROVIDER_IDEMPOTENCY_PREFIX), such as Resend's
    /// 409 for a request still in flight: a healthy provider's answer), and not the caller's
    /// invalid input.
    pub fn counts_against_provider(&self) -> bool {
        !self.is_idempotency_answer()
            && self.code != codes::CIRCUIT_OPEN
            && !self.code.starts_with(codes::PROVIDER_IDEMPOTENCY_PREFIX)
            && matches!(self.category, Category::Retryable | Category::Unknown)
    }
}

impl fmt::Debug for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("SendError");
        d.field("code", &self.code)
            .field("category", &self.category)
            .field("retryable", &self.retryable)
            .field("message", &self.message);
        if let Some(r) = self.retry_after {
            d.field("retry_after", &r);
        }
        if self.replayed {
            d.field("replayed", &true);
        }
        if let Some(s) = &self.source {
            d.field("source", s);
        }
        d.finish()
    }
}

/// `message (code)`, then the text of each error of the source chain after `: `, so a log line
/// of `%error` keeps the provider's own words ("422 Unprocessable Entity") and the client's
/// ("operation timed out") that a plain error carried.
///
/// ```
/// use tower_idempotency::SendError;
///
/// let error = SendError::unknown_delivery("provider.unknown", "the send failed")
///     .with_source(std::io::Error::other("provider answered 422"));
/// assert_eq!(error.to_string(), "the send failed (provider.unknown): provider answered 422");
/// ```
impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code)?;
        let mut next = self.source.as_deref().map(|e| e as &(dyn Error + 'static));
        while let Some(error) = next {
            write!(f, ": {error}")?;
            next = error.source();
        }
        Ok(())
    }
}

impl Error for SendError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// The outcome of a send as a store keeps it: the receipt, or the error of unknown delivery.
///
/// Build one with [`sent`](Self::sent), [`failed`](Self::failed) or `From` a send's result.
/// A store persists it through [`store::record`](crate::store::record), which owns the
/// stored form; the type itself has no serde form, so the public API can change without
/// changing what is stored.
///
/// ```
/// use tower_idempotency::{Outcome, Receipt, SendError};
///
/// let sent = Outcome::sent(Receipt::new("msg_1", "resend"));
/// let replayed = sent.replay().unwrap();
/// assert!(replayed.replayed);
///
/// let failed = Outcome::failed(SendError::aborted());
/// assert!(failed.replay().unwrap_err().is_replayed());
/// ```
#[derive(Clone, Debug)]
pub struct Outcome(pub(crate) Kept);

/// What an [`Outcome`] holds. Crate-internal so the stored form can read and rebuild it
/// while the public type stays opaque.
#[derive(Clone, Debug)]
pub(crate) enum Kept {
    /// The provider accepted the message.
    Sent {
        /// The receipt; a kept one holds no addresses (`accepted` is empty).
        receipt: Receipt,
        /// The accepted recipients as positions in the message's recipient list, so no
        /// address is written to the store; empty when the receipt names them itself.
        accepted_at: Vec<u32>,
    },
    /// The send failed; kept only when delivery is unknown.
    Failed(SendError),
}

/// The positions in `recipients` (the message's) of a receipt's accepted addresses, which a
/// store keeps in their place; an address not among the recipients is not kept.
fn accepted_at(receipt: &Receipt, recipients: &[&str]) -> Vec<u32> {
    receipt
        .accepted
        .iter()
        .filter_map(|address| {
            recipients
                .iter()
                .position(|r| r.eq_ignore_ascii_case(address))
                .and_then(|i| u32::try_from(i).ok())
        })
        .collect()
}

impl Outcome {
    /// The provider accepted the message with `receipt`.
    pub fn sent(receipt: Receipt) -> Self {
        Self(Kept::Sent {
            receipt,
            accepted_at: Vec::new(),
        })
    }

    /// The send failed with `error`.
    pub fn failed(error: SendError) -> Self {
        Self(Kept::Failed(error))
    }

    /// The receipt, when the provider accepted the message. A receipt the layer kept names
    /// no accepted recipients (the store keeps their positions); a replay for the message
    /// restores them.
    pub fn receipt(&self) -> Option<&Receipt> {
        match &self.0 {
            Kept::Sent { receipt, .. } => Some(receipt),
            Kept::Failed(_) => None,
        }
    }

    /// The error, when the send failed.
    pub fn error(&self) -> Option<&SendError> {
        match &self.0 {
            Kept::Sent { .. } => None,
            Kept::Failed(error) => Some(error),
        }
    }

    /// The outcome as the caller sees it when it is answered from the store: marked replayed.
    pub fn replay(&self) -> Result<Receipt, SendError> {
        self.clone().into_replay()
    }

    /// The outcome as a store keeps it: a receipt's accepted recipients become their
    /// positions in `recipients` (the message's), so no address reaches the store. An
    /// accepted address that is not among the message's recipients is not kept.
    pub(crate) fn kept(result: &Result<Receipt, SendError>, recipients: &[&str]) -> Self {
        match result {
            Ok(receipt) => Self(Kept::Sent {
                receipt: Receipt {
                    id: receipt.id.clone(),
                    transport: receipt.transport.clone(),
                    accepted: Vec::new(),
                    replayed: false,
                },
                accepted_at: accepted_at(receipt, recipients),
            }),
            Err(error) => Self::failed(error.clone()),
        }
    }

    /// [`replay`](Self::replay), consuming the outcome instead of cloning it.
    pub fn into_replay(self) -> Result<Receipt, SendError> {
        match self.0 {
            Kept::Sent { receipt, .. } => Ok(Receipt {
                replayed: true,
                ..receipt
            }),
            Kept::Failed(error) => Err(error.replayed()),
        }
    }

    /// The category of the outcome.
    pub fn category(&self) -> Category {
        match &self.0 {
            Kept::Sent { receipt, .. } => receipt.category(),
            Kept::Failed(error) => error.category(),
        }
    }
}

impl From<Result<Receipt, SendError>> for Outcome {
    fn from(result: Result<Receipt, SendError>) -> Self {
        match result {
            Ok(receipt) => Self::sent(receipt),
            Err(error) => Self::failed(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replayed_outcomes_are_marked_and_of_category_unknown() {
        let sent = Outcome::sent(Receipt::new("m1", "fake"));
        let replay = sent.replay().unwrap();
        assert!(replay.replayed);
        assert_eq!(replay.category(), Category::Unknown);
        let failed = Outcome::failed(SendError::aborted()).replay().unwrap_err();
        assert!(failed.is_replayed());
        assert!(!failed.counts_against_provider());
    }

    #[test]
    fn a_kept_receipt_holds_positions_and_a_replay_for_the_message_restores_them() {
        let receipt = Receipt::new("m1", "fake").with_accepted(["B@x", "a@x", "stranger@x"]);
        let kept = Outcome::kept(&Ok(receipt), &["a@x", "b@x"]);
        let stored = kept.receipt().unwrap();
        assert!(stored.accepted.is_empty(), "no address is kept");
        assert!(kept.replay().unwrap().accepted.is_empty());
        let replay = kept.into_replay_for(&["a@x", "b@x"]).unwrap();
        assert_eq!(replay.accepted, ["b@x", "a@x"]);
        assert!(replay.replayed);

        let given = Outcome::sent(Receipt::new("m2", "fake").with_accepted(["c@x"]));
        assert_eq!(given.into_replay_for(&["a@x"]).unwrap().accepted, ["c@x"]);
    }

    #[test]
    fn layer_answers_are_unknown_except_key_reused() {
        let timed_out = std::io::Error::from(std::io::ErrorKind::TimedOut);
        let store = SendError::store_failed(timed_out);
        for e in [SendError::in_flight(), SendError::aborted(), store.clone()] {
            assert_eq!(e.category(), Category::Unknown, "{}", e.code());
            assert!(e.is_idempotency_answer());
            assert!(!e.counts_against_provider());
        }
        assert!(store.is_retryable());
        assert_eq!(SendError::key_reused().category(), Category::Validation);
        assert!(!SendError::key_reused().is_retryable());
    }

    #[test]
    fn a_providers_answer_about_an_earlier_request_under_the_key_does_not_count() {
        // Retryable and of unknown delivery, as Resend's 409 for a request still in flight.
        let in_flight = SendError::new(
            "provider.idempotency_in_flight",
            Category::Unknown,
            true,
            "still handling an earlier request under this key",
        );
        assert!(!in_flight.is_idempotency_answer());
        assert!(!in_flight.counts_against_provider());
        // The prefix is the whole rule: a code that only looks alike still counts.
        let lookalike = SendError::new("provider.idempotency", Category::Unknown, true, "500");
        assert!(lookalike.counts_against_provider());
    }
}
