//! The SMS shape of a [`Message`]: E.164 recipients, a text body, no subject, and a sender that
//! is a number, an alphanumeric id or a messaging service.
//!
//! An SMS is a [`Message`] rather than a type of its own, so everything built for messages
//! (the idempotency layer, fingerprints, batches, the outbox) takes it as it is; its
//! [`Channel`] says what it is, and a provider's codec refuses a channel it cannot send with a
//! validation error.

use std::collections::BTreeMap;
use std::time::SystemTime;

use super::address::is_e164;
use super::{IdempotencyKey, Message, MessageError, MessageParts, Threading, Tracking, schedule};

/// Whether a [`Message`] is an email or an SMS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Channel {
    /// An email ([`Message::builder`]).
    Email,
    /// An SMS ([`Message::sms`]), from this kind of sender.
    Sms(SmsSender),
}

/// What the sender ([`Message::from`]) of an SMS is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SmsSender {
    /// A phone number, E.164, or a short code (5 or 6 digits, `"40404"`).
    Number,
    /// An alphanumeric sender id (`MyShop`): 1 to 11 ASCII letters, digits or spaces, at least
    /// one letter.
    AlphanumericId,
    /// A messaging service, by its id (`MG` and 32 hex digits), that picks the number.
    MessagingService,
}

/// Builds an SMS [`Message`]; [`build`](Self::build) validates it.
///
/// ```
/// use tower_idempotency::Message;
/// use tower_idempotency::message::{Channel, MessageError, SmsSender};
///
/// let sms = Message::sms()
///     .from_number("+14155552345")
///     .to("+15558675310")
///     .text("Your code is 314159")
///     .idempotency_key("login:u_42:otp:1")
///     .build()?;
/// assert_eq!(sms.channel(), Channel::Sms(SmsSender::Number));
/// assert_eq!(sms.subject(), None);
///
/// let bad = Message::sms().from_sender_id("MyShop").to("555-0100").text("hi").build();
/// assert_eq!(bad, Err(MessageError::InvalidPhoneNumber { field: "to", index: 0 }));
/// # Ok::<(), MessageError>(())
/// ```
#[derive(Debug, Default, Clone)]
#[must_use]
pub struct SmsBuilder {
    from: Option<(String, SmsSender)>,
    to: Vec<String>,
    text: Option<String>,
    send_at: Option<SystemTime>,
    metadata: BTreeMap<String, String>,
    key: Option<String>,
}

impl SmsBuilder {
    /// Sends from a phone number (E.164) or a short code (5 or 6 digits).
    pub fn from_number(mut self, number: impl Into<String>) -> Self {
        self.from = Some((number.into(), SmsSender::Number));
        self
    }
    /// Sends from an alphanumeric sender id (where the destination country allows one).
    pub fn from_sender_id(mut self, id: impl Into<String>) -> Self {
        self.from = Some((id.into(), SmsSender::AlphanumericId));
        self
    }
    /// Sends through a messaging service, which picks the sender.
    pub fn messaging_service(mut self, id: impl Into<String>) -> Self {
        self.from = Some((id.into(), SmsSender::MessagingService));
        self
    }
    /// Adds a recipient number (E.164).
    pub fn to(mut self, number: impl Into<String>) -> Self {
        self.to.push(number.into());
        self
    }
    /// Sets the text.
    pub fn text(mut self, text: impl Into<String>) -> Self {
        self.text = Some(text.into());
        self
    }
    /// Schedules the message, to the millisecond: [`build`](Self::build) rounds `at` down to
    /// the whole millisecond, as [`MessageBuilder::send_at`](crate::MessageBuilder::send_at)
    /// does.
    pub fn send_at(mut self, at: SystemTime) -> Self {
        self.send_at = Some(at);
        self
    }
    /// Sets a metadata entry; a second value under the same name replaces the first.
    pub fn metadata(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(name.into(), value.into());
        self
    }
    /// Sets the idempotency key; it is checked by [`build`](Self::build).
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Checks the SMS and builds it.
    ///
    /// # Errors
    /// [`MessageError`] when the sender, every recipient or the text is missing, a number is
    /// not E.164, the sender id or messaging service id is malformed, `send_at` is outside
    /// what RFC 3339 can write, or the key breaks the rules of [`IdempotencyKey`].
    pub fn build(self) -> Result<Message, MessageError> {
        let (from, sender) = self.from.ok_or(MessageError::MissingSender)?;
        let sender_ok = match sender {
            SmsSender::Number => is_e164(&from) || is_short_code(&from),
            SmsSender::AlphanumericId => is_sender_id(&from),
            SmsSender::MessagingService => is_messaging_service(&from),
        };
        if !sender_ok {
            return Err(match sender {
                SmsSender::Number => MessageError::InvalidPhoneNumber {
                    field: "from",
                    index: 0,
                },
                _ => MessageError::InvalidSender,
            });
        }
        if self.to.is_empty() {
            return Err(MessageError::MissingRecipient);
        }
        if let Some(index) = self.to.iter().position(|n| !is_e164(n)) {
            return Err(MessageError::InvalidPhoneNumber { field: "to", index });
        }
        if self.text.as_deref().is_none_or(str::is_empty) {
            return Err(MessageError::MissingBody);
        }
        let send_at = schedule(self.send_at)?;
        let idempotency_key = self.key.map(IdempotencyKey::new).transpose()?;
        Ok(Message::from_parts(MessageParts {
            from,
            to: self.to,
            cc: Vec::new(),
            bcc: Vec::new(),
            reply_to: Vec::new(),
            subject: None,
            text: self.text,
            html: None,
            headers: BTreeMap::new(),
            attachments: Vec::new(),
            threading: Threading::default(),
            send_at,
            tracking: Tracking::default(),
            metadata: self.metadata,
            idempotency_key,
            channel: Channel::Sms(sender),
        }))
    }
}

/// 1 to 11 ASCII letters, digits or spaces, one letter at least (the GSM alphanumeric sender).
fn is_sender_id(id: &str) -> bool {
    (1..=11).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b' ')
        && id.bytes().any(|b| b.is_ascii_alphabetic())
}

/// 5 or 6 ASCII digits: a short code, the sender of high-volume SMS in the US, Canada and
/// other countries (Twilio's `From` takes one as it is).
fn is_short_code(code: &str) -> bool {
    (5..=6).contains(&code.len()) && code.bytes().all(|b| b.is_ascii_digit())
}

/// `MG` and 32 hex digits.
fn is_messaging_service(id: &str) -> bool {
    id.strip_prefix("MG")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn senders_are_checked_by_their_kind() {
        let sms = || Message::sms().to("+15558675310").text("hi");
        assert!(sms().from_number("+14155552345").build().is_ok());
        assert!(sms().from_number("40404").build().is_ok());
        assert!(sms().from_number("898211").build().is_ok());
        assert!(sms().from_number("4040").build().is_err());
        assert!(sms().from_number("4040a").build().is_err());
        assert!(sms().from_sender_id("My Shop 24").build().is_ok());
        assert!(
            sms()
                .messaging_service(format!("MG{}", "a".repeat(32)))
                .build()
                .is_ok()
        );
        assert_eq!(
            sms().from_number("4155552345").build(),
            Err(MessageError::InvalidPhoneNumber {
                field: "from",
                index: 0
            })
        );
        for id in ["", "123", "TooLongSender", "Shop!"] {
            assert_eq!(
                sms().from_sender_id(id).build(),
                Err(MessageError::InvalidSender)
            );
        }
        assert_eq!(
            sms().messaging_service("MG123").build(),
            Err(MessageError::InvalidSender)
        );
        assert_eq!(
            Message::sms().to("+15558675310").text("hi").build(),
            Err(MessageError::MissingSender)
        );
        assert_eq!(
            Message::sms()
                .from_number("+14155552345")
                .to("+15558675310")
                .build(),
            Err(MessageError::MissingBody)
        );
    }
}
