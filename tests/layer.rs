//! The send contract of `IdempotencyLayer` through `ServiceBuilder`, case by case: what the
//! store holds under the key decides whether the provider is called (the table in the
//! README's "What it does"), and the outcome decides whether the key is kept or freed.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use support::{Provider, TestStore, capture, message, send};
use tokio::sync::{Notify, oneshot};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::layer::{ConfigError, DEFAULT_LEASE};
use tower_idempotency::outcome::{Category, codes};
use tower_idempotency::store::{Record, RecordState, Reservation, Store};
use tower_idempotency::{
    BoxError, Envelope, IdempotencyLayer, MemoryStore, Message, RawMessage, Receipt, SendError,
};

fn layer(store: &TestStore) -> IdempotencyLayer {
    IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("test")
        .build()
        .unwrap()
}

#[tokio::test]
async fn first_send_under_a_key_reaches_the_provider() {
    let store = TestStore::default();
    let provider = Provider::ok();
    let mut svc = ServiceBuilder::new()
        .layer(layer(&store))
        .service(provider.clone());
    let receipt = send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    assert_eq!(receipt.id, "msg-1");
    assert!(!receipt.replayed);
    assert_eq!(receipt.category(), Category::Delivered);
    assert_eq!(provider.calls(), 1);
    assert_eq!(store.reserves.load(Ordering::SeqCst), 1);
    assert_eq!(store.completes.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn second_send_under_same_key_replays_first_receipt() {
    let store = TestStore::default();
    let provider = Provider::ok();
    let l = layer(&store);
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());
    let first = send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    let again = send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    assert_eq!(again.id, first.id);
    assert!(again.replayed);
    assert_eq!(again.category(), Category::Unknown);
    assert_eq!(provider.calls(), 1);
    assert_eq!(l.stats().replayed, 1);
    assert_eq!(l.stats().sent, 1);
}

#[tokio::test]
async fn send_while_the_first_is_in_flight_is_answered_in_flight_and_not_sent() {
    let store = TestStore::default();
    let release = Arc::new(Notify::new());
    let gate = Arc::clone(&release);
    let provider = Provider::answering(move |n, _| {
        let gate = Arc::clone(&gate);
        async move {
            gate.notified().await;
            Ok(Receipt::new(format!("msg-{n}"), "fake"))
        }
    });
    let svc = ServiceBuilder::new()
        .layer(layer(&store))
        .service(provider.clone());
    let first = tokio::spawn(svc.clone().oneshot(message(Some("k"), "hi")));
    // Wait until the provider holds the first send.
    support::wait_until(|| provider.calls() != 0).await;
    let err = svc
        .clone()
        .oneshot(message(Some("k"), "hi"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), codes::IN_FLIGHT);
    assert_eq!(err.category(), Category::Unknown);
    assert!(err.delivery_unknown());
    assert!(err.is_retryable());
    assert_eq!(provider.calls(), 1);
    release.notify_one();
    assert_eq!(first.await.unwrap().unwrap().id, "msg-1");
}

#[tokio::test]
async fn another_message_under_a_used_key_is_refused_as_key_reused() {
    let store = TestStore::default();
    let provider = Provider::ok();
    let mut svc = ServiceBuilder::new()
        .layer(layer(&store))
        .service(provider.clone());
    send(&mut svc, message(Some("k"), "first")).await.unwrap();
    let err = send(&mut svc, message(Some("k"), "second"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), codes::KEY_REUSED);
    assert_eq!(err.category(), Category::Validation);
    assert!(!err.is_retryable());
    assert_eq!(provider.calls(), 1);
}

#[tokio::test]
async fn another_message_under_a_pending_key_is_refused_as_key_reused() {
    let store = TestStore::default();
    *store.forced.lock().unwrap() = Some(Reservation::Held {
        record: Record::pending(Fingerprint::from_bytes([0; 32])),
    });
    let provider = Provider::ok();
    let mut svc = ServiceBuilder::new()
        .layer(layer(&store))
        .service(provider.clone());
    let err = send(&mut svc, message(Some("k"), "x")).await.unwrap_err();
    assert_eq!(err.code(), codes::KEY_REUSED);
    assert_eq!(provider.calls(), 0);
}

#[tokio::test]
async fn unkeyed_message_is_sent_as_it_is_and_never_touches_the_store() {
    let store = TestStore::default();
    let provider = Provider::ok();
    let l = layer(&store);
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());
    send(&mut svc, message(None, "hi")).await.unwrap();
    send(&mut svc, message(None, "hi")).await.unwrap();
    assert_eq!(provider.calls(), 2);
    assert_eq!(store.total_calls(), 0);
    assert_eq!(l.stats().unkeyed, 2);
}

#[tokio::test]
async fn failure_that_did_not_send_frees_the_key_and_a_retry_sends() {
    let store = TestStore::default();
    let provider = Provider::answering(|n, _| async move {
        if n == 1 {
            Err(SendError::retryable("provider.503", "unavailable").into())
        } else {
            Ok(Receipt::new(format!("msg-{n}"), "fake"))
        }
    });
    let mut svc = ServiceBuilder::new()
        .layer(layer(&store))
        .service(provider.clone());
    let err = send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(err.code(), "provider.503");
    assert_eq!(store.releases.load(Ordering::SeqCst), 1);
    let receipt = send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    assert_eq!(receipt.id, "msg-2");
    assert!(!receipt.replayed);
    assert_eq!(provider.calls(), 2);
}

#[tokio::test]
async fn permanent_and_validation_failures_free_the_key_too() {
    for error in [
        SendError::permanent("provider.422", "rejected"),
        SendError::validation("provider.invalid", "bad address"),
    ] {
        let store = TestStore::default();
        let e = error.clone();
        let provider = Provider::answering(move |_, _| {
            let e = e.clone();
            async move { Err(e.into()) }
        });
        let mut svc = ServiceBuilder::new()
            .layer(layer(&store))
            .service(provider.clone());
        assert_eq!(
            send(&mut svc, message(Some("k"), "hi"))
                .await
                .unwrap_err()
                .code(),
            error.code()
        );
        assert_eq!(
            send(&mut svc, message(Some("k"), "hi"))
                .await
                .unwrap_err()
                .code(),
            error.code()
        );
        assert_eq!(provider.calls(), 2, "{} must free the key", error.code());
    }
}

#[tokio::test]
async fn unknown_delivery_keeps_the_key_and_a_retry_is_answered_from_the_store() {
    let store = TestStore::default();
    let provider = Provider::answering(|_, _| async {
        Err(SendError::unknown_delivery("provider.500", "internal error").into())
    });
    let mut svc = ServiceBuilder::new()
        .layer(layer(&store))
        .service(provider.clone());
    let err = send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(err.code(), "provider.500");
    assert!(!err.is_replayed());
    let again = send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(again.code(), "provider.500");
    assert!(again.is_replayed());
    assert!(again.delivery_unknown());
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_inside_the_stack_is_unknown_delivery_and_keeps_the_key() {
    let store = TestStore::default();
    let provider = Provider::answering(|_, _| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok(Receipt::new("late", "fake"))
    });
    let mut svc = ServiceBuilder::new()
        .layer(layer(&store))
        .timeout(Duration::from_secs(1))
        .service(provider.clone());
    let err = send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(err.code(), codes::TIMEOUT);
    assert!(err.delivery_unknown());
    assert!(err.counts_against_provider());
    let again = send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert!(again.is_replayed());
    assert_eq!(provider.calls(), 1);
}

#[tokio::test]
async fn default_classifier_frees_the_key_on_connection_refused_and_keeps_it_otherwise() {
    let store = TestStore::default();
    let provider = Provider::answering(|n, _| async move {
        let kind = if n == 1 {
            std::io::ErrorKind::ConnectionRefused
        } else {
            std::io::ErrorKind::ConnectionReset
        };
        Err(BoxError::from(std::io::Error::new(kind, "socket")))
    });
    let mut svc = ServiceBuilder::new()
        .layer(layer(&store))
        .service(provider.clone());
    let refused = send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(refused.code(), codes::NOT_SENT);
    assert!(refused.is_retryable());
    let reset = send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(reset.code(), codes::UNKNOWN);
    assert_eq!(
        std::error::Error::source(&reset).unwrap().to_string(),
        "socket"
    );
    let replayed = send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert!(replayed.is_replayed());
    assert_eq!(provider.calls(), 2);
}

#[tokio::test]
async fn a_custom_classifier_judges_foreign_errors() {
    let store = TestStore::default();
    let provider = Provider::answering(|_, _| async { Err(BoxError::from("mailbox full")) });
    let l = IdempotencyLayer::builder()
        .store(store.clone())
        .classify(|e| {
            if e.to_string().contains("mailbox full") {
                Category::Permanent
            } else {
                Category::Unknown
            }
        })
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new().layer(l).service(provider.clone());
    let err = send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(err.category(), Category::Permanent);
    send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(provider.calls(), 2, "a permanent failure frees the key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_sends_under_one_key_reach_the_provider_once() {
    let store = TestStore::default();
    let provider = Provider::answering(|n, _| async move {
        tokio::task::yield_now().await;
        Ok(Receipt::new(format!("msg-{n}"), "fake"))
    });
    let svc = ServiceBuilder::new()
        .layer(layer(&store))
        .service(provider.clone());
    let barrier = Arc::new(tokio::sync::Barrier::new(100));
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let svc = svc.clone();
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                svc.oneshot(message(Some("one-key"), "hi")).await
            })
        })
        .collect();
    let mut sent = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(r) if !r.replayed => sent += 1,
            Ok(r) => assert_eq!(r.id, "msg-1"),
            Err(e) => assert_eq!(e.code(), codes::IN_FLIGHT),
        }
    }
    assert_eq!(sent, 1);
    assert_eq!(provider.calls(), 1);
}

#[tokio::test]
async fn dropping_the_send_after_the_provider_was_called_keeps_the_key_as_aborted() {
    let store = TestStore::default();
    let (called_tx, called_rx) = oneshot::channel::<()>();
    let called_tx = Arc::new(std::sync::Mutex::new(Some(called_tx)));
    let provider = Provider::answering(move |_, _| {
        if let Some(tx) = called_tx.lock().unwrap().take() {
            let _ = tx.send(());
        }
        std::future::pending()
    });
    let l = layer(&store);
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());
    let future = svc.ready().await.unwrap().call(message(Some("k"), "hi"));
    let handle = tokio::spawn(future);
    called_rx.await.unwrap();
    handle.abort();
    assert!(handle.await.unwrap_err().is_cancelled());
    // The aborted outcome is written by a spawned task: wait for the store to see it.
    support::wait_until(|| store.completes.load(Ordering::SeqCst) != 0).await;
    let err = send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(err.code(), codes::ABORTED);
    assert!(err.is_replayed());
    assert_eq!(err.category(), Category::Unknown);
    assert_eq!(provider.calls(), 1, "a dropped send never frees its key");
    assert_eq!(store.releases.load(Ordering::SeqCst), 0);
    assert_eq!(l.stats().aborted, 1);
}

#[tokio::test]
async fn dropping_the_send_while_the_store_reserves_frees_the_key_at_once() {
    let store = TestStore::default();
    let gate = store.close_gate();
    let provider = Provider::ok();
    let mut svc = ServiceBuilder::new()
        .layer(layer(&store))
        .service(provider.clone());
    let mut future = Box::pin(svc.ready().await.unwrap().call(message(Some("k"), "hi")));
    // Poll once so the reserve starts, then drop the send while the store is answering.
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(std::future::Future::poll(future.as_mut(), &mut cx).is_pending());
    drop(future);
    gate.add_permits(1);
    // The background task finishes the reserve and frees the key.
    support::wait_until(|| store.releases.load(Ordering::SeqCst) != 0).await;
    gate.add_permits(1);
    let receipt = send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    assert!(!receipt.replayed);
    assert_eq!(provider.calls(), 1);
}

#[tokio::test]
async fn store_failing_to_reserve_fails_that_message_retryable_and_does_not_send() {
    let store = TestStore::default();
    store.fail_reserve.store(true, Ordering::SeqCst);
    let provider = Provider::ok();
    let l = layer(&store);
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());
    let (captured, _guard) = capture();
    let err = send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(err.code(), codes::STORE_FAILED);
    assert!(err.is_retryable());
    assert_eq!(err.category(), Category::Unknown);
    assert!(!err.counts_against_provider());
    assert_eq!(provider.calls(), 0);
    assert_eq!(l.stats().store_failed, 1);
    let lines = captured.lines();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("WARN") && l.contains(codes::STORE_FAILED)),
        "{lines:?}"
    );
    // The store recovers: the next send goes.
    store.fail_reserve.store(false, Ordering::SeqCst);
    send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn store_that_does_not_answer_in_time_fails_as_store_failed() {
    let store = TestStore::default();
    let _gate = store.close_gate();
    let provider = Provider::ok();
    let l = IdempotencyLayer::builder()
        .store(store.clone())
        .reserve_timeout(Duration::from_millis(250))
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new().layer(l).service(provider.clone());
    let err = send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(err.code(), codes::STORE_FAILED);
    let source = std::error::Error::source(&err).unwrap();
    assert!(source.to_string().contains("timed out"), "{source}");
    assert_eq!(provider.calls(), 0);
}

/// A store that bounds its own calls within the reserve timeout gets no second timer from
/// the layer; one whose bound is longer still gets the layer's. The store here says it keeps
/// a bound and keeps none, so only the layer's timer can end the gated reserve.
#[tokio::test(start_paused = true)]
async fn the_layer_times_a_store_call_only_when_the_store_bounds_it_later() {
    let reserve_timeout = Duration::from_millis(250);
    let send_under = |bound: Duration| {
        let store = TestStore {
            call_timeout: Some(bound),
            ..TestStore::default()
        };
        let gate = store.close_gate();
        let l = IdempotencyLayer::builder()
            .store(store)
            .reserve_timeout(reserve_timeout)
            .build()
            .unwrap();
        let svc = ServiceBuilder::new().layer(l).service(Provider::ok());
        (svc, gate)
    };

    // Longer than the reserve timeout: the layer's timer fires at 250 ms.
    let (mut svc, _gate) = send_under(Duration::from_secs(10));
    let err = send(&mut svc, message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(err.code(), codes::STORE_FAILED);

    // Within it: the layer leaves the bound to the store, and waits past its own timeout.
    let (mut svc, gate) = send_under(reserve_timeout);
    let sent = tokio::spawn(async move { send(&mut svc, message(Some("k"), "hi")).await });
    tokio::time::sleep(reserve_timeout * 4).await;
    assert!(!sent.is_finished(), "the layer set a timer of its own");
    gate.add_permits(1);
    sent.await.unwrap().expect("sent once the store answered");
}

#[tokio::test]
async fn done_record_without_an_outcome_is_store_failed_and_not_sent() {
    let store = TestStore::default();
    let provider = Provider::ok();
    let l = layer(&store);
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());
    let m = message(Some("k"), "hi");
    *store.forced.lock().unwrap() = Some(Reservation::Held {
        record: {
            let mut corrupt = Record::pending(Fingerprint::of(&m));
            corrupt.state = RecordState::Done;
            corrupt
        },
    });
    let err = send(&mut svc, m).await.unwrap_err();
    assert_eq!(err.code(), codes::STORE_FAILED);
    assert_eq!(provider.calls(), 0);
    // Counted once, as every store failure the layer answers.
    assert_eq!(l.stats().store_failed, 1);
}

#[tokio::test(start_paused = true)]
async fn store_failing_after_the_send_returns_the_real_outcome_and_warns_once_it_gives_up() {
    // The store is down for good after the reserve: settlements and renewals fail.
    let store = TestStore::default();
    store.fail_complete.store(true, Ordering::SeqCst);
    store.fail_extend.store(true, Ordering::SeqCst);
    let provider = Provider::ok();
    let l = layer(&store);
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());
    let (captured, _guard) = capture();
    let receipt = send(&mut svc, message(Some("seller@example.com:k"), "hi"))
        .await
        .unwrap();
    assert_eq!(receipt.id, "msg-1");
    assert!(!receipt.replayed);
    // The settlement retries in the background until the lease is about to end; only then
    // does it warn.
    assert_eq!(l.stats().store_failed_after_send, 0);
    tokio::time::sleep(DEFAULT_LEASE).await;
    let lines = captured.lines();
    let warning = lines
        .iter()
        .find(|l| l.contains(codes::STORE_FAILED_WARNING))
        .unwrap_or_else(|| panic!("no IDEMPOTENCY_STORE_FAILED warning in {lines:?}"));
    assert!(warning.starts_with("WARN"));
    assert!(warning.contains("namespace=test"));
    assert!(warning.contains("key_hash="));
    assert!(
        warning.contains("free_in="),
        "the warning says when the key frees: {warning}"
    );
    assert!(
        !warning.contains("seller@example.com"),
        "the raw key leaked: {warning}"
    );
    assert_eq!(l.stats().store_failed_after_send, 1);

    // And when freeing the key fails after a failed send.
    store.fail_release.store(true, Ordering::SeqCst);
    let failing =
        Provider::answering(|_, _| async { Err(SendError::permanent("p.400", "bad").into()) });
    let mut svc = ServiceBuilder::new().layer(l.clone()).service(failing);
    let err = send(&mut svc, message(Some("other"), "hi"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "p.400");
    tokio::time::sleep(DEFAULT_LEASE).await;
    assert_eq!(l.stats().store_failed_after_send, 2);
}

#[tokio::test]
async fn layer_answers_are_traced_at_their_levels_without_the_key_or_content() {
    let store = TestStore::default();
    let release = Arc::new(Notify::new());
    let gate = Arc::clone(&release);
    let provider = Provider::answering(move |_, _| {
        let gate = Arc::clone(&gate);
        async move {
            gate.notified().await;
            Ok(Receipt::new("m", "fake"))
        }
    });
    let svc = ServiceBuilder::new()
        .layer(layer(&store))
        .service(provider.clone());
    let (captured, _guard) = capture();
    let key = "order:ord_1:email:seller@example.com";
    let first = tokio::spawn(svc.clone().oneshot(message(Some(key), "secret body")));
    support::wait_until(|| provider.calls() != 0).await;
    let in_flight = svc
        .clone()
        .oneshot(message(Some(key), "secret body"))
        .await
        .unwrap_err();
    assert_eq!(in_flight.code(), codes::IN_FLIGHT);
    release.notify_one();
    first.await.unwrap().unwrap();
    svc.clone()
        .oneshot(message(Some(key), "secret body"))
        .await
        .unwrap();
    svc.clone()
        .oneshot(message(Some(key), "other body"))
        .await
        .unwrap_err();
    let lines = captured.lines();
    let find = |needle: &str| {
        lines
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle} in {lines:?}"))
            .clone()
    };
    assert!(find(codes::IN_FLIGHT).starts_with("INFO"));
    assert!(find("answered from the idempotency store").starts_with("DEBUG"));
    assert!(find(codes::KEY_REUSED).starts_with("WARN"));
    for line in &lines {
        assert!(
            !line.contains("seller@example.com"),
            "raw key in log: {line}"
        );
        assert!(!line.contains("secret body"), "content in log: {line}");
        assert!(!line.contains("ord_1"), "raw key in log: {line}");
    }
}

#[tokio::test]
async fn layers_with_different_namespaces_never_see_each_others_keys() {
    let store = MemoryStore::new();
    let provider = Provider::ok();
    let a = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("a")
        .build()
        .unwrap();
    let b = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("b")
        .build()
        .unwrap();
    let mut sa = ServiceBuilder::new().layer(a).service(provider.clone());
    let mut sb = ServiceBuilder::new()
        .layer(b.clone())
        .service(provider.clone());
    assert!(
        !send(&mut sa, message(Some("k"), "hi"))
            .await
            .unwrap()
            .replayed
    );
    assert!(
        !send(&mut sb, message(Some("k"), "hi"))
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(provider.calls(), 2);
    // The same namespace over the same store does see it.
    let b2 = IdempotencyLayer::builder()
        .store(store)
        .namespace("b")
        .build()
        .unwrap();
    let mut sb2 = ServiceBuilder::new().layer(b2).service(provider.clone());
    assert!(
        send(&mut sb2, message(Some("k"), "hi"))
            .await
            .unwrap()
            .replayed
    );
}

#[tokio::test(start_paused = true)]
async fn send_after_the_lease_of_a_crashed_holder_goes() {
    let store = MemoryStore::new();
    let m = message(Some("k"), "hi");
    // A process reserved the key and crashed before completing.
    let crashed = store
        .reserve("test:k", Fingerprint::of(&m), Duration::from_secs(600))
        .await
        .unwrap();
    assert!(matches!(crashed, Reservation::Reserved { .. }));
    let provider = Provider::ok();
    let l = IdempotencyLayer::builder()
        .store(store)
        .namespace("test")
        .lease(Duration::from_secs(600))
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new().layer(l).service(provider.clone());
    assert_eq!(
        send(&mut svc, m.clone()).await.unwrap_err().code(),
        codes::IN_FLIGHT
    );
    tokio::time::advance(Duration::from_secs(601)).await;
    assert!(!send(&mut svc, m).await.unwrap().replayed);
    assert_eq!(provider.calls(), 1);
}

#[tokio::test]
async fn invalid_keys_from_the_key_function_are_refused_before_the_store_is_asked() {
    for bad in [String::new(), "k".repeat(257), "a\nb".to_owned()] {
        let store = TestStore::default();
        let provider = Provider::ok();
        let bad2 = bad.clone();
        let l = IdempotencyLayer::builder()
            .store(store.clone())
            .key(move |_| Some(bad2.clone()))
            .build()
            .unwrap();
        let mut svc = ServiceBuilder::new().layer(l).service(provider.clone());
        let err = send(&mut svc, message(None, "hi")).await.unwrap_err();
        assert_eq!(err.code(), codes::INVALID_KEY, "{bad:?}");
        assert_eq!(err.category(), Category::Validation);
        assert_eq!(store.total_calls(), 0);
        assert_eq!(provider.calls(), 0);
    }
}

#[tokio::test]
async fn key_function_replaces_the_messages_own_key() {
    let store = TestStore::default();
    let provider = Provider::ok();
    let l = IdempotencyLayer::builder()
        .store(store.clone())
        .key(|m: &Message| m.metadata().get("event").map(|e| format!("event:{e}")))
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new().layer(l).service(provider.clone());
    let m = Message::builder()
        .from("a@x")
        .to("b@x")
        .text("t")
        .metadata("event", "e1")
        .build()
        .unwrap();
    send(&mut svc, m.clone()).await.unwrap();
    assert!(send(&mut svc, m).await.unwrap().replayed);
    // No event: no key, sent as it is.
    send(&mut svc, message(Some("ignored"), "hi"))
        .await
        .unwrap();
    send(&mut svc, message(Some("ignored"), "hi"))
        .await
        .unwrap();
    assert_eq!(provider.calls(), 3);
}

#[tokio::test]
async fn raw_messages_are_deduplicated_only_by_the_raw_key_function() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let relay = tower::service_fn(move |raw: RawMessage| {
        let n = c.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Ok::<_, BoxError>(
                Receipt::new(format!("raw-{n}"), "smtp")
                    .with_accepted(raw.envelope().to().to_vec()),
            )
        }
    });
    let raw =
        |to: &str, body: &'static [u8]| RawMessage::new(Envelope::new("a@x", [to]).unwrap(), body);

    // Without a raw key function, raw messages go through untouched.
    let mut plain = ServiceBuilder::new()
        .layer(IdempotencyLayer::in_memory())
        .service(relay.clone());
    plain
        .ready()
        .await
        .unwrap()
        .call(raw("b@x", b"1"))
        .await
        .unwrap();
    plain
        .ready()
        .await
        .unwrap()
        .call(raw("b@x", b"1"))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let l = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .raw_key(|r: &RawMessage| Some(format!("raw:{}", r.envelope().to()[0])))
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new().layer(l).service(relay);
    let first = svc
        .ready()
        .await
        .unwrap()
        .call(raw("c@x", b"1"))
        .await
        .unwrap();
    // Same envelope, other bytes: the fingerprint is the envelope's, so it is a repeat.
    let again = svc
        .ready()
        .await
        .unwrap()
        .call(raw("c@x", b"2"))
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.id, first.id);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[test]
fn builder_refuses_invalid_options_with_typed_errors() {
    let err = |b: tower_idempotency::IdempotencyLayerBuilder| b.build().unwrap_err();
    let builder = || IdempotencyLayer::builder().store(MemoryStore::new());
    assert!(matches!(
        err(builder().namespace("")),
        ConfigError::InvalidNamespace(_)
    ));
    assert!(matches!(
        err(builder().namespace("a:b")),
        ConfigError::InvalidNamespace(_)
    ));
    assert_eq!(
        err(builder().lease(Duration::ZERO)),
        ConfigError::ZeroDuration("lease")
    );
    assert_eq!(
        err(builder()
            .lease(Duration::from_secs(10))
            .ttl(Duration::from_secs(5))),
        ConfigError::TtlShorterThanLease
    );
    assert_eq!(
        err(builder().settle_timeout(Duration::ZERO)),
        ConfigError::ZeroDuration("settle timeout")
    );
    assert_eq!(
        err(builder().max_hold(Duration::ZERO)),
        ConfigError::ZeroDuration("max hold")
    );
    // A zero wait is no wait, not an error.
    assert!(builder().wait_for_in_flight(Duration::ZERO).build().is_ok());
    let layer = IdempotencyLayer::in_memory();
    assert_eq!(layer.namespace(), "default");
    assert!(format!("{layer:?}").contains("lease"));
}

#[test]
fn options_set_before_the_store_are_kept_and_checked() {
    // A builder without a store has no `build` (a doctest of `IdempotencyLayerBuilder` shows
    // it does not compile); the options set before `.store(..)` carry over.
    let layer = IdempotencyLayer::builder()
        .namespace("orders")
        .lease(Duration::from_secs(30))
        .shared_store(std::sync::Arc::new(MemoryStore::new()))
        .build()
        .unwrap();
    assert_eq!(layer.namespace(), "orders");
    assert!(format!("{layer:?}").contains("30s"), "{layer:?}");
    assert!(matches!(
        IdempotencyLayer::builder()
            .namespace("")
            .store(MemoryStore::new())
            .build(),
        Err(ConfigError::InvalidNamespace(_))
    ));
}

#[test]
fn a_config_error_printed_by_main_shows_its_advice() {
    // `main() -> Result<(), BoxError>` prints the error with `Debug`.
    let error: tower_idempotency::BoxError = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .namespace("a:b")
        .build()
        .unwrap_err()
        .into();
    let printed = format!("{error:?}");
    assert!(printed.contains("InvalidNamespace(\"a:b\")"), "{printed}");
    assert!(printed.contains("1 to 64 bytes, no ':'"), "{printed}");
    let printed = format!(
        "{:?}",
        IdempotencyLayer::builder()
            .store(MemoryStore::new())
            .lease(Duration::from_secs(10))
            .ttl(Duration::from_secs(5))
            .build()
            .unwrap_err()
    );
    assert!(
        printed.contains("the ttl must be at least the lease"),
        "{printed}"
    );
}

#[test]
fn without_a_runtime_a_send_on_the_memory_store_still_works() {
    let provider = Provider::ok();
    let mut svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::in_memory())
        .service(provider.clone());
    let first = futures_util::FutureExt::now_or_never(svc.call(message(Some("k"), "hi")));
    assert!(!first.unwrap().unwrap().replayed);
    let again = futures_util::FutureExt::now_or_never(svc.call(message(Some("k"), "hi")));
    assert!(again.unwrap().unwrap().replayed);
}

#[tokio::test]
async fn kept_receipts_hold_no_address_and_replays_restore_the_accepted_recipients() {
    let store = TestStore::default();
    let provider = Provider::answering(|_, m| {
        let accepted: Vec<String> = m.recipients().map(str::to_owned).collect();
        async move { Ok(Receipt::new("msg-1", "fake").with_accepted(accepted)) }
    });
    let mut svc = ServiceBuilder::new()
        .layer(layer(&store))
        .service(provider.clone());
    let m = Message::builder()
        .from("shop@example.com")
        .to("seller@example.com")
        .cc("accounts@example.com")
        .text("hi")
        .idempotency_key("k")
        .build()
        .unwrap();
    let first = send(&mut svc, m.clone()).await.unwrap();
    assert_eq!(
        first.accepted,
        ["seller@example.com", "accounts@example.com"]
    );

    // What the store keeps: positions, not addresses.
    let Reservation::Held { record } = store
        .inner
        .reserve("test:k", Fingerprint::of(&m), Duration::from_secs(1))
        .await
        .unwrap()
    else {
        panic!("the key is done")
    };
    let kept = String::from_utf8(
        tower_idempotency::store::record::encode_outcome(&record.outcome.unwrap()).unwrap(),
    )
    .unwrap();
    assert!(!kept.contains('@'), "an address reached the store: {kept}");
    assert!(kept.contains("\"accepted_at\":[0,1]"), "{kept}");

    let again = send(&mut svc, m).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.accepted, first.accepted);
}
