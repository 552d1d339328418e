//! [`ResendCodec`]: Resend's email API (`POST /emails` and `POST /emails/batch`), with its
//! constants and the [`codes`] of the errors only it makes.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, USER_AGENT};
use http::{HeaderValue, Method, Uri};
use serde::{Deserialize, Serialize};

use super::{BatchCodec, Codec};
use crate::base64::encode as base64;
use crate::http::codes as http_codes;
use crate::message::Message;
use crate::outcome::{BoxError, Receipt, SendError};

/// The stable codes of the errors only [`ResendCodec`] makes: what Resend's own 409 answers
/// mean. Its other answers get the transport's codes ([`http::codes`](crate::http::codes)).
pub mod codes {
    /// Resend is still handling a request under this idempotency key (its 409
    /// `concurrent_idempotent_requests`). Unknown delivery.
    pub const IDEMPOTENCY_IN_FLIGHT: &str = "provider.idempotency_in_flight";
    /// Resend holds this idempotency key for a different request (its 409
    /// `invalid_idempotent_request`). Validation.
    pub const IDEMPOTENCY_KEY_REUSED: &str = "provider.idempotency_key_reused";
}

/// Resend's API, where [`ResendCodec::new`] points.
pub const RESEND_API: &str = "https://api.resend.com";

/// The transport name in receipts from [`ResendCodec`].
pub const RESEND: &str = "resend";

/// The most emails Resend's `POST /emails/batch` takes in one request.
pub const RESEND_MAX_BATCH: usize = 100;

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
/// | send_at | `scheduled_at`, RFC 3339 in UTC, whole seconds |
///
/// Tracking flags are not sent: Resend sets tracking per domain. Empty lists and absent
/// fields are left out.
///
/// The answer `{"id": "…"}` becomes `Receipt { id, transport: "resend", accepted }` with the
/// message's to, cc and bcc. A 409 is read by its `name`: `concurrent_idempotent_requests`
/// (Resend is still handling a request under this key) is of unknown delivery,
/// [`provider.idempotency_in_flight`](codes::IDEMPOTENCY_IN_FLIGHT);
/// `invalid_idempotent_request` (the key was used with another payload) is a validation
/// error, [`provider.idempotency_key_reused`](codes::IDEMPOTENCY_KEY_REUSED). Error texts are
/// taken from the body's `name` and `message`.
///
/// # Batches
///
/// As a [`BatchCodec`], it sends to [`POST /emails/batch`](https://resend.com/docs/api-reference/emails/send-batch-emails):
/// a JSON array of the same email objects, at most [`RESEND_MAX_BATCH`] (100) of them, answered
/// `{"data": [{"id": "…"}, …]}` in the order sent. Resend's batch endpoint takes neither
/// attachments nor `scheduled_at`, so a message with attachments or a `send_at` is not
/// [`batchable`](BatchCodec::batchable): it is answered a validation error,
/// [`provider.not_batchable`](http_codes::NOT_BATCHABLE), and the rest of the batch goes
/// without it. That error lands on the message at fault, never on its neighbours, and says
/// what to do: send that message on its own (its key was not used, so the layer has freed it).
///
/// ```
/// use tower_idempotency::http::ResendCodec;
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

    fn endpoint(&self, path: &str) -> Result<Uri, SendError> {
        let base = self.base_url.to_string();
        format!("{}{path}", base.trim_end_matches('/'))
            .parse::<Uri>()
            .ok()
            .filter(|uri| uri.scheme().is_some() && uri.authority().is_some())
            .ok_or_else(|| {
                SendError::validation(
                    http_codes::INVALID_REQUEST,
                    "the Resend base URL is not an absolute http(s) URL",
                )
            })
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
    value: &'a str,
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

fn invalid(text: &'static str) -> impl FnOnce(http::Error) -> SendError {
    move |e| SendError::validation(http_codes::INVALID_REQUEST, text).with_source(e)
}

impl ResendCodec {
    /// The JSON object of one email, as `/emails` and `/emails/batch` both take it.
    fn email<'a>(&self, message: &'a Message) -> Result<Email<'a>, SendError> {
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
        let scheduled_at = match message.send_at() {
            Some(at) => Some(rfc3339(at).ok_or_else(|| {
                SendError::validation(
                    http_codes::INVALID_REQUEST,
                    "the message is scheduled before 1970, which Resend cannot take",
                )
            })?),
            None => None,
        };
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
            tags: message
                .metadata()
                .iter()
                .map(|(name, value)| Tag { name, value })
                .collect(),
            scheduled_at,
        })
    }

    /// A JSON `POST` to `path` with the API key.
    fn post(&self, path: &str, body: &impl Serialize) -> Result<http::Request<Bytes>, SendError> {
        let body = serde_json::to_vec(body).map_err(|e| {
            SendError::validation(
                http_codes::INVALID_REQUEST,
                "the message cannot be encoded as JSON",
            )
            .with_source(e)
        })?;
        let mut authorization = HeaderValue::from_str(&self.authorization).map_err(|e| {
            SendError::validation(
                http_codes::INVALID_REQUEST,
                "the Resend API key cannot be sent as an HTTP header",
            )
            .with_source(e)
        })?;
        authorization.set_sensitive(true);
        http::Request::builder()
            .method(Method::POST)
            .uri(self.endpoint(path)?)
            .header(AUTHORIZATION, authorization)
            .header(CONTENT_TYPE, "application/json")
            .header(
                USER_AGENT,
                concat!("tower-idempotency/", env!("CARGO_PKG_VERSION")),
            )
            .body(Bytes::from(body))
            .map_err(invalid("the Resend request cannot be built"))
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

    fn conflict(&self, response: &http::Response<Bytes>) -> Option<SendError> {
        let error = resend_error(response)?;
        let detail = error.message.unwrap_or_default();
        match error.name.as_deref()? {
            "concurrent_idempotent_requests" => Some(SendError::unknown_delivery(
                codes::IDEMPOTENCY_IN_FLIGHT,
                format!(
                    "Resend is still handling a request under this idempotency key; \
                     the message may have gone (HTTP 409 concurrent_idempotent_requests: {})",
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
        let refused = match (message.attachments().is_empty(), message.send_at()) {
            (false, _) => "attachments",
            (true, Some(_)) => "a schedule (send_at)",
            (true, None) => return Ok(()),
        };
        Err(SendError::validation(
            http_codes::NOT_BATCHABLE,
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

fn truncate(text: &str) -> String {
    text.chars().take(300).collect()
}

/// `at` as RFC 3339 in UTC with whole seconds (`2025-03-01T09:30:00Z`); `None` before 1970.
fn rfc3339(at: SystemTime) -> Option<String> {
    let secs = at.duration_since(UNIX_EPOCH).ok()?.as_secs();
    let (year, month, day) = civil_from_days(secs / 86_400);
    let time = secs % 86_400;
    Some(format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        time / 3600,
        time % 3600 / 60,
        time % 60
    ))
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`,
/// for non-negative day counts).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn rfc3339_formats_utc_dates_with_leap_days() {
        let at = |secs| UNIX_EPOCH + Duration::from_secs(secs);
        assert_eq!(rfc3339(at(0)).unwrap(), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(at(784_111_777)).unwrap(), "1994-11-06T08:49:37Z");
        assert_eq!(rfc3339(at(951_782_400)).unwrap(), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(at(1_709_210_096)).unwrap(), "2024-02-29T12:34:56Z");
        assert_eq!(rfc3339(at(4_102_444_800)).unwrap(), "2100-01-01T00:00:00Z");
        assert_eq!(rfc3339(UNIX_EPOCH - Duration::from_secs(1)), None);
        // Cross-check a day a week for 200 years against httpdate's IMF-fixdate.
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        for day in (0..73_000).step_by(7) {
            let t = at(day * 86_400 + 3_723);
            let imf = httpdate::fmt_http_date(t); // "Sun, 06 Nov 1994 01:02:03 GMT"
            let parts: Vec<&str> = imf.split_whitespace().collect();
            let month = MONTHS.iter().position(|m| *m == parts[2]).unwrap() + 1;
            let expected = format!("{}-{month:02}-{}T{}Z", parts[3], parts[1], parts[4]);
            assert_eq!(rfc3339(t).unwrap(), expected);
        }
    }
}
