//! What an SMTP failure means for the key: which step it came in, and the server's reply code
//! and enhanced status code (RFC 3463) when it answered.

use std::error::Error as _;

use lettre::transport::smtp::Error as SmtpError;

use crate::outcome::{SendError, codes};

/// Where a send stood when it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Connecting, TLS, EHLO, AUTH, `MAIL FROM`, `RCPT TO` or `DATA` itself: the server has
    /// no message body, so it cannot have taken the message.
    Envelope,
    /// The body and the final `.` are being written, or their reply awaited: the server may
    /// have taken the message.
    Body,
}

/// The enhanced status code at the start of a reply's text (`5.1.1 <a@x>: unknown user`).
fn enhanced(text: &str) -> Option<(u8, u16, u16)> {
    let word = text.split_whitespace().next()?;
    let mut parts = word.split('.');
    let class = parts.next()?.parse().ok()?;
    let subject = parts.next()?.parse().ok()?;
    let detail = parts.next()?.parse().ok()?;
    (parts.next().is_none() && matches!(class, 2 | 4 | 5)).then_some((class, subject, detail))
}

/// The reply's text, without message content: lettre keeps the server's reply as the error's
/// source. At most 300 characters.
fn reply_text(error: &SmtpError) -> String {
    error
        .source()
        .map(|s| s.to_string().chars().take(300).collect())
        .unwrap_or_default()
}

/// Whether a permanent (5xx) reply says the message or command was malformed rather than
/// refused by the server's policy.
fn is_validation(code: u16, text: &str) -> bool {
    match enhanced(text) {
        // x.5.x protocol and syntax, x.6.x media and content, x.3.4 too big for the system,
        // x.1.3 / x.1.7 a mailbox address of bad syntax.
        Some((_, subject, detail)) => {
            matches!(subject, 5 | 6)
                || (subject, detail) == (3, 4)
                || matches!((subject, detail), (1, 3) | (1, 7))
        }
        // 500-504 syntax and sequence errors; 555 MAIL/RCPT parameters not recognised.
        None => matches!(code, 500..=504 | 555),
    }
}

/// The outcome of `error`, met at `step`; see the table in the [module docs](super#errors).
pub(super) fn judge(error: SmtpError, step: Step) -> SendError {
    if let Some(code) = error.status() {
        let code = u16::from(code);
        let text = reply_text(&error);
        let said = format!("the SMTP server answered {code} {text}");
        let error_out = if code == 421 {
            SendError::retryable(
                codes::UNAVAILABLE,
                format!("{said}; it is closing the connection, not sent"),
            )
        } else if (400..500).contains(&code) {
            SendError::retryable(codes::DEFERRED, format!("{said}; not sent this time"))
        } else if is_validation(code, &text) {
            SendError::validation(codes::VALIDATION_ERROR, format!("{said}; not sent"))
        } else {
            SendError::permanent(codes::REJECTED, format!("{said}; not sent"))
        };
        return error_out.with_source(error);
    }
    match step {
        Step::Envelope if error.is_client() => SendError::permanent(
            codes::REJECTED,
            "the SMTP client cannot send this message to this server (see the source); not sent",
        ),
        Step::Envelope => SendError::retryable(
            codes::CONNECT,
            "the SMTP connection failed before the message body was written; not sent",
        ),
        Step::Body => SendError::unknown_delivery(
            codes::CONNECTION_LOST,
            "the SMTP connection failed while the message was written or its reply awaited; \
             the server may have taken it",
        ),
    }
    .with_source(error)
}

/// The outcome of a step that did not end within the transport's timeout.
pub(super) fn timed_out(step: Step) -> SendError {
    match step {
        Step::Envelope => SendError::retryable(
            codes::NOT_SENT,
            "the SMTP server did not answer in time before the message body was written; not sent",
        ),
        Step::Body => SendError::unknown_delivery(
            codes::TIMEOUT,
            "the SMTP server did not answer the message in time; it may have taken it",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enhanced_codes_are_read_from_the_start_of_the_text() {
        assert_eq!(enhanced("5.1.1 <a@x>: unknown user"), Some((5, 1, 1)));
        assert_eq!(enhanced("4.7.0 try later"), Some((4, 7, 0)));
        assert_eq!(enhanced("Requested action aborted"), None);
        assert_eq!(enhanced("1.2.3 no"), None);
    }

    #[test]
    fn permanent_replies_split_into_validation_and_refusal() {
        assert!(is_validation(550, "5.6.0 content rejected"));
        assert!(is_validation(552, "5.3.4 message too big"));
        assert!(is_validation(553, "5.1.3 bad address syntax"));
        assert!(is_validation(501, "syntax error"));
        assert!(!is_validation(550, "5.1.1 unknown user"));
        assert!(!is_validation(550, "5.7.1 relay denied"));
        assert!(!is_validation(554, "transaction failed"));
    }
}
