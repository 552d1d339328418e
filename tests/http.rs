//! `HttpTransport` with `ResendCodec` against a fake provider on 127.0.0.1, over hyper-util's
//! legacy client and over reqwest: the request the provider receives, every status mapping,
//! connection failures, timeouts, the batch form (`/emails/batch`), and the whole stack under
//! `IdempotencyLayer`.
#![cfg(feature = "http")]

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use support::http::{AnyClient, ClientKind, FakeProvider, Reply, hyper_client, resend};
use tower::timeout::TimeoutLayer;
use tower::timeout::error::Elapsed;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::batch::{Batch, BatchOutcomes};
use tower_idempotency::http::mark::key_digest;
use tower_idempotency::http::resend::{RESEND_MAX_BATCH, ResendCodec};
use tower_idempotency::http::{HttpTransport, batch_idempotency_key};
use tower_idempotency::outcome::{Category, codes};
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

fn transport(kind: ClientKind, provider: &FakeProvider) -> HttpTransport<AnyClient, ResendCodec> {
    HttpTransport::new(
        kind.client(),
        ResendCodec::new(API_KEY).base_url(provider.base_url()),
    )
}

/// Sends `order_email()` to a provider that answers `reply`, and returns the error.
async fn error_for(kind: ClientKind, reply: Reply) -> SendError {
    let provider = resend::answering(reply).await;
    let mut transport = transport(kind, &provider);
    let result = ServiceExt::<Message>::ready(&mut transport)
        .await
        .unwrap()
        .call(order_email())
        .await;
    assert_eq!(provider.requests().len(), 1);
    result.expect_err("the provider answered a failure")
}

fn resend_error(status: u16, name: &str, message: &str) -> Reply {
    Reply::json(
        status,
        serde_json::json!({ "statusCode": status, "name": name, "message": message }).to_string(),
    )
}

async fn sends_resend_json_with_authorization_and_idempotency_key(kind: ClientKind) {
    let provider = resend::answering(Reply::new(
        200,
        r#"{"id":"49a3999c-0ce1-4ea6-ab68-afcd6dc2e794"}"#,
    ))
    .await;
    let mut transport = transport(kind, &provider);

    let receipt = ServiceExt::<Message>::ready(&mut transport)
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
                // The mark a lookup finds the message by: a digest of the key, never the key.
                "Message-ID": format!("<ti-{}@marketplace.example>", key_digest(KEY)),
            },
            "attachments": [
                { "filename": "invoice.txt", "content": "Zm9vYmFy", "content_type": "text/plain" }
            ],
            "tags": [
                { "name": "kind", "value": "order_created" },
                { "name": "order_id", "value": "ord_20481" },
                { "name": "idempotency_digest", "value": key_digest(KEY) },
            ],
            "scheduled_at": "2024-02-29T12:34:56Z",
        })
    );
}

async fn message_without_key_goes_without_idempotency_key_header(kind: ClientKind) {
    let provider = resend::answering(Reply::new(200, r#"{"id":"m1"}"#)).await;
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
        resend::provider(vec![Reply::new(503, ""), Reply::new(200, r#"{"id":"m1"}"#)]).await;
    let mut transport = transport(kind, &provider);
    let message = order_email();

    let first = ServiceExt::<Message>::ready(&mut transport)
        .await
        .unwrap()
        .call(message.clone())
        .await;
    assert_eq!(first.unwrap_err().code(), codes::UNAVAILABLE);
    let second = ServiceExt::<Message>::ready(&mut transport)
        .await
        .unwrap()
        .call(message)
        .await;
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

async fn status_999_the_transport_cannot_place_leaves_delivery_unknown(kind: ClientKind) {
    let err = error_for(kind, Reply::new(999, "?")).await;
    assert_eq!(err.code(), codes::UNEXPECTED_STATUS);
    assert_eq!(err.category(), Category::Unknown);
    assert!(err.delivery_unknown());
    assert!(err.message().contains("999"), "{err}");
}

async fn see_other_303_is_not_followed_and_leaves_delivery_unknown(kind: ClientKind) {
    // After a POST, a 303 says the provider acted on it and points at the result.
    let reply = Reply::new(303, "").header("location", "/emails/msg_1");
    let err = error_for(kind, reply).await;
    assert_eq!(err.code(), codes::UNEXPECTED_STATUS);
    assert_eq!(err.category(), Category::Unknown);
}

async fn request_timeout_408_is_retryable(kind: ClientKind) {
    let err = error_for(kind, Reply::new(408, "")).await;
    assert_eq!(err.code(), codes::REQUEST_TIMEOUT);
    assert_eq!(err.category(), Category::Retryable);
}

async fn conflict_409_concurrent_idempotent_requests_is_unknown_but_retryable(kind: ClientKind) {
    let reply = resend_error(
        409,
        "concurrent_idempotent_requests",
        "Same idempotency key used while original request is still in progress.",
    );
    let err = error_for(kind, reply).await;
    assert_eq!(err.code(), codes::IDEMPOTENCY_IN_FLIGHT);
    // An earlier request under the key may send; a retry under the same key is answered its
    // outcome by Resend, so it is safe and the retry policy takes it.
    assert_eq!(err.category(), Category::Unknown);
    assert!(err.is_retryable());
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

async fn unprocessable_422_is_a_validation_error_with_the_providers_text_and_no_content(
    kind: ClientKind,
) {
    let reply = resend_error(422, "validation_error", "Invalid `from` field.");
    let err = error_for(kind, reply).await;
    assert_eq!(err.code(), codes::VALIDATION_ERROR);
    assert_eq!(err.category(), Category::Validation);
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
    let provider = resend::answering(Reply::new(
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
    let provider = resend::answering(Reply::stall()).await;
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
    let provider = resend::answering(Reply::stall()).await;
    let client = ServiceBuilder::new()
        .layer(TimeoutLayer::new(Duration::from_millis(200)))
        .service(kind.client());
    let codec = ResendCodec::new(API_KEY).base_url(provider.base_url());

    let err = HttpTransport::new(client, codec)
        .oneshot(order_email())
        .await
        .unwrap_err();

    assert_eq!(err.code(), codes::TIMEOUT);
    assert_eq!(err.category(), Category::Unknown);
    provider.received(1).await;
}

// ---- The batch form: `Service<Batch<Message>>` on `/emails/batch`. ----

/// A batchable message to `user_<key>@example.com` under idempotency key `key`.
fn welcome(key: &str) -> Message {
    Message::builder()
        .from("hello@marketplace.example")
        .to(format!("user_{key}@example.com"))
        .subject("Welcome")
        .text("Thanks for signing up.")
        .metadata("kind", "welcome")
        .idempotency_key(key)
        .build()
        .unwrap()
}

fn welcomes(keys: &[&str]) -> Batch {
    keys.iter().map(|key| welcome(key)).collect()
}

/// Resend's answer to a batch: `{"data": [{"id": ids[0]}, …]}`.
fn batch_ids(ids: &[&str]) -> Reply {
    let data: Vec<_> = ids
        .iter()
        .map(|id| serde_json::json!({ "id": id }))
        .collect();
    Reply::new(200, serde_json::json!({ "data": data }).to_string())
        .header("content-type", "application/json")
}

async fn send_batch(kind: ClientKind, provider: &FakeProvider, batch: Batch) -> BatchOutcomes {
    ServiceExt::<Batch>::ready(&mut transport(kind, provider))
        .await
        .unwrap()
        .call(batch)
        .await
        .expect("a batch is answered message by message")
}

fn ids(outcomes: &BatchOutcomes) -> Vec<&str> {
    outcomes
        .iter()
        .map(|o| o.as_ref().expect("delivered").id.as_str())
        .collect()
}

fn assert_every_error(outcomes: &BatchOutcomes, n: usize, code: &str, category: Category) {
    assert_eq!(outcomes.len(), n);
    for outcome in outcomes {
        let err = outcome.as_ref().expect_err("every message failed");
        assert_eq!(err.code(), code, "{err}");
        assert_eq!(err.category(), category, "{err}");
    }
}

async fn batch_goes_as_one_json_array_to_emails_batch_and_receipts_follow_its_order(
    kind: ClientKind,
) {
    let provider = resend::answering(batch_ids(&["id-a", "id-b", "id-c"])).await;

    let outcomes = send_batch(kind, &provider, welcomes(&["a", "b", "c"])).await;

    assert_eq!(ids(&outcomes), ["id-a", "id-b", "id-c"]);
    let first = outcomes[0].as_ref().unwrap();
    assert_eq!(first.transport, "resend");
    assert_eq!(first.accepted, ["user_a@example.com"]);
    assert!(!first.replayed);
    assert_eq!(
        outcomes[2].as_ref().unwrap().accepted,
        ["user_c@example.com"]
    );

    let requests = provider.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, http::Method::POST);
    assert_eq!(request.uri.path(), "/emails/batch");
    assert_eq!(request.header("authorization"), Some("Bearer re_test_123"));
    assert_eq!(request.header("content-type"), Some("application/json"));
    let email = |key: &str| {
        serde_json::json!({
            "from": "hello@marketplace.example",
            "to": [format!("user_{key}@example.com")],
            "subject": "Welcome",
            "text": "Thanks for signing up.",
            "headers": { "Message-ID": format!("<ti-{}@marketplace.example>", key_digest(key)) },
            "tags": [
                { "name": "kind", "value": "welcome" },
                { "name": "idempotency_digest", "value": key_digest(key) },
            ],
        })
    };
    assert_eq!(
        request.json(),
        serde_json::json!([email("a"), email("b"), email("c")])
    );
    let key = request
        .header("idempotency-key")
        .expect("a keyed batch carries a key");
    assert!(key.starts_with("batch-") && key.len() == 38, "{key}");
    assert_eq!(
        Some(key.to_owned()),
        batch_idempotency_key(welcomes(&["a", "b", "c"]).as_slice())
    );
}

async fn every_attempt_of_a_batch_carries_the_same_key_and_another_batch_another(kind: ClientKind) {
    let provider = resend::provider(vec![
        Reply::new(503, ""),
        batch_ids(&["id-a", "id-b"]),
        batch_ids(&["id-a", "id-c"]),
    ])
    .await;
    let mut transport = transport(kind, &provider);

    let first = ServiceExt::<Batch>::ready(&mut transport)
        .await
        .unwrap()
        .call(welcomes(&["a", "b"]))
        .await
        .unwrap();
    assert_every_error(&first, 2, codes::UNAVAILABLE, Category::Retryable);
    let retried = ServiceExt::<Batch>::ready(&mut transport)
        .await
        .unwrap()
        .call(welcomes(&["a", "b"]))
        .await
        .unwrap();
    assert_eq!(ids(&retried), ["id-a", "id-b"]);
    let other = ServiceExt::<Batch>::ready(&mut transport)
        .await
        .unwrap()
        .call(welcomes(&["a", "c"]))
        .await
        .unwrap();
    assert_eq!(ids(&other), ["id-a", "id-c"]);

    let keys: Vec<String> = provider
        .requests()
        .iter()
        .map(|r| r.header("idempotency-key").expect("keyed").to_owned())
        .collect();
    assert_eq!(
        keys[0], keys[1],
        "a retry of the same batch has the same key"
    );
    assert_ne!(keys[1], keys[2], "another batch has another key");
    // Neither is a message's own key: a batch is a different request from a single send.
    assert!(keys.iter().all(|k| k != "a" && k.starts_with("batch-")));
}

async fn batch_with_an_unkeyed_message_goes_without_idempotency_key(kind: ClientKind) {
    let provider = resend::answering(batch_ids(&["id-a", "id-x"])).await;
    let unkeyed = Message::builder()
        .from("hello@marketplace.example")
        .to("someone@example.com")
        .subject("Hello")
        .text("Your code is 123456")
        .build()
        .unwrap();

    let outcomes = send_batch(kind, &provider, Batch::from(vec![welcome("a"), unkeyed])).await;

    assert_eq!(ids(&outcomes), ["id-a", "id-x"]);
    assert_eq!(provider.requests()[0].header("idempotency-key"), None);
}

async fn batch_answered_with_too_few_ids_leaves_every_message_unknown(kind: ClientKind) {
    let provider = resend::answering(batch_ids(&["id-a", "id-b"])).await;

    let outcomes = send_batch(kind, &provider, welcomes(&["a", "b", "c"])).await;

    assert_every_error(&outcomes, 3, codes::BAD_RESPONSE, Category::Unknown);
    assert!(
        outcomes
            .iter()
            .all(|o| o.as_ref().unwrap_err().delivery_unknown())
    );
}

async fn batch_answered_with_a_garbage_body_leaves_every_message_unknown(kind: ClientKind) {
    let provider = resend::answering(Reply::new(200, r#"{"id":"single"}"#)).await;

    let outcomes = send_batch(kind, &provider, welcomes(&["a", "b"])).await;

    assert_every_error(&outcomes, 2, codes::BAD_RESPONSE, Category::Unknown);
    assert!(std::error::Error::source(outcomes[0].as_ref().unwrap_err()).is_some());
}

async fn rate_limited_batch_makes_every_message_retryable_with_retry_after(kind: ClientKind) {
    let reply =
        resend_error(429, "rate_limit_exceeded", "Too many requests.").header("retry-after", "3");
    let provider = resend::answering(reply).await;

    let outcomes = send_batch(kind, &provider, welcomes(&["a", "b", "c"])).await;

    assert_every_error(&outcomes, 3, codes::RATE_LIMITED, Category::Retryable);
    for outcome in &outcomes {
        let err = outcome.as_ref().unwrap_err();
        assert!(err.is_retryable());
        assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
    }
    assert_eq!(provider.requests().len(), 1);
}

async fn server_error_500_on_a_batch_leaves_every_message_unknown(kind: ClientKind) {
    let provider = resend::answering(resend_error(500, "internal_server_error", "oops")).await;

    let outcomes = send_batch(kind, &provider, welcomes(&["a", "b"])).await;

    assert_every_error(&outcomes, 2, codes::SERVER_ERROR, Category::Unknown);
}

async fn status_999_on_a_batch_leaves_every_message_unknown(kind: ClientKind) {
    let provider = resend::answering(Reply::new(999, "")).await;

    let outcomes = send_batch(kind, &provider, welcomes(&["a", "b"])).await;

    assert_every_error(&outcomes, 2, codes::UNEXPECTED_STATUS, Category::Unknown);
}

async fn more_than_100_messages_is_a_validation_error_and_nothing_is_sent(kind: ClientKind) {
    let provider = resend::answering(batch_ids(&["never"])).await;
    let keys: Vec<String> = (0..=RESEND_MAX_BATCH).map(|i| format!("k{i}")).collect();
    let batch: Batch = keys.iter().map(|k| welcome(k)).collect();
    assert_eq!(batch.len(), 101);

    let outcomes = send_batch(kind, &provider, batch).await;

    assert_every_error(&outcomes, 101, codes::BATCH_TOO_LARGE, Category::Validation);
    assert!(provider.requests().is_empty());
}

async fn exactly_100_messages_go_in_one_request(kind: ClientKind) {
    let ids_sent: Vec<String> = (0..RESEND_MAX_BATCH).map(|i| format!("id-{i}")).collect();
    let id_refs: Vec<&str> = ids_sent.iter().map(String::as_str).collect();
    let provider = resend::answering(batch_ids(&id_refs)).await;
    let keys: Vec<String> = (0..RESEND_MAX_BATCH).map(|i| format!("k{i}")).collect();

    let outcomes = send_batch(kind, &provider, keys.iter().map(|k| welcome(k)).collect()).await;

    assert_eq!(ids(&outcomes), id_refs);
    assert_eq!(provider.requests()[0].json().as_array().unwrap().len(), 100);
}

async fn messages_with_attachments_or_a_schedule_are_left_out_of_the_batch_with_a_validation_error(
    kind: ClientKind,
) {
    let provider = resend::answering(batch_ids(&["id-a", "id-d"])).await;
    let with_attachment = Message::builder()
        .from("hello@marketplace.example")
        .to("user_b@example.com")
        .subject("Hello")
        .text("Your invoice.")
        .attachment(Attachment::new("invoice.txt", "text/plain", &b"foobar"[..]))
        .idempotency_key("b")
        .build()
        .unwrap();
    let scheduled = Message::builder()
        .from("hello@marketplace.example")
        .to("user_c@example.com")
        .subject("Hello")
        .text("Later.")
        .send_at(SystemTime::now() + Duration::from_secs(3600))
        .idempotency_key("c")
        .build()
        .unwrap();
    let batch = Batch::from(vec![welcome("a"), with_attachment, scheduled, welcome("d")]);

    let outcomes = send_batch(kind, &provider, batch).await;

    assert_eq!(outcomes.len(), 4);
    assert_eq!(outcomes[0].as_ref().unwrap().id, "id-a");
    assert_eq!(outcomes[3].as_ref().unwrap().id, "id-d");
    for (i, what) in [(1, "attachments"), (2, "schedule")] {
        let err = outcomes[i].as_ref().unwrap_err();
        assert_eq!(err.code(), codes::NOT_BATCHABLE);
        assert_eq!(err.category(), Category::Validation);
        assert!(err.message().contains(what), "{err}");
    }
    let requests = provider.requests();
    assert_eq!(requests.len(), 1);
    let body = requests[0].json();
    let sent: Vec<_> = body
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["to"][0].clone())
        .collect();
    assert_eq!(sent, ["user_a@example.com", "user_d@example.com"]);
    assert!(
        body.as_array()
            .unwrap()
            .iter()
            .all(|e| e.get("attachments").is_none() && e.get("scheduled_at").is_none())
    );
    // The key is that of the messages actually sent.
    assert_eq!(
        requests[0].header("idempotency-key").map(str::to_owned),
        batch_idempotency_key(&[welcome("a"), welcome("d")])
    );
}

async fn batch_of_nothing_sendable_makes_no_request(kind: ClientKind) {
    let provider = resend::answering(batch_ids(&["never"])).await;
    let with_attachment = Message::builder()
        .from("hello@marketplace.example")
        .to("user_b@example.com")
        .subject("Hello")
        .text("Your invoice.")
        .attachment(Attachment::new("invoice.txt", "text/plain", &b"foobar"[..]))
        .build()
        .unwrap();

    assert!(
        send_batch(kind, &provider, Batch::new(Vec::new()))
            .await
            .is_empty()
    );
    let outcomes = send_batch(kind, &provider, Batch::from(vec![with_attachment])).await;
    assert_every_error(&outcomes, 1, codes::NOT_BATCHABLE, Category::Validation);

    assert!(provider.requests().is_empty());
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
    status_999_the_transport_cannot_place_leaves_delivery_unknown,
    see_other_303_is_not_followed_and_leaves_delivery_unknown,
    request_timeout_408_is_retryable,
    conflict_409_concurrent_idempotent_requests_is_unknown_but_retryable,
    conflict_409_invalid_idempotent_request_is_a_validation_error,
    conflict_409_the_codec_does_not_know_is_permanent,
    unprocessable_422_is_a_validation_error_with_the_providers_text_and_no_content,
    success_with_a_garbage_body_is_a_bad_response_of_unknown_delivery,
    success_with_an_oversized_body_is_a_bad_response,
    connection_refused_is_retryable_and_not_sent,
    stalled_provider_behind_a_timeout_layer_gives_elapsed,
    stalled_provider_with_a_timeout_around_the_client_leaves_delivery_unknown,
    batch_goes_as_one_json_array_to_emails_batch_and_receipts_follow_its_order,
    every_attempt_of_a_batch_carries_the_same_key_and_another_batch_another,
    batch_with_an_unkeyed_message_goes_without_idempotency_key,
    batch_answered_with_too_few_ids_leaves_every_message_unknown,
    batch_answered_with_a_garbage_body_leaves_every_message_unknown,
    rate_limited_batch_makes_every_message_retryable_with_retry_after,
    server_error_500_on_a_batch_leaves_every_message_unknown,
    status_999_on_a_batch_leaves_every_message_unknown,
    more_than_100_messages_is_a_validation_error_and_nothing_is_sent,
    exactly_100_messages_go_in_one_request,
    messages_with_attachments_or_a_schedule_are_left_out_of_the_batch_with_a_validation_error,
    batch_of_nothing_sendable_makes_no_request,
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
    let provider = resend::answering(Reply::new(200, r#"{"id":"m1"}"#)).await;
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

    let first = ServiceExt::<Message>::ready(&mut service)
        .await
        .unwrap()
        .call(order_email())
        .await
        .unwrap();
    let again = ServiceExt::<Message>::ready(&mut service)
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
    let provider = resend::answering(Reply::stall()).await;
    let codec = ResendCodec::new(API_KEY).base_url(provider.base_url());
    let mut service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .timeout(Duration::from_millis(200))
        .service(HttpTransport::new(hyper_client(), codec));

    let first = ServiceExt::<Message>::ready(&mut service)
        .await
        .unwrap()
        .call(order_email())
        .await
        .unwrap_err();
    assert_eq!(first.code(), codes::TIMEOUT);
    assert!(first.delivery_unknown());
    let again = ServiceExt::<Message>::ready(&mut service)
        .await
        .unwrap()
        .call(order_email())
        .await
        .unwrap_err();
    assert_eq!(again.code(), codes::TIMEOUT);
    assert!(again.is_replayed());
    provider.received(1).await;
    assert_eq!(provider.requests().len(), 1);
}

/// A status the transport cannot place may hide a message the provider took: the key is
/// kept, so a repeat is answered from the store and the provider sees one request.
#[tokio::test]
async fn status_999_through_the_stack_keeps_the_key_and_the_provider_sees_one_request() {
    let provider = resend::provider(vec![Reply::new(999, ""), Reply::accepted(2)]).await;
    let codec = ResendCodec::new(API_KEY).base_url(provider.base_url());
    let mut service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .timeout(Duration::from_secs(10))
        .service(HttpTransport::new(hyper_client(), codec));

    let first = ServiceExt::<Message>::ready(&mut service)
        .await
        .unwrap()
        .call(order_email())
        .await
        .unwrap_err();
    assert_eq!(first.code(), codes::UNEXPECTED_STATUS);
    assert!(first.delivery_unknown());
    assert!(!first.is_replayed());
    let again = ServiceExt::<Message>::ready(&mut service)
        .await
        .unwrap()
        .call(order_email())
        .await
        .unwrap_err();
    assert_eq!(again.code(), codes::UNEXPECTED_STATUS);
    assert!(again.is_replayed(), "the repeat is answered from the store");
    assert_eq!(provider.requests().len(), 1, "the provider was called once");
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
    let err = ServiceExt::<Message>::ready(&mut down)
        .await
        .unwrap()
        .call(order_email())
        .await
        .unwrap_err();
    assert_eq!(err.code(), codes::CONNECT);

    // The same key, through the same store, once the provider is up: it sends.
    let provider = resend::answering(Reply::new(200, r#"{"id":"m2"}"#)).await;
    let codec = ResendCodec::new(API_KEY).base_url(provider.base_url());
    let mut up = ServiceBuilder::new()
        .layer(layer)
        .service(HttpTransport::new(hyper_client(), codec));
    let receipt = ServiceExt::<Message>::ready(&mut up)
        .await
        .unwrap()
        .call(order_email())
        .await
        .unwrap();
    assert_eq!(receipt.id, "m2");
    assert!(!receipt.replayed);
    assert_eq!(provider.requests().len(), 1);
}

#[tokio::test]
async fn batch_through_the_stack_sends_only_new_messages_and_replays_the_next_identical_batch() {
    let provider = resend::provider(vec![
        Reply::new(200, r#"{"id":"id-seen"}"#),
        batch_ids(&["id-a", "id-b", "id-c"]),
    ])
    .await;
    let codec = ResendCodec::new(API_KEY).base_url(provider.base_url());
    let layer = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .namespace("resend")
        .build()
        .unwrap();
    let keys = layer.clone();
    let mut service = ServiceBuilder::new()
        .layer(layer)
        .timeout(Duration::from_secs(10))
        .service(HttpTransport::new(hyper_client(), codec));

    // "seen" went before, alone, through the same store.
    let seen = ServiceExt::<Message>::ready(&mut service)
        .await
        .unwrap()
        .call(welcome("seen"))
        .await
        .unwrap();
    assert_eq!(seen.id, "id-seen");

    let batch = || welcomes(&["a", "seen", "b", "c"]);
    let first = ServiceExt::<Batch>::ready(&mut service)
        .await
        .unwrap()
        .call(batch())
        .await
        .unwrap();

    let receipts: Vec<_> = first.iter().map(|o| o.as_ref().unwrap()).collect();
    let ids: Vec<_> = receipts.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["id-a", "id-seen", "id-b", "id-c"]);
    let replayed: Vec<_> = receipts.iter().map(|r| r.replayed).collect();
    assert_eq!(replayed, [false, true, false, false]);

    let requests = provider.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].uri.path(), "/emails");
    let request = &requests[1];
    assert_eq!(request.uri.path(), "/emails/batch");
    let to: Vec<_> = request
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["to"][0].clone())
        .collect();
    assert_eq!(
        to,
        [
            "user_a@example.com",
            "user_b@example.com",
            "user_c@example.com"
        ]
    );
    // Derived from the keys the layer's store holds (namespaced), in order.
    let under_stored_key = |k: &str| {
        let stored = keys.stored_key_for(k).unwrap();
        Message::builder()
            .from("a@example.com")
            .to("b@example.com")
            .text("only the key counts")
            .idempotency_key(stored)
            .build()
            .unwrap()
    };
    let expected = ["a", "b", "c"].map(under_stored_key);
    assert_eq!(
        request.header("idempotency-key").map(str::to_owned),
        batch_idempotency_key(&expected)
    );

    // The same batch again: every message answered from the store, no request.
    let again = ServiceExt::<Batch>::ready(&mut service)
        .await
        .unwrap()
        .call(batch())
        .await
        .unwrap();
    let receipts: Vec<_> = again.iter().map(|o| o.as_ref().unwrap()).collect();
    assert_eq!(
        receipts.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["id-a", "id-seen", "id-b", "id-c"]
    );
    assert!(receipts.iter().all(|r| r.replayed));
    assert_eq!(provider.requests().len(), 2);
}

#[tokio::test]
async fn batch_left_out_message_frees_its_key_through_the_stack_for_a_single_send() {
    let provider = resend::provider(vec![
        batch_ids(&["id-a"]),
        Reply::new(200, r#"{"id":"id-invoice"}"#),
    ])
    .await;
    let codec = ResendCodec::new(API_KEY).base_url(provider.base_url());
    let mut service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .service(HttpTransport::new(hyper_client(), codec));
    let invoice = Message::builder()
        .from("hello@marketplace.example")
        .to("user_b@example.com")
        .subject("Hello")
        .text("Your invoice.")
        .attachment(Attachment::new("invoice.txt", "text/plain", &b"foobar"[..]))
        .idempotency_key("invoice:b")
        .build()
        .unwrap();

    let outcomes = ServiceExt::<Batch>::ready(&mut service)
        .await
        .unwrap()
        .call(Batch::from(vec![welcome("a"), invoice.clone()]))
        .await
        .unwrap();
    assert_eq!(outcomes[0].as_ref().unwrap().id, "id-a");
    assert_eq!(
        outcomes[1].as_ref().unwrap_err().code(),
        codes::NOT_BATCHABLE
    );

    // As its error says: send it on its own, under the same key.
    let receipt = ServiceExt::<Message>::ready(&mut service)
        .await
        .unwrap()
        .call(invoice)
        .await
        .unwrap();
    assert_eq!(receipt.id, "id-invoice");
    assert!(!receipt.replayed);
    let paths: Vec<_> = provider
        .requests()
        .iter()
        .map(|r| r.uri.path().to_owned())
        .collect();
    assert_eq!(paths, ["/emails/batch", "/emails"]);
}
