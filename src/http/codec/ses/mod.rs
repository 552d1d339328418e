//! [`SesCodec`]: Amazon SES API v2 `SendEmail` (`POST /v2/email/outbound-emails`), signed
//! with AWS Signature Version 4, sent by [`HttpTransport`](crate::http::HttpTransport).
//! Enabled by the `ses` feature.
//!
//! SES has no idempotency key of its own ("none built in; you own it"): the idempotency layer
//! is the only net in front of it, so what each SES answer means for the key matters more
//! here than anywhere.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use aws_credential_types::Credentials;
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_idempotency::http::HttpTransport;
//! use tower_idempotency::http::ses::SesCodec;
//! use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message, RetryPolicy};
//!
//! # #[tokio::main] async fn main() -> Result<(), BoxError> {
//! // SES is https: build the client over an HTTPS connector such as hyper-rustls.
//! let client = ServiceBuilder::new()
//!     .map_request(|request: http::Request<Bytes>| request.map(Full::new))
//!     .service(Client::builder(TokioExecutor::new()).build_http());
//! // Or the credentials your AWS SDK's provider gives (`aws-config`).
//! let credentials = Credentials::new(
//!     std::env::var("AWS_ACCESS_KEY_ID")?,
//!     std::env::var("AWS_SECRET_ACCESS_KEY")?,
//!     std::env::var("AWS_SESSION_TOKEN").ok(),
//!     None,
//!     "environment",
//! );
//! let codec = SesCodec::new("eu-west-1", credentials).configuration_set("transactional");
//!
//! let ses = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::builder().store(MemoryStore::new()).build()?)
//!     .layer(tower::retry::RetryLayer::new(RetryPolicy::new()))
//!     .timeout(Duration::from_secs(10))
//!     .service(HttpTransport::new(client, codec));
//!
//! let message = Message::builder()
//!     .from("orders@marketplace.example")
//!     .to("seller@example.com")
//!     .subject("New order ord_20481")
//!     .text("Vintage Nikon FM2 just sold.")
//!     .idempotency_key("order.created:ord_20481:email")
//!     .build()?;
//! let receipt = ses.oneshot(message).await?;
//! println!("SES message id {}", receipt.id);
//! # Ok(()) }
//! ```
//!
//! # Why SigV4 over `HttpTransport`, not the `aws-sdk-sesv2` client
//!
//! - **What happened, told apart.** [`HttpTransport`](crate::http::HttpTransport) knows
//!   whether a request never left (a refused connect: the key is freed) or may have been
//!   written (a timeout, a reset: the key is kept). The SDK folds both into its own
//!   `SdkError` variants, dispatch and timeout errors whose meaning changed across releases.
//! - **Retries in one place.** The SDK retries by itself (standard mode, three attempts),
//!   inside the stack, where a retried throttle or a 500 is hidden from the idempotency layer,
//!   its retry policy and a circuit breaker. Here every attempt is one the stack chose.
//! - **One HTTP client** for every provider, the user's, with its pool, TLS and proxy.
//! - **Weight.** The SDK brings its runtime, its HTTP stack and its config loader; this codec
//!   needs the signing crate alone (`aws-sigv4`, the SDK's own signer).
//!
//! What a Rust AWS user has carries over: [`Credentials`](aws_credential_types::Credentials)
//! from `aws-credential-types`, the type the SDK's credentials providers give, in a
//! [`SesCredentials`] that can be replaced while the codec runs when they are temporary.
//!
//! # The request
//!
//! | message | `SendEmail` member |
//! |---|---|
//! | from | `FromEmailAddress` |
//! | to, cc, bcc | `Destination`: `ToAddresses`, `CcAddresses`, `BccAddresses` |
//! | reply_to | `ReplyToAddresses` |
//! | subject, text, html, headers, in-reply-to, references | `Content.Simple`: `Subject`, `Body.Text`, `Body.Html`, `Headers` (UTF-8) |
//! | with attachments, more than [`SES_MAX_HEADERS`] headers, or its own `Message-ID` | `Content.Raw.Data`: the MIME message (lettre's builder), base64, its `Message-ID` derived from the stored key as the SMTP transport's is |
//! | metadata | `EmailTags`, one tag each |
//! | the stored key ([`provider_key`](crate::Message::provider_key)) | the tag [`SES_IDEMPOTENCY_TAG`] = [`ses_key_tag`] (hex SHA-256), and the tag [`KEY_DIGEST`](crate::http::mark::KEY_DIGEST) = [`key_digest`](crate::http::mark::key_digest), the mark the SNS receiver finds the key by |
//! | the codec's configuration set | `ConfigurationSetName` |
//!
//! The key rides as a tag, not as a header: SES writes a message's tags into every event it
//! publishes for it (sends, deliveries, bounces, complaints through a configuration set's SNS
//! or EventBridge destination), so an event maps back to the key by
//! `mail.tags["idempotency-key"]`. Tags take only `[A-Za-z0-9_-]`, at most 256 characters, so
//! the tag holds the key's SHA-256 in hex, which also keeps a key with personal data out of
//! SES's event stream. Tracking flags are not sent: SES tracks opens and clicks per
//! configuration set.
//!
//! # Limits
//!
//! What SES documents, and the codec checks before it sends: a message that breaks one is a
//! validation error, code [`provider.invalid_request`](codes::INVALID_REQUEST), and is not
//! sent. Sources: the `sesv2` service description (2019-09-27) AWS publishes with its SDKs,
//! and the [quotas page](https://docs.aws.amazon.com/ses/latest/dg/quotas.html).
//!
//! | rule | constant |
//! |---|---|
//! | email only, sent now: an SMS or a `send_at` is refused (SES does not schedule) | |
//! | at most 50 recipients in `To`, `Cc` and `Bcc` together | [`SES_MAX_RECIPIENTS`] |
//! | tag names and values: ASCII letters, digits, `_` and `-`, at most 256 characters; a metadata name [`SES_IDEMPOTENCY_TAG`] is refused | [`SES_MAX_TAG_LEN`] |
//! | a message of at most 40 MB, attachments included (as MIME, before base64) | [`SES_MAX_MESSAGE`] |
//!
//! What SES's errors become (the errors `SendEmail` declares, and the throttling and
//! authentication errors every AWS API may answer):
//!
//! | status | error | outcome | code |
//! |---|---|---|---|
//! | 429 | `TooManyRequestsException` | retryable (with `Retry-After` when given) | [`provider.rate_limited`](codes::RATE_LIMITED) |
//! | 400 | `Throttling`, `ThrottlingException` (a sending rate) | retryable | [`provider.rate_limited`](codes::RATE_LIMITED) |
//! | 400 | `Throttling` naming a quota, `LimitExceededException` | permanent | [`provider.quota_exceeded`](codes::QUOTA_EXCEEDED) |
//! | 400 | `AccountSuspendedException`, `SendingPausedException` | permanent | [`provider.sending_paused`](codes::SENDING_PAUSED) |
//! | 400 | `MailFromDomainNotVerifiedException`, `MessageRejected` for an unverified identity | permanent | [`provider.identity_not_verified`](codes::IDENTITY_NOT_VERIFIED) |
//! | 400 | `MessageRejected` (content: a virus, a header SES refuses) | permanent | [`provider.rejected`](codes::REJECTED) |
//! | 400 | `BadRequestException` | validation | [`provider.validation_error`](codes::VALIDATION_ERROR) |
//! | 4xx | `NotFoundException` (a configuration set), authentication errors | permanent | [`provider.rejected`](codes::REJECTED) |
//! | 500 | `InternalFailure` | unknown delivery | [`provider.server_error`](codes::SERVER_ERROR) |
//! | 503 | `ServiceUnavailable` | retryable | [`provider.unavailable`](codes::UNAVAILABLE) |
//! | | a timeout or a lost connection after the request left | unknown delivery | [`provider.timeout`](codes::TIMEOUT), [`provider.unknown`](codes::UNKNOWN) |
//!
//! Every permanent and validation answer above means SES did not take the message: the key is
//! freed, and a later send under it goes. The name is read from `x-amzn-ErrorType`, else from
//! the body (`__type` or `code` in JSON, `<Code>` in XML).
//!
//! # Batches
//!
//! SES's `SendBulkEmail` sends templates only, so messages go one request each: wrap the
//! transport in [`PerMessage`](crate::batch::PerMessage) to give it the batch API.

mod errors;
mod request;

use std::fmt;
use std::time::SystemTime;

use bytes::Bytes;
use http::Uri;
use serde::Deserialize;

use super::Codec;
use super::wire::{self, refused};
use crate::base64::encode as base64;
pub use crate::http::sigv4::SesCredentials;
use crate::http::sigv4::sign_request;
use crate::message::{Channel, Message};
use crate::outcome::{BoxError, Receipt, SendError, codes};
pub use request::ses_key_tag;
use request::{Content, Destination, Raw, SendEmail};

/// The transport name in receipts from [`SesCodec`].
pub const SES: &str = "ses";

/// The tag that carries the message's stored key (as [`ses_key_tag`]).
pub const SES_IDEMPOTENCY_TAG: &str = "idempotency-key";

/// The most recipients in `To`, `Cc` and `Bcc` together.
pub const SES_MAX_RECIPIENTS: usize = 50;

/// The longest tag name or value.
pub const SES_MAX_TAG_LEN: usize = 256;

/// The most header fields of a `Simple` message; a message with more goes raw.
pub const SES_MAX_HEADERS: usize = 15;

/// The largest message SES v2 takes, attachments included: 40 MB.
pub const SES_MAX_MESSAGE: usize = 40_000_000;

/// The name SES is signed under.
const SIGNING_NAME: &str = "ses";

/// The [`Codec`] of Amazon SES API v2 `SendEmail` (see the [module docs](self)).
///
/// ```
/// use aws_credential_types::Credentials;
/// use tower_idempotency::http::ses::SesCodec;
///
/// let codec = SesCodec::new("eu-west-1", Credentials::new("AKID", "secret", None, None, "static"))
///     .configuration_set("transactional");
/// assert_eq!(codec.endpoint().to_string(), "https://email.eu-west-1.amazonaws.com/");
/// ```
#[derive(Clone)]
pub struct SesCodec {
    region: String,
    credentials: SesCredentials,
    configuration_set: Option<String>,
    base_url: Uri,
}

impl SesCodec {
    /// A codec that sends through SES in `region` (`eu-west-1`), signed with `credentials`.
    pub fn new(region: impl Into<String>, credentials: impl Into<SesCredentials>) -> Self {
        let region = region.into();
        let base_url = format!("https://email.{region}.amazonaws.com/")
            .parse()
            .unwrap_or_else(|_| Uri::from_static("https://email.invalid/"));
        Self {
            region,
            credentials: credentials.into(),
            configuration_set: None,
            base_url,
        }
    }

    /// Sends every message under the configuration set `name` (its event destinations publish
    /// the message's events, tags included).
    #[must_use]
    pub fn configuration_set(mut self, name: impl Into<String>) -> Self {
        self.configuration_set = Some(name.into());
        self
    }

    /// Sends to `base_url` instead of the region's endpoint (a VPC endpoint, a test server);
    /// requests are still signed for the codec's region.
    #[must_use]
    pub fn base_url(mut self, base_url: Uri) -> Self {
        self.base_url = base_url;
        self
    }

    /// Where requests go: the region's endpoint, or the [`base_url`](Self::base_url).
    pub fn endpoint(&self) -> &Uri {
        &self.base_url
    }

    /// The credentials the codec signs with, to [`replace`](SesCredentials::replace) them.
    pub fn credentials(&self) -> &SesCredentials {
        &self.credentials
    }

    /// Checks `message` against SES's documented limits (the [table](self#limits)).
    fn check(message: &Message) -> Result<(), SendError> {
        if message.channel() != Channel::Email {
            return Err(refused(
                "Amazon SES",
                "SES sends email, and this message is an SMS",
            ));
        }
        if message.send_at().is_some() {
            return Err(refused(
                "Amazon SES",
                "SES sends at once and takes no schedule (send_at)",
            ));
        }
        let recipients = message.to().len() + message.cc().len() + message.bcc().len();
        if recipients > SES_MAX_RECIPIENTS {
            return Err(refused(
                "Amazon SES",
                format_args!(
                    "`To`, `Cc` and `Bcc` hold {recipients} addresses together and SES takes at \
                     most {SES_MAX_RECIPIENTS} per message"
                ),
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for SesCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SesCodec")
            .field("region", &self.region)
            .field("credentials", &self.credentials)
            .field("configuration_set", &self.configuration_set)
            .field("base_url", &self.base_url)
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Sent {
    message_id: String,
}

impl Codec for SesCodec {
    fn encode(&self, message: &Message) -> Result<http::Request<Bytes>, SendError> {
        Self::check(message)?;
        let content = match request::simple(message) {
            Some(simple) => Content::Simple(simple),
            None => {
                let id = message
                    .provider_key()
                    .map(|key| crate::mime::message_id_for_key(key, message.from()));
                let mime = crate::mime::build(message, id, "Amazon SES")?.formatted();
                if mime.len() > SES_MAX_MESSAGE {
                    return Err(refused(
                        "Amazon SES",
                        format_args!(
                            "the message is {} bytes as MIME and SES takes at most \
                             {SES_MAX_MESSAGE}",
                            mime.len()
                        ),
                    ));
                }
                Content::Raw(Raw {
                    data: base64(&mime),
                })
            }
        };
        let body = SendEmail {
            from_email_address: message.from(),
            destination: Destination {
                to_addresses: message.to(),
                cc_addresses: message.cc(),
                bcc_addresses: message.bcc(),
            },
            reply_to_addresses: message.reply_to(),
            content,
            email_tags: request::tags(message)?,
            configuration_set_name: self.configuration_set.as_deref(),
        };
        let body = serde_json::to_vec(&body).map_err(|e| {
            SendError::validation(
                codes::INVALID_REQUEST,
                "the message cannot be encoded as JSON",
            )
            .with_source(e)
        })?;
        let uri = wire::endpoint(&self.base_url, "/v2/email/outbound-emails", "Amazon SES")?;
        let mut request = http::Request::post(uri)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Bytes::from(body))
            .map_err(|e| {
                SendError::validation(
                    codes::INVALID_REQUEST,
                    "the Amazon SES request cannot be built",
                )
                .with_source(e)
            })?;
        sign_request(
            &mut request,
            &self.credentials,
            &self.region,
            SIGNING_NAME,
            SystemTime::now(),
        )?;
        Ok(request)
    }

    fn decode(
        &self,
        message: &Message,
        response: &http::Response<Bytes>,
    ) -> Result<Receipt, BoxError> {
        let sent: Sent = serde_json::from_slice(response.body())?;
        if sent.message_id.is_empty() {
            return Err("Amazon SES answered an empty MessageId".into());
        }
        Ok(Receipt::new(sent.message_id, SES).with_accepted(message.recipients()))
    }

    /// SES takes no idempotency key: the stored key rides as a message tag instead.
    fn idempotency_key(&self, _key: &str) -> Option<String> {
        None
    }

    fn failure(&self, response: &http::Response<Bytes>) -> Option<SendError> {
        errors::classify(&errors::read(response), response.status())
    }

    fn error_detail(&self, response: &http::Response<Bytes>) -> Option<String> {
        let error = errors::read(response);
        match (error.name, error.text) {
            (Some(name), Some(text)) => Some(format!("{name}: {text}")),
            (name, text) => name.or(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use aws_credential_types::Credentials;

    use super::*;
    use crate::Attachment;

    fn codec() -> SesCodec {
        SesCodec::new(
            "us-east-1",
            Credentials::new("AKID", "secret", None, None, "static"),
        )
        .configuration_set("transactional")
    }

    fn body(request: &http::Request<Bytes>) -> serde_json::Value {
        serde_json::from_slice(request.body()).unwrap()
    }

    #[test]
    fn a_simple_message_carries_its_key_as_a_tag_and_is_signed() {
        let message = Message::builder()
            .from("shop@example.com")
            .to("a@example.com")
            .bcc("b@example.com")
            .subject("Hi")
            .text("Hello")
            .metadata("order", "ord_1")
            .idempotency_key("welcome:a@example.com")
            .build()
            .unwrap();
        let request = codec().encode(&message).unwrap();
        assert_eq!(
            request.uri(),
            "https://email.us-east-1.amazonaws.com/v2/email/outbound-emails"
        );
        let authorization = request.headers()["authorization"].to_str().unwrap();
        assert!(authorization.starts_with("AWS4-HMAC-SHA256 Credential=AKID/"));
        assert!(authorization.contains("/us-east-1/ses/aws4_request"));
        let body = body(&request);
        assert_eq!(body["FromEmailAddress"], "shop@example.com");
        assert_eq!(body["Destination"]["BccAddresses"][0], "b@example.com");
        assert_eq!(body["Content"]["Simple"]["Subject"]["Data"], "Hi");
        assert_eq!(body["Content"]["Simple"]["Body"]["Text"]["Data"], "Hello");
        assert_eq!(body["ConfigurationSetName"], "transactional");
        let tags = body["EmailTags"].as_array().unwrap();
        assert_eq!(tags[0]["Name"], "order");
        assert_eq!(tags[1]["Name"], SES_IDEMPOTENCY_TAG);
        assert_eq!(tags[1]["Value"], ses_key_tag("welcome:a@example.com"));
        assert_eq!(tags[2]["Name"], crate::http::mark::KEY_DIGEST);
        assert_eq!(
            tags[2]["Value"],
            crate::http::mark::key_digest("welcome:a@example.com")
        );
        assert!(!body.to_string().contains("welcome:a@example.com"));
    }

    #[test]
    fn attachments_go_as_a_raw_mime_message() {
        let message = Message::builder()
            .from("shop@example.com")
            .to("a@example.com")
            .subject("Invoice")
            .text("attached")
            .attachment(Attachment::new("i.pdf", "application/pdf", &b"%PDF"[..]))
            .build()
            .unwrap();
        let body = body(&codec().encode(&message).unwrap());
        assert!(body["Content"].get("Simple").is_none());
        let data = body["Content"]["Raw"]["Data"].as_str().unwrap();
        assert!(!data.is_empty());
        assert_eq!(body["Destination"]["ToAddresses"][0], "a@example.com");
    }

    #[test]
    fn what_ses_cannot_take_is_refused_unsent() {
        let base = || Message::builder().from("shop@example.com").text("x");
        let mut many = base();
        for i in 0..=SES_MAX_RECIPIENTS {
            many = many.to(format!("r{i}@example.com"));
        }
        let bad_tag = base().to("a@example.com").metadata("order id", "1");
        let scheduled = base()
            .to("a@example.com")
            .send_at(SystemTime::now() + std::time::Duration::from_secs(60));
        for builder in [many, bad_tag, scheduled] {
            let error = codec().encode(&builder.build().unwrap()).unwrap_err();
            assert_eq!(error.code(), codes::INVALID_REQUEST);
        }
    }
}
