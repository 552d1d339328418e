//! How an inner service's error is judged: sent, not sent, or unknown.

use std::error::Error;
use std::io;

use super::layer::Config;
use crate::outcome::{BoxError, Category, SendError, codes};

/// The default judge of inner errors that are neither a [`SendError`] nor a timeout.
///
/// A connection refused (an [`io::Error`] of kind `ConnectionRefused` anywhere in the source
/// chain) certainly did not send: [`Category::Retryable`], the key is freed. Anything else is
/// [`Category::Unknown`]: the layer cannot tell whether the request left, so it keeps the key
/// and answers repeats from the store rather than risk a duplicate. Transports that know
/// better return a [`SendError`] of the right category, which the layer takes as it is.
pub fn default_classifier(error: &(dyn Error + 'static)) -> Category {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<io::Error>()
            && io.kind() == io::ErrorKind::ConnectionRefused
        {
            return Category::Retryable;
        }
        current = e.source();
    }
    Category::Unknown
}

/// Turns an inner error into the [`SendError`] the caller gets.
///
/// Order: a [`SendError`] (the error itself or in its source chain) is taken as it is; a
/// timeout of `tower::timeout` or `tokio::time` is of unknown delivery; anything else goes to
/// the configured classifier, with the error kept as the source.
pub(crate) fn classify(config: &Config, error: BoxError) -> SendError {
    let error = match error.downcast::<SendError>() {
        Ok(send_error) => return *send_error,
        Err(error) => error,
    };
    let mut current: Option<&(dyn Error + 'static)> = Some(&*error);
    while let Some(e) = current {
        if let Some(send_error) = e.downcast_ref::<SendError>() {
            return send_error.clone();
        }
        if e.is::<tower::timeout::error::Elapsed>() || e.is::<tokio::time::error::Elapsed>() {
            return SendError::unknown_delivery(
                codes::TIMEOUT,
                "the provider did not answer in time; the message may have gone",
            )
            .with_source(error);
        }
        current = e.source();
    }
    let category = (config.classify)(&*error);
    let send_error = match category {
        Category::Retryable => {
            SendError::retryable(codes::NOT_SENT, "the provider call failed before sending")
        }
        Category::Permanent => {
            SendError::permanent("provider.rejected", "the provider refused the message")
        }
        Category::Validation => {
            SendError::validation("provider.invalid", "the provider found the message invalid")
        }
        _ => SendError::unknown_delivery(
            codes::UNKNOWN,
            "the provider call failed; the message may have gone",
        ),
    };
    send_error.with_source(error)
}
