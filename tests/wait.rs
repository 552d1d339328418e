//! Repeats that can wait: with `wait_for_in_flight`, a repeat that finds the same message in
//! flight waits (polling the store) for its outcome, up to a bound.

mod support;

use std::time::Duration;

use support::{Provider, TestStore, message};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::outcome::codes;
use tower_idempotency::{IdempotencyLayer, Receipt, SendError};

fn layer(store: &TestStore, wait: Duration) -> IdempotencyLayer {
    IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("wait")
        .wait_for_in_flight(wait)
        .build()
        .unwrap()
}

/// A provider that takes `d` to answer each message with `answer(n)`.
fn slow(d: Duration, answer: fn(usize) -> Result<Receipt, SendError>) -> Provider {
    Provider::answering(move |n, _| async move {
        tokio::time::sleep(d).await;
        answer(n).map_err(Into::into)
    })
}

fn accepted(n: usize) -> Result<Receipt, SendError> {
    Ok(Receipt::new(format!("msg-{n}"), "fake"))
}

#[tokio::test(start_paused = true)]
async fn a_repeat_that_waits_gets_the_first_sends_receipt() {
    let store = TestStore::default();
    let provider = slow(Duration::from_secs(2), accepted);
    let l = layer(&store, Duration::from_secs(10));
    let svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());

    let first = tokio::spawn(svc.clone().oneshot(message(Some("k"), "hi")));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let repeat = svc.clone().oneshot(message(Some("k"), "hi")).await.unwrap();
    let waited = started.elapsed();
    let first = first.await.unwrap().unwrap();
    assert_eq!(repeat.id, first.id);
    assert!(repeat.replayed);
    // It answered soon after the first send was kept, at t = 2 s, not at its bound.
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_millis(2600),
        "{waited:?}"
    );
    assert_eq!(provider.calls(), 1);
    assert_eq!(l.stats().waited, 1);
    assert_eq!(l.stats().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn a_repeat_still_pending_at_its_bound_is_answered_in_flight() {
    let store = TestStore::default();
    let provider = slow(Duration::from_secs(30), accepted);
    let bound = Duration::from_secs(3);
    let svc = ServiceBuilder::new()
        .layer(layer(&store, bound))
        .service(provider.clone());

    let first = tokio::spawn(svc.clone().oneshot(message(Some("k"), "hi")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let repeat = svc.clone().oneshot(message(Some("k"), "hi")).await;
    let waited = started.elapsed();
    assert_eq!(repeat.unwrap_err().code(), codes::IN_FLIGHT);
    assert!(
        waited >= bound && waited < bound + Duration::from_millis(100),
        "{waited:?}"
    );
    first.await.unwrap().unwrap();
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_repeat_waiting_on_a_send_that_certainly_did_not_go_is_sent() {
    // The first send fails without sending, so its key is freed: the waiting repeat's poll
    // reserves it and sends, as a repeat arriving a moment later would.
    let store = TestStore::default();
    let provider = slow(Duration::from_secs(1), |n| {
        if n == 1 {
            Err(SendError::retryable("p.503", "try later"))
        } else {
            accepted(n)
        }
    });
    let svc = ServiceBuilder::new()
        .layer(layer(&store, Duration::from_secs(10)))
        .service(provider.clone());

    let first = tokio::spawn(svc.clone().oneshot(message(Some("k"), "hi")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let repeat = svc.clone().oneshot(message(Some("k"), "hi")).await.unwrap();
    assert_eq!(first.await.unwrap().unwrap_err().code(), "p.503");
    assert_eq!(repeat.id, "msg-2");
    assert!(!repeat.replayed);
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn another_message_under_a_pending_key_does_not_wait() {
    let store = TestStore::default();
    let provider = slow(Duration::from_secs(5), accepted);
    let svc = ServiceBuilder::new()
        .layer(layer(&store, Duration::from_secs(10)))
        .service(provider.clone());
    let first = tokio::spawn(svc.clone().oneshot(message(Some("k"), "hi")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let other = svc.clone().oneshot(message(Some("k"), "other")).await;
    assert_eq!(other.unwrap_err().code(), codes::KEY_REUSED);
    assert_eq!(started.elapsed(), Duration::ZERO);
    first.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_repeat_that_reserves_after_waiting_longer_than_the_lease_holds_a_fresh_lease() {
    // The first send runs for two leases and frees its key; the waiting repeat takes it
    // and is sent. Its settlement then fails for a while: it must retry on its own lease,
    // which started when it won the key, not when it arrived.
    let lease = Duration::from_secs(4);
    let store = TestStore::default();
    store
        .fail_complete
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let provider = Provider::answering(move |n, _| async move {
        if n == 1 {
            tokio::time::sleep(lease * 2).await;
            Err(SendError::retryable("p.503", "try later").into())
        } else {
            Ok(Receipt::new(format!("msg-{n}"), "fake"))
        }
    });
    let l = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("wait")
        .lease(lease)
        .wait_for_in_flight(Duration::from_secs(30))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());

    let first = tokio::spawn(svc.clone().oneshot(message(Some("k"), "hi")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let repeat = tokio::spawn(svc.clone().oneshot(message(Some("k"), "hi")));
    tokio::time::sleep(lease * 2 + Duration::from_millis(1500)).await;
    store
        .fail_complete
        .store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(first.await.unwrap().unwrap_err().code(), "p.503");
    assert_eq!(repeat.await.unwrap().unwrap().id, "msg-2");
    tokio::time::sleep(lease).await;
    assert_eq!(l.stats().store_failed_after_send, 0);
    assert!(l.stats().settle_retries >= 1);
    let again = svc.oneshot(message(Some("k"), "hi")).await.unwrap();
    assert!(again.replayed);
    assert_eq!(provider.calls(), 2);
}
