//! [`SesWebhook`]: Amazon SES events published to an SNS topic and delivered to an HTTPS
//! subscription. SNS signs each message with RSA (`SignatureVersion` 1: SHA-1, 2: SHA-256)
//! over the canonical string AWS documents ("Verifying the signatures of Amazon SNS
//! messages"); the receiver checks it against the certificate **you** configure (PEM), never
//! one fetched from the message's `SigningCertURL`, which it ignores: the configured
//! certificate is the only trust anchor, and the receiver makes no outbound request. AWS
//! rotates its signing certificate: configure the new one beside the old
//! ([`SesEvents::certificate`]) before the old one goes.
//!
//! A certificate outside its validity period (`notBefore`, `notAfter`) is refused when it is
//! configured ([`CertificateError`]); one that expires afterwards no longer vouches for a
//! message: a message that only its key verifies is refused ([`Refused::ExpiredCertificate`],
//! 401, logged at warn with the date), so a missed rotation fails loudly.
//!
//! Checked, in order, before the event is read: the signature (401), the `TopicArn` (the
//! one configured, 401), the `Timestamp` (within [`SNS_TOLERANCE`], one hour, of now, 401:
//! SNS keeps a message's publish time on every retry, and its delivery policies retry for
//! longer than a few minutes). A redelivered `MessageId` is acted on once.
//!
//! A `SubscriptionConfirmation` is answered 200 and acted on no further: the receiver never
//! fetches its `SubscribeURL`. It is logged (`tracing`, target `tower_idempotency::webhook`,
//! warn) and kept ([`SesEvents::subscribe_url`]): confirm the subscription by opening that
//! URL, or with `aws sns confirm-subscription --topic-arn … --token …`.
//!
//! The notification's `Message` is SES's event (configuration-set events, `eventType`, or
//! identity notifications, `notificationType`); the key is the one the message's tag
//! [`idempotency_digest`](crate::http::mark::KEY_DIGEST) names (`mail.tags`), which the
//! [SES codec](crate::http::ses::SesCodec) sets.
//!
//! | SES event | the key |
//! |---|---|
//! | `Send`, `Delivery`, `Bounce`, `Complaint`, `DeliveryDelay`, `Open`, `Click` | settled as delivered with `mail.messageId` |
//! | `Reject`, `Rendering Failure` | freed: SES says it did not send the message |
//! | any other | untouched |

use std::collections::HashMap;
use std::error::Error;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ring::signature::{
    RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY, RSA_PKCS1_2048_8192_SHA256, RsaParameters,
    UnparsedPublicKey,
};
use serde::Deserialize;

use super::{Event, EventKind, Provider, Refused, WebhookReceiver, constant_time_eq};
use crate::http::codec::ses::SES;
use crate::http::codec::wire::rfc3339;
use crate::http::lookup::time::iso8601;
use crate::http::mark::KEY_DIGEST;
use crate::outcome::BoxError;

/// How far an SNS message's `Timestamp` may be from now unless told otherwise: one hour.
pub const SNS_TOLERANCE: Duration = Duration::from_secs(60 * 60);

/// The receiver of SES events through SNS: a [`WebhookReceiver`] of [`SesEvents`].
///
/// ```
/// use tower_idempotency::http::webhook::ses::{SesEvents, SesWebhook};
/// use tower_idempotency::MemoryStore;
///
/// # let pem = "\
/// # -----BEGIN CERTIFICATE-----\n\
/// # MIIDGTCCAgGgAwIBAgIUcC1udoL7+sPmMISduO6pzYj4rXYwDQYJKoZIhvcNAQEL\n\
/// # BQAwGzEZMBcGA1UEAwwQc25zLnRlc3QuaW52YWxpZDAgFw0yNjEyMDQxODUwNTVa\n\
/// # GA8yMTI2MTExMDE4NTA1NVowGzEZMBcGA1UEAwwQc25zLnRlc3QuaW52YWxpZDCC\n\
/// # ASIwDQYJKoZIhvcNAQEBBQADggEPADCCAQoCggEBAMczrDAAguIH5FI2Ev9C5Wld\n\
/// # Ep5kRQEwDNYsy6oJWdhj1deDflBSJI5zNtgJQVUngxEZR8ccMo41llMWdPm43wge\n\
/// # EV+jZEI97990GIWkIFwcpMVlVSmHw/g+yYPduTW59tL0VewcNtxFbEcmJwRYsIgr\n\
/// # V1GVXBy64Si9wpgvB75nNnexwZMl7LkYTGwBn/IvnP2f4sWNV1KaaiGxo59inJC3\n\
/// # tRvJEcYS8qO26WYCpPZ1HXToUZ5TFGkTCN2/qc1CdnAvnpZ/O0NqwRbt50eVMWOW\n\
/// # xweyJ6N4cw40C+RhHhWVgMN/Ut1m9vrIOa1/AzQ3bwdDUj2YOjS5zK0Qst2dPuMC\n\
/// # AwEAAaNTMFEwHQYDVR0OBBYEFH+8v3BflJfgtrVPUI2GepQ4NXlTMB8GA1UdIwQY\n\
/// # MBaAFH+8v3BflJfgtrVPUI2GepQ4NXlTMA8GA1UdEwEB/wQFMAMBAf8wDQYJKoZI\n\
/// # hvcNAQELBQADggEBACJatayWXVLU6mwEFgaXRAIKqwtMvLvO1mOgA7NxEGz9ZVoF\n\
/// # HLidgzHb4vcjDTcEDOD/j8Va2gimLwnWdWu7vdd7V1yBnSnfVeWo16y7IBS9PTm/\n\
/// # hR3yjeO9jThbP4mXHGCV5vomXu6x6AAuLWwOMIZKxpstjLgzfq4/4aC39fdimfdC\n\
/// # pVpA+ENQBwDFFUojNaq19pyQ51rB+t4VPzTxXG64Yzm3s4wEuYMB9dzaa+pdUMRS\n\
/// # n9aUOCACrAW4thdd56vCIs7a1EzgkUHc5gluvDvdSIvD2I3PRfLmWxN/J4Heshah\n\
/// # nr+I6H4pMHWncN2GAgL455Jy+XgGECGZdFAJMD4=\n\
/// # -----END CERTIFICATE-----\n";
/// // The certificate of SNS's SigningCertURL, downloaded and checked once by you.
/// let events = SesEvents::new("arn:aws:sns:eu-west-1:123456789012:ses-events", pem)?;
/// let receiver: SesWebhook<MemoryStore> = SesWebhook::new(MemoryStore::new(), events);
/// // axum: Router::new().route_service("/webhooks/ses", receiver)
/// # let _ = receiver;
/// # Ok::<(), tower_idempotency::BoxError>(())
/// ```
pub type SesWebhook<S> = WebhookReceiver<S, SesEvents>;

/// SES's events through SNS, for a [`WebhookReceiver`]: the topic, the certificates that
/// sign it, and the events that settle.
#[derive(Clone)]
pub struct SesEvents {
    topic_arn: String,
    certificates: Vec<Certificate>,
    tolerance: Duration,
    clock: Clock,
    subscribe_url: Arc<Mutex<Option<String>>>,
}

/// What the receiver reads the time from: the certificates' validity and the tolerance of a
/// message's `Timestamp` are judged by it.
type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

impl SesEvents {
    /// Accepts messages of `topic_arn` signed by the certificate `certificate_pem` (the one
    /// SNS's `SigningCertURL` serves, which you download and check yourself).
    ///
    /// # Errors
    /// [`CertificateError`] when the PEM holds no X.509 certificate with an RSA key, or one
    /// outside its validity period now.
    pub fn new(
        topic_arn: impl Into<String>,
        certificate_pem: &str,
    ) -> Result<Self, CertificateError> {
        Self::with_clock(topic_arn, certificate_pem, SystemTime::now)
    }

    /// As [`new`](Self::new), with the time read from `clock` rather than the system's: the
    /// certificates' validity and the messages' `Timestamp` are judged by it (a test's clock,
    /// or one your service already keeps).
    ///
    /// # Errors
    /// As [`new`](Self::new), judged at `clock`'s time.
    pub fn with_clock(
        topic_arn: impl Into<String>,
        certificate_pem: &str,
        clock: impl Fn() -> SystemTime + Send + Sync + 'static,
    ) -> Result<Self, CertificateError> {
        let clock: Clock = Arc::new(clock);
        let certificate = Certificate::from_pem(certificate_pem, clock())?;
        Ok(Self {
            topic_arn: topic_arn.into(),
            certificates: vec![certificate],
            tolerance: SNS_TOLERANCE,
            clock,
            subscribe_url: Arc::default(),
        })
    }

    /// Accepts messages signed by `certificate_pem` too (AWS's next certificate, while it
    /// rotates).
    ///
    /// # Errors
    /// [`CertificateError`] when the PEM holds no X.509 certificate with an RSA key, or one
    /// outside its validity period now.
    pub fn certificate(mut self, certificate_pem: &str) -> Result<Self, CertificateError> {
        let certificate = Certificate::from_pem(certificate_pem, (self.clock)())?;
        self.certificates.push(certificate);
        Ok(self)
    }

    /// How far a message's `Timestamp` may be from now (default [`SNS_TOLERANCE`]).
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The `SubscribeURL` of the last authenticated `SubscriptionConfirmation`: open it (or
    /// confirm with its token) to start the subscription; the receiver never does.
    pub fn subscribe_url(&self) -> Option<String> {
        self.subscribe_url
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl fmt::Debug for SesEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SesEvents")
            .field("topic_arn", &self.topic_arn)
            .field("certificates", &self.certificates.len())
            .field("tolerance", &self.tolerance)
            .finish_non_exhaustive()
    }
}

/// An SNS message as an HTTPS subscription receives it.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SnsMessage {
    #[serde(rename = "Type")]
    kind: String,
    message_id: String,
    topic_arn: String,
    message: String,
    timestamp: String,
    signature_version: String,
    signature: String,
    #[serde(default)]
    subject: Option<String>,
    #[serde(default)]
    token: Option<String>,
    #[serde(rename = "SubscribeURL", default)]
    subscribe_url: Option<String>,
}

impl SnsMessage {
    /// The string SNS signs, fields in the order AWS documents for the message's type.
    fn string_to_sign(&self) -> Option<String> {
        let mut out = String::with_capacity(self.message.len() + 256);
        let mut field = |name: &str, value: &str| {
            out.push_str(name);
            out.push('\n');
            out.push_str(value);
            out.push('\n');
        };
        match self.kind.as_str() {
            "Notification" => {
                field("Message", &self.message);
                field("MessageId", &self.message_id);
                if let Some(subject) = &self.subject {
                    field("Subject", subject);
                }
                field("Timestamp", &self.timestamp);
                field("TopicArn", &self.topic_arn);
                field("Type", &self.kind);
            }
            "SubscriptionConfirmation" | "UnsubscribeConfirmation" => {
                field("Message", &self.message);
                field("MessageId", &self.message_id);
                field("SubscribeURL", self.subscribe_url.as_deref()?);
                field("Timestamp", &self.timestamp);
                field("Token", self.token.as_deref()?);
                field("TopicArn", &self.topic_arn);
                field("Type", &self.kind);
            }
            _ => return None,
        }
        Some(out)
    }
}

/// SES's event, the `Message` of a notification.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SesEvent {
    #[serde(default)]
    event_type: Option<String>,
    #[serde(default)]
    notification_type: Option<String>,
    mail: Mail,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Mail {
    message_id: String,
    #[serde(default)]
    tags: HashMap<String, Vec<String>>,
}

impl Provider for SesEvents {
    fn transport(&self) -> &'static str {
        SES
    }

    fn authenticate(
        &self,
        _parts: &http::request::Parts,
        body: &[u8],
    ) -> Result<Option<String>, Refused> {
        let message: SnsMessage =
            serde_json::from_slice(body).map_err(|_| Refused::BadSignature)?;
        let signed = message.string_to_sign().ok_or(Refused::BadSignature)?;
        let signature = crate::base64::decode(&message.signature).ok_or(Refused::BadSignature)?;
        let algorithm: &RsaParameters = match message.signature_version.as_str() {
            "1" => &RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY,
            "2" => &RSA_PKCS1_2048_8192_SHA256,
            _ => return Err(Refused::BadSignature),
        };
        let now = (self.clock)();
        let mut verified = false;
        let mut outdated = None;
        for certificate in &self.certificates {
            let verifies = UnparsedPublicKey::new(algorithm, &certificate.key)
                .verify(signed.as_bytes(), &signature)
                .is_ok();
            if verifies && certificate.valid_at(now) {
                verified = true;
                break;
            }
            if verifies {
                outdated.get_or_insert(certificate);
            }
        }
        if !verified {
            if let Some(certificate) = outdated {
                tracing::warn!(
                    target: "tower_idempotency::webhook",
                    topic = %self.topic_arn,
                    not_after = %date(certificate.not_after),
                    "an SNS message signed with the key of an expired certificate was refused: \
                     configure SNS's current certificate"
                );
                return Err(Refused::ExpiredCertificate);
            }
            return Err(Refused::BadSignature);
        }
        if !constant_time_eq(message.topic_arn.as_bytes(), self.topic_arn.as_bytes()) {
            return Err(Refused::WrongTopic);
        }
        let published = iso8601(&message.timestamp).ok_or(Refused::StaleTimestamp)?;
        let skew = match now.duration_since(published) {
            Ok(behind) => behind,
            Err(ahead) => ahead.duration(),
        };
        if skew > self.tolerance {
            return Err(Refused::StaleTimestamp);
        }
        Ok(Some(message.message_id))
    }

    fn event(&self, _parts: &http::request::Parts, body: &[u8]) -> Result<Option<Event>, BoxError> {
        let message: SnsMessage = serde_json::from_slice(body)?;
        match message.kind.as_str() {
            "Notification" => {}
            "SubscriptionConfirmation" => {
                tracing::warn!(
                    target: "tower_idempotency::webhook",
                    topic = %message.topic_arn,
                    subscribe_url = message.subscribe_url.as_deref().unwrap_or_default(),
                    "SNS asks to confirm the subscription: open its SubscribeURL (never fetched here)"
                );
                *self
                    .subscribe_url
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = message.subscribe_url;
                return Ok(None);
            }
            _ => return Ok(None),
        }
        let event: SesEvent = serde_json::from_str(&message.message)?;
        let name = event
            .event_type
            .as_deref()
            .or(event.notification_type.as_deref())
            .unwrap_or_default();
        let kind = match name {
            "Send" | "Delivery" | "Bounce" | "Complaint" | "DeliveryDelay" | "Open" | "Click" => {
                EventKind::Took
            }
            "Reject" | "Rendering Failure" => EventKind::FailedBeforeSending,
            _ => return Ok(None),
        };
        let Some(digest) = event.mail.tags.get(KEY_DIGEST).and_then(|v| v.first()) else {
            return Ok(None);
        };
        Ok(Some(Event::new(
            digest.clone(),
            event.mail.message_id,
            kind,
        )))
    }
}

/// Why a certificate could not be configured.
///
/// Its `Debug` form says what to do as its `Display` form does, so a `main` that returns the
/// error prints the advice.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CertificateError {
    /// The text holds no PEM `CERTIFICATE` block, or one that is not base64.
    NotPem,
    /// The PEM block is not an X.509 certificate with an RSA key and a validity period.
    Malformed,
    /// The certificate's validity ended (`not_after`) before `now`.
    Expired {
        /// The certificate's `notAfter`.
        not_after: SystemTime,
        /// The time it was configured at.
        now: SystemTime,
    },
    /// The certificate's validity starts (`not_before`) after `now`.
    NotYetValid {
        /// The certificate's `notBefore`.
        not_before: SystemTime,
        /// The time it was configured at.
        now: SystemTime,
    },
}

impl CertificateError {
    /// A stable name of the error, for logs and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotPem => "sns_certificate.not_pem",
            Self::Malformed => "sns_certificate.malformed",
            Self::Expired { .. } => "sns_certificate.expired",
            Self::NotYetValid { .. } => "sns_certificate.not_yet_valid",
        }
    }
}

impl fmt::Display for CertificateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotPem => f.write_str(
                "no PEM certificate: give the text SNS's SigningCertURL serves, \
                 -----BEGIN CERTIFICATE----- included",
            ),
            Self::Malformed => f.write_str(
                "not an X.509 certificate with an RSA key: give the one SNS's SigningCertURL serves",
            ),
            Self::Expired { not_after, now } => write!(
                f,
                "the SNS certificate expired at {} (now {}): download the current one from \
                 SNS's SigningCertURL and configure it",
                date(*not_after),
                date(*now)
            ),
            Self::NotYetValid { not_before, now } => write!(
                f,
                "the SNS certificate is not valid before {} (now {}): check the clock, or \
                 configure it once it is valid and keep the current one meanwhile",
                date(*not_before),
                date(*now)
            ),
        }
    }
}

// `main() -> Result<(), BoxError>` prints its error with `Debug`: the advice belongs there too.
impl fmt::Debug for CertificateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CertificateError({}): {self}", self.code())
    }
}

impl Error for CertificateError {}

/// `at` as RFC 3339, or as `SystemTime` writes itself where RFC 3339 cannot.
fn date(at: SystemTime) -> String {
    rfc3339(at).unwrap_or_else(|| format!("{at:?}"))
}

/// A configured certificate: its key, and when it vouches for one.
#[derive(Clone)]
struct Certificate {
    /// The RSA public key (PKCS#1 `RSAPublicKey`, as ring takes it).
    key: Vec<u8>,
    not_before: SystemTime,
    not_after: SystemTime,
}

impl Certificate {
    /// The first certificate in `pem`, valid at `now`.
    fn from_pem(pem: &str, now: SystemTime) -> Result<Self, CertificateError> {
        const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
        const END: &str = "-----END CERTIFICATE-----";
        let start = pem.find(BEGIN).ok_or(CertificateError::NotPem)? + BEGIN.len();
        let end = pem[start..].find(END).ok_or(CertificateError::NotPem)? + start;
        let text: String = pem[start..end].split_whitespace().collect();
        let der = crate::base64::decode(&text).ok_or(CertificateError::NotPem)?;
        let certificate = Self::from_der(&der).ok_or(CertificateError::Malformed)?;
        if now < certificate.not_before {
            return Err(CertificateError::NotYetValid {
                not_before: certificate.not_before,
                now,
            });
        }
        if now > certificate.not_after {
            return Err(CertificateError::Expired {
                not_after: certificate.not_after,
                now,
            });
        }
        Ok(certificate)
    }

    /// The validity and the `RSAPublicKey` inside `subjectPublicKeyInfo` of an X.509
    /// certificate (RFC 5280 4.1).
    fn from_der(der: &[u8]) -> Option<Self> {
        /// `rsaEncryption`, 1.2.840.113549.1.1.1, as DER.
        const RSA_ENCRYPTION: &[u8] = &[
            0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
        ];
        let (certificate, _) = element(der, 0x30)?;
        let (mut tbs, _) = element(certificate, 0x30)?;
        if tbs.first() == Some(&0xa0) {
            tbs = element(tbs, 0xa0)?.1;
        }
        // serialNumber, signature, issuer.
        for tag in [0x02, 0x30, 0x30] {
            tbs = element(tbs, tag)?.1;
        }
        let (validity, rest) = element(tbs, 0x30)?;
        let (not_before, validity) = time(validity)?;
        let (not_after, _) = time(validity)?;
        let (_subject, rest) = element(rest, 0x30)?;
        let (spki, _) = element(rest, 0x30)?;
        let (algorithm, rest) = element(spki, 0x30)?;
        if !algorithm.starts_with(RSA_ENCRYPTION) {
            return None;
        }
        let (bits, _) = element(rest, 0x03)?;
        // A BIT STRING's first byte counts the unused bits of its last: none in a key.
        let key = match bits.split_first()? {
            (0, key) => key.to_vec(),
            _ => return None,
        };
        Some(Self {
            key,
            not_before,
            not_after,
        })
    }

    /// Whether `now` is within the certificate's validity period, both ends included (RFC
    /// 5280 4.1.2.5).
    fn valid_at(&self, now: SystemTime) -> bool {
        self.not_before <= now && now <= self.not_after
    }
}

/// A validity time (RFC 5280 4.1.2.5) at the start of `input`, and what follows it: a
/// `UTCTime` `YYMMDDHHMMSSZ` (years 1950 to 2049) or a `GeneralizedTime` `YYYYMMDDHHMMSSZ`,
/// in UTC with whole seconds, as the RFC requires. `None` for another form, and for a time
/// before 1970, which no SNS certificate holds.
fn time(input: &[u8]) -> Option<(SystemTime, &[u8])> {
    let (&tag, _) = input.split_first()?;
    let (digits, rest) = element(input, tag)?;
    let century = match tag {
        0x17 if digits.first()? < &b'5' => "20",
        0x17 => "19",
        0x18 => "",
        _ => return None,
    };
    let digits = std::str::from_utf8(digits.strip_suffix(b"Z")?).ok()?;
    let full = format!("{century}{digits}");
    if full.len() != 14 || !full.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Read by the receiver's ISO 8601 reader, which checks the fields' ranges.
    let iso = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &full[0..4],
        &full[4..6],
        &full[6..8],
        &full[8..10],
        &full[10..12],
        &full[12..14]
    );
    Some((iso8601(&iso)?, rest))
}

/// The content of the DER element tagged `tag` at the start of `input`, and what follows it.
fn element(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&first, rest) = input.split_first()?;
    if first != tag {
        return None;
    }
    let (&length, rest) = rest.split_first()?;
    let (length, rest) = if length < 0x80 {
        (usize::from(length), rest)
    } else {
        let octets = usize::from(length & 0x7f);
        if octets == 0 || octets > 4 || rest.len() < octets {
            return None;
        }
        let (digits, rest) = rest.split_at(octets);
        let length = digits
            .iter()
            .fold(0usize, |n, &d| (n << 8) | usize::from(d));
        (length, rest)
    };
    (rest.len() >= length).then(|| rest.split_at(length))
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    // A real certificate's key and validity are read in tests/webhooks_ses.rs, which verifies
    // with it.
    #[test]
    fn what_is_not_a_certificate_is_refused_without_panicking() {
        let now = SystemTime::now();
        assert_eq!(
            Certificate::from_pem("no certificate", now).err(),
            Some(CertificateError::NotPem)
        );
        assert_eq!(
            Certificate::from_pem(
                "-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----",
                now
            )
            .err(),
            Some(CertificateError::NotPem)
        );
        assert!(Certificate::from_der(&[0x30, 0x82, 0xff]).is_none());
        assert!(Certificate::from_der(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_none());
        assert!(Certificate::from_der(&[0x30, 0x80]).is_none());
        assert!(Certificate::from_der(&[]).is_none());
    }

    #[test]
    fn validity_times_are_read_in_both_encodings_and_nothing_else() {
        let at = |secs| UNIX_EPOCH + Duration::from_secs(secs);
        let utc = b"\x17\x0d200101000000Zrest";
        assert_eq!(time(utc), Some((at(1_577_836_800), &b"rest"[..])));
        // UTCTime's two-digit years from 50 are the 1900s: before 1970, not read.
        assert_eq!(time(b"\x17\x0d500101000000Z"), None);
        assert_eq!(
            time(b"\x18\x0f21000101000000Z").map(|(t, _)| t),
            Some(at(4_102_444_800))
        );
        for malformed in [
            &b"\x17\x0d2001010000000"[..],  // no Z
            b"\x17\x0b2001010000Z",         // no seconds
            b"\x18\x0d200101000000Z",       // GeneralizedTime with a two-digit year
            b"\x18\x1321000101000000.123Z", // a fraction
            b"\x18\x0f21001301000000Z",     // month 13
            b"\x17\x0d20010100000+Z",       // not digits
            b"\x17\x0d200101",              // shorter than its length
            b"\x04\x0d200101000000Z",       // another type
            b"",
        ] {
            assert_eq!(time(malformed), None, "{malformed:?}");
        }
    }

    #[test]
    fn a_certificate_vouches_from_its_first_to_its_last_second() {
        let (start, end) = (
            UNIX_EPOCH + Duration::from_secs(10),
            UNIX_EPOCH + Duration::from_secs(20),
        );
        let certificate = Certificate {
            key: Vec::new(),
            not_before: start,
            not_after: end,
        };
        assert!(certificate.valid_at(start) && certificate.valid_at(end));
        assert!(!certificate.valid_at(start - Duration::from_secs(1)));
        assert!(!certificate.valid_at(end + Duration::from_secs(1)));
    }

    #[test]
    fn the_string_to_sign_names_the_subject_only_when_present() {
        let mut message = SnsMessage {
            kind: "Notification".into(),
            message_id: "m".into(),
            topic_arn: "t".into(),
            message: "{}".into(),
            timestamp: "2024-01-01T00:00:00.000Z".into(),
            signature_version: "2".into(),
            signature: String::new(),
            subject: None,
            token: None,
            subscribe_url: None,
        };
        assert_eq!(
            message.string_to_sign().unwrap(),
            "Message\n{}\nMessageId\nm\nTimestamp\n2024-01-01T00:00:00.000Z\nTopicArn\nt\nType\nNotification\n"
        );
        message.subject = Some("s".into());
        assert!(
            message
                .string_to_sign()
                .unwrap()
                .contains("MessageId\nm\nSubject\ns\nTimestamp")
        );
        message.kind = "SubscriptionConfirmation".into();
        assert!(
            message.string_to_sign().is_none(),
            "needs its token and URL"
        );
    }
}
