//! A [`Message`] as an RFC 5322 / MIME message, written by lettre's message builder: what SMTP
//! sends after `DATA`, and what Amazon SES takes as a raw message when attachments need one.

use lettre::message::header::{ContentType, HeaderName, HeaderValue};
use lettre::message::{Attachment, Mailbox, MultiPart, SinglePart};
use sha2::{Digest, Sha256};

use crate::message::Message;
use crate::outcome::{SendError, codes};

/// Header fields the builder writes itself from the message's own fields: a header of the same
/// name among the message's headers would be written twice.
const WRITTEN_BY_THE_BUILDER: [&str; 14] = [
    "from",
    "to",
    "cc",
    "bcc",
    "reply-to",
    "subject",
    "date",
    "message-id",
    "in-reply-to",
    "references",
    "mime-version",
    "content-type",
    "content-transfer-encoding",
    "sender",
];

fn refused(what: &str, why: impl std::fmt::Display) -> SendError {
    SendError::validation(
        codes::INVALID_REQUEST,
        format!("the message cannot be written as MIME for {what}: {why}; not sent"),
    )
}

/// The `Message-ID` of a message sent under the stored key `key` from `from`:
/// `<` 32 hex digits `.idempotency@` the sender's domain `>`. The digits are the first 16 bytes
/// of the SHA-256 of a domain prefix and the key, so every attempt of the same send carries the
/// same id, and the key (which may hold personal data) cannot be read back from it.
pub(crate) fn message_id_for_key(key: &str, from: &str) -> String {
    let mut digest = Sha256::new();
    digest.update(b"tower-idempotency/message-id/v1\0");
    digest.update(key.as_bytes());
    let digest = digest.finalize();
    let mut id = String::with_capacity(80);
    id.push('<');
    for b in &digest[..16] {
        id.push_str(&format!("{b:02x}"));
    }
    id.push_str(".idempotency@");
    id.push_str(sender_domain(from));
    id.push('>');
    id
}

/// The domain of a mailbox (`Name <a@example.com>` or `a@example.com`); `localhost` when it
/// has none, which a validated message's sender always has.
fn sender_domain(from: &str) -> &str {
    let address = match (from.rfind('<'), from.rfind('>')) {
        (Some(open), Some(close)) if open < close => &from[open + 1..close],
        _ => from,
    };
    match address.rsplit_once('@') {
        Some((_, domain)) if !domain.is_empty() => domain.trim(),
        _ => "localhost",
    }
}

fn mailbox(address: &str, what: &str) -> Result<Mailbox, SendError> {
    address
        .parse::<Mailbox>()
        .map_err(|e| refused(what, format_args!("an address lettre cannot parse ({e})")))
}

/// `message` as a MIME message for `what` (a provider's name, for errors), with `message_id`
/// as its `Message-ID` when the message sets none of its own. `Bcc` is left out of the header:
/// the envelope (SMTP's `RCPT TO`, SES's `Destination`) carries those recipients.
pub(crate) fn build(
    message: &Message,
    message_id: Option<String>,
    what: &str,
) -> Result<lettre::Message, SendError> {
    let mut builder = lettre::Message::builder().from(mailbox(message.from(), what)?);
    for to in message.to() {
        builder = builder.to(mailbox(to, what)?);
    }
    for cc in message.cc() {
        builder = builder.cc(mailbox(cc, what)?);
    }
    for bcc in message.bcc() {
        builder = builder.bcc(mailbox(bcc, what)?);
    }
    for reply_to in message.reply_to() {
        builder = builder.reply_to(mailbox(reply_to, what)?);
    }
    if let Some(subject) = message.subject() {
        builder = builder.subject(subject);
    }
    let threading = message.threading();
    builder = builder.message_id(threading.message_id.clone().or(message_id));
    if let Some(in_reply_to) = &threading.in_reply_to {
        builder = builder.in_reply_to(in_reply_to.clone());
    }
    for reference in &threading.references {
        builder = builder.references(reference.clone());
    }
    for (name, value) in message.headers() {
        if WRITTEN_BY_THE_BUILDER.contains(&name.to_ascii_lowercase().as_str()) {
            return Err(refused(
                what,
                format_args!(
                    "the header {name:?} is written from the message's own fields; set it there"
                ),
            ));
        }
        let header = HeaderName::new_from_ascii(name.clone())
            .map_err(|_| refused(what, format_args!("{name:?} is no header name")))?;
        builder = builder.raw_header(HeaderValue::new(header, value.clone()));
    }

    let body = match (message.text(), message.html()) {
        (Some(text), Some(html)) => Body::Multi(MultiPart::alternative_plain_html(
            text.to_owned(),
            html.to_owned(),
        )),
        (Some(text), None) => Body::Single(SinglePart::plain(text.to_owned())),
        (None, Some(html)) => Body::Single(SinglePart::html(html.to_owned())),
        (None, None) => Body::Single(SinglePart::plain(String::new())),
    };
    let built = if message.attachments().is_empty() {
        match body {
            Body::Single(part) => builder.singlepart(part),
            Body::Multi(part) => builder.multipart(part),
        }
    } else {
        let mut mixed = match body {
            Body::Single(part) => MultiPart::mixed().singlepart(part),
            Body::Multi(part) => MultiPart::mixed().multipart(part),
        };
        for attachment in message.attachments() {
            let content_type = ContentType::parse(&attachment.content_type).map_err(|_| {
                refused(
                    what,
                    format_args!(
                        "the attachment {:?} has no valid content type",
                        attachment.filename
                    ),
                )
            })?;
            mixed = mixed.singlepart(
                Attachment::new(attachment.filename.clone())
                    .body(attachment.content.to_vec(), content_type),
            );
        }
        builder.multipart(mixed)
    };
    built.map_err(|e| refused(what, e))
}

enum Body {
    Single(SinglePart),
    Multi(MultiPart),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_id_of_a_key_is_stable_and_hides_the_key() {
        let id = message_id_for_key("order:42:seller@example.com", "Shop <shop@example.com>");
        assert_eq!(
            id,
            message_id_for_key("order:42:seller@example.com", "shop@example.com")
        );
        assert!(id.starts_with('<') && id.ends_with(".idempotency@example.com>"));
        assert!(!id.contains("seller"));
        assert_ne!(id, message_id_for_key("order:43", "shop@example.com"));
    }

    #[test]
    fn a_header_the_builder_writes_is_refused() {
        let message = Message::builder()
            .from("a@example.com")
            .to("b@example.com")
            .text("hi")
            .header("Subject", "twice")
            .build()
            .unwrap();
        let error = build(&message, None, "SMTP").unwrap_err();
        assert_eq!(error.code(), codes::INVALID_REQUEST);
    }

    #[test]
    fn attachments_and_both_bodies_make_a_mixed_message() {
        let message = Message::builder()
            .from("Shop <shop@example.com>")
            .to("b@example.com")
            .bcc("hidden@example.com")
            .subject("Invoice")
            .text("see attached")
            .html("<p>see attached</p>")
            .attachment(crate::Attachment::new(
                "invoice.pdf",
                "application/pdf",
                &b"%PDF"[..],
            ))
            .build()
            .unwrap();
        let id = message_id_for_key("k", message.from());
        let built = build(&message, Some(id.clone()), "SMTP").unwrap();
        let text = String::from_utf8(built.formatted()).unwrap();
        assert!(text.contains(&format!("Message-ID: {id}")), "{text}");
        assert!(text.contains("multipart/mixed"));
        assert!(text.contains("multipart/alternative"));
        assert!(text.contains("invoice.pdf"));
        assert!(!text.contains("hidden@example.com"));
    }
}
