//! The one judge of "was it sent?": how an error that is not (yet) a [`SendError`] is placed in
//! a [`Category`].
//!
//! Four parts of the crate read errors, and all four judge them here, the same way:
//!
//! - the [layer](crate::IdempotencyLayer) turns the inner service's error into the
//!   [`SendError`] its caller gets, and keeps or frees the key by it;
//! - [`RetryPolicy`](crate::RetryPolicy) retries what certainly did not go;
//! - `http::HttpTransport` judges the HTTP client's errors (feature
//!   `http`);
//! - [`counts_against_provider`] tells a circuit breaker what to count.
//!
//! The judgement walks the error's [`source`](Error::source) chain, outermost first:
//!
//! 1. a [`SendError`] anywhere in the chain ([`find_send_error`]) is taken as it is: whoever
//!    made it knew what happened;
//! 2. else a timeout of `tower::timeout` or `tokio::time` anywhere in the chain is of unknown
//!    delivery: the request may have left before the time ran out;
//! 3. else, with the `reqwest` feature, a `reqwest::Error` carrying a provider's status (from
//!    `error_for_status()`) is answered as `http::HttpTransport` answers that status: the same
//!    code and category from one status table (the `http` module's), the classifier not asked;
//! 4. else the [`Classifier`] decides. The [default](default_classifier) answers
//!    [`Category::Retryable`] for an error that shows the request never left (a connection
//!    refused, a failed connect of hyper-util's or reqwest's client: [`never_connected`]) and
//!    [`Category::Unknown`] for anything else.
//!
//! Set the same classifier everywhere, so the layer and the retry policy never disagree about
//! an error:
//!
//! ```
//! use tower::retry::RetryLayer;
//! use tower::ServiceBuilder;
//! use tower_idempotency::classify::{Classifier, default_classifier};
//! use tower_idempotency::outcome::Category;
//! use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message, Receipt, RetryPolicy};
//!
//! # fn main() -> Result<(), BoxError> {
//! // An SMTP relay that answers "mailbox full" refused the message: it did not go.
//! fn relay_errors(error: &(dyn std::error::Error + 'static)) -> Category {
//!     if error.to_string().starts_with("552") {
//!         return Category::Permanent;
//!     }
//!     default_classifier(error)
//! }
//! let layer = IdempotencyLayer::builder()
//!     .store(MemoryStore::new())
//!     .classify(relay_errors)
//!     .build()?;
//! let retry = RetryPolicy::new().classifier(layer.classifier());
//! # let relay = tower::service_fn(|_m: Message| async { Ok::<_, BoxError>(Receipt::new("m", "smtp")) });
//! let service = ServiceBuilder::new()
//!     .layer(layer)
//!     .layer(RetryLayer::new(retry))
//!     .service(relay);
//! # let _ = service;
//! # Ok(()) }
//! ```

use std::borrow::Cow;
use std::error::Error;
use std::fmt;
use std::io;
use std::sync::Arc;

use crate::outcome::{BoxError, Category, SendError, codes};

/// The hook that places an error the crate cannot read in a [`Category`]; see the
/// [module docs](self).
///
/// Answer [`Category::Unknown`] when the message may have gone (the layer then keeps the key
/// and answers repeats from the store), a not-sent category ([`Retryable`](Category::Retryable),
/// [`Permanent`](Category::Permanent), [`Validation`](Category::Validation)) only when it
/// certainly did not. [`Category::Delivered`] is read as `Unknown`: an error is no delivery.
///
/// Cheap to clone: clones share the function.
///
/// ```
/// use tower_idempotency::classify::Classifier;
/// use tower_idempotency::outcome::Category;
///
/// let classifier = Classifier::new(|e| {
///     if e.to_string().contains("quota") { Category::Retryable } else { Category::Unknown }
/// });
/// assert_eq!(classifier.category(&std::io::Error::other("quota exceeded")), Category::Retryable);
/// assert_eq!(Classifier::default().category(&std::io::Error::other("reset")), Category::Unknown);
/// ```
#[derive(Clone)]
pub struct Classifier(Arc<ClassifyFn>);

/// The shape of the hook: one error in, one category out.
type ClassifyFn = dyn Fn(&(dyn Error + 'static)) -> Category + Send + Sync;

impl Classifier {
    /// A classifier calling `classify`.
    pub fn new<F>(classify: F) -> Self
    where
        F: Fn(&(dyn Error + 'static)) -> Category + Send + Sync + 'static,
    {
        Self(Arc::new(classify))
    }

    /// What the hook says of `error`, [`Category::Delivered`] read as [`Category::Unknown`].
    ///
    /// This is the hook alone: [`SendError`]s and timeouts in the chain are judged before it
    /// (see the [module docs](self)).
    pub fn category(&self, error: &(dyn Error + 'static)) -> Category {
        match (self.0)(error) {
            category @ (Category::Retryable | Category::Permanent | Category::Validation) => {
                category
            }
            _ => Category::Unknown,
        }
    }
}

impl Default for Classifier {
    /// [`default_classifier`].
    fn default() -> Self {
        Self::new(default_classifier)
    }
}

impl fmt::Debug for Classifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Classifier").finish_non_exhaustive()
    }
}

/// The default [`Classifier`]: [`Category::Retryable`] when the error shows the request never
/// left ([`never_connected`]), [`Category::Unknown`] for anything else.
///
/// Nothing was written to a connection that was never opened, so the message certainly did
/// not leave and the key is freed. For anything else the crate cannot tell whether the request
/// left, so it keeps the key and answers repeats from the store rather than risk a duplicate.
/// Transports that know better return a [`SendError`] of the right category, which is taken
/// as it is.
///
/// With the `reqwest` feature it also reads a `reqwest::Error` (reqwest 0.13) anywhere in the
/// chain, so a provider client on reqwest can answer its errors with `?`:
///
/// | the `reqwest::Error` | category |
/// |---|---|
/// | `is_builder()`: the request could not be built (a bad URL or scheme) | [`Validation`](Category::Validation) |
/// | `is_connect()`: no connection (DNS, refused, TLS handshake, connect timeout) | [`Retryable`](Category::Retryable) |
/// | `status()`, from `error_for_status()` | the category `HttpTransport` gives that status: one status table for both |
/// | anything else: a timeout after the request left, a body that failed, a redirect | [`Unknown`](Category::Unknown) |
///
/// `error_for_status()` drops the response's `Retry-After`; `HttpTransport` over a reqwest
/// client keeps it.
pub fn default_classifier(error: &(dyn Error + 'static)) -> Category {
    #[cfg(feature = "reqwest")]
    if let Some(category) = reqwest_category(error) {
        return category;
    }
    if never_connected(error) {
        Category::Retryable
    } else {
        Category::Unknown
    }
}

/// What a `reqwest::Error` in the chain says of the message; see [`default_classifier`].
#[cfg(feature = "reqwest")]
fn reqwest_category(error: &(dyn Error + 'static)) -> Option<Category> {
    let error = chain(error).find_map(|e| e.downcast_ref::<reqwest::Error>())?;
    Some(if error.is_builder() {
        // Refused before a connection was asked for: an unparsable URL, a scheme reqwest
        // does not speak.
        Category::Validation
    } else if error.is_connect() {
        // Nothing is written before the connection is up.
        Category::Retryable
    } else if let Some(status) = error.status() {
        status_error(status.as_u16(), |what| what.to_owned()).category()
    } else {
        Category::Unknown
    })
}

/// A provider's failure status carried by a `reqwest::Error` (`error_for_status()`), as the
/// error `HttpTransport` answers for that status.
#[cfg(feature = "reqwest")]
fn reqwest_status_error(error: &(dyn Error + 'static)) -> Option<SendError> {
    let error = chain(error).find_map(|e| e.downcast_ref::<reqwest::Error>())?;
    let status = error.status()?;
    Some(status_error(status.as_u16(), |what| {
        format!("{what} (HTTP {status})")
    }))
}

/// Whether the error's chain shows that the request never left: no connection was made, so
/// nothing of the request was written.
///
/// Read from the errors' types, never from their text:
///
/// - an [`io::Error`] of kind [`ConnectionRefused`](io::ErrorKind::ConnectionRefused)
///   ([`connection_refused`]), from any client;
/// - with the `http` feature, hyper-util's legacy client error whose `is_connect()` is true:
///   its connector failed before the request was handed to a connection (an unresolvable
///   host, a URL its connector does not take such as `https` over the plain-HTTP connector,
///   a refused or reset connect, a connect timeout, a TLS handshake of an HTTPS connector);
/// - with the `reqwest` feature, a `reqwest::Error` whose `is_connect()` is true (the same
///   failures, seen through reqwest).
///
/// An error after the connection was up (a reset while the request was written or its answer
/// awaited) is not among them: the request may have left.
pub fn never_connected(error: &(dyn Error + 'static)) -> bool {
    chain(error).any(|e| {
        let unconnected = e
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::ConnectionRefused);
        #[cfg(feature = "http")]
        let unconnected = unconnected
            || e.downcast_ref::<hyper_util::client::legacy::Error>()
                .is_some_and(hyper_util::client::legacy::Error::is_connect);
        #[cfg(feature = "reqwest")]
        let unconnected = unconnected
            || e.downcast_ref::<reqwest::Error>()
                .is_some_and(reqwest::Error::is_connect);
        unconnected
    })
}

/// Whether the error's source chain holds an [`io::Error`] of kind
/// [`ConnectionRefused`](io::ErrorKind::ConnectionRefused).
///
/// hyper-util's legacy client and reqwest both keep the `io::Error` in the chain.
/// [`never_connected`] reads this and the clients' own connect errors.
pub fn connection_refused(error: &(dyn Error + 'static)) -> bool {
    chain(error).any(|e| {
        e.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::ConnectionRefused)
    })
}

/// The error a provider's failure `status` answers, by the status alone: the one table
/// `http::HttpTransport` (for a status its codec does not read) and the `reqwest` reading of
/// `error_for_status()` share, so an alert keyed on a code does not depend on the client.
///
/// `describe` turns the table's explanation into the error's text (the transport adds the
/// status and the provider's own words).
///
/// | status | category | code |
/// |---|---|---|
/// | 408 | retryable | [`provider.request_timeout`](codes::REQUEST_TIMEOUT) |
/// | 409 | permanent | [`provider.conflict`](codes::CONFLICT) |
/// | 429 | retryable | [`provider.rate_limited`](codes::RATE_LIMITED) |
/// | other 4xx | permanent | [`provider.rejected`](codes::REJECTED) |
/// | 502, 503, 504 | retryable | [`provider.unavailable`](codes::UNAVAILABLE) |
/// | 500, other 5xx | unknown | [`provider.server_error`](codes::SERVER_ERROR) |
/// | anything else (1xx, 2xx, 3xx, 600 to 999) | unknown | [`provider.unexpected_status`](codes::UNEXPECTED_STATUS) |
#[cfg(any(feature = "http", feature = "reqwest"))]
pub(crate) fn status_error(status: u16, describe: impl FnOnce(&str) -> String) -> SendError {
    match status {
        408 => SendError::retryable(
            codes::REQUEST_TIMEOUT,
            describe("the provider timed out waiting for the request; not sent"),
        ),
        409 => SendError::permanent(
            codes::CONFLICT,
            describe("the provider refused the message as a conflict"),
        ),
        429 => SendError::retryable(
            codes::RATE_LIMITED,
            describe("the provider is rate limiting; not sent"),
        ),
        400..=499 => SendError::permanent(
            codes::REJECTED,
            describe("the provider rejected the message"),
        ),
        502..=504 => SendError::retryable(
            codes::UNAVAILABLE,
            describe("the provider is unavailable; not sent"),
        ),
        500..=599 => SendError::unknown_delivery(
            codes::SERVER_ERROR,
            describe("the provider failed while handling the request; the message may have gone"),
        ),
        // A 1xx as the final answer, a 3xx (a redirect is not followed: re-sending a POST
        // elsewhere is the client's business), 600 to 999. None says the message did not go
        // (a 303 after a POST even says the provider acted on it), so the key is kept.
        _ => SendError::unknown_delivery(
            codes::UNEXPECTED_STATUS,
            describe(
                "the provider answered a status the transport cannot place; the message may \
                 have gone",
            ),
        ),
    }
}

/// The first [`SendError`] in the error's source chain, the error itself included.
///
/// Every judge of the crate reads a [`SendError`] through this function, so one wrapped in
/// another error (a `tower::buffer` error, an application's own type) is judged the same
/// everywhere.
///
/// ```
/// use tower_idempotency::classify::find_send_error;
/// use tower_idempotency::SendError;
///
/// #[derive(Debug)]
/// struct Wrapped(SendError);
/// impl std::fmt::Display for Wrapped {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("wrapped") }
/// }
/// impl std::error::Error for Wrapped {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> { Some(&self.0) }
/// }
///
/// let error = Wrapped(SendError::in_flight());
/// assert_eq!(find_send_error(&error).map(|e| e.code()), Some("idempotency.in_flight"));
/// ```
pub fn find_send_error<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a SendError> {
    chain(error).find_map(|e| e.downcast_ref::<SendError>())
}

/// The error and its sources, outermost first.
fn chain<'a>(error: &'a (dyn Error + 'static)) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(error), |&e| e.source())
}

/// Whether the chain holds a timeout of `tower::timeout` or `tokio::time`.
fn timed_out(error: &(dyn Error + 'static)) -> bool {
    chain(error)
        .any(|e| e.is::<tower::timeout::error::Elapsed>() || e.is::<tokio::time::error::Elapsed>())
}

/// What the judge makes of an error; see the [module docs](self).
pub(crate) enum Verdict<'a> {
    /// A [`SendError`] in the chain, to be taken as it is, or the error of a provider's
    /// status the chain carries ([`status_error`]).
    Answered(Cow<'a, SendError>),
    /// A timeout in the chain: of unknown delivery.
    TimedOut,
    /// The classifier's category (never [`Category::Delivered`]).
    Classified(Category),
}

/// Judges `error`: a [`SendError`] in the chain, then a timeout, then a provider's status,
/// then the classifier.
pub(crate) fn judge<'a>(error: &'a (dyn Error + 'static), classifier: &Classifier) -> Verdict<'a> {
    if let Some(send_error) = find_send_error(error) {
        return Verdict::Answered(Cow::Borrowed(send_error));
    }
    if timed_out(error) {
        return Verdict::TimedOut;
    }
    #[cfg(feature = "reqwest")]
    if let Some(status_error) = reqwest_status_error(error) {
        return Verdict::Answered(Cow::Owned(status_error));
    }
    Verdict::Classified(classifier.category(error))
}

/// Turns an inner service's error into the [`SendError`] the layer answers, keeping the error
/// as the source.
pub(crate) fn into_send_error(classifier: &Classifier, error: BoxError) -> SendError {
    let error = match error.downcast::<SendError>() {
        Ok(send_error) => return *send_error,
        Err(error) => error,
    };
    let send_error = match judge(&*error, classifier) {
        Verdict::Answered(Cow::Borrowed(send_error)) => return send_error.clone(),
        Verdict::Answered(Cow::Owned(status_error)) => status_error,
        Verdict::TimedOut => SendError::unknown_delivery(
            codes::TIMEOUT,
            "the provider did not answer in time; the message may have gone",
        ),
        Verdict::Classified(Category::Retryable) => SendError::retryable(
            codes::NOT_SENT,
            "the provider call failed; the message was not sent",
        ),
        Verdict::Classified(Category::Permanent) => {
            SendError::permanent("provider.rejected", "the provider refused the message")
        }
        Verdict::Classified(Category::Validation) => {
            SendError::validation("provider.invalid", "the provider found the message invalid")
        }
        Verdict::Classified(_) => SendError::unknown_delivery(
            codes::UNKNOWN,
            "the provider call failed; the message may have gone",
        ),
    };
    send_error.with_source(error)
}

/// Errors [`counts_against_provider`] and [`RetryPolicy`](crate::RetryPolicy) can read:
/// [`SendError`] itself and boxed errors that may hold one in their source chain.
pub trait AsSendError {
    /// The error as a `dyn Error`, whose source chain is searched for a [`SendError`].
    fn as_error(&self) -> &(dyn Error + 'static);

    /// The first [`SendError`] in the chain ([`find_send_error`]).
    fn as_send_error(&self) -> Option<&SendError> {
        find_send_error(self.as_error())
    }
}

impl AsSendError for SendError {
    fn as_error(&self) -> &(dyn Error + 'static) {
        self
    }
}

impl AsSendError for BoxError {
    fn as_error(&self) -> &(dyn Error + 'static) {
        &**self
    }
}

/// The breaker predicate: whether `result` should count as a provider failure.
///
/// Successes, replays, the layer's own answers (in flight, aborted, store failed, key reused)
/// and validation or permanent errors do not count; retryable and unknown-delivery errors from
/// the provider do, except its answers about an earlier request under the same key (see
/// [`SendError::counts_against_provider`]). The error is read through [`find_send_error`], so a [`SendError`] wrapped
/// in another error is judged as itself. Errors that hold no [`SendError`] count (a timeout, a
/// connection error).
///
/// ```
/// use tower_idempotency::{counts_against_provider, Receipt, SendError};
///
/// let ok: Result<Receipt, SendError> = Ok(Receipt::new("m1", "fake"));
/// assert!(!counts_against_provider(&ok));
/// assert!(!counts_against_provider(&Err::<Receipt, _>(SendError::in_flight())));
/// assert!(counts_against_provider(&Err::<Receipt, _>(SendError::retryable("provider.503", "busy"))));
/// ```
pub fn counts_against_provider<T, E>(result: &Result<T, E>) -> bool
where
    E: AsSendError,
{
    match result {
        Ok(_) => false,
        Err(e) => e
            .as_send_error()
            .is_none_or(SendError::counts_against_provider),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An application's error that keeps what it wraps as its source.
    #[derive(Debug)]
    struct Wrapped(BoxError);

    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("the job failed")
        }
    }

    impl Error for Wrapped {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&*self.0)
        }
    }

    fn wrapped(inner: impl Into<BoxError>) -> BoxError {
        Box::new(Wrapped(inner.into()))
    }

    #[test]
    fn a_wrapped_send_error_counts_as_the_inner_send_error() {
        let in_flight = wrapped(SendError::in_flight());
        assert!(!counts_against_provider(&Err::<(), _>(in_flight)));
        let rejected = wrapped(SendError::permanent("provider.422", "bad"));
        assert!(!counts_against_provider(&Err::<(), _>(rejected)));
        let unavailable = wrapped(SendError::retryable("provider.503", "busy"));
        assert!(counts_against_provider(&Err::<(), _>(unavailable)));
        let foreign = wrapped("connection reset");
        assert!(counts_against_provider(&Err::<(), _>(foreign)));
    }

    #[test]
    fn provider_failures_count_and_caller_errors_do_not() {
        let boxed: BoxError = Box::new(SendError::permanent("provider.422", "bad"));
        assert!(!counts_against_provider(&Err::<(), _>(boxed)));
        let other: BoxError = "connection reset".into();
        assert!(counts_against_provider(&Err::<(), _>(other)));
        assert!(counts_against_provider(&Err::<(), _>(
            SendError::unknown_delivery("provider.500", "500")
        )));
    }

    #[test]
    fn the_judge_reads_a_send_error_before_a_timeout_and_the_classifier() {
        let never = Classifier::new(|_| Category::Permanent);
        let error = wrapped(SendError::in_flight());
        assert!(matches!(
            judge(&*error, &never),
            Verdict::Answered(Cow::Borrowed(e)) if e.code() == codes::IN_FLIGHT
        ));
        let timeout = wrapped(tower::timeout::error::Elapsed::new());
        assert!(matches!(judge(&*timeout, &never), Verdict::TimedOut));
        let other = wrapped("boom");
        assert!(matches!(
            judge(&*other, &never),
            Verdict::Classified(Category::Permanent)
        ));
    }

    #[test]
    fn a_classifier_answering_delivered_is_read_as_unknown() {
        let odd = Classifier::new(|_| Category::Delivered);
        assert_eq!(odd.category(&io::Error::other("x")), Category::Unknown);
    }

    #[test]
    fn connection_refused_is_found_anywhere_in_the_chain() {
        let refused = wrapped(io::Error::new(io::ErrorKind::ConnectionRefused, "no"));
        assert!(connection_refused(&*refused));
        assert_eq!(default_classifier(&*refused), Category::Retryable);
        let reset = wrapped(io::Error::new(io::ErrorKind::ConnectionReset, "reset"));
        assert_eq!(default_classifier(&*reset), Category::Unknown);
    }
}
