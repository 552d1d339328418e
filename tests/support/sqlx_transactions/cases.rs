//! Claims and outbox messages in the caller's sqlx transaction, the same on every database:
//! a rollback leaves nothing; a commit, then a crash before the send, is sent once by the
//! next run; another message under a claimed key is `key_reused`; a table never migrated
//! says so; the outbox's worker sends a message enqueued through sqlx once. Each case gets a
//! [`Shop`] of its own.

use std::time::Duration;

use sqlx::Connection as _;
use tower::{Layer, ServiceExt};

use super::{Connection, Database, Shop};
use crate::support::Provider;
use crate::support::claims::{alert, layer, the_send_takes_the_claim_once};
use crate::support::outbox::start;
use crate::support::poll_until;
use crate::support::stores::unique;
use tower_idempotency::Message;
use tower_idempotency::outbox::Enqueued;
use tower_idempotency::store::{StoreErrorKind, WaitingClaim};

pub async fn a_sqlx_rollback_leaves_no_claim_no_outbox_row_and_no_order_and_frees_the_key<
    D: Database,
>(
    shop: &Shop<D>,
) {
    let layer = layer(shop.store.clone());
    let message = alert("sold");

    // The claim, the alert and the order in one transaction: all go with its rollback.
    let mut tx = shop.begin().await;
    shop.order(&mut tx).await;
    let claim = layer.claim(&message).unwrap().expect("keyed");
    assert!(
        D::claim_in_sqlx(&shop.store, &mut tx, &claim)
            .await
            .unwrap()
    );
    assert!(matches!(
        D::enqueue_sqlx(&shop.outbox, &mut tx, &message).await,
        Ok(Enqueued::New(_))
    ));
    tx.rollback().await.unwrap();

    assert_eq!(shop.orders_in().await, 0);
    assert!(shop.claims().await.is_empty(), "no claim");
    assert_eq!(
        shop.outbox.counts().await.unwrap().waiting,
        0,
        "no outbox row"
    );
    // The key is free: a send goes.
    let provider = Provider::ok();
    layer
        .layer(provider.clone())
        .oneshot(message)
        .await
        .unwrap();
    assert_eq!(provider.calls(), 1);
}

pub async fn a_sqlx_commit_then_a_crash_before_the_send_is_sent_once_by_the_next_run<
    D: Database,
>(
    shop: &Shop<D>,
) {
    let table = D::table_name(&shop.store).to_owned();
    {
        // The first run: a store of its own and a bare sqlx connection, its transaction begun
        // by hand, in a task of its own (a claim's future can be spawned, as a user's handler
        // is).
        let store = D::store(&shop.url, &table).await;
        let claim = layer(store.clone()).claim(&alert("sold")).unwrap().unwrap();
        let first_run = tokio::spawn({
            let (store, url, order) = (store.clone(), shop.url.clone(), shop.order_sql());
            async move {
                let mut connection = Connection::<D>::connect(&url).await.unwrap();
                let mut tx = connection.begin().await.unwrap();
                D::execute(&mut tx, &order).await;
                let claimed = D::claim_in_sqlx(&store, &mut tx, &claim).await.unwrap();
                tx.commit().await.unwrap();
                // The process dies here, before the send: its connection goes.
                claimed
            }
        });
        assert!(first_run.await.unwrap());
        // Its store and layer go too.
        drop(store);
    }
    assert_eq!(shop.orders_in().await, 1, "the order committed");

    // The next run finds the claim …
    let store = D::store(&shop.url, &table).await;
    let layer = layer(store.clone());
    let claim = layer.claim(&alert("sold")).unwrap().unwrap();
    assert_eq!(
        D::claims(&store).await,
        [WaitingClaim::new(claim.key.clone(), claim.fingerprint)]
    );

    // … and sends the same message under the same key: once.
    the_send_takes_the_claim_once(&layer).await;
    assert!(D::claims(&store).await.is_empty(), "the send took it");

    // A claim of a key already sent writes nothing.
    let mut tx = shop.begin().await;
    assert!(!D::claim_in_sqlx(&store, &mut tx, &claim).await.unwrap());
    tx.commit().await.unwrap();
}

pub async fn another_message_under_a_key_claimed_through_sqlx_is_key_reused_and_not_sent<
    D: Database,
>(
    shop: &Shop<D>,
) {
    let layer = layer(shop.store.clone());
    let claim = layer.claim(&alert("sold")).unwrap().unwrap();
    let mut tx = shop.begin().await;
    assert!(
        D::claim_in_sqlx(&shop.store, &mut tx, &claim)
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();

    // A live claim holds the key: another claim through sqlx writes nothing, though MySQL's
    // sqlx connection counts the row it matched.
    let other = layer.claim(&alert("a different text")).unwrap().unwrap();
    let mut tx = shop.begin().await;
    assert!(
        !D::claim_in_sqlx(&shop.store, &mut tx, &other)
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();

    // Nor is another message sent under it.
    let provider = Provider::ok();
    let error = layer
        .layer(provider.clone())
        .oneshot(alert("a different text"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), "idempotency.key_reused");
    assert_eq!(provider.calls(), 0);
    assert_eq!(
        shop.claims().await,
        [WaitingClaim::new(claim.key.clone(), claim.fingerprint)],
        "the first claim still waits"
    );

    the_send_takes_the_claim_once(&layer).await;
}

pub async fn a_sqlx_claim_on_a_table_never_migrated_fails_and_says_to_migrate<D: Database>(
    shop: &Shop<D>,
) {
    let store = D::store(&shop.url, &unique("sqlx_never_migrated")).await;
    let claim = layer(store.clone()).claim(&alert("sold")).unwrap().unwrap();
    let mut tx = shop.begin().await;
    let error = D::claim_in_sqlx(&store, &mut tx, &claim).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Unavailable);
    assert!(error.to_string().contains("migrate"), "{error}");
    tx.rollback().await.unwrap();
}

pub async fn an_outbox_message_enqueued_through_sqlx_is_sent_once_by_the_worker<D: Database>(
    shop: &Shop<D>,
) {
    let message = alert("sold");
    let mut tx = shop.begin().await;
    shop.order(&mut tx).await;
    assert!(matches!(
        D::enqueue_sqlx(&shop.outbox, &mut tx, &message).await,
        Ok(Enqueued::New(_))
    ));
    // MySQL's sqlx connection counts found rows: the second enqueue of the key must still
    // say it wrote nothing.
    assert_eq!(
        D::enqueue_sqlx(&shop.outbox, &mut tx, &message)
            .await
            .unwrap(),
        Enqueued::AlreadyThere
    );
    tx.commit().await.unwrap();
    assert_eq!(shop.outbox.counts().await.unwrap().waiting, 1);

    let provider = Provider::ok();
    let worker = shop
        .outbox
        .worker(layer(shop.store.clone()).layer(provider.clone()))
        .poll_interval(Duration::from_millis(20));
    let running = start(worker);
    poll_until(
        "the worker sends the row",
        Duration::from_secs(10),
        || async { shop.outbox.counts().await.unwrap().done == 1 },
    )
    .await;
    let stats = running.stop().await;
    assert_eq!((stats.claimed, stats.sent), (1, 1));
    assert_eq!(provider.calls(), 1);

    // The sqlx row is the row the outbox's own driver writes: its enqueue of the key finds it.
    assert_eq!(
        D::enqueue_natively(&shop.url, &shop.outbox, &message)
            .await
            .unwrap(),
        Enqueued::AlreadyThere
    );

    // An unkeyed message is refused before any statement.
    let unkeyed = Message::builder()
        .from("a@x.example")
        .to("b@x.example")
        .text("no key")
        .build()
        .unwrap();
    let mut tx = shop.begin().await;
    let error = D::enqueue_sqlx(&shop.outbox, &mut tx, &unkeyed)
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::InvalidInput);
    tx.rollback().await.unwrap();
}
