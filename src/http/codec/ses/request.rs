//! The body of SES v2's `SendEmail` (`POST /v2/email/outbound-emails`), as AWS's published
//! description (`sesv2` 2019-09-27) names its members, and the message tags it carries.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::http::mark::{KEY_DIGEST, key_digest};
use crate::message::Message;
use crate::outcome::SendError;

use super::super::wire::refused;
use super::{SES_IDEMPOTENCY_TAG, SES_MAX_HEADERS, SES_MAX_TAG_LEN};

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct SendEmail<'a> {
    pub(super) from_email_address: &'a str,
    pub(super) destination: Destination<'a>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub(super) reply_to_addresses: &'a [String],
    pub(super) content: Content<'a>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) email_tags: Vec<Tag<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) configuration_set_name: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Destination<'a> {
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub(super) to_addresses: &'a [String],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub(super) cc_addresses: &'a [String],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub(super) bcc_addresses: &'a [String],
}

/// `EmailContent`: exactly one of `Simple` and `Raw`.
#[derive(Serialize)]
pub(super) enum Content<'a> {
    Simple(Simple<'a>),
    Raw(Raw),
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Simple<'a> {
    subject: Text<'a>,
    body: Body<'a>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    headers: Vec<Header<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Body<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<Text<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    html: Option<Text<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Text<'a> {
    data: &'a str,
    charset: &'static str,
}

impl<'a> Text<'a> {
    fn utf8(data: &'a str) -> Self {
        Self {
            data,
            charset: "UTF-8",
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Header<'a> {
    name: &'a str,
    value: String,
}

/// `RawMessage`: the MIME message, base64 (a JSON blob).
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Raw {
    pub(super) data: String,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Tag<'a> {
    pub(super) name: &'a str,
    pub(super) value: String,
}

/// The `Simple` content of `message`, or `None` when it needs a raw message: attachments, or
/// more header fields than `Simple` takes.
pub(super) fn simple(message: &Message) -> Option<Simple<'_>> {
    if !message.attachments().is_empty() {
        return None;
    }
    let threading = message.threading();
    let mut headers: Vec<Header<'_>> = message
        .headers()
        .iter()
        .map(|(name, value)| Header {
            name,
            value: value.clone(),
        })
        .collect();
    if let Some(in_reply_to) = &threading.in_reply_to {
        headers.push(Header {
            name: "In-Reply-To",
            value: in_reply_to.clone(),
        });
    }
    if !threading.references.is_empty() {
        headers.push(Header {
            name: "References",
            value: threading.references.join(" "),
        });
    }
    // SES writes its own Message-ID on a simple message; a message that sets one goes raw.
    if headers.len() > SES_MAX_HEADERS || threading.message_id.is_some() {
        return None;
    }
    let text = message.text().map(Text::utf8);
    let html = message.html().map(Text::utf8);
    let body = match (text, html) {
        (None, None) => Body {
            text: Some(Text::utf8("")),
            html: None,
        },
        (text, html) => Body { text, html },
    };
    Some(Simple {
        subject: Text::utf8(message.subject().unwrap_or("")),
        body,
        headers,
    })
}

/// The value of the [`SES_IDEMPOTENCY_TAG`] tag for the stored key `key`: the 64 lowercase hex
/// digits of its SHA-256. Within SES's tag rules whatever the key holds, and the same the SNS
/// event of the message carries back.
///
/// ```
/// use tower_idempotency::http::ses::ses_key_tag;
///
/// let tag = ses_key_tag("order.created:ord_1:email");
/// assert_eq!(tag.len(), 64);
/// assert!(tag.bytes().all(|b| b.is_ascii_hexdigit()));
/// ```
pub fn ses_key_tag(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let mut value = String::with_capacity(64);
    for b in digest {
        value.push_str(&format!("{b:02x}"));
    }
    value
}

/// Whether `text` is a tag name or value SES takes: ASCII letters, digits, `_` and `-`, at most
/// [`SES_MAX_TAG_LEN`] characters.
fn is_tag_text(text: &str) -> bool {
    text.len() <= SES_MAX_TAG_LEN
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The message's tags: its metadata, then the key's tag when it is sent under a key.
pub(super) fn tags(message: &Message) -> Result<Vec<Tag<'_>>, SendError> {
    let mut tags = Vec::with_capacity(message.metadata().len() + 1);
    for (name, value) in message.metadata() {
        if name.is_empty() || !is_tag_text(name) || !is_tag_text(value) {
            return Err(refused(
                "Amazon SES",
                format_args!(
                    "the metadata {name:?} is sent as a message tag, and tag names and values \
                     hold only ASCII letters, digits, `_` and `-`, at most {SES_MAX_TAG_LEN} \
                     characters (a name at least one)"
                ),
            ));
        }
        if name == SES_IDEMPOTENCY_TAG || name == KEY_DIGEST {
            return Err(refused(
                "Amazon SES",
                format_args!("the tag {name:?} carries the idempotency key"),
            ));
        }
        tags.push(Tag {
            name,
            value: value.clone(),
        });
    }
    if let Some(key) = message.provider_key() {
        tags.push(Tag {
            name: SES_IDEMPOTENCY_TAG,
            value: ses_key_tag(key),
        });
        // The mark the SNS receiver finds the stored key by (`http::mark`).
        tags.push(Tag {
            name: KEY_DIGEST,
            value: key_digest(key),
        });
    }
    Ok(tags)
}
