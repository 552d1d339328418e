//! [`TwilioCodec`]: Twilio's Programmable Messaging API (`POST
//! /2010-04-01/Accounts/{AccountSid}/Messages.json`), with its documented [limits](self#limits)
//! and the [codes](self#limits) its errors become.
//!
//! # No idempotency key at Twilio
//!
//! Twilio's Messages resource takes no idempotency key: a request sent twice is two text
//! messages. The codec therefore sends no `Idempotency-Key`
//! ([`Codec::idempotency_key`] answers `None`), and the idempotency store is the only net.
//! What follows from that: never put a [`RetryPolicy`](crate::RetryPolicy) with
//! [`retry_unknown_delivery(true)`](crate::RetryPolicy::retry_unknown_delivery) in front of
//! Twilio (a timeout after the request left would send twice), and keep the store's lease
//! longer than the transport's timeout.
//!
//! # Limits
//!
//! What Twilio documents, and the codec checks before it sends: a message that breaks one is a
//! validation error, code [`provider.invalid_request`](codes::INVALID_REQUEST), and is
//! not sent. Sources: Twilio's
//! [OpenAPI description](https://github.com/twilio/twilio-oai/blob/main/spec/yaml/twilio_api_v2010.yaml)
//! (`CreateMessage`, `CreateMessageRequest`: `From` "a Twilio phone number (E.164),
//! alphanumeric sender ID, … short code", `Body` "up to 1,600 characters", segments of 160
//! GSM-7 or 70 UCS-2 characters), and the
//! [message scheduling](https://www.twilio.com/docs/messaging/features/message-scheduling)
//! page with error [35114](https://www.twilio.com/docs/api/errors/35114) (`SendAt` between 15
//! minutes and 35 days after Twilio receives the request, through a messaging service).
//!
//! | rule | constant |
//! |---|---|
//! | SMS only: an email ([`Channel::Email`]) is refused | |
//! | one `To` per request: an SMS to several numbers is refused (send one message each) | |
//! | `Body` at most 1,600 characters, counted as Twilio counts them ([`sms_length`]: GSM-7 septets, or UTF-16 code units when a character is outside GSM-7, so an emoji counts two) | [`TWILIO_MAX_BODY_CHARS`] |
//! | `From` a number, a short code (5 or 6 digits) or an alphanumeric id; a messaging service goes as `MessagingServiceSid` (`MG` and 32 hex digits) | |
//! | `SendAt` (RFC 3339) only through a messaging service, with `ScheduleType=fixed`, at least 15 minutes and at most 35 days ahead when the codec encodes it | [`TWILIO_MIN_SCHEDULE_AHEAD`], [`TWILIO_MAX_SCHEDULE_AHEAD`] |
//! | the account SID is `AC` and 32 hex digits | |
//!
//! Metadata are not sent. What Twilio's error answers (`{"code", "message", "more_info",
//! "status"}`) become, each code as Twilio's [error list](https://www.twilio.com/docs/api/errors)
//! describes it:
//!
//! | status | `code` | outcome | code |
//! |---|---|---|---|
//! | 429 | 20429 (or none) | retryable, with `Retry-After` | [`provider.rate_limited`](codes::RATE_LIMITED) |
//! | 400 | 21611 (the sender's queue is full), 14107 (30 messages between two numbers in 30 s; 30 s wait), 35125 (the account's scheduled messages at their limit), 63038 (the account's daily limit) | retryable, not sent | [`provider.rate_limited`](codes::RATE_LIMITED) |
//! | 400 | 21610 (the recipient replied STOP) | permanent | [`provider.recipient_unsubscribed`](codes::RECIPIENT_UNSUBSCRIBED) |
//! | 400 | 21408, 21606, 21608, 21612, 21614, 21635, 21661 (region not enabled, sender not able to reach this destination, unverified number on a trial account, unreachable, not a mobile number, a landline, sender not SMS-capable) | permanent | [`provider.rejected`](codes::REJECTED) |
//! | 400 | 21211, 21212, 21602, 21603, 21604, 21617, 35114 (invalid `To` or `From`, `Body`, `From` or `To` missing, body too long, `SendAt` outside the window) | validation | [`provider.validation_error`](codes::VALIDATION_ERROR) |
//! | 400 | any other | permanent (Twilio refused the request: not sent) | [`provider.rejected`](codes::REJECTED) |
//! | 401, 403, 404 | 20003, 20404, … | permanent | [`provider.rejected`](codes::REJECTED) |
//! | 5xx | | as the transport maps it | |

use std::fmt;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::AUTHORIZATION;
use http::{StatusCode, Uri};
use serde::Deserialize;

use super::Codec;
pub use super::segments::{SmsEncoding, SmsLength, sms_length};
use super::wire::{self, refused, rfc3339, truncate};
use crate::message::{Channel, Message, SmsSender};
use crate::outcome::{BoxError, Receipt, SendError, codes};

/// Twilio's API, where [`TwilioCodec::new`] points.
pub const TWILIO_API: &str = "https://api.twilio.com";

/// The transport name in receipts from [`TwilioCodec`].
pub const TWILIO: &str = "twilio";

/// The longest `Body`, in characters as Twilio counts them ([`sms_length`]'s units).
pub const TWILIO_MAX_BODY_CHARS: usize = 1600;

/// The earliest a `SendAt` may be, after Twilio receives the request: 15 minutes.
pub const TWILIO_MIN_SCHEDULE_AHEAD: Duration = Duration::from_secs(15 * 60);

/// The latest a `SendAt` may be, after Twilio receives the request: 35 days.
pub const TWILIO_MAX_SCHEDULE_AHEAD: Duration = Duration::from_secs(35 * 86_400);

/// The [`Codec`] of Twilio's
/// [Messages resource](https://www.twilio.com/docs/messaging/api/message-resource#create-a-message-resource):
/// sends an SMS ([`Message::sms`]) as one form-encoded `POST` with HTTP Basic authentication
/// (account SID and auth token).
///
/// | message | form field |
/// |---|---|
/// | to (one number) | `To` |
/// | from: a number, a short code or a sender id | `From` |
/// | from: a messaging service | `MessagingServiceSid` |
/// | text | `Body` |
/// | send_at | `SendAt` (RFC 3339, UTC) and `ScheduleType=fixed` |
/// | the stored key, with [`status_callback`](Self::status_callback) | `StatusCallback`: the URL with [`idempotency_digest`](crate::http::mark::KEY_DIGEST) in its query |
///
/// The `201 Created` answer's `sid` becomes `Receipt { id, transport: "twilio", accepted }`
/// with the recipient. Twilio takes no idempotency key: see [the module docs](self).
///
/// ```
/// use tower_idempotency::http::twilio::TwilioCodec;
///
/// let codec = TwilioCodec::new("AC0123456789abcdef0123456789abcdef", "auth-token");
/// assert!(!format!("{codec:?}").contains("auth-token"));
/// ```
#[derive(Clone)]
pub struct TwilioCodec {
    account_sid: String,
    authorization: String,
    base_url: Uri,
    status_callback: Option<String>,
}

impl TwilioCodec {
    /// A codec that sends to [`TWILIO_API`] for `account_sid`, authenticated with the
    /// account's `auth_token`.
    pub fn new(account_sid: impl Into<String>, auth_token: impl AsRef<str>) -> Self {
        let account_sid = account_sid.into();
        Self::with_credentials(account_sid.clone(), &account_sid, auth_token.as_ref())
    }

    /// A codec that sends for `account_sid`, authenticated with an API key (`SK…`) and its
    /// secret instead of the auth token.
    pub fn with_api_key(
        account_sid: impl Into<String>,
        api_key_sid: impl AsRef<str>,
        secret: impl AsRef<str>,
    ) -> Self {
        Self::with_credentials(account_sid.into(), api_key_sid.as_ref(), secret.as_ref())
    }

    fn with_credentials(account_sid: String, user: &str, password: &str) -> Self {
        let basic = crate::base64::encode(format!("{user}:{password}").as_bytes());
        Self {
            account_sid,
            authorization: format!("Basic {basic}"),
            base_url: Uri::from_static(TWILIO_API),
            status_callback: None,
        }
    }

    /// Asks Twilio to report each message's status to `url` (`StatusCallback`), with the
    /// [`key_digest`](crate::http::mark::key_digest) of a keyed message's stored key added to
    /// its query as [`idempotency_digest`](crate::http::mark::KEY_DIGEST): the mark Twilio
    /// gives back, as its Messages resource has no field of the sender's. Mount
    /// [`TwilioWebhook`](crate::http::webhook::twilio::TwilioWebhook) there.
    #[must_use]
    pub fn status_callback(mut self, url: Uri) -> Self {
        self.status_callback = Some(url.to_string());
        self
    }

    /// Sends to `base_url` instead of [`TWILIO_API`] (a test server, a proxy).
    #[must_use]
    pub fn base_url(mut self, base_url: Uri) -> Self {
        self.base_url = base_url;
        self
    }

    /// The form fields of `message`, checked against Twilio's [limits](self#limits).
    fn fields<'a>(&self, message: &'a Message) -> Result<Vec<(&'static str, Cow<'a>)>, SendError> {
        let Channel::Sms(sender) = message.channel() else {
            return Err(refused(
                "Twilio",
                "Twilio's Messages API sends SMS, and this message is an email",
            ));
        };
        let [to] = message.to() else {
            return Err(refused(
                "Twilio",
                format_args!(
                    "a request takes one `To` and this SMS has {}; send one message per number",
                    message.to().len()
                ),
            ));
        };
        let body = message.text().unwrap_or_default();
        let length = sms_length(body);
        if length.units > TWILIO_MAX_BODY_CHARS {
            let unit = match length.encoding {
                SmsEncoding::Gsm7 => "GSM-7 characters",
                _ => "UCS-2 characters (an emoji counts two)",
            };
            return Err(refused(
                "Twilio",
                format_args!(
                    "the text is {} {unit} and Twilio takes at most {TWILIO_MAX_BODY_CHARS}",
                    length.units
                ),
            ));
        }
        let mut fields = vec![("To", Cow::Borrowed(to.as_str()))];
        fields.push(match sender {
            SmsSender::MessagingService => ("MessagingServiceSid", Cow::Borrowed(message.from())),
            _ => ("From", Cow::Borrowed(message.from())),
        });
        fields.push(("Body", Cow::Borrowed(body)));
        if let Some(url) = &self.status_callback {
            fields.push((
                "StatusCallback",
                match message.provider_key() {
                    Some(key) => {
                        let separator = if url.contains('?') { '&' } else { '?' };
                        let digest = crate::http::mark::key_digest(key);
                        Cow::Owned(format!(
                            "{url}{separator}{}={digest}",
                            crate::http::mark::KEY_DIGEST
                        ))
                    }
                    None => Cow::Owned(url.clone()),
                },
            ));
        }
        if let Some(at) = message.send_at() {
            if sender != SmsSender::MessagingService {
                return Err(refused(
                    "Twilio",
                    "Twilio schedules only messages sent through a messaging service",
                ));
            }
            check_schedule(at, SystemTime::now())?;
            let at = rfc3339(at).ok_or_else(|| refused("Twilio", "it is scheduled before 1970"))?;
            fields.push(("SendAt", Cow::Owned(at)));
            fields.push(("ScheduleType", Cow::Borrowed("fixed")));
        }
        Ok(fields)
    }

    fn is_account_sid(&self) -> bool {
        self.account_sid
            .strip_prefix("AC")
            .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
    }
}

type Cow<'a> = std::borrow::Cow<'a, str>;

/// Refuses a `send_at` outside Twilio's window, as of `now`: Twilio answers 35114 to one less
/// than [`TWILIO_MIN_SCHEDULE_AHEAD`] or more than [`TWILIO_MAX_SCHEDULE_AHEAD`] ahead.
fn check_schedule(at: SystemTime, now: SystemTime) -> Result<(), SendError> {
    let ahead = at.duration_since(now).unwrap_or(Duration::ZERO);
    if ahead < TWILIO_MIN_SCHEDULE_AHEAD {
        return Err(refused(
            "Twilio",
            "its send_at is less than 15 minutes ahead, and Twilio schedules 15 minutes to \
             35 days ahead; send it now, or later",
        ));
    }
    if ahead > TWILIO_MAX_SCHEDULE_AHEAD {
        return Err(refused(
            "Twilio",
            "its send_at is more than 35 days ahead, and Twilio schedules 15 minutes to 35 \
             days ahead; keep it until then (an outbox) and schedule it nearer the time",
        ));
    }
    Ok(())
}

/// What a Twilio error code answered with HTTP 400 says of the message: the classes of
/// Twilio's error list, one arm each.
fn error_for_code(code: Option<u32>, detail: &str) -> SendError {
    match code {
        // 21611: the sender's queue holds more than 10 hours of messages; 14107: more than 30
        // messages between two numbers in 30 seconds; 35125: 500,000 scheduled messages;
        // 63038: the account's daily limit. Twilio created nothing: a later send may go.
        Some(21611 | 35125 | 63038) => SendError::retryable(
            codes::RATE_LIMITED,
            format!("Twilio is holding back this sender or account; not sent (HTTP 400 {detail})"),
        ),
        Some(14107) => SendError::retryable(
            codes::RATE_LIMITED,
            format!("Twilio is holding back messages between these numbers; not sent (HTTP 400 {detail})"),
        )
        .with_retry_after(Duration::from_secs(30)),
        Some(21610) => SendError::permanent(
            codes::RECIPIENT_UNSUBSCRIBED,
            format!(
                "the recipient opted out of messages from this sender; not sent (HTTP 400 {detail})"
            ),
        ),
        Some(21408 | 21606 | 21608 | 21612 | 21614 | 21635 | 21661) => SendError::permanent(
            codes::REJECTED,
            format!("Twilio cannot deliver to this number from this sender; not sent (HTTP 400 {detail})"),
        ),
        Some(21211 | 21212 | 21602 | 21603 | 21604 | 21617 | 35114) => SendError::validation(
            codes::VALIDATION_ERROR,
            format!("Twilio refused the message's parameters; not sent (HTTP 400 {detail})"),
        ),
        // A 400 is a refusal of the request: nothing was created, whatever the code means.
        _ => SendError::permanent(
            codes::REJECTED,
            format!("Twilio refused the message; not sent (HTTP 400 {detail})"),
        ),
    }
}

impl fmt::Debug for TwilioCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TwilioCodec")
            .field("account_sid", &self.account_sid)
            .field("auth", &"<redacted>")
            .field("base_url", &self.base_url)
            .field("status_callback", &self.status_callback)
            .finish()
    }
}

#[derive(Deserialize)]
struct Created {
    sid: String,
}

#[derive(Deserialize)]
struct TwilioError {
    #[serde(default)]
    code: Option<u32>,
    #[serde(default)]
    message: Option<String>,
}

fn twilio_error(response: &http::Response<Bytes>) -> Option<TwilioError> {
    serde_json::from_slice(response.body()).ok()
}

impl Codec for TwilioCodec {
    fn encode(&self, message: &Message) -> Result<http::Request<Bytes>, SendError> {
        let fields = self.fields(message)?;
        if !self.is_account_sid() {
            return Err(refused(
                "Twilio",
                "the account SID is not `AC` and 32 hex digits",
            ));
        }
        let path = format!("/2010-04-01/Accounts/{}/Messages.json", self.account_sid);
        let uri = wire::endpoint(&self.base_url, &path, "Twilio")?;
        let pairs: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_ref())).collect();
        wire::post(
            uri,
            AUTHORIZATION,
            &self.authorization,
            "application/x-www-form-urlencoded",
            wire::form(&pairs),
            "Twilio",
        )
    }

    fn decode(
        &self,
        message: &Message,
        response: &http::Response<Bytes>,
    ) -> Result<Receipt, BoxError> {
        let created: Created = serde_json::from_slice(response.body())?;
        if created.sid.is_empty() {
            return Err("Twilio answered an empty message sid".into());
        }
        Ok(Receipt::new(created.sid, TWILIO).with_accepted(message.to()))
    }

    /// Twilio's Messages resource takes no idempotency key.
    fn idempotency_key(&self, _key: &str) -> Option<String> {
        None
    }

    fn failure(&self, response: &http::Response<Bytes>) -> Option<SendError> {
        if response.status() != StatusCode::BAD_REQUEST {
            return None;
        }
        let code = twilio_error(response).and_then(|e| e.code);
        let detail = self
            .error_detail(response)
            .map(|d| truncate(&d))
            .unwrap_or_default();
        Some(error_for_code(code, &detail))
    }

    fn error_detail(&self, response: &http::Response<Bytes>) -> Option<String> {
        let error = twilio_error(response)?;
        match (error.code, error.message) {
            (Some(code), Some(message)) => Some(format!("{code}: {message}")),
            (Some(code), None) => Some(code.to_string()),
            (None, message) => message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_goes_only_within_twilios_window() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let minute = Duration::from_secs(60);
        for (ahead, goes) in [
            (Duration::ZERO, false),
            (TWILIO_MIN_SCHEDULE_AHEAD - Duration::from_secs(1), false),
            (TWILIO_MIN_SCHEDULE_AHEAD, true),
            (TWILIO_MIN_SCHEDULE_AHEAD + minute, true),
            (TWILIO_MAX_SCHEDULE_AHEAD, true),
            (TWILIO_MAX_SCHEDULE_AHEAD + Duration::from_secs(1), false),
        ] {
            let result = check_schedule(now + ahead, now);
            assert_eq!(result.is_ok(), goes, "{ahead:?}: {result:?}");
            if let Err(error) = result {
                assert_eq!(error.code(), codes::INVALID_REQUEST);
                assert!(error.message().contains("15 minutes to 35 days"), "{error}");
            }
        }
        // In the past: refused, not an overflow.
        assert!(check_schedule(now - minute, now).is_err());
    }

    #[test]
    fn every_listed_twilio_code_has_its_class_and_an_unlisted_one_is_a_refusal() {
        use crate::outcome::Category;
        for (code, expected, category) in [
            (21611, codes::RATE_LIMITED, Category::Retryable),
            (14107, codes::RATE_LIMITED, Category::Retryable),
            (35125, codes::RATE_LIMITED, Category::Retryable),
            (21610, codes::RECIPIENT_UNSUBSCRIBED, Category::Permanent),
            (21606, codes::REJECTED, Category::Permanent),
            (21211, codes::VALIDATION_ERROR, Category::Validation),
            (35114, codes::VALIDATION_ERROR, Category::Validation),
            (29999, codes::REJECTED, Category::Permanent),
        ] {
            let error = error_for_code(Some(code), "x");
            assert_eq!(
                (error.code(), error.category()),
                (expected, category),
                "{code}"
            );
            assert!(!error.delivery_unknown(), "{code}: a 400 created nothing");
        }
        assert_eq!(
            error_for_code(Some(14107), "x").retry_after(),
            Some(Duration::from_secs(30))
        );
        assert_eq!(error_for_code(None, "x").code(), codes::REJECTED);
    }
}
