//! The messages the layer sends: [`Message`] (email or SMS), [`RawMessage`] (bytes plus an
//! [`Envelope`]), their builder and the [`IdempotencyKey`] they may carry.
//!
//! Messages are validated when they are built, so a message that reaches a transport always has a
//! sender, at least one recipient, a body and, when it has one, a well-formed key. Both message
//! types keep their fields behind an [`Arc`], so cloning one for a retry is a reference-count
//! increment, not a copy of the bodies.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;

/// The longest idempotency key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 256;

/// A validated idempotency key: 1 to [`MAX_KEY_LEN`] bytes, no control characters.
///
/// Derive it from the business event, never from the clock or a random id: a key made at call
/// time is different on every retry and deduplicates nothing.
///
/// ```
/// use tower_idempotency::IdempotencyKey;
///
/// let key = IdempotencyKey::new("order.created:ord_20481:email")?;
/// assert_eq!(key.as_str(), "order.created:ord_20481:email");
/// assert!(IdempotencyKey::new("").is_err());
/// # Ok::<(), tower_idempotency::message::KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(Arc<str>);

impl IdempotencyKey {
    /// Validates `key` and wraps it.
    pub fn new(key: impl AsRef<str>) -> Result<Self, KeyError> {
        let key = key.as_ref();
        validate_key(key)?;
        Ok(Self(Arc::from(key)))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Checks the rules of [`IdempotencyKey`] without allocating.
pub(crate) fn validate_key(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong { len: key.len() });
    }
    if let Some(position) = key
        .char_indices()
        .find(|(_, c)| c.is_control())
        .map(|(i, _)| i)
    {
        return Err(KeyError::ControlCharacter { position });
    }
    Ok(())
}

impl fmt::Debug for IdempotencyKey {
    // Keys often embed an address; Debug output lands in logs, so show only its length.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey(<{} bytes>)", self.0.len())
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Why a key was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is the empty string.
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`] bytes.
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The key holds a control character (newline, NUL, …).
    ControlCharacter {
        /// The byte offset of the first one.
        position: usize,
    },
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("idempotency key is empty"),
            Self::TooLong { len } => write!(
                f,
                "idempotency key is {len} bytes long, the limit is {MAX_KEY_LEN}"
            ),
            Self::ControlCharacter { position } => {
                write!(
                    f,
                    "idempotency key holds a control character at byte {position}"
                )
            }
        }
    }
}

impl std::error::Error for KeyError {}

/// Why a message could not be built.
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

/// A file attached to an email. Its bytes are sent but not fingerprinted: two messages whose
/// attachments differ only in content are the same message (see [`crate::fingerprint`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    /// The file name shown to the recipient.
    pub filename: String,
    /// The MIME type, such as `application/pdf`.
    pub content_type: String,
    /// The content.
    pub content: Bytes,
}

impl Attachment {
    /// An attachment from its name, MIME type and bytes.
    pub fn new(
        filename: impl Into<String>,
        content_type: impl Into<String>,
        content: impl Into<Bytes>,
    ) -> Self {
        Self {
            filename: filename.into(),
            content_type: content_type.into(),
            content: content.into(),
        }
    }
}

/// Open and click tracking flags, passed to providers that support them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tracking {
    /// Track opens.
    pub opens: bool,
    /// Track link clicks.
    pub clicks: bool,
}

/// Threading headers that place an email in a conversation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Threading {
    /// The `Message-ID` of this message.
    pub message_id: Option<String>,
    /// The `In-Reply-To` of this message.
    pub in_reply_to: Option<String>,
    /// The `References` chain, oldest first.
    pub references: Vec<String>,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct MessageParts {
    pub(crate) from: String,
    pub(crate) to: Vec<String>,
    pub(crate) cc: Vec<String>,
    pub(crate) bcc: Vec<String>,
    pub(crate) reply_to: Vec<String>,
    pub(crate) subject: Option<String>,
    pub(crate) text: Option<String>,
    pub(crate) html: Option<String>,
    pub(crate) headers: BTreeMap<String, String>,
    pub(crate) attachments: Vec<Attachment>,
    pub(crate) threading: Threading,
    pub(crate) send_at: Option<SystemTime>,
    pub(crate) tracking: Tracking,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) idempotency_key: Option<IdempotencyKey>,
}

/// An email or SMS, with an optional idempotency key.
///
/// Build one with [`Message::builder`]; [`MessageBuilder::build`] checks it. Clones share the
/// fields.
///
/// ```
/// use tower_idempotency::Message;
///
/// let message = Message::builder()
///     .from("orders@marketplace.example")
///     .to("seller@example.com")
///     .subject("New order ord_20481")
///     .text("Vintage Nikon FM2 just sold.")
///     .metadata("order_id", "ord_20481")
///     .idempotency_key("order.created:ord_20481:email")
///     .build()?;
///
/// assert_eq!(message.to(), ["seller@example.com"]);
/// assert_eq!(message.idempotency_key().map(|k| k.as_str()), Some("order.created:ord_20481:email"));
///
/// // Validation is typed, never a panic:
/// let err = Message::builder().from("a@example.com").text("hi").build().unwrap_err();
/// assert_eq!(err, tower_idempotency::message::MessageError::MissingRecipient);
/// # Ok::<(), tower_idempotency::message::MessageError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message(pub(crate) Arc<MessageParts>);

impl Message {
    /// Starts a message.
    pub fn builder() -> MessageBuilder {
        MessageBuilder::default()
    }

    /// The sender: an address, a phone number or a sender id.
    pub fn from(&self) -> &str {
        &self.0.from
    }
    /// The `to` recipients.
    pub fn to(&self) -> &[String] {
        &self.0.to
    }
    /// The `cc` recipients.
    pub fn cc(&self) -> &[String] {
        &self.0.cc
    }
    /// The `bcc` recipients.
    pub fn bcc(&self) -> &[String] {
        &self.0.bcc
    }
    /// The `reply-to` addresses.
    pub fn reply_to(&self) -> &[String] {
        &self.0.reply_to
    }
    /// The subject (absent for SMS).
    pub fn subject(&self) -> Option<&str> {
        self.0.subject.as_deref()
    }
    /// The plain-text body.
    pub fn text(&self) -> Option<&str> {
        self.0.text.as_deref()
    }
    /// The HTML body.
    pub fn html(&self) -> Option<&str> {
        self.0.html.as_deref()
    }
    /// Extra header fields, by name.
    pub fn headers(&self) -> &BTreeMap<String, String> {
        &self.0.headers
    }
    /// The attachments, in order.
    pub fn attachments(&self) -> &[Attachment] {
        &self.0.attachments
    }
    /// The threading headers.
    pub fn threading(&self) -> &Threading {
        &self.0.threading
    }
    /// When the provider should send it, if scheduled.
    pub fn send_at(&self) -> Option<SystemTime> {
        self.0.send_at
    }
    /// The tracking flags.
    pub fn tracking(&self) -> Tracking {
        self.0.tracking
    }
    /// Metadata (tags) passed to the provider.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.0.metadata
    }
    /// The idempotency key, if the message has one.
    pub fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.0.idempotency_key.as_ref()
    }
    /// Every recipient: `to`, then `cc`, then `bcc`.
    pub fn recipients(&self) -> impl Iterator<Item = &str> {
        self.0
            .to
            .iter()
            .chain(&self.0.cc)
            .chain(&self.0.bcc)
            .map(String::as_str)
    }
}

/// Builds a [`Message`]; [`build`](Self::build) validates it.
#[derive(Debug, Default, Clone)]
#[must_use]
pub struct MessageBuilder {
    from: Option<String>,
    to: Vec<String>,
    cc: Vec<String>,
    bcc: Vec<String>,
    reply_to: Vec<String>,
    subject: Option<String>,
    text: Option<String>,
    html: Option<String>,
    headers: BTreeMap<String, String>,
    attachments: Vec<Attachment>,
    threading: Threading,
    send_at: Option<SystemTime>,
    tracking: Tracking,
    metadata: BTreeMap<String, String>,
    key: Option<String>,
}

impl MessageBuilder {
    /// Sets the sender.
    pub fn from(mut self, from: impl Into<String>) -> Self {
        self.from = Some(from.into());
        self
    }
    /// Adds a `to` recipient.
    pub fn to(mut self, to: impl Into<String>) -> Self {
        self.to.push(to.into());
        self
    }
    /// Adds a `cc` recipient.
    pub fn cc(mut self, cc: impl Into<String>) -> Self {
        self.cc.push(cc.into());
        self
    }
    /// Adds a `bcc` recipient.
    pub fn bcc(mut self, bcc: impl Into<String>) -> Self {
        self.bcc.push(bcc.into());
        self
    }
    /// Adds a `reply-to` address.
    pub fn reply_to(mut self, reply_to: impl Into<String>) -> Self {
        self.reply_to.push(reply_to.into());
        self
    }
    /// Sets the subject.
    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }
    /// Sets the plain-text body (the body of an SMS).
    pub fn text(mut self, text: impl Into<String>) -> Self {
        self.text = Some(text.into());
        self
    }
    /// Sets the HTML body.
    pub fn html(mut self, html: impl Into<String>) -> Self {
        self.html = Some(html.into());
        self
    }
    /// Sets a header field; a second value under the same name replaces the first.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }
    /// Adds an attachment.
    pub fn attachment(mut self, attachment: Attachment) -> Self {
        self.attachments.push(attachment);
        self
    }
    /// Sets this message's `Message-ID`.
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.threading.message_id = Some(id.into());
        self
    }
    /// Sets `In-Reply-To`.
    pub fn in_reply_to(mut self, id: impl Into<String>) -> Self {
        self.threading.in_reply_to = Some(id.into());
        self
    }
    /// Appends to `References`.
    pub fn reference(mut self, id: impl Into<String>) -> Self {
        self.threading.references.push(id.into());
        self
    }
    /// Schedules the message.
    pub fn send_at(mut self, at: SystemTime) -> Self {
        self.send_at = Some(at);
        self
    }
    /// Sets the tracking flags.
    pub fn tracking(mut self, tracking: Tracking) -> Self {
        self.tracking = tracking;
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

    /// Checks the message and builds it.
    ///
    /// # Errors
    /// [`MessageError`] when the sender, every recipient or both bodies are missing, an address
    /// is empty, or the key breaks the rules of [`IdempotencyKey`].
    pub fn build(self) -> Result<Message, MessageError> {
        let from = match self.from {
            Some(from) if !from.is_empty() => from,
            Some(_) => return Err(MessageError::EmptyAddress { field: "from" }),
            None => return Err(MessageError::MissingSender),
        };
        for (field, list) in [
            ("to", &self.to),
            ("cc", &self.cc),
            ("bcc", &self.bcc),
            ("reply_to", &self.reply_to),
        ] {
            if list.iter().any(String::is_empty) {
                return Err(MessageError::EmptyAddress { field });
            }
        }
        if self.to.is_empty() && self.cc.is_empty() && self.bcc.is_empty() {
            return Err(MessageError::MissingRecipient);
        }
        if self.text.is_none() && self.html.is_none() {
            return Err(MessageError::MissingBody);
        }
        let idempotency_key = self.key.map(IdempotencyKey::new).transpose()?;
        Ok(Message(Arc::new(MessageParts {
            from,
            to: self.to,
            cc: self.cc,
            bcc: self.bcc,
            reply_to: self.reply_to,
            subject: self.subject,
            text: self.text,
            html: self.html,
            headers: self.headers,
            attachments: self.attachments,
            threading: self.threading,
            send_at: self.send_at,
            tracking: self.tracking,
            metadata: self.metadata,
            idempotency_key,
        })))
    }
}

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
    /// [`MessageError`] when the sender or every recipient is missing, or an address is empty.
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

    fn base() -> MessageBuilder {
        Message::builder()
            .from("a@example.com")
            .to("b@example.com")
            .text("hi")
    }

    #[test]
    fn builder_refuses_each_missing_part_with_its_own_error() {
        assert_eq!(
            Message::builder().to("b@x").text("t").build(),
            Err(MessageError::MissingSender)
        );
        assert_eq!(
            Message::builder().from("a@x").text("t").build(),
            Err(MessageError::MissingRecipient)
        );
        assert_eq!(
            Message::builder().from("a@x").to("b@x").build(),
            Err(MessageError::MissingBody)
        );
        assert_eq!(
            base().cc("").build(),
            Err(MessageError::EmptyAddress { field: "cc" })
        );
        assert!(
            Message::builder()
                .from("a@x")
                .bcc("b@x")
                .html("<p>")
                .build()
                .is_ok()
        );
    }

    #[test]
    fn keys_are_checked_for_emptiness_length_and_control_characters() {
        assert_eq!(
            base().idempotency_key("").build(),
            Err(MessageError::InvalidKey(KeyError::Empty))
        );
        let long = "k".repeat(MAX_KEY_LEN + 1);
        assert_eq!(
            base().idempotency_key(long).build(),
            Err(MessageError::InvalidKey(KeyError::TooLong { len: 257 }))
        );
        assert!(
            base()
                .idempotency_key("k".repeat(MAX_KEY_LEN))
                .build()
                .is_ok()
        );
        assert_eq!(
            base().idempotency_key("ab\ncd").build(),
            Err(MessageError::InvalidKey(KeyError::ControlCharacter {
                position: 2
            }))
        );
        assert!(IdempotencyKey::new("é:ünïcode").is_ok());
    }

    #[test]
    fn key_debug_output_hides_the_key() {
        let key = IdempotencyKey::new("welcome:seller@example.com").unwrap();
        assert!(!format!("{key:?}").contains("seller"));
    }

    #[test]
    fn clones_share_their_fields() {
        let m = base().build().unwrap();
        let c = m.clone();
        assert!(Arc::ptr_eq(&m.0, &c.0));
    }

    #[test]
    fn envelope_needs_a_sender_and_a_recipient() {
        assert_eq!(Envelope::new("", ["b@x"]), Err(MessageError::MissingSender));
        assert_eq!(
            Envelope::new("a@x", Vec::<String>::new()),
            Err(MessageError::MissingRecipient)
        );
    }
}
