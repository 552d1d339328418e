//! The layer in the stack users build: with a real circuit breaker
//! (`tower-resilience-circuitbreaker`), retries and timeouts.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use support::{Provider, TestStore, breaker_error, message};
use tower::retry::RetryLayer;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::outcome::codes;
use tower_idempotency::{
    BoxError, IdempotencyLayer, Receipt, RetryPolicy, SendError, counts_against_provider,
};
use tower_resilience_circuitbreaker::{CircuitBreakerLayer, CircuitState};

/// A breaker that opens after 4 counted failures in a window of 4 calls.
fn breaker() -> CircuitBreakerLayer<
    impl tower_resilience_circuitbreaker::FailureClassifier<Receipt, BoxError> + Clone,
> {
    CircuitBreakerLayer::builder()
        .sliding_window_size(4)
        .minimum_number_of_calls(4)
        .failure_rate_threshold(0.5)
        .failure_classifier(|r: &Result<Receipt, BoxError>| counts_against_provider(r))
        .build()
        .expect("valid breaker")
}

#[tokio::test]
async fn breaker_inside_the_layer_never_sees_the_layers_own_answers() {
    let provider = Provider::ok();
    let breaker = breaker().layer_fn(provider.clone());
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::in_memory())
        .map_err(breaker_error)
        .service(breaker.clone());
    svc.clone().oneshot(message(Some("k"), "hi")).await.unwrap();
    // Many repeats and reused keys: answered by the layer, the breaker is not called.
    for _ in 0..10 {
        assert!(
            svc.clone()
                .oneshot(message(Some("k"), "hi"))
                .await
                .unwrap()
                .replayed
        );
        let e = svc
            .clone()
            .oneshot(message(Some("k"), "other"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), codes::KEY_REUSED);
    }
    let metrics = breaker.metrics().await;
    assert_eq!(metrics.total_calls, 1, "{metrics:?}");
    assert_eq!(breaker.state().await, CircuitState::Closed);
}

#[tokio::test]
async fn breaker_outside_the_layer_ignores_its_answers_with_the_predicate() {
    let store = TestStore::default();
    store.fail_reserve.store(true, Ordering::SeqCst);
    let provider = Provider::ok();
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .build()
        .unwrap();
    let outside = CircuitBreakerLayer::builder()
        .sliding_window_size(4)
        .minimum_number_of_calls(4)
        .failure_rate_threshold(0.5)
        .failure_classifier(|r: &Result<Receipt, SendError>| counts_against_provider(r))
        .build()
        .unwrap();
    let svc = outside.layer_fn(ServiceBuilder::new().layer(layer).service(provider.clone()));
    // Store failures: the layer's answers, of category unknown.
    for _ in 0..8 {
        let e = svc
            .clone()
            .oneshot(message(Some("k"), "hi"))
            .await
            .unwrap_err();
        assert_eq!(e.into_inner().unwrap().code(), codes::STORE_FAILED);
    }
    assert_eq!(svc.state().await, CircuitState::Closed);
    // In flight and replayed answers do not count either.
    store.fail_reserve.store(false, Ordering::SeqCst);
    svc.clone().oneshot(message(Some("k"), "hi")).await.unwrap();
    for _ in 0..8 {
        assert!(
            svc.clone()
                .oneshot(message(Some("k"), "hi"))
                .await
                .unwrap()
                .replayed
        );
    }
    assert_eq!(svc.state().await, CircuitState::Closed);
    assert_eq!(provider.calls(), 1);
}

#[tokio::test]
async fn provider_failures_open_the_breaker_and_an_open_circuit_frees_the_key() {
    let failing = Arc::new(AtomicBool::new(true));
    let f = Arc::clone(&failing);
    let provider = Provider::answering(move |n, _| {
        let fail = f.load(Ordering::SeqCst);
        async move {
            if fail {
                Err(SendError::retryable("provider.unavailable", "503").into())
            } else {
                Ok(Receipt::new(format!("msg-{n}"), "fake"))
            }
        }
    });
    let breaker = breaker().layer_fn(provider.clone());
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::in_memory())
        .map_err(breaker_error)
        .service(breaker.clone());
    for i in 0..4 {
        let e = svc
            .clone()
            .oneshot(message(Some(&format!("k{i}")), "hi"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), "provider.unavailable");
    }
    assert_eq!(breaker.state().await, CircuitState::Open);

    // Open: not sent, retryable, and the key is freed.
    let e = svc
        .clone()
        .oneshot(message(Some("after"), "hi"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), codes::CIRCUIT_OPEN);
    assert!(e.is_retryable());
    assert!(!e.delivery_unknown());
    let calls = provider.calls();

    failing.store(false, Ordering::SeqCst);
    breaker.force_closed().await;
    let receipt = svc
        .clone()
        .oneshot(message(Some("after"), "hi"))
        .await
        .unwrap();
    assert!(
        !receipt.replayed,
        "the open circuit must not have kept the key"
    );
    assert_eq!(provider.calls(), calls + 1);
}

#[tokio::test(start_paused = true)]
async fn the_whole_stack_composes_retry_breaker_limit_and_timeout() {
    let provider = Provider::answering(|n, _| async move {
        if n == 1 {
            Err(SendError::retryable("provider.unavailable", "503").into())
        } else {
            Ok(Receipt::new(format!("msg-{n}"), "fake"))
        }
    });
    let breaker = breaker().layer_fn(
        ServiceBuilder::new()
            .concurrency_limit(4)
            .timeout(std::time::Duration::from_secs(5))
            .service(provider.clone()),
    );
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::in_memory())
        .layer(RetryLayer::new(RetryPolicy::new()))
        .map_err(breaker_error)
        .service(breaker);
    let receipt = svc.clone().oneshot(message(Some("k"), "hi")).await.unwrap();
    assert_eq!(receipt.id, "msg-2");
    assert!(
        svc.oneshot(message(Some("k"), "hi"))
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(provider.calls(), 2);
}
