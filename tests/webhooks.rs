//! Webhook receivers settle the keys the providers' events name, after checking the
//! provider's signature and before anything else: a send that timed out is settled by the
//! event with no second send, and its repeat replays the provider's id; a forged signature, a
//! stale timestamp, a redelivered `svix-id`, an oversized body and an event about no key of
//! ours change nothing and are counted. Requests are signed as the providers document it
//! (tests/support/http/signing.rs), with Svix's and Twilio's published examples as vectors.
#![cfg(feature = "http")]

mod support;

use std::time::{Duration, UNIX_EPOCH};

use axum::Router;
use support::http::hyper_client;
use support::http::listing::{ListingResend, OnSend};
use support::http::signing::{
    SVIX_SECRET, now_secs, postmark_request, svix_request, twilio_request,
};
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::mark::key_digest;
use tower_idempotency::http::resend::ResendCodec;
use tower_idempotency::http::webhook::postmark::{PostmarkEvents, PostmarkWebhook};
use tower_idempotency::http::webhook::resend::{ResendEvents, ResendWebhook};
use tower_idempotency::http::webhook::svix::SvixSecret;
use tower_idempotency::http::webhook::twilio::{TwilioEvents, TwilioWebhook};
use tower_idempotency::http::webhook::{FirstKnown, Refused, WebhookStats, WebhookVerifier};
use tower_idempotency::reconcile::Reconciler;
use tower_idempotency::store::admin::{KeyState, StoreAdmin};
use tower_idempotency::verify::{Verified, Verify};
use tower_idempotency::{IdempotencyLayer, MemoryStore, Message, Receipt, SendError};

const NAMESPACE: &str = "orders";

fn email(key: &str) -> Message {
    Message::builder()
        .from("Shop <hello@shop.example>")
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
    resend: ListingResend,
    router: Router,
    stats: WebhookStats,
    verifier: WebhookVerifier,
}

impl Stack {
    async fn new() -> Self {
        let store = MemoryStore::new();
        let layer = IdempotencyLayer::builder()
            .store(store.clone())
            .namespace(NAMESPACE)
            .build()
            .unwrap();
        let receiver = ResendWebhook::new(store.clone(), ResendEvents::new(SVIX_SECRET).unwrap())
            .max_body(4096);
        let stats = receiver.stats();
        let verifier = receiver.verifier();
        let router = Router::new().route_service("/webhooks/resend", receiver);
        Self {
            store,
            layer,
            resend: ListingResend::start().await,
            router,
            stats,
            verifier,
        }
    }

    async fn send(&self, key: &str) -> Result<Receipt, SendError> {
        let transport = HttpTransport::new(
            hyper_client(),
            ResendCodec::new("re_test").base_url(self.resend.base_url()),
        );
        ServiceBuilder::new()
            .layer(self.layer.clone())
            .timeout(Duration::from_millis(300))
            .service(transport)
            .oneshot(email(key))
            .await
    }

    /// Posts `request` to the axum route; the status it answered.
    async fn post(&self, request: http::Request<String>) -> u16 {
        let request = request.map(axum::body::Body::from);
        let response = self.router.clone().oneshot(request).await.unwrap();
        response.status().as_u16()
    }

    async fn state(&self, key: &str) -> Option<(KeyState, bool)> {
        let record = self
            .store
            .inspect(&format!("{NAMESPACE}:{key}"))
            .await
            .unwrap()?;
        Some((record.state, record.is_unknown_delivery()))
    }
}

/// Resend's event about what the fake took `n`-th, as Resend writes it.
fn event(stack: &Stack, kind: &str, n: usize) -> String {
    let taken = &stack.resend.taken()[n];
    let tags: serde_json::Map<String, serde_json::Value> = taken
        .tags
        .iter()
        .map(|(n, v)| (n.clone(), v.clone().into()))
        .collect();
    serde_json::json!({
        "type": kind,
        "created_at": "2024-11-22T23:41:12.126Z",
        "data": {
            "created_at": "2024-11-22 23:41:11.894719+00",
            "email_id": taken.id,
            "from": "Shop <hello@shop.example>",
            "to": ["seller@example.com"],
            "subject": "New order",
            "tags": tags,
        }
    })
    .to_string()
}

#[test]
fn svixs_published_example_verifies_and_a_changed_byte_does_not() {
    let secret = SvixSecret::new(SVIX_SECRET).unwrap();
    let at = UNIX_EPOCH + Duration::from_secs(1_614_265_330);
    let good = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
    let (id, ts, body) = (
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "1614265330",
        br#"{"test": 2432232314}"#,
    );
    assert_eq!(secret.verify(id, ts, body, good, at), Ok(()));
    assert_eq!(
        secret.verify(id, ts, br#"{"test": 2432232315}"#, good, at),
        Err(Refused::BadSignature)
    );
    // Several signatures during a rotation: one match is enough.
    let rotated = format!("v1,AAAA {good}");
    assert_eq!(secret.verify(id, ts, body, &rotated, at), Ok(()));
    let late = at + Duration::from_secs(5 * 60 + 1);
    assert_eq!(
        secret.verify(id, ts, body, good, late),
        Err(Refused::StaleTimestamp)
    );
}

#[tokio::test]
async fn a_send_that_timed_out_is_settled_by_the_webhook_and_never_sent_twice() {
    let stack = Stack::new().await;
    stack.resend.script([OnSend::TakeThenHang]);
    let timed_out = stack.send("order:1").await.unwrap_err();
    assert!(timed_out.delivery_unknown(), "{timed_out:?}");
    assert_eq!(stack.state("order:1").await, Some((KeyState::Done, true)));

    let body = event(&stack, "email.delivered", 0);
    let status = stack
        .post(svix_request("msg_1", now_secs(), &body, SVIX_SECRET))
        .await;
    assert_eq!(status, 200);
    assert_eq!(stack.stats.delivered(), 1);
    assert_eq!(stack.state("order:1").await, Some((KeyState::Done, false)));

    let repeat = stack.send("order:1").await.unwrap();
    assert_eq!(repeat.id, "re-0", "the provider's id");
    assert!(repeat.replayed);
    assert_eq!(stack.resend.sends(), 1, "no second send");
}

#[tokio::test]
async fn a_forged_signature_or_a_stale_timestamp_changes_nothing() {
    let stack = Stack::new().await;
    stack.resend.script([OnSend::TakeThen500]);
    stack.send("order:2").await.unwrap_err();
    let body = event(&stack, "email.delivered", 0);

    let forged = svix_request("msg_2", now_secs(), &body, "whsec_QUFBQUFBQUFBQUFBQUFBQQ==");
    assert_eq!(stack.post(forged).await, 401);
    let mut unsigned = svix_request("msg_2", now_secs(), &body, SVIX_SECRET);
    unsigned.headers_mut().remove("svix-signature");
    assert_eq!(stack.post(unsigned).await, 401);
    let stale = svix_request("msg_2", now_secs() - 10 * 60, &body, SVIX_SECRET);
    assert_eq!(stack.post(stale).await, 401);
    let mut tampered = svix_request("msg_2", now_secs(), &body, SVIX_SECRET);
    *tampered.body_mut() = body.replace("re-0", "re-9");
    assert_eq!(stack.post(tampered).await, 401);

    assert_eq!(stack.stats.unauthorized(), 4);
    assert_eq!(stack.stats.delivered(), 0);
    assert_eq!(
        stack.state("order:2").await,
        Some((KeyState::Done, true)),
        "still unknown"
    );
}

#[tokio::test]
async fn a_redelivered_svix_id_changes_nothing_twice() {
    let stack = Stack::new().await;
    stack.resend.script([OnSend::TakeThen500]);
    stack.send("order:3").await.unwrap_err();
    let failed = event(&stack, "email.failed", 0);
    assert_eq!(
        stack
            .post(svix_request("msg_3", now_secs(), &failed, SVIX_SECRET))
            .await,
        200
    );
    assert_eq!(stack.stats.freed(), 1);
    assert_eq!(stack.state("order:3").await, None, "freed");

    // Sent again, and again of unknown delivery.
    stack.resend.script([OnSend::TakeThen500]);
    stack.send("order:3").await.unwrap_err();
    assert_eq!(stack.state("order:3").await, Some((KeyState::Done, true)));

    // The first event, delivered again: acted on twice, it would free the key again.
    assert_eq!(
        stack
            .post(svix_request("msg_3", now_secs(), &failed, SVIX_SECRET))
            .await,
        200
    );
    assert_eq!(stack.stats.replayed(), 1);
    assert_eq!(stack.stats.freed(), 1);
    assert_eq!(stack.state("order:3").await, Some((KeyState::Done, true)));
}

#[tokio::test]
async fn an_oversized_body_an_unknown_key_and_a_malformed_event_are_counted_and_change_nothing() {
    let stack = Stack::new().await;
    stack.resend.script([OnSend::TakeThen500]);
    stack.send("order:4").await.unwrap_err();

    let huge = "x".repeat(5000);
    assert_eq!(
        stack
            .post(svix_request("msg_4", now_secs(), &huge, SVIX_SECRET))
            .await,
        413
    );
    assert_eq!(stack.stats.too_large(), 1);

    let stranger = serde_json::json!({
        "type": "email.delivered",
        "data": {"email_id": "re-77", "tags": {"idempotency_digest": key_digest("orders:never")}}
    })
    .to_string();
    assert_eq!(
        stack
            .post(svix_request("msg_5", now_secs(), &stranger, SVIX_SECRET))
            .await,
        200
    );
    let untagged = r#"{"type":"email.delivered","data":{"email_id":"re-78"}}"#;
    assert_eq!(
        stack
            .post(svix_request("msg_6", now_secs(), untagged, SVIX_SECRET))
            .await,
        200
    );
    assert_eq!(stack.stats.ignored(), 2);

    assert_eq!(
        stack
            .post(svix_request("msg_7", now_secs(), "not json", SVIX_SECRET))
            .await,
        400
    );
    assert_eq!(stack.stats.malformed(), 1);

    assert_eq!(stack.stats.delivered() + stack.stats.freed(), 0);
    assert_eq!(stack.state("order:4").await, Some((KeyState::Done, true)));
}

#[tokio::test]
async fn a_twilio_status_callback_settles_the_key_its_url_names() {
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("sms")
        .build()
        .unwrap();
    // An SMS whose send left the key unknown.
    let provider = tower::service_fn(|_: Message| async {
        Err::<Receipt, _>(SendError::unknown_delivery("provider.timeout", "timed out"))
    });
    let sms = Message::sms()
        .from_number("+15005550006")
        .to("+15005550010")
        .text("Your code is 1234")
        .idempotency_key("otp:1")
        .build()
        .unwrap();
    let unknown = ServiceBuilder::new()
        .layer(layer.clone())
        .service(provider)
        .oneshot(sms.clone())
        .await
        .unwrap_err();
    assert!(unknown.delivery_unknown());

    let origin = "https://hooks.shop.example";
    let receiver = TwilioWebhook::new(store.clone(), TwilioEvents::new("auth-token", origin));
    let stats = receiver.stats();
    let path = format!(
        "/twilio/status?idempotency_digest={}",
        key_digest("sms:otp:1")
    );
    let params = [
        ("MessageSid", "SM0123456789abcdef0123456789abcdef"),
        ("MessageStatus", "sent"),
        ("To", "+15005550010"),
    ];
    let forged = twilio_request(origin, &path, &params, "other-token");
    let answer = receiver.clone().oneshot(forged).await.unwrap();
    assert_eq!(answer.status(), 401);
    assert_eq!(stats.unauthorized(), 1);

    let signed = twilio_request(origin, &path, &params, "auth-token");
    let answer = receiver.clone().oneshot(signed).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(stats.delivered(), 1);

    let never = tower::service_fn(|_: Message| async {
        Err::<Receipt, _>(SendError::permanent("test.called", "must not be called"))
    });
    let repeat = ServiceBuilder::new()
        .layer(layer)
        .service(never)
        .oneshot(sms)
        .await
        .unwrap();
    assert_eq!(repeat.id, "SM0123456789abcdef0123456789abcdef");
    assert!(repeat.replayed);
}

#[tokio::test]
async fn a_postmark_event_settles_only_with_the_webhooks_credentials() {
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("mail")
        .build()
        .unwrap();
    let provider = tower::service_fn(|_: Message| async {
        Err::<Receipt, _>(SendError::unknown_delivery("provider.timeout", "timed out"))
    });
    ServiceBuilder::new()
        .layer(layer)
        .service(provider)
        .oneshot(email("welcome:1"))
        .await
        .unwrap_err();
    let receiver = PostmarkWebhook::new(store.clone(), PostmarkEvents::new("hooks", "s3cret"));
    let stats = receiver.stats();
    let body = serde_json::json!({
        "RecordType": "Bounce",
        "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483",
        "Type": "HardBounce",
        "Metadata": {"idempotency_digest": key_digest("mail:welcome:1")},
    })
    .to_string();
    let wrong = receiver
        .clone()
        .oneshot(postmark_request("hooks", "guess", &body))
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    assert!(
        store
            .inspect("mail:welcome:1")
            .await
            .unwrap()
            .unwrap()
            .is_unknown_delivery()
    );

    let right = receiver
        .clone()
        .oneshot(postmark_request("hooks", "s3cret", &body))
        .await
        .unwrap();
    assert_eq!(right.status(), 200);
    assert_eq!((stats.unauthorized(), stats.delivered()), (1, 1));
    let record = store.inspect("mail:welcome:1").await.unwrap().unwrap();
    let receipt = record.outcome.unwrap().receipt().cloned().unwrap();
    assert_eq!(
        receipt.id, "883953f4-6105-42a2-a16a-77a8eac79483",
        "a bounce was still sent"
    );
}

#[tokio::test]
async fn an_event_that_arrives_while_the_send_holds_its_key_settles_it_through_the_reconciler() {
    let stack = Stack::new().await;
    stack.resend.script([OnSend::TakeThenHang]);
    let early_event = async {
        support::wait_until(|| !stack.resend.taken().is_empty()).await;
        // Resend's event comes before the client gives up: the live send keeps the key.
        let body = event(&stack, "email.sent", 0);
        let status = stack
            .post(svix_request("msg_8", now_secs(), &body, SVIX_SECRET))
            .await;
        (status, stack.stats.ignored(), stack.stats.delivered())
    };
    let (sent, answered) = tokio::join!(stack.send("order:early"), early_event);
    assert_eq!(answered, (200, 1, 0));
    assert!(sent.unwrap_err().delivery_unknown());

    // The reconciler asks what the webhooks said first; the lookup after is never needed.
    let never = tower::service_fn(|_: Verify| async {
        Err::<Verified, tower_idempotency::BoxError>("the lookup must not be asked".into())
    });
    let verify = FirstKnown::new(stack.verifier.clone(), never);
    let mut reconciler =
        Reconciler::new(stack.store.clone(), verify).stored_keys(stack.layer.stored_keys());
    let report = reconciler.run_once().await;
    assert_eq!((report.delivered, report.errors), (1, 0));
    let repeat = stack.send("order:early").await.unwrap();
    assert_eq!(repeat.id, "re-0");
    assert!(repeat.replayed);
    assert_eq!(stack.resend.sends(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_event_settles_a_key_a_crash_left_pending() {
    use tower_idempotency::Fingerprint;
    use tower_idempotency::store::Store;

    let store = MemoryStore::new();
    let lease = Duration::from_secs(30);
    // A process reserved the key, sent, and died before settling it.
    store
        .reserve(
            "orders:order:crashed",
            Fingerprint::of(&email("order:crashed")),
            lease,
        )
        .await
        .unwrap();
    let receiver = ResendWebhook::new(store.clone(), ResendEvents::new(SVIX_SECRET).unwrap());
    let stats = receiver.stats();
    let body = serde_json::json!({
        "type": "email.delivered",
        "data": {"email_id": "re-41", "tags": [
            {"name": "idempotency_digest", "value": key_digest("orders:order:crashed")}
        ]}
    })
    .to_string();

    // Within its lease the holder may still be alive: its key is left to it.
    let early = receiver
        .clone()
        .oneshot(svix_request("msg_9", now_secs(), &body, SVIX_SECRET));
    assert_eq!(early.await.unwrap().status(), 200);
    assert_eq!((stats.ignored(), stats.delivered()), (1, 0));
    assert!(
        store
            .inspect("orders:order:crashed")
            .await
            .unwrap()
            .unwrap()
            .is_held_live()
    );

    // Once the lease passed, the event settles it (Resend's tags as a list, too).
    tokio::time::advance(lease + Duration::from_secs(1)).await;
    let late = receiver
        .clone()
        .oneshot(svix_request("msg_10", now_secs(), &body, SVIX_SECRET));
    assert_eq!(late.await.unwrap().status(), 200);
    assert_eq!(stats.delivered(), 1);
    let record = store
        .inspect("orders:order:crashed")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.outcome.unwrap().receipt().unwrap().id, "re-41");
}
