//! [`MessageError`]: why a message could not be built.

use std::fmt;

use super::KeyError;
#[cfg(doc)]
use super::MAX_SEND_AT;
#[cfg(doc)]
use super::MIN_SEND_AT;

/// Why a message could not be built.
///
/// No variant holds the refused text: errors are logged, and addresses and subjects are
/// personal data. A variant names the field, and for lists the position in it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MessageError {
    /// No sender was given.
    MissingSender,
    /// No recipient was given (`to`, `cc` and `bcc` are all empty).
    MissingRecipient,
    /// Neither a text nor an HTML body was given.
    MissingBody,
    /// An address field holds an empty string.
    EmptyAddress {
        /// The field: `from`, `to`, `cc`, `bcc` or `reply_to`.
        field: &'static str,
    },
    /// An address is not an RFC 5322 mailbox (`ann@example.com` or
    /// `Ann Lee <ann@example.com>`); an envelope's address not an `addr-spec`.
    InvalidAddress {
        /// The field: `from`, `to`, `cc`, `bcc` or `reply_to`.
        field: &'static str,
        /// The position in the field's list (0 for `from`).
        index: usize,
    },
    /// An SMS number is not E.164 (`+` and up to 15 digits).
    InvalidPhoneNumber {
        /// The field: `to`, or `from` for a sender number.
        field: &'static str,
        /// The position in the field's list (0 for `from`).
        index: usize,
    },
    /// An SMS sender id is not 1 to 11 ASCII letters, digits or spaces with at least one
    /// letter, or a messaging service id is not `MG` and 32 hex digits.
    InvalidSender,
    /// A header name is not an RFC 5322 field name (printable ASCII except `:`).
    InvalidHeaderName,
    /// A field that ends up in an email header holds a carriage return or a line feed: the
    /// way headers are injected.
    LineBreak {
        /// The field: `header`, `subject`, `from`, `to`, `cc`, `bcc`, `reply_to`,
        /// `attachment`, `message_id`, `in_reply_to` or `references`.
        field: &'static str,
    },
    /// `send_at` is before year 0 ([`MIN_SEND_AT`] before the epoch) or after
    /// [`MAX_SEND_AT`], where RFC 3339 cannot write it.
    SendAtOutOfRange,
    /// The idempotency key was refused.
    InvalidKey(KeyError),
}

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingSender => f.write_str("message has no sender"),
            Self::MissingRecipient => f.write_str("message has no recipient (to, cc or bcc)"),
            Self::MissingBody => f.write_str("message has neither a text nor an html body"),
            Self::EmptyAddress { field } => write!(f, "message has an empty address in `{field}`"),
            Self::InvalidAddress { field, index } => write!(
                f,
                "address {index} of `{field}` is not an RFC 5322 mailbox \
                 (`name@domain` or `Name <name@domain>`)"
            ),
            Self::InvalidPhoneNumber { field, index } => write!(
                f,
                "number {index} of `{field}` is not an E.164 number (`+` and up to 15 digits)"
            ),
            Self::InvalidSender => f.write_str(
                "SMS sender is not an alphanumeric id (1 to 11 letters, digits or spaces, one \
                 letter at least) or a messaging service id (`MG` and 32 hex digits)",
            ),
            Self::InvalidHeaderName => f.write_str(
                "header name is not an RFC 5322 field name (printable ASCII except `:`)",
            ),
            Self::LineBreak { field } => write!(
                f,
                "`{field}` holds a carriage return or line feed, which would inject a header"
            ),
            Self::SendAtOutOfRange => f.write_str(
                "send_at is outside 0000-01-01T00:00:00Z to 9999-12-31T23:59:59Z, which is all \
                 RFC 3339 can write",
            ),
            Self::InvalidKey(e) => write!(f, "invalid idempotency key: {e}"),
        }
    }
}

impl std::error::Error for MessageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::InvalidKey(e) => Some(e),
            _ => None,
        }
    }
}

impl From<KeyError> for MessageError {
    fn from(e: KeyError) -> Self {
        Self::InvalidKey(e)
    }
}
