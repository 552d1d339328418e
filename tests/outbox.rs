//! The PostgreSQL outbox against a real server: the outbox suite of `support::outbox` (the
//! message commits or rolls back with the caller's transaction, workers send each message
//! once, retries, `Retry-After` and dead letters, workers killed or told to stop), and what
//! only PostgreSQL has: `NOTIFY` wakes an idle worker; a trigger makes the server refuse a
//! mark once, which the worker asks again.
//!
//! Runs against `DATABASE_URL` or the default local server; reported as ignored when none
//! answered as the suite was built (see `support::stores`).
#![cfg(feature = "postgres")]

mod support;

use std::time::Duration;

use support::outbox::{Database, Provider, Row, Table, outbox_suite, start};
use support::poll_until;
use support::stores::postgres_admin::{admin, drop_table};
use tower_idempotency::Message;
use tower_idempotency::outbox::{Enqueued, Outbox};
use tower_idempotency::store::StoreError;

/// The caller's transactions are tokio-postgres ones.
struct Postgres;

impl Database for Postgres {
    const URL_VAR: &'static str = "DATABASE_URL";

    async fn enqueue_in_transaction(
        url: &str,
        outbox: &Outbox,
        messages: &[Message],
        commit: bool,
    ) -> Vec<Result<Enqueued, StoreError>> {
        let mut client = admin(url).await;
        let tx = client.transaction().await.expect("begin");
        let mut answers = Vec::new();
        for message in messages {
            answers.push(outbox.enqueue(&tx, message).await);
        }
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
        answers
    }

    async fn rows(url: &str, outbox: &Outbox) -> Vec<Row> {
        let rows = admin(url)
            .await
            .query(
                &format!(
                    "SELECT key, state, attempts, provider_id,
                            available_at > now() + interval '59 minutes'
                     FROM \"{}\" ORDER BY id",
                    outbox.table_name()
                ),
                &[],
            )
            .await
            .expect("read rows");
        rows.iter()
            .map(|row| Row {
                key: row.get(0),
                state: row.get(1),
                attempts: row.get(2),
                provider_id: row.get(3),
                held_an_hour: row.get(4),
            })
            .collect()
    }

    async fn drop_table(url: &str, table: &str) {
        drop_table(url, table).await;
    }
}

outbox_suite!(
    #[cfg_attr(
        not(backend_postgres),
        ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
    )]
    Postgres
);

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn notify_wakes_an_idle_worker_that_polls_once_an_hour() {
    let Some(table) = Table::<Postgres>::fresh().await else {
        return;
    };
    let (url, outbox) = (&table.url, &table.outbox);
    let provider = Provider::ok();
    let worker = start(
        outbox
            .worker(provider.service())
            .poll_interval(Duration::from_secs(3600)),
    );
    table.enqueue(["first".to_owned()]).await;
    table.until_done(1).await;
    let enqueued = std::time::Instant::now();
    table.enqueue(["second".to_owned()]).await;
    table.until_done(2).await;
    let woken_within = enqueued.elapsed();
    worker.stop().await;

    // Without a LISTEN connection, the same worker waits for its poll.
    let pool_only = Outbox::new(outbox_pool(url))
        .table(outbox.table_name())
        .unwrap();
    let quiet = pool_only
        .worker(provider.service())
        .poll_interval(Duration::from_secs(3600));
    let quiet_stats = quiet.stats();
    let quiet = start(quiet);
    // Its first claim runs at start and finds nothing; once it has run, the worker is idle
    // until its hour-long poll.
    poll_until(
        "the worker's first claim",
        Duration::from_secs(5),
        || async { quiet_stats.get().polls >= 1 },
    )
    .await;
    table.enqueue(["third".to_owned()]).await;
    // A check that nothing happens needs a span of real time: a few times what the listening
    // worker took to send the second message, so a wake-up would have shown by then.
    tokio::time::sleep((woken_within * 3).max(Duration::from_millis(50))).await;
    assert_eq!(
        provider.calls("third"),
        0,
        "nothing woke the polling worker"
    );
    quiet.stop().await;
    table.drop_table().await;
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

/// A statement that records the sends' answers and fails is asked again: the row is marked
/// done and its message goes once, instead of staying claimed to be sent again when its
/// claim passes. The failure is the server's own: a trigger refuses the first mark of a row
/// as done (a sequence counts, as a raised exception rolls back every write of its
/// statement).
#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_failed_mark_is_asked_again_and_its_message_goes_once() {
    let Some(table) = Table::<Postgres>::fresh().await else {
        return;
    };
    let name = table.outbox.table_name().to_owned();
    let admin = admin(&table.url).await;
    admin
        .batch_execute(&format!(
            r#"CREATE SEQUENCE "{name}_marks";
               CREATE FUNCTION "{name}_refuse_once"() RETURNS trigger AS $$
               BEGIN
                 IF NEW.state = 'done' AND nextval('"{name}_marks"') = 1 THEN
                   RAISE EXCEPTION 'the first mark is refused';
                 END IF;
                 RETURN NEW;
               END $$ LANGUAGE plpgsql;
               CREATE TRIGGER "{name}_refuse_once" BEFORE UPDATE ON "{name}"
                 FOR EACH ROW EXECUTE FUNCTION "{name}_refuse_once"();"#
        ))
        .await
        .expect("the trigger");

    let provider = Provider::ok();
    // The claim outlives the test: without the mark asked again, the row would stay
    // claimed and the wait for it to be done would fail.
    let worker = table
        .worker(provider.service())
        .claim_lease(Duration::from_secs(3600));
    table.enqueue(["refused-once".to_owned()]).await;
    let stats = table.drain(worker, 1).await;
    assert_eq!(provider.calls("refused-once"), 1);
    assert_eq!(stats.sent, 1);
    let row = table.row("refused-once").await;
    assert_eq!(row.state, "done");
    let refused: i64 = admin
        .query_one(&format!(r#"SELECT last_value FROM "{name}_marks""#), &[])
        .await
        .expect("the sequence")
        .get(0);
    assert_eq!(
        refused, 2,
        "the first mark was refused, the second recorded"
    );

    table.drop_table().await;
    admin
        .batch_execute(&format!(
            r#"DROP FUNCTION IF EXISTS "{name}_refuse_once"() CASCADE;
               DROP SEQUENCE IF EXISTS "{name}_marks";"#
        ))
        .await
        .expect("drop the trigger's function");
}
