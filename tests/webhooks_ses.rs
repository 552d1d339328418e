//! The SES receiver settles the key an SNS-delivered SES event names, after checking SNS's
//! RSA signature against the configured certificate, the topic and the timestamp: a send
//! that timed out is settled by a `Delivery` with no second send, and a repeat replays the
//! SES id; a forged signature, another certificate, a stale timestamp and another topic are
//! refused with the store untouched; a redelivery changes nothing; `Reject` frees the key.
//! A certificate outside its validity is refused when configured, with its dates, and one
//! that expires afterwards verifies no message: the time is the receiver's injected clock.
//! Messages are signed as AWS documents it, with the test key in tests/fixtures/sns.
#![cfg(feature = "ses")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::rand::SystemRandom;
use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use serde_json::json;
use support::http::signing::base64_engine;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::http::mark::{KEY_DIGEST, key_digest};
use tower_idempotency::http::webhook::ses::{CertificateError, SesEvents, SesWebhook};
use tower_idempotency::http::webhook::{Provider, Refused};
use tower_idempotency::store::admin::StoreAdmin;
use tower_idempotency::{IdempotencyLayer, MemoryStore, Message, Receipt, SendError};

const NAMESPACE: &str = "orders";
const TOPIC: &str = "arn:aws:sns:eu-west-1:123456789012:ses-events";
const CERT: &str = include_str!("fixtures/sns/cert.pem");
const OTHER_CERT: &str = include_str!("fixtures/sns/other-cert.pem");
/// `key.pem`'s certificate valid from 2020-01-01 to 2021-01-01 (UTCTime).
const EXPIRED_CERT: &str = include_str!("fixtures/sns/expired-cert.pem");
/// `key.pem`'s certificate valid from 2100-01-01 to 2101-01-01 (GeneralizedTime).
const NOT_YET_VALID_CERT: &str = include_str!("fixtures/sns/not-yet-valid-cert.pem");
const KEY: &[u8] = include_bytes!("fixtures/sns/key.pk8");

/// `SystemTime` as SNS writes it: `2024-05-01T12:00:00.000Z`.
fn timestamp(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.000Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// An SNS Notification of `event` (SES's JSON), signed (version 2) as AWS documents.
fn notification(
    message_id: &str,
    topic: &str,
    at: SystemTime,
    event: &serde_json::Value,
) -> String {
    let message = event.to_string();
    let ts = timestamp(at);
    let subject = "Amazon SES Email Event Notification";
    let signed = format!(
        "Message\n{message}\nMessageId\n{message_id}\nSubject\n{subject}\nTimestamp\n{ts}\nTopicArn\n{topic}\nType\nNotification\n"
    );
    let key = RsaKeyPair::from_pkcs8(KEY).unwrap();
    let mut signature = vec![0; key.public().modulus_len()];
    key.sign(
        &RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        signed.as_bytes(),
        &mut signature,
    )
    .unwrap();
    json!({
        "Type": "Notification",
        "MessageId": message_id,
        "TopicArn": topic,
        "Subject": subject,
        "Message": message,
        "Timestamp": ts,
        "SignatureVersion": "2",
        "Signature": base64_engine::encode(&signature),
        "SigningCertURL": "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-x.pem",
        "UnsubscribeURL": "https://sns.eu-west-1.amazonaws.com/?Action=Unsubscribe",
    })
    .to_string()
}

fn ses_event(kind: &str, stored_key: &str, ses_id: &str) -> serde_json::Value {
    json!({
        "eventType": kind,
        "mail": {
            "messageId": ses_id,
            "tags": { KEY_DIGEST: [key_digest(stored_key)], "ses:operation": ["SendEmail"] },
        },
    })
}

fn email(key: &str) -> Message {
    Message::builder()
        .from("shop@shop.example")
        .to("seller@example.com")
        .subject("New order")
        .text("Sold.")
        .idempotency_key(key)
        .build()
        .unwrap()
}

struct Stack {
    store: MemoryStore,
    layer: IdempotencyLayer,
    receiver: SesWebhook<MemoryStore>,
    sends: Arc<AtomicUsize>,
}

impl Stack {
    fn new(events: SesEvents) -> Self {
        let store = MemoryStore::new();
        let layer = IdempotencyLayer::builder()
            .store(store.clone())
            .namespace(NAMESPACE)
            .build()
            .unwrap();
        let receiver = SesWebhook::new(store.clone(), events);
        Self {
            store,
            layer,
            receiver,
            sends: Arc::default(),
        }
    }

    /// A send whose provider answers as `took` says: `false` times out (unknown delivery).
    async fn send(&self, key: &str, took: bool) -> Result<Receipt, SendError> {
        let sends = Arc::clone(&self.sends);
        let transport = tower::service_fn(move |_: Message| {
            let n = sends.fetch_add(1, Ordering::SeqCst);
            async move {
                if took {
                    Ok(Receipt::new(format!("ses-fresh-{n}"), "ses"))
                } else {
                    Err(SendError::unknown_delivery("provider.timeout", "timed out"))
                }
            }
        });
        ServiceBuilder::new()
            .layer(self.layer.clone())
            .service(transport)
            .oneshot(email(key))
            .await
    }

    async fn post(&self, body: String) -> u16 {
        let request = http::Request::post("/webhooks/ses")
            .header("x-amz-sns-message-type", "Notification")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap();
        let response = self.receiver.clone().oneshot(request).await.unwrap();
        response.status().as_u16()
    }

    async fn stored(&self, key: &str) -> Option<String> {
        self.store
            .inspect(&format!("{NAMESPACE}:{key}"))
            .await
            .unwrap()
            .map(|record| format!("{:?}/{:?}", record.state, record.outcome))
    }
}

fn events() -> SesEvents {
    SesEvents::new(TOPIC, CERT).unwrap()
}

#[tokio::test]
async fn a_send_that_timed_out_is_settled_by_a_delivery_and_never_sent_twice() {
    let stack = Stack::new(events());
    let unknown = stack.send("order:1", false).await.unwrap_err();
    assert!(unknown.delivery_unknown());

    let stored_key = format!("{NAMESPACE}:order:1");
    let body = notification(
        "sns-1",
        TOPIC,
        SystemTime::now(),
        &ses_event("Delivery", &stored_key, "0100-ses-id"),
    );
    assert_eq!(stack.post(body.clone()).await, 200);
    assert_eq!(stack.receiver.stats().delivered(), 1);

    let again = stack.send("order:1", true).await.unwrap();
    assert_eq!(again.id, "0100-ses-id", "the SES id, replayed");
    assert!(again.replayed);
    assert_eq!(stack.sends.load(Ordering::SeqCst), 1, "never sent twice");

    // SNS delivers the same notification again: answered, nothing changes.
    let before = stack.stored("order:1").await;
    assert_eq!(stack.post(body).await, 200);
    assert_eq!(stack.receiver.stats().replayed(), 1);
    assert_eq!(stack.receiver.stats().delivered(), 1);
    assert_eq!(stack.stored("order:1").await, before);
}

#[tokio::test]
async fn forged_foreign_stale_and_other_topic_messages_leave_the_store_untouched() {
    let stack = Stack::new(events());
    stack.send("order:2", false).await.unwrap_err();
    let before = stack.stored("order:2").await;
    let event = ses_event("Delivery", &format!("{NAMESPACE}:order:2"), "0100-x");

    let good = notification("sns-forged", TOPIC, SystemTime::now(), &event);
    let forged = good.replace("0100-x", "0100-y");
    assert_eq!(stack.post(forged).await, 401, "a changed message");

    let other = Stack::new(SesEvents::new(TOPIC, OTHER_CERT).unwrap());
    other.send("order:2", false).await.unwrap_err();
    assert_eq!(other.post(good.clone()).await, 401, "another certificate");
    assert_eq!(other.receiver.stats().delivered(), 0);

    let stale = notification(
        "sns-stale",
        TOPIC,
        SystemTime::now() - Duration::from_secs(2 * 3600),
        &event,
    );
    assert_eq!(stack.post(stale).await, 401, "two hours old");

    let foreign = notification(
        "sns-topic",
        "arn:aws:sns:eu-west-1:123456789012:someone-else",
        SystemTime::now(),
        &event,
    );
    assert_eq!(stack.post(foreign).await, 401, "another topic");

    assert_eq!(
        stack.post("not json".to_owned()).await,
        401,
        "no signature at all"
    );
    assert_eq!(stack.receiver.stats().unauthorized(), 4);
    assert_eq!(stack.receiver.stats().delivered(), 0);
    assert_eq!(stack.stored("order:2").await, before);

    // A signed message whose event does not parse: 400, untouched.
    let broken = notification("sns-broken", TOPIC, SystemTime::now(), &json!({"mail": 1}));
    assert_eq!(stack.post(broken).await, 400);
    assert_eq!(stack.stored("order:2").await, before);

    // The genuine one still settles.
    assert_eq!(stack.post(good).await, 200);
    assert_eq!(stack.receiver.stats().delivered(), 1);
}

#[tokio::test]
async fn a_reject_frees_the_key_and_the_next_send_goes() {
    let stack = Stack::new(events());
    stack.send("order:3", false).await.unwrap_err();
    let body = notification(
        "sns-reject",
        TOPIC,
        SystemTime::now(),
        &ses_event("Reject", &format!("{NAMESPACE}:order:3"), "0100-rejected"),
    );
    assert_eq!(stack.post(body).await, 200);
    assert_eq!(stack.receiver.stats().freed(), 1);
    assert_eq!(stack.stored("order:3").await, None);

    let sent = stack.send("order:3", true).await.unwrap();
    assert!(!sent.replayed);
    assert_eq!(stack.sends.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_signature_version_1_message_verifies_and_a_subscription_is_only_exposed() {
    // Signed with SHA-1 by openssl (ring signs no SHA-1); its timestamp is fixed, so the
    // tolerance is opened for it.
    let v1 = include_str!("fixtures/sns/v1-notification.json");
    let stack = Stack::new(events().tolerance(Duration::from_secs(100 * 365 * 86_400)));
    assert_eq!(stack.post(v1.to_owned()).await, 200);
    assert_eq!(stack.receiver.stats().unauthorized(), 0);
    assert_eq!(
        stack.post(v1.replace("0100-v1-vector", "0100-v2")).await,
        401
    );

    // A subscription confirmation, signed: 200, its URL exposed, nothing fetched or settled.
    let ts = timestamp(SystemTime::now());
    let url = "https://sns.eu-west-1.amazonaws.com/?Action=ConfirmSubscription&Token=tok";
    let signed = format!(
        "Message\nYou have chosen to subscribe.\nMessageId\nsns-sub\nSubscribeURL\n{url}\nTimestamp\n{ts}\nToken\ntok\nTopicArn\n{TOPIC}\nType\nSubscriptionConfirmation\n"
    );
    let key = RsaKeyPair::from_pkcs8(KEY).unwrap();
    let mut signature = vec![0; key.public().modulus_len()];
    key.sign(
        &RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        signed.as_bytes(),
        &mut signature,
    )
    .unwrap();
    let body = json!({
        "Type": "SubscriptionConfirmation", "MessageId": "sns-sub", "Token": "tok",
        "TopicArn": TOPIC, "Message": "You have chosen to subscribe.", "SubscribeURL": url,
        "Timestamp": ts, "SignatureVersion": "2",
        "Signature": base64_engine::encode(&signature),
        "SigningCertURL": "https://sns.eu-west-1.amazonaws.com/x.pem",
    });
    let stack = Stack::new(events());
    assert_eq!(stack.post(body.to_string()).await, 200);
    assert_eq!(
        stack.receiver.provider().subscribe_url().as_deref(),
        Some(url)
    );
    assert_eq!(stack.receiver.stats().ignored(), 1);
}

/// 2020-01-01T00:00:00Z, 2021-01-01T00:00:00Z, 2100-01-01T00:00:00Z, 2101-01-01T00:00:00Z:
/// the fixtures' validity dates, in seconds since the epoch.
const Y2020: u64 = 1_577_836_800;
const Y2021: u64 = 1_609_459_200;
const Y2100: u64 = 4_102_444_800;
const Y2101: u64 = 4_133_980_800;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// A clock the test moves, and the function the receiver reads it through.
fn clock(
    secs: u64,
) -> (
    Arc<AtomicU64>,
    impl Fn() -> SystemTime + Send + Sync + 'static,
) {
    let now = Arc::new(AtomicU64::new(secs));
    let read = Arc::clone(&now);
    (now, move || at(read.load(Ordering::SeqCst)))
}

/// What the receiver answers `body`'s authenticity, without the store.
fn authenticate(events: &SesEvents, body: &str) -> Result<Option<String>, Refused> {
    let (parts, ()) = http::Request::post("/webhooks/ses")
        .body(())
        .unwrap()
        .into_parts();
    events.authenticate(&parts, body.as_bytes())
}

#[test]
fn certificates_outside_their_validity_are_refused_when_configured_with_their_dates() {
    let expired = SesEvents::new(TOPIC, EXPIRED_CERT).unwrap_err();
    let CertificateError::Expired { not_after, now } = expired else {
        panic!("{expired:?}");
    };
    assert_eq!(not_after, at(Y2021));
    assert!(now > at(Y2021));
    assert_eq!(expired.code(), "sns_certificate.expired");
    let advice = expired.to_string();
    assert!(
        advice.contains("expired at 2021-01-01T00:00:00Z") && advice.contains("SigningCertURL"),
        "{advice}"
    );

    let early = SesEvents::new(TOPIC, NOT_YET_VALID_CERT).unwrap_err();
    assert!(
        matches!(early, CertificateError::NotYetValid { not_before, .. } if not_before == at(Y2100)),
        "{early:?}"
    );
    assert!(
        format!("{early:?}").contains("not valid before 2100-01-01T00:00:00Z"),
        "Debug carries the advice: {early:?}"
    );

    // Beside a valid one, as for a rotation, the same checks.
    assert!(matches!(
        events().certificate(EXPIRED_CERT),
        Err(CertificateError::Expired { .. })
    ));
    assert!(matches!(
        events().certificate(NOT_YET_VALID_CERT),
        Err(CertificateError::NotYetValid { .. })
    ));

    // Judged at the receiver's clock, both ends of the period included.
    for secs in [Y2020, Y2021] {
        assert!(SesEvents::with_clock(TOPIC, EXPIRED_CERT, move || at(secs)).is_ok());
    }
    assert!(SesEvents::with_clock(TOPIC, EXPIRED_CERT, || at(Y2021 + 1)).is_err());
    assert!(SesEvents::with_clock(TOPIC, NOT_YET_VALID_CERT, || at(Y2100 - 1)).is_err());
    assert!(SesEvents::with_clock(TOPIC, NOT_YET_VALID_CERT, || at(Y2101)).is_ok());
}

#[tokio::test]
async fn a_message_only_a_certificate_expired_since_configuration_verifies_is_refused() {
    // Configured an hour before the certificate expires; SNS signs with its key meanwhile.
    let (now, read) = clock(Y2021 - 3600);
    let stack = Stack::new(SesEvents::with_clock(TOPIC, EXPIRED_CERT, read).unwrap());
    stack.send("order:5", false).await.unwrap_err();
    let before = stack.stored("order:5").await;
    let event = ses_event("Delivery", &format!("{NAMESPACE}:order:5"), "0100-late");
    let in_time = notification("sns-in-time", TOPIC, at(Y2021 - 60), &event);
    assert_eq!(
        authenticate(stack.receiver.provider(), &in_time),
        Ok(Some("sns-in-time".to_owned()))
    );

    // A second past its notAfter: the same key's signature no longer vouches.
    now.store(Y2021 + 1, Ordering::SeqCst);
    let late = notification("sns-late", TOPIC, at(Y2021 + 1), &event);
    assert_eq!(
        authenticate(stack.receiver.provider(), &late),
        Err(Refused::ExpiredCertificate)
    );
    assert_eq!(stack.post(late.clone()).await, 401);
    assert_eq!(stack.receiver.stats().unauthorized(), 1);
    assert_eq!(stack.receiver.stats().delivered(), 0);
    assert_eq!(stack.stored("order:5").await, before);

    // A message no configured key verifies is still a bad signature, expired or not.
    let forged = late.replace("0100-late", "0100-forged");
    assert_eq!(
        authenticate(stack.receiver.provider(), &forged),
        Err(Refused::BadSignature)
    );
}

#[tokio::test]
async fn a_valid_certificate_beside_an_expired_one_still_verifies() {
    // Configured while the first was valid; the operator adds the next in time.
    let (now, read) = clock(Y2021 - 3600);
    let events = SesEvents::with_clock(TOPIC, EXPIRED_CERT, read).unwrap();
    let real_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    now.store(real_now, Ordering::SeqCst);
    let stack = Stack::new(events.certificate(CERT).unwrap());
    stack.send("order:6", false).await.unwrap_err();

    let body = notification(
        "sns-rotated",
        TOPIC,
        at(real_now),
        &ses_event("Delivery", &format!("{NAMESPACE}:order:6"), "0100-rotated"),
    );
    assert_eq!(stack.post(body).await, 200);
    assert_eq!(stack.receiver.stats().delivered(), 1);
}
