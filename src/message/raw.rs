//! [`RawMessage`]: bytes already encoded, sent with their [`Envelope`].

use std::sync::Arc;

use bytes::Bytes;

use super::MessageError;
use super::address::is_addr_spec;

/// Who a raw message is from and to, as given to the relay (SMTP `MAIL FROM` / `RCPT TO`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    from: String,
    to: Vec<String>,
}

impl Envelope {
    /// An envelope from a sender and its recipients.
    ///
    /// # Errors
    /// [`MessageError`] when the sender or every recipient is missing, or an address is empty
    /// or not an RFC 5322 `addr-spec` (SMTP takes bare addresses: no display name, no line
    /// break).
    pub fn new<I, S>(from: impl Into<String>, to: I) -> Result<Self, MessageError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let from = from.into();
        if from.is_empty() {
            return Err(MessageError::MissingSender);
        }
        let to: Vec<String> = to.into_iter().map(Into::into).collect();
        if to.is_empty() {
            return Err(MessageError::MissingRecipient);
        }
        if to.iter().any(String::is_empty) {
            return Err(MessageError::EmptyAddress { field: "to" });
        }
        if !is_addr_spec(&from) {
            return Err(MessageError::InvalidAddress {
                field: "from",
                index: 0,
            });
        }
        if let Some(index) = to.iter().position(|a| !is_addr_spec(a)) {
            return Err(MessageError::InvalidAddress { field: "to", index });
        }
        Ok(Self { from, to })
    }

    /// The sender.
    pub fn from(&self) -> &str {
        &self.from
    }

    /// The recipients.
    pub fn to(&self) -> &[String] {
        &self.to
    }
}

/// A message already encoded (RFC 5322 bytes, say), sent with its [`Envelope`].
///
/// It has no key field: only a key function on the layer gives it one. Its fingerprint is its
/// envelope's.
///
/// ```
/// use tower_idempotency::{Envelope, RawMessage};
///
/// let envelope = Envelope::new("shop@example.com", ["user@example.com"])?;
/// let raw = RawMessage::new(envelope, &b"Subject: Welcome\r\n\r\nHello"[..]);
/// assert_eq!(raw.envelope().to(), ["user@example.com"]);
/// # Ok::<(), tower_idempotency::message::MessageError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawMessage {
    envelope: Arc<Envelope>,
    bytes: Bytes,
}

impl RawMessage {
    /// A raw message from its envelope and bytes.
    pub fn new(envelope: Envelope, bytes: impl Into<Bytes>) -> Self {
        Self {
            envelope: Arc::new(envelope),
            bytes: bytes.into(),
        }
    }

    /// The envelope.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// The encoded message.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_needs_a_sender_and_a_recipient() {
        assert_eq!(Envelope::new("", ["b@x"]), Err(MessageError::MissingSender));
        assert_eq!(
            Envelope::new("a@x", Vec::<String>::new()),
            Err(MessageError::MissingRecipient)
        );
    }
}
