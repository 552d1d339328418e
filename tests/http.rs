//! `HttpTransport` with `ResendCodec` against a fake provider on 127.0.0.1, over hyper-util's
//! legacy client and over reqwest: the request the provider receives, every status mapping,
//! connection failures, timeouts, and the whole stack under `IdempotencyLayer`.
#![cfg(feature = "http")]

mod http_support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_support::{ClientKind, FakeProvider, Reply, hyper_client};
use tower::timeout::TimeoutLayer;
use tower::timeout::error::Elapsed;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::http::{HttpTransport, ResendCodec, codes};
use tower_idempotency::outcome::{Category, codes as layer_codes};
use tower_idempotency::{Attachment, IdempotencyLayer, MemoryStore, Message, SendError};

const API_KEY: &str = "re_test_123";
const KEY: &str = "order.created:ord_20481:email";

fn order_email() -> Message {
    Message::builder()
        .from("orders@marketplace.example")
        .to("seller@example.com")
        .cc("ops@example.com")
        .bcc("audit@example.com")
        .reply_to("support@marketplace.example")
        .subject("New order ord_20481")
        .text("Vintage Nikon FM2 just sold.")
        .html("<p>Vintage Nikon FM2 just sold.</p>")
        .header("X-Entity-Ref-ID", "ord_20481")
        .in_reply_to("<thread-1@marketplace.example>")
        .reference("<r1@marketplace.example>")
        .reference("<r2@marketplace.example>")
        .attachment(Attachment::new("invoice.txt", "text/plain", &b"foobar"[..]))
        .metadata("order_id", "ord_20481")
        .metadata("kind", "order_created")
        .send_at(UNIX_EPOCH + Duration::from_secs(1_709_210_096))
        .idempotency_key(KEY)
        .build()
        .unwrap()
}

fn transport(
    kind: ClientKind,
    provider: &FakeProvider,
) -> HttpTransport<http_support::AnyClient, ResendCodec> {
    HttpTransport::new(
        kind.client(),
        ResendCodec::new(API_KEY).base_url(provider.base_url()),
    )
}

/// Sends `order_email()` to a provider that answers `reply`, and returns the error.
async fn error_for(kind: ClientKind, reply: Reply) -> SendError {
    let provider = FakeProvider::answering(reply).await;
    let mut transport = transport(kind, &provider);
    let result = transport.ready().await.unwrap().call(order_email()).await;
    assert_eq!(provider.requests().len(), 1);
    result.expect_err("the provider answered a failure")
}

fn resend_error(status: u16, name: &str, message: &str) -> Reply {
    Reply::new(
        status,
        serde_json::json!({ "statusCode": status, "name": name, "message": message }).to_string(),
    )
    .header("content-type", "application/json")
}

async fn sends_resend_json_with_authorization_and_idempotency_key(kind: ClientKind) {
    let provider = FakeProvider::answering(Reply::new(
        200,
        r#"{"id":"49a3999c-0ce1-4ea6-ab68-afcd6dc2e794"}"#,
    ))
    .await;
    let mut transport = transport(kind, &provider);

    let receipt = transport
        .ready()
        .await
        .unwrap()
        .call(order_email())
        .await
        .unwrap();

    assert_eq!(receipt.id, "49a3999c-0ce1-4ea6-ab68-afcd6dc2e794");
    assert_eq!(receipt.transport, "resend");
    assert_eq!(
        receipt.accepted,
        ["seller@example.com", "ops@example.com", "audit@example.com"]
    );
    assert!(!receipt.replayed);

    let requests = provider.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, http::Method::POST);
    assert_eq!(request.uri.path(), "/emails");
    assert_eq!(request.header("idempotency-key"), Some(KEY));
    assert_eq!(request.header("authorization"), Some("Bearer re_test_123"));
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(
        request.json(),
        serde_json::json!({
            "from": "orders@marketplace.example",
            "to": ["seller@example.com"],
            "cc": ["ops@example.com"],
            "bcc": ["audit@example.com"],
            "reply_to": ["support@marketplace.example"],
            "subject": "New order ord_20481",
            "html": "<p>Vintage Nikon FM2 just sold.</p>",
            "text": "Vintage Nikon FM2 just sold.",
            "headers": {
                "X-Entity-Ref-ID": "ord_20481",
                "In-Reply-To": "<thread-1@marketplace.example>",
                "References": "<r1@marketplace.example> <r2@marketplace.example>",
            },
            "attachments": [
                { "filename": "invoice.txt", "content": "Zm9vYmFy", "content_type": "text/plain" }
            ],
            "tags": [
                { "name": "kind", "value": "order_created" },
                { "name": "order_id", "value": "ord_20481" },
            ],
            "scheduled_at": "2024-02-29T12:34:56Z",
        })
    );
}

async fn message_without_key_goes_without_idempotency_key_header(kind: ClientKind) {
    let provider = FakeProvider::answering(Reply::new(200, r#"{"id":"m1"}"#)).await;
    let message = Message::builder()
        .from("shop@example.com")
        .to("user@example.com")
        .subject("Hi")
        .text("Welcome")
        .build()
        .unwrap();
    transport(kind, &provider).oneshot(message).await.unwrap();
    let body = provider.requests()[0].json();
    assert_eq!(provider.requests()[0].header("idempotency-key"), None);
    assert_eq!(body["to"], serde_json::json!(["user@example.com"]));
    assert!(body.get("cc").is_none() && body.get("attachments").is_none());
}

async fn every_attempt_of_a_message_carries_the_same_idempotency_key(kind: ClientKind) {
    let provider =
        FakeProvider::start(vec![Reply::new(503, ""), Reply::new(200, r#"{"id":"m1"}"#)]).await;
    let mut transport = transport(kind, &provider);
    let message = order_email();

    let first = transport.ready().await.unwrap().call(message.clone()).await;
    assert_eq!(first.unwrap_err().code(), codes::UNAVAILABLE);
    let second = transport.ready().await.unwrap().call(message).await;
    assert_eq!(second.unwrap().id, "m1");

    let keys: Vec<_> = provider
        .requests()
        .iter()
        .map(|r| r.header("idempotency-key").map(str::to_owned))
        .collect();
    assert_eq!(keys, [Some(KEY.to_owned()), Some(KEY.to_owned())]);
}

async fn rate_limited_429_is_retryable_with_retry_after_seconds(kind: ClientKind) {
    let err = error_for(kind, Reply::new(429, "").header("retry-after", "7")).await;
    assert_eq!(err.code(), codes::RATE_LIMITED);
    assert_eq!(err.category(), Category::Retryable);
    assert!(err.is_retryable());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
}

async fn rate_limited_429_reads_retry_after_as_an_http_date(kind: ClientKind) {
    let at = SystemTime::now() + Duration::from_secs(120);
    let reply = Reply::new(429, "").header("retry-after", httpdate::fmt_http_date(at));
    let wait = error_for(kind, reply).await.retry_after().unwrap();
    // The date has whole seconds and the clock moved on since it was written.
    assert!(
        wait > Duration::from_secs(100) && wait <= Duration::from_secs(120),
        "{wait:?}"
    );

    let past = Reply::new(429, "").header("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT");
    assert_eq!(
        error_for(kind, past).await.retry_after(),
        Some(Duration::ZERO)
    );
}

async fn rate_limited_429_ignores_a_garbage_retry_after(kind: ClientKind) {
    let err = error_for(kind, Reply::new(429, "").header("retry-after", "soon-ish")).await;
    assert_eq!(err.code(), codes::RATE_LIMITED);
    assert_eq!(err.retry_after(), None);
}

async fn unavailable_503_is_retryable_and_not_sent(kind: ClientKind) {
    let err = error_for(kind, Reply::new(503, "busy")).await;
    assert_eq!(err.code(), codes::UNAVAILABLE);
    assert_eq!(err.category(), Category::Retryable);
    assert!(!err.delivery_unknown());
}

async fn server_error_500_leaves_delivery_unknown(kind: ClientKind) {
    let err = error_for(kind, resend_error(500, "internal_server_error", "oops")).await;
    assert_eq!(err.code(), codes::SERVER_ERROR);
    assert_eq!(err.category(), Category::Unknown);
    assert!(
        err.message().contains("internal_server_error: oops"),
        "{err}"
    );
}

async fn request_timeout_408_is_retryable(kind: ClientKind) {
    let err = error_for(kind, Reply::new(408, "")).await;
    assert_eq!(err.code(), codes::REQUEST_TIMEOUT);
    assert_eq!(err.category(), Category::Retryable);
}

async fn conflict_409_concurrent_idempotent_requests_leaves_delivery_unknown(kind: ClientKind) {
    let reply = resend_error(
        409,
        "concurrent_idempotent_requests",
        "Same idempotency key used while original request is still in progress.",
    );
    let err = error_for(kind, reply).await;
    assert_eq!(err.code(), codes::IDEMPOTENCY_IN_FLIGHT);
    assert_eq!(err.category(), Category::Unknown);
}

async fn conflict_409_invalid_idempotent_request_is_a_validation_error(kind: ClientKind) {
    let reply = resend_error(
        409,
        "invalid_idempotent_request",
        "Same idempotency key used with a different request payload.",
    );
    let err = error_for(kind, reply).await;
    assert_eq!(err.code(), codes::IDEMPOTENCY_KEY_REUSED);
    assert_eq!(err.category(), Category::Validation);
}

async fn conflict_409_the_codec_does_not_know_is_permanent(kind: ClientKind) {
    let err = error_for(kind, Reply::new(409, "<html>conflict</html>")).await;
    assert_eq!(err.code(), codes::CONFLICT);
    assert_eq!(err.category(), Category::Permanent);
}

async fn unprocessable_422_is_permanent_with_the_providers_text_and_no_content(kind: ClientKind) {
    let reply = resend_error(422, "validation_error", "Invalid `from` field.");
    let err = error_for(kind, reply).await;
    assert_eq!(err.code(), codes::REJECTED);
    assert_eq!(err.category(), Category::Permanent);
    let text = format!("{err} {err:?}");
    assert!(text.contains("422"), "{text}");
    assert!(
        text.contains("validation_error: Invalid `from` field."),
        "{text}"
    );
    for content in ["Nikon", "seller@example.com", "ord_20481", API_KEY] {
        assert!(!text.contains(content), "{content} leaked into {text}");
    }
}

async fn success_with_a_garbage_body_is_a_bad_response_of_unknown_delivery(kind: ClientKind) {
    let err = error_for(kind, Reply::new(200, "<html>ok</html>")).await;
    assert_eq!(err.code(), codes::BAD_RESPONSE);
    assert_eq!(err.category(), Category::Unknown);
    assert!(std::error::Error::source(&err).is_some());
}

async fn success_with_an_oversized_body_is_a_bad_response(kind: ClientKind) {
    let provider = FakeProvider::answering(Reply::new(
        200,
        format!(r#"{{"id":"{}"}}"#, "x".repeat(4096)),
    ))
    .await;
    let err = transport(kind, &provider)
        .max_response_body(1024)
        .oneshot(order_email())
        .await
        .unwrap_err();
    assert_eq!(err.code(), codes::BAD_RESPONSE);
    assert_eq!(err.category(), Category::Unknown);
    assert!(err.message().contains("longer than 1024 bytes"), "{err}");
}

async fn connection_refused_is_retryable_and_not_sent(kind: ClientKind) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let codec = ResendCodec::new(API_KEY).base_url(format!("http://{addr}").parse().unwrap());

    let err = HttpTransport::new(kind.client(), codec)
        .oneshot(order_email())
        .await
        .unwrap_err();

    assert_eq!(err.code(), codes::CONNECT);
    assert_eq!(err.category(), Category::Retryable);
    assert!(!err.delivery_unknown());
}

async fn stalled_provider_behind_a_timeout_layer_gives_elapsed(kind: ClientKind) {
    let provider = FakeProvider::answering(Reply::stall()).await;
    let service = ServiceBuilder::new()
        .layer(TimeoutLayer::new(Duration::from_millis(200)))
        .service(transport(kind, &provider));

    let err = service.oneshot(order_email()).await.unwrap_err();

    assert!(err.is::<Elapsed>(), "{err:?}");
    provider.received(1).await; // the request left: delivery is unknown
}

async fn stalled_provider_with_a_timeout_around_the_client_leaves_delivery_unknown(
    kind: ClientKind,
) {
    let provider = FakeProvider::answering(Reply::stall()).await;
    let client = ServiceBuilder::new()
        .layer(TimeoutLayer::new(Duration::from_millis(200)))
        .service(kind.client());
    let codec = ResendCodec::new(API_KEY).base_url(provider.base_url());

    let err = HttpTransport::new(client, codec)
        .oneshot(order_email())
        .await
        .unwrap_err();

    assert_eq!(err.code(), layer_codes::TIMEOUT);
    assert_eq!(err.category(), Category::Unknown);
    provider.received(1).await;
}

macro_rules! over_both_clients {
    ($($test:ident),* $(,)?) => {
        mod over_hyper_util {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(super::ClientKind::HyperUtil).await
                }
            )*
        }
        mod over_reqwest {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(super::ClientKind::Reqwest).await
                }
            )*
        }
    };
}

over_both_clients!(
    sends_resend_json_with_authorization_and_idempotency_key,
    message_without_key_goes_without_idempotency_key_header,
    every_attempt_of_a_message_carries_the_same_idempotency_key,
    rate_limited_429_is_retryable_with_retry_after_seconds,
    rate_limited_429_reads_retry_after_as_an_http_date,
    rate_limited_429_ignores_a_garbage_retry_after,
    unavailable_503_is_retryable_and_not_sent,
    server_error_500_leaves_delivery_unknown,
    request_timeout_408_is_retryable,
    conflict_409_concurrent_idempotent_requests_leaves_delivery_unknown,
    conflict_409_invalid_idempotent_request_is_a_validation_error,
    conflict_409_the_codec_does_not_know_is_permanent,
    unprocessable_422_is_permanent_with_the_providers_text_and_no_content,
    success_with_a_garbage_body_is_a_bad_response_of_unknown_delivery,
    success_with_an_oversized_body_is_a_bad_response,
    connection_refused_is_retryable_and_not_sent,
    stalled_provider_behind_a_timeout_layer_gives_elapsed,
    stalled_provider_with_a_timeout_around_the_client_leaves_delivery_unknown,
);

#[tokio::test]
async fn hyper_util_connect_errors_can_be_judged_not_sent() {
    fn never_connected(error: &(dyn std::error::Error + 'static)) -> bool {
        let mut current = Some(error);
        while let Some(e) = current {
            if e.downcast_ref::<hyper_util::client::legacy::Error>()
                .is_some_and(|e| e.is_connect())
            {
                return true;
            }
            current = e.source();
        }
        false
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let codec = ResendCodec::new(API_KEY).base_url(format!("http://{addr}").parse().unwrap());

    let err = HttpTransport::new(hyper_client(), codec)
        .not_sent_if(never_connected)
        .oneshot(order_email())
        .await
        .unwrap_err();

    assert_eq!(err.code(), codes::CONNECT);
    assert!(!err.delivery_unknown());
}

#[tokio::test]
async fn second_send_through_the_stack_is_replayed_and_the_provider_sees_one_request() {
    let provider = FakeProvider::answering(Reply::new(200, r#"{"id":"m1"}"#)).await;
    let codec = ResendCodec::new(API_KEY).base_url(provider.base_url());
    let layer = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .namespace("resend")
        .build()
        .unwrap();
    let mut service = ServiceBuilder::new()
        .layer(layer)
        .timeout(Duration::from_secs(10))
        .service(HttpTransport::new(hyper_client(), codec));

    let first = service
        .ready()
        .await
        .unwrap()
        .call(order_email())
        .await
        .unwrap();
    let again = service
        .ready()
        .await
        .unwrap()
        .call(order_email())
        .await
        .unwrap();

    assert_eq!(first.id, "m1");
    assert!(!first.replayed);
    assert_eq!(again.id, "m1");
    assert!(again.replayed);
    assert_eq!(provider.requests().len(), 1);
}

#[tokio::test]
async fn timeout_through_the_stack_keeps_the_key_and_the_provider_sees_one_request() {
    let provider = FakeProvider::answering(Reply::stall()).await;
    let codec = ResendCodec::new(API_KEY).base_url(provider.base_url());
    let mut service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .timeout(Duration::from_millis(200))
        .service(HttpTransport::new(hyper_client(), codec));

    let first = service
        .ready()
        .await
        .unwrap()
        .call(order_email())
        .await
        .unwrap_err();
    assert_eq!(first.code(), layer_codes::TIMEOUT);
    assert!(first.delivery_unknown());
    let again = service
        .ready()
        .await
        .unwrap()
        .call(order_email())
        .await
        .unwrap_err();
    assert_eq!(again.code(), layer_codes::TIMEOUT);
    assert!(again.is_replayed());
    provider.received(1).await;
    assert_eq!(provider.requests().len(), 1);
}

#[tokio::test]
async fn refused_connection_through_the_stack_frees_the_key_for_a_later_send() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let codec = ResendCodec::new(API_KEY).base_url(format!("http://{addr}").parse().unwrap());
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let mut down = ServiceBuilder::new()
        .layer(layer.clone())
        .service(HttpTransport::new(hyper_client(), codec));
    let err = down
        .ready()
        .await
        .unwrap()
        .call(order_email())
        .await
        .unwrap_err();
    assert_eq!(err.code(), codes::CONNECT);

    // The same key, through the same store, once the provider is up: it sends.
    let provider = FakeProvider::answering(Reply::new(200, r#"{"id":"m2"}"#)).await;
    let codec = ResendCodec::new(API_KEY).base_url(provider.base_url());
    let mut up = ServiceBuilder::new()
        .layer(layer)
        .service(HttpTransport::new(hyper_client(), codec));
    let receipt = up.ready().await.unwrap().call(order_email()).await.unwrap();
    assert_eq!(receipt.id, "m2");
    assert!(!receipt.replayed);
    assert_eq!(provider.requests().len(), 1);
}
