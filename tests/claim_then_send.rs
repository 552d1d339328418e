//! Claim-then-send on a real PostgreSQL server: the key is claimed in the caller's own
//! transaction, commits or rolls back with the business rows, and the layer's send takes the
//! claim: once, also after a crash between the commit and the send, and under concurrency.
//!
//! Runs against `DATABASE_URL` or the default local server; reported as ignored when none
//! answered as the suite was built (see `support::stores`).
#![cfg(feature = "postgres")]

mod support;

use futures_util::future::join_all;
use tower::{Layer, ServiceExt};

use support::Provider;
use support::claims::alert;
use support::stores::postgres_admin::{admin, drop_table};
use support::stores::{backend_url, unique};
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::store::postgres::PostgresStore;

/// A store on a fresh table of the test's own and a layer over it (see `backend_url` for the `Option`).
async fn setup(test: &str) -> Option<(String, PostgresStore, IdempotencyLayer)> {
    let url = backend_url("DATABASE_URL")?;
    let store = PostgresStore::connect(&url)
        .await
        .expect("connect")
        .table(&unique(test))
        .expect("valid table name");
    store.migrate().await.expect("migrate");
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("alerts")
        .build()
        .expect("valid layer");
    Some((url, store, layer))
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_claim_rolls_back_with_the_callers_transaction() {
    let Some((url, store, layer)) = setup("claim_rollback").await else {
        return;
    };
    let claim = layer.claim(&alert("sold")).unwrap().expect("keyed");
    assert_eq!(claim.key, "alerts:order.created:ord_1:email");
    let mut client = admin(&url).await;
    let tx = client.transaction().await.unwrap();
    assert!(store.claim_in(&tx, &claim).await.unwrap());
    tx.rollback().await.unwrap();
    assert!(store.claims(10).await.unwrap().is_empty());

    let provider = Provider::ok();
    let service = layer.layer(provider.clone());
    service.oneshot(alert("sold")).await.unwrap();
    assert_eq!(provider.calls(), 1);
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_claim_left_by_a_crash_before_the_send_is_found_and_sent_once() {
    let Some((url, store, layer)) = setup("claim_crash").await else {
        return;
    };
    let message = alert("sold");
    let mut client = admin(&url).await;
    let tx = client.transaction().await.unwrap();
    let claim = layer.claim(&message).unwrap().unwrap();
    assert!(store.claim_in(&tx, &claim).await.unwrap());
    tx.commit().await.unwrap();
    // The process dies here, before the send. The next run finds the claim …
    let waiting = store.claims(10).await.unwrap();
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_eq!(waiting[0].key, claim.key);
    assert!(waiting[0].is_claim_of(&claim));

    // … and sends the same message under the same key: once.
    let provider = Provider::ok();
    let service = layer.layer(provider.clone());
    let first = service.clone().oneshot(message.clone()).await.unwrap();
    assert!(!first.replayed);
    assert_eq!(provider.calls(), 1);
    assert!(
        store.claims(10).await.unwrap().is_empty(),
        "the send took the claim"
    );
    let again = service.oneshot(message).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.id, first.id);
    assert_eq!(provider.calls(), 1);

    // A claim of a key already sent writes nothing.
    let tx = client.transaction().await.unwrap();
    assert!(!store.claim_in(&tx, &claim).await.unwrap());
    tx.commit().await.unwrap();
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn another_message_under_a_claimed_key_is_key_reused_and_not_sent() {
    let Some((url, store, layer)) = setup("claim_reused").await else {
        return;
    };
    let mut client = admin(&url).await;
    let tx = client.transaction().await.unwrap();
    let claim = layer.claim(&alert("sold")).unwrap().unwrap();
    store.claim_in(&tx, &claim).await.unwrap();
    tx.commit().await.unwrap();

    let provider = Provider::ok();
    let error = layer
        .layer(provider.clone())
        .oneshot(alert("a different text"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), "idempotency.key_reused");
    assert_eq!(provider.calls(), 0);
    let waiting = store.claims(10).await.unwrap();
    assert_eq!(waiting.len(), 1, "the claim still waits: {waiting:?}");
    assert!(waiting[0].is_claim_of(&claim));
    let other = layer
        .claim(&alert("a different text"))
        .unwrap()
        .expect("keyed");
    assert_eq!(other.key, claim.key);
    assert!(
        !waiting[0].is_claim_of(&other),
        "a different message under the key is not the one claimed"
    );
    drop_table(&url, store.table_name()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn forty_concurrent_sends_of_a_claimed_message_through_two_layers_send_once() {
    let Some((url, store, layer)) = setup("claim_race").await else {
        return;
    };
    let other = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("alerts")
        .build()
        .unwrap();
    let mut client = admin(&url).await;
    let tx = client.transaction().await.unwrap();
    store
        .claim_in(&tx, &layer.claim(&alert("sold")).unwrap().unwrap())
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let provider = Provider::ok();
    let sends = (0..40).map(|i| {
        let layer = if i % 2 == 0 { &layer } else { &other };
        layer.layer(provider.clone()).oneshot(alert("sold"))
    });
    let answers = join_all(sends).await;
    assert_eq!(provider.calls(), 1);
    let sent = answers
        .iter()
        .filter(|a| a.as_ref().is_ok_and(|r| !r.replayed))
        .count();
    assert_eq!(sent, 1);
    assert!(
        answers.iter().all(|a| match a {
            Ok(_) => true,
            Err(e) => e.code() == "idempotency.in_flight",
        }),
        "every other answer is a replay or in flight"
    );
    drop_table(&url, store.table_name()).await;
}
