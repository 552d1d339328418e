//! The messages the layer sends: [`Message`] (email or SMS), [`RawMessage`] (bytes plus an
//! [`Envelope`]), their builder and the [`IdempotencyKey`] they may carry.
//!
//! Messages are validated when they are built, so a message that reaches a transport always has a
//! sender, at least one recipient, a body and, when it has one, a well-formed key; its
//! addresses are RFC 5322 mailboxes (an SMS's numbers E.164, see [`SmsBuilder`]), its header
//! names RFC 5322 field names, and no field that ends up in an email header (header values,
//! subject, addresses, display names, attachment names, threading ids) holds a CR or LF, so no
//! header can be injected. Both message types keep their fields behind an [`Arc`], so cloning
//! one for a retry is a reference-count increment, not a copy of the bodies.

mod address;
mod error;
mod key;
mod raw;
mod sms;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use address::{has_line_break, is_field_name, is_mailbox};
pub use error::MessageError;
pub(crate) use key::validate_key;
pub use key::{IdempotencyKey, KeyError, MAX_KEY_LEN};
pub use raw::{Envelope, RawMessage};
pub use sms::{Channel, SmsBuilder, SmsSender};

/// The latest `send_at` a message takes, after the Unix epoch: 9999-12-31T23:59:59Z, the last
/// second RFC 3339 (four-digit years) can write. Providers take schedules as RFC 3339 text.
pub const MAX_SEND_AT: Duration = Duration::from_secs(253_402_300_799);

/// The earliest `send_at` a message takes, before the Unix epoch: 0000-01-01T00:00:00Z, the
/// first second RFC 3339 can write.
pub const MIN_SEND_AT: Duration = Duration::from_secs(62_167_219_200);

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
    pub(crate) channel: Channel,
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
#[derive(Clone, Debug)]
pub struct Message {
    pub(crate) parts: Arc<MessageParts>,
    // What the idempotency layer said of this send's key, just before it called the
    // provider; outside the shared parts, so setting it copies no body.
    layer_key: LayerKey,
}

/// The key the idempotency layer holds for a send.
#[derive(Clone, Debug, Default)]
enum LayerKey {
    /// The message did not pass through a layer: its own key stands.
    #[default]
    NotSet,
    /// The layer's stored key.
    Stored(ProviderKey),
    /// The layer sends it unkeyed (a key function answered `None`).
    Unkeyed,
}

/// The layer's key for a send. Debug shows its length only, as [`IdempotencyKey`]'s does:
/// keys often embed an address.
#[derive(Clone)]
struct ProviderKey(Arc<str>);

impl fmt::Debug for ProviderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProviderKey(<{} bytes>)", self.0.len())
    }
}

/// Two messages are equal when their content and own key are; the layer's key for a send is
/// not part of the message.
impl PartialEq for Message {
    fn eq(&self, other: &Self) -> bool {
        self.parts == other.parts
    }
}

impl Eq for Message {}

impl Message {
    pub(crate) fn from_parts(parts: MessageParts) -> Self {
        Self {
            parts: Arc::new(parts),
            layer_key: LayerKey::NotSet,
        }
    }

    /// Starts an email.
    pub fn builder() -> MessageBuilder {
        MessageBuilder::default()
    }

    /// Starts an SMS; see [`SmsBuilder`].
    pub fn sms() -> SmsBuilder {
        SmsBuilder::default()
    }

    /// Whether it is an email or an SMS, and for an SMS what its sender is.
    pub fn channel(&self) -> Channel {
        self.parts.channel
    }

    /// The key a provider should deduplicate this send by: the key the idempotency layer
    /// reserved for it (its stored key, after the key function and the namespace), `None` when
    /// the layer sends it unkeyed, or, for a message that did not pass through a layer, its
    /// own key.
    ///
    /// Transports send it as the provider's idempotency key
    /// (`HttpTransport`, feature `http`, through its codec), so the provider's
    /// own deduplication covers exactly what the layer's store does.
    pub fn provider_key(&self) -> Option<&str> {
        match &self.layer_key {
            LayerKey::NotSet => self.idempotency_key().map(IdempotencyKey::as_str),
            LayerKey::Stored(key) => Some(&key.0),
            LayerKey::Unkeyed => None,
        }
    }

    /// This message, to be sent under the layer's stored `key` (`None`: unkeyed); see
    /// [`provider_key`](Self::provider_key).
    pub(crate) fn with_provider_key(mut self, key: Option<&Arc<str>>) -> Self {
        self.layer_key = match key {
            Some(key) => LayerKey::Stored(ProviderKey(Arc::clone(key))),
            None => LayerKey::Unkeyed,
        };
        self
    }

    /// The sender: an address, a phone number or a sender id.
    pub fn from(&self) -> &str {
        &self.parts.from
    }
    /// The `to` recipients.
    pub fn to(&self) -> &[String] {
        &self.parts.to
    }
    /// The `cc` recipients.
    pub fn cc(&self) -> &[String] {
        &self.parts.cc
    }
    /// The `bcc` recipients.
    pub fn bcc(&self) -> &[String] {
        &self.parts.bcc
    }
    /// The `reply-to` addresses.
    pub fn reply_to(&self) -> &[String] {
        &self.parts.reply_to
    }
    /// The subject (absent for SMS).
    pub fn subject(&self) -> Option<&str> {
        self.parts.subject.as_deref()
    }
    /// The plain-text body.
    pub fn text(&self) -> Option<&str> {
        self.parts.text.as_deref()
    }
    /// The HTML body.
    pub fn html(&self) -> Option<&str> {
        self.parts.html.as_deref()
    }
    /// Extra header fields, by name.
    pub fn headers(&self) -> &BTreeMap<String, String> {
        &self.parts.headers
    }
    /// The attachments, in order.
    pub fn attachments(&self) -> &[Attachment] {
        &self.parts.attachments
    }
    /// The threading headers.
    pub fn threading(&self) -> &Threading {
        &self.parts.threading
    }
    /// When the provider should send it, if scheduled: a whole millisecond (see
    /// [`MessageBuilder::send_at`]).
    pub fn send_at(&self) -> Option<SystemTime> {
        self.parts.send_at
    }
    /// The tracking flags.
    pub fn tracking(&self) -> Tracking {
        self.parts.tracking
    }
    /// Metadata (tags) passed to the provider.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.parts.metadata
    }
    /// The idempotency key, if the message has one.
    pub fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.parts.idempotency_key.as_ref()
    }
    /// Every recipient: `to`, then `cc`, then `bcc`.
    pub fn recipients(&self) -> impl Iterator<Item = &str> {
        self.parts
            .to
            .iter()
            .chain(&self.parts.cc)
            .chain(&self.parts.bcc)
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
    /// Schedules the message, to the millisecond: [`build`](Self::build) rounds `at` down to
    /// the whole millisecond, the precision the outbox keeps and the fingerprint hashes, so a
    /// message stored and read back is the same message. Providers take coarser schedules
    /// still (Resend's are whole seconds).
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
    /// is empty or not an RFC 5322 mailbox, a header name is not an RFC 5322 field name, a
    /// header value, the subject, an address, an attachment's name or type or a threading id
    /// holds a CR or LF, `send_at` is outside what RFC 3339 can write, or the key breaks the
    /// rules of [`IdempotencyKey`].
    ///
    /// ```
    /// use tower_idempotency::Message;
    /// use tower_idempotency::message::MessageError;
    ///
    /// let email = || Message::builder().from("shop@example.com").to("ann@example.com").text("Hi");
    /// // A header injection is refused before any provider sees it:
    /// assert_eq!(
    ///     email().header("X-Note", "hi\r\nBcc: victim@example.com").build(),
    ///     Err(MessageError::LineBreak { field: "header" })
    /// );
    /// assert_eq!(email().header("X-A\r\nBcc", "x").build(), Err(MessageError::InvalidHeaderName));
    /// assert_eq!(
    ///     email().cc("a@b@c").build(),
    ///     Err(MessageError::InvalidAddress { field: "cc", index: 0 })
    /// );
    /// assert!(email().cc("Ann Lee <ann.lee@example.com>").build().is_ok());
    /// ```
    pub fn build(mut self) -> Result<Message, MessageError> {
        let from = match self.from.take() {
            Some(from) if !from.is_empty() => from,
            Some(_) => return Err(MessageError::EmptyAddress { field: "from" }),
            None => return Err(MessageError::MissingSender),
        };
        check_mailboxes("from", std::slice::from_ref(&from))?;
        for (field, list) in [
            ("to", &self.to),
            ("cc", &self.cc),
            ("bcc", &self.bcc),
            ("reply_to", &self.reply_to),
        ] {
            check_mailboxes(field, list)?;
        }
        if self.to.is_empty() && self.cc.is_empty() && self.bcc.is_empty() {
            return Err(MessageError::MissingRecipient);
        }
        if self.text.is_none() && self.html.is_none() {
            return Err(MessageError::MissingBody);
        }
        check_header_fields(&self)?;
        let send_at = schedule(self.send_at)?;
        let idempotency_key = self.key.map(IdempotencyKey::new).transpose()?;
        Ok(Message::from_parts(MessageParts {
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
            send_at,
            tracking: self.tracking,
            metadata: self.metadata,
            idempotency_key,
            channel: Channel::Email,
        }))
    }
}

/// Every address of `field` is a non-empty RFC 5322 mailbox without line breaks.
fn check_mailboxes(field: &'static str, list: &[String]) -> Result<(), MessageError> {
    for (index, address) in list.iter().enumerate() {
        if address.is_empty() {
            return Err(MessageError::EmptyAddress { field });
        }
        if has_line_break(address) {
            return Err(MessageError::LineBreak { field });
        }
        if !is_mailbox(address) {
            return Err(MessageError::InvalidAddress { field, index });
        }
    }
    Ok(())
}

/// Header names are field names; nothing that becomes a header line holds CR or LF.
fn check_header_fields(b: &MessageBuilder) -> Result<(), MessageError> {
    for (name, value) in &b.headers {
        if !is_field_name(name) {
            return Err(MessageError::InvalidHeaderName);
        }
        if has_line_break(value) {
            return Err(MessageError::LineBreak { field: "header" });
        }
    }
    let line_break = |field, text: Option<&str>| match text {
        Some(text) if has_line_break(text) => Err(MessageError::LineBreak { field }),
        _ => Ok(()),
    };
    line_break("subject", b.subject.as_deref())?;
    for a in &b.attachments {
        line_break("attachment", Some(&a.filename))?;
        line_break("attachment", Some(&a.content_type))?;
    }
    line_break("message_id", b.threading.message_id.as_deref())?;
    line_break("in_reply_to", b.threading.in_reply_to.as_deref())?;
    for reference in &b.threading.references {
        line_break("references", Some(reference))?;
    }
    Ok(())
}

/// The schedule a message keeps: `send_at` checked to be within what RFC 3339 writes
/// ([`MIN_SEND_AT`] before the epoch to [`MAX_SEND_AT`] after it), then rounded down to the
/// whole millisecond, the precision of every form a message is kept in (the outbox's row, the
/// fingerprint), so a message read back from one of them is the message that was built.
pub(crate) fn schedule(send_at: Option<SystemTime>) -> Result<Option<SystemTime>, MessageError> {
    const NANOS_PER_MILLI: u32 = 1_000_000;
    let Some(at) = send_at else {
        return Ok(None);
    };
    match at.duration_since(UNIX_EPOCH) {
        Ok(since) if since <= MAX_SEND_AT => {
            let sub_milli = since.subsec_nanos() % NANOS_PER_MILLI;
            Ok(Some(at - Duration::from_nanos(u64::from(sub_milli))))
        }
        // Down is towards the past on both sides of the epoch; whole seconds bound the
        // range, so rounding down never leaves it.
        Err(before) if before.duration() <= MIN_SEND_AT => {
            let sub_milli = before.duration().subsec_nanos() % NANOS_PER_MILLI;
            let down = (NANOS_PER_MILLI - sub_milli) % NANOS_PER_MILLI;
            Ok(Some(at - Duration::from_nanos(u64::from(down))))
        }
        _ => Err(MessageError::SendAtOutOfRange),
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
    fn a_line_break_in_any_header_bound_field_is_refused() {
        let lb = |field| Err(MessageError::LineBreak { field });
        assert_eq!(base().header("X-A", "1\r\nBcc: x@y").build(), lb("header"));
        assert_eq!(base().header("X-A", "1\nBcc: x@y").build(), lb("header"));
        assert_eq!(base().subject("Hi\r\nBcc: x@y").build(), lb("subject"));
        assert_eq!(base().to("b@x\r\nBcc: c@y").build(), lb("to"));
        assert_eq!(base().reply_to("\"A\r\n\" <a@x>").build(), lb("reply_to"));
        let attachment = Attachment::new("a.pdf\r\nX-B: 1", "application/pdf", &b"%"[..]);
        assert_eq!(base().attachment(attachment).build(), lb("attachment"));
        assert_eq!(base().message_id("<a@x>\r\nX: 1").build(), lb("message_id"));
        assert_eq!(base().in_reply_to("<a@x>\n").build(), lb("in_reply_to"));
        assert_eq!(base().reference("<a@x>\r").build(), lb("references"));
        assert_eq!(
            base().header("X-A\r\nBcc", "v").build(),
            Err(MessageError::InvalidHeaderName)
        );
        assert_eq!(
            base().header("", "v").build(),
            Err(MessageError::InvalidHeaderName)
        );
        let err = base().subject("a\r\nb").build().unwrap_err().to_string();
        assert!(!err.contains('\r') && !err.contains('\n'), "{err}");
    }

    #[test]
    fn addresses_are_rfc_5322_mailboxes() {
        assert_eq!(
            base().cc("ok@x").cc("a@b@c").build(),
            Err(MessageError::InvalidAddress {
                field: "cc",
                index: 1
            })
        );
        assert_eq!(
            Message::builder()
                .from("nobody")
                .to("b@x")
                .text("t")
                .build(),
            Err(MessageError::InvalidAddress {
                field: "from",
                index: 0
            })
        );
        assert!(base().to("\"Lee, Ann\" <ann@example.com>").build().is_ok());
        assert_eq!(
            Envelope::new("Ann <a@x>", ["b@x"]),
            Err(MessageError::InvalidAddress {
                field: "from",
                index: 0
            })
        );
    }

    #[test]
    fn send_at_must_be_writable_as_rfc_3339() {
        let last = UNIX_EPOCH + MAX_SEND_AT;
        assert!(base().send_at(last).build().is_ok());
        assert_eq!(
            base().send_at(last + Duration::from_secs(1)).build(),
            Err(MessageError::SendAtOutOfRange)
        );
        let first = UNIX_EPOCH - MIN_SEND_AT;
        assert!(base().send_at(first).build().is_ok());
        assert_eq!(
            base().send_at(first - Duration::from_secs(1)).build(),
            Err(MessageError::SendAtOutOfRange)
        );
    }

    #[test]
    fn a_schedule_is_kept_to_the_millisecond_rounded_down() {
        let at = |secs: u64, nanos: u32| UNIX_EPOCH + Duration::new(secs, nanos);
        let kept = |send_at| base().send_at(send_at).build().unwrap().send_at().unwrap();
        assert_eq!(
            kept(at(1_800_000_000, 123_456_789)),
            at(1_800_000_000, 123_000_000)
        );
        assert_eq!(
            kept(at(1_800_000_000, 999_999_999)),
            at(1_800_000_000, 999_000_000)
        );
        assert_eq!(
            kept(at(1_800_000_000, 7_000_000)),
            at(1_800_000_000, 7_000_000)
        );
        // Before the epoch, down is further back.
        let before = |secs: u64, nanos: u32| UNIX_EPOCH - Duration::new(secs, nanos);
        assert_eq!(kept(before(86_400, 1)), before(86_400, 1_000_000));
        assert_eq!(kept(before(86_400, 2_500_000)), before(86_400, 3_000_000));
        assert_eq!(kept(before(86_400, 0)), before(86_400, 0));
        let first = UNIX_EPOCH - MIN_SEND_AT;
        assert_eq!(
            kept(first),
            first,
            "the range's ends are whole milliseconds"
        );
        let sms = Message::sms()
            .from_number("+15550100")
            .to("+15550199")
            .text("hi")
            .send_at(at(1_800_000_000, 123_456_789))
            .build()
            .unwrap();
        assert_eq!(sms.send_at(), Some(at(1_800_000_000, 123_000_000)));
    }

    #[test]
    fn the_layer_key_is_the_provider_key_and_the_own_key_otherwise() {
        let own = base().idempotency_key("k").build().unwrap();
        assert_eq!(own.provider_key(), Some("k"));
        let sent = own.clone().with_provider_key(Some(&Arc::from("ns:k")));
        assert_eq!(sent.provider_key(), Some("ns:k"));
        assert_eq!(sent, own, "the layer's key is not part of the message");
        assert!(!format!("{sent:?}").contains("ns:k"), "Debug hides the key");
        assert_eq!(own.with_provider_key(None).provider_key(), None);
        assert_eq!(base().build().unwrap().provider_key(), None);
    }

    #[test]
    fn clones_share_their_fields() {
        let m = base().build().unwrap();
        let c = m.clone();
        assert!(Arc::ptr_eq(&m.parts, &c.parts));
    }
}
