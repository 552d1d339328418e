//! The outbox on MySQL / MariaDB against a real server: the message commits or rolls back
//! with the caller's mysql_async transaction, workers send each message once (four of them on
//! one table, a worker killed before sending, a worker told to stop), retries and
//! `Retry-After` put rows back, poison messages end dead and are requeued, done rows purge.
//! The worker polls: MySQL has no notifications.
//!
//! Runs against `MYSQL_URL`, else `mysql://root@127.0.0.1:3306/test`; reported as ignored when
//! neither answered as the suite was built (see `support::stores`).
#![cfg(feature = "mysql")]

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mysql_async::TxOpts;
use mysql_async::prelude::Queryable;

use support::outbox::{Gated, Provider, cases, eventually, message, start};
use support::stores::mysql_admin::{admin, drop_table};
use support::stores::{backend_url, unique};
use tower_idempotency::message::Attachment;
use tower_idempotency::outbox::{Enqueued, Outbox};
use tower_idempotency::store::StoreErrorKind;
use tower_idempotency::{BoxError, Message, Receipt, SendError};

/// A fresh outbox table of the test's own, migrated (see `backend_url` for the `Option`).
async fn outbox(test: &str) -> Option<(String, Outbox)> {
    let url = backend_url("MYSQL_URL")?;
    let outbox = Outbox::connect(&url)
        .await
        .expect("connect")
        .table(&unique(test))
        .expect("valid table name");
    outbox.migrate().await.expect("migrate");
    Some((url, outbox))
}

/// Enqueues `messages` in one committed transaction.
async fn enqueue_all(url: &str, outbox: &Outbox, messages: impl IntoIterator<Item = Message>) {
    let pool = admin(url);
    let mut tx = pool
        .start_transaction(TxOpts::default())
        .await
        .expect("begin");
    for message in messages {
        outbox
            .enqueue_mysql(&mut tx, &message)
            .await
            .expect("enqueue");
    }
    tx.commit().await.expect("commit");
    pool.disconnect().await.expect("disconnect");
}

async fn enqueue(url: &str, outbox: &Outbox, keys: impl IntoIterator<Item = String>) {
    enqueue_all(url, outbox, keys.into_iter().map(|k| message(&k))).await;
}

/// The rows' `(key, state, attempts, provider_id)`, read around the outbox.
async fn rows(url: &str, outbox: &Outbox) -> Vec<(String, String, i32, Option<String>)> {
    let pool = admin(url);
    let mut conn = pool.get_conn().await.expect("admin connection");
    let rows: Vec<(Vec<u8>, String, i32, Option<String>)> = conn
        .query(format!(
            "SELECT `key`, state, attempts, provider_id FROM `{}` ORDER BY id",
            outbox.table_name()
        ))
        .await
        .expect("read rows");
    drop(conn);
    pool.disconnect().await.expect("disconnect");
    rows.into_iter()
        .map(|(k, s, a, p)| (String::from_utf8(k).expect("UTF-8 key"), s, a, p))
        .collect()
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn a_message_commits_or_rolls_back_with_the_callers_mysql_transaction() {
    let Some((url, outbox)) = outbox("outbox_my_tx").await else {
        return;
    };
    let pool = admin(&url);

    let mut tx = pool.start_transaction(TxOpts::default()).await.unwrap();
    assert!(matches!(
        outbox.enqueue_mysql(&mut tx, &message("k1")).await,
        Ok(Enqueued::New(_))
    ));
    tx.rollback().await.unwrap();
    assert_eq!(
        outbox.counts().await.unwrap().waiting,
        0,
        "a rollback leaves no row"
    );

    let mut tx = pool.start_transaction(TxOpts::default()).await.unwrap();
    let Ok(Enqueued::New(id)) = outbox.enqueue_mysql(&mut tx, &message("k1")).await else {
        panic!("a new row");
    };
    assert!(id > 0);
    assert_eq!(
        outbox.enqueue_mysql(&mut tx, &message("k1")).await.unwrap(),
        Enqueued::AlreadyThere
    );
    tx.commit().await.unwrap();
    let mut tx = pool.start_transaction(TxOpts::default()).await.unwrap();
    assert_eq!(
        outbox.enqueue_mysql(&mut tx, &message("k1")).await.unwrap(),
        Enqueued::AlreadyThere,
        "a committed key, enqueued again, changes nothing"
    );
    let unkeyed = Message::builder()
        .from("a@x")
        .to("b@x")
        .text("t")
        .build()
        .unwrap();
    let error = outbox.enqueue_mysql(&mut tx, &unkeyed).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::InvalidInput);
    tx.rollback().await.unwrap();
    assert_eq!(outbox.counts().await.unwrap().waiting, 1);
    pool.disconnect().await.unwrap();
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn a_committed_message_is_sent_once_as_it_was_enqueued_and_lag_and_purge_follow() {
    let Some((url, outbox)) = outbox("outbox_my_once").await else {
        return;
    };
    // Text in several scripts and an attachment: the JSON column keeps them whole.
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
    enqueue_all(&url, &outbox, messages).await;
    assert!(
        outbox.lag().await.unwrap().is_some(),
        "rows are waiting: there is a lag"
    );

    let seen = Arc::new(Mutex::new(HashMap::<String, Message>::new()));
    let record = Arc::clone(&seen);
    let provider = Provider::ok();
    let inner = provider.service();
    let stack = tower::service_fn(move |m: Message| {
        let key = m.idempotency_key().unwrap().as_str().to_owned();
        record.lock().unwrap().insert(key, m.clone());
        let mut inner = inner.clone();
        async move { tower::Service::call(&mut inner, m).await }
    });
    let worker = start(
        outbox
            .worker(stack)
            .poll_interval(Duration::from_millis(20)),
    );
    eventually(Duration::from_secs(10), || async {
        outbox.counts().await.unwrap().done == 5
    })
    .await;
    let stats = worker.stop().await;
    assert_eq!((stats.claimed, stats.sent), (5, 5));
    assert_eq!(seen.lock().unwrap()["unicode"], original);
    for (key, state, attempts, provider_id) in rows(&url, &outbox).await {
        assert_eq!((state.as_str(), attempts), ("done", 1), "{key}");
        assert_eq!(provider_id, Some(format!("id-{key}")), "the receipt's id");
        assert_eq!(provider.calls(&key), 1, "{key}");
    }
    assert_eq!(outbox.lag().await.unwrap(), None, "nothing waits");

    // A second worker polls busily for a bounded time and finds nothing to send.
    let stats = outbox
        .worker(provider.service())
        .poll_interval(Duration::from_millis(5))
        .run(tokio::time::sleep(Duration::from_millis(300)))
        .await
        .unwrap();
    assert_eq!(stats.claimed, 0);
    assert!(stats.polls > 1, "it polled");

    assert_eq!(
        outbox
            .purge_done(Duration::from_secs(3600), 2)
            .await
            .unwrap(),
        0,
        "sent just now: kept"
    );
    assert_eq!(outbox.purge_done(Duration::ZERO, 2).await.unwrap(), 5);
    assert_eq!(outbox.counts().await.unwrap().done, 0);
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn four_workers_on_one_mysql_table_send_a_thousand_messages_exactly_once() {
    let Some((url, outbox)) = outbox("outbox_my_four").await else {
        return;
    };
    let keys: Vec<String> = (0..1000).map(|i| format!("four-{i}")).collect();
    enqueue(&url, &outbox, keys.clone()).await;
    cases::four_workers_send_each_message_once(&outbox, &keys).await;
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn retries_retry_after_and_dead_letters_on_mysql_then_a_requeue_sends_again() {
    let Some((url, outbox)) = outbox("outbox_my_retry").await else {
        return;
    };
    enqueue(
        &url,
        &outbox,
        ["flaky", "poison", "refused", "limited", "good"].map(String::from),
    )
    .await;
    let provider = Provider::answering(|key| match key {
        "poison" => Err(SendError::retryable("provider.unavailable", "503")),
        "refused" => Err(SendError::permanent("provider.rejected", "422")),
        "limited" => Err(SendError::retryable("provider.rate_limited", "429")
            .with_retry_after(Duration::from_secs(3600))),
        _ => Ok(Receipt::new(format!("id-{key}"), "fake")),
    });
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
        let mut inner = inner.clone();
        async move {
            if first {
                return Err(BoxError::from(SendError::retryable(
                    "provider.unavailable",
                    "503",
                )));
            }
            tower::Service::call(&mut inner, m).await
        }
    });
    let worker = start(
        outbox
            .worker(stack)
            .max_attempts(3)
            .backoff(Duration::from_millis(1), Duration::from_millis(5))
            .poll_interval(Duration::from_millis(10)),
    );
    eventually(Duration::from_secs(10), || async {
        let counts = outbox.counts().await.unwrap();
        counts.done == 2 && counts.dead == 2
    })
    .await;
    let stats = worker.stop().await;
    // flaky once, poison twice before it died, limited once.
    assert_eq!((stats.sent, stats.dead_lettered, stats.retried), (2, 2, 4));
    assert_eq!(*flaky_calls.lock().unwrap(), 2, "failed, then sent");
    assert_eq!(provider.calls("poison"), 3, "retried up to its attempts");
    assert_eq!(provider.calls("refused"), 1, "a refusal is not retried");
    assert_eq!(provider.calls("limited"), 1, "held for its Retry-After");

    let pool = admin(&url);
    let mut conn = pool.get_conn().await.unwrap();
    let held: Option<(String, i32, bool)> = conn
        .query_first(format!(
            "SELECT state, attempts, available_at > UTC_TIMESTAMP(6) + INTERVAL 59 MINUTE
             FROM `{}` WHERE `key` = 'limited'",
            outbox.table_name()
        ))
        .await
        .unwrap();
    assert_eq!(held, Some(("waiting".to_owned(), 1, true)));
    drop(conn);
    pool.disconnect().await.unwrap();

    let dead = outbox.dead_letters(10).await.unwrap();
    let by_key: HashMap<_, _> = dead.iter().map(|d| (d.key.as_str(), d)).collect();
    assert_eq!(by_key.len(), 2);
    assert_eq!(by_key["poison"].attempts, 3);
    let why = by_key["poison"].last_error.as_deref().unwrap();
    assert!(
        why.starts_with("provider.unavailable (out of attempts)"),
        "{why}"
    );
    assert!(
        by_key["refused"]
            .last_error
            .as_deref()
            .unwrap()
            .starts_with("provider.rejected")
    );

    // Requeued by an operator once its cause is fixed, it goes again.
    assert!(outbox.requeue("refused").await.unwrap());
    assert!(!outbox.requeue("refused").await.unwrap(), "no longer dead");
    assert!(
        !outbox.requeue("good").await.unwrap(),
        "a done row is not requeued"
    );
    let fixed = Provider::ok();
    let worker = start(
        outbox
            .worker(fixed.service())
            .poll_interval(Duration::from_millis(10)),
    );
    eventually(Duration::from_secs(10), || async {
        outbox.counts().await.unwrap().done == 3
    })
    .await;
    worker.stop().await;
    assert_eq!(fixed.calls("refused"), 1);
    assert_eq!(fixed.total(), 1, "only the requeued row went");
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn a_mysql_worker_told_to_stop_lets_its_sends_answer_and_puts_back_the_rows_it_did_not_start()
{
    let Some((url, outbox)) = outbox("outbox_my_stop").await else {
        return;
    };
    let keys: Vec<String> = (0..10).map(|i| format!("stop-{i}")).collect();
    enqueue(&url, &outbox, keys.clone()).await;
    cases::a_stopped_worker_puts_back_the_rows_it_did_not_start(&outbox, &keys).await;
    for (key, _, attempts, _) in rows(&url, &outbox).await {
        assert_eq!(
            attempts, 1,
            "{key}: a row put back unsent does not count an attempt"
        );
    }
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn a_mysql_worker_killed_before_sending_leaves_its_rows_to_the_next_once_the_claim_passes() {
    let Some((url, outbox)) = outbox("outbox_my_kill").await else {
        return;
    };
    enqueue(&url, &outbox, ["k".to_owned()]).await;
    cases::a_killed_workers_row_goes_once_its_claim_passes(&outbox, "k").await;
    assert_eq!(
        rows(&url, &outbox).await[0].2,
        2,
        "the killed attempt counts"
    );
    drop_table(&url, outbox.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn a_mysql_outbox_refuses_bad_table_names_other_schemes_and_a_missing_table() {
    let Some(url) = backend_url("MYSQL_URL") else {
        return;
    };
    let outbox = Outbox::connect(&url).await.expect("connect");
    let error = outbox.clone().table("Out-box").unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured);
    let error = Outbox::connect("redis://127.0.0.1:6379").await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured);
    assert!(error.to_string().contains("mysql://"), "{error}");

    let table = unique("outbox_my_missing");
    let missing = outbox.table(&table).unwrap();
    let error = missing.counts().await.unwrap_err();
    assert!(error.to_string().contains("Outbox::migrate"), "{error}");
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn the_late_answer_of_a_claim_that_passed_is_not_recorded_over_the_next_claims() {
    let Some((url, outbox)) = outbox("outbox_my_fence").await else {
        return;
    };
    enqueue(&url, &outbox, ["k".to_owned()]).await;
    let slow = Provider::answering(|_| Ok(Receipt::new("late", "fake")));
    let gated = Gated::new();
    let first = outbox
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
    let second = start(
        outbox
            .worker(gated_second.service(&provider, 1))
            .poll_interval(Duration::from_millis(20)),
    );
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
        outbox.counts().await.unwrap().waiting,
        1,
        "still the second's"
    );

    gated_second.gate.add_permits(1);
    eventually(Duration::from_secs(5), || async {
        outbox.counts().await.unwrap().done == 1
    })
    .await;
    assert_eq!(second.stop().await.sent, 1);
    let rows = rows(&url, &outbox).await;
    assert_eq!(
        rows[0],
        (
            "k".to_owned(),
            "done".to_owned(),
            2,
            Some("id-k".to_owned())
        ),
        "the row keeps the second claim's answer"
    );
    drop_table(&url, outbox.table_name()).await;
}
