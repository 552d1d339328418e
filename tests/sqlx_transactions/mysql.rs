//! Claims in a sqlx transaction on MySQL (MariaDB here): a rollback leaves nothing; a
//! commit, then a crash before the send, is sent once by the next run; another message under
//! a claimed key is `key_reused`. sqlx's connections count matched rows
//! (`CLIENT_FOUND_ROWS`), so these also check that the answer stays exact with them.
//!
//! Runs against `MYSQL_URL` or the default local server; reported as ignored when none
//! answered as the suite was built (see `support::stores`).

use std::time::Duration;

use sqlx::mysql::MySqlPoolOptions;
use sqlx::{Connection as _, MySqlConnection, MySqlPool};
use tower::{Layer, ServiceExt};

use crate::support::Provider;
use crate::support::claims::{alert, layer, the_send_takes_the_claim_once};
use crate::support::outbox::{eventually, start};
use crate::support::stores::mysql_admin::drop_table;
use crate::support::stores::{backend_url, unique};
use tower_idempotency::outbox::{Enqueued, Outbox};
use tower_idempotency::store::{StoreErrorKind, WaitingClaim};
use tower_idempotency::{Message, MySqlStore};

/// A store on a fresh table of the test's own (see `backend_url` for the `Option`).
async fn setup(test: &str) -> Option<(String, MySqlStore)> {
    let url = backend_url("MYSQL_URL")?;
    let store = MySqlStore::connect(&url)
        .await
        .expect("connect")
        .table(&unique(test))
        .expect("valid table name");
    store.migrate().await.expect("migrate");
    Some((url, store))
}

/// The application's own sqlx pool, with a table of business rows of the test's own.
async fn app_pool(url: &str, orders: &str) -> MySqlPool {
    let pool = MySqlPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .expect("sqlx connects");
    sqlx::query(&format!(
        "CREATE TABLE `{orders}` (id VARCHAR(16) PRIMARY KEY, state TEXT NOT NULL) ENGINE = InnoDB"
    ))
    .execute(&pool)
    .await
    .expect("orders table");
    pool
}

async fn orders_in(pool: &MySqlPool, orders: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM `{orders}`"))
        .fetch_one(pool)
        .await
        .expect("count")
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn a_sqlx_mysql_rollback_leaves_no_claim_and_no_order() {
    let Some((url, store)) = setup("idem_sqlx_my_rollback").await else {
        return;
    };
    let orders = unique("idem_sqlx_my_rollback_orders");
    let pool = app_pool(&url, &orders).await;
    let layer = layer(store.clone());

    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!("INSERT INTO `{orders}` VALUES ('ord_1', 'paid')"))
        .execute(&mut *tx)
        .await
        .unwrap();
    let claim = layer.claim(&alert("sold")).unwrap().expect("keyed");
    assert!(store.claim_in_sqlx(&mut tx, &claim).await.unwrap());
    tx.rollback().await.unwrap();

    assert_eq!(orders_in(&pool, &orders).await, 0);
    assert!(store.claims(10).await.unwrap().is_empty(), "no claim");
    // The key is free: a send goes.
    let provider = Provider::ok();
    layer
        .layer(provider.clone())
        .oneshot(alert("sold"))
        .await
        .unwrap();
    assert_eq!(provider.calls(), 1);

    pool.close().await;
    drop_table(&url, &orders).await;
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn a_sqlx_mysql_commit_then_a_crash_before_the_send_is_sent_once_by_the_next_run() {
    let Some((url, store)) = setup("idem_sqlx_my_crash").await else {
        return;
    };
    let table = store.table_name().to_owned();
    let orders = unique("idem_sqlx_my_crash_orders");
    {
        // The first run: a bare sqlx connection, its transaction begun by hand, in a task of
        // its own (a claim's future can be spawned, as a user's handler is).
        let pool = app_pool(&url, &orders).await;
        let claim = layer(store.clone()).claim(&alert("sold")).unwrap().unwrap();
        let first_run = tokio::spawn({
            let (store, url, orders) = (store.clone(), url.clone(), orders.clone());
            async move {
                let mut connection = MySqlConnection::connect(&url).await.unwrap();
                let mut tx = connection.begin().await.unwrap();
                sqlx::query(&format!("INSERT INTO `{orders}` VALUES ('ord_1', 'paid')"))
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                let claimed = store.claim_in_sqlx(&mut tx, &claim).await.unwrap();
                tx.commit().await.unwrap();
                // The process dies here, before the send: its connection goes.
                claimed
            }
        });
        assert!(first_run.await.unwrap());
        // Its store, layer and pool go too.
        drop((store, pool));
    }

    // The next run finds the claim …
    let store = MySqlStore::connect(&url)
        .await
        .unwrap()
        .table(&table)
        .unwrap();
    let layer = layer(store.clone());
    let claim = layer.claim(&alert("sold")).unwrap().unwrap();
    assert_eq!(
        store.claims(10).await.unwrap(),
        [WaitingClaim::new(claim.key.clone(), claim.fingerprint)]
    );

    // … and sends the same message under the same key: once.
    the_send_takes_the_claim_once(&layer).await;
    assert!(
        store.claims(10).await.unwrap().is_empty(),
        "the send took it"
    );

    // A claim of a key already sent writes nothing.
    let pool = MySqlPool::connect(&url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(!store.claim_in_sqlx(&mut tx, &claim).await.unwrap());
    tx.commit().await.unwrap();

    pool.close().await;
    drop_table(&url, &orders).await;
    drop_table(&url, &table).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn another_message_under_a_key_claimed_through_sqlx_on_mysql_is_key_reused_and_not_sent() {
    let Some((url, store)) = setup("idem_sqlx_my_reused").await else {
        return;
    };
    let layer = layer(store.clone());
    let pool = MySqlPool::connect(&url).await.unwrap();
    let claim = layer.claim(&alert("sold")).unwrap().unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(store.claim_in_sqlx(&mut tx, &claim).await.unwrap());
    tx.commit().await.unwrap();

    // A live claim holds the key: another claim through sqlx writes nothing, though sqlx's
    // connection counts the row it matched.
    let other = layer.claim(&alert("a different text")).unwrap().unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(!store.claim_in_sqlx(&mut tx, &other).await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(
        store.claims(10).await.unwrap(),
        [WaitingClaim::new(claim.key.clone(), claim.fingerprint)],
        "the first claim still waits"
    );

    the_send_takes_the_claim_once(&layer).await;
    pool.close().await;
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn a_sqlx_mysql_claim_on_a_table_never_migrated_says_to_migrate() {
    let Some(url) = backend_url("MYSQL_URL") else {
        return;
    };
    let store = MySqlStore::connect(&url)
        .await
        .unwrap()
        .table(&unique("idem_sqlx_my_never_migrated"))
        .unwrap();
    let claim = layer(store.clone()).claim(&alert("sold")).unwrap().unwrap();
    let pool = MySqlPool::connect(&url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let error = store.claim_in_sqlx(&mut tx, &claim).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Unavailable);
    assert!(error.to_string().contains("migrate"), "{error}");
    tx.rollback().await.unwrap();
    pool.close().await;
}

/// An outbox on a fresh MySQL table of the test's own.
async fn outbox_on(url: &str, test: &str) -> Outbox {
    let outbox = Outbox::connect(url)
        .await
        .expect("connect")
        .table(&unique(test))
        .expect("valid table name");
    outbox.migrate().await.expect("migrate");
    outbox
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn a_sqlx_mysql_rollback_leaves_no_claim_no_outbox_row_and_no_order() {
    let Some((url, store)) = setup("idem_sqlx_my_ob_rollback").await else {
        return;
    };
    let outbox = outbox_on(&url, "idem_sqlx_my_ob_rollback_outbox").await;
    let orders = unique("idem_sqlx_my_ob_rollback_orders");
    let pool = app_pool(&url, &orders).await;
    let layer = layer(store.clone());
    let message = alert("sold");

    // The claim, the alert and the order in one transaction: all go with its rollback.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!("INSERT INTO `{orders}` VALUES ('ord_1', 'paid')"))
        .execute(&mut *tx)
        .await
        .unwrap();
    let claim = layer.claim(&message).unwrap().expect("keyed");
    assert!(store.claim_in_sqlx(&mut tx, &claim).await.unwrap());
    assert!(matches!(
        outbox.enqueue_sqlx_mysql(&mut tx, &message).await,
        Ok(Enqueued::New(_))
    ));
    tx.rollback().await.unwrap();

    assert_eq!(orders_in(&pool, &orders).await, 0);
    assert!(store.claims(10).await.unwrap().is_empty(), "no claim");
    assert_eq!(outbox.counts().await.unwrap().waiting, 0, "no outbox row");

    pool.close().await;
    drop_table(&url, &orders).await;
    drop_table(&url, outbox.table_name()).await;
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn an_outbox_message_enqueued_through_sqlx_on_mysql_is_sent_once_by_the_worker() {
    let Some((url, store)) = setup("idem_sqlx_my_ob_once").await else {
        return;
    };
    let outbox = outbox_on(&url, "idem_sqlx_my_ob_once_outbox").await;
    let orders = unique("idem_sqlx_my_ob_once_orders");
    let pool = app_pool(&url, &orders).await;
    let message = alert("sold");

    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!("INSERT INTO `{orders}` VALUES ('ord_1', 'paid')"))
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(matches!(
        outbox.enqueue_sqlx_mysql(&mut tx, &message).await,
        Ok(Enqueued::New(_))
    ));
    // sqlx's connection counts found rows: the second enqueue of the key must still say it
    // wrote nothing.
    assert_eq!(
        outbox.enqueue_sqlx_mysql(&mut tx, &message).await.unwrap(),
        Enqueued::AlreadyThere
    );
    tx.commit().await.unwrap();
    assert_eq!(outbox.counts().await.unwrap().waiting, 1);

    let provider = Provider::ok();
    let worker = outbox
        .worker(layer(store.clone()).layer(provider.clone()))
        .poll_interval(Duration::from_millis(20));
    let running = start(worker);
    eventually(Duration::from_secs(10), || async {
        outbox.counts().await.unwrap().done == 1
    })
    .await;
    let stats = running.stop().await;
    assert_eq!((stats.claimed, stats.sent), (1, 1));
    assert_eq!(provider.calls(), 1);

    // An unkeyed message is refused before any statement.
    let unkeyed = Message::builder()
        .from("a@x.example")
        .to("b@x.example")
        .text("no key")
        .build()
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let error = outbox
        .enqueue_sqlx_mysql(&mut tx, &unkeyed)
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::InvalidInput);
    tx.rollback().await.unwrap();

    pool.close().await;
    drop_table(&url, &orders).await;
    drop_table(&url, outbox.table_name()).await;
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn a_postgres_outbox_refuses_a_sqlx_mysql_enqueue() {
    let Some(url) = backend_url("MYSQL_URL") else {
        return;
    };
    let Some(pg_url) = backend_url("DATABASE_URL") else {
        return;
    };
    let outbox = Outbox::connect(&pg_url).await.expect("connect");
    let pool = MySqlPool::connect(&url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let error = outbox
        .enqueue_sqlx_mysql(&mut tx, &alert("sold"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured);
    tx.rollback().await.unwrap();
    pool.close().await;
}
