//! The PostgreSQL outbox against a real server: the message commits or rolls back with the
//! caller's transaction, workers send each message once (four of them on one table, workers
//! killed before and after the provider took a message, a worker told to stop), poison
//! messages end dead without blocking the rest, and `NOTIFY` wakes an idle worker.
//!
//! Runs against `DATABASE_URL` or the default local server; reported as ignored when none
//! answered as the suite was built (see `support::stores`).
#![cfg(feature = "postgres")]

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::Notify;
use tower::{Layer, ServiceExt};

use support::outbox::{Gated, Provider, cases, eventually, message, start};
use support::stores::postgres_admin::{admin, drop_table};
use support::stores::{backend_url, unique};
use tower_idempotency::outbox::{Enqueued, Outbox};
use tower_idempotency::store::StoreErrorKind;
use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message, Receipt, SendError};

/// A fresh outbox table of the test's own, migrated (see `backend_url` for the `Option`).
async fn outbox(test: &str) -> Option<(String, Outbox)> {
    let url = backend_url("DATABASE_URL")?;
    let outbox = Outbox::connect(&url)
        .await
        .expect("connect")
        .table(&unique(test))
        .expect("valid table name");
    outbox.migrate().await.expect("migrate");
    Some((url, outbox))
}

/// Enqueues `keys` in one committed transaction.
async fn enqueue(url: &str, outbox: &Outbox, keys: impl IntoIterator<Item = String>) {
    let mut client = admin(url).await;
    let tx = client.transaction().await.expect("begin");
    for key in keys {
        outbox.enqueue(&tx, &message(&key)).await.expect("enqueue");
    }
    tx.commit().await.expect("commit");
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_message_commits_or_rolls_back_with_the_callers_transaction() {
    let Some((url, outbox)) = outbox("outbox_tx").await else {
        return;
    };
    let mut client = admin(&url).await;

    let tx = client.transaction().await.unwrap();
    assert!(matches!(
        outbox.enqueue(&tx, &message("k1")).await,
        Ok(Enqueued::New(_))
    ));
    tx.rollback().await.unwrap();
    assert_eq!(
        outbox.counts().await.unwrap().waiting,
        0,
        "a rollback leaves no row"
    );

    let tx = client.transaction().await.unwrap();
    assert!(matches!(
        outbox.enqueue(&tx, &message("k1")).await,
        Ok(Enqueued::New(_))
    ));
    assert_eq!(
        outbox.enqueue(&tx, &message("k1")).await.unwrap(),
        Enqueued::AlreadyThere
    );
    tx.commit().await.unwrap();
    assert_eq!(outbox.counts().await.unwrap().waiting, 1);

    let unkeyed = Message::builder()
        .from("a@x")
        .to("b@x")
        .text("t")
        .build()
        .unwrap();
    let tx = client.transaction().await.unwrap();
    let error = outbox.enqueue(&tx, &unkeyed).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::InvalidInput);
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_worker_sends_each_message_once_and_a_second_worker_finds_nothing_to_send() {
    let Some((url, outbox)) = outbox("outbox_once").await else {
        return;
    };
    enqueue(&url, &outbox, (0..5).map(|i| format!("once-{i}"))).await;
    let provider = Provider::ok();

    let first = start(
        outbox
            .worker(provider.service())
            .poll_interval(Duration::from_millis(20)),
    );
    eventually(Duration::from_secs(10), || async {
        outbox.counts().await.unwrap().done == 5
    })
    .await;
    let stats = first.stop().await;
    assert_eq!((stats.claimed, stats.sent), (5, 5));

    let rows = admin(&url)
        .await
        .query(
            &format!("SELECT key, provider_id FROM \"{}\"", outbox.table_name()),
            &[],
        )
        .await
        .unwrap();
    for row in rows {
        let (key, id): (String, String) = (row.get(0), row.get(1));
        assert_eq!(
            id,
            format!("id-{key}"),
            "the row keeps the provider's receipt"
        );
        assert_eq!(provider.calls(&key), 1);
    }

    // A second run polls busily for a bounded time and finds nothing to send.
    let second = outbox
        .worker(provider.service())
        .poll_interval(Duration::from_millis(5));
    let stats = second
        .run(tokio::time::sleep(Duration::from_millis(300)))
        .await
        .unwrap();
    assert_eq!(stats.claimed, 0);
    assert_eq!(provider.total(), 5);
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn four_workers_on_one_table_send_a_thousand_messages_exactly_once() {
    let Some((url, outbox)) = outbox("outbox_four").await else {
        return;
    };
    let keys: Vec<String> = (0..1000).map(|i| format!("four-{i}")).collect();
    enqueue(&url, &outbox, keys.clone()).await;
    cases::four_workers_send_each_message_once(&outbox, &keys).await;
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_poison_message_ends_dead_after_its_attempts_and_blocks_nothing() {
    let Some((url, outbox)) = outbox("outbox_poison").await else {
        return;
    };
    enqueue(
        &url,
        &outbox,
        ["poison", "refused", "unknown", "good-1", "good-2"].map(String::from),
    )
    .await;
    let provider = Provider::answering(|key| match key {
        "poison" => Err(SendError::retryable("provider.unavailable", "503")),
        "refused" => Err(SendError::permanent("provider.rejected", "422")),
        "unknown" => Err(SendError::unknown_delivery("provider.timeout", "timed out")),
        _ => Ok(Receipt::new(format!("id-{key}"), "fake")),
    });
    let worker = start(
        outbox
            .worker(provider.service())
            .max_attempts(3)
            .backoff(Duration::from_millis(1), Duration::from_millis(5))
            .poll_interval(Duration::from_millis(10)),
    );
    eventually(Duration::from_secs(10), || async {
        let counts = outbox.counts().await.unwrap();
        counts.done == 2 && counts.dead == 3
    })
    .await;
    let stats = worker.stop().await;
    assert_eq!((stats.sent, stats.dead_lettered, stats.retried), (2, 3, 2));
    assert_eq!(provider.calls("poison"), 3, "retried up to its attempts");
    assert_eq!(provider.calls("refused"), 1, "a refusal is not retried");
    assert_eq!(
        provider.calls("unknown"),
        1,
        "an unknown delivery is not retried: the layer would only replay it"
    );

    let dead = outbox.dead_letters(10).await.unwrap();
    let by_key: HashMap<_, _> = dead.iter().map(|d| (d.key.as_str(), d)).collect();
    assert_eq!(by_key["poison"].attempts, 3);
    assert!(
        by_key["poison"]
            .last_error
            .as_deref()
            .unwrap()
            .starts_with("provider.unavailable")
    );
    assert!(
        by_key["refused"]
            .last_error
            .as_deref()
            .unwrap()
            .starts_with("provider.rejected")
    );

    let unknown = by_key["unknown"].last_error.as_deref().unwrap();
    assert!(
        unknown.starts_with("provider.timeout (delivery unknown"),
        "{unknown}"
    );

    // Requeued by an operator, it goes again.
    assert!(outbox.requeue("refused").await.unwrap());
    assert!(!outbox.requeue("refused").await.unwrap(), "no longer dead");
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn notify_wakes_an_idle_worker_that_polls_once_an_hour() {
    let Some((url, outbox)) = outbox("outbox_notify").await else {
        return;
    };
    let provider = Provider::ok();
    let worker = start(
        outbox
            .worker(provider.service())
            .poll_interval(Duration::from_secs(3600)),
    );
    enqueue(&url, &outbox, ["first".to_owned()]).await;
    eventually(Duration::from_secs(5), || async {
        outbox.counts().await.unwrap().done == 1
    })
    .await;
    enqueue(&url, &outbox, ["second".to_owned()]).await;
    eventually(Duration::from_secs(5), || async {
        outbox.counts().await.unwrap().done == 2
    })
    .await;
    worker.stop().await;

    // Without a LISTEN connection, the same worker waits for its poll.
    let pool_only = Outbox::new(outbox_pool(&url))
        .table(outbox.table_name())
        .unwrap();
    let quiet = pool_only
        .worker(provider.service())
        .poll_interval(Duration::from_secs(3600));
    let quiet_stats = quiet.stats();
    let quiet = start(quiet);
    // Its first claim runs at start and finds nothing; once it has run, the worker is idle
    // until its hour-long poll.
    eventually(Duration::from_secs(5), || async {
        quiet_stats.get().polls >= 1
    })
    .await;
    enqueue(&url, &outbox, ["third".to_owned()]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        provider.calls("third"),
        0,
        "nothing woke the polling worker"
    );
    quiet.stop().await;
    drop_table(&url, outbox.table_name()).await;
}

fn outbox_pool(url: &str) -> deadpool_postgres::Pool {
    use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
    use tokio_postgres::NoTls;
    let manager = Manager::from_config(
        url.parse().expect("valid URL"),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager).build().expect("pool")
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_worker_killed_before_sending_leaves_its_rows_to_the_next_once_the_claim_passes() {
    let Some((url, outbox)) = outbox("outbox_kill_before").await else {
        return;
    };
    enqueue(&url, &outbox, ["k".to_owned()]).await;
    cases::a_killed_workers_row_goes_once_its_claim_passes(&outbox, "k").await;
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_worker_killed_after_the_provider_took_the_message_does_not_send_it_again() {
    let Some((url, outbox)) = outbox("outbox_kill_after").await else {
        return;
    };
    enqueue(&url, &outbox, ["k".to_owned()]).await;
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
        outbox
            .worker(dying)
            .claim_lease(Duration::from_millis(300))
            .run(std::future::pending()),
    );
    tokio::time::timeout(Duration::from_secs(5), answered.notified())
        .await
        .expect("the provider was called");
    doomed.abort();

    let next = start(
        outbox
            .worker(stack(store))
            .poll_interval(Duration::from_millis(20)),
    );
    eventually(Duration::from_secs(5), || async {
        outbox.counts().await.unwrap().done == 1
    })
    .await;
    next.stop().await;
    assert_eq!(
        provider.calls("k"),
        1,
        "the layer's store answered the repeat"
    );
    let row = admin(&url)
        .await
        .query_one(
            &format!("SELECT provider_id FROM \"{}\"", outbox.table_name()),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, String>(0),
        "id-k",
        "the row keeps the original receipt"
    );
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_worker_has_as_many_sends_in_flight_as_its_concurrency_and_no_more() {
    let Some((url, outbox)) = outbox("outbox_concurrent").await else {
        return;
    };
    enqueue(&url, &outbox, (0..30).map(|i| format!("conc-{i}"))).await;
    let provider = Provider::ok();
    let gated = Gated::new();
    let worker = start(
        outbox
            .worker(gated.service(&provider, 8))
            .concurrency(8)
            .poll_interval(Duration::from_millis(20)),
    );
    // Every send waits for a permit: eight are in flight together, or this never fires.
    tokio::time::timeout(Duration::from_secs(10), gated.reached.notified())
        .await
        .expect("eight sends in flight at once");
    gated.gate.add_permits(30);
    eventually(Duration::from_secs(10), || async {
        outbox.counts().await.unwrap().done == 30
    })
    .await;
    let stats = worker.stop().await;
    assert_eq!(
        gated.peak.load(Ordering::SeqCst),
        8,
        "never more than eight"
    );
    assert_eq!((stats.claimed, stats.sent), (30, 30));
    assert!((0..30).all(|i| provider.calls(&format!("conc-{i}")) == 1));
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_worker_told_to_stop_lets_its_sends_answer_and_puts_back_the_rows_it_did_not_start() {
    let Some((url, outbox)) = outbox("outbox_stop").await else {
        return;
    };
    let keys: Vec<String> = (0..10).map(|i| format!("stop-{i}")).collect();
    enqueue(&url, &outbox, keys.clone()).await;
    cases::a_stopped_worker_puts_back_the_rows_it_did_not_start(&outbox, &keys).await;
    let attempts = admin(&url)
        .await
        .query(
            &format!("SELECT attempts FROM \"{}\"", outbox.table_name()),
            &[],
        )
        .await
        .unwrap();
    assert!(
        attempts.iter().all(|row| row.get::<_, i32>(0) == 1),
        "a row put back unsent does not count an attempt"
    );
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn retries_retry_after_and_dead_letters_hold_with_many_sends_in_flight() {
    let Some((url, outbox)) = outbox("outbox_conc_retry").await else {
        return;
    };
    enqueue(&url, &outbox, (0..60).map(|i| format!("cr-{i}"))).await;
    // Of every four keys: one sent, one refused, one failing until out of attempts, one
    // rate limited for an hour.
    let provider = Provider::answering(|key| {
        let i: usize = key.trim_start_matches("cr-").parse().unwrap();
        match i % 4 {
            0 => Ok(Receipt::new(format!("id-{key}"), "fake")),
            1 => Err(SendError::permanent("provider.rejected", "422")),
            2 => Err(SendError::retryable("provider.unavailable", "503")),
            _ => Err(SendError::retryable("provider.rate_limited", "429")
                .with_retry_after(Duration::from_secs(3600))),
        }
    });
    let gated = Gated::new();
    let worker = start(
        outbox
            .worker(gated.service(&provider, 60))
            .concurrency(64)
            .max_attempts(3)
            .backoff(Duration::from_millis(1), Duration::from_millis(5))
            .poll_interval(Duration::from_millis(10)),
    );
    // The first answers come only once every row's first send is in flight.
    tokio::time::timeout(Duration::from_secs(10), gated.reached.notified())
        .await
        .expect("sixty sends in flight at once");
    gated.gate.add_permits(1000);
    eventually(Duration::from_secs(20), || async {
        let counts = outbox.counts().await.unwrap();
        counts.done == 15 && counts.dead == 30
    })
    .await;
    let stats = worker.stop().await;
    assert_eq!((stats.sent, stats.dead_lettered), (15, 30));
    // 15 retries before the out-of-attempts ones died, and one for each rate limited key.
    assert_eq!(stats.retried, 15 * 2 + 15);
    let rows = admin(&url)
        .await
        .query(
            &format!(
                "SELECT key, state, attempts, available_at > now() + interval '59 minutes'
                 FROM \"{}\"",
                outbox.table_name()
            ),
            &[],
        )
        .await
        .unwrap();
    for row in rows {
        let (key, state, attempts, held): (String, String, i32, bool) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let i: usize = key.trim_start_matches("cr-").parse().unwrap();
        let expected = match i % 4 {
            0 => ("done", 1, false),
            1 => ("dead", 1, false),
            2 => ("dead", 3, false),
            _ => ("waiting", 1, true),
        };
        assert_eq!((state.as_str(), attempts, held), expected, "{key}");
        assert_eq!(provider.calls(&key), attempts as usize, "{key}");
    }
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn done_rows_are_purged_after_their_retention_and_lag_reads_the_oldest_waiting_row() {
    let Some((url, outbox)) = outbox("outbox_purge").await else {
        return;
    };
    assert_eq!(outbox.lag().await.unwrap(), None, "nothing waits");
    enqueue(&url, &outbox, (0..5).map(|i| format!("purge-{i}"))).await;
    assert!(outbox.lag().await.unwrap().is_some());
    let provider = Provider::ok();
    let worker = start(
        outbox
            .worker(provider.service())
            .poll_interval(Duration::from_millis(20)),
    );
    eventually(Duration::from_secs(5), || async {
        outbox.counts().await.unwrap().done == 5
    })
    .await;
    worker.stop().await;
    enqueue(&url, &outbox, ["still-waiting".to_owned()]).await;

    // A retention not yet reached keeps every row; then done rows go, in small statements.
    assert_eq!(
        outbox
            .purge_done(Duration::from_secs(3600), 2)
            .await
            .unwrap(),
        0
    );
    assert_eq!(outbox.purge_done(Duration::ZERO, 2).await.unwrap(), 5);
    let counts = outbox.counts().await.unwrap();
    assert_eq!(
        (counts.done, counts.waiting),
        (0, 1),
        "a waiting row is never purged"
    );
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_schedule_with_sub_millisecond_digits_is_sent_once_through_the_outbox() {
    let Some((url, outbox)) = outbox("outbox_sub_ms").await else {
        return;
    };
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
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let at = std::time::UNIX_EPOCH + Duration::new(now.as_secs() + 86_400, 123_456_789);
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

    // One message through the outbox alone; one sent inline first, then enqueued as well:
    // the worker's stack answers it from the layer's record of that first send.
    let inline = scheduled("sub-ms-inline");
    let receipt = stack().oneshot(inline.clone()).await.expect("inline send");
    let mut client = admin(&url).await;
    let tx = client.transaction().await.unwrap();
    for message in [scheduled("sub-ms-outbox"), inline] {
        outbox.enqueue(&tx, &message).await.unwrap();
    }
    tx.commit().await.unwrap();

    let worker = start(
        outbox
            .worker(stack())
            .poll_interval(Duration::from_millis(20)),
    );
    eventually(Duration::from_secs(10), || async {
        let counts = outbox.counts().await.unwrap();
        counts.done + counts.dead == 2
    })
    .await;
    let stats = worker.stop().await;
    assert_eq!(
        outbox.dead_letters(10).await.unwrap(),
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
    let row = admin(&url)
        .await
        .query_one(
            &format!(
                "SELECT provider_id FROM \"{}\" WHERE key = 'sub-ms-inline'",
                outbox.table_name()
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), receipt.id);
    drop_table(&url, outbox.table_name()).await;
}
