//! Claims and outbox messages in a sqlx transaction on MySQL (MariaDB here): the suite of
//! `support::sqlx_transactions`, through `MySqlStore::claim_in_sqlx` and
//! `Outbox::enqueue_sqlx_mysql`. sqlx's connections count matched rows (`CLIENT_FOUND_ROWS`),
//! so its cases also check that the answers stay exact with them. And what only MySQL has: its
//! sqlx enqueue refuses an outbox on PostgreSQL.
//!
//! Runs against `MYSQL_URL` or the default local server; reported as ignored when none
//! answered as the suite was built (see `support::stores`).

use mysql_async::TxOpts;
use sqlx::{MySqlConnection, MySqlPool};

use crate::support::claims::alert;
use crate::support::sqlx_transactions::{
    Database, same_on_every_database, sqlx_transactions_suite,
};
use crate::support::stores::backend_url;
use crate::support::stores::mysql_admin::{admin, drop_table};
use tower_idempotency::outbox::{Enqueued, Outbox};
use tower_idempotency::store::{StoreError, StoreErrorKind};
use tower_idempotency::{Message, MySqlStore};

/// The application writes through sqlx's MySQL driver; the outbox's own is mysql_async.
struct MySql;

impl Database for MySql {
    const URL_VAR: &'static str = "MYSQL_URL";
    type Sqlx = sqlx::MySql;

    same_on_every_database!(MySqlStore, MySqlConnection);

    async fn enqueue_sqlx(
        outbox: &Outbox,
        conn: &mut MySqlConnection,
        message: &Message,
    ) -> Result<Enqueued, StoreError> {
        outbox.enqueue_sqlx_mysql(conn, message).await
    }

    async fn enqueue_natively(
        url: &str,
        outbox: &Outbox,
        message: &Message,
    ) -> Result<Enqueued, StoreError> {
        let pool = admin(url);
        let mut tx = pool
            .start_transaction(TxOpts::default())
            .await
            .expect("begin");
        let answer = outbox.enqueue_mysql(&mut tx, message).await;
        tx.commit().await.expect("commit");
        pool.disconnect().await.expect("disconnect");
        answer
    }

    fn create_orders(orders: &str) -> String {
        // InnoDB, whatever the server's default: the orders roll back with the claim.
        format!(
            "CREATE TABLE {orders} (id VARCHAR(16) PRIMARY KEY, state TEXT NOT NULL) \
             ENGINE = InnoDB"
        )
    }

    async fn drop_table(url: &str, table: &str) {
        drop_table(url, table).await;
    }
}

sqlx_transactions_suite!(
    #[cfg_attr(
        not(backend_mysql),
        ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
    )]
    MySql
);

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
