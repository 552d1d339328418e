//! The outbox's behaviour, the same on every database: each case gets a fresh, empty table
//! of its own, and reads the rows around the outbox through its [`Database`].

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;
use tower::{Layer, ServiceExt};

use super::{Database, Gated, Provider, Running, Table, message, start};
use crate::support::poll_until;
use crate::support::stores::unique;
use tower_idempotency::message::Attachment;
use tower_idempotency::outbox::{Enqueued, Outbox, Worker};
use tower_idempotency::store::StoreErrorKind;
use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message, Receipt, SendError};

pub async fn a_message_commits_or_rolls_back_with_the_callers_transaction<D: Database>(
    t: &Table<D>,
) {
    let in_transaction = |messages: Vec<Message>, commit: bool| async move {
        D::enqueue_in_transaction(&t.url, &t.outbox, &messages, commit).await
    };
    let answers = in_transaction(vec![message("k1")], false).await;
    assert!(matches!(answers[..], [Ok(Enqueued::New(_))]), "{answers:?}");
    assert_eq!(
        t.outbox.counts().await.unwrap().waiting,
        0,
        "a rollback leaves no row"
    );

    let answers = in_transaction(vec![message("k1"), message("k1")], true).await;
    let [Ok(Enqueued::New(id)), Ok(Enqueued::AlreadyThere)] = answers[..] else {
        panic!("a new row, then the same key again changes nothing: {answers:?}");
    };
    assert!(id > 0);
    assert_eq!(t.outbox.counts().await.unwrap().waiting, 1);

    let unkeyed = Message::builder()
        .from("a@x")
        .to("b@x")
        .text("t")
        .build()
        .unwrap();
    let answers = in_transaction(vec![message("k1"), unkeyed], false).await;
    assert!(
        matches!(answers[0], Ok(Enqueued::AlreadyThere)),
        "a committed key, enqueued again, changes nothing: {answers:?}"
    );
    let Err(error) = &answers[1] else {
        panic!("a message without a key is refused: {answers:?}");
    };
    assert_eq!(error.kind(), StoreErrorKind::InvalidInput);
    assert_eq!(t.outbox.counts().await.unwrap().waiting, 1);
}

pub async fn a_worker_sends_each_message_once_as_it_was_enqueued_and_a_second_worker_finds_nothing_to_send<
    D: Database,
>(
    t: &Table<D>,
) {
    // Text in several scripts and an attachment: the stored form keeps them whole.
    let original = Message::builder()
        .from("orders@shop.example")
        .to("seller@example.com")
        .subject("Grüße — 注文 🎉")
        .text("Ваш заказ отправлен. 你好 👋")
        .attachment(Attachment::new(
            "a.bin",
            "application/octet-stream",
            vec![0u8, 255, 10, 13],
        ))
        .idempotency_key("unicode")
        .build()
        .unwrap();
    let mut messages = vec![original.clone()];
    messages.extend((0..4).map(|i| message(&format!("once-{i}"))));
    t.enqueue_messages(&messages).await;

    let seen = Arc::new(Mutex::new(HashMap::<String, Message>::new()));
    let record = Arc::clone(&seen);
    let provider = Provider::ok();
    let inner = provider.service();
    let stack = tower::service_fn(move |m: Message| {
        let key = m.idempotency_key().unwrap().as_str().to_owned();
        record.lock().unwrap().insert(key, m.clone());
        inner.clone().oneshot(m)
    });
    let stats = t.drain(t.worker(stack), 5).await;
    assert_eq!((stats.claimed, stats.sent), (5, 5));
    assert_eq!(seen.lock().unwrap()["unicode"], original);
    for row in t.rows().await {
        assert_eq!((row.state.as_str(), row.attempts), ("done", 1), "{row:?}");
        assert_eq!(
            row.provider_id,
            Some(format!("id-{}", row.key)),
            "the row keeps the provider's receipt"
        );
        assert_eq!(provider.calls(&row.key), 1, "{row:?}");
    }

    // A second run polls busily and finds nothing to send.
    let stats = t.polls(provider.service(), 5).await;
    assert_eq!(stats.claimed, 0);
    assert_eq!(provider.total(), 5);
}

pub async fn done_rows_are_purged_after_their_retention_and_lag_reads_the_oldest_waiting_row<
    D: Database,
>(
    t: &Table<D>,
) {
    assert_eq!(t.outbox.lag().await.unwrap(), None, "nothing waits");
    t.enqueue((0..5).map(|i| format!("purge-{i}"))).await;
    assert!(t.outbox.lag().await.unwrap().is_some(), "rows wait");
    let provider = Provider::ok();
    t.drain(t.worker(provider.service()), 5).await;
    assert_eq!(t.outbox.lag().await.unwrap(), None, "every row went");
    t.enqueue(["still-waiting".to_owned()]).await;
    assert!(t.outbox.lag().await.unwrap().is_some(), "a row waits");

    // A retention not yet reached keeps every row; then done rows go, in small statements.
    assert_eq!(
        t.outbox
            .purge_done(Duration::from_secs(3600), 2)
            .await
            .unwrap(),
        0,
        "sent just now: kept"
    );
    assert_eq!(t.outbox.purge_done(Duration::ZERO, 2).await.unwrap(), 5);
    let counts = t.outbox.counts().await.unwrap();
    assert_eq!(
        (counts.done, counts.waiting),
        (0, 1),
        "a waiting row is never purged"
    );
}

pub async fn four_workers_on_one_table_send_a_thousand_messages_exactly_once<D: Database>(
    t: &Table<D>,
) {
    let keys: Vec<String> = (0..1000).map(|i| format!("four-{i}")).collect();
    t.enqueue(keys.clone()).await;
    let provider = Provider::ok();
    let workers: Vec<Running> = (0..4)
        .map(|_| start(t.worker(provider.service()).batch(25)))
        .collect();
    let total = keys.len() as u64;
    t.until(Duration::from_secs(60), |counts| counts.done == total)
        .await;
    let mut sent = 0;
    for worker in workers {
        sent += worker.stop().await.sent;
    }
    assert_eq!(sent, total);
    let calls = provider.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), keys.len());
    assert!(calls.values().all(|&n| n == 1), "a message went twice");
}

/// How the provider answers a key, by the kind its name starts with: `poison` fails
/// retryably every time, `refused` is refused, `unknown` times out with its delivery unknown,
/// `limited` is rate limited for an hour; any other is sent.
fn answer_by_kind(key: &str) -> Result<Receipt, SendError> {
    let kind = key.split('-').next().unwrap_or_default();
    match kind {
        "poison" => Err(SendError::retryable("provider.unavailable", "503")),
        "refused" => Err(SendError::permanent("provider.rejected", "422")),
        "unknown" => Err(SendError::unknown_delivery("provider.timeout", "timed out")),
        "limited" => Err(SendError::retryable("provider.rate_limited", "429")
            .with_retry_after(Duration::from_secs(3600))),
        _ => Ok(Receipt::new(format!("id-{key}"), "fake")),
    }
}

/// A worker that gives up after three attempts, a few milliseconds apart.
fn retrying<S>(outbox: &Outbox, stack: S) -> Worker<S> {
    outbox
        .worker(stack)
        .max_attempts(3)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .poll_interval(Duration::from_millis(10))
}

/// A failure put back is tried again, a `Retry-After` holds its row, a poison message ends
/// dead after its attempts without blocking the rest, a refusal and an unknown delivery end
/// dead at once, and a dead letter requeued by an operator goes again.
pub async fn retries_retry_after_and_dead_letters_then_a_requeue_sends_again<D: Database>(
    t: &Table<D>,
) {
    let keys = ["flaky", "poison", "refused", "unknown", "limited", "good"];
    t.enqueue(keys.map(String::from)).await;
    let provider = Provider::answering(answer_by_kind);
    // "flaky" fails its first send, then goes.
    let flaky_calls = Arc::new(Mutex::new(0));
    let counted = Arc::clone(&flaky_calls);
    let inner = provider.service();
    let stack = tower::service_fn(move |m: Message| {
        let flaky = m.idempotency_key().unwrap().as_str() == "flaky";
        let first = flaky && {
            let mut n = counted.lock().unwrap();
            *n += 1;
            *n == 1
        };
        let inner = inner.clone();
        async move {
            if first {
                return Err(BoxError::from(SendError::retryable(
                    "provider.unavailable",
                    "503",
                )));
            }
            inner.oneshot(m).await
        }
    });
    let worker = start(retrying(&t.outbox, stack));
    t.until(Duration::from_secs(10), |counts| {
        counts.done == 2 && counts.dead == 3
    })
    .await;
    let stats = worker.stop().await;
    // flaky once, poison twice before it died, limited once.
    assert_eq!((stats.sent, stats.dead_lettered, stats.retried), (2, 3, 4));
    assert_eq!(*flaky_calls.lock().unwrap(), 2, "failed, then sent");
    assert_eq!(provider.calls("poison"), 3, "retried up to its attempts");
    assert_eq!(provider.calls("refused"), 1, "a refusal is not retried");
    assert_eq!(
        provider.calls("unknown"),
        1,
        "an unknown delivery is not retried: the layer would only replay it"
    );
    assert_eq!(provider.calls("limited"), 1, "held for its Retry-After");
    let limited = t.row("limited").await;
    assert_eq!(
        (
            limited.state.as_str(),
            limited.attempts,
            limited.held_an_hour
        ),
        ("waiting", 1, true)
    );

    let dead = t.outbox.dead_letters(10).await.unwrap();
    let why: HashMap<_, _> = dead
        .iter()
        .map(|d| (d.key.as_str(), d.last_error.as_deref().unwrap_or_default()))
        .collect();
    assert_eq!(why.len(), 3, "{why:?}");
    assert!(
        why["poison"].starts_with("provider.unavailable (out of attempts)"),
        "{why:?}"
    );
    assert!(why["refused"].starts_with("provider.rejected"), "{why:?}");
    assert!(
        why["unknown"].starts_with("provider.timeout (delivery unknown"),
        "{why:?}"
    );
    let poison = dead.iter().find(|d| d.key == "poison");
    assert_eq!(poison.map(|d| d.attempts), Some(3));

    // Requeued by an operator once its cause is fixed, it goes again.
    assert!(t.outbox.requeue("refused").await.unwrap());
    assert!(
        !t.outbox.requeue("refused").await.unwrap(),
        "no longer dead"
    );
    assert!(
        !t.outbox.requeue("good").await.unwrap(),
        "a done row is not requeued"
    );
    let fixed = Provider::ok();
    t.drain(t.worker(fixed.service()), 3).await;
    assert_eq!(fixed.calls("refused"), 1);
    assert_eq!(fixed.total(), 1, "only the requeued row went");
}

pub async fn retries_retry_after_and_dead_letters_hold_with_many_sends_in_flight<D: Database>(
    t: &Table<D>,
) {
    // Of every four keys: one sent, one refused, one failing until out of attempts, one
    // rate limited for an hour.
    let kinds = ["good", "refused", "poison", "limited"];
    t.enqueue((0..60).map(|i| format!("{}-{i}", kinds[i % 4])))
        .await;
    let provider = Provider::answering(answer_by_kind);
    let gated = Gated::new();
    let worker = start(retrying(&t.outbox, gated.service(&provider, 60)).concurrency(64));
    // The first answers come only once every row's first send is in flight.
    tokio::time::timeout(Duration::from_secs(10), gated.reached.notified())
        .await
        .expect("sixty sends in flight at once");
    gated.gate.add_permits(1000);
    t.until(Duration::from_secs(20), |counts| {
        counts.done == 15 && counts.dead == 30
    })
    .await;
    let stats = worker.stop().await;
    assert_eq!((stats.sent, stats.dead_lettered), (15, 30));
    // 15 retries before the out-of-attempts ones died, and one for each rate limited key.
    assert_eq!(stats.retried, 15 * 2 + 15);
    for row in t.rows().await {
        let expected = match row.key.split('-').next() {
            Some("good") => ("done", 1, false),
            Some("refused") => ("dead", 1, false),
            Some("poison") => ("dead", 3, false),
            _ => ("waiting", 1, true),
        };
        assert_eq!(
            (row.state.as_str(), row.attempts, row.held_an_hour),
            expected,
            "{row:?}"
        );
        assert_eq!(provider.calls(&row.key), row.attempts as usize, "{row:?}");
    }
}

pub async fn a_worker_has_as_many_sends_in_flight_as_its_concurrency_and_no_more<D: Database>(
    t: &Table<D>,
) {
    t.enqueue((0..30).map(|i| format!("conc-{i}"))).await;
    let provider = Provider::ok();
    let gated = Gated::new();
    let worker = start(t.worker(gated.service(&provider, 8)).concurrency(8));
    // Every send waits for a permit: eight are in flight together, or this never fires.
    tokio::time::timeout(Duration::from_secs(10), gated.reached.notified())
        .await
        .expect("eight sends in flight at once");
    gated.gate.add_permits(30);
    t.until_done(30).await;
    let stats = worker.stop().await;
    assert_eq!(
        gated.peak.load(Ordering::SeqCst),
        8,
        "never more than eight"
    );
    assert_eq!((stats.claimed, stats.sent), (30, 30));
    assert!((0..30).all(|i| provider.calls(&format!("conc-{i}")) == 1));
}

/// Stopped with two sends in hand and four rows queued, a worker lets the two answer and
/// puts the four back, which the next worker sends at once, each message once.
pub async fn a_worker_told_to_stop_lets_its_sends_answer_and_puts_back_the_rows_it_did_not_start<
    D: Database,
>(
    t: &Table<D>,
) {
    let keys: Vec<String> = (0..10).map(|i| format!("stop-{i}")).collect();
    t.enqueue(keys.clone()).await;
    let provider = Provider::ok();
    let gated = Gated::new();
    // The stack takes two sends at a time: of the six rows the worker claims, four wait
    // for it to be ready.
    let stack = tower::ServiceBuilder::new()
        .concurrency_limit(2)
        .service(gated.service(&provider, 2));
    let worker = t
        .outbox
        .worker(stack)
        .concurrency(6)
        .batch(6)
        .claim_lease(Duration::from_secs(3600));
    let stats_handle = worker.stats();
    let worker = start(worker);
    tokio::time::timeout(Duration::from_secs(5), gated.reached.notified())
        .await
        .expect("two sends in flight");
    poll_until(
        "the worker claims six rows",
        Duration::from_secs(5),
        || async { stats_handle.get().claimed == 6 },
    )
    .await;
    // The stop is asked while two sends are in hand; then their provider answers.
    let Running { stop, task } = worker;
    let _ = stop.send(());
    gated.gate.add_permits(2);
    let stats = task.await.unwrap();
    assert_eq!((stats.claimed, stats.sent, stats.released), (6, 2, 4));
    let counts = t.outbox.counts().await.unwrap();
    assert_eq!((counts.done, counts.waiting), (2, 8));

    // The four put back go at once, without waiting for the hour-long claim.
    t.drain(t.worker(provider.service()), 10).await;
    assert!(
        keys.iter().all(|key| provider.calls(key) == 1),
        "nothing went twice"
    );
    for row in t.rows().await {
        assert_eq!(
            row.attempts, 1,
            "{row:?}: a row put back unsent does not count an attempt"
        );
    }
}

/// A worker whose stack never answers is killed holding the row: the row goes to the
/// next worker once the claim passes, not before.
pub async fn a_worker_killed_before_sending_leaves_its_rows_to_the_next_once_the_claim_passes<
    D: Database,
>(
    t: &Table<D>,
) {
    t.enqueue(["k".to_owned()]).await;
    let provider = Provider::ok();
    // A stack that never gets to the provider: the process dies first.
    let stalled =
        tower::service_fn(|_m: Message| std::future::pending::<Result<Receipt, BoxError>>());
    let doomed = t
        .outbox
        .worker(stalled)
        .claim_lease(Duration::from_millis(300));
    let doomed_stats = doomed.stats();
    let doomed = tokio::spawn(doomed.run(std::future::pending()));
    poll_until(
        "the doomed worker claims the row",
        Duration::from_secs(5),
        || async { doomed_stats.get().claimed == 1 },
    )
    .await;
    doomed.abort(); // killed: no release, no answer
    let _ = doomed.await;

    // Within the lease, nobody takes the row.
    let early = t.polls(provider.service(), 3).await;
    assert_eq!(early.claimed, 0, "the claim still holds the row");

    t.drain(t.worker(provider.service()), 1).await;
    assert_eq!(provider.calls("k"), 1);
    assert_eq!(t.row("k").await.attempts, 2, "the killed attempt counts");
}

pub async fn a_worker_killed_after_the_provider_took_the_message_does_not_send_it_again<
    D: Database,
>(
    t: &Table<D>,
) {
    t.enqueue(["k".to_owned()]).await;
    let provider = Provider::ok();
    let store = MemoryStore::new();
    let stack = |store: MemoryStore| {
        IdempotencyLayer::builder()
            .store(store)
            .build()
            .unwrap()
            .layer(provider.service())
    };

    // The process dies after the stack answered, before the row is marked done.
    let answered = Arc::new(Notify::new());
    let dying = {
        let answered = Arc::clone(&answered);
        let inner = stack(store.clone());
        tower::service_fn(move |m: Message| {
            let inner = inner.clone();
            let answered = Arc::clone(&answered);
            async move {
                let receipt = inner.oneshot(m).await;
                answered.notify_one();
                std::future::pending::<()>().await;
                receipt.map_err(BoxError::from)
            }
        })
    };
    let doomed = tokio::spawn(
        t.outbox
            .worker(dying)
            .claim_lease(Duration::from_millis(300))
            .run(std::future::pending()),
    );
    tokio::time::timeout(Duration::from_secs(5), answered.notified())
        .await
        .expect("the provider was called");
    doomed.abort();

    t.drain(t.worker(stack(store)), 1).await;
    assert_eq!(
        provider.calls("k"),
        1,
        "the layer's store answered the repeat"
    );
    assert_eq!(
        t.row("k").await.provider_id.as_deref(),
        Some("id-k"),
        "the row keeps the original receipt"
    );
}

pub async fn the_late_answer_of_a_claim_that_passed_is_not_recorded_over_the_next_claims<
    D: Database,
>(
    t: &Table<D>,
) {
    t.enqueue(["k".to_owned()]).await;
    let slow = Provider::answering(|_| Ok(Receipt::new("late", "fake")));
    let gated = Gated::new();
    let first = t
        .outbox
        .worker(gated.service(&slow, 1))
        .claim_lease(Duration::from_millis(200));
    let first = start(first);
    tokio::time::timeout(Duration::from_secs(5), gated.reached.notified())
        .await
        .expect("the first send is in flight");

    // Its lease passes while the send hangs: a second worker takes the row, and its send
    // hangs too.
    let provider = Provider::ok();
    let gated_second = Gated::new();
    let second = start(t.worker(gated_second.service(&provider, 1)));
    tokio::time::timeout(Duration::from_secs(5), gated_second.reached.notified())
        .await
        .expect("the second claim's send is in flight");

    // The first send answers now, while the second claim holds the row: nothing recorded.
    gated.gate.add_permits(1);
    let stats = first.stop().await;
    assert_eq!(
        (stats.claimed, stats.sent),
        (1, 0),
        "the late answer is not counted"
    );
    assert_eq!(
        t.outbox.counts().await.unwrap().waiting,
        1,
        "still the second's"
    );

    gated_second.gate.add_permits(1);
    t.until_done(1).await;
    assert_eq!(second.stop().await.sent, 1);
    let row = t.row("k").await;
    assert_eq!(
        (row.state.as_str(), row.attempts, row.provider_id.as_deref()),
        ("done", 2, Some("id-k")),
        "the row keeps the second claim's answer"
    );
}

pub async fn a_schedule_with_sub_millisecond_digits_is_sent_once_through_the_outbox<D: Database>(
    t: &Table<D>,
) {
    let provider = Provider::ok();
    let store = MemoryStore::new();
    let stack = || {
        IdempotencyLayer::builder()
            .store(store.clone())
            .build()
            .unwrap()
            .layer(provider.service())
    };
    // A day ahead, with digits below the millisecond, as `now() + 1 day` has.
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let at = UNIX_EPOCH + Duration::new(now.as_secs() + 86_400, 123_456_789);
    let scheduled = |key: &str| {
        Message::builder()
            .from("orders@shop.example")
            .to("seller@example.com")
            .text("Your order ships tomorrow.")
            .send_at(at)
            .idempotency_key(key)
            .build()
            .unwrap()
    };

    // One message through the outbox alone; one sent inline first, then enqueued as
    // well: the worker's stack answers it from the layer's record of that first send.
    let inline = scheduled("sub-ms-inline");
    let receipt = stack().oneshot(inline.clone()).await.expect("inline send");
    t.enqueue_messages(&[scheduled("sub-ms-outbox"), inline])
        .await;

    let worker = start(t.worker(stack()));
    t.until(Duration::from_secs(10), |counts| {
        counts.done + counts.dead == 2
    })
    .await;
    let stats = worker.stop().await;
    assert_eq!(
        t.outbox.dead_letters(10).await.unwrap(),
        vec![],
        "no key_reused"
    );
    assert_eq!((stats.sent, stats.dead_lettered), (2, 0));
    assert_eq!(provider.calls("sub-ms-outbox"), 1);
    assert_eq!(
        provider.calls("sub-ms-inline"),
        1,
        "the repeat was replayed"
    );
    assert_eq!(t.row("sub-ms-inline").await.provider_id, Some(receipt.id));
}

pub async fn an_outbox_refuses_bad_table_names_other_schemes_and_a_missing_table<D: Database>(
    t: &Table<D>,
) {
    let outbox = Outbox::connect(&t.url).await.expect("connect");
    let error = outbox.clone().table("Out-box").unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured);
    let error = Outbox::connect("redis://127.0.0.1:6379").await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured);
    assert!(
        error.to_string().contains("postgres://") && error.to_string().contains("mysql://"),
        "{error}"
    );

    let missing = outbox.table(&unique("outbox_missing")).unwrap();
    let error = missing.counts().await.unwrap_err();
    assert!(error.to_string().contains("Outbox::migrate"), "{error}");
}
