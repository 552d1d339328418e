//! The retry policy: what it retries, when, and how often. Time is tokio's paused clock.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{Provider, message};
use tokio::time::Instant;
use tower::retry::RetryLayer;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::{BoxError, IdempotencyLayer, Receipt, RetryPolicy, SendError};

/// When each call came, with the key and text it carried.
type Calls = Arc<Mutex<Vec<(Instant, Option<String>, String)>>>;

/// A provider that fails with `errors` in turn, then succeeds, and records when and what it
/// was called with.
fn scripted(errors: Vec<SendError>) -> (Provider, Calls) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let provider = Provider::answering(move |n, m| {
        log.lock().unwrap().push((
            Instant::now(),
            m.idempotency_key().map(|k| k.as_str().to_owned()),
            m.text().unwrap_or_default().to_owned(),
        ));
        let next = errors.get(n - 1).cloned();
        async move {
            match next {
                Some(e) => Err(BoxError::from(e)),
                None => Ok(Receipt::new(format!("msg-{n}"), "fake")),
            }
        }
    });
    (provider, seen)
}

fn unavailable() -> SendError {
    SendError::retryable("provider.unavailable", "503")
}

#[tokio::test(start_paused = true)]
async fn retryable_failures_are_retried_with_the_same_message_and_key() {
    let (provider, seen) = scripted(vec![unavailable(), unavailable()]);
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::new().max_attempts(3)))
        .service(provider.clone());
    let receipt = svc.oneshot(message(Some("k1"), "body")).await.unwrap();
    assert_eq!(receipt.id, "msg-3");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    for (_, key, text) in seen.iter() {
        assert_eq!(key.as_deref(), Some("k1"));
        assert_eq!(text, "body");
    }
}

#[tokio::test(start_paused = true)]
async fn attempts_are_bounded_and_the_last_error_is_returned() {
    let (provider, _) = scripted(vec![unavailable(); 10]);
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::new().max_attempts(4)))
        .service(provider.clone());
    let err = svc.oneshot(message(Some("k"), "b")).await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<SendError>().unwrap().code(),
        "provider.unavailable"
    );
    assert_eq!(provider.calls(), 4);
}

#[tokio::test(start_paused = true)]
async fn validation_permanent_and_unknown_failures_are_not_retried_by_default() {
    for error in [
        SendError::validation("provider.invalid", "bad address"),
        SendError::permanent("provider.rejected", "422"),
        SendError::unknown_delivery("provider.server_error", "500"),
    ] {
        let (provider, _) = scripted(vec![error.clone(); 5]);
        let svc = ServiceBuilder::new()
            .layer(RetryLayer::new(RetryPolicy::new().max_attempts(5)))
            .service(provider.clone());
        svc.oneshot(message(Some("k"), "b")).await.unwrap_err();
        assert_eq!(provider.calls(), 1, "{} must not be retried", error.code());
    }
}

#[tokio::test(start_paused = true)]
async fn unknown_delivery_is_retried_only_when_configured() {
    let (provider, _) = scripted(vec![SendError::unknown_delivery(
        "provider.server_error",
        "500",
    )]);
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(
            RetryPolicy::new().retry_unknown_delivery(true),
        ))
        .service(provider.clone());
    assert_eq!(
        svc.oneshot(message(Some("k"), "b")).await.unwrap().id,
        "msg-2"
    );
}

#[tokio::test(start_paused = true)]
async fn a_timeout_is_unknown_delivery_and_not_retried_by_default() {
    let provider = Provider::answering(|_, _| async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(Receipt::new("late", "fake"))
    });
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::new()))
        .timeout(Duration::from_secs(1))
        .service(provider.clone());
    svc.oneshot(message(Some("k"), "b")).await.unwrap_err();
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn retry_after_from_the_provider_is_honoured() {
    let limited = SendError::retryable("provider.rate_limited", "429")
        .with_retry_after(Duration::from_secs(7));
    let (provider, seen) = scripted(vec![limited]);
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(
            RetryPolicy::new().base_delay(Duration::from_millis(10)),
        ))
        .service(provider.clone());
    svc.oneshot(message(Some("k"), "b")).await.unwrap();
    let seen = seen.lock().unwrap();
    let gap = seen[1].0 - seen[0].0;
    assert!(gap >= Duration::from_secs(7), "waited only {gap:?}");
    assert!(gap < Duration::from_secs(8), "waited {gap:?}");
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_past_the_budget_ends_the_retries() {
    let limited = SendError::retryable("provider.rate_limited", "429")
        .with_retry_after(Duration::from_secs(120));
    let (provider, _) = scripted(vec![limited]);
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(
            RetryPolicy::new().max_elapsed(Duration::from_secs(60)),
        ))
        .service(provider.clone());
    let start = Instant::now();
    svc.oneshot(message(Some("k"), "b")).await.unwrap_err();
    assert_eq!(provider.calls(), 1);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "it must not wait before giving up"
    );
}

#[tokio::test(start_paused = true)]
async fn backoff_grows_exponentially_with_jitter_and_is_capped() {
    let (provider, seen) = scripted(vec![unavailable(); 5]);
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(
            RetryPolicy::new()
                .max_attempts(6)
                .base_delay(Duration::from_millis(100))
                .max_delay(Duration::from_millis(300)),
        ))
        .service(provider.clone());
    svc.oneshot(message(Some("k"), "b")).await.unwrap();
    let seen = seen.lock().unwrap();
    let gaps: Vec<Duration> = seen.windows(2).map(|w| w[1].0 - w[0].0).collect();
    // Full delays 100, 200, 300 (capped), 300, 300 ms; each wait is between half and all.
    let full = [100u64, 200, 300, 300, 300];
    for (gap, full) in gaps.iter().zip(full) {
        let full = Duration::from_millis(full);
        assert!(
            *gap >= full / 2 && *gap <= full,
            "gap {gap:?} outside [{:?}, {full:?}]",
            full / 2
        );
    }
    assert_eq!(gaps.len(), 5);
}

#[tokio::test(start_paused = true)]
async fn behind_the_layer_exhausted_retries_free_the_key_and_a_later_send_goes() {
    let (provider, _) = scripted(vec![unavailable(); 3]);
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::in_memory())
        .layer(RetryLayer::new(RetryPolicy::new().max_attempts(3)))
        .service(provider.clone());
    let err = svc
        .clone()
        .oneshot(message(Some("k"), "b"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "provider.unavailable");
    assert!(err.is_retryable());
    assert_eq!(provider.calls(), 3);
    let receipt = svc.oneshot(message(Some("k"), "b")).await.unwrap();
    assert_eq!(receipt.id, "msg-4");
    assert!(!receipt.replayed);
}

#[tokio::test(start_paused = true)]
async fn connection_refused_is_retried() {
    let provider = Provider::answering(|n, _| async move {
        if n == 1 {
            Err(BoxError::from(std::io::Error::from(
                std::io::ErrorKind::ConnectionRefused,
            )))
        } else {
            Ok(Receipt::new("ok", "fake"))
        }
    });
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::new()))
        .service(provider.clone());
    svc.oneshot(message(Some("k"), "b")).await.unwrap();
    assert_eq!(provider.calls(), 2);
}
