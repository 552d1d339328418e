//! Claims and outbox messages written in a transaction of the caller's own driver: sqlx on a
//! real PostgreSQL server, and the claim as a statement with its parameters: run by diesel's
//! `sql_query` on SQLite, and on PostgreSQL with the typed binds diesel sends (diesel's
//! PostgreSQL backend needs libpq, which the tests do without). A rollback leaves
//! nothing; a commit, then a crash before the send, is sent once by the next run; another
//! message under a claimed key is `key_reused`; the outbox's worker sends a message enqueued
//! through sqlx once.
//!
//! The same claims through sqlx on MySQL are in `sqlx_transactions/mysql.rs`.
//!
//! The PostgreSQL tests run against `DATABASE_URL` or the default local server; reported as
//! ignored when none answered as the suite was built (see `support::stores`).
#![cfg(all(feature = "sqlx", feature = "sqlite"))]

#[cfg(feature = "mysql")]
#[path = "sqlx_transactions/mysql.rs"]
mod mysql;
mod support;

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Binary, Text};
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel::{Connection as _, RunQueryDsl};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection as _, PgConnection, PgPool};
use tokio::sync::oneshot;
use tokio_postgres::types::{ToSql, Type};
use tower::{Layer, ServiceExt};

use support::Provider;
use support::claims::{alert, layer};
use support::outbox::eventually;
use support::stores::postgres_admin::{admin, drop_table};
use support::stores::{SqliteDir, backend_url, unique};
use tower_idempotency::outbox::{Enqueued, Outbox};
use tower_idempotency::store::{ClaimParam, ClaimStatement, StoreErrorKind, WaitingClaim};
use tower_idempotency::{Message, PostgresStore, SqliteStore};

/// A store on a fresh table of the test's own (see `backend_url` for the `Option`).
async fn setup(test: &str) -> Option<(String, PostgresStore)> {
    let url = backend_url("DATABASE_URL")?;
    let store = PostgresStore::connect(&url)
        .await
        .expect("connect")
        .table(&unique(test))
        .expect("valid table name");
    store.migrate().await.expect("migrate");
    Some((url, store))
}

/// The application's own sqlx pool, with a table of business rows of the test's own.
async fn app_pool(url: &str, orders: &str) -> PgPool {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .expect("sqlx connects");
    sqlx::query(&format!(
        "CREATE TABLE \"{orders}\" (id text PRIMARY KEY, state text NOT NULL)"
    ))
    .execute(&pool)
    .await
    .expect("orders table");
    pool
}

async fn orders_in(pool: &PgPool, orders: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM \"{orders}\""))
        .fetch_one(pool)
        .await
        .expect("count")
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_sqlx_rollback_leaves_no_claim_no_outbox_row_and_no_order() {
    let Some((url, store)) = setup("sqlx_rollback").await else {
        return;
    };
    let outbox = Outbox::connect(&url)
        .await
        .unwrap()
        .table(&unique("sqlx_rollback_outbox"))
        .unwrap();
    outbox.migrate().await.unwrap();
    let orders = unique("sqlx_rollback_orders");
    let pool = app_pool(&url, &orders).await;
    let layer = layer(store.clone());
    let message = alert("sold");

    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO \"{orders}\" VALUES ('ord_1', 'paid')"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    let claim = layer.claim(&message).unwrap().expect("keyed");
    assert!(store.claim_in_sqlx(&mut *tx, &claim).await.unwrap());
    assert!(matches!(
        outbox.enqueue_sqlx(&mut *tx, &message).await,
        Ok(Enqueued::New(_))
    ));
    tx.rollback().await.unwrap();

    assert_eq!(orders_in(&pool, &orders).await, 0);
    assert!(store.claims(10).await.unwrap().is_empty(), "no claim");
    assert_eq!(outbox.counts().await.unwrap().waiting, 0, "no outbox row");
    // The key is free: a send goes.
    let provider = Provider::ok();
    layer
        .layer(provider.clone())
        .oneshot(message)
        .await
        .unwrap();
    assert_eq!(provider.calls(), 1);

    drop_table(&url, &orders).await;
    drop_table(&url, outbox.table_name()).await;
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_sqlx_commit_then_a_crash_before_the_send_is_sent_once_by_the_next_run() {
    let Some((url, store)) = setup("sqlx_crash").await else {
        return;
    };
    let table = store.table_name().to_owned();
    let orders = unique("sqlx_crash_orders");
    let message = alert("sold");
    {
        // The first run: a bare sqlx connection, its transaction begun by hand.
        let pool = app_pool(&url, &orders).await;
        let mut connection = PgConnection::connect(&url).await.unwrap();
        let mut tx = connection.begin().await.unwrap();
        sqlx::query(&format!(
            "INSERT INTO \"{orders}\" VALUES ('ord_1', 'paid')"
        ))
        .execute(&mut *tx)
        .await
        .unwrap();
        let claim = layer(store.clone()).claim(&message).unwrap().unwrap();
        assert!(store.claim_in_sqlx(&mut *tx, &claim).await.unwrap());
        tx.commit().await.unwrap();
        // The process dies here, before the send: its store, layer, pool and connection go.
        drop((store, connection, pool));
    }

    // The next run finds the claim …
    let store = PostgresStore::connect(&url)
        .await
        .unwrap()
        .table(&table)
        .unwrap();
    let layer = layer(store.clone());
    let claim = layer.claim(&message).unwrap().unwrap();
    assert_eq!(
        store.claims(10).await.unwrap(),
        [WaitingClaim::new(claim.key.clone(), claim.fingerprint)]
    );

    // … and sends the same message under the same key: once.
    let provider = Provider::ok();
    let service = layer.layer(provider.clone());
    let first = service.clone().oneshot(message.clone()).await.unwrap();
    assert!(!first.replayed);
    assert_eq!(provider.calls(), 1);
    assert!(
        store.claims(10).await.unwrap().is_empty(),
        "the send took it"
    );
    let again = service.oneshot(message).await.unwrap();
    assert!(again.replayed);
    assert_eq!((again.id, provider.calls()), (first.id, 1));

    // A claim of a key already sent writes nothing.
    let pool = PgPool::connect(&url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(!store.claim_in_sqlx(&mut *tx, &claim).await.unwrap());
    tx.commit().await.unwrap();

    drop_table(&url, &orders).await;
    drop_table(&url, &table).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn another_message_under_a_key_claimed_through_sqlx_is_key_reused_and_not_sent() {
    let Some((url, store)) = setup("sqlx_reused").await else {
        return;
    };
    let layer = layer(store.clone());
    let pool = PgPool::connect(&url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let claim = layer.claim(&alert("sold")).unwrap().unwrap();
    assert!(store.claim_in_sqlx(&mut *tx, &claim).await.unwrap());
    tx.commit().await.unwrap();

    let provider = Provider::ok();
    let error = layer
        .layer(provider.clone())
        .oneshot(alert("a different text"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), "idempotency.key_reused");
    assert_eq!(provider.calls(), 0);
    assert_eq!(
        store.claims(10).await.unwrap(),
        [WaitingClaim::new(claim.key.clone(), claim.fingerprint)],
        "the claim still waits"
    );
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_sqlx_claim_on_a_table_never_migrated_fails_the_transaction_and_says_so() {
    let Some(url) = backend_url("DATABASE_URL") else {
        return;
    };
    let store = PostgresStore::connect(&url)
        .await
        .unwrap()
        .table(&unique("sqlx_never_migrated"))
        .unwrap();
    let claim = layer(store.clone()).claim(&alert("sold")).unwrap().unwrap();
    let pool = PgPool::connect(&url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let error = store.claim_in_sqlx(&mut *tx, &claim).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Unavailable);
    assert!(error.to_string().contains("migrate"), "{error}");
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn an_outbox_message_enqueued_through_sqlx_is_sent_once_by_the_worker() {
    let Some((url, store)) = setup("sqlx_outbox_store").await else {
        return;
    };
    let outbox = Outbox::connect(&url)
        .await
        .unwrap()
        .table(&unique("sqlx_outbox"))
        .unwrap();
    outbox.migrate().await.unwrap();
    let orders = unique("sqlx_outbox_orders");
    let pool = app_pool(&url, &orders).await;
    let message = alert("sold");

    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO \"{orders}\" VALUES ('ord_1', 'paid')"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    assert!(matches!(
        outbox.enqueue_sqlx(&mut *tx, &message).await,
        Ok(Enqueued::New(_))
    ));
    assert_eq!(
        outbox.enqueue_sqlx(&mut *tx, &message).await.unwrap(),
        Enqueued::AlreadyThere
    );
    tx.commit().await.unwrap();
    assert_eq!(outbox.counts().await.unwrap().waiting, 1);

    let provider = Provider::ok();
    let worker = outbox
        .worker(layer(store.clone()).layer(provider.clone()))
        .poll_interval(Duration::from_millis(20));
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    eventually(Duration::from_secs(10), || async {
        outbox.counts().await.unwrap().done == 1
    })
    .await;
    let _ = stop.send(());
    let stats = running.await.unwrap().unwrap();
    assert_eq!((stats.claimed, stats.sent), (1, 1));
    assert_eq!(provider.calls(), 1);
    // The sqlx row is the row `enqueue` writes: a second enqueue of the key, through
    // tokio-postgres, finds it.
    let mut client = admin(&url).await;
    let tx = client.transaction().await.unwrap();
    assert_eq!(
        outbox.enqueue(&tx, &message).await.unwrap(),
        Enqueued::AlreadyThere
    );
    tx.commit().await.unwrap();

    let unkeyed = Message::builder()
        .from("a@x.example")
        .to("b@x.example")
        .text("t")
        .build()
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let error = outbox.enqueue_sqlx(&mut *tx, &unkeyed).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::InvalidInput);

    drop_table(&url, &orders).await;
    drop_table(&url, outbox.table_name()).await;
    drop_table(&url, store.table_name()).await;
}

/// Runs `statement` on `tx` as diesel's `sql_query(..).bind::<T, _>(..)` does on PostgreSQL:
/// each parameter sent with the type its bind names (`Text`, `Binary`, `BigInt`).
async fn execute_as_diesel(
    tx: &tokio_postgres::Transaction<'_>,
    statement: &ClaimStatement,
) -> u64 {
    let mut types = Vec::new();
    let mut values: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
    for param in statement.params() {
        match param {
            ClaimParam::Text(text) => {
                types.push(Type::TEXT);
                values.push(Box::new(text.clone()));
            }
            ClaimParam::Bytes(bytes) => {
                types.push(Type::BYTEA);
                values.push(Box::new(bytes.clone()));
            }
            ClaimParam::BigInt(n) => {
                types.push(Type::INT8);
                values.push(Box::new(*n));
            }
            other => panic!("a claim parameter of no known type: {other:?}"),
        }
    }
    let prepared = tx
        .prepare_typed(statement.sql(), &types)
        .await
        .expect("the statement prepares with typed parameters");
    let refs: Vec<&(dyn ToSql + Sync)> = values
        .iter()
        .map(|v| v.as_ref() as &(dyn ToSql + Sync))
        .collect();
    tx.execute(&prepared, &refs).await.expect("the claim runs")
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn the_postgres_claim_statement_with_typed_binds_commits_a_claim_the_send_takes() {
    let Some((url, store)) = setup("claim_statement_pg").await else {
        return;
    };
    let layer = layer(store.clone());
    let message = alert("sold");
    let claim = layer.claim(&message).unwrap().unwrap();
    let mut client = admin(&url).await;

    // Rolled back: nothing.
    let tx = client.transaction().await.unwrap();
    assert_eq!(
        execute_as_diesel(&tx, &store.claim_statement(&claim)).await,
        1
    );
    tx.rollback().await.unwrap();
    assert!(store.claims(10).await.unwrap().is_empty());

    // Committed: the claim waits, a second statement writes nothing, the send takes it.
    let tx = client.transaction().await.unwrap();
    assert_eq!(
        execute_as_diesel(&tx, &store.claim_statement(&claim)).await,
        1
    );
    tx.commit().await.unwrap();
    assert_eq!(
        store.claims(10).await.unwrap(),
        [WaitingClaim::new(claim.key.clone(), claim.fingerprint)]
    );
    let tx = client.transaction().await.unwrap();
    assert_eq!(
        execute_as_diesel(&tx, &store.claim_statement(&claim)).await,
        0
    );
    tx.commit().await.unwrap();

    let provider = Provider::ok();
    let service = layer.layer(provider.clone());
    let error = service
        .clone()
        .oneshot(alert("a different text"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), "idempotency.key_reused");
    let receipt = service.oneshot(message).await.unwrap();
    assert!(!receipt.replayed);
    assert_eq!(provider.calls(), 1);
    assert!(store.claims(10).await.unwrap().is_empty());
    drop_table(&url, store.table_name()).await;
}

/// Runs `statement` with diesel's `sql_query`, each parameter bound as its `ClaimParam`
/// names: the README's route for diesel users. The count of rows written.
fn claim_with_diesel(
    connection: &mut SqliteConnection,
    statement: &ClaimStatement,
) -> diesel::QueryResult<usize> {
    let mut query = diesel::sql_query(statement.sql()).into_boxed::<Sqlite>();
    for param in statement.params() {
        query = match param {
            ClaimParam::Text(text) => query.bind::<Text, _>(text),
            ClaimParam::Bytes(bytes) => query.bind::<Binary, _>(bytes),
            ClaimParam::BigInt(n) => query.bind::<BigInt, _>(*n),
            other => panic!("a claim parameter of no known type: {other:?}"),
        };
    }
    query.execute(connection)
}

#[tokio::test]
async fn the_sqlite_claim_statement_run_by_diesel_commits_a_claim_the_send_takes() {
    let dir = SqliteDir::new("claim-statement-diesel");
    let store = SqliteStore::open(dir.file()).await.unwrap();
    let layer = layer(store.clone());
    let message = alert("sold");
    let claim = layer.claim(&message).unwrap().unwrap();
    let path = dir.file();
    let mut connection = SqliteConnection::establish(path.to_str().unwrap()).unwrap();
    connection
        .batch_execute(
            "PRAGMA busy_timeout = 5000;
             CREATE TABLE orders (id TEXT PRIMARY KEY, state TEXT NOT NULL);",
        )
        .unwrap();
    let order = "INSERT INTO orders VALUES ('ord_1', 'paid')";

    // Rolled back: no claim, no order.
    let rolled_back = connection.immediate_transaction(|connection| {
        diesel::sql_query(order).execute(connection)?;
        assert_eq!(
            claim_with_diesel(connection, &store.claim_statement(&claim))?,
            1
        );
        Err::<(), _>(diesel::result::Error::RollbackTransaction)
    });
    assert!(rolled_back.is_err());
    assert!(store.claims(10).await.unwrap().is_empty());

    // Committed with the order: the claim waits, a second statement writes nothing.
    let claimed = connection.immediate_transaction(|connection| {
        diesel::sql_query(order).execute(connection)?;
        claim_with_diesel(connection, &store.claim_statement(&claim))
    });
    assert_eq!(claimed, Ok(1));
    assert_eq!(
        store.claims(10).await.unwrap(),
        [WaitingClaim::new(claim.key.clone(), claim.fingerprint)]
    );
    let again = connection.immediate_transaction(|connection| {
        claim_with_diesel(connection, &store.claim_statement(&claim))
    });
    assert_eq!(again, Ok(0), "a live claim holds the key");

    // Another message under the key is refused; the claimed one goes once.
    let provider = Provider::ok();
    let service = layer.layer(provider.clone());
    let error = service
        .clone()
        .oneshot(alert("a different text"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), "idempotency.key_reused");
    let first = service.clone().oneshot(message.clone()).await.unwrap();
    let repeat = service.oneshot(message).await.unwrap();
    assert!(!first.replayed && repeat.replayed);
    assert_eq!(provider.calls(), 1);
    assert!(store.claims(10).await.unwrap().is_empty());
}
