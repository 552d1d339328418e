//! Resend to the letter: `ResendCodec` against a fake Resend that enforces Resend's published
//! request schema and limits (tests/support/http/resend.rs). A request Resend would refuse
//! never leaves the codec; every documented error name maps to its class; the
//! `Idempotency-Key` Resend sees is the key the idempotency layer holds.
#![cfg(feature = "http")]

mod support;

use std::time::Duration;

use support::http::{FakeProvider, Reply, hyper_client, resend};
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::batch::BatchOutcomes;
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::resend::ResendCodec;
use tower_idempotency::outcome::{Category, codes};
use tower_idempotency::{
    IdempotencyLayer, MemoryStore, Message, Receipt, RetryPolicy, SendError,
    counts_against_provider,
};

const API_KEY: &str = "re_test_123";

fn email() -> tower_idempotency::MessageBuilder {
    Message::builder()
        .from("Marketplace <hello@marketplace.example>")
        .to("seller@example.com")
        .subject("New order")
        .text("Vintage Nikon FM2 just sold.")
}

fn transport(provider: &FakeProvider) -> HttpTransport<support::http::HyperClient, ResendCodec> {
    HttpTransport::new(
        hyper_client(),
        ResendCodec::new(API_KEY).base_url(provider.base_url()),
    )
}

async fn send(provider: &FakeProvider, message: Message) -> Result<Receipt, SendError> {
    support::send(&mut transport(provider), message).await
}

/// Sends one email under `key` through the layer (in memory) and a retry `policy` to
/// `provider`, expecting an error: the stack a production user has, for the answers that end
/// it.
async fn fail_through_layer(provider: &FakeProvider, policy: RetryPolicy, key: &str) -> SendError {
    ServiceBuilder::new()
        .layer(IdempotencyLayer::in_memory())
        .layer(RetryLayer::new(policy))
        .service(transport(provider))
        .oneshot(email().idempotency_key(key).build().unwrap())
        .await
        .unwrap_err()
}

async fn send_batch(provider: &FakeProvider, messages: Vec<Message>) -> BatchOutcomes {
    support::send_batch(&mut transport(provider), messages).await
}

fn resend_error(status: u16, name: &str) -> Reply {
    let body = serde_json::json!({ "statusCode": status, "name": name, "message": "documented" });
    Reply::json(status, body.to_string())
}

fn batch_ids(ids: &[&str]) -> Reply {
    let data: Vec<_> = ids
        .iter()
        .map(|id| serde_json::json!({ "id": id }))
        .collect();
    Reply::json(200, serde_json::json!({ "data": data }).to_string())
}

#[tokio::test]
async fn a_cc_only_message_is_a_validation_error_and_its_batch_neighbours_are_sent() {
    let provider = resend::answering(batch_ids(&["id-a", "id-c"])).await;
    let cc_only = Message::builder()
        .from("hello@marketplace.example")
        .cc("ops@example.com")
        .subject("Copy")
        .text("For the record.")
        .idempotency_key("b")
        .build()
        .unwrap();
    let messages = vec![
        email().idempotency_key("a").build().unwrap(),
        cc_only,
        email()
            .to("buyer@example.com")
            .idempotency_key("c")
            .build()
            .unwrap(),
    ];

    let outcomes = send_batch(&provider, messages).await;

    assert_eq!(outcomes[0].as_ref().unwrap().id, "id-a");
    let err = outcomes[1].as_ref().unwrap_err();
    assert_eq!(err.code(), codes::INVALID_REQUEST);
    assert_eq!(err.category(), Category::Validation);
    assert!(err.message().contains("`to` is required"), "{err}");
    assert_eq!(outcomes[2].as_ref().unwrap().id, "id-c");
    let requests = provider.requests();
    assert_eq!(requests.len(), 1, "the neighbours went as one batch");
    assert_eq!(requests[0].json().as_array().unwrap().len(), 2);
    provider.assert_no_violations();
}

#[tokio::test]
async fn a_cc_only_or_bcc_only_message_alone_is_never_sent() {
    let provider = resend::answering(Reply::accepted(1)).await;
    for only in [
        Message::builder().cc("a@example.com"),
        Message::builder().bcc("a@example.com"),
    ] {
        let message = only
            .from("hello@marketplace.example")
            .subject("s")
            .text("t")
            .build()
            .unwrap();
        let err = send(&provider, message).await.unwrap_err();
        assert_eq!(err.code(), codes::INVALID_REQUEST);
    }
    assert!(provider.requests().is_empty());
}

#[tokio::test]
async fn fifty_one_to_addresses_are_refused_and_fifty_go() {
    let provider = resend::answering(Reply::accepted(1)).await;
    let with_to = |n: usize| {
        (0..n)
            .fold(Message::builder(), |b, i| b.to(format!("r{i}@example.com")))
            .from("hello@marketplace.example")
            .subject("s")
            .text("t")
            .build()
            .unwrap()
    };

    let err = send(&provider, with_to(51)).await.unwrap_err();
    assert_eq!(err.code(), codes::INVALID_REQUEST);
    assert!(err.message().contains("51"), "{err}");
    assert!(provider.requests().is_empty());

    send(&provider, with_to(50)).await.unwrap();
    assert_eq!(provider.requests().len(), 1);
    provider.assert_no_violations();
}

#[tokio::test]
async fn every_documented_limit_is_checked_before_sending() {
    let provider = resend::answering(Reply::accepted(1)).await;
    let no_subject = Message::builder()
        .from("hello@marketplace.example")
        .to("seller@example.com")
        .text("t")
        .build()
        .unwrap();
    let long_tag = email().metadata("k".repeat(257), "v").build().unwrap();
    let spaced_tag = email().metadata("order id", "v").build().unwrap();
    let unicode_value = email().metadata("kind", "größe").build().unwrap();
    let empty_name = email().metadata("", "v").build().unwrap();
    let sms = support::sms("hi");
    for message in [
        no_subject,
        long_tag,
        spaced_tag,
        unicode_value,
        empty_name,
        sms,
    ] {
        let err = send(&provider, message).await.unwrap_err();
        assert_eq!(err.code(), codes::INVALID_REQUEST, "{err}");
        assert_eq!(err.category(), Category::Validation);
    }
    assert!(provider.requests().is_empty());

    // At the limits, it goes.
    let tag = "a-Z_9".repeat(52);
    let at_limits = email().metadata(&tag[..256], &tag[..256]).build().unwrap();
    send(&provider, at_limits).await.unwrap();
    provider.assert_no_violations();
}

#[tokio::test]
async fn every_documented_error_name_maps_to_its_class() {
    let cases = [
        (
            400,
            "validation_error",
            codes::VALIDATION_ERROR,
            Category::Validation,
        ),
        (
            400,
            "invalid_idempotency_key",
            codes::VALIDATION_ERROR,
            Category::Validation,
        ),
        (401, "missing_api_key", codes::REJECTED, Category::Permanent),
        (
            401,
            "restricted_api_key",
            codes::REJECTED,
            Category::Permanent,
        ),
        (403, "invalid_api_key", codes::REJECTED, Category::Permanent),
        (
            403,
            "validation_error",
            codes::REJECTED,
            Category::Permanent,
        ),
        (404, "not_found", codes::REJECTED, Category::Permanent),
        (
            405,
            "method_not_allowed",
            codes::REJECTED,
            Category::Permanent,
        ),
        (
            409,
            "invalid_idempotent_request",
            codes::IDEMPOTENCY_KEY_REUSED,
            Category::Validation,
        ),
        (
            409,
            "concurrent_idempotent_requests",
            codes::IDEMPOTENCY_IN_FLIGHT,
            Category::Unknown,
        ),
        (
            422,
            "missing_required_field",
            codes::VALIDATION_ERROR,
            Category::Validation,
        ),
        (
            422,
            "invalid_from_address",
            codes::VALIDATION_ERROR,
            Category::Validation,
        ),
        (
            422,
            "invalid_attachment",
            codes::VALIDATION_ERROR,
            Category::Validation,
        ),
        (
            422,
            "invalid_parameter",
            codes::VALIDATION_ERROR,
            Category::Validation,
        ),
        (
            429,
            "rate_limit_exceeded",
            codes::RATE_LIMITED,
            Category::Retryable,
        ),
        (
            429,
            "daily_quota_exceeded",
            codes::QUOTA_EXCEEDED,
            Category::Permanent,
        ),
        (
            429,
            "monthly_quota_exceeded",
            codes::QUOTA_EXCEEDED,
            Category::Permanent,
        ),
        (451, "security_error", codes::REJECTED, Category::Permanent),
        (
            500,
            "application_error",
            codes::SERVER_ERROR,
            Category::Unknown,
        ),
        (
            500,
            "internal_server_error",
            codes::SERVER_ERROR,
            Category::Unknown,
        ),
    ];
    for (status, name, code, category) in cases {
        let provider = resend::answering(resend_error(status, name)).await;
        let err = send(&provider, email().build().unwrap()).await.unwrap_err();
        assert_eq!(
            (err.code(), err.category()),
            (code, category),
            "{status} {name}"
        );
        assert!(err.message().contains(name), "{status} {name}: {err}");
        provider.assert_no_violations();
    }
}

#[tokio::test]
async fn quota_exceeded_is_not_retried_and_does_not_count_against_the_provider() {
    let provider =
        resend::answering(resend_error(429, "daily_quota_exceeded").header("retry-after", "3600"))
            .await;
    let err = fail_through_layer(&provider, RetryPolicy::new().max_attempts(5), "quota:1").await;

    assert_eq!(err.code(), codes::QUOTA_EXCEEDED);
    assert!(!err.is_retryable());
    assert!(!counts_against_provider(&Err::<(), _>(err.clone())));
    assert_eq!(err.retry_after(), Some(Duration::from_secs(3600)));
    assert_eq!(provider.requests().len(), 1, "no retry");

    // A rate limit, by contrast, is retried and counts.
    let limited = resend::provider(vec![
        resend_error(429, "rate_limit_exceeded").header("retry-after", "0"),
        Reply::accepted(7),
    ])
    .await;
    let receipt = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::new()))
        .service(transport(&limited))
        .oneshot(email().build().unwrap())
        .await
        .unwrap();
    assert_eq!(receipt.id, "msg-7");
}

#[tokio::test]
async fn concurrent_idempotent_request_is_retried_under_the_same_key_and_gets_the_outcome() {
    let provider = resend::provider(vec![
        resend_error(409, "concurrent_idempotent_requests"),
        Reply::accepted(1),
    ])
    .await;
    let layer = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .namespace("mail")
        .build()
        .unwrap();
    let stored = layer.stored_key_for("order:42").unwrap();
    let policy = RetryPolicy::new().base_delay(Duration::from_millis(1));
    let mut service = ServiceBuilder::new()
        .layer(layer)
        .layer(RetryLayer::new(policy))
        .service(transport(&provider));

    let receipt = ServiceExt::<Message>::ready(&mut service)
        .await
        .unwrap()
        .call(email().idempotency_key("order:42").build().unwrap())
        .await
        .unwrap();

    assert_eq!(receipt.id, "msg-1");
    let keys: Vec<_> = provider.requests().into_iter().map(|r| r.key).collect();
    assert_eq!(keys, [Some(stored.clone()), Some(stored)]);
    provider.assert_no_violations();
}

#[tokio::test]
async fn a_request_still_in_flight_at_resend_does_not_count_against_the_provider() {
    // Resend answers 409 concurrent_idempotent_requests to every attempt: the retries end on
    // it, and the error is a healthy provider's answer about the key's earlier request.
    let provider = resend::answering(resend_error(409, "concurrent_idempotent_requests")).await;
    let policy = RetryPolicy::new()
        .max_attempts(2)
        .base_delay(Duration::from_millis(1));
    let err = fail_through_layer(&provider, policy, "in-flight:1").await;

    assert_eq!(err.code(), codes::IDEMPOTENCY_IN_FLIGHT);
    assert!(err.delivery_unknown(), "the earlier request may send");
    assert!(!err.counts_against_provider());
    assert!(!counts_against_provider(&Err::<(), _>(err)));
    assert_eq!(provider.requests().len(), 2, "retried under the same key");
    provider.assert_no_violations();
}

#[tokio::test]
async fn a_base_url_with_a_query_string_keeps_it_after_the_path() {
    let provider = resend::answering(Reply::accepted(1)).await;
    let base = format!("http://{}/resend/?tenant=7", provider.addr);
    let codec = ResendCodec::new(API_KEY).base_url(base.parse().unwrap());

    HttpTransport::new(hyper_client(), codec)
        .oneshot(email().build().unwrap())
        .await
        .unwrap();

    let uri = &provider.requests()[0].uri;
    assert_eq!(uri.path(), "/resend/emails");
    assert_eq!(uri.query(), Some("tenant=7"));
}

// ---- The key Resend sees is the key the layer holds. ----

#[tokio::test]
async fn idempotency_key_is_the_layers_stored_key_under_two_namespaces() {
    let provider = resend::provider(vec![Reply::accepted(1), Reply::accepted(2)]).await;
    let layer = |namespace: &str| {
        IdempotencyLayer::builder()
            .store(MemoryStore::new())
            .namespace(namespace)
            .build()
            .unwrap()
    };
    let (shop, billing) = (layer("shop"), layer("billing"));
    let message = email().idempotency_key("order.created:42").build().unwrap();

    for layer in [&shop, &billing] {
        ServiceBuilder::new()
            .layer(layer.clone())
            .service(transport(&provider))
            .oneshot(message.clone())
            .await
            .unwrap();
    }

    let keys: Vec<_> = provider.requests().into_iter().map(|r| r.key).collect();
    assert_eq!(
        keys,
        [
            Some(shop.stored_key_for("order.created:42").unwrap()),
            Some(billing.stored_key_for("order.created:42").unwrap()),
        ]
    );
    assert_ne!(keys[0], keys[1], "two namespaces, two key spaces at Resend");
    provider.assert_no_violations();
}

#[tokio::test]
async fn idempotency_key_is_the_layers_stored_key_with_a_key_function() {
    let provider = resend::answering(Reply::accepted(1)).await;
    let layer = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .namespace("welcome")
        .key(|m: &Message| Some(format!("welcome:{}", m.to()[0])))
        .build()
        .unwrap();
    let expected = layer.stored_key_for("welcome:seller@example.com").unwrap();

    // The message has no key of its own: only the key function gives it one.
    ServiceBuilder::new()
        .layer(layer)
        .service(transport(&provider))
        .oneshot(email().build().unwrap())
        .await
        .unwrap();

    assert_eq!(
        provider.requests()[0].key.as_deref(),
        Some(expected.as_str())
    );
}

#[tokio::test]
async fn a_stored_key_resend_cannot_take_is_sent_as_its_digest_and_unkeyed_sends_carry_none() {
    let provider = resend::answering(Reply::accepted(1)).await;
    let layer = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .namespace("shop")
        .build()
        .unwrap();
    // 256 bytes of key and the namespace: longer than Resend's 256.
    let long = "k".repeat(256);
    let accented = "commande:été";
    let service = || {
        ServiceBuilder::new()
            .layer(layer.clone())
            .service(transport(&provider))
    };
    for key in [long.as_str(), accented] {
        service()
            .oneshot(email().idempotency_key(key).build().unwrap())
            .await
            .unwrap();
    }
    service().oneshot(email().build().unwrap()).await.unwrap();

    let keys: Vec<_> = provider.requests().into_iter().map(|r| r.key).collect();
    for (key, sent) in [long.as_str(), accented].iter().zip(&keys) {
        let sent = sent.as_deref().unwrap();
        assert!(sent.starts_with("sha256-") && sent.len() == 71, "{sent}");
        assert_ne!(sent, layer.stored_key_for(key).unwrap());
    }
    assert_ne!(keys[0], keys[1]);
    assert_eq!(keys[2], None, "an unkeyed message carries no key");
    provider.assert_no_violations();
}

#[tokio::test]
async fn a_message_the_key_function_leaves_unkeyed_carries_no_key_despite_its_own() {
    let provider = resend::answering(Reply::accepted(1)).await;
    let layer = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .namespace("digest")
        .key(|_: &Message| None)
        .build()
        .unwrap();

    ServiceBuilder::new()
        .layer(layer)
        .service(transport(&provider))
        .oneshot(email().idempotency_key("own:1").build().unwrap())
        .await
        .unwrap();

    assert_eq!(provider.requests()[0].key, None);
}
