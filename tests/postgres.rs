//! `PostgresStore` against a real server: the conformance suite, races across connections,
//! corrupt rows, killed connections, timeouts, purges, and the batch operations' statements.
//!
//! Runs against `DATABASE_URL`, else `postgres://postgres@127.0.0.1:5432/test`; reported as
//! ignored when neither answered as the suite was built (see `support::stores`).
#![cfg(feature = "postgres")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_postgres::NoTls;

use support::poll_until;
use support::stores::postgres_admin::admin;
use support::stores::{backend_url, broken_records, fp, unique, until_expired};
use tower_idempotency::PostgresStore;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::{Outcome, Receipt, SendError};
use tower_idempotency::store::admin::{AdminOutcome, Force, KeyState, Resolution, StoreAdmin};
use tower_idempotency::store::conformance::Conformance;
use tower_idempotency::store::{
    Claim, Completion, RecordState, Reservation, Store, StoreErrorKind, Token,
};
use uuid::Uuid;

/// The table the conformance cases share; each case uses its own random key prefix, and each
/// setup purges the rows earlier cases left to expire, so the table does not grow.
const CONFORMANCE_TABLE: &str = "idem_conformance";

const LEASE: Duration = Duration::from_secs(60);

fn database_url() -> Option<String> {
    backend_url("DATABASE_URL")
}

/// A pool of up to `size` connections whose sessions carry `application_name`.
fn pool(url: &str, size: usize, application_name: &str) -> Pool {
    let mut config: tokio_postgres::Config = url.parse().expect("DATABASE_URL parses");
    config.application_name(application_name);
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .build()
        .expect("pool builds")
}

/// Deletes the rows a test left in the shared table, whose keys start with `prefix`.
async fn forget(url: &str, prefix: &str) {
    let sql = format!("DELETE FROM {CONFORMANCE_TABLE} WHERE starts_with(key, $1)");
    admin(url).await.execute(&sql, &[&prefix]).await.unwrap();
}

/// A store on a fresh table of its own, dropped by [`TempTable::drop`].
struct TempTable {
    store: PostgresStore,
    admin: tokio_postgres::Client,
}

impl TempTable {
    async fn new(url: &str) -> Self {
        let store = PostgresStore::connect(url)
            .await
            .expect("connect")
            .table(&unique("idem_test"))
            .expect("valid table name");
        store.migrate().await.expect("migrate");
        Self {
            store,
            admin: admin(url).await,
        }
    }

    async fn rows(&self) -> i64 {
        let sql = format!("SELECT count(*) FROM {}", self.store.table_name());
        self.admin.query_one(&sql, &[]).await.unwrap().get(0)
    }

    async fn drop(self) {
        let sql = format!("DROP TABLE {}", self.store.table_name());
        self.admin.batch_execute(&sql).await.unwrap();
    }
}

/// A store on the shared conformance table.
async fn shared_store(url: &str) -> PostgresStore {
    let store = PostgresStore::connect(url)
        .await
        .expect("connect")
        .table(CONFORMANCE_TABLE)
        .expect("valid table name");
    store.migrate().await.expect("migrate");
    store
}

mod postgres_conformance {
    use super::*;

    async fn suite() -> Option<Conformance> {
        let url = database_url()?;
        let store = shared_store(&url).await;
        // Rows earlier runs left, not the stale pending rows of cases running now: a purge
        // deletes those, and a reserve after it can no longer report the takeover.
        let sql = format!(
            "DELETE FROM {CONFORMANCE_TABLE} WHERE expires_at < now() - interval '1 minute'"
        );
        support::stores::postgres_admin::admin(&url)
            .await
            .batch_execute(&sql)
            .await
            .expect("delete old rows");
        // A lease of 3 s, not the suite's 300 ms: with the whole suite running on 2 cores
        // and every statement a commit to disk, a new owner's 300 ms lease passed before the
        // stale owner's complete ran (which then rightly wrote over an expired row), and a
        // 1 s lease passed within the listing case, which then (rightly) listed its own
        // pending key as stale.
        Some(Conformance::with_admin(store).lease(Duration::from_secs(3)))
    }

    tower_idempotency::store_conformance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[cfg_attr(
            not(backend_postgres),
            ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
        )]
        suite()
    );
}

async fn race(store: &PostgresStore, key: &str, contenders: usize) -> usize {
    let barrier = Arc::new(tokio::sync::Barrier::new(contenders));
    let tasks: Vec<_> = (0..contenders)
        .map(|_| {
            let store = store.clone();
            let key = key.to_owned();
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                store.reserve(&key, fp(1), LEASE).await
            })
        })
        .collect();
    let mut reserved = 0;
    for task in tasks {
        match task.await.expect("task panicked") {
            Ok(Reservation::Reserved { .. } | Reservation::TakenOver { .. }) => reserved += 1,
            Ok(Reservation::Held { record }) => assert_eq!(record.state, RecordState::Pending),
            Ok(other) => panic!("unexpected reservation {other:?}"),
            Err(e) => panic!("reserve failed under the race: {e}"),
        }
    }
    reserved
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn sixty_four_connections_racing_one_key_reserve_it_once() {
    let Some(url) = database_url() else { return };
    const CONTENDERS: usize = 64;
    let store = PostgresStore::new(pool(&url, CONTENDERS, &unique("idem_race")))
        .table(CONFORMANCE_TABLE)
        .unwrap()
        .timeout(Duration::from_secs(10));
    store.migrate().await.unwrap();

    // Open all 64 sessions before the race, so every contender has its own.
    let clients = futures_util::future::try_join_all((0..CONTENDERS).map(|_| store.pool().get()))
        .await
        .expect("64 connections");
    drop(clients);
    assert_eq!(store.pool().status().size, CONTENDERS);

    let prefix = unique("race");
    for round in 0..10 {
        let key = format!("{prefix}:fresh:{round}");
        assert_eq!(
            race(&store, &key, CONTENDERS).await,
            1,
            "fresh key, {round}"
        );
    }
    // The same race over keys whose previous reservation has expired (a zero lease expires
    // at once): exactly one contender takes each over.
    for round in 0..10 {
        let key = format!("{prefix}:expired:{round}");
        let first = store.reserve(&key, fp(2), Duration::ZERO).await.unwrap();
        assert!(matches!(first, Reservation::Reserved { .. }));
        assert_eq!(
            race(&store, &key, CONTENDERS).await,
            1,
            "expired key, {round}"
        );
    }
    forget(&url, &prefix).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn two_stores_see_each_others_keys() {
    let Some(url) = database_url() else { return };
    let a = shared_store(&url).await;
    let b = shared_store(&url).await;
    let key = unique("two-stores");

    let Ok(Reservation::Reserved { token }) = a.reserve(&key, fp(1), LEASE).await else {
        panic!("a fresh key is reserved")
    };
    match b.reserve(&key, fp(1), LEASE).await.unwrap() {
        Reservation::Held { record } => assert_eq!(record.state, RecordState::Pending),
        Reservation::Reserved { .. } => panic!("the second store reserved a held key"),
        other => panic!("unexpected reservation {other:?}"),
    }
    assert!(!b.release(&key, Token::new()).await.unwrap());

    let outcome = Outcome::sent(Receipt::new("msg-7", "test"));
    assert!(
        a.complete(&key, token, fp(1), &outcome, LEASE)
            .await
            .unwrap()
    );
    match b.reserve(&key, fp(1), LEASE).await.unwrap() {
        Reservation::Held { record } => {
            assert_eq!(record.state, RecordState::Done);
            assert_eq!(record.outcome.unwrap().replay().unwrap().id, "msg-7");
        }
        Reservation::Reserved { .. } => panic!("the second store reserved a done key"),
        other => panic!("unexpected reservation {other:?}"),
    }
    forget(&url, &key).await;
}

/// The row's version and its last locker: `ctid` moves and `xmin` changes whenever the row
/// is written again; `xmax` changes when a transaction locks it (a row lock is written to the
/// row and to the WAL, and its transaction commits to disk).
async fn row_version(admin: &tokio_postgres::Client, key: &str) -> (String, String, String) {
    let sql = format!(
        "SELECT ctid::text, xmin::text, xmax::text FROM {CONFORMANCE_TABLE} WHERE key = $1"
    );
    let row = admin.query_one(&sql, &[&key]).await.expect("the row");
    (row.get(0), row.get(1), row.get(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn replays_do_not_rewrite_the_row_they_find_held() {
    let Some(url) = database_url() else { return };
    let store = shared_store(&url).await;
    let admin = admin(&url).await;
    let done = unique("replays-done");
    let pending = unique("replays-pending");

    let Ok(Reservation::Reserved { token }) = store.reserve(&done, fp(1), LEASE).await else {
        panic!("a fresh key is reserved")
    };
    let outcome = Outcome::sent(Receipt::new("msg-1", "test"));
    assert!(
        store
            .complete(&done, token, fp(1), &outcome, LEASE)
            .await
            .unwrap()
    );
    let Ok(Reservation::Reserved { .. }) = store.reserve(&pending, fp(2), LEASE).await else {
        panic!("a fresh key is reserved")
    };
    let before = (
        row_version(&admin, &done).await,
        row_version(&admin, &pending).await,
    );

    // 10,000 replays of the done key and of the pending one, 16 at a time.
    for _ in 0..10_000 / 16 {
        let replays = (0..16).map(|i| {
            let (key, fingerprint) = if i % 2 == 0 {
                (&done, fp(1))
            } else {
                (&pending, fp(2))
            };
            store.reserve(key, fingerprint, LEASE)
        });
        for answer in futures_util::future::join_all(replays).await {
            assert!(matches!(answer, Ok(Reservation::Held { .. })), "{answer:?}");
        }
    }

    let after = (
        row_version(&admin, &done).await,
        row_version(&admin, &pending).await,
    );
    assert_eq!(
        before, after,
        "a replay wrote or locked the row it found held"
    );
    forget(&url, &done).await;
    forget(&url, &pending).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn replayed_batches_do_not_rewrite_the_rows_they_find_held() {
    let Some(url) = database_url() else { return };
    let store = shared_store(&url).await;
    let admin = admin(&url).await;
    let prefix = unique("batch-replays");
    // Eight held keys: even ones done, odd ones pending, each of its own message.
    let held: Vec<String> = (0..8).map(|i| format!("{prefix}:held:{i}")).collect();
    let outcome = Outcome::sent(Receipt::new("msg-1", "test"));
    for (i, key) in held.iter().enumerate() {
        let Ok(Reservation::Reserved { token }) = store.reserve(key, fp(i as u8), LEASE).await
        else {
            panic!("a fresh key is reserved")
        };
        if i % 2 == 0 {
            assert!(
                store
                    .complete(key, token, fp(i as u8), &outcome, LEASE)
                    .await
                    .unwrap()
            );
        }
    }
    let mut before = Vec::new();
    for key in &held {
        before.push(row_version(&admin, key).await);
    }

    // 10,000 replays: 1,250 batches of the eight held keys, each batch with a fresh key too,
    // five batches at a time.
    let fresh = AtomicU64::new(0);
    for _ in 0..1_250 / 5 {
        let batches = (0..5).map(|_| {
            let fresh = format!("{prefix}:fresh:{}", fresh.fetch_add(1, Ordering::Relaxed));
            let (store, held) = (&store, &held);
            async move {
                let mut requests: Vec<(&str, Fingerprint)> = held
                    .iter()
                    .enumerate()
                    .map(|(i, key)| (key.as_str(), fp(i as u8)))
                    .collect();
                requests.push((&fresh, fp(9)));
                store.reserve_many(&requests, LEASE).await.map(|answers| {
                    let last = answers.len() - 1;
                    for (at, answer) in answers.into_iter().enumerate() {
                        match (at, answer) {
                            (at, Ok(Reservation::Reserved { .. })) if at == last => {}
                            (at, Ok(Reservation::Held { record })) if at < last => {
                                let state = if at % 2 == 0 {
                                    RecordState::Done
                                } else {
                                    RecordState::Pending
                                };
                                assert_eq!(record.state, state, "key {at}");
                                assert_eq!(record.fingerprint, fp(at as u8), "key {at}");
                            }
                            (at, other) => panic!("key {at}: {other:?}"),
                        }
                    }
                })
            }
        });
        for answer in futures_util::future::join_all(batches).await {
            answer.expect("reserve_many");
        }
    }

    let mut after = Vec::new();
    for key in &held {
        after.push(row_version(&admin, key).await);
    }
    assert_eq!(
        before, after,
        "a replayed batch wrote or locked a row it found held"
    );
    // The keys the batches inserted know their first attempt's time, as a reserve's do.
    let sql = format!(
        "SELECT count(*), count(first_attempt_at) FROM {CONFORMANCE_TABLE}
         WHERE starts_with(key, $1)"
    );
    let row = admin
        .query_one(&sql, &[&format!("{prefix}:fresh:")])
        .await
        .unwrap();
    let (fresh, timed): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!((fresh, timed), (1_250, 1_250));
    forget(&url, &prefix).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn rows_that_do_not_decode_are_reported_as_corrupt() {
    let Some(url) = database_url() else { return };
    let store = shared_store(&url).await;
    let admin = admin(&url).await;
    let prefix = unique("corrupt");
    let fingerprint = vec![1u8; 32];
    let valid_outcome = String::from_utf8(
        tower_idempotency::store::record::encode_outcome(&Outcome::sent(Receipt::new("m", "t")))
            .unwrap(),
    )
    .unwrap();
    let rows: [(&str, &str, Vec<u8>, Option<&str>); 6] = [
        ("bad-state", "weird", fingerprint.clone(), None),
        (
            "bad-outcome",
            "done",
            fingerprint.clone(),
            Some(r#"{"nope": 1}"#),
        ),
        ("done-without-outcome", "done", fingerprint.clone(), None),
        (
            "pending-with-outcome",
            "pending",
            fingerprint.clone(),
            Some(&valid_outcome),
        ),
        ("short-fingerprint", "pending", vec![1, 2, 3], None),
        (
            "outcome-not-an-object",
            "done",
            fingerprint.clone(),
            Some("42"),
        ),
    ];
    let insert = format!(
        "INSERT INTO {CONFORMANCE_TABLE} (key, state, token, fingerprint, outcome, expires_at)
         VALUES ($1, $2, $3, $4, $5::text::jsonb, now() + interval '1 hour')"
    );
    for (name, state, fingerprint, outcome) in &rows {
        let key = format!("{prefix}:{name}");
        admin
            .execute(
                &insert,
                &[&key, state, &Uuid::new_v4(), fingerprint, outcome],
            )
            .await
            .unwrap();
        let error = store
            .reserve(&key, fp(1), LEASE)
            .await
            .expect_err("a garbage row is not a record");
        assert_eq!(error.kind(), StoreErrorKind::Corrupt, "{name}: {error}");
    }
    // A garbage row whose time has passed is simply taken over.
    let key = format!("{prefix}:expired-garbage");
    let expired = format!(
        "INSERT INTO {CONFORMANCE_TABLE} (key, state, token, fingerprint, outcome, expires_at)
         VALUES ($1, 'weird', $2, '\\x00', '[]', now() - interval '1 second')"
    );
    admin
        .execute(&expired, &[&key, &Uuid::new_v4()])
        .await
        .unwrap();
    assert!(matches!(
        store.reserve(&key, fp(1), LEASE).await.unwrap(),
        Reservation::Reserved { .. }
    ));

    forget(&url, &prefix).await;
}

/// Polls the server until a session of `application_name` waits on a lock; answers its pid.
async fn session_waiting_on_a_lock(admin: &tokio_postgres::Client, application_name: &str) -> i32 {
    let pid = std::cell::Cell::new(None);
    poll_until(
        &format!("a session of {application_name} waits on the lock"),
        Duration::from_secs(5),
        || async {
            let found = admin
                .query_opt(
                    "SELECT pid FROM pg_stat_activity
                     WHERE application_name = $1 AND wait_event_type = 'Lock'",
                    &[&application_name],
                )
                .await
                .unwrap()
                .map(|row| row.get(0));
            pid.set(found);
            found.is_some()
        },
    )
    .await;
    pid.get().expect("polled until found")
}

/// Writes a row of `key` in a transaction of `admin` that stays open.
///
/// A reserve reads a row there without locking it, so what makes a reserve wait is a row of
/// its key being inserted: `admin` inserts one in a transaction it leaves open, and a reserve
/// of `key` waits for that transaction to end (its insert cannot tell yet whether the key is
/// taken).
async fn insert_uncommitted(admin: &tokio_postgres::Client, key: &str) {
    admin.batch_execute("BEGIN").await.unwrap();
    let sql = format!(
        "INSERT INTO {CONFORMANCE_TABLE} (key, state, token, fingerprint, outcome, expires_at)
         VALUES ($1, 'pending', $2, $3, NULL, now() + interval '1 hour')"
    );
    let (token, fingerprint) = (Uuid::new_v4(), fp(1));
    let fingerprint = &fingerprint.as_bytes()[..];
    let inserted = admin.execute(&sql, &[&key, &token, &fingerprint]).await;
    assert_eq!(inserted.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn killed_sessions_fail_as_store_errors_and_the_store_recovers_by_itself() {
    let Some(url) = database_url() else { return };
    let application_name = unique("idem_kill");
    let store = PostgresStore::new(pool(&url, 4, &application_name))
        .table(CONFORMANCE_TABLE)
        .unwrap()
        .timeout(Duration::from_secs(5));
    store.migrate().await.unwrap();
    let admin = admin(&url).await;
    let prefix = unique("kill");

    // An operation in flight when its session is killed fails as a store error.
    let locked = format!("{prefix}:locked");
    insert_uncommitted(&admin, &locked).await;
    let blocked = tokio::spawn({
        let store = store.clone();
        let locked = locked.clone();
        async move { store.reserve(&locked, fp(1), LEASE).await }
    });
    let pid = session_waiting_on_a_lock(&admin, &application_name).await;
    let killed: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(killed);
    let error = blocked
        .await
        .expect("no panic")
        .expect_err("the killed session's reserve fails");
    assert_eq!(error.kind(), StoreErrorKind::Unavailable, "{error}");
    admin.batch_execute("ROLLBACK").await.unwrap();

    // Kill every session of the store at once, idle ones included. First make sure the pool
    // holds four live sessions: the one killed above may not have been noticed as closed yet.
    let mut pids = Vec::new();
    for _ in 0..10 {
        let clients = futures_util::future::try_join_all((0..4).map(|_| store.pool().get()))
            .await
            .unwrap();
        let answers = futures_util::future::join_all(
            clients
                .iter()
                .map(|client| client.query_one("SELECT pg_backend_pid()", &[])),
        )
        .await;
        pids = answers
            .into_iter()
            .filter_map(|row| row.ok().map(|row| row.get::<_, i32>(0)))
            .collect();
        if pids.len() == 4 {
            break;
        }
    }
    assert_eq!(pids.len(), 4, "four live sessions");
    let killed: i64 = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM unnest($1::int[]) AS pid",
            &[&pids],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 4, "sessions killed");

    // No action on our side: within a few attempts the pool has replaced the dead sessions.
    let mut failures = 0;
    let mut recovered = false;
    for attempt in 0..20 {
        let key = format!("{prefix}:after:{attempt}");
        match store.reserve(&key, fp(1), LEASE).await {
            Ok(Reservation::Reserved { token }) => {
                let outcome = Outcome::sent(Receipt::new("m", "t"));
                assert!(
                    store
                        .complete(&key, token, fp(1), &outcome, LEASE)
                        .await
                        .unwrap()
                );
                recovered = true;
                break;
            }
            Ok(Reservation::Held { record }) => panic!("a fresh key was held: {record:?}"),
            Ok(other) => panic!("unexpected reservation {other:?}"),
            Err(e) => {
                assert!(
                    matches!(
                        e.kind(),
                        StoreErrorKind::Unavailable | StoreErrorKind::Timeout
                    ),
                    "{e}"
                );
                failures += 1;
            }
        }
    }
    eprintln!("{failures} operations failed before the pool replaced the killed sessions");
    assert!(recovered, "still failing after {failures} attempts");
    assert!(failures <= 4, "{failures} failures for 4 dead sessions");
    // Every session is a new one now.
    for _ in 0..8 {
        let key = format!("{prefix}:later:{}", Uuid::new_v4());
        store.reserve(&key, fp(1), LEASE).await.expect("healthy");
    }
    forget(&url, &prefix).await;
}

/// A repeat is answered from the row as committed, without waiting for a transaction that
/// holds the row locked (an operator's forget or resolve under way): the reserve reads the
/// row, it does not lock it.
#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_repeat_is_answered_while_another_transaction_holds_the_row_locked() {
    let Some(url) = database_url() else { return };
    // A bound far shorter than the lock is held: waiting on the lock would time out.
    let store = shared_store(&url).await.timeout(Duration::from_secs(2));
    let admin = admin(&url).await;
    let key = unique("locked-repeat");
    assert!(matches!(
        store.reserve(&key, fp(1), LEASE).await.unwrap(),
        Reservation::Reserved { .. }
    ));
    admin.batch_execute("BEGIN").await.unwrap();
    let lock = format!("SELECT 1 FROM {CONFORMANCE_TABLE} WHERE key = $1 FOR UPDATE");
    assert_eq!(admin.execute(&lock, &[&key]).await.unwrap(), 1);
    match store.reserve(&key, fp(1), LEASE).await {
        Ok(Reservation::Held { record }) => assert_eq!(record.state, RecordState::Pending),
        other => panic!("a repeat of a held key under a row lock: {other:?}"),
    }
    admin.batch_execute("ROLLBACK").await.unwrap();
    forget(&url, &key).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn an_operation_past_its_timeout_fails_with_a_timeout_error() {
    let Some(url) = database_url() else { return };
    let store = shared_store(&url).await.timeout(Duration::from_millis(200));
    // The bound the layer trusts in place of its own timer: kept, below.
    assert_eq!(store.call_timeout(), Some(Duration::from_millis(200)));
    let admin = admin(&url).await;
    let key = unique("timeout");
    insert_uncommitted(&admin, &key).await;
    let error = store
        .reserve(&key, fp(1), LEASE)
        .await
        .expect_err("blocked on the row being inserted");
    assert_eq!(error.kind(), StoreErrorKind::Timeout, "{error}");
    admin.batch_execute("ROLLBACK").await.unwrap();
    forget(&url, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_reserve_whose_answer_was_lost_frees_its_key_soon_after_it_lands() {
    let Some(url) = database_url() else { return };
    let application_name = unique("idem_lost");
    let store = PostgresStore::new(pool(&url, 4, &application_name))
        .table(CONFORMANCE_TABLE)
        .unwrap()
        .timeout(Duration::from_millis(200));
    store.migrate().await.expect("migrate");
    let admin = admin(&url).await;
    let key = unique("lost-answer");
    insert_uncommitted(&admin, &key).await;
    let error = store
        .reserve(&key, fp(1), LEASE)
        .await
        .expect_err("blocked on the row being inserted");
    assert_eq!(error.kind(), StoreErrorKind::Timeout, "{error}");
    // The reserve's statement is still on the server, waiting: its caller gave up, and it
    // takes the key once the other transaction ends.
    session_waiting_on_a_lock(&admin, &application_name).await;
    admin.batch_execute("ROLLBACK").await.unwrap();
    // Nobody will send under the lost reserve's token: without its release, the key would be
    // held for the whole lease (a minute), every repeat answered as in flight.
    poll_until(
        "the lost reserve's key is freed within seconds, not at its lease's end",
        Duration::from_secs(10),
        || async {
            match store.reserve(&key, fp(1), LEASE).await {
                Ok(Reservation::Reserved { .. }) => true,
                Ok(Reservation::Held { record }) => {
                    assert_eq!(record.state, RecordState::Pending);
                    false
                }
                other => panic!("a repeat after the lost reserve: {other:?}"),
            }
        },
    )
    .await;
    forget(&url, &key).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn huge_leases_and_ttls_do_not_overflow() {
    let Some(url) = database_url() else { return };
    let store = shared_store(&url).await;
    let key = unique("forever");
    let Reservation::Reserved { token } = store.reserve(&key, fp(1), Duration::MAX).await.unwrap()
    else {
        panic!("a fresh key is reserved")
    };
    assert!(store.extend(&key, token, Duration::MAX).await.unwrap());
    let outcome = Outcome::sent(Receipt::new("m", "t"));
    assert!(
        store
            .complete(&key, token, fp(1), &outcome, Duration::MAX)
            .await
            .unwrap()
    );
    assert!(matches!(
        store.reserve(&key, fp(1), Duration::MAX).await.unwrap(),
        Reservation::Held { record } if record.state == RecordState::Done
    ));
    forget(&url, &key).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn purge_expired_removes_expired_rows_only_in_batches() {
    let Some(url) = database_url() else { return };
    let table = TempTable::new(&url).await;
    let store = table.store.clone().purge_batch(3);
    let outcome = Outcome::sent(Receipt::new("m", "t"));
    for i in 0..7 {
        // A zero lease or ttl expires at once.
        let key = format!("expired:{i}");
        let Reservation::Reserved { token } =
            store.reserve(&key, fp(1), Duration::ZERO).await.unwrap()
        else {
            panic!("fresh key held")
        };
        if i % 2 == 0 {
            assert!(
                store
                    .complete(&key, token, fp(1), &outcome, Duration::ZERO)
                    .await
                    .unwrap()
            );
        }
    }
    store.reserve("live:pending", fp(1), LEASE).await.unwrap();
    assert!(
        store
            .complete("live:done", Token::new(), fp(1), &outcome, LEASE)
            .await
            .unwrap()
    );
    assert_eq!(table.rows().await, 9);

    // Seven rows in batches of three: three statements.
    assert_eq!(store.purge_expired().await.unwrap(), 7);
    assert_eq!(table.rows().await, 2);
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    assert!(matches!(
        store.reserve("live:pending", fp(1), LEASE).await.unwrap(),
        Reservation::Held { record } if record.state == RecordState::Pending
    ));
    assert!(matches!(
        store.reserve("live:done", fp(1), LEASE).await.unwrap(),
        Reservation::Held { record } if record.state == RecordState::Done
    ));
    table.drop().await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn the_background_purge_deletes_expired_rows_until_dropped() {
    let Some(url) = database_url() else { return };
    let table = TempTable::new(&url).await;
    for i in 0..5 {
        table
            .store
            .reserve(&format!("expired:{i}"), fp(1), Duration::ZERO)
            .await
            .unwrap();
    }
    table.store.reserve("live", fp(1), LEASE).await.unwrap();
    let purge = table.store.spawn_purge(Duration::from_millis(20)).unwrap();
    poll_until(
        "the background purge deletes the expired rows",
        Duration::from_secs(5),
        || async { table.rows().await == 1 },
    )
    .await;

    purge.abort();
    for _ in 0..100 {
        if purge.is_finished() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(purge.is_finished());
    table.drop().await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_missing_table_is_an_unavailable_error_that_says_to_migrate() {
    let Some(url) = database_url() else { return };
    let store = PostgresStore::connect(&url)
        .await
        .unwrap()
        .table(&unique("idem_missing"))
        .unwrap();
    let error = store.reserve("k", fp(1), LEASE).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Unavailable);
    assert!(error.to_string().contains("migrate"), "{error}");
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn concurrent_migrations_of_one_schema_qualified_table_all_succeed() {
    let Some(url) = database_url() else { return };
    let admin = admin(&url).await;
    let schema = unique("idem_schema");
    admin
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    let store = PostgresStore::connect(&url)
        .await
        .unwrap()
        .table(&format!("{schema}.keys"))
        .unwrap();
    let migrations = (0..4).map(|_| store.migrate());
    for result in futures_util::future::join_all(migrations).await {
        result.expect("migrate");
    }
    assert!(matches!(
        store.reserve("k", fp(1), LEASE).await.unwrap(),
        Reservation::Reserved { .. }
    ));
    let index: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = 'keys_expires_at_idx'",
            &[&schema],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(index, 1);
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn connecting_to_nothing_is_unavailable_and_a_bad_url_misconfigured() {
    let Some(_) = database_url() else { return };
    let error = PostgresStore::connect("postgres://postgres@127.0.0.1:1/test")
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Unavailable, "{error}");
    assert!(error.to_string().contains("127.0.0.1:1"), "{error}");
    let error = PostgresStore::connect("postgres://[::1").await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
}

#[test]
fn unsafe_table_names_are_refused_before_any_sql() {
    let pool = pool("postgres://nobody@127.0.0.1:1/none", 1, "unused");
    for name in ["keys; DROP TABLE users", "\"keys\"", "Keys", "a.b.c", ""] {
        let error = PostgresStore::new(pool.clone()).table(name).unwrap_err();
        assert_eq!(error.name(), name);
    }
    let store = PostgresStore::new(pool).table("app.keys").unwrap();
    assert_eq!(store.table_name(), "app.keys");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn overlapping_batches_on_sixteen_connections_never_deadlock() {
    let Some(url) = database_url() else { return };
    const TASKS: usize = 16;
    const BATCH: usize = 20;
    // Task t asks for keys t*2 .. t*2+20 of the round: each key is wanted by up to ten tasks.
    const KEYS: usize = (TASKS - 1) * 2 + BATCH;
    let store = PostgresStore::new(pool(&url, TASKS, &unique("idem_batch_race")))
        .table(CONFORMANCE_TABLE)
        .unwrap()
        .timeout(Duration::from_secs(30));
    store.migrate().await.unwrap();
    let clients = futures_util::future::try_join_all((0..TASKS).map(|_| store.pool().get()))
        .await
        .expect("16 connections");
    drop(clients);

    let prefix = unique("batch-race");
    for round in 0..10 {
        let keys: Arc<Vec<String>> = Arc::new(
            (0..KEYS)
                .map(|i| format!("{prefix}:{round}:{i:02}"))
                .collect(),
        );
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let (store, keys, barrier) =
                    (store.clone(), Arc::clone(&keys), Arc::clone(&barrier));
                tokio::spawn(async move {
                    // Every task asks in its own order: rotated, and reversed for odd tasks,
                    // so unordered locking would cross between almost every pair of tasks.
                    let mut window: Vec<&str> = keys[t * 2..t * 2 + BATCH]
                        .iter()
                        .map(String::as_str)
                        .collect();
                    window.rotate_left((t * 7 + round) % BATCH);
                    if t % 2 == 1 {
                        window.reverse();
                    }
                    let requests: Vec<(&str, Fingerprint)> =
                        window.iter().map(|key| (*key, fp(1))).collect();
                    barrier.wait().await;
                    let answers = store.reserve_many(&requests, LEASE).await;
                    let answers = answers.unwrap_or_else(|e| panic!("task {t}: {e}"));
                    assert_eq!(answers.len(), BATCH);
                    let mut won = Vec::new();
                    for (answer, key) in answers.into_iter().zip(window) {
                        match answer {
                            Ok(Reservation::Reserved { .. }) => won.push(key.to_owned()),
                            Ok(Reservation::Held { record }) => {
                                assert_eq!(record.state, RecordState::Pending);
                            }
                            Ok(other) => panic!("unexpected reservation {other:?}"),
                            Err(e) => panic!("task {t}, key {key}: {e}"),
                        }
                    }
                    won
                })
            })
            .collect();
        let mut reserved = Vec::new();
        for task in tasks {
            reserved.extend(task.await.expect("a batch task failed"));
        }
        reserved.sort();
        assert_eq!(
            reserved, *keys,
            "round {round}: each key reserved exactly once"
        );
    }
    forget(&url, &prefix).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_key_repeated_in_one_batch_is_refused_before_any_statement() {
    let Some(url) = database_url() else { return };
    let store = shared_store(&url).await;
    let key = unique("repeated");
    let other = format!("{key}:other");
    let error = store
        .reserve_many(&[(&key, fp(1)), (&other, fp(1)), (&key, fp(2))], LEASE)
        .await
        .expect_err("a repeated key");
    assert_eq!(error.kind(), StoreErrorKind::InvalidInput, "{error}");
    assert!(error.to_string().contains("distinct"), "{error}");
    // Nothing was reserved: the statement never ran.
    let answers = store
        .reserve_many(&[(&key, fp(1)), (&other, fp(1))], LEASE)
        .await
        .unwrap();
    let tokens: Vec<Token> = answers
        .into_iter()
        .map(|answer| match answer {
            Ok(Reservation::Reserved { token }) => token,
            other => panic!("a refused batch reserved something: {other:?}"),
        })
        .collect();

    let outcome = Outcome::sent(Receipt::new("m", "t"));
    let twice = Completion {
        key: &key,
        token: tokens[0],
        fingerprint: fp(1),
        outcome: &outcome,
    };
    let error = store
        .complete_many(&[twice, twice], LEASE)
        .await
        .expect_err("a repeated key");
    assert_eq!(error.kind(), StoreErrorKind::InvalidInput, "{error}");
    let error = store
        .release_many(&[(&key, tokens[0]), (&key, tokens[0])])
        .await
        .expect_err("a repeated key");
    assert_eq!(error.kind(), StoreErrorKind::InvalidInput, "{error}");
    // Both keys are still held pending by their reservation.
    assert_eq!(
        store
            .release_many(&[(&other, tokens[1]), (&key, tokens[0])])
            .await
            .unwrap(),
        [true, true]
    );
    forget(&url, &key).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_row_that_does_not_decode_fails_its_own_entry_of_a_batch_only() {
    let Some(url) = database_url() else { return };
    let store = shared_store(&url).await;
    let prefix = unique("corrupt-batch");
    let (before, garbage, after) = (
        format!("{prefix}:a"),
        format!("{prefix}:b"),
        format!("{prefix}:c"),
    );
    let insert = format!(
        "INSERT INTO {CONFORMANCE_TABLE} (key, state, token, fingerprint, outcome, expires_at)
         VALUES ($1, 'weird', $2, '\\x01', NULL, now() + interval '1 hour')"
    );
    admin(&url)
        .await
        .execute(&insert, &[&garbage, &Uuid::new_v4()])
        .await
        .unwrap();
    let answers = store
        .reserve_many(
            &[(&after, fp(1)), (&garbage, fp(1)), (&before, fp(1))],
            LEASE,
        )
        .await
        .expect("the call as a whole succeeds");
    assert_eq!(answers.len(), 3);
    assert!(matches!(answers[0], Ok(Reservation::Reserved { .. })));
    match &answers[1] {
        Err(error) => assert_eq!(error.kind(), StoreErrorKind::Corrupt, "{error}"),
        Ok(answer) => panic!("a garbage row decoded: {answer:?}"),
    }
    assert!(matches!(answers[2], Ok(Reservation::Reserved { .. })));
    forget(&url, &prefix).await;
}

/// Point 5 of the store contract: a row that decodes but breaks the record rules (a pending
/// row with an outcome, a failure of category delivered) is corrupt here as on every store, on
/// a single reserve and in its own entry of a batch, and is left as it is.
#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_row_that_breaks_the_record_rules_is_corrupt_like_on_every_store() {
    let Some(url) = database_url() else { return };
    let store = shared_store(&url).await;
    let admin = admin(&url).await;
    let prefix = unique("broken-record");
    let insert = format!(
        "INSERT INTO {CONFORMANCE_TABLE} (key, state, token, fingerprint, outcome, expires_at)
         VALUES ($1, $2, $3, $4, $5::text::jsonb, now() + interval '1 hour')"
    );
    let fingerprint = fp(1).as_bytes().to_vec();
    for (name, state, outcome) in broken_records::PARTS {
        let key = format!("{prefix}:{name}");
        admin
            .execute(
                &insert,
                &[&key, &state, &Uuid::new_v4(), &fingerprint, &outcome],
            )
            .await
            .unwrap();

        let err = store.reserve(&key, fp(1), LEASE).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{name}: {err}");
        let fresh = format!("{key}-fresh");
        let answers = store
            .reserve_many(&[(&key, fp(1)), (&fresh, fp(1))], LEASE)
            .await
            .expect("the batch as a whole succeeds");
        match &answers[0] {
            Err(err) => assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{name}: {err}"),
            Ok(answer) => panic!("{name} was answered {answer:?}"),
        }
        assert!(
            matches!(answers[1], Ok(Reservation::Reserved { .. })),
            "{name}: the other entry is reserved: {:?}",
            answers[1]
        );
        let row = admin
            .query_one(
                &format!("SELECT state, outcome::text FROM {CONFORMANCE_TABLE} WHERE key = $1"),
                &[&key],
            )
            .await
            .unwrap();
        assert_eq!(
            row.get::<_, &str>(0),
            state,
            "{name}: the row was left as it is"
        );
        let kept: serde_json::Value = serde_json::from_str(row.get(1)).unwrap();
        let planted: serde_json::Value = serde_json::from_str(outcome).unwrap();
        assert_eq!(kept, planted, "{name}: the outcome was left as it is");
    }
    forget(&url, &prefix).await;
}

/// A TCP relay in front of the server that counts the server's `ReadyForQuery` messages.
///
/// The server sends exactly one `ReadyForQuery` per `Sync` or simple query it answers, and a
/// client waits for it before it knows its statement finished: the count is the number of
/// round trips, read off the wire, including any the driver makes behind our back (prepares,
/// type look-ups) and any on extra connections. It is counted before the message is passed
/// on, so it is exact the moment the store's call returns.
///
/// Why not the server's statistics: `pg_stat_statements` is not preloaded on the test server
/// (loading it needs a restart); `pg_stat_database.xact_commit` is database-wide, counts
/// autovacuum's transactions as well, and PostgreSQL 15 publishes a busy backend's counters
/// only every second (or ten seconds after it goes idle), so reading it takes a dedicated
/// database, a session closed to force the flush, and still a tolerance for noise.
struct Relay {
    port: u16,
    ready: Arc<AtomicU64>,
}

impl Relay {
    async fn start(server: (String, u16)) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let ready = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&ready);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = TcpStream::connect(server.clone()).await.unwrap();
                tokio::spawn(relay_session(client, upstream, Arc::clone(&counter)));
            }
        });
        Self { port, ready }
    }

    fn round_trips(&self) -> u64 {
        self.ready.load(Ordering::SeqCst)
    }
}

async fn relay_session(client: TcpStream, upstream: TcpStream, ready: Arc<AtomicU64>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = upstream.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
    });
    // The server's side, without TLS, is a stream of messages: a type byte, then a length
    // that counts itself and the body.
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match server_read.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        pending.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        while pending.len() - at >= 5 {
            let length = u32::from_be_bytes(pending[at + 1..at + 5].try_into().unwrap()) as usize;
            if pending.len() - at < 1 + length {
                break;
            }
            if pending[at] == b'Z' {
                ready.fetch_add(1, Ordering::SeqCst);
            }
            at += 1 + length;
        }
        pending.drain(..at);
        if client_write.write_all(&chunk[..n]).await.is_err() {
            return;
        }
    }
}

/// Round trips, counted by [`Relay`] on the store's single pooled connection: a batch of 100
/// costs one statement each for `reserve_many` and `complete_many` (two with its prepare the
/// first time), where 100 single reserve + complete pairs cost 200.
#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_batch_of_a_hundred_costs_one_round_trip_per_call() {
    let Some(url) = database_url() else { return };
    let direct: tokio_postgres::Config = url.parse().unwrap();
    let host = match direct.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        other => panic!("this test relays to a TCP host; DATABASE_URL names {other:?}"),
    };
    let port = direct.get_ports().first().copied().unwrap_or(5432);
    let relay = Relay::start((host, port)).await;

    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(relay.port)
        .ssl_mode(tokio_postgres::config::SslMode::Disable)
        .application_name("idem_round_trips");
    if let Some(user) = direct.get_user() {
        config.user(user);
    }
    if let Some(password) = direct.get_password() {
        config.password(password);
    }
    if let Some(dbname) = direct.get_dbname() {
        config.dbname(dbname);
    }
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager).max_size(1).build().unwrap();
    let store = PostgresStore::new(pool)
        .table(CONFORMANCE_TABLE)
        .unwrap()
        .timeout(Duration::from_secs(10));
    store.migrate().await.unwrap();

    let prefix = unique("round-trips");
    let outcome = Outcome::sent(Receipt::new("m", "t"));
    let batch =
        |name: &str| -> Vec<String> { (0..100).map(|i| format!("{prefix}:{name}:{i}")).collect() };
    // Measures one call in round trips.
    async fn counted<T>(relay: &Relay, call: impl Future<Output = T>) -> (T, u64) {
        let before = relay.round_trips();
        let answer = call.await;
        (answer, relay.round_trips() - before)
    }
    let reserve_and_complete = |keys: Vec<String>| {
        let (store, outcome) = (&store, &outcome);
        let relay = &relay;
        async move {
            let requests: Vec<(&str, Fingerprint)> =
                keys.iter().map(|key| (key.as_str(), fp(1))).collect();
            let (answers, reserving) = counted(relay, store.reserve_many(&requests, LEASE)).await;
            let completions: Vec<Completion<'_>> = answers
                .unwrap()
                .into_iter()
                .zip(&keys)
                .map(|(answer, key)| match answer {
                    Ok(Reservation::Reserved { token }) => Completion {
                        key,
                        token,
                        fingerprint: fp(1),
                        outcome,
                    },
                    other => panic!("a fresh key was not reserved: {other:?}"),
                })
                .collect();
            let (written, completing) =
                counted(relay, store.complete_many(&completions, LEASE)).await;
            assert_eq!(written.unwrap(), vec![true; 100]);
            (reserving, completing)
        }
    };

    // The first batch on the connection also prepares its statements.
    let first = reserve_and_complete(batch("first")).await;
    assert!(first.0 <= 2 && first.1 <= 2, "first batch: {first:?}");
    let prepared = reserve_and_complete(batch("prepared")).await;
    assert_eq!(prepared, (1, 1), "once prepared");
    eprintln!("round trips for 100 keys: first batch {first:?}, then {prepared:?}");

    // The same work as single operations: the relay counts what it should.
    let (_, singles) = counted(&relay, async {
        for key in batch("singles") {
            let Reservation::Reserved { token } = store.reserve(&key, fp(1), LEASE).await.unwrap()
            else {
                panic!("a fresh key was not reserved")
            };
            assert!(
                store
                    .complete(&key, token, fp(1), &outcome, LEASE)
                    .await
                    .unwrap()
            );
        }
    })
    .await;
    assert!(
        singles >= 200,
        "100 single pairs took {singles} round trips"
    );
    eprintln!("round trips for 100 single pairs: {singles}");
    forget(&url, &prefix).await;
}

/// Releases and reserves of overlapping batches at once, over keys whose stale reservations
/// have expired: no deadlock, and every key ends reserved by exactly one reserver.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn overlapping_releases_and_reserves_never_deadlock() {
    let Some(url) = database_url() else { return };
    const TASKS: usize = 16;
    const KEYS: usize = 30;
    let store = PostgresStore::new(pool(&url, TASKS, &unique("idem_release_race")))
        .table(CONFORMANCE_TABLE)
        .unwrap()
        .timeout(Duration::from_secs(30));
    store.migrate().await.unwrap();
    let prefix = unique("release-race");
    for round in 0..10 {
        let keys: Vec<String> = (0..KEYS)
            .map(|i| format!("{prefix}:{round}:{i:02}"))
            .collect();
        let requests: Vec<(&str, Fingerprint)> =
            keys.iter().map(|key| (key.as_str(), fp(2))).collect();
        // Stale reservations: a zero lease has expired by the time anyone looks.
        let stale: Arc<Vec<(String, Token)>> = Arc::new(
            store
                .reserve_many(&requests, Duration::ZERO)
                .await
                .unwrap()
                .into_iter()
                .zip(&keys)
                .map(|(answer, key)| match answer {
                    Ok(Reservation::Reserved { token }) => (key.clone(), token),
                    other => panic!("a fresh key was not reserved: {other:?}"),
                })
                .collect(),
        );
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let (store, stale, barrier) =
                    (store.clone(), Arc::clone(&stale), Arc::clone(&barrier));
                tokio::spawn(async move {
                    let mut mine: Vec<(&str, Token)> = stale
                        .iter()
                        .map(|(key, token)| (key.as_str(), *token))
                        .collect();
                    mine.rotate_left(t * 3 % KEYS);
                    if t % 2 == 1 {
                        mine.reverse();
                    }
                    barrier.wait().await;
                    if t % 2 == 0 {
                        store
                            .release_many(&mine)
                            .await
                            .unwrap_or_else(|e| panic!("release task {t}: {e}"));
                        return Vec::new();
                    }
                    let requests: Vec<(&str, Fingerprint)> =
                        mine.iter().map(|(key, _)| (*key, fp(1))).collect();
                    let answers = store
                        .reserve_many(&requests, LEASE)
                        .await
                        .unwrap_or_else(|e| panic!("reserve task {t}: {e}"));
                    answers
                        .into_iter()
                        .zip(mine)
                        .filter_map(|(answer, (key, _))| match answer {
                            Ok(Reservation::Reserved { .. }) => Some(key.to_owned()),
                            Ok(Reservation::Held { .. }) => None,
                            Ok(other) => panic!("unexpected reservation {other:?}"),
                            Err(e) => panic!("reserve task {t}, key {key}: {e}"),
                        })
                        .collect()
                })
            })
            .collect();
        let mut reserved = Vec::new();
        for task in tasks {
            reserved.extend(task.await.expect("a batch task failed"));
        }
        reserved.sort();
        assert_eq!(
            reserved, keys,
            "round {round}: each key reserved exactly once"
        );
    }
    forget(&url, &prefix).await;
}

/// A claim waiting for its send is a live holder to the admin operations: shown as claimed,
/// left alone by forget and resolve unless forced. Once its ttl passed it is not listed (its
/// message never went), while a pending row whose lease passed is; and `migrate` made the
/// partial index the listing reads.
#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn admin_sees_claims_as_live_holders_and_lists_only_lost_sends() {
    let Some(url) = database_url() else {
        return;
    };
    let table = TempTable::new(&url).await;
    let store = &table.store;
    let mut client = admin(&url).await;
    let tx = client.transaction().await.unwrap();
    let claim = Claim::new("ns:claimed", fp(1), Duration::from_millis(300));
    assert!(store.claim_in(&tx, &claim).await.unwrap());
    tx.commit().await.unwrap();

    let record = store.inspect("ns:claimed").await.unwrap().expect("claimed");
    assert_eq!(record.state, KeyState::Claimed);
    assert!(record.is_held_live());
    assert_eq!(
        store.forget("ns:claimed", Force::No).await.unwrap(),
        AdminOutcome::HeldByLiveSend
    );
    let delivered = Resolution::delivered(Receipt::new("m", "test"), LEASE);
    assert_eq!(
        store
            .resolve("ns:claimed", &delivered, Force::No)
            .await
            .unwrap(),
        AdminOutcome::HeldByLiveSend
    );

    let Reservation::Reserved { .. } = store
        .reserve("ns:lost", fp(1), Duration::from_millis(300))
        .await
        .unwrap()
    else {
        panic!("fresh key")
    };
    until_expired(store, &["ns:claimed", "ns:lost"]).await;
    let page = store.list(None, 10).await.unwrap();
    let keys: Vec<&str> = page.entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["ns:lost"]);
    assert!(page.entries[0].is_stale());
    assert!(page.next.is_none());

    let indexes: i64 = table
        .admin
        .query_one(
            "SELECT count(*) FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%WHERE%unknown%'",
            &[&store.table_name()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(indexes, 1, "the partial index on unknown outcomes");
    table.drop().await;
}

/// A row completed after its own pending row was gone does not know its first attempt: its
/// age is unknown, and a retake never takes it back.
#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn a_row_completed_without_its_pending_row_is_never_taken_back() {
    let Some(url) = database_url() else { return };
    let table = TempTable::new(&url).await;
    let store = &table.store;
    let outcome = Outcome::failed(SendError::unknown_delivery("provider.timeout", "timed out"));
    let window = Duration::from_secs(3600);
    assert!(
        store
            .complete("k", Token::new(), fp(1), &outcome, window)
            .await
            .unwrap()
    );
    assert_eq!(store.retake("k", fp(1), LEASE, window).await.unwrap(), None);
    match store.reserve("k", fp(1), LEASE).await.unwrap() {
        Reservation::Held { record } => {
            assert!(record.is_unknown_delivery());
            assert_eq!(record.first_attempt_age, None);
        }
        other => panic!("a kept outcome: {other:?}"),
    }
    table.drop().await;
}
