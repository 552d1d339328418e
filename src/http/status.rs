//! The status mapping: a provider's answer, or the inner client's error, as an outcome.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, StatusCode, header::RETRY_AFTER};

use super::codec::{BatchCodec, Codec};
use crate::batch::BatchOutcomes;
use crate::classify::{Classifier, Verdict, judge, status_error};
use crate::message::Message;
use crate::outcome::{self, BoxError, Category, Receipt, SendError, codes};

/// The most characters of a provider's error text kept in a [`SendError`].
const MAX_DETAIL_CHARS: usize = 300;

/// Parses a `Retry-After` value: delta-seconds (`"120"`) or an HTTP-date
/// (`"Wed, 21 Oct 2015 07:28:00 GMT"`), as of `now`.
///
/// A date in the past gives zero; anything else that is not one of the two forms gives
/// `None`.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use tower_idempotency::http::parse_retry_after;
///
/// let now = SystemTime::now();
/// assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
/// assert_eq!(parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", now), Some(Duration::ZERO));
/// assert_eq!(parse_retry_after("soon", now), None);
/// ```
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value.parse::<u64>().ok().map(Duration::from_secs);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?;
    parse_retry_after(value, SystemTime::now())
}

fn with_retry_after(error: SendError, headers: &HeaderMap) -> SendError {
    match retry_after(headers) {
        Some(wait) => error.with_retry_after(wait),
        None => error,
    }
}

/// "the provider answered 422 Unprocessable Entity: <detail>", without message content.
fn describe<C: Codec + ?Sized>(codec: &C, response: &http::Response<Bytes>, what: &str) -> String {
    let status = response.status();
    let mut text = format!("{what} (HTTP {status})");
    if let Some(detail) = codec.error_detail(response) {
        let detail = detail.trim();
        if !detail.is_empty() {
            text.push_str(": ");
            text.extend(detail.chars().take(MAX_DETAIL_CHARS));
        }
    }
    text
}

/// The outcome of a complete answer; see the mapping table in the [module docs](super).
pub(crate) fn from_response<C: Codec + ?Sized>(
    codec: &C,
    message: &Message,
    response: &http::Response<Bytes>,
) -> Result<Receipt, SendError> {
    let status = response.status();
    if status.is_success() {
        return codec.decode(message, response).map_err(|e| {
            SendError::unknown_delivery(
                codes::BAD_RESPONSE,
                format!(
                    "the provider answered HTTP {status} with a body that does not decode; \
                     the message was probably accepted"
                ),
            )
            .with_source(e)
        });
    }
    Err(from_status(codec, response))
}

/// The outcomes of a complete answer to a batch request: the single-send mapping, applied to
/// every message; see the [module docs](super#batches).
pub(crate) fn from_batch_response<C: BatchCodec + ?Sized>(
    codec: &C,
    messages: &[Message],
    response: &http::Response<Bytes>,
) -> BatchOutcomes {
    let status = response.status();
    if !status.is_success() {
        return vec![Err(from_status(codec, response)); messages.len()];
    }
    let bad_response = |why: String| {
        SendError::unknown_delivery(
            codes::BAD_RESPONSE,
            format!(
                "the provider answered HTTP {status} to a batch of {} messages {why}; \
                 the messages were probably accepted",
                messages.len()
            ),
        )
    };
    let error = match codec.decode_batch(messages, response) {
        Ok(outcomes) if outcomes.len() == messages.len() => return outcomes,
        Ok(outcomes) => bad_response(format!("with {} outcomes", outcomes.len())),
        Err(e) => bad_response("with a body that does not decode".to_owned()).with_source(e),
    };
    vec![Err(error); messages.len()]
}

fn from_status<C: Codec + ?Sized>(codec: &C, response: &http::Response<Bytes>) -> SendError {
    let status = response.status();
    let headers = response.headers();
    if status != StatusCode::CONFLICT
        && (status.is_client_error() || status.is_server_error())
        && let Some(error) = codec.failure(response)
    {
        return with_retry_after(error, headers);
    }
    if status == StatusCode::CONFLICT
        && let Some(error) = codec.conflict(response)
    {
        return error;
    }
    let error = status_error(status.as_u16(), |what| describe(codec, response, what));
    match status {
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => with_retry_after(error, headers),
        _ => error,
    }
}

/// The outcome when the status arrived but the body could not be read (too long, cut off).
pub(crate) fn from_unread_body<C: Codec + ?Sized>(
    codec: &C,
    parts: http::response::Parts,
    error: BoxError,
    limit: usize,
) -> SendError {
    let status = parts.status;
    if status.is_success() {
        let why = if error.is::<http_body_util::LengthLimitError>() {
            format!("is longer than {limit} bytes")
        } else {
            "could not be read".to_owned()
        };
        return SendError::unknown_delivery(
            codes::BAD_RESPONSE,
            format!(
                "the provider answered HTTP {status} but the body {why}; \
                 the message was probably accepted"
            ),
        )
        .with_source(error);
    }
    // The status alone decides a failure; the codec sees an empty body.
    from_status(codec, &http::Response::from_parts(parts, Bytes::new())).with_source(error)
}

/// The outcome of an error of the inner client: no answer came. Judged by
/// [`crate::classify`], as the layer judges its inner errors.
pub(crate) fn from_inner_error(error: BoxError, classifier: &Classifier) -> SendError {
    let send_error = match judge(&*error, classifier) {
        // A layer between the transport and the client already said what happened.
        Verdict::Answered(Cow::Borrowed(send_error)) => return send_error.clone(),
        // A client that reads statuses itself (reqwest's `error_for_status`).
        Verdict::Answered(Cow::Owned(status_error)) => status_error,
        Verdict::TimedOut => SendError::unknown_delivery(
            outcome::codes::TIMEOUT,
            "the provider did not answer in time; the message may have gone",
        ),
        Verdict::Classified(Category::Retryable) => SendError::retryable(
            codes::CONNECT,
            "could not connect to the provider; not sent",
        ),
        Verdict::Classified(Category::Permanent) => SendError::permanent(
            codes::REJECTED,
            "the HTTP client refused the request; not sent",
        ),
        Verdict::Classified(Category::Validation) => SendError::validation(
            codes::INVALID_REQUEST,
            "the HTTP client found the request invalid; not sent",
        ),
        Verdict::Classified(_) => SendError::unknown_delivery(
            outcome::codes::UNKNOWN,
            "the request to the provider failed after it may have been written; \
             the message may have gone",
        ),
    };
    send_error.with_source(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::codec::resend::ResendCodec;

    fn error_for(status: u16) -> SendError {
        let status = StatusCode::from_u16(status).expect("a status http can hold");
        let response = http::Response::builder()
            .status(status)
            .body(Bytes::new())
            .expect("a response");
        from_status(&ResendCodec::new("re_test"), &response)
    }

    #[test]
    fn a_status_the_transport_cannot_place_keeps_the_key_as_unknown_delivery() {
        for status in [
            100, 101, 103, 199, 300, 301, 302, 303, 304, 307, 308, 399, 600, 799, 999,
        ] {
            let error = error_for(status);
            assert_eq!(error.code(), codes::UNEXPECTED_STATUS, "{status}");
            assert_eq!(error.category(), Category::Unknown, "{status}");
            assert!(error.delivery_unknown(), "{status}");
            assert!(
                error.message().contains(&status.to_string()),
                "{status}: {error}"
            );
        }
    }

    #[test]
    fn the_documented_statuses_keep_their_categories() {
        for (status, code, category) in [
            (400, codes::REJECTED, Category::Permanent),
            (408, codes::REQUEST_TIMEOUT, Category::Retryable),
            (409, codes::CONFLICT, Category::Permanent),
            (429, codes::RATE_LIMITED, Category::Retryable),
            (499, codes::REJECTED, Category::Permanent),
            (500, codes::SERVER_ERROR, Category::Unknown),
            (502, codes::UNAVAILABLE, Category::Retryable),
            (503, codes::UNAVAILABLE, Category::Retryable),
            (504, codes::UNAVAILABLE, Category::Retryable),
            (599, codes::SERVER_ERROR, Category::Unknown),
        ] {
            let error = error_for(status);
            assert_eq!(error.code(), code, "{status}");
            assert_eq!(error.category(), category, "{status}");
        }
    }
}
