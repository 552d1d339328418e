//! Settlements that land: after a send, keeping the outcome (or freeing the key) is retried
//! on transient store errors until it lands, in the background once the caller has its
//! answer, and only a settlement that finally gives up warns.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use support::{Provider, TestStore, capture, message, send};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::layer::{DEFAULT_LEASE, DEFAULT_SETTLE_TIMEOUT};
use tower_idempotency::outcome::codes;
use tower_idempotency::{IdempotencyLayer, SendError};

fn layer(store: &TestStore) -> IdempotencyLayer {
    IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("settle")
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_complete_that_fails_once_is_retried_and_a_repeat_after_the_lease_is_replayed() {
    // The reproduction: the provider accepts, the store's connection drops once
    // while the outcome is kept.
    let store = TestStore::default();
    store.fail_next_settlements.store(1, Ordering::SeqCst);
    let provider = Provider::ok();
    let l = layer(&store);
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());

    let started = Instant::now();
    let first = send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    // The caller waited for the retry (a backoff under 10 ms), not for a timeout.
    assert!(started.elapsed() < Duration::from_millis(20));
    assert_eq!(store.completes.load(Ordering::SeqCst), 2);
    assert_eq!(l.stats().settle_retries, 1);
    assert_eq!(l.stats().store_failed_after_send, 0);

    tokio::time::sleep(DEFAULT_LEASE * 2).await;
    let again = send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.id, first.id);
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_caller_waits_at_most_the_settle_timeout_and_the_settlement_goes_on() {
    let store = TestStore::default();
    store.fail_complete.store(true, Ordering::SeqCst);
    let provider = Provider::ok();
    let l = layer(&store);
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());

    let started = Instant::now();
    let receipt = send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    assert_eq!(receipt.id, "msg-1");
    let waited = started.elapsed();
    assert!(
        waited >= DEFAULT_SETTLE_TIMEOUT
            && waited < DEFAULT_SETTLE_TIMEOUT + Duration::from_secs(1),
        "{waited:?}"
    );
    assert_eq!(l.stats().store_failed_after_send, 0);

    // The store comes back: the background settlement keeps the outcome.
    store.fail_complete.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(l.stats().settle_retries >= 5);
    assert_eq!(l.stats().store_failed_after_send, 0);
    tokio::time::sleep(DEFAULT_LEASE * 2).await;
    assert!(
        send(&mut svc, message(Some("k"), "hi"))
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_settlement_goes_on_after_the_caller_drops_the_send() {
    let store = TestStore::default();
    store.fail_complete.store(true, Ordering::SeqCst);
    let provider = Provider::ok();
    let l = layer(&store);
    let svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());

    // The provider answered at once; the caller gives up while the settlement retries.
    let dropped = tokio::time::timeout(
        Duration::from_secs(1),
        svc.clone().oneshot(message(Some("k"), "hi")),
    )
    .await;
    assert!(dropped.is_err(), "the send should still be settling");
    assert_eq!(provider.calls(), 1);
    let tries = store.completes.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(store.completes.load(Ordering::SeqCst) > tries);

    store.fail_complete.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio::time::sleep(DEFAULT_LEASE * 2).await;
    let again = svc.clone().oneshot(message(Some("k"), "hi")).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.id, "msg-1");
    assert_eq!(provider.calls(), 1);
    // It was the send's own outcome that was kept, not an abort.
    assert_eq!(l.stats().aborted, 0);
    assert_eq!(l.stats().store_failed_after_send, 0);
}

#[tokio::test(start_paused = true)]
async fn a_release_that_fails_once_is_retried_so_a_new_attempt_sends_at_once() {
    let store = TestStore::default();
    store.fail_next_settlements.store(1, Ordering::SeqCst);
    let l = layer(&store);
    let refusing =
        Provider::answering(|_, _| async { Err(SendError::permanent("p.400", "bad").into()) });
    let mut svc = ServiceBuilder::new().layer(l.clone()).service(refusing);
    let err = send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(err.code(), "p.400");
    assert_eq!(store.releases.load(Ordering::SeqCst), 2);
    assert_eq!(l.stats().settle_retries, 1);

    // The key is free: the next attempt goes now, not after the lease.
    let provider = Provider::ok();
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());
    assert!(
        !send(&mut svc, message(Some("k"), "hi"))
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(provider.calls(), 1);
    assert_eq!(l.stats().lease_lost, 0);
}

#[tokio::test(start_paused = true)]
async fn a_settlement_that_keeps_failing_gives_up_before_the_lease_ends_and_says_when_the_key_frees()
 {
    let store = TestStore::default();
    store.fail_complete.store(true, Ordering::SeqCst);
    store.fail_extend.store(true, Ordering::SeqCst);
    let lease = Duration::from_secs(30);
    let l = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("settle")
        .lease(lease)
        .build()
        .unwrap();
    let provider = Provider::ok();
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());
    let (captured, _guard) = capture();
    let started = Instant::now();
    send(&mut svc, message(Some("k"), "hi")).await.unwrap();

    tokio::time::sleep(lease).await;
    assert_eq!(l.stats().store_failed_after_send, 1);
    let tries = store.completes.load(Ordering::SeqCst);
    assert!(tries > 10, "{tries} attempts");
    let lines = captured.lines();
    let warning = lines
        .iter()
        .find(|l| l.contains(codes::STORE_FAILED_WARNING) && l.contains("free_in"))
        .unwrap_or_else(|| panic!("no give-up warning in {lines:?}"));
    assert!(warning.contains("attempts="), "{warning}");
    // It gave up within a second of the lease's end, and tries no more.
    tokio::time::sleep(lease).await;
    assert_eq!(store.completes.load(Ordering::SeqCst), tries);
    assert!(started.elapsed() >= lease);

    // After the lease the key is free: a repeat sends again, which is what the warning
    // announced.
    store.fail_complete.store(false, Ordering::SeqCst);
    send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_settlement_keeps_the_lease_renewed_while_it_retries() {
    // The outcome cannot be written for longer than the lease, though the store answers
    // renewals: the key stays held, and a repeat is in flight rather than sent.
    let store = TestStore::default();
    store.fail_complete.store(true, Ordering::SeqCst);
    let lease = Duration::from_secs(30);
    let l = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("settle")
        .lease(lease)
        .build()
        .unwrap();
    let provider = Provider::ok();
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());
    send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    tokio::time::sleep(lease * 3).await;
    assert!(store.extends() >= 6, "{} renewals", store.extends());
    let repeat = send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(repeat.code(), codes::IN_FLIGHT);
    assert_eq!(provider.calls(), 1);

    store.fail_complete.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        send(&mut svc, message(Some("k"), "hi"))
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(l.stats().store_failed_after_send, 0);
    // Settled: renewal stopped with it.
    let renewals = store.extends();
    tokio::time::sleep(lease * 3).await;
    assert_eq!(store.extends(), renewals);
}

#[test]
fn without_a_runtime_a_settlement_is_tried_once() {
    let store = TestStore::default();
    store.fail_complete.store(true, Ordering::SeqCst);
    let l = layer(&store);
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(Provider::ok());
    let answer = futures_util::FutureExt::now_or_never(svc.call(message(Some("k"), "hi")));
    assert!(!answer.unwrap().unwrap().replayed);
    assert_eq!(store.completes.load(Ordering::SeqCst), 1);
    assert_eq!(l.stats().store_failed_after_send, 1);
    assert_eq!(l.stats().settle_retries, 0);
}

#[tokio::test(start_paused = true)]
async fn an_error_that_retrying_cannot_mend_gives_up_at_once() {
    let store = TestStore::default();
    store.corrupt_complete.store(true, Ordering::SeqCst);
    let l = layer(&store);
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(Provider::ok());
    let (captured, _guard) = capture();
    let started = Instant::now();
    send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(store.completes.load(Ordering::SeqCst), 1);
    assert_eq!(l.stats().settle_retries, 0);
    assert_eq!(l.stats().store_failed_after_send, 1);
    assert!(
        captured
            .lines()
            .iter()
            .any(|l| l.contains(codes::STORE_FAILED_WARNING) && l.contains("corrupt")),
        "{:?}",
        captured.lines()
    );
}

#[tokio::test(start_paused = true)]
async fn an_error_from_complete_now_is_settled_through_complete() {
    let store = TestStore::default();
    store.fail_complete_now.store(true, Ordering::SeqCst);
    let provider = Provider::ok();
    let l = layer(&store);
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());
    let first = send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    assert_eq!(
        store.completes.load(Ordering::SeqCst),
        1,
        "settled by complete"
    );
    let again = send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.id, first.id);
    assert_eq!(provider.calls(), 1);
    assert_eq!(l.stats().store_failed_after_send, 0);
}

/// A send over a Redis server of the test's own that stops taking writes (`CLIENT PAUSE`)
/// once the provider accepted: the caller is answered at the settle timeout, whether the
/// store's own bound on each call is longer than it (its timer must not be taken for the
/// settle timeout's) or shorter (the calls time out and are retried until the settle timeout
/// answers the caller). Once the server takes writes again, the background settlement keeps
/// the outcome: a repeat is replayed, the provider called once. Real time, bounded.
#[cfg(feature = "redis")]
async fn settle_timeout_over_a_paused_redis(store_timeout: Duration, settle_timeout: Duration) {
    use support::servers::RedisServer;
    use support::stores::{redis_admin, unique_prefix};

    let Some(server) = RedisServer::start().await else {
        return;
    };
    let store = server
        .store(unique_prefix("settle-paused"), store_timeout)
        .await;
    let l = IdempotencyLayer::builder()
        .store(store)
        .namespace("settle")
        .lease(Duration::from_secs(30))
        .settle_timeout(settle_timeout)
        .build()
        .unwrap();
    let admin = redis_admin::admin(&server.url).await;
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&calls);
    let provider = tower::service_fn(move |_m: tower_idempotency::Message| {
        let mut admin = admin.clone();
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            // Accepted; the store stops taking writes before the outcome is kept.
            let _: () = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(20_000)
                .arg("WRITE")
                .query_async(&mut admin)
                .await
                .expect("CLIENT PAUSE");
            Ok::<_, tower_idempotency::BoxError>(tower_idempotency::Receipt::new("msg-1", "t"))
        }
    });
    let mut svc = ServiceBuilder::new().layer(l.clone()).service(provider);

    let started = Instant::now();
    let receipt = send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    let waited = started.elapsed();
    assert_eq!(receipt.id, "msg-1");
    assert!(
        waited >= settle_timeout && waited < settle_timeout + Duration::from_millis(700),
        "answered after {waited:?}, settle timeout {settle_timeout:?}, store bound \
         {store_timeout:?}"
    );

    let mut admin = redis_admin::admin(&server.url).await;
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut admin)
        .await
        .expect("CLIENT UNPAUSE");
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        match send(&mut svc, message(Some("k"), "hi")).await {
            Ok(again) => break again,
            // Still pending: the background settlement has not landed yet.
            Err(error) if Instant::now() < deadline => {
                assert_eq!(error.code(), codes::IN_FLIGHT, "{error:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("the outcome was never kept: {error:?}"),
        }
    };
    assert!(again.replayed);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[cfg(feature = "redis")]
#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn a_store_bound_longer_than_the_settle_timeout_does_not_stretch_it() {
    settle_timeout_over_a_paused_redis(Duration::from_secs(3), Duration::from_millis(300)).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn a_store_bound_shorter_than_the_settle_timeout_is_retried_until_it() {
    settle_timeout_over_a_paused_redis(Duration::from_millis(150), Duration::from_millis(600))
        .await;
}
