//! Leases that hold: while a send runs its key's lease is renewed, so a send slower than its
//! lease keeps its key; renewal stops with the send (also when the caller drops it); a send
//! that outlives the maximum hold is given up and its key kept. A reserve given up while the
//! store answers it, a single send's or a batch's, frees a fresh key at once, but keeps a
//! taken-over one for its lease.

mod support;

use std::future::{Future, pending};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;

use support::{BatchProvider, Provider, TestStore, capture, message, send, send_batch};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::batch::Batch;
use tower_idempotency::outcome::{Category, codes};
use tower_idempotency::store::{RecordState, Reservation, Store};
use tower_idempotency::verify::{Verified, Verify};
use tower_idempotency::{
    BoxError, Fingerprint, IdempotencyLayer, IdempotencyLayerBuilder, Message, Receipt,
};

const LEASE: Duration = Duration::from_secs(3);

fn layer(
    store: &TestStore,
    options: impl FnOnce(IdempotencyLayerBuilder) -> IdempotencyLayerBuilder,
) -> IdempotencyLayer {
    options(
        IdempotencyLayer::builder()
            .store(store.clone())
            .namespace("lease")
            .lease(LEASE),
    )
    .build()
    .unwrap()
}

/// A provider that takes `d` to accept each message.
fn slow(d: Duration) -> Provider {
    Provider::answering(move |n, _| async move {
        tokio::time::sleep(d).await;
        Ok(Receipt::new(format!("msg-{n}"), "fake"))
    })
}

#[tokio::test(start_paused = true)]
async fn a_send_lasting_three_leases_keeps_its_key_and_concurrent_repeats_are_in_flight() {
    let store = TestStore::default();
    let provider = slow(LEASE * 3);
    let l = layer(&store, |b| b);
    let svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());

    let first = tokio::spawn(svc.clone().oneshot(message(Some("k"), "hi")));
    // Repeats every half lease while the first send runs: none is sent.
    for _ in 0..5 {
        tokio::time::sleep(LEASE / 2).await;
        let repeat = svc.clone().oneshot(message(Some("k"), "hi")).await;
        assert_eq!(repeat.unwrap_err().code(), codes::IN_FLIGHT);
    }
    let receipt = first.await.unwrap().unwrap();
    assert_eq!(receipt.id, "msg-1");
    assert_eq!(provider.calls(), 1);
    assert!(store.extends() >= 8, "{} renewals", store.extends());
    assert_eq!(l.stats().renewal_lost, 0);

    // Renewal stopped with the send; the outcome is kept.
    let renewals = store.extends();
    tokio::time::sleep(LEASE * 3).await;
    assert_eq!(store.extends(), renewals);
    assert!(
        svc.oneshot(message(Some("k"), "hi"))
            .await
            .unwrap()
            .replayed
    );
}

#[tokio::test(start_paused = true)]
async fn a_send_that_finishes_within_a_third_of_the_lease_is_never_renewed() {
    let store = TestStore::default();
    let provider = slow(LEASE / 4);
    let mut svc = ServiceBuilder::new()
        .layer(layer(&store, |b| b))
        .service(provider);
    send(&mut svc, message(Some("k"), "hi")).await.unwrap();
    send(&mut svc, message(Some("k2"), "hi")).await.unwrap();
    tokio::time::sleep(LEASE * 2).await;
    assert_eq!(store.extends(), 0);
}

#[tokio::test(start_paused = true)]
async fn renewal_stops_when_the_caller_drops_the_send_and_the_key_is_kept() {
    let store = TestStore::default();
    let provider = Provider::answering(|_, _| pending());
    let l = layer(&store, |b| b);
    let svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());

    let dropped =
        tokio::time::timeout(LEASE * 2, svc.clone().oneshot(message(Some("k"), "hi"))).await;
    assert!(dropped.is_err());
    let renewals = store.extends();
    assert!(renewals >= 4, "{renewals} renewals");
    tokio::time::sleep(LEASE * 3).await;
    assert_eq!(store.extends(), renewals);

    let repeat = svc.oneshot(message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(repeat.code(), codes::ABORTED);
    assert!(repeat.is_replayed());
    assert_eq!(provider.calls(), 1);
    assert_eq!(l.stats().aborted, 1);
}

#[tokio::test(start_paused = true)]
async fn a_send_longer_than_the_maximum_hold_is_given_up_and_its_key_kept() {
    let store = TestStore::default();
    let provider = Provider::answering(|_, _| pending());
    let max_hold = Duration::from_secs(20);
    let l = layer(&store, |b| b.max_hold(max_hold));
    let svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());

    let started = tokio::time::Instant::now();
    let err = svc
        .clone()
        .oneshot(message(Some("k"), "hi"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), codes::MAX_HOLD);
    assert_eq!(err.category(), Category::Unknown);
    assert!(err.delivery_unknown());
    assert!(started.elapsed() >= max_hold && started.elapsed() < max_hold + Duration::from_secs(1));
    assert_eq!(l.stats().max_hold, 1);

    // Kept, never freed: long after the lease, a repeat is answered from the store.
    tokio::time::sleep(LEASE * 10).await;
    let repeat = svc.oneshot(message(Some("k"), "hi")).await.unwrap_err();
    assert_eq!(repeat.code(), codes::MAX_HOLD);
    assert!(repeat.is_replayed());
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn without_renewal_a_send_slower_than_its_lease_lets_a_repeat_send_again() {
    // The behaviour before renewal, kept for `renew(false)`: the lease must outlast a send.
    let store = TestStore::default();
    let provider = slow(LEASE * 3);
    let svc = ServiceBuilder::new()
        .layer(layer(&store, |b| b.renew(false)))
        .service(provider.clone());

    let first = tokio::spawn(svc.clone().oneshot(message(Some("k"), "hi")));
    tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
    let repeat = tokio::spawn(svc.clone().oneshot(message(Some("k"), "hi")));
    first.await.unwrap().unwrap();
    repeat.await.unwrap().unwrap();
    assert_eq!(provider.calls(), 2);
    assert_eq!(store.extends(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_store_outage_longer_than_the_renewal_window_loses_the_key_and_says_so() {
    // The limit of the guarantee (tests/protocol_model.rs): renewals fail for longer than
    // the rest of the lease, the key expires, and a repeat sends again.
    let store = TestStore::default();
    store
        .fail_extend
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let provider = slow(LEASE * 3);
    let l = layer(&store, |b| b);
    let svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());
    let (captured, _guard) = capture();

    let first = tokio::spawn(svc.clone().oneshot(message(Some("k"), "hi")));
    tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
    store
        .fail_extend
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let repeat = tokio::spawn(svc.clone().oneshot(message(Some("k"), "hi")));
    first.await.unwrap().unwrap();
    repeat.await.unwrap().unwrap();
    assert_eq!(provider.calls(), 2);
    assert_eq!(l.stats().renewal_lost, 1);
    assert!(
        captured
            .lines()
            .iter()
            .any(|l| l.starts_with("WARN") && l.contains("before it could be renewed")),
        "{:?}",
        captured.lines()
    );
}

#[tokio::test(start_paused = true)]
async fn a_store_without_extend_is_warned_about_once_and_not_asked_again() {
    let store = TestStore::default();
    store
        .extend_unsupported
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let provider = slow(LEASE / 2);
    let svc = ServiceBuilder::new()
        .layer(layer(&store, |b| b))
        .service(provider.clone());
    let (captured, _guard) = capture();
    for key in ["a", "b", "c"] {
        svc.clone().oneshot(message(Some(key), "hi")).await.unwrap();
    }
    assert_eq!(store.extends(), 1);
    let warnings = captured
        .lines()
        .into_iter()
        .filter(|l| l.contains("cannot extend"))
        .count();
    assert_eq!(warnings, 1);
    assert_eq!(provider.calls(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_concurrency_a_send_slower_than_its_lease_reaches_the_provider_once() {
    // Real time, short: a 600 ms lease, a send of 1.5 s, 50 repeats spread over 1.8 s on
    // two threads. Without renewal most of them would send again.
    let store = TestStore::default();
    let provider = slow(Duration::from_millis(1500));
    let svc = ServiceBuilder::new()
        .layer(
            IdempotencyLayer::builder()
                .store(store.clone())
                .namespace("lease")
                .lease(Duration::from_millis(600))
                .build()
                .unwrap(),
        )
        .service(provider.clone());
    let first = tokio::spawn(svc.clone().oneshot(message(Some("k"), "hi")));
    let repeats: Vec<_> = (0..50u64)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i * 36)).await;
                svc.oneshot(message(Some("k"), "hi")).await
            })
        })
        .collect();
    let sent = first.await.unwrap().unwrap();
    for repeat in repeats {
        match repeat.await.unwrap() {
            Ok(receipt) => {
                assert!(receipt.replayed);
                assert_eq!(receipt.id, sent.id);
            }
            Err(error) => assert_eq!(error.code(), codes::IN_FLIGHT),
        }
    }
    assert_eq!(provider.calls(), 1);
    assert!(store.extends() >= 5, "{} renewals", store.extends());
}

/// Without renewal, a send slower than its lease finds another send holding its key when it
/// settles: counted as `lease_lost`, and the other send's outcome is the one kept. On a
/// store that settles at once (`MemoryStore`, `complete_now`) as on one that waits.
#[tokio::test(start_paused = true)]
async fn a_send_that_finds_its_key_taken_when_it_settles_counts_the_lease_lost() {
    async fn run(store: impl tower_idempotency::store::Store + Clone, label: &str) {
        // The first call takes three leases, the others answer at once.
        let provider = Provider::answering(|n, _| async move {
            if n == 1 {
                tokio::time::sleep(LEASE * 3).await;
            }
            Ok(Receipt::new(format!("msg-{n}"), "fake"))
        });
        let l = IdempotencyLayer::builder()
            .store(store)
            .namespace("lease-lost")
            .lease(LEASE)
            .renew(false)
            .build()
            .unwrap();
        let svc = ServiceBuilder::new()
            .layer(l.clone())
            .service(provider.clone());
        let first = tokio::spawn(svc.clone().oneshot(message(Some("k"), "hi")));
        tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
        // The repeat takes the key over and sends at once; the first then settles.
        let repeat = svc.clone().oneshot(message(Some("k"), "hi")).await;
        assert_eq!(repeat.unwrap().id, "msg-2", "{label}");
        assert_eq!(l.stats().lease_lost, 0, "{label}");
        assert_eq!(first.await.unwrap().unwrap().id, "msg-1", "{label}");
        assert_eq!(l.stats().lease_lost, 1, "{label}");
        let replayed = svc.oneshot(message(Some("k"), "hi")).await.unwrap();
        assert_eq!(
            (replayed.id.as_str(), replayed.replayed),
            ("msg-2", true),
            "{label}"
        );
        assert_eq!(provider.calls(), 2, "{label}");
        assert_eq!(l.stats().lease_lost, 1, "{label}");
    }
    run(tower_idempotency::MemoryStore::new(), "memory").await;
    run(TestStore::default(), "a store that waits").await;
}

/// How a send gives up its reserve while the store is still answering it.
#[derive(Clone, Copy, Debug)]
enum GivenUp {
    /// The caller drops the send.
    Dropped,
    /// The reserve timeout fires.
    TimedOut,
}

const RESERVE_TIMEOUT: Duration = Duration::from_millis(250);

/// A layer whose takeovers ask a verification service first, which answers that the provider
/// took the message; the count of its answers.
fn verifying_layer(store: &TestStore) -> (IdempotencyLayer, Arc<AtomicUsize>) {
    verifying_layer_answering(store, || Verified::Delivered(Receipt::new("msg-0", "fake")))
}

/// [`verifying_layer`] with a verification service that answers `answer()`.
fn verifying_layer_answering(
    store: &TestStore,
    answer: impl Fn() -> Verified + Clone + Send + Sync + 'static,
) -> (IdempotencyLayer, Arc<AtomicUsize>) {
    let asked = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&asked);
    let verifier = tower::service_fn(move |_: Verify| {
        counted.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<_, BoxError>(answer()))
    });
    let l = layer(store, |b| {
        b.reserve_timeout(RESERVE_TIMEOUT)
            .verify_takeovers(verifier)
    });
    (l, asked)
}

/// Gives `call` up as `how` says, while its store reserve waits at the closed `gate`
/// (`timed_out` checks the answer of a call the reserve timeout ended), then lets the store
/// answer that reserve in the layer's background task. Returns once that task has had the
/// answer.
async fn give_up<F: Future>(
    store: &TestStore,
    gate: Arc<Semaphore>,
    call: F,
    how: GivenUp,
    timed_out: impl FnOnce(F::Output),
) {
    match how {
        GivenUp::Dropped => {
            // Polled once, so the reserve is at the gate, then dropped.
            let mut call = Box::pin(call);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(call.as_mut().poll(&mut cx).is_pending());
            drop(call);
        }
        GivenUp::TimedOut => timed_out(call.await),
    }
    assert_eq!(store.reserve_calls(), 1, "{how:?}");
    gate.add_permits(1);
    // The background task starts any release in the poll that has the store's answer.
    support::wait_until(|| store.reserves_answered.load(Ordering::SeqCst) == 1).await;
    *store.gate.lock().unwrap() = None;
}

/// Sends `m` through `l` and gives its reserve up ([`give_up`]).
async fn give_up_a_reserve(store: &TestStore, l: &IdempotencyLayer, m: Message, how: GivenUp) {
    let gate = store.close_gate();
    let provider = Provider::ok();
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());
    let call = svc.ready().await.unwrap().call(m);
    give_up(store, gate, call, how, |answer| {
        assert_eq!(answer.unwrap_err().code(), codes::STORE_FAILED, "{how:?}");
    })
    .await;
    assert_eq!(provider.calls(), 0, "{how:?}");
}

/// Sends `messages` as one batch through `l` and gives its reserve, one store call for every
/// key, up ([`give_up`]).
async fn give_up_a_batch_reserve(
    store: &TestStore,
    l: &IdempotencyLayer,
    messages: Vec<Message>,
    how: GivenUp,
) {
    let gate = store.close_gate();
    let provider = BatchProvider::ok();
    let mut svc = tower::Layer::layer(l, provider.clone());
    let call = ServiceExt::<Batch>::ready(&mut svc)
        .await
        .unwrap()
        .call(Batch::from(messages));
    give_up(store, gate, call, how, |answer| {
        for outcome in answer.expect("a batch answers message by message") {
            assert_eq!(outcome.unwrap_err().code(), codes::STORE_FAILED, "{how:?}");
        }
    })
    .await;
    assert!(provider.batches().is_empty(), "{how:?}");
}

/// A holder of `m` under `key` that crashed mid-send: its lease passes, its record stays.
async fn crashed_holder(store: &TestStore, key: &str, m: &Message) {
    let crashed = store.inner.reserve(key, Fingerprint::of(m), LEASE).await;
    assert!(matches!(crashed, Ok(Reservation::Reserved { .. })));
    tokio::time::advance(LEASE + Duration::from_secs(1)).await;
}

/// After the lease of a given-up reserve that took `m`'s key over, a send of `m` through `l`
/// takes the key over again: it asks the verification service (`asked` counts its answers),
/// which answers delivered, and is never sent.
async fn taken_over_again(l: &IdempotencyLayer, asked: &AtomicUsize, m: Message, how: GivenUp) {
    tokio::time::advance(LEASE + Duration::from_secs(1)).await;
    let provider = Provider::ok();
    let mut svc = ServiceBuilder::new()
        .layer(l.clone())
        .service(provider.clone());
    let receipt = send(&mut svc, m).await.unwrap();
    assert_eq!(
        (receipt.id.as_str(), receipt.replayed),
        ("msg-0", true),
        "{how:?}"
    );
    assert_eq!(asked.load(Ordering::SeqCst), 1, "{how:?}: checked first");
    let stats = l.stats();
    assert_eq!(stats.taken_over, 1, "{how:?}");
    assert_eq!(stats.verified_delivered, 1, "{how:?}");
    assert_eq!(provider.calls(), 0, "{how:?}: never sent again");
}

/// A takeover's earlier holder may have sent: a reserve that took the key over and was given
/// up does not free it. The key stays pending for its lease, and the repeat after it takes it
/// over again, asking the verification service, rather than sending as a fresh key would.
#[tokio::test(start_paused = true)]
async fn a_given_up_reserve_that_took_a_key_over_keeps_it_until_its_lease_passes() {
    for how in [GivenUp::Dropped, GivenUp::TimedOut] {
        let store = TestStore::default();
        let m = message(Some("k"), "hi");
        let fingerprint = Fingerprint::of(&m);
        crashed_holder(&store, "lease:k", &m).await;

        let (l, asked) = verifying_layer(&store);
        give_up_a_reserve(&store, &l, m.clone(), how).await;
        assert_eq!(store.releases.load(Ordering::SeqCst), 0, "{how:?}");
        let held = store.inner.reserve("lease:k", fingerprint, LEASE).await;
        match held {
            Ok(Reservation::Held { record }) => {
                assert_eq!(record.state, RecordState::Pending, "{how:?}");
                assert_eq!(record.fingerprint, fingerprint, "{how:?}");
            }
            other => panic!("{how:?}: the taken-over key is still held, got {other:?}"),
        }

        let provider = Provider::ok();
        let mut svc = ServiceBuilder::new()
            .layer(l.clone())
            .service(provider.clone());
        let repeat = send(&mut svc, m.clone()).await.unwrap_err();
        assert_eq!(repeat.code(), codes::IN_FLIGHT, "{how:?}");
        assert_eq!(provider.calls(), 0, "{how:?}");

        taken_over_again(&l, &asked, m, how).await;
    }
}

/// The contrast: a reserve that took a free key and was given up sent nothing, so the key is
/// freed at once and the next send goes without waiting for a lease or a check.
#[tokio::test(start_paused = true)]
async fn a_given_up_reserve_of_a_free_key_frees_it_at_once() {
    for how in [GivenUp::Dropped, GivenUp::TimedOut] {
        let store = TestStore::default();
        let m = message(Some("k"), "hi");
        let (l, asked) = verifying_layer(&store);
        give_up_a_reserve(&store, &l, m.clone(), how).await;
        assert_eq!(store.releases.load(Ordering::SeqCst), 1, "{how:?}");

        let provider = Provider::ok();
        let mut svc = ServiceBuilder::new()
            .layer(l.clone())
            .service(provider.clone());
        let receipt = send(&mut svc, m).await.unwrap();
        assert_eq!((receipt.id.as_str(), receipt.replayed), ("msg-1", false));
        assert_eq!(provider.calls(), 1, "{how:?}");
        assert_eq!(asked.load(Ordering::SeqCst), 0, "{how:?}");
        assert_eq!(l.stats().taken_over, 0, "{how:?}");
    }
}

/// A batch gives up its reserve as a single send does, and its one store call holds both
/// kinds of key: once it finishes in the background, the key it freshly reserved is freed at
/// once, and the key it took over is kept for its lease. The next batch sends the fresh
/// message and finds the other in flight; after the lease, the kept key is taken over again,
/// asking the verification service, rather than sent as a fresh key would be.
#[tokio::test(start_paused = true)]
async fn a_given_up_batch_reserve_frees_its_fresh_keys_and_keeps_a_taken_over_one() {
    for how in [GivenUp::Dropped, GivenUp::TimedOut] {
        let store = TestStore::default();
        let fresh = message(Some("fresh"), "fresh");
        let stale = message(Some("stale"), "stale");
        crashed_holder(&store, "lease:stale", &stale).await;

        let (l, asked) = verifying_layer(&store);
        give_up_a_batch_reserve(&store, &l, vec![fresh.clone(), stale.clone()], how).await;

        // At once, within the lease the given-up call took.
        let provider = BatchProvider::ok();
        let mut svc = tower::Layer::layer(&l, provider.clone());
        let answers = send_batch(&mut svc, vec![fresh, stale.clone()]).await;
        let sent = answers[0].as_ref().unwrap();
        assert_eq!(
            (sent.id.as_str(), sent.replayed),
            ("id-fresh", false),
            "{how:?}"
        );
        let kept = answers[1].as_ref().unwrap_err();
        assert_eq!(kept.code(), codes::IN_FLIGHT, "{how:?}");
        assert_eq!(
            provider.batches(),
            vec![vec!["fresh".to_owned()]],
            "{how:?}"
        );

        taken_over_again(&l, &asked, stale, how).await;
    }
}

/// A batch decides each key it took over from a crashed holder of the same message as a
/// single send does, before it sends: the verification service is asked, and a key the
/// provider took is answered with its receipt (replayed) and not sent, one it never saw is
/// sent with the batch, one it cannot vouch for is kept unsent. A fresh key of the same
/// batch goes in every case, and a key a crashed holder of another message left is sent
/// without asking.
#[tokio::test(start_paused = true)]
async fn a_batch_checks_the_keys_it_takes_over_before_it_sends() {
    /// The verification service's answer in each case.
    type Answer = fn() -> Verified;
    let delivered: Answer = || Verified::Delivered(Receipt::new("msg-0", "fake"));
    let cases = [
        ("delivered", delivered),
        ("not sent", || Verified::NotSent),
        ("unknown", || Verified::Unknown),
    ];
    for (case, answer) in cases {
        let store = TestStore::default();
        let fresh = message(Some("fresh"), "fresh");
        let stale = message(Some("stale"), "stale");
        let other = message(Some("other"), "other");
        crashed_holder(&store, "lease:stale", &stale).await;
        // A holder of another message (fresh's) under "other" crashed too.
        crashed_holder(&store, "lease:other", &fresh).await;

        let (l, asked) = verifying_layer_answering(&store, answer);
        let provider = BatchProvider::ok();
        let mut svc = tower::Layer::layer(&l, provider.clone());
        let answers = send_batch(&mut svc, vec![fresh, stale.clone(), other]).await;
        let sent = answers[0].as_ref().unwrap();
        assert_eq!(
            (sent.id.as_str(), sent.replayed),
            ("id-fresh", false),
            "{case}"
        );
        let other_sent = answers[2].as_ref().unwrap();
        assert_eq!(other_sent.id, "id-other", "{case}");
        assert_eq!(
            asked.load(Ordering::SeqCst),
            1,
            "{case}: asked once, for stale"
        );
        assert_eq!(l.stats().taken_over, 1, "{case}");
        let texts = |names: &[&str]| vec![names.iter().map(|n| n.to_string()).collect::<Vec<_>>()];
        match case {
            "delivered" => {
                let kept = answers[1].as_ref().unwrap();
                assert_eq!((kept.id.as_str(), kept.replayed), ("msg-0", true));
                assert_eq!(provider.batches(), texts(&["fresh", "other"]));
                assert_eq!(l.stats().verified_delivered, 1);
            }
            "not sent" => {
                let now_sent = answers[1].as_ref().unwrap();
                assert_eq!(
                    (now_sent.id.as_str(), now_sent.replayed),
                    ("id-stale", false)
                );
                assert_eq!(provider.batches(), texts(&["fresh", "stale", "other"]));
                assert_eq!(l.stats().verified_not_sent, 1);
            }
            _ => {
                let error = answers[1].as_ref().unwrap_err();
                assert_eq!(error.code(), codes::UNVERIFIED);
                assert_eq!(provider.batches(), texts(&["fresh", "other"]));
                assert_eq!(l.stats().verify_inconclusive, 1);
            }
        }

        // Settled by the check or by the send: a repeat is answered from the store, and
        // nothing is asked or sent again.
        let before = provider.batches().len();
        let again = send_batch(&mut svc, vec![stale]).await;
        match &again[0] {
            Ok(receipt) => assert!(receipt.replayed, "{case}"),
            Err(error) => assert!(error.is_replayed(), "{case}: {error}"),
        }
        assert_eq!(asked.load(Ordering::SeqCst), 1, "{case}");
        assert_eq!(provider.batches().len(), before, "{case}");
    }
}
