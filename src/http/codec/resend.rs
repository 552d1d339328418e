//! [`ResendCodec`]: Resend's email API (`POST /emails` and `POST /emails/batch`), with its
//! documented [limits](self#limits) and the [codes](self#limits) its errors become.
//!
//! # Limits
//!
//! What Resend documents, and the codec checks before it sends: a message that breaks one is
//! a validation error, code [`provider.invalid_request`](codes::INVALID_REQUEST), and is
//! not sent (in a batch, it alone is left out). Sources: the
//! [OpenAPI description](https://github.com/resend/resend-openapi/blob/main/resend.yaml)
//! (`info.version` 1.5.0: `SendEmailRequest`, `Tag`, the `Idempotency-Key` parameter), the
//! [batch page](https://resend.com/docs/api-reference/emails/send-batch-emails) and the
//! [errors page](https://resend.com/docs/api-reference/errors).
//!
//! | rule | constant |
//! |---|---|
//! | `from`, `to` (1 at least) and `subject` are required: a cc-only or bcc-only message is refused | |
//! | at most 50 `to` addresses | [`RESEND_MAX_TO`] |
//! | tag names and values: ASCII letters, digits, `_` and `-`, at most 256 characters; a name is not empty | [`RESEND_MAX_TAG_LEN`] |
//! | `Idempotency-Key`: 1 to 256 characters (a longer or non-ASCII key is sent as its digest) | [`RESEND_MAX_IDEMPOTENCY_KEY`] |
//! | `scheduled_at`: an ISO 8601 time, written RFC 3339 in UTC; nothing before 1970 | |
//! | batch: at most 100 emails, none with attachments or `scheduled_at` | [`RESEND_MAX_BATCH`] |
//! | email only: an SMS ([`Channel::Sms`]) is refused | |
//!
//! And what each documented error becomes:
//!
//! | status | `name` | outcome | code |
//! |---|---|---|---|
//! | 400 | `validation_error`, `invalid_idempotency_key` | validation | [`provider.validation_error`](codes::VALIDATION_ERROR) |
//! | 422 | any (`missing_required_field`, `invalid_from_address`, `invalid_attachment`, …) | validation | [`provider.validation_error`](codes::VALIDATION_ERROR) |
//! | 409 | `concurrent_idempotent_requests` | unknown delivery, **retryable** | [`provider.idempotency_in_flight`](codes::IDEMPOTENCY_IN_FLIGHT) |
//! | 409 | `invalid_idempotent_request` | validation | [`provider.idempotency_key_reused`](codes::IDEMPOTENCY_KEY_REUSED) |
//! | 429 | `daily_quota_exceeded`, `monthly_quota_exceeded` | permanent | [`provider.quota_exceeded`](codes::QUOTA_EXCEEDED) |
//! | 429 | `rate_limit_exceeded` (or none) | retryable, with `Retry-After` | [`provider.rate_limited`](codes::RATE_LIMITED) |
//! | 401, 403, 404, 405, 451 | `missing_api_key`, `invalid_api_key`, `restricted_api_key`, `validation_error`, `not_found`, `method_not_allowed`, `security_error` | permanent | [`provider.rejected`](codes::REJECTED) |
//! | 500 | `application_error`, `internal_server_error` | unknown delivery | [`provider.server_error`](codes::SERVER_ERROR) |
//!
//! Why:
//! - **409 `concurrent_idempotent_requests`**: Resend is still handling an earlier request
//!   under this key, and documents the answer as "try the request again later". That earlier
//!   request may send, so delivery is unknown; but a retry under the same key is safe, as
//!   Resend answers it the earlier request's outcome. The error is therefore of unknown
//!   delivery and [`is_retryable`](SendError::is_retryable): a
//!   [`RetryPolicy`](crate::RetryPolicy) inside the idempotency layer retries it (with its
//!   backoff) under the same key and gets the real outcome; only when every retry meets the
//!   same answer does the layer keep it, as any unknown delivery. It is a healthy Resend's
//!   answer about the key's earlier request, so
//!   [`counts_against_provider`](crate::counts_against_provider) does not count it (its code
//!   starts with [`provider.idempotency_`](crate::outcome::codes::PROVIDER_IDEMPOTENCY_PREFIX)):
//!   a circuit breaker does not open on it.
//! - **Quota exceeded** is not a rate limit: retrying within seconds cannot succeed, and it
//!   says nothing about Resend's health. It is permanent (the message certainly did not go, so
//!   the key is freed; no retry policy retries it; a circuit breaker does not count it), with
//!   its own code so it can be alerted on, and `Retry-After` when Resend gives one.
//! - **422** names a field of the message Resend refused: the message is invalid, not
//!   rejected by the provider's policy.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use http::{StatusCode, Uri};
use serde::{Deserialize, Serialize};

use super::wire::{self, refused, rfc3339, truncate};
use super::{BatchCodec, Codec};
use crate::base64::encode as base64;
use crate::http::mark;
use crate::message::{Channel, Message};
use crate::outcome::{BoxError, Category, Receipt, SendError, codes};

/// Resend's API, where [`ResendCodec::new`] points.
pub const RESEND_API: &str = "https://api.resend.com";

/// The transport name in receipts from [`ResendCodec`].
pub const RESEND: &str = "resend";

/// The most emails Resend's `POST /emails/batch` takes in one request.
pub const RESEND_MAX_BATCH: usize = 100;

/// The most `to` addresses of one email (`maxItems: 50`).
pub const RESEND_MAX_TO: usize = 50;

/// The longest tag name or value, in characters.
pub const RESEND_MAX_TAG_LEN: usize = 256;

/// The longest `Idempotency-Key` Resend takes (`maxLength: 256`).
pub const RESEND_MAX_IDEMPOTENCY_KEY: usize = 256;

/// The [`Codec`] of [Resend](https://resend.com/docs/api-reference/emails/send-email)'s
/// `POST /emails`.
///
/// The request carries `Authorization: Bearer <api key>` and a JSON body:
///
/// | message | JSON field |
/// |---|---|
/// | from, to, cc, bcc, reply_to | `from`, `to`, `cc`, `bcc`, `reply_to` (arrays) |
/// | subject, html, text | `subject`, `html`, `text` |
/// | headers, threading (message id, in-reply-to, references) | `headers` object (`Message-ID`, `In-Reply-To`, `References`) |
/// | attachments | `attachments`: `[{filename, content (base64), content_type}]` |
/// | metadata | `tags`: `[{name, value}]` (Resend accepts ASCII letters, digits, `_` and `-`) |
/// | the stored key (keyed messages) | the tag [`idempotency_digest`](crate::http::mark::KEY_DIGEST) and, unless the message sets its own, the `Message-ID` header, both carrying [`key_digest`](crate::http::mark::key_digest) |
/// | send_at | `scheduled_at`, RFC 3339 in UTC, whole seconds |
///
/// Tracking flags are not sent: Resend sets tracking per domain. Empty lists and absent
/// fields are left out.
///
/// The answer `{"id": "…"}` becomes `Receipt { id, transport: "resend", accepted }` with the
/// message's to, cc and bcc. The `Idempotency-Key` header carries the message's
/// [`provider_key`](Message::provider_key) (under the idempotency layer, the key its store
/// holds), as its SHA-256 digest when it is longer than 256 characters or not ASCII. Before
/// sending, the message is checked against every [documented limit](self#limits); error
/// answers are read by their `name` as the [table](self#limits) says. Error texts are taken
/// from the body's `name` and `message`.
///
/// # Batches
///
/// As a [`BatchCodec`], it sends to [`POST /emails/batch`](https://resend.com/docs/api-reference/emails/send-batch-emails):
/// a JSON array of the same email objects, at most [`RESEND_MAX_BATCH`] (100) of them, answered
/// `{"data": [{"id": "…"}, …]}` in the order sent. Resend validates a batch strictly: one
/// invalid email fails the whole request. So every message is checked alone first
/// ([`batchable`](BatchCodec::batchable)): one that breaks a [limit](self#limits) is answered
/// its validation error, [`provider.invalid_request`](codes::INVALID_REQUEST), and one
/// with attachments or a `send_at` (which the batch endpoint does not take)
/// [`provider.not_batchable`](codes::NOT_BATCHABLE); the rest of the batch goes without
/// it. The error lands on the message at fault, never on its neighbours, and says what to do
/// (fix it, or send it on its own; its key was not used, so the layer has freed it).
///
/// ```
/// use tower_idempotency::http::resend::ResendCodec;
///
/// let codec = ResendCodec::new("re_123").base_url("http://127.0.0.1:8080".parse()?);
/// // The key never shows in Debug output.
/// assert!(!format!("{codec:?}").contains("re_123"));
/// # Ok::<(), http::uri::InvalidUri>(())
/// ```
#[derive(Clone)]
pub struct ResendCodec {
    authorization: String,
    base_url: Uri,
}

impl ResendCodec {
    /// A codec that sends to [`RESEND_API`] with `api_key`.
    pub fn new(api_key: impl AsRef<str>) -> Self {
        Self {
            authorization: format!("Bearer {}", api_key.as_ref()),
            base_url: Uri::from_static(RESEND_API),
        }
    }

    /// Sends to `base_url` instead of [`RESEND_API`] (a test server, a proxy): requests go to
    /// `<base_url>/emails` and `<base_url>/emails/batch`.
    #[must_use]
    pub fn base_url(mut self, base_url: Uri) -> Self {
        self.base_url = base_url;
        self
    }
}

impl fmt::Debug for ResendCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResendCodec")
            .field("api_key", &"<redacted>")
            .field("base_url", &self.base_url)
            .finish()
    }
}

#[derive(Serialize)]
struct Email<'a> {
    from: &'a str,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    to: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    cc: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    bcc: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    reply_to: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    subject: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    html: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    headers: BTreeMap<&'a str, Cow<'a, str>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    attachments: Vec<Attachment<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tags: Vec<Tag<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scheduled_at: Option<String>,
}

#[derive(Serialize)]
struct Attachment<'a> {
    filename: &'a str,
    content: String,
    content_type: &'a str,
}

#[derive(Serialize)]
struct Tag<'a> {
    name: &'a str,
    value: Cow<'a, str>,
}

#[derive(Deserialize)]
struct Created {
    id: String,
}

#[derive(Deserialize)]
struct CreatedBatch {
    data: Vec<Created>,
}

#[derive(Deserialize)]
struct ResendError {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

fn resend_error(response: &http::Response<Bytes>) -> Option<ResendError> {
    serde_json::from_slice(response.body()).ok()
}

/// Whether a tag name or value is in Resend's charset and length.
fn is_tag_text(text: &str) -> bool {
    text.len() <= RESEND_MAX_TAG_LEN
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl ResendCodec {
    /// Checks `message` against Resend's documented limits (the [table](self#limits)).
    fn check(&self, message: &Message) -> Result<(), SendError> {
        if message.channel() != Channel::Email {
            return Err(refused(
                "Resend",
                "Resend sends email, and this message is an SMS",
            ));
        }
        if message.to().is_empty() {
            return Err(refused(
                "Resend",
                "`to` is required and the message has only cc or bcc recipients",
            ));
        }
        if message.to().len() > RESEND_MAX_TO {
            return Err(refused(
                "Resend",
                format_args!(
                    "it has {} `to` addresses and Resend takes at most {RESEND_MAX_TO}",
                    message.to().len()
                ),
            ));
        }
        if message.subject().is_none() {
            return Err(refused("Resend", "`subject` is required"));
        }
        for (name, value) in message.metadata() {
            if name.is_empty() || !is_tag_text(name) || !is_tag_text(value) {
                return Err(refused(
                    "Resend",
                    format_args!(
                        "metadata become tags, whose names and values hold only ASCII \
                         letters, digits, `_` and `-`, at most {RESEND_MAX_TAG_LEN} of them"
                    ),
                ));
            }
        }
        if let Some(at) = message.send_at()
            && rfc3339(at).is_none()
        {
            return Err(refused(
                "Resend",
                "it is scheduled before 1970, which Resend cannot take",
            ));
        }
        Ok(())
    }

    /// The JSON object of one email, as `/emails` and `/emails/batch` both take it.
    fn email<'a>(&self, message: &'a Message) -> Result<Email<'a>, SendError> {
        self.check(message)?;
        let mut headers: BTreeMap<&str, Cow<'_, str>> = message
            .headers()
            .iter()
            .map(|(name, value)| (name.as_str(), Cow::Borrowed(value.as_str())))
            .collect();
        let threading = message.threading();
        if let Some(id) = &threading.message_id {
            headers.insert("Message-ID", Cow::Borrowed(id));
        }
        if let Some(id) = &threading.in_reply_to {
            headers.insert("In-Reply-To", Cow::Borrowed(id));
        }
        if !threading.references.is_empty() {
            headers.insert("References", Cow::Owned(threading.references.join(" ")));
        }
        // The mark a lookup and a webhook find the stored key by (`http::mark`).
        let mut tags: Vec<Tag<'_>> = message
            .metadata()
            .iter()
            .filter(|(name, _)| name.as_str() != mark::KEY_DIGEST)
            .map(|(name, value)| Tag {
                name,
                value: Cow::Borrowed(value),
            })
            .collect();
        if let Some(key) = message.provider_key() {
            let digest = mark::key_digest(key);
            if !headers
                .keys()
                .any(|name| name.eq_ignore_ascii_case("message-id"))
            {
                headers.insert(
                    "Message-ID",
                    Cow::Owned(mark::message_id(&digest, message.from())),
                );
            }
            tags.push(Tag {
                name: mark::KEY_DIGEST,
                value: Cow::Owned(digest),
            });
        }
        Ok(Email {
            from: message.from(),
            to: message.to(),
            cc: message.cc(),
            bcc: message.bcc(),
            reply_to: message.reply_to(),
            subject: message.subject(),
            html: message.html(),
            text: message.text(),
            headers,
            attachments: message
                .attachments()
                .iter()
                .map(|a| Attachment {
                    filename: &a.filename,
                    content: base64(&a.content),
                    content_type: &a.content_type,
                })
                .collect(),
            tags,
            scheduled_at: message.send_at().and_then(rfc3339),
        })
    }

    /// A JSON `POST` to `path` with the API key.
    fn post(&self, path: &str, body: &impl Serialize) -> Result<http::Request<Bytes>, SendError> {
        let uri = wire::endpoint(&self.base_url, path, "Resend")?;
        wire::post_json(uri, &self.authorization, body, "Resend")
    }
}

impl Codec for ResendCodec {
    fn encode(&self, message: &Message) -> Result<http::Request<Bytes>, SendError> {
        self.post("/emails", &self.email(message)?)
    }

    fn decode(
        &self,
        message: &Message,
        response: &http::Response<Bytes>,
    ) -> Result<Receipt, BoxError> {
        let created: Created = serde_json::from_slice(response.body())?;
        if created.id.is_empty() {
            return Err("Resend answered an empty message id".into());
        }
        Ok(Receipt::new(created.id, RESEND).with_accepted(message.recipients()))
    }

    fn idempotency_key(&self, key: &str) -> Option<String> {
        Some(crate::http::fit_idempotency_key(
            key,
            RESEND_MAX_IDEMPOTENCY_KEY,
        ))
    }

    fn conflict(&self, response: &http::Response<Bytes>) -> Option<SendError> {
        let error = resend_error(response)?;
        let detail = error.message.unwrap_or_default();
        match error.name.as_deref()? {
            // Retryable although of unknown delivery: see the module docs.
            "concurrent_idempotent_requests" => Some(SendError::new(
                codes::IDEMPOTENCY_IN_FLIGHT,
                Category::Unknown,
                true,
                format!(
                    "Resend is still handling an earlier request under this idempotency key, \
                     which may send the message; retry later under the same key to get its \
                     outcome (HTTP 409 concurrent_idempotent_requests: {})",
                    truncate(&detail)
                ),
            )),
            "invalid_idempotent_request" => Some(SendError::validation(
                codes::IDEMPOTENCY_KEY_REUSED,
                format!(
                    "Resend holds this idempotency key for a different request; not sent \
                     (HTTP 409 invalid_idempotent_request: {})",
                    truncate(&detail)
                ),
            )),
            _ => None,
        }
    }

    fn failure(&self, response: &http::Response<Bytes>) -> Option<SendError> {
        let status = response.status();
        let error = resend_error(response);
        let name = error.as_ref().and_then(|e| e.name.as_deref());
        let detail = || {
            self.error_detail(response)
                .map(|d| truncate(&d))
                .unwrap_or_default()
        };
        match (status, name) {
            (
                StatusCode::TOO_MANY_REQUESTS,
                Some(name @ ("daily_quota_exceeded" | "monthly_quota_exceeded")),
            ) => Some(SendError::permanent(
                codes::QUOTA_EXCEEDED,
                format!(
                    "the Resend account's sending quota is used up; not sent, and no retry \
                     will send it before the quota resets (HTTP 429 {name}: {})",
                    detail()
                ),
            )),
            (StatusCode::UNPROCESSABLE_ENTITY, _)
            | (StatusCode::BAD_REQUEST, Some("validation_error" | "invalid_idempotency_key")) => {
                Some(SendError::validation(
                    codes::VALIDATION_ERROR,
                    format!(
                        "Resend found the message invalid; not sent (HTTP {status}: {})",
                        detail()
                    ),
                ))
            }
            _ => None,
        }
    }

    fn error_detail(&self, response: &http::Response<Bytes>) -> Option<String> {
        let error = resend_error(response)?;
        match (error.name, error.message) {
            (Some(name), Some(message)) => Some(format!("{name}: {message}")),
            (name, message) => name.or(message),
        }
    }
}

impl BatchCodec for ResendCodec {
    fn max_batch(&self) -> usize {
        RESEND_MAX_BATCH
    }

    fn batchable(&self, message: &Message) -> Result<(), SendError> {
        self.check(message)?;
        let refused = match (message.attachments().is_empty(), message.send_at()) {
            (false, _) => "attachments",
            (true, Some(_)) => "a schedule (send_at)",
            (true, None) => return Ok(()),
        };
        Err(SendError::validation(
            codes::NOT_BATCHABLE,
            format!(
                "Resend's batch endpoint does not take {refused}; this message was left out \
                 of the batch and not sent: send it on its own"
            ),
        ))
    }

    fn encode_batch(&self, messages: &[Message]) -> Result<http::Request<Bytes>, SendError> {
        let emails = messages
            .iter()
            .map(|message| {
                self.batchable(message)?;
                self.email(message)
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.post("/emails/batch", &emails)
    }

    fn decode_batch(
        &self,
        messages: &[Message],
        response: &http::Response<Bytes>,
    ) -> Result<Vec<Result<Receipt, SendError>>, BoxError> {
        let created: CreatedBatch = serde_json::from_slice(response.body())?;
        if created.data.len() != messages.len() {
            return Err(format!(
                "Resend answered {} ids for {} messages",
                created.data.len(),
                messages.len()
            )
            .into());
        }
        if created.data.iter().any(|c| c.id.is_empty()) {
            return Err("Resend answered an empty message id".into());
        }
        Ok(created
            .data
            .into_iter()
            .zip(messages)
            .map(|(created, message)| {
                Ok(Receipt::new(created.id, RESEND).with_accepted(message.recipients()))
            })
            .collect())
    }
}
