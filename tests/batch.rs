//! Batch sends: per-message answers in input order, one inner batch, keys kept or freed one by
//! one, and a bounded number of store calls.

mod support;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{BatchProvider, TestStore, message};
use tower::{Service, ServiceExt};
use tower_idempotency::batch::{Batch, BatchOutcomes};
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::codes;
use tower_idempotency::store::Store;
use tower_idempotency::{BoxError, Idempotency, IdempotencyLayer, Message, Receipt, SendError};

fn service(store: &TestStore, provider: &BatchProvider) -> Idempotency<BatchProvider> {
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("batch")
        .build()
        .unwrap();
    tower::Layer::layer(&layer, provider.clone())
}

async fn send(svc: &mut Idempotency<BatchProvider>, messages: Vec<Message>) -> BatchOutcomes {
    svc.ready()
        .await
        .unwrap()
        .call(Batch::from(messages))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_mixed_batch_gets_the_right_answer_at_each_position_and_sends_only_the_new() {
    let store = TestStore::default();
    let provider = BatchProvider::ok();
    let mut svc = service(&store, &provider);
    send(&mut svc, vec![message(Some("done"), "done")]).await;
    // A send still in flight elsewhere under "pending".
    let pending = message(Some("pending"), "pending");
    store
        .inner
        .reserve(
            "batch:pending",
            Fingerprint::of(&pending),
            Duration::from_secs(600),
        )
        .await
        .unwrap();

    let answers = send(
        &mut svc,
        vec![
            message(Some("new-1"), "new-1"),   // 0: sent
            message(Some("done"), "done"),     // 1: replayed
            pending.clone(),                   // 2: in flight
            message(Some("done"), "other"),    // 3: key reused (store)
            message(Some("new-1"), "new-1"),   // 4: repeat of 0 in the batch
            message(Some("new-1"), "changed"), // 5: key reused within the batch
            message(None, "unkeyed"),          // 6: sent as it is
            message(Some("new-2"), "new-2"),   // 7: sent
        ],
    )
    .await;
    assert_eq!(answers.len(), 8);
    let ok = |i: usize| answers[i].as_ref().unwrap();
    let err = |i: usize| answers[i].as_ref().unwrap_err();
    assert_eq!(ok(0).id, "id-new-1");
    assert!(!ok(0).replayed);
    assert_eq!(ok(1).id, "id-done");
    assert!(ok(1).replayed);
    assert_eq!(err(2).code(), codes::IN_FLIGHT);
    assert_eq!(err(3).code(), codes::KEY_REUSED);
    assert_eq!(ok(4).id, "id-new-1");
    assert!(ok(4).replayed);
    assert_eq!(err(5).code(), codes::KEY_REUSED);
    assert_eq!(ok(6).id, "id-unkeyed");
    assert_eq!(ok(7).id, "id-new-2");
    // The provider saw the first batch, then only the new and the unkeyed, in input order.
    assert_eq!(
        provider.batches(),
        vec![
            vec!["done".to_owned()],
            vec!["new-1".into(), "unkeyed".into(), "new-2".into()]
        ]
    );
}

#[tokio::test]
async fn a_batch_costs_one_reserve_call_and_one_complete_call() {
    let store = TestStore::default();
    let provider = BatchProvider::ok();
    let mut svc = service(&store, &provider);
    let messages: Vec<Message> = (0..100)
        .map(|i| message(Some(&format!("k{i}")), &format!("m{i}")))
        .collect();
    let answers = send(&mut svc, messages.clone()).await;
    assert!(
        answers
            .iter()
            .all(|a| a.as_ref().is_ok_and(|r| !r.replayed))
    );
    assert_eq!(store.reserve_many_calls.load(Ordering::SeqCst), 1);
    assert_eq!(store.complete_many_calls.load(Ordering::SeqCst), 1);
    assert_eq!(store.release_many_calls.load(Ordering::SeqCst), 0);
    assert_eq!(provider.batches().len(), 1);
    // All of them again: answered from the store, no inner call, one more reserve call.
    let again = send(&mut svc, messages).await;
    assert!(again.iter().all(|a| a.as_ref().is_ok_and(|r| r.replayed)));
    assert_eq!(store.reserve_many_calls.load(Ordering::SeqCst), 2);
    assert_eq!(provider.batches().len(), 1);
}

#[tokio::test]
async fn each_key_is_kept_or_freed_by_its_own_outcome() {
    let store = TestStore::default();
    let calls = Arc::new(Mutex::new(0));
    let c = Arc::clone(&calls);
    let provider = BatchProvider::answering(move |batch| {
        *c.lock().unwrap() += 1;
        Ok(batch
            .iter()
            .map(|m| match m.text().unwrap_or_default() {
                "rejected" => Err(SendError::permanent("provider.rejected", "bad address")),
                "unknown" => Err(SendError::unknown_delivery("provider.server_error", "500")),
                text => Ok(Receipt::new(format!("id-{text}"), "bulk")),
            })
            .collect())
    });
    let mut svc = service(&store, &provider);
    let batch = || {
        vec![
            message(Some("a"), "ok"),
            message(Some("b"), "rejected"),
            message(Some("c"), "unknown"),
        ]
    };
    let first = send(&mut svc, batch()).await;
    assert!(first[0].is_ok());
    assert_eq!(first[1].as_ref().unwrap_err().code(), "provider.rejected");
    assert_eq!(
        first[2].as_ref().unwrap_err().code(),
        "provider.server_error"
    );
    assert_eq!(store.release_many_calls.load(Ordering::SeqCst), 1);

    let second = send(&mut svc, batch()).await;
    assert!(
        second[0].as_ref().unwrap().replayed,
        "a delivered key is kept"
    );
    assert!(
        !second[1].as_ref().unwrap_err().is_replayed(),
        "a rejected key is freed and sent again"
    );
    assert!(
        second[2].as_ref().unwrap_err().is_replayed(),
        "an unknown key is kept"
    );
    assert_eq!(provider.batches()[1], vec!["rejected".to_owned()]);
}

#[tokio::test]
async fn fewer_outcomes_than_messages_is_a_clear_error_and_keeps_every_key() {
    let store = TestStore::default();
    let provider = BatchProvider::answering(|batch| {
        Ok(batch
            .iter()
            .skip(1)
            .map(|_| Ok(Receipt::new("x", "bulk")))
            .collect())
    });
    let mut svc = service(&store, &provider);
    let messages = vec![
        message(Some("a"), "a"),
        message(Some("b"), "b"),
        message(None, "c"),
    ];
    let answers = send(&mut svc, messages.clone()).await;
    for answer in &answers {
        let e = answer.as_ref().unwrap_err();
        assert_eq!(e.code(), codes::BATCH_MISMATCH);
        assert!(e.delivery_unknown());
        assert!(
            e.message().contains("2 outcomes for 3 messages"),
            "{}",
            e.message()
        );
    }
    assert_eq!(
        store.release_many_calls.load(Ordering::SeqCst),
        0,
        "no key may be freed"
    );
    let again = send(&mut svc, messages[..2].to_vec()).await;
    for answer in &again {
        let e = answer.as_ref().unwrap_err();
        assert!(e.is_replayed());
        assert_eq!(e.code(), codes::BATCH_MISMATCH);
    }
    assert_eq!(provider.batches().len(), 1);
}

#[tokio::test]
async fn a_batch_that_fails_as_a_whole_answers_every_sent_message_and_frees_not_sent_keys() {
    let store = TestStore::default();
    let provider = BatchProvider::answering(|_| {
        Err(SendError::retryable("provider.unavailable", "503").into())
    });
    let mut svc = service(&store, &provider);
    let answers = send(
        &mut svc,
        vec![message(Some("a"), "a"), message(Some("b"), "b")],
    )
    .await;
    assert!(
        answers
            .iter()
            .all(|a| a.as_ref().unwrap_err().code() == "provider.unavailable")
    );
    let again = send(&mut svc, vec![message(Some("a"), "a")]).await;
    assert!(
        !again[0].as_ref().unwrap_err().is_replayed(),
        "the key was freed, so it was sent again"
    );
    assert_eq!(provider.batches().len(), 2);
}

#[tokio::test]
async fn a_store_that_cannot_reserve_fails_the_keyed_messages_unsent_and_sends_the_unkeyed() {
    let store = TestStore::default();
    store.fail_reserve.store(true, Ordering::SeqCst);
    let provider = BatchProvider::ok();
    let mut svc = service(&store, &provider);
    let answers = send(
        &mut svc,
        vec![message(Some("a"), "a"), message(None, "plain")],
    )
    .await;
    let e = answers[0].as_ref().unwrap_err();
    assert_eq!(e.code(), codes::STORE_FAILED);
    assert!(e.is_retryable());
    assert_eq!(answers[1].as_ref().unwrap().id, "id-plain");
    assert_eq!(provider.batches(), vec![vec!["plain".to_owned()]]);
}

#[tokio::test]
async fn an_empty_batch_answers_nothing_and_calls_nobody() {
    let store = TestStore::default();
    let provider = BatchProvider::ok();
    let mut svc = service(&store, &provider);
    assert!(send(&mut svc, vec![]).await.is_empty());
    assert!(provider.batches().is_empty());
    assert_eq!(store.total_calls(), 0);
    assert_eq!(store.reserve_many_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn dropping_a_batch_after_the_provider_was_called_keeps_every_key_as_aborted() {
    let store = TestStore::default();
    let (called_tx, called_rx) = tokio::sync::oneshot::channel::<()>();
    let called_tx = Arc::new(Mutex::new(Some(called_tx)));
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("batch")
        .build()
        .unwrap();
    let stalled = tower::service_fn(move |_batch: Batch| {
        if let Some(tx) = called_tx.lock().unwrap().take() {
            let _ = tx.send(());
        }
        std::future::pending::<Result<BatchOutcomes, BoxError>>()
    });
    let mut svc = tower::Layer::layer(&layer, stalled);
    let future = svc.ready().await.unwrap().call(Batch::from(vec![
        message(Some("a"), "a"),
        message(Some("b"), "b"),
    ]));
    let task = tokio::spawn(future);
    called_rx.await.unwrap();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    support::wait_until(|| store.complete_many_calls.load(Ordering::SeqCst) != 0).await;
    let provider = BatchProvider::ok();
    let mut svc = service(&store, &provider);
    let answers = send(
        &mut svc,
        vec![message(Some("a"), "a"), message(Some("b"), "b")],
    )
    .await;
    for answer in answers {
        let e = answer.unwrap_err();
        assert_eq!(e.code(), codes::ABORTED);
        assert!(e.is_replayed());
    }
    assert!(provider.batches().is_empty());
    assert_eq!(layer.stats().aborted, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_batches_with_the_same_keys_send_each_message_once() {
    let store = TestStore::default();
    let provider = BatchProvider::ok();
    let svc = service(&store, &provider);
    let barrier = Arc::new(tokio::sync::Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|t| {
            let svc = svc.clone();
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                let mut batch: Vec<Message> = (0..10)
                    .map(|i| message(Some(&format!("k{i}")), &format!("m{i}")))
                    .collect();
                batch.rotate_left(t % 10);
                barrier.wait().await;
                svc.oneshot(Batch::from(batch)).await.unwrap()
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let mut sent: Vec<String> = provider.batches().into_iter().flatten().collect();
    sent.sort();
    let mut expected: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    expected.sort();
    assert_eq!(
        sent, expected,
        "each message reached the provider exactly once"
    );
}

fn service_with(
    store: &TestStore,
    provider: &BatchProvider,
    options: impl FnOnce(
        tower_idempotency::IdempotencyLayerBuilder,
    ) -> tower_idempotency::IdempotencyLayerBuilder,
) -> Idempotency<BatchProvider> {
    let layer = options(
        IdempotencyLayer::builder()
            .store(store.clone())
            .namespace("batch"),
    )
    .build()
    .unwrap();
    tower::Layer::layer(&layer, provider.clone())
}

#[tokio::test]
async fn a_later_message_under_a_reused_key_is_judged_against_the_store_like_a_single_send() {
    let store = TestStore::default();
    let provider = BatchProvider::ok();
    let mut svc = service(&store, &provider);
    send(&mut svc, vec![message(Some("k"), "A")]).await;

    let answers = send(
        &mut svc,
        vec![message(Some("k"), "B"), message(Some("k"), "A")],
    )
    .await;
    // B is another message under a used key; A is the message the store kept: replayed, as
    // a single send of it would be.
    assert_eq!(answers[0].as_ref().unwrap_err().code(), codes::KEY_REUSED);
    let replayed = answers[1].as_ref().unwrap();
    assert_eq!(replayed.id, "id-A");
    assert!(replayed.replayed);
    assert_eq!(provider.batches(), vec![vec!["A".to_owned()]]);

    // A fresh key: the first message reserves it, so the other one finds it pending under
    // another fingerprint and is refused, as a single send would be.
    let answers = send(
        &mut svc,
        vec![message(Some("fresh"), "X"), message(Some("fresh"), "Y")],
    )
    .await;
    assert_eq!(answers[0].as_ref().unwrap().id, "id-X");
    assert_eq!(answers[1].as_ref().unwrap_err().code(), codes::KEY_REUSED);
    assert_eq!(provider.batches().len(), 2);
    assert_eq!(provider.batches()[1], vec!["X".to_owned()]);
}

#[tokio::test(start_paused = true)]
async fn a_batch_settlement_that_fails_once_is_retried_and_every_key_kept() {
    let store = TestStore::default();
    store.fail_next_settlements.store(1, Ordering::SeqCst);
    let provider = BatchProvider::ok();
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("batch")
        .build()
        .unwrap();
    let mut svc = tower::Layer::layer(&layer, provider.clone());
    let batch = vec![message(Some("a"), "a"), message(Some("b"), "b")];
    send(&mut svc, batch.clone()).await;
    assert_eq!(store.complete_many_calls.load(Ordering::SeqCst), 2);
    assert_eq!(layer.stats().settle_retries, 1);
    assert_eq!(layer.stats().store_failed_after_send, 0);

    // Long after the lease, both keys are still kept.
    tokio::time::sleep(tower_idempotency::layer::DEFAULT_LEASE * 2).await;
    let again = send(&mut svc, batch).await;
    assert!(again.iter().all(|a| a.as_ref().unwrap().replayed));
    assert_eq!(provider.batches().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_batch_waits_for_its_in_flight_keys_and_replays_their_outcome() {
    let store = TestStore::default();
    let provider = BatchProvider::ok();
    let mut svc = service_with(&store, &provider, |b| {
        b.wait_for_in_flight(Duration::from_secs(10))
    });
    // Another process holds "busy" and keeps its outcome two seconds later.
    let busy = message(Some("busy"), "busy");
    let fingerprint = Fingerprint::of(&busy);
    let token = match store
        .inner
        .reserve("batch:busy", fingerprint, Duration::from_secs(60))
        .await
        .unwrap()
    {
        tower_idempotency::store::Reservation::Reserved { token } => token,
        other => panic!("not reserved: {other:?}"),
    };
    let other_process = store.inner.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let outcome = tower_idempotency::Outcome::sent(Receipt::new("id-elsewhere", "bulk"));
        other_process
            .complete(
                "batch:busy",
                token,
                fingerprint,
                &outcome,
                Duration::from_secs(600),
            )
            .await
            .unwrap();
    });

    let started = tokio::time::Instant::now();
    let answers = send(&mut svc, vec![busy, message(Some("new"), "new")]).await;
    let waited = started.elapsed();
    let replayed = answers[0].as_ref().unwrap();
    assert_eq!(replayed.id, "id-elsewhere");
    assert!(replayed.replayed);
    assert_eq!(answers[1].as_ref().unwrap().id, "id-new");
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    assert_eq!(provider.batches(), vec![vec!["new".to_owned()]]);
}

#[tokio::test(start_paused = true)]
async fn a_batch_slower_than_its_lease_keeps_every_key_renewed() {
    let store = TestStore::default();
    let lease = Duration::from_secs(3);
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("batch")
        .lease(lease)
        .build()
        .unwrap();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let slow = tower::service_fn(move |batch: Batch| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(lease * 3).await;
            Ok::<_, BoxError>(
                batch
                    .iter()
                    .map(|m| {
                        Ok(Receipt::new(
                            format!("id-{}", m.text().unwrap_or_default()),
                            "bulk",
                        ))
                    })
                    .collect::<BatchOutcomes>(),
            )
        }
    });
    let svc = tower::Layer::layer(&layer, slow);
    let batch = || Batch::from(vec![message(Some("a"), "a"), message(Some("b"), "b")]);

    let first = tokio::spawn(svc.clone().oneshot(batch()));
    tokio::time::sleep(lease * 2).await;
    let repeat = svc.clone().oneshot(batch()).await.unwrap();
    assert!(
        repeat
            .iter()
            .all(|a| a.as_ref().unwrap_err().code() == codes::IN_FLIGHT)
    );
    assert!(first.await.unwrap().unwrap().iter().all(Result::is_ok));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Two keys, renewed every second for nine seconds.
    assert!(store.extends() >= 16, "{} renewals", store.extends());
}

/// A batch that took over a key from a crashed holder holds that key while it waits for
/// another in flight, so it waits at most a third of the lease, as for any key it reserved.
#[tokio::test(start_paused = true)]
async fn a_batch_holding_a_taken_over_key_waits_at_most_a_third_of_the_lease() {
    let store = TestStore::default();
    let provider = BatchProvider::ok();
    let mut svc = service_with(&store, &provider, |b| {
        b.wait_for_in_flight(Duration::from_secs(100))
    });
    let stale = message(Some("stale"), "stale");
    let busy = message(Some("busy"), "busy");
    // A crashed holder of "stale", whose lease passed; a live one of "busy" that never ends.
    store
        .inner
        .reserve(
            "batch:stale",
            Fingerprint::of(&stale),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    store
        .inner
        .reserve(
            "batch:busy",
            Fingerprint::of(&busy),
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let started = tokio::time::Instant::now();
    let answers = send(&mut svc, vec![stale, busy]).await;
    let waited = started.elapsed();
    assert_eq!(answers[0].as_ref().unwrap().id, "id-stale");
    assert_eq!(answers[1].as_ref().unwrap_err().code(), codes::IN_FLIGHT);
    let third = tower_idempotency::layer::DEFAULT_LEASE / 3;
    assert!(waited <= third + Duration::from_secs(2), "{waited:?}");
    assert_eq!(provider.batches(), vec![vec!["stale".to_owned()]]);
}
