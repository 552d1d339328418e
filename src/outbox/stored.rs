//! The stored form of a message in the outbox (version 1): JSON in the `message` column.
//!
//! Unlike the idempotency store, the outbox must keep the whole message, since the worker
//! that sends it may run on another machine and after a restart. The form is versioned
//! (`"v":1`) and pinned by a golden test, as a message enqueued by one release is sent by
//! whichever release drains the table.
//!
//! ```json
//! {"v":1,"key":"order.created:ord_1:email","from":"shop@example.com","to":["a@example.com"],
//!  "subject":"New order","text":"…","headers":{"X-Order":"ord_1"},
//!  "attachments":[{"filename":"a.pdf","content_type":"application/pdf","content":"JVBERi0="}],
//!  "send_at_ms":1767225600000,"tracking":{"opens":true,"clicks":false},"metadata":{"k":"v"}}
//! ```
//!
//! Empty lists and maps and absent values are left out; attachment content is padded base64.
//! `send_at_ms` is the schedule in milliseconds since the epoch, the precision a
//! [`Message`] keeps, so a message read back has the fingerprint it was enqueued with.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::base64;
use crate::message::{Attachment, Channel, Message, SmsSender, Tracking};
use crate::store::{StoreError, StoreErrorKind};

/// The version this release writes, and the only one it reads.
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct StoredMessage {
    v: u32,
    key: String,
    from: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    to: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    cc: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    bcc: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    reply_to: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    html: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    headers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    attachments: Vec<StoredAttachment>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    in_reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    references: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    send_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "is_default")]
    tracking: StoredTracking,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<String, String>,
    /// An SMS's sender kind (`number`, `sender_id`, `messaging_service`); absent for an email.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sms: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct StoredAttachment {
    filename: String,
    content_type: String,
    content: String,
}

#[derive(Serialize, Deserialize, Default, PartialEq, Eq)]
struct StoredTracking {
    opens: bool,
    clicks: bool,
}

fn is_default(t: &StoredTracking) -> bool {
    *t == StoredTracking::default()
}

fn invalid(detail: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::InvalidInput, detail)
}

fn corrupt(detail: impl Into<String>) -> StoreError {
    StoreError::corrupt(detail)
}

/// The message as the outbox keeps it. Refuses a message without a key (the outbox sends
/// each business event once, by its key) or scheduled before 1970.
pub(crate) fn encode(message: &Message) -> Result<String, StoreError> {
    let key = message
        .idempotency_key()
        .ok_or_else(|| invalid("an outbox message needs an idempotency key"))?;
    let send_at_ms = match message.send_at() {
        None => None,
        Some(at) => {
            let since = at
                .duration_since(UNIX_EPOCH)
                .map_err(|_| invalid("an outbox message cannot be scheduled before 1970"))?;
            Some(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
        }
    };
    let threading = message.threading();
    let tracking = message.tracking();
    let stored = StoredMessage {
        v: VERSION,
        key: key.as_str().to_owned(),
        from: message.from().to_owned(),
        to: message.to().to_vec(),
        cc: message.cc().to_vec(),
        bcc: message.bcc().to_vec(),
        reply_to: message.reply_to().to_vec(),
        subject: message.subject().map(str::to_owned),
        text: message.text().map(str::to_owned),
        html: message.html().map(str::to_owned),
        headers: message.headers().clone(),
        attachments: message
            .attachments()
            .iter()
            .map(|a| StoredAttachment {
                filename: a.filename.clone(),
                content_type: a.content_type.clone(),
                content: base64::encode(&a.content),
            })
            .collect(),
        message_id: threading.message_id.clone(),
        in_reply_to: threading.in_reply_to.clone(),
        references: threading.references.clone(),
        send_at_ms,
        tracking: StoredTracking {
            opens: tracking.opens,
            clicks: tracking.clicks,
        },
        metadata: message.metadata().clone(),
        sms: match message.channel() {
            Channel::Sms(SmsSender::Number) => Some("number".to_owned()),
            Channel::Sms(SmsSender::AlphanumericId) => Some("sender_id".to_owned()),
            Channel::Sms(SmsSender::MessagingService) => Some("messaging_service".to_owned()),
            _ => None,
        },
    };
    serde_json::to_string(&stored)
        .map_err(|e| StoreError::corrupt("the message could not be encoded").with_source(e))
}

/// The message back from its stored form; a form this release cannot read is corrupt.
pub(crate) fn decode(text: &str) -> Result<Message, StoreError> {
    let mut stored: StoredMessage = serde_json::from_str(text)
        .map_err(|e| corrupt("an outbox row's message does not decode").with_source(e))?;
    if stored.v != VERSION {
        return Err(corrupt(format!(
            "an outbox row's message is of version {}; this release reads version {VERSION}",
            stored.v
        )));
    }
    if let Some(sender) = stored.sms.take() {
        return decode_sms(sender, stored);
    }
    let mut builder = Message::builder()
        .from(stored.from)
        .idempotency_key(stored.key);
    for to in stored.to {
        builder = builder.to(to);
    }
    for cc in stored.cc {
        builder = builder.cc(cc);
    }
    for bcc in stored.bcc {
        builder = builder.bcc(bcc);
    }
    for reply_to in stored.reply_to {
        builder = builder.reply_to(reply_to);
    }
    if let Some(subject) = stored.subject {
        builder = builder.subject(subject);
    }
    if let Some(text) = stored.text {
        builder = builder.text(text);
    }
    if let Some(html) = stored.html {
        builder = builder.html(html);
    }
    for (name, value) in stored.headers {
        builder = builder.header(name, value);
    }
    for a in stored.attachments {
        let content = base64::decode(&a.content)
            .ok_or_else(|| corrupt("an outbox row's attachment is not base64"))?;
        builder = builder.attachment(Attachment::new(a.filename, a.content_type, content));
    }
    if let Some(id) = stored.message_id {
        builder = builder.message_id(id);
    }
    if let Some(id) = stored.in_reply_to {
        builder = builder.in_reply_to(id);
    }
    for id in stored.references {
        builder = builder.reference(id);
    }
    if let Some(at) = send_at(stored.send_at_ms)? {
        builder = builder.send_at(at);
    }
    builder = builder.tracking(Tracking {
        opens: stored.tracking.opens,
        clicks: stored.tracking.clicks,
    });
    for (name, value) in stored.metadata {
        builder = builder.metadata(name, value);
    }
    builder
        .build()
        .map_err(|e| corrupt("an outbox row's message is not a valid message").with_source(e))
}

fn send_at(ms: Option<u64>) -> Result<Option<SystemTime>, StoreError> {
    ms.map(|ms| {
        UNIX_EPOCH
            .checked_add(Duration::from_millis(ms))
            .ok_or_else(|| corrupt("an outbox row's schedule is out of range"))
    })
    .transpose()
}

fn decode_sms(sender: String, stored: StoredMessage) -> Result<Message, StoreError> {
    let builder = Message::sms();
    let mut builder = match sender.as_str() {
        "number" => builder.from_number(stored.from),
        "sender_id" => builder.from_sender_id(stored.from),
        "messaging_service" => builder.messaging_service(stored.from),
        _ => return Err(corrupt("an outbox row's SMS sender kind is unknown")),
    }
    .idempotency_key(stored.key);
    for to in stored.to {
        builder = builder.to(to);
    }
    if let Some(text) = stored.text {
        builder = builder.text(text);
    }
    if let Some(at) = send_at(stored.send_at_ms)? {
        builder = builder.send_at(at);
    }
    for (name, value) in stored.metadata {
        builder = builder.metadata(name, value);
    }
    builder
        .build()
        .map_err(|e| corrupt("an outbox row's SMS is not a valid message").with_source(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprinted;

    fn full() -> Message {
        Message::builder()
            .from("shop@example.com")
            .to("a@example.com")
            .cc("b@example.com")
            .bcc("c@example.com")
            .reply_to("help@example.com")
            .subject("New order")
            .text("Sold.")
            .html("<p>Sold.</p>")
            .header("X-Order", "ord_1")
            .attachment(Attachment::new("a.pdf", "application/pdf", &b"%PDF-"[..]))
            .message_id("<m1@example.com>")
            .in_reply_to("<m0@example.com>")
            .reference("<m0@example.com>")
            .send_at(UNIX_EPOCH + Duration::from_secs(1_767_225_600))
            .tracking(Tracking {
                opens: true,
                clicks: false,
            })
            .metadata("k", "v")
            .idempotency_key("order.created:ord_1:email")
            .build()
            .unwrap()
    }

    /// The golden form of version 1: a change here breaks rows already in every outbox.
    #[test]
    fn version_1_is_pinned() {
        let expected = concat!(
            r#"{"v":1,"key":"order.created:ord_1:email","from":"shop@example.com","#,
            r#""to":["a@example.com"],"cc":["b@example.com"],"bcc":["c@example.com"],"#,
            r#""reply_to":["help@example.com"],"subject":"New order","text":"Sold.","#,
            r#""html":"<p>Sold.</p>","headers":{"X-Order":"ord_1"},"#,
            r#""attachments":[{"filename":"a.pdf","content_type":"application/pdf","content":"JVBERi0="}],"#,
            r#""message_id":"<m1@example.com>","in_reply_to":"<m0@example.com>","#,
            r#""references":["<m0@example.com>"],"send_at_ms":1767225600000,"#,
            r#""tracking":{"opens":true,"clicks":false},"metadata":{"k":"v"}}"#
        );
        assert_eq!(encode(&full()).unwrap(), expected);
        let minimal = Message::builder()
            .from("a@x")
            .to("b@x")
            .text("t")
            .idempotency_key("k")
            .build()
            .unwrap();
        assert_eq!(
            encode(&minimal).unwrap(),
            r#"{"v":1,"key":"k","from":"a@x","to":["b@x"],"text":"t"}"#
        );
    }

    #[test]
    fn a_message_comes_back_the_same_message() {
        let message = full();
        let back = decode(&encode(&message).unwrap()).unwrap();
        assert_eq!(back, message);
        assert_eq!(back.fingerprint(), message.fingerprint());
        // jsonb reorders keys and spacing: any order decodes.
        let reordered = r#"{"text": "t", "to": ["b@x"], "from": "a@x", "key": "k", "v": 1}"#;
        assert_eq!(decode(reordered).unwrap().text(), Some("t"));
    }

    #[test]
    fn a_schedule_with_sub_millisecond_digits_comes_back_the_same_message() {
        let message = Message::builder()
            .from("a@x")
            .to("b@x")
            .text("t")
            .send_at(UNIX_EPOCH + Duration::new(1_767_225_600, 123_456_789))
            .idempotency_key("k")
            .build()
            .unwrap();
        let text = encode(&message).unwrap();
        assert!(text.contains(r#""send_at_ms":1767225600123"#), "{text}");
        let back = decode(&text).unwrap();
        assert_eq!(back.send_at(), message.send_at());
        assert_eq!(back.fingerprint(), message.fingerprint());
    }

    #[test]
    fn an_sms_comes_back_an_sms_and_an_email_row_names_no_channel() {
        let sms = Message::sms()
            .from_sender_id("MyShop")
            .to("+15558675310")
            .text("Your code is 314159")
            .idempotency_key("login:u_42:otp")
            .build()
            .unwrap();
        let text = encode(&sms).unwrap();
        assert!(text.contains(r#""sms":"sender_id""#), "{text}");
        let back = decode(&text).unwrap();
        assert_eq!(back.channel(), Channel::Sms(SmsSender::AlphanumericId));
        assert_eq!(back.fingerprint(), sms.fingerprint());
        assert!(!encode(&full()).unwrap().contains("sms"));
    }

    #[test]
    fn what_cannot_be_kept_or_read_is_a_typed_error() {
        let unkeyed = Message::builder().from("a@x").to("b@x").text("t").build();
        assert_eq!(
            encode(&unkeyed.unwrap()).unwrap_err().kind(),
            StoreErrorKind::InvalidInput
        );
        for bad in [
            "not json",
            r#"{"v":2,"key":"k","from":"a@x","to":["b@x"],"text":"t"}"#,
            r#"{"v":1,"key":"k","from":"a@x","text":"t"}"#,
            r#"{"v":1,"key":"","from":"a@x","to":["b@x"],"text":"t"}"#,
            r#"{"v":1,"key":"k","from":"a@x","to":["b@x"],"text":"t","attachments":[{"filename":"f","content_type":"t","content":"!"}]}"#,
        ] {
            assert_eq!(
                decode(bad).unwrap_err().kind(),
                StoreErrorKind::Corrupt,
                "{bad}"
            );
        }
    }
}
