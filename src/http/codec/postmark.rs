//! [`PostmarkCodec`]: Postmark's email API (`POST /email` and `POST /email/batch`), with its
//! documented [limits](self#limits) and the [codes](self#limits) its errors become.
//!
//! # No idempotency key at Postmark
//!
//! Postmark's email API takes no idempotency key: the codec sends none
//! ([`Codec::idempotency_key`] answers `None`), and the idempotency store is the only net, as
//! with [Twilio](super::twilio#no-idempotency-key-at-twilio).
//!
//! # Limits
//!
//! What Postmark documents, and the codec checks before it sends: a message that breaks one is
//! a validation error, code [`provider.invalid_request`](codes::INVALID_REQUEST), and is
//! not sent (in a batch, it alone is left out). Sources: the
//! [email API reference](https://postmarkapp.com/developer/api/email-api), the
//! [batch guide](https://postmarkapp.com/developer/user-guide/send-email-with-api/batch-emails),
//! the [error codes](https://postmarkapp.com/developer/api/overview#error-codes), what
//! [error 300](https://postmarkapp.com/support/article/1180-what-does-errorcode-300-mean)
//! covers (50 recipients "includes any collection of TO, CC, and BCC"; "the message body
//! cannot be empty") and the
//! [metadata FAQ](https://postmarkapp.com/support/article/1125-custom-metadata-faq)
//! ("duplicate keys, including the same key with case differences, are not allowed").
//!
//! | rule | constant |
//! |---|---|
//! | `From`, `To` and a `TextBody` or `HtmlBody` are required: a cc-only or bcc-only message is refused | |
//! | a body that is not empty: a message whose text and html are both empty is refused (the codec sends no templates, which carry their own) | |
//! | at most 50 addresses in `To`, `Cc` and `Bcc` together | [`POSTMARK_MAX_RECIPIENTS`] |
//! | no two metadata keys that differ only by case (`order_id` and `Order_ID`) | |
//! | email only, sent now: an SMS or a `send_at` is refused (Postmark does not schedule) | |
//! | a request body of at most 10 MB, a batch's at most 50 MB (attachments included) | [`POSTMARK_MAX_BODY`], [`POSTMARK_MAX_BATCH_BODY`] |
//! | a batch of at most 500 emails | [`POSTMARK_MAX_BATCH`] |
//!
//! What Postmark's `ErrorCode`s become, for a single send (HTTP 422) and for each message of a
//! batch (in its `200 OK` answer, one result per message):
//!
//! | `ErrorCode` | outcome | code |
//! |---|---|---|
//! | 0 | the receipt | |
//! | 406 (inactive recipient: hard bounce, spam complaint, suppression) | permanent | [`provider.inactive_recipient`](codes::INACTIVE_RECIPIENT) |
//! | 300, 402, 403, 409, 410, 411 (invalid email request, JSON, too many batch messages, forbidden attachment type) | validation | [`provider.validation_error`](codes::VALIDATION_ERROR) |
//! | 429 (rate limit), 100 (maintenance) | retryable | [`provider.rate_limited`](codes::RATE_LIMITED), [`provider.unavailable`](codes::UNAVAILABLE) |
//! | any other (400, 401 sender signature; 405, 412, 413 account) | permanent | [`provider.rejected`](codes::REJECTED) |
//!
//! Other statuses (401 bad token, 429, 500, …) map as the transport maps them. In a batch, one
//! message's error is its own: the other messages keep their receipts, and the layer frees
//! only the refused message's key.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use http::{HeaderName, StatusCode, Uri};
use serde::{Deserialize, Serialize};

use super::wire::{self, refused, truncate};
use super::{BatchCodec, Codec};
use crate::base64::encode as base64;
use crate::http::mark;
use crate::message::{Channel, Message};
use crate::outcome::{BoxError, Receipt, SendError, codes};

/// Postmark's API, where [`PostmarkCodec::new`] points.
pub const POSTMARK_API: &str = "https://api.postmarkapp.com";

/// The transport name in receipts from [`PostmarkCodec`].
pub const POSTMARK: &str = "postmark";

/// The most emails `POST /email/batch` takes in one request.
pub const POSTMARK_MAX_BATCH: usize = 500;

/// The most addresses in `To`, `Cc` and `Bcc` together.
pub const POSTMARK_MAX_RECIPIENTS: usize = 50;

/// The largest `POST /email` body, attachments included: 10 MB.
pub const POSTMARK_MAX_BODY: usize = 10_000_000;

/// The largest `POST /email/batch` body, attachments included: 50 MB.
pub const POSTMARK_MAX_BATCH_BODY: usize = 50_000_000;

/// The header that carries the server token.
const SERVER_TOKEN: &str = "x-postmark-server-token";

/// The [`Codec`] of [Postmark](https://postmarkapp.com/developer/api/email-api)'s
/// `POST /email`, and as a [`BatchCodec`] of `POST /email/batch`.
///
/// The request carries `X-Postmark-Server-Token` and a JSON body:
///
/// | message | JSON field |
/// |---|---|
/// | from, subject | `From`, `Subject` |
/// | to, cc, bcc, reply_to | `To`, `Cc`, `Bcc`, `ReplyTo` (comma-separated) |
/// | text, html | `TextBody`, `HtmlBody` |
/// | headers, threading | `Headers`: `[{Name, Value}]` (`Message-ID`, `In-Reply-To`, `References`) |
/// | attachments | `Attachments`: `[{Name, Content (base64), ContentType}]` |
/// | tracking | `TrackOpens`, `TrackLinks` (`HtmlAndText` when clicks are tracked) |
/// | metadata | `Metadata` |
/// | the stored key (keyed messages) | the `Metadata` entry [`idempotency_digest`](crate::http::mark::KEY_DIGEST): [`key_digest`](crate::http::mark::key_digest) |
/// | the codec's message stream | `MessageStream` (default `outbound`) |
///
/// The answer's `MessageID` becomes `Receipt { id, transport: "postmark", accepted }` with the
/// message's to, cc and bcc. A batch's answer holds one result per message, in order; each is
/// that message's outcome ([table](self#limits)).
///
/// ```
/// use tower_idempotency::http::postmark::PostmarkCodec;
///
/// let codec = PostmarkCodec::new("server-token").message_stream("broadcast");
/// assert!(!format!("{codec:?}").contains("server-token"));
/// ```
#[derive(Clone)]
pub struct PostmarkCodec {
    server_token: String,
    message_stream: String,
    base_url: Uri,
}

impl PostmarkCodec {
    /// A codec that sends to [`POSTMARK_API`] with `server_token`, on the `outbound` stream.
    pub fn new(server_token: impl Into<String>) -> Self {
        Self {
            server_token: server_token.into(),
            message_stream: "outbound".to_owned(),
            base_url: Uri::from_static(POSTMARK_API),
        }
    }

    /// Sends on `stream` (a message stream's id) instead of `outbound`.
    #[must_use]
    pub fn message_stream(mut self, stream: impl Into<String>) -> Self {
        self.message_stream = stream.into();
        self
    }

    /// Sends to `base_url` instead of [`POSTMARK_API`] (a test server, a proxy).
    #[must_use]
    pub fn base_url(mut self, base_url: Uri) -> Self {
        self.base_url = base_url;
        self
    }
}

impl fmt::Debug for PostmarkCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostmarkCodec")
            .field("server_token", &"<redacted>")
            .field("message_stream", &self.message_stream)
            .field("base_url", &self.base_url)
            .finish()
    }
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Email<'a> {
    from: &'a str,
    to: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    cc: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    bcc: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    reply_to: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    subject: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text_body: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    html_body: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    headers: Vec<Header<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    attachments: Vec<Attachment<'a>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    track_opens: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    track_links: Option<&'static str>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<&'a str, Cow<'a, str>>,
    message_stream: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Header<'a> {
    name: &'a str,
    value: String,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Attachment<'a> {
    name: &'a str,
    content: String,
    content_type: &'a str,
}

/// One result: the answer of `/email`, or one element of the answer of `/email/batch`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Sent {
    error_code: i64,
    #[serde(default)]
    message: Option<String>,
    #[serde(rename = "MessageID", default)]
    message_id: Option<String>,
}

impl PostmarkCodec {
    /// Checks `message` against Postmark's documented limits (the [table](self#limits)).
    fn check(&self, message: &Message) -> Result<(), SendError> {
        if message.channel() != Channel::Email {
            return Err(refused(
                "Postmark",
                "Postmark sends email, and this message is an SMS",
            ));
        }
        if message.to().is_empty() {
            return Err(refused(
                "Postmark",
                "`To` is required and the message has only cc or bcc recipients",
            ));
        }
        let recipients = message.to().len() + message.cc().len() + message.bcc().len();
        if recipients > POSTMARK_MAX_RECIPIENTS {
            return Err(refused(
                "Postmark",
                format_args!(
                    "`To`, `Cc` and `Bcc` hold {recipients} addresses together and Postmark \
                     takes at most {POSTMARK_MAX_RECIPIENTS} per message"
                ),
            ));
        }
        if message.text().is_none_or(str::is_empty) && message.html().is_none_or(str::is_empty) {
            return Err(refused(
                "Postmark",
                "its text and html bodies are empty, and Postmark takes no message without a body",
            ));
        }
        let mut keys: Vec<String> = message
            .metadata()
            .keys()
            .map(|k| k.to_lowercase())
            .collect();
        keys.sort_unstable();
        if let Some(pair) = keys.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(refused(
                "Postmark",
                format_args!(
                    "two metadata keys differ only by case ({:?}), and Postmark takes each key once \
                     whatever its case",
                    pair[0]
                ),
            ));
        }
        if message.send_at().is_some() {
            return Err(refused(
                "Postmark",
                "Postmark does not schedule messages, and this one has a send_at",
            ));
        }
        Ok(())
    }

    fn email<'a>(&'a self, message: &'a Message) -> Result<Email<'a>, SendError> {
        self.check(message)?;
        let mut headers: Vec<Header<'_>> = message
            .headers()
            .iter()
            .map(|(name, value)| Header {
                name,
                value: value.clone(),
            })
            .collect();
        let threading = message.threading();
        if let Some(id) = &threading.message_id {
            headers.push(Header {
                name: "Message-ID",
                value: id.clone(),
            });
        }
        if let Some(id) = &threading.in_reply_to {
            headers.push(Header {
                name: "In-Reply-To",
                value: id.clone(),
            });
        }
        if !threading.references.is_empty() {
            headers.push(Header {
                name: "References",
                value: threading.references.join(" "),
            });
        }
        let tracking = message.tracking();
        // The mark a lookup and a webhook find the stored key by (`http::mark`).
        let mut metadata: BTreeMap<&str, Cow<'_, str>> = message
            .metadata()
            .iter()
            .map(|(name, value)| (name.as_str(), Cow::Borrowed(value.as_str())))
            .collect();
        if let Some(key) = message.provider_key() {
            metadata.insert(mark::KEY_DIGEST, Cow::Owned(mark::key_digest(key)));
        }
        Ok(Email {
            from: message.from(),
            // Addresses are RFC 5322 mailboxes, whose display names quote any comma.
            to: message.to().join(", "),
            cc: message.cc().join(", "),
            bcc: message.bcc().join(", "),
            reply_to: message.reply_to().join(", "),
            subject: message.subject(),
            text_body: message.text(),
            html_body: message.html(),
            headers,
            attachments: message
                .attachments()
                .iter()
                .map(|a| Attachment {
                    name: &a.filename,
                    content: base64(&a.content),
                    content_type: &a.content_type,
                })
                .collect(),
            track_opens: tracking.opens,
            track_links: tracking.clicks.then_some("HtmlAndText"),
            metadata,
            message_stream: &self.message_stream,
        })
    }

    fn post(
        &self,
        path: &str,
        body: &impl Serialize,
        max: usize,
    ) -> Result<http::Request<Bytes>, SendError> {
        let body = serde_json::to_vec(body).map_err(|e| {
            SendError::validation(
                codes::INVALID_REQUEST,
                "the message cannot be encoded as JSON",
            )
            .with_source(e)
        })?;
        if body.len() > max {
            return Err(refused(
                "Postmark",
                format_args!(
                    "the request is {} bytes and Postmark takes at most {max}",
                    body.len()
                ),
            ));
        }
        let uri = wire::endpoint(&self.base_url, path, "Postmark")?;
        wire::post(
            uri,
            HeaderName::from_static(SERVER_TOKEN),
            &self.server_token,
            "application/json",
            body,
            "Postmark",
        )
    }
}

/// The outcome of one Postmark result; see the [table](self#limits).
fn outcome(sent: Sent, message: &Message) -> Result<Receipt, SendError> {
    if let Some(error) = error_of(&sent) {
        return Err(error);
    }
    match sent.message_id {
        Some(id) if !id.is_empty() => {
            Ok(Receipt::new(id, POSTMARK).with_accepted(message.recipients()))
        }
        // Postmark said OK: accepted, but without an id to point at.
        _ => Err(SendError::unknown_delivery(
            codes::BAD_RESPONSE,
            "Postmark accepted the message but answered no MessageID; it was probably sent",
        )),
    }
}

/// The error a non-zero `ErrorCode` stands for; `None` for 0 (sent).
fn error_of(sent: &Sent) -> Option<SendError> {
    let detail = truncate(sent.message.as_deref().unwrap_or_default());
    let text = |what: &str| format!("{what} (Postmark ErrorCode {}: {detail})", sent.error_code);
    Some(match sent.error_code {
        0 => return None,
        406 => SendError::permanent(
            codes::INACTIVE_RECIPIENT,
            text(
                "a recipient is inactive at Postmark (hard bounce, spam complaint or \
                 suppression); not sent",
            ),
        ),
        300 | 402 | 403 | 409 | 410 | 411 => SendError::validation(
            codes::VALIDATION_ERROR,
            text("Postmark found the message invalid; not sent"),
        ),
        429 => SendError::retryable(
            codes::RATE_LIMITED,
            text("Postmark is rate limiting; not sent"),
        ),
        100 => SendError::retryable(
            codes::UNAVAILABLE,
            text("Postmark is in maintenance; not sent"),
        ),
        _ => SendError::permanent(
            codes::REJECTED,
            text("Postmark rejected the message; not sent"),
        ),
    })
}

fn postmark_error(response: &http::Response<Bytes>) -> Option<Sent> {
    serde_json::from_slice(response.body()).ok()
}

impl Codec for PostmarkCodec {
    fn encode(&self, message: &Message) -> Result<http::Request<Bytes>, SendError> {
        self.post("/email", &self.email(message)?, POSTMARK_MAX_BODY)
    }

    fn decode(
        &self,
        message: &Message,
        response: &http::Response<Bytes>,
    ) -> Result<Receipt, BoxError> {
        let sent: Sent = serde_json::from_slice(response.body())?;
        if sent.error_code != 0 {
            return Err(format!("Postmark answered 2xx with ErrorCode {}", sent.error_code).into());
        }
        outcome(sent, message).map_err(Into::into)
    }

    /// Postmark's email API takes no idempotency key.
    fn idempotency_key(&self, _key: &str) -> Option<String> {
        None
    }

    fn failure(&self, response: &http::Response<Bytes>) -> Option<SendError> {
        if response.status() != StatusCode::UNPROCESSABLE_ENTITY {
            return None;
        }
        error_of(&postmark_error(response)?)
    }

    fn error_detail(&self, response: &http::Response<Bytes>) -> Option<String> {
        let sent = postmark_error(response)?;
        Some(format!(
            "ErrorCode {}: {}",
            sent.error_code,
            sent.message.unwrap_or_default()
        ))
    }
}

impl BatchCodec for PostmarkCodec {
    fn max_batch(&self) -> usize {
        POSTMARK_MAX_BATCH
    }

    fn batchable(&self, message: &Message) -> Result<(), SendError> {
        self.check(message)
    }

    fn encode_batch(&self, messages: &[Message]) -> Result<http::Request<Bytes>, SendError> {
        let emails = messages
            .iter()
            .map(|message| self.email(message))
            .collect::<Result<Vec<_>, _>>()?;
        self.post("/email/batch", &emails, POSTMARK_MAX_BATCH_BODY)
    }

    fn decode_batch(
        &self,
        messages: &[Message],
        response: &http::Response<Bytes>,
    ) -> Result<Vec<Result<Receipt, SendError>>, BoxError> {
        let results: Vec<Sent> = serde_json::from_slice(response.body())?;
        if results.len() != messages.len() {
            return Err(format!(
                "Postmark answered {} results for {} messages",
                results.len(),
                messages.len()
            )
            .into());
        }
        Ok(results
            .into_iter()
            .zip(messages)
            .map(|(sent, message)| outcome(sent, message))
            .collect())
    }
}
