//! SMS through Twilio: `TwilioCodec` against a fake Twilio that enforces Twilio's published
//! `CreateMessage` schema (tests/support/http/twilio.rs). An SMS is sent once and replayed; a
//! message Twilio would refuse never leaves the codec; Twilio's error codes map to outcomes;
//! no idempotency key is sent, as Twilio takes none.
#![cfg(feature = "http")]

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use support::http::twilio::{self, created, decode_form, epoch_seconds, error, parse_rfc3339};
use support::http::{FakeProvider, Reply, hyper_client, send_with};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::twilio::TwilioCodec;
use tower_idempotency::outcome::{Category, codes};
use tower_idempotency::{IdempotencyLayer, Message};

const ACCOUNT: &str = "AC0123456789abcdef0123456789abcdef";
const SERVICE: &str = "MGfedcba9876543210fedcba9876543210";

fn codec(provider: &FakeProvider) -> TwilioCodec {
    TwilioCodec::new(ACCOUNT, "auth-token").base_url(provider.base_url())
}

fn otp() -> tower_idempotency::message::SmsBuilder {
    Message::sms()
        .from_number("+14155552345")
        .to("+15558675310")
        .text("Your code is 314159")
}

#[tokio::test]
async fn an_sms_through_twilio_is_sent_once_and_replayed() {
    let provider = twilio::provider(vec![created(1)]).await;
    let mut service = ServiceBuilder::new()
        .layer(IdempotencyLayer::in_memory())
        .service(HttpTransport::new(hyper_client(), codec(&provider)));
    let message = otp().idempotency_key("login:u_42:otp:1").build().unwrap();

    let first = ServiceExt::<Message>::ready(&mut service)
        .await
        .unwrap()
        .call(message.clone())
        .await
        .unwrap();
    let again = ServiceExt::<Message>::ready(&mut service)
        .await
        .unwrap()
        .call(message)
        .await
        .unwrap();

    assert_eq!(first.id, format!("SM{:032x}", 1));
    assert_eq!(first.transport, "twilio");
    assert_eq!(first.accepted, ["+15558675310"]);
    assert!(!first.replayed);
    assert_eq!(again.id, first.id);
    assert!(again.replayed);
    let requests = provider.requests();
    assert_eq!(requests.len(), 1, "the store is the only net, and it held");
    let request = &requests[0];
    assert_eq!(
        request.uri.path(),
        format!("/2010-04-01/Accounts/{ACCOUNT}/Messages.json")
    );
    assert_eq!(
        request.header("authorization"),
        Some("Basic QUMwMTIzNDU2Nzg5YWJjZGVmMDEyMzQ1Njc4OWFiY2RlZjphdXRoLXRva2Vu")
    );
    assert_eq!(request.key, None, "Twilio takes no idempotency key");
    let form = decode_form(&request.body).unwrap();
    assert_eq!(form["To"], "+15558675310");
    assert_eq!(form["From"], "+14155552345");
    assert_eq!(form["Body"], "Your code is 314159");
    assert_eq!(form.len(), 3);
    provider.assert_no_violations();
}

/// `ahead` from now, in whole seconds (what Twilio's RFC 3339 `SendAt` carries).
fn in_(ahead: Duration) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(epoch_seconds(SystemTime::now() + ahead))
}

/// An SMS through the messaging service, scheduled `at`.
fn scheduled(at: SystemTime) -> Message {
    Message::sms()
        .messaging_service(SERVICE)
        .to("+15558675310")
        .text("Your parcel arrives tomorrow.")
        .send_at(at)
        .build()
        .unwrap()
}

const MINUTE: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(86_400);

#[tokio::test]
async fn a_messaging_service_sends_and_schedules_through_twilio() {
    let provider = twilio::provider(vec![created(1)]).await;
    let at = in_(DAY);

    send_with(codec(&provider), scheduled(at)).await.unwrap();

    let form = decode_form(&provider.requests()[0].body).unwrap();
    assert_eq!(form["MessagingServiceSid"], SERVICE);
    assert!(!form.contains_key("From"));
    assert_eq!(parse_rfc3339(&form["SendAt"]), Some(epoch_seconds(at)));
    assert!(form["SendAt"].ends_with('Z'));
    assert_eq!(form["ScheduleType"], "fixed");
    provider.assert_no_violations();
}

#[tokio::test]
async fn a_short_code_sender_goes_as_from() {
    let provider = twilio::provider(vec![created(1)]).await;
    let message = Message::sms()
        .from_number("40404")
        .to("+15558675310")
        .text("Reply STOP to stop.")
        .build()
        .unwrap();

    send_with(codec(&provider), message).await.unwrap();

    let form = decode_form(&provider.requests()[0].body).unwrap();
    assert_eq!(form["From"], "40404");
    provider.assert_no_violations();
}

#[tokio::test]
async fn what_twilio_would_refuse_never_leaves_the_codec() {
    let provider = twilio::provider(vec![created(1)]).await;
    let email = Message::builder()
        .from("shop@example.com")
        .to("user@example.com")
        .text("hi")
        .build()
        .unwrap();
    let two_numbers = otp().to("+15558675311").build().unwrap();
    let too_long = otp().text("x".repeat(1601)).build().unwrap();
    // 800 emoji are 800 scalars but 1,600 UTF-16 code units; one more is over.
    let too_many_emoji = otp().text("👍".repeat(801)).build().unwrap();
    // `€` is two GSM-7 septets.
    let too_many_euros = otp().text("€".repeat(801)).build().unwrap();
    let scheduled_from_a_number = otp().send_at(in_(DAY)).build().unwrap();
    for (message, what) in [
        (email, "email"),
        (two_numbers, "one `To`"),
        (too_long, "1601 GSM-7"),
        (too_many_emoji, "1602 UCS-2"),
        (too_many_euros, "1602 GSM-7"),
        (scheduled_from_a_number, "messaging service"),
        (scheduled(in_(10 * MINUTE)), "less than 15 minutes"),
        (scheduled(in_(36 * DAY)), "more than 35 days"),
        (scheduled(SystemTime::now() - DAY), "less than 15 minutes"),
    ] {
        let err = send_with(codec(&provider), message).await.unwrap_err();
        assert_eq!(err.code(), codes::INVALID_REQUEST, "{what}");
        assert_eq!(err.category(), Category::Validation);
        assert!(err.message().contains(what), "{what}: {err}");
    }
    let bad_account = TwilioCodec::new("AC123", "t").base_url(provider.base_url());
    let err = HttpTransport::new(hyper_client(), bad_account)
        .oneshot(otp().build().unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.code(), codes::INVALID_REQUEST);
    assert!(provider.requests().is_empty());

    // At the limits, each goes: 1,600 GSM-7 characters (accented ones of the alphabet
    // included), 800 emoji, a schedule 20 minutes and 34 days ahead.
    for message in [
        otp().text("é".repeat(1600)).build().unwrap(),
        otp().text("👍".repeat(800)).build().unwrap(),
        scheduled(in_(20 * MINUTE)),
        scheduled(in_(34 * DAY)),
    ] {
        send_with(codec(&provider), message).await.unwrap();
    }
    assert_eq!(provider.requests().len(), 4);
    provider.assert_no_violations();
}

#[tokio::test]
async fn twilio_error_codes_map_to_outcomes() {
    let cases = [
        (
            error(429, 20429, "Too Many Requests"),
            codes::RATE_LIMITED,
            Category::Retryable,
        ),
        (
            error(400, 21610, "Attempt to send to unsubscribed recipient"),
            codes::RECIPIENT_UNSUBSCRIBED,
            Category::Permanent,
        ),
        (
            error(400, 21614, "'To' number is not a valid mobile number"),
            codes::REJECTED,
            Category::Permanent,
        ),
        (
            error(
                400,
                21408,
                "Permission to send an SMS has not been enabled for the region",
            ),
            codes::REJECTED,
            Category::Permanent,
        ),
        (
            error(400, 21211, "Invalid 'To' Phone Number"),
            codes::VALIDATION_ERROR,
            Category::Validation,
        ),
        (
            error(
                400,
                21611,
                "This 'From' number has exceeded the maximum number of queued messages",
            ),
            codes::RATE_LIMITED,
            Category::Retryable,
        ),
        (
            error(400, 35114, "Scheduling does not support this timestamp"),
            codes::VALIDATION_ERROR,
            Category::Validation,
        ),
        (
            error(
                400,
                21606,
                "The 'From' phone number provided is not a valid message-capable Twilio phone number for this destination",
            ),
            codes::REJECTED,
            Category::Permanent,
        ),
        (
            error(400, 29_999, "A code this crate does not list"),
            codes::REJECTED,
            Category::Permanent,
        ),
        (
            error(401, 20003, "Authenticate"),
            codes::REJECTED,
            Category::Permanent,
        ),
        (
            error(500, 20500, "Internal Server Error"),
            codes::SERVER_ERROR,
            Category::Unknown,
        ),
        (
            error(503, 20503, "Service Unavailable"),
            codes::UNAVAILABLE,
            Category::Retryable,
        ),
    ];
    for (reply, code, category) in cases {
        let provider = twilio::provider(vec![reply.clone()]).await;
        let err = send_with(codec(&provider), otp().build().unwrap())
            .await
            .unwrap_err();
        assert_eq!((err.code(), err.category()), (code, category), "{reply:?}");
        provider.assert_no_violations();
    }
    // A 429 carries Twilio's wait.
    let provider = twilio::provider(vec![
        error(429, 20429, "Too Many Requests").header("retry-after", "2"),
    ])
    .await;
    let err = send_with(codec(&provider), otp().build().unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));
}

#[tokio::test]
async fn a_full_sender_queue_frees_the_key_and_a_later_send_goes() {
    let provider = twilio::provider(vec![
        error(
            400,
            21611,
            "This 'From' number has exceeded the maximum number of queued messages",
        ),
        created(2),
    ])
    .await;
    let layer = IdempotencyLayer::in_memory();
    let message = otp().idempotency_key("queue-full:1").build().unwrap();
    let send = || {
        ServiceBuilder::new()
            .layer(layer.clone())
            .service(HttpTransport::new(hyper_client(), codec(&provider)))
            .oneshot(message.clone())
    };

    let err = send().await.unwrap_err();
    assert_eq!(err.code(), codes::RATE_LIMITED, "{err}");
    assert!(!err.delivery_unknown());
    let receipt = send()
        .await
        .expect("Twilio created nothing: the key was freed");
    assert_eq!(receipt.id, format!("SM{:032x}", 2));
    assert!(!receipt.replayed);
    assert_eq!(provider.requests().len(), 2);
    provider.assert_no_violations();
}

/// Posts `form` to the fake's Messages resource as a client of its own would.
async fn post_form(provider: &FakeProvider, form: String) -> http::StatusCode {
    let request = http::Request::post(format!(
        "{}2010-04-01/Accounts/{ACCOUNT}/Messages.json",
        provider.base_url()
    ))
    .header("authorization", "Basic eDp5")
    .header("content-type", "application/x-www-form-urlencoded")
    .body(bytes::Bytes::from(form))
    .unwrap();
    hyper_client().oneshot(request).await.unwrap().status()
}

#[tokio::test]
async fn a_refusal_of_the_fake_is_twilios_own_error() {
    // The schema is real: what Twilio refuses, the fake refuses with Twilio's code.
    let provider = twilio::provider(vec![Reply::new(500, "never")]).await;
    let to = "To=%2B15558675310";
    let emoji = "%F0%9F%91%8D".repeat(801);
    for form in [
        "Body=hi&From=%2B14155552345".to_owned(),
        format!("{to}&From=4040&Body=hi"),
        format!("{to}&From=%2B14155552345&Body={emoji}"),
        format!(
            "{to}&MessagingServiceSid={SERVICE}&Body=hi&ScheduleType=fixed&SendAt=2024-02-29T12%3A34%3A56Z"
        ),
    ] {
        assert_eq!(post_form(&provider, form).await, 400);
    }
    let violations = provider.violations();
    assert_eq!(violations[0], "`To` is required");
    assert!(
        violations[1].contains("not a valid sender"),
        "{violations:?}"
    );
    assert!(violations[2].contains("1600"), "{violations:?}");
    assert!(
        violations[3].contains("15 minutes to 35 days"),
        "{violations:?}"
    );
}
