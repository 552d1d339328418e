//! The whole production stack over real sockets: `IdempotencyLayer`, tower's `RetryLayer` with
//! `RetryPolicy`, a `tower-resilience` circuit breaker, a concurrency limit and a per-attempt
//! timeout over `HttpTransport` (hyper-util's legacy client, `ResendCodec`), against a fake
//! provider on 127.0.0.1 that records when each request arrived, its `Idempotency-Key` and its
//! body, and answers by a script per test.
//!
//! Real time, bounded: the clock is not paused (hyper and axum run real sockets), so waits are
//! short and every wait on the provider has a deadline.
#![cfg(feature = "http")]

mod support;

use std::time::{Duration, Instant};

use support::breaker_error;
use support::http::{DEADLINE, FakeProvider, Reply, hyper_client, resend, script};
use tokio::task::JoinSet;
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::resend::ResendCodec;
use tower_idempotency::outcome::codes;
use tower_idempotency::{
    BoxError, IdempotencyLayer, Message, Receipt, RetryPolicy, SendError, counts_against_provider,
};
use tower_resilience_circuitbreaker::CircuitBreakerLayer;

// ---------------------------------------------------------------------------------------------
// The stack
// ---------------------------------------------------------------------------------------------

/// What a test varies in the stack.
struct Options {
    concurrency: usize,
    per_attempt: Duration,
    policy: RetryPolicy,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            concurrency: 4,
            per_attempt: Duration::from_secs(2),
            policy: RetryPolicy::new()
                .max_attempts(3)
                .base_delay(Duration::from_millis(10)),
        }
    }
}

/// The key the provider sees: the key the layer's store holds (default namespace).
fn stored_key(key: &str) -> String {
    IdempotencyLayer::in_memory().stored_key_for(key).unwrap()
}

/// The stack the README's "Production stack" section describes, over `provider`.
fn stack(
    layer: IdempotencyLayer,
    provider: &FakeProvider,
    options: Options,
) -> impl Service<Message, Response = Receipt, Error = SendError, Future: Send> + Clone + Send + 'static
{
    // Wide enough that no test here opens it: these tests are about the other layers.
    let breaker = CircuitBreakerLayer::builder()
        .sliding_window_size(20)
        .minimum_number_of_calls(20)
        .failure_rate_threshold(0.5)
        .failure_classifier(|r: &Result<Receipt, BoxError>| counts_against_provider(r))
        .build()
        .expect("valid breaker");
    let transport = HttpTransport::new(
        hyper_client(),
        ResendCodec::new("re_test_123").base_url(provider.base_url()),
    );
    ServiceBuilder::new()
        .layer(layer)
        .layer(RetryLayer::new(options.policy))
        .map_err(breaker_error)
        .layer(breaker)
        .concurrency_limit(options.concurrency)
        .timeout(options.per_attempt)
        .service(transport)
}

fn order_email(order: &str) -> Message {
    Message::builder()
        .from("orders@marketplace.example")
        .to("seller@example.com")
        .subject(format!("New order {order}"))
        .text("Vintage Nikon FM2 just sold.")
        .idempotency_key(format!("order.created:{order}:email"))
        .build()
        .expect("valid message")
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn rate_limited_send_waits_for_retry_after_and_resends_under_the_same_key() {
    let provider = resend::provider(script(|n, _| async move {
        if n == 1 {
            Reply::json(
                429,
                r#"{"statusCode":429,"name":"rate_limit_exceeded","message":"slow down"}"#,
            )
            .header("retry-after", "1")
        } else {
            Reply::accepted(n)
        }
    }))
    .await;
    let service = stack(IdempotencyLayer::in_memory(), &provider, Options::default());

    let receipt = service.oneshot(order_email("ord_1")).await.unwrap();

    assert_eq!(receipt.id, "msg-2");
    assert!(!receipt.replayed);
    let arrivals = provider.requests();
    assert_eq!(arrivals.len(), 2, "one 429, one resend");
    assert_eq!(
        arrivals[0].key,
        Some(stored_key("order.created:ord_1:email"))
    );
    assert_eq!(arrivals[1].key, arrivals[0].key);
    assert_eq!(arrivals[1].body, arrivals[0].body, "the same message");
    let waited = arrivals[1].at.duration_since(arrivals[0].at);
    assert!(
        waited >= Duration::from_secs(1),
        "the resend came {waited:?} after the 429 with Retry-After: 1"
    );
}

#[tokio::test]
async fn unavailable_three_times_fails_retryable_and_frees_the_key() {
    let provider = resend::provider(script(|n, _| async move {
        if n <= 3 {
            Reply::json(
                503,
                r#"{"statusCode":503,"name":"service_unavailable","message":"try later"}"#,
            )
        } else {
            Reply::accepted(n)
        }
    }))
    .await;
    let layer = IdempotencyLayer::in_memory();
    let service = stack(layer.clone(), &provider, Options::default());

    let error = service
        .clone()
        .oneshot(order_email("ord_2"))
        .await
        .unwrap_err();

    assert_eq!(error.code(), codes::UNAVAILABLE);
    assert!(error.is_retryable());
    assert!(!error.delivery_unknown());
    assert_eq!(provider.requests().len(), 3, "max_attempts(3)");

    // The key was freed: the same message later goes again.
    let receipt = service.oneshot(order_email("ord_2")).await.unwrap();
    assert_eq!(receipt.id, "msg-4");
    assert!(!receipt.replayed);
    let arrivals = provider.requests();
    assert_eq!(arrivals.len(), 4);
    assert!(
        arrivals
            .iter()
            .all(|a| a.key == Some(stored_key("order.created:ord_2:email")))
    );
    assert_eq!(layer.stats().sent, 2);
}

#[tokio::test]
async fn attempt_timeout_is_unknown_delivery_and_keeps_the_key() {
    // The provider takes the request and never answers until the test ends.
    let provider = resend::provider(script(|n, provider| async move {
        provider.released().await;
        Reply::accepted(n)
    }))
    .await;
    let layer = IdempotencyLayer::in_memory();
    let options = Options {
        per_attempt: Duration::from_millis(200),
        ..Options::default()
    };
    let service = stack(layer.clone(), &provider, options);

    let started = Instant::now();
    let error = service
        .clone()
        .oneshot(order_email("ord_3"))
        .await
        .unwrap_err();

    assert!(
        started.elapsed() < Duration::from_secs(2),
        "one attempt only"
    );
    assert_eq!(error.code(), codes::TIMEOUT);
    assert!(error.delivery_unknown());
    assert!(!error.is_retryable());
    assert!(!error.is_replayed());
    assert_eq!(
        provider.requests().len(),
        1,
        "unknown delivery is not retried"
    );

    // The key is kept: the same message is answered from the store, not sent again.
    let again = service.oneshot(order_email("ord_3")).await.unwrap_err();
    assert_eq!(again.code(), codes::TIMEOUT);
    assert!(again.is_replayed());
    assert_eq!(provider.requests().len(), 1);
    let stats = layer.stats();
    assert_eq!((stats.sent, stats.replayed), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_limit_bounds_requests_the_provider_holds_at_once() {
    const MESSAGES: usize = 50;
    const LIMIT: usize = 4;
    // Each request waits for the rest of its group of 4 to arrive (bounded), so that the
    // requests really overlap: a group cannot fill unless 4 are in flight together, and the
    // next group cannot start until one of this group is answered.
    let provider = resend::provider(script(|n, provider| async move {
        let group_end = n.div_ceil(LIMIT) * LIMIT;
        provider.arrived(group_end.min(MESSAGES)).await;
        Reply::accepted(n)
    }))
    .await;
    let options = Options {
        concurrency: LIMIT,
        // A request waits for its whole group, which arrives only as the group before it is
        // answered: on a loaded machine that can take longer than the stack's usual 2 s,
        // and a timeout here would fail the test for a reason it is not about.
        per_attempt: DEADLINE,
        ..Options::default()
    };
    let service = stack(IdempotencyLayer::in_memory(), &provider, options);

    let mut sends = JoinSet::new();
    for i in 0..MESSAGES {
        sends.spawn(service.clone().oneshot(order_email(&format!("ord_c{i}"))));
    }
    let mut receipts = Vec::new();
    while let Some(result) = sends.join_next().await {
        receipts.push(result.unwrap().unwrap());
    }

    assert_eq!(receipts.len(), MESSAGES);
    assert!(receipts.iter().all(|r| !r.replayed));
    assert_eq!(provider.requests().len(), MESSAGES);
    assert_eq!(
        provider.max_in_flight(),
        LIMIT,
        "the provider held at most (and, as the script waits, exactly) the limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_through_the_stack_reach_the_provider_once() {
    const DUPLICATES: usize = 50;
    // The provider holds the one send until the test has every other answer.
    let provider = resend::provider(script(|n, provider| async move {
        provider.released().await;
        Reply::accepted(n)
    }))
    .await;
    let layer = IdempotencyLayer::in_memory();
    let service = stack(layer.clone(), &provider, Options::default());

    let mut sends = JoinSet::new();
    for _ in 0..DUPLICATES {
        sends.spawn(service.clone().oneshot(order_email("ord_5")));
    }
    let mut in_flight = 0;
    let mut replayed = 0;
    for _ in 1..DUPLICATES {
        match sends.join_next().await.unwrap().unwrap() {
            Err(e) if e.code() == codes::IN_FLIGHT => in_flight += 1,
            Ok(receipt) if receipt.replayed => replayed += 1,
            other => panic!("a duplicate was not answered by the layer: {other:?}"),
        }
    }
    provider.release();
    let sent = sends.join_next().await.unwrap().unwrap().unwrap();

    assert!(!sent.replayed);
    assert_eq!(sent.id, "msg-1");
    assert_eq!(in_flight + replayed, DUPLICATES - 1);
    assert!(sends.is_empty());
    let arrivals = provider.requests();
    assert_eq!(arrivals.len(), 1);
    assert_eq!(
        arrivals[0].key,
        Some(stored_key("order.created:ord_5:email"))
    );
    assert_eq!(layer.stats().sent, 1);
}
