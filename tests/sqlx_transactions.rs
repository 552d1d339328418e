//! Claims and outbox messages written in a transaction of the caller's own driver: the suite
//! of `support::sqlx_transactions` on a real PostgreSQL server (a rollback leaves nothing; a
//! commit, then a crash before the send, is sent once by the next run; another message under
//! a claimed key is `key_reused`; the outbox's worker sends a message enqueued through sqlx
//! once), and the claim as a statement with its parameters: run by diesel's `sql_query` on
//! SQLite, and on PostgreSQL with the typed binds diesel sends (diesel's PostgreSQL backend
//! needs libpq, which the tests do without).
//!
//! The same suite on MySQL, and what only MySQL has, are in `sqlx_transactions/mysql.rs`.
//!
//! The PostgreSQL tests run against `DATABASE_URL` or the default local server; reported as
//! ignored when none answered as the suite was built (see `support::stores`).
#![cfg(all(feature = "sqlx", feature = "sqlite"))]

#[cfg(feature = "mysql")]
#[path = "sqlx_transactions/mysql.rs"]
mod mysql;
mod support;

use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Binary, Text};
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel::{Connection as _, RunQueryDsl};
use sqlx::PgConnection;
use tokio_postgres::types::{ToSql, Type};

use support::claims::{alert, layer, the_send_takes_the_claim_once};
use support::sqlx_transactions::{Database, same_on_every_database, sqlx_transactions_suite};
use support::stores::postgres_admin::{admin, drop_table};
use support::stores::{SqliteDir, backend_url, unique};
use tower_idempotency::outbox::{Enqueued, Outbox};
use tower_idempotency::store::{ClaimParam, ClaimStatement, StoreError, WaitingClaim};
use tower_idempotency::{Message, PostgresStore, SqliteStore};

/// The application writes through sqlx's PostgreSQL driver; the outbox's own is
/// tokio-postgres.
struct Postgres;

impl Database for Postgres {
    const URL_VAR: &'static str = "DATABASE_URL";
    type Sqlx = sqlx::Postgres;

    same_on_every_database!(PostgresStore, PgConnection);

    async fn enqueue_sqlx(
        outbox: &Outbox,
        conn: &mut PgConnection,
        message: &Message,
    ) -> Result<Enqueued, StoreError> {
        outbox.enqueue_sqlx(conn, message).await
    }

    async fn enqueue_natively(
        url: &str,
        outbox: &Outbox,
        message: &Message,
    ) -> Result<Enqueued, StoreError> {
        let mut client = admin(url).await;
        let tx = client.transaction().await.expect("begin");
        let answer = outbox.enqueue(&tx, message).await;
        tx.commit().await.expect("commit");
        answer
    }

    fn create_orders(orders: &str) -> String {
        format!("CREATE TABLE {orders} (id text PRIMARY KEY, state text NOT NULL)")
    }

    async fn drop_table(url: &str, table: &str) {
        drop_table(url, table).await;
    }
}

sqlx_transactions_suite!(
    #[cfg_attr(
        not(backend_postgres),
        ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
    )]
    Postgres
);

/// A store on a fresh table of the test's own (see `backend_url` for the `Option`).
async fn setup(test: &str) -> Option<(String, PostgresStore)> {
    let url = backend_url("DATABASE_URL")?;
    let store = Postgres::store(&url, &unique(test)).await;
    Postgres::migrate(&store).await;
    Some((url, store))
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
    let claim = layer.claim(&alert("sold")).unwrap().unwrap();
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

    the_send_takes_the_claim_once(&layer).await;
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
    let claim = layer.claim(&alert("sold")).unwrap().unwrap();
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
    the_send_takes_the_claim_once(&layer).await;
    assert!(store.claims(10).await.unwrap().is_empty());
}
