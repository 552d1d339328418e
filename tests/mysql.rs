//! `MySqlStore` against a real server (MariaDB here; the statements are MySQL 8's too): the
//! conformance suite, races across connections and through the layer, the connections of
//! `connect`'s pool kept between operations, claims in the caller's transaction and as one
//! statement bound as diesel binds it (diesel's MySQL backend needs libmysqlclient, so
//! mysql_async runs it), corrupt rows, expiry by the server's clock whatever the session's
//! time zone, purges and the batch statements.
//!
//! Runs against `MYSQL_URL`, else `mysql://root@127.0.0.1:3306/test`; reported as ignored when
//! neither answered as the suite was built (see `support::stores`).
#![cfg(feature = "mysql")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use mysql_async::prelude::Queryable;
use mysql_async::{OptsBuilder, Pool, TxOpts};
use tower::{Layer, ServiceExt};

use support::Provider;
use support::claims::{alert, layer, the_send_takes_the_claim_once};
use support::stores::mysql_admin::{admin, drop_table};
use support::stores::{backend_url, broken_records, fp, unique, until_expired};
use tower_idempotency::MySqlStore;
use tower_idempotency::outcome::{Outcome, Receipt};
use tower_idempotency::store::conformance::Conformance;
use tower_idempotency::store::{
    ClaimParam, ClaimStatement, Completion, RecordState, Reservation, Store, StoreErrorKind,
    WaitingClaim,
};

/// The table the conformance cases share; each case uses its own random key prefix.
const CONFORMANCE_TABLE: &str = "idem_conformance";

const LEASE: Duration = Duration::from_secs(60);

fn mysql_url() -> Option<String> {
    backend_url("MYSQL_URL")
}

/// A store on a fresh table of the test's own.
async fn fresh_store(url: &str, test: &str) -> MySqlStore {
    let store = MySqlStore::connect(url)
        .await
        .expect("connect")
        .table(&unique(test))
        .expect("valid table name");
    store.migrate().await.expect("migrate");
    store
}

mod mysql_conformance {
    use super::*;

    async fn suite() -> Option<Conformance> {
        let url = mysql_url()?;
        let store = MySqlStore::connect(&url)
            .await
            .expect("connect")
            .table(CONFORMANCE_TABLE)
            .expect("valid table name");
        store.migrate().await.expect("migrate");
        // Rows earlier runs left, not the stale pending rows of cases running now.
        let pool = admin(&url);
        let mut conn = pool.get_conn().await.expect("admin connection");
        conn.query_drop(format!(
            "DELETE FROM {CONFORMANCE_TABLE} \
             WHERE expires_at < UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE"
        ))
        .await
        .expect("delete old rows");
        // A lease of 3 s, as for PostgreSQL: the whole suite shares two cores.
        Some(Conformance::with_admin(store).lease(Duration::from_secs(3)))
    }

    tower_idempotency::store_conformance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[cfg_attr(
            not(backend_mysql),
            ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
        )]
        suite()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn concurrent_reserves_across_connections_reserve_once() {
    let Some(url) = mysql_url() else { return };
    let store = fresh_store(&url, "idem_race").await;
    // Fresh keys, then keys whose rows expired: the insert and the compare-and-set each race.
    for round in 0..2 {
        let key = format!("race-{round}");
        if round == 1 {
            let Reservation::Reserved { .. } = store
                .reserve(&key, fp(1), Duration::from_millis(1))
                .await
                .unwrap()
            else {
                panic!("a fresh key is reserved");
            };
            until_expired(&store, &[&key]).await;
        }
        let barrier = Arc::new(tokio::sync::Barrier::new(24));
        let tasks: Vec<_> = (0..24)
            .map(|_| {
                let store = store.clone();
                let key = key.clone();
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
                Ok(Reservation::Held { record }) => {
                    assert_eq!(record.state, RecordState::Pending);
                }
                Ok(other) => panic!("unexpected reservation {other:?}"),
                Err(e) => panic!("reserve failed under the race: {e}"),
            }
        }
        assert_eq!(reserved, 1, "round {round}");
    }
    drop_table(&url, store.table_name()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn many_tasks_sending_under_one_key_send_once_through_the_layer() {
    let Some(url) = mysql_url() else { return };
    let store = fresh_store(&url, "idem_layer_race").await;
    // Two layers on two pools: two processes, as far as the server can tell.
    let other = MySqlStore::new(admin(&url))
        .table(store.table_name())
        .unwrap();
    let (first, second) = (layer(store.clone()), layer(other.clone()));
    let provider = Provider::ok();
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let sends = (0..32).map(|i| {
        let service = if i % 2 == 0 { &first } else { &second }.layer(provider.clone());
        let barrier = Arc::clone(&barrier);
        tokio::spawn(async move {
            barrier.wait().await;
            service.oneshot(alert("sold")).await
        })
    });
    let answers: Vec<_> = join_all(sends)
        .await
        .into_iter()
        .map(|joined| joined.expect("task panicked"))
        .collect();
    assert_eq!(provider.calls(), 1, "one send reached the provider");
    let sent = answers
        .iter()
        .filter(|a| a.as_ref().is_ok_and(|r| !r.replayed))
        .count();
    assert_eq!(sent, 1);
    for answer in &answers {
        if let Err(e) = answer {
            assert_eq!(e.code(), "idempotency.in_flight", "{e}");
        }
    }
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn a_claim_rolls_back_with_the_callers_transaction() {
    let Some(url) = mysql_url() else { return };
    let store = fresh_store(&url, "idem_claim_rollback").await;
    let layer = layer(store.clone());
    let claim = layer.claim(&alert("sold")).unwrap().expect("keyed");
    let pool = admin(&url);
    let mut tx = pool.start_transaction(TxOpts::default()).await.unwrap();
    assert!(store.claim_in(&mut tx, &claim).await.unwrap());
    tx.rollback().await.unwrap();
    assert!(store.claims(10).await.unwrap().is_empty());

    let provider = Provider::ok();
    layer
        .layer(provider.clone())
        .oneshot(alert("sold"))
        .await
        .unwrap();
    assert_eq!(provider.calls(), 1);
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn a_claim_left_by_a_crash_before_the_send_is_found_and_sent_once() {
    let Some(url) = mysql_url() else { return };
    let store = fresh_store(&url, "idem_claim_crash").await;
    let layer = layer(store.clone());
    let message = alert("sold");
    let claim = layer.claim(&message).unwrap().unwrap();
    let pool = admin(&url);
    let mut tx = pool.start_transaction(TxOpts::default()).await.unwrap();
    tx.exec_drop("SELECT 1", ()).await.unwrap();
    assert!(store.claim_in(&mut tx, &claim).await.unwrap());
    tx.commit().await.unwrap();
    // The process dies here, before the send. The next run finds the claim …
    assert_eq!(
        store.claims(10).await.unwrap(),
        [WaitingClaim::new(claim.key.clone(), claim.fingerprint)]
    );
    // … and sends the same message under the same key: once.
    let provider = Provider::ok();
    let service = layer.layer(provider.clone());
    let first = service.clone().oneshot(message.clone()).await.unwrap();
    assert!(!first.replayed);
    assert!(
        store.claims(10).await.unwrap().is_empty(),
        "the send took it"
    );
    let again = service.oneshot(message).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.id, first.id);
    assert_eq!(provider.calls(), 1);

    // A claim of a key already sent writes nothing; on a plain connection too.
    let mut conn = pool.get_conn().await.unwrap();
    assert!(!store.claim_in(&mut conn, &claim).await.unwrap());
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn another_message_under_a_claimed_key_is_key_reused_and_not_sent() {
    let Some(url) = mysql_url() else { return };
    let store = fresh_store(&url, "idem_claim_reused").await;
    let layer = layer(store.clone());
    let claim = layer.claim(&alert("sold")).unwrap().unwrap();
    let pool = admin(&url);
    let mut tx = pool.start_transaction(TxOpts::default()).await.unwrap();
    assert!(store.claim_in(&mut tx, &claim).await.unwrap());
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
        [WaitingClaim::new(claim.key.clone(), claim.fingerprint)]
    );
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn connects_pool_keeps_its_connections_open_and_unreset_between_operations() {
    let Some(url) = mysql_url() else { return };
    let store = fresh_store(&url, "idem_pool_reuse").await;
    for n in 0..20 {
        let key = format!("pool-{n}");
        let Reservation::Reserved { token } = store.reserve(&key, fp(1), LEASE).await.unwrap()
        else {
            panic!("a fresh key is reserved");
        };
        let sent = Outcome::sent(Receipt::new("msg", "fake"));
        assert!(
            store
                .complete(&key, token, fp(1), &sent, LEASE)
                .await
                .unwrap()
        );
    }
    // Closing a connection as it comes back, or resetting it (a round trip, and its prepared
    // statements gone), would each be counted here.
    let metrics = store.pool().metrics();
    let closed = metrics
        .discarded_superfluous_connection
        .load(std::sync::atomic::Ordering::Relaxed);
    let reset = metrics
        .resetting_connection
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!((closed, reset), (0, 0));
    drop_table(&url, store.table_name()).await;
}

/// Runs `statement` on `conn` with each parameter bound as its `ClaimParam` names, as diesel's
/// `sql_query(..).bind::<T, _>(..)` sends them (diesel's MySQL backend needs libmysqlclient,
/// which the tests do without): the count of rows MySQL reports.
async fn execute_as_diesel(conn: &mut impl Queryable, statement: &ClaimStatement) -> u64 {
    let params: Vec<mysql_async::Value> = statement
        .params()
        .iter()
        .map(|param| match param {
            ClaimParam::Text(text) => text.as_str().into(),
            ClaimParam::Bytes(bytes) => bytes.clone().into(),
            ClaimParam::BigInt(n) => (*n).into(),
            other => panic!("a claim parameter of no known type: {other:?}"),
        })
        .collect();
    let result = conn
        .exec_iter(statement.sql(), params)
        .await
        .expect("the claim runs");
    let count = result.affected_rows();
    result.drop_result().await.expect("no rows");
    count
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn the_claim_statement_bound_as_diesel_binds_it_commits_a_claim_the_send_takes() {
    let Some(url) = mysql_url() else { return };
    let store = fresh_store(&url, "idem_claim_statement").await;
    let layer = layer(store.clone());
    let claim = layer.claim(&alert("sold")).unwrap().unwrap();
    let pool = admin(&url);

    // Rolled back: nothing.
    let mut tx = pool.start_transaction(TxOpts::default()).await.unwrap();
    assert_eq!(
        execute_as_diesel(&mut tx, &store.claim_statement(&claim)).await,
        1
    );
    tx.rollback().await.unwrap();
    assert!(store.claims(10).await.unwrap().is_empty());

    // Committed: the claim waits; a second statement leaves it as it is, and counts 0, or 1
    // on a connection that counts matched rows (diesel's, sqlx's).
    let mut tx = pool.start_transaction(TxOpts::default()).await.unwrap();
    assert_eq!(
        execute_as_diesel(&mut tx, &store.claim_statement(&claim)).await,
        1
    );
    tx.commit().await.unwrap();
    let waiting = [WaitingClaim::new(claim.key.clone(), claim.fingerprint)];
    assert_eq!(store.claims(10).await.unwrap(), waiting);
    let mut conn = pool.get_conn().await.unwrap();
    assert_eq!(
        execute_as_diesel(&mut conn, &store.claim_statement(&claim)).await,
        0
    );
    let found_rows = Pool::new(
        OptsBuilder::from_opts(mysql_async::Opts::from_url(&url).unwrap()).client_found_rows(true),
    );
    let mut counting_matches = found_rows.get_conn().await.unwrap();
    let other = layer.claim(&alert("a different text")).unwrap().unwrap();
    assert_eq!(
        execute_as_diesel(&mut counting_matches, &store.claim_statement(&other)).await,
        1
    );
    assert_eq!(store.claims(10).await.unwrap(), waiting, "left as it was");

    // An expired claim is replaced (MySQL counts 2), by the other message's.
    conn.exec_drop(
        format!(
            "UPDATE `{}` SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND",
            store.table_name()
        ),
        (),
    )
    .await
    .unwrap();
    assert!(store.claims(10).await.unwrap().is_empty(), "expired");
    assert_eq!(
        execute_as_diesel(&mut counting_matches, &store.claim_statement(&other)).await,
        2
    );
    assert_eq!(
        store.claims(10).await.unwrap(),
        [WaitingClaim::new(other.key.clone(), other.fingerprint)]
    );
    // And back to the first message's, which the send then takes.
    conn.exec_drop(
        format!(
            "UPDATE `{}` SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND",
            store.table_name()
        ),
        (),
    )
    .await
    .unwrap();
    assert_eq!(
        execute_as_diesel(&mut conn, &store.claim_statement(&claim)).await,
        2
    );
    drop((conn, counting_matches));
    found_rows.disconnect().await.unwrap();

    the_send_takes_the_claim_once(&layer).await;
    assert!(
        store.claims(10).await.unwrap().is_empty(),
        "the send took it"
    );
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn expiry_follows_the_servers_utc_clock_whatever_the_sessions_time_zone() {
    let Some(url) = mysql_url() else { return };
    let store = fresh_store(&url, "idem_time_zone").await;
    // Two sessions fourteen hours apart: a DATETIME written by `NOW()` in one would read as
    // long expired, or far from expiring, in the other.
    let zoned = |zone: &str| {
        let opts = OptsBuilder::from_opts(mysql_async::Opts::from_url(&url).unwrap())
            .init(vec![format!("SET time_zone = '{zone}'")]);
        MySqlStore::new(Pool::new(opts))
            .table(store.table_name())
            .unwrap()
    };
    let (east, west) = (zoned("+07:00"), zoned("-07:00"));
    let Reservation::Reserved { token } = east.reserve("k", fp(1), LEASE).await.unwrap() else {
        panic!("a fresh key is reserved");
    };
    match west.reserve("k", fp(1), LEASE).await.unwrap() {
        Reservation::Held { record } => assert_eq!(record.state, RecordState::Pending),
        other => panic!("a live lease read from another zone: {other:?}"),
    }
    assert!(west.extend("k", token, LEASE).await.unwrap());
    let short = Duration::from_millis(200);
    assert!(west.extend("k", token, short).await.unwrap());
    until_expired(&west, &["k"]).await;
    assert!(
        matches!(
            east.reserve("k", fp(1), LEASE).await.unwrap(),
            Reservation::TakenOver { .. }
        ),
        "a lease set from -07:00 ends for +07:00 when it ends"
    );
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn rows_that_break_the_record_rules_are_corrupt_never_a_panic() {
    let Some(url) = mysql_url() else { return };
    let store = fresh_store(&url, "idem_corrupt").await;
    let pool = admin(&url);
    let mut conn = pool.get_conn().await.unwrap();
    let insert = format!(
        "INSERT INTO {} (`key`, state, token, fingerprint, outcome, expires_at) \
         VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
        store.table_name()
    );
    let mut planted = broken_records::PARTS
        .iter()
        .map(|(name, state, outcome)| (name.to_string(), *state, vec![7u8; 32], *outcome))
        .collect::<Vec<_>>();
    planted.push((
        "short-fingerprint".into(),
        "done",
        vec![7; 5],
        broken_records::RECEIPT,
    ));
    planted.push((
        "unknown-state".into(),
        "lost",
        vec![7; 32],
        broken_records::RECEIPT,
    ));
    planted.push((
        "not-an-outcome".into(),
        "done",
        vec![7; 32],
        r#"{"what":1}"#,
    ));
    for (name, state, fingerprint, outcome) in planted {
        conn.exec_drop(&insert, (&name, state, vec![1u8; 16], fingerprint, outcome))
            .await
            .unwrap();
        let err = store.reserve(&name, fp(7), LEASE).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{name}: {err}");
        let fresh = format!("{name}-fresh");
        let answers = store
            .reserve_many(&[(&name, fp(7)), (&fresh, fp(7))], LEASE)
            .await
            .expect("the batch as a whole succeeds");
        assert!(
            matches!(&answers[0], Err(e) if e.kind() == StoreErrorKind::Corrupt),
            "{name}: {:?}",
            answers[0]
        );
        assert!(matches!(answers[1], Ok(Reservation::Reserved { .. })));
    }
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn purge_deletes_expired_rows_in_batches_and_keeps_live_ones() {
    let Some(url) = mysql_url() else { return };
    let store = fresh_store(&url, "idem_purge").await.purge_batch(2);
    for i in 0..5 {
        store
            .reserve(&format!("short-{i}"), fp(1), Duration::from_millis(1))
            .await
            .unwrap();
    }
    let Reservation::Reserved { token } = store.reserve("live", fp(1), LEASE).await.unwrap() else {
        panic!("a fresh key is reserved");
    };
    until_expired(
        &store,
        &["short-0", "short-1", "short-2", "short-3", "short-4"],
    )
    .await;
    assert_eq!(store.purge_expired().await.unwrap(), 5);
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    // The purged keys are free, with nothing to report as taken over; the live one is held.
    assert!(matches!(
        store.reserve("short-0", fp(1), LEASE).await.unwrap(),
        Reservation::Reserved { .. }
    ));
    assert!(store.release("live", token).await.unwrap());
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn keys_differing_only_in_case_or_trailing_spaces_are_different_keys() {
    let Some(url) = mysql_url() else { return };
    let store = fresh_store(&url, "idem_collation").await;
    for key in ["Key", "key", "key ", "kéy", "ke\u{301}y"] {
        assert!(
            matches!(
                store.reserve(key, fp(1), LEASE).await.unwrap(),
                Reservation::Reserved { .. }
            ),
            "{key:?} is a key of its own"
        );
    }
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn bad_calls_are_refused_before_any_statement() {
    let Some(url) = mysql_url() else { return };
    let store = fresh_store(&url, "idem_bad_calls").await;
    let long = "k".repeat(1025);
    let err = store.reserve(&long, fp(1), LEASE).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::InvalidInput);
    let err = store
        .reserve_many(&[("a", fp(1)), ("a", fp(2))], LEASE)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::InvalidInput);
    let sent = Outcome::sent(Receipt::new("m", "test"));
    let token = tower_idempotency::store::Token::new();
    let twice = [
        Completion {
            key: "a",
            token,
            fingerprint: fp(1),
            outcome: &sent,
        },
        Completion {
            key: "a",
            token,
            fingerprint: fp(1),
            outcome: &sent,
        },
    ];
    let err = store.complete_many(&twice, LEASE).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::InvalidInput);
    // Nothing was written by any of them.
    assert!(matches!(
        store.reserve("a", fp(1), LEASE).await.unwrap(),
        Reservation::Reserved { .. }
    ));

    let missing = MySqlStore::connect(&url)
        .await
        .unwrap()
        .table(&unique("idem_never_migrated"))
        .unwrap();
    let err = missing.reserve("a", fp(1), LEASE).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unavailable);
    assert!(err.to_string().contains("migrate"), "{err}");
    drop_table(&url, store.table_name()).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn batches_write_what_the_single_operations_would_key_by_key() {
    let Some(url) = mysql_url() else { return };
    let store = fresh_store(&url, "idem_batches").await;
    let short = Duration::from_millis(1);
    let reserved = |answer: Reservation| match answer {
        Reservation::Reserved { token } | Reservation::TakenOver { token, .. } => token,
        other => panic!("not reserved: {other:?}"),
    };
    let own = reserved(store.reserve("own", fp(1), LEASE).await.unwrap());
    let _other = reserved(store.reserve("other", fp(1), LEASE).await.unwrap());
    let stale = reserved(store.reserve("stale", fp(1), short).await.unwrap());
    let _expired = reserved(store.reserve("expired", fp(1), short).await.unwrap());
    // A claim of the message the batch sends: a reserve takes it.
    let claim = tower_idempotency::store::Claim::new("claimed", fp(1), LEASE);
    let pool = admin(&url);
    let mut conn = pool.get_conn().await.unwrap();
    assert!(store.claim_in(&mut conn, &claim).await.unwrap());
    until_expired(&store, &["stale", "expired"]).await;

    // reserve_many: a free key, a live one, an expired one, a claim of the same message.
    let answers = store
        .reserve_many(
            &[
                ("free", fp(1)),
                ("own", fp(1)),
                ("expired", fp(1)),
                ("claimed", fp(1)),
            ],
            LEASE,
        )
        .await
        .unwrap();
    let answers: Vec<Reservation> = answers.into_iter().map(Result::unwrap).collect();
    assert!(matches!(answers[0], Reservation::Reserved { .. }));
    assert!(
        matches!(&answers[1], Reservation::Held { record } if record.state == RecordState::Pending)
    );
    assert!(
        matches!(&answers[2], Reservation::TakenOver { previous, .. } if previous.state == RecordState::Pending)
    );
    assert!(matches!(answers[3], Reservation::Reserved { .. }));

    // complete_many: its own key, a key with no row, another token's live key, and a stale
    // token over an expired row that nobody took: written, written, refused, written.
    let sent = Outcome::sent(Receipt::new("m", "test"));
    let completions = [
        Completion {
            key: "own",
            token: own,
            fingerprint: fp(1),
            outcome: &sent,
        },
        Completion {
            key: "nothing",
            token: own,
            fingerprint: fp(1),
            outcome: &sent,
        },
        Completion {
            key: "other",
            token: own,
            fingerprint: fp(1),
            outcome: &sent,
        },
        Completion {
            key: "stale",
            token: stale,
            fingerprint: fp(1),
            outcome: &sent,
        },
    ];
    assert_eq!(
        store.complete_many(&completions, LEASE).await.unwrap(),
        [true, true, false, true]
    );
    for key in ["own", "nothing", "stale"] {
        match store.reserve(key, fp(1), LEASE).await.unwrap() {
            Reservation::Held { record } => {
                assert_eq!(record.state, RecordState::Done, "{key}");
                assert_eq!(record.outcome.unwrap().receipt().unwrap().id, "m");
            }
            other => panic!("{key}: {other:?}"),
        }
    }

    // release_many: only the pending rows of the given tokens go.
    let free = reserved(answers[0].clone());
    assert_eq!(
        store
            .release_many(&[("free", free), ("own", own), ("other", own)])
            .await
            .unwrap(),
        [true, false, false]
    );
    drop(conn);
    drop_table(&url, store.table_name()).await;
}

/// The store bounds its own calls by its timeout, as it reports to the layer (which then
/// sets no timer of its own): a complete waiting on a row another transaction holds locked
/// fails as timed out at the store's bound, long before MariaDB's lock wait would end.
#[tokio::test]
#[cfg_attr(
    not(backend_mysql),
    ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
)]
async fn an_operation_past_its_timeout_fails_with_a_timeout_error() {
    let Some(url) = mysql_url() else { return };
    let bound = Duration::from_millis(300);
    let store = fresh_store(&url, "idem_timeout").await.timeout(bound);
    assert_eq!(store.call_timeout(), Some(bound));
    let key = unique("timeout");
    let token = match store.reserve(&key, fp(1), Duration::from_secs(60)).await {
        Ok(Reservation::Reserved { token }) => token,
        other => panic!("a fresh key is reserved: {other:?}"),
    };
    let pool = admin(&url);
    let mut tx = pool.start_transaction(TxOpts::default()).await.unwrap();
    let lock = format!(
        "SELECT 1 FROM `{}` WHERE `key` = ? FOR UPDATE",
        store.table_name()
    );
    tx.exec_drop(lock, (key.as_bytes(),)).await.unwrap();
    let outcome = Outcome::sent(Receipt::new("m", "test"));
    let error = store
        .complete(&key, token, fp(1), &outcome, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Timeout, "{error}");
    tx.rollback().await.unwrap();
    drop_table(&url, store.table_name()).await;
}
