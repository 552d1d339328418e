//! SES's error answers: the error's name (`x-amzn-ErrorType`, else the body's `__type` or
//! `code`, else an XML `<Code>`), its text, and what each name becomes.

use bytes::Bytes;
use serde::Deserialize;

use super::super::wire::truncate;
use crate::outcome::{SendError, codes};

/// The name and text of an SES error answer.
pub(super) struct SesError {
    pub(super) name: Option<String>,
    pub(super) text: Option<String>,
}

#[derive(Deserialize)]
struct JsonError {
    #[serde(rename = "__type", alias = "code", alias = "Code", default)]
    name: Option<String>,
    #[serde(alias = "Message", default)]
    message: Option<String>,
}

/// `MessageRejected:http://internal.amazon.com/...` and `com.amazonaws.sesv2#MessageRejected`
/// both name `MessageRejected`.
fn bare(name: &str) -> String {
    let name = name.split(':').next().unwrap_or(name);
    let name = name.rsplit('#').next().unwrap_or(name);
    name.trim().to_owned()
}

/// The text between `<tag>` and `</tag>`.
fn xml_element<'a>(body: &'a str, tag: &str) -> Option<&'a str> {
    let start = body.find(&format!("<{tag}>"))? + tag.len() + 2;
    let end = body[start..].find(&format!("</{tag}>"))? + start;
    Some(body[start..end].trim())
}

pub(super) fn read(response: &http::Response<Bytes>) -> SesError {
    let header = response
        .headers()
        .get("x-amzn-errortype")
        .and_then(|v| v.to_str().ok())
        .map(bare)
        .filter(|n| !n.is_empty());
    let body = response.body();
    let (name, text) = if let Ok(json) = serde_json::from_slice::<JsonError>(body) {
        (json.name.map(|n| bare(&n)), json.message)
    } else if let Ok(text) = std::str::from_utf8(body) {
        (
            xml_element(text, "Code").map(bare),
            xml_element(text, "Message").map(str::to_owned),
        )
    } else {
        (None, None)
    };
    SesError {
        name: header.or(name).filter(|n| !n.is_empty()),
        text: text.map(|t| truncate(&t)).filter(|t| !t.is_empty()),
    }
}

/// What an SES error name means; `None` leaves the status to the transport (5xx above all:
/// a 500 may come after SES took the message).
pub(super) fn classify(error: &SesError, status: http::StatusCode) -> Option<SendError> {
    if status.is_server_error() {
        return None;
    }
    let name = error.name.as_deref()?;
    let text = error.text.as_deref().unwrap_or("");
    let what = |s: &str| format!("Amazon SES answered {name} (HTTP {status}){s}");
    let with_text = if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    };
    Some(match name {
        "TooManyRequestsException" | "Throttling" | "ThrottlingException" => {
            // SES v1 names an exhausted daily quota "Throttling" too; that one cannot pass
            // in seconds.
            if text.to_ascii_lowercase().contains("quota") {
                SendError::permanent(codes::QUOTA_EXCEEDED, what(&with_text))
            } else {
                SendError::retryable(codes::RATE_LIMITED, what(&with_text))
            }
        }
        "LimitExceededException" => SendError::permanent(codes::QUOTA_EXCEEDED, what(&with_text)),
        "AccountSuspendedException" | "SendingPausedException" => {
            SendError::permanent(codes::SENDING_PAUSED, what(&with_text))
        }
        "MailFromDomainNotVerifiedException" => {
            SendError::permanent(codes::IDENTITY_NOT_VERIFIED, what(&with_text))
        }
        "MessageRejected" if text.to_ascii_lowercase().contains("not verified") => {
            SendError::permanent(codes::IDENTITY_NOT_VERIFIED, what(&with_text))
        }
        "MessageRejected" => SendError::permanent(codes::REJECTED, what(&with_text)),
        "BadRequestException" | "ValidationException" | "SerializationException" => {
            SendError::validation(codes::VALIDATION_ERROR, what(&with_text))
        }
        // NotFoundException (a configuration set or identity ARN that does not exist), and
        // the authentication errors (a bad or expired key, a signature, a denied action).
        _ => SendError::permanent(codes::REJECTED, what(&with_text)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Category;

    fn answer(status: u16, header: Option<&str>, body: &str) -> Option<SendError> {
        let mut response = http::Response::builder().status(status);
        if let Some(header) = header {
            response = response.header("x-amzn-ErrorType", header);
        }
        let response = response.body(Bytes::from(body.to_owned())).unwrap();
        classify(&read(&response), response.status())
    }

    #[test]
    fn documented_errors_keep_their_categories() {
        for (status, name, text, code, category) in [
            (
                429,
                "TooManyRequestsException",
                "",
                codes::RATE_LIMITED,
                Category::Retryable,
            ),
            (
                400,
                "Throttling",
                "Maximum sending rate exceeded.",
                codes::RATE_LIMITED,
                Category::Retryable,
            ),
            (
                400,
                "Throttling",
                "Daily message quota exceeded.",
                codes::QUOTA_EXCEEDED,
                Category::Permanent,
            ),
            (
                400,
                "LimitExceededException",
                "",
                codes::QUOTA_EXCEEDED,
                Category::Permanent,
            ),
            (
                400,
                "AccountSuspendedException",
                "",
                codes::SENDING_PAUSED,
                Category::Permanent,
            ),
            (
                400,
                "SendingPausedException",
                "",
                codes::SENDING_PAUSED,
                Category::Permanent,
            ),
            (
                400,
                "MailFromDomainNotVerifiedException",
                "",
                codes::IDENTITY_NOT_VERIFIED,
                Category::Permanent,
            ),
            (
                400,
                "MessageRejected",
                "Email address is not verified.",
                codes::IDENTITY_NOT_VERIFIED,
                Category::Permanent,
            ),
            (
                400,
                "MessageRejected",
                "Illegal header",
                codes::REJECTED,
                Category::Permanent,
            ),
            (
                400,
                "BadRequestException",
                "",
                codes::VALIDATION_ERROR,
                Category::Validation,
            ),
            (
                404,
                "NotFoundException",
                "",
                codes::REJECTED,
                Category::Permanent,
            ),
            (
                403,
                "InvalidSignatureException",
                "",
                codes::REJECTED,
                Category::Permanent,
            ),
        ] {
            let header = format!("{name}:http://internal.amazon.com/coral/com.amazonaws.sesv2/");
            let body = format!(r#"{{"message":"{text}"}}"#);
            let error = answer(status, Some(&header), &body).expect(name);
            assert_eq!(
                (error.code(), error.category()),
                (code, category),
                "{name} {text}"
            );
        }
    }

    #[test]
    fn the_name_is_read_from_a_json_or_xml_body_without_the_header() {
        let json = answer(
            400,
            None,
            r#"{"__type":"com.amazonaws.sesv2#SendingPausedException"}"#,
        );
        assert_eq!(json.unwrap().code(), codes::SENDING_PAUSED);
        let xml = "<ErrorResponse><Error><Code>MessageRejected</Code>\
                   <Message>Email address not verified a@example.com</Message></Error></ErrorResponse>";
        assert_eq!(
            answer(400, None, xml).unwrap().code(),
            codes::IDENTITY_NOT_VERIFIED
        );
    }

    #[test]
    fn server_errors_and_nameless_answers_are_left_to_the_transport() {
        assert!(answer(500, Some("InternalFailure"), "{}").is_none());
        assert!(answer(503, Some("ServiceUnavailable"), "{}").is_none());
        assert!(answer(400, None, "not json").is_none());
    }
}
