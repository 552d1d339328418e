//! The outbox on MySQL / MariaDB against a real server: the outbox suite of
//! `support::outbox` (the message commits or rolls back with the caller's mysql_async
//! transaction, workers send each message once, retries, `Retry-After` and dead letters,
//! workers killed or told to stop). The worker polls: MySQL has no notifications.
//!
//! Runs against `MYSQL_URL`, else `mysql://root@127.0.0.1:3306/test`; reported as ignored when
//! neither answered as the suite was built (see `support::stores`).
#![cfg(feature = "mysql")]

mod support;

use mysql_async::TxOpts;
use mysql_async::prelude::Queryable;

use support::outbox::{Database, Row, outbox_suite};
use support::stores::mysql_admin::{admin, drop_table};
use tower_idempotency::Message;
use tower_idempotency::outbox::{Enqueued, Outbox};
use tower_idempotency::store::StoreError;

/// A row as mysql_async reads it: the key is binary.
type RawRow = (Vec<u8>, String, i32, Option<String>, bool);

/// The caller's transactions are mysql_async ones, through `Outbox::enqueue_mysql`.
struct MySql;

impl Database for MySql {
    const URL_VAR: &'static str = "MYSQL_URL";

    async fn enqueue_in_transaction(
        url: &str,
        outbox: &Outbox,
        messages: &[Message],
        commit: bool,
    ) -> Vec<Result<Enqueued, StoreError>> {
        let pool = admin(url);
        let mut tx = pool
            .start_transaction(TxOpts::default())
            .await
            .expect("begin");
        let mut answers = Vec::new();
        for message in messages {
            answers.push(outbox.enqueue_mysql(&mut tx, message).await);
        }
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
        pool.disconnect().await.expect("disconnect");
        answers
    }

    async fn rows(url: &str, outbox: &Outbox) -> Vec<Row> {
        let pool = admin(url);
        let mut conn = pool.get_conn().await.expect("admin connection");
        let rows: Vec<RawRow> = conn
            .query(format!(
                "SELECT `key`, state, attempts, provider_id,
                        available_at > UTC_TIMESTAMP(6) + INTERVAL 59 MINUTE
                 FROM `{}` ORDER BY id",
                outbox.table_name()
            ))
            .await
            .expect("read rows");
        drop(conn);
        pool.disconnect().await.expect("disconnect");
        rows.into_iter()
            .map(|(key, state, attempts, provider_id, held_an_hour)| Row {
                key: String::from_utf8(key).expect("UTF-8 key"),
                state,
                attempts,
                provider_id,
                held_an_hour,
            })
            .collect()
    }

    async fn drop_table(url: &str, table: &str) {
        drop_table(url, table).await;
    }
}

outbox_suite!(
    #[cfg_attr(
        not(backend_mysql),
        ignore = "no MySQL at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
    )]
    MySql
);
