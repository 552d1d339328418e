//! `RedisStore` against a real server: the conformance suite on one node (`REDIS_URL`) and on a
//! cluster (`REDIS_CLUSTER_URLS`, comma separated; `.ci/redis-cluster.sh` starts one), plus
//! races across connections, corrupt values and connections killed under the store.
#![cfg(all(feature = "redis", feature = "test-util"))]

mod support;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use support::poll_until;
use support::servers::RedisServer;
use support::stores::redis_admin::admin;
use support::stores::{backend_url, broken_records, fp, unique_prefix, until_expired};
use tower_idempotency::RedisStore;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::{Outcome, Receipt, SendError};
use tower_idempotency::store::admin::{AdminOutcome, Cursor, Force, Resolution, StoreAdmin};
use tower_idempotency::store::conformance::Conformance;
use tower_idempotency::store::{
    Completion, RecordState, Reservation, Store, StoreError, StoreErrorKind, Token,
};

const LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(60);

/// Writes `value` under the store's key, as something other than the store would.
async fn plant(url: &str, redis_key: &str, value: &[u8]) {
    let mut admin = admin(url).await;
    let () = redis::cmd("SET")
        .arg(redis_key)
        .arg(value)
        .arg("PX")
        .arg(60_000)
        .query_async(&mut admin)
        .await
        .expect("plant a value");
}

async fn raw_get(url: &str, redis_key: &str) -> Option<Vec<u8>> {
    let mut admin = admin(url).await;
    redis::cmd("GET")
        .arg(redis_key)
        .query_async(&mut admin)
        .await
        .expect("GET")
}

mod single_node_conformance {
    use super::*;

    async fn suite() -> Option<Conformance> {
        let url = backend_url("REDIS_URL")?;
        let store = RedisStore::connect(&url)
            .await
            .expect("connect to REDIS_URL")
            .key_prefix(unique_prefix("conformance"));
        Some(Conformance::with_admin(store))
    }

    tower_idempotency::store_conformance_tests!(
        #[tokio::test]
        #[cfg_attr(
            not(backend_redis),
            ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
        )]
        suite()
    );
}

#[cfg(feature = "redis-cluster")]
mod cluster_conformance {
    use super::*;

    async fn suite() -> Option<Conformance> {
        let urls = backend_url("REDIS_CLUSTER_URLS")?;
        let store = RedisStore::connect_cluster(urls.split(','))
            .await
            .expect("connect to REDIS_CLUSTER_URLS")
            .key_prefix(unique_prefix("cluster-conformance"));
        Some(Conformance::with_admin(store))
    }

    tower_idempotency::store_conformance_tests!(
        #[tokio::test]
        #[cfg_attr(
            not(backend_redis_cluster),
            ignore = "no Redis Cluster at REDIS_CLUSTER_URLS or 127.0.0.1:7001-7003"
        )]
        suite()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn racing_reserves_on_separate_connections_reserve_once() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    const TASKS: usize = 64;
    let prefix = unique_prefix("race");
    let mut stores = Vec::with_capacity(TASKS);
    for _ in 0..TASKS {
        // Each its own store and ConnectionManager, so its own TCP connection.
        stores.push(
            RedisStore::connect(&url)
                .await
                .expect("connect")
                .key_prefix(prefix.clone()),
        );
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
    let tasks: Vec<_> = stores
        .into_iter()
        .map(|store| {
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                store.reserve("one-key", fp(1), LEASE).await
            })
        })
        .collect();
    let mut reserved = 0;
    for task in tasks {
        match task.await.expect("no panic") {
            Ok(Reservation::Reserved { .. }) => reserved += 1,
            Ok(Reservation::Held { record }) => {
                assert_eq!(record.state, RecordState::Pending);
                assert_eq!(record.fingerprint, fp(1));
            }
            Ok(other) => panic!("unexpected reservation {other:?}"),
            Err(e) => panic!("reserve failed: {e}"),
        }
    }
    assert_eq!(reserved, 1, "{TASKS} connections raced for one key");
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn two_store_instances_see_each_others_keys() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let prefix = unique_prefix("shared");
    let a = RedisStore::connect(&url)
        .await
        .unwrap()
        .key_prefix(prefix.clone());
    let b = RedisStore::connect(&url).await.unwrap().key_prefix(prefix);

    let Reservation::Reserved { token } = a.reserve("k", fp(1), LEASE).await.unwrap() else {
        panic!("fresh key held")
    };
    let Reservation::Held { record } = b.reserve("k", fp(1), LEASE).await.unwrap() else {
        panic!("b reserved a's key")
    };
    assert_eq!(record.state, RecordState::Pending);
    assert!(
        !b.release("k", Token::new()).await.unwrap(),
        "b holds no token"
    );

    let outcome = Outcome::sent(Receipt::new("msg-a", "test"));
    assert!(a.complete("k", token, fp(1), &outcome, TTL).await.unwrap());
    let Reservation::Held { record } = b.reserve("k", fp(1), LEASE).await.unwrap() else {
        panic!("b reserved a done key")
    };
    assert_eq!(record.state, RecordState::Done);
    assert_eq!(record.outcome.unwrap().replay().unwrap().id, "msg-a");
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn different_prefixes_do_not_share_keys() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let a = RedisStore::connect(&url)
        .await
        .unwrap()
        .key_prefix(unique_prefix("a"));
    let b = a.clone().key_prefix(unique_prefix("b"));
    assert!(matches!(
        a.reserve("k", fp(1), LEASE).await.unwrap(),
        Reservation::Reserved { .. }
    ));
    assert!(matches!(
        b.reserve("k", fp(1), LEASE).await.unwrap(),
        Reservation::Reserved { .. }
    ));
}

async fn assert_corrupt_everywhere(url: &str, test: &str, value: &[u8]) {
    let prefix = unique_prefix(test);
    let store = RedisStore::connect(url)
        .await
        .unwrap()
        .key_prefix(prefix.clone());
    let redis_key = format!("{prefix}k");
    plant(url, &redis_key, value).await;

    let err = store.reserve("k", fp(1), LEASE).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "reserve: {err}");
    let outcome = Outcome::sent(Receipt::new("m", "test"));
    let err = store
        .complete("k", Token::new(), fp(1), &outcome, TTL)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "complete: {err}");
    let err = store.release("k", Token::new()).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "release: {err}");
    let err = store.extend("k", Token::new(), LEASE).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "extend: {err}");
    assert_eq!(
        raw_get(url, &redis_key).await.as_deref(),
        Some(value),
        "the value was left as it is"
    );
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn garbage_under_a_key_is_corrupt_and_left_alone() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    for (i, value) in [
        &b"garbage"[..],
        b"",
        b"\xff\xfe\x00",
        b"null",
        b"42",
        b"[1,2]",
        br#"{"state":"pending"}"#,
        br#"{"state":"pending","token":5,"fingerprint":"00"}"#,
    ]
    .into_iter()
    .enumerate()
    {
        assert_corrupt_everywhere(&url, &format!("garbage-{i}"), value).await;
    }
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn a_record_the_store_cannot_use_is_corrupt_on_reserve() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let prefix = unique_prefix("bad-record");
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .key_prefix(prefix.clone());
    let token = Token::new();
    let cases = [
        // Done without an outcome: there is nothing to replay.
        format!("\x02D{token}{},\n", fp(1)),
        // A state the store does not know.
        format!("\x02S{token}{},\n", fp(1)),
        // A fingerprint that is not 32 bytes of hex.
        format!("\x02P{token}{}1,1\n", "z".repeat(64)),
    ];
    for (i, value) in cases.iter().enumerate() {
        let key = format!("k{i}");
        plant(&url, &format!("{prefix}{key}"), value.as_bytes()).await;
        let err = store.reserve(&key, fp(1), LEASE).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{value}: {err}");
        // The scripts read only the token: its holder may still overwrite or, if pending,
        // release it; another token may not.
        let outcome = Outcome::sent(Receipt::new("m", "test"));
        assert!(
            !store
                .complete(&key, Token::new(), fp(1), &outcome, TTL)
                .await
                .unwrap()
        );
        assert!(!store.release(&key, Token::new()).await.unwrap());
    }
    // The holder's complete repairs a done record without an outcome.
    let outcome = Outcome::sent(Receipt::new("repaired", "test"));
    assert!(
        store
            .complete("k0", token, fp(1), &outcome, TTL)
            .await
            .unwrap()
    );
    let Reservation::Held { record } = store.reserve("k0", fp(1), LEASE).await.unwrap() else {
        panic!("done key reserved")
    };
    assert_eq!(record.outcome.unwrap().replay().unwrap().id, "repaired");
}

/// Point 5 of the store contract: a record that decodes but breaks the record rules (a
/// pending record with an outcome, a failure of category delivered) is corrupt here as on
/// every store, on a single reserve and in its own entry of a batch, and is left as it is.
#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn a_record_that_breaks_the_record_rules_is_corrupt_like_on_every_store() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let prefix = unique_prefix("broken-record");
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .key_prefix(prefix.clone());
    let token = Token::new().to_string();
    let fingerprint = fp(1).to_string();
    for (name, state, outcome) in broken_records::PARTS {
        let value = broken_records::whole(state, &token, &fingerprint, outcome);
        let redis_key = format!("{prefix}{name}");
        plant(&url, &redis_key, value.as_bytes()).await;

        let err = store.reserve(name, fp(1), LEASE).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{name}: {err}");
        let fresh = format!("{name}-fresh");
        let answers = store
            .reserve_many(&[(name, fp(1)), (&fresh, fp(1))], LEASE)
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
        assert_eq!(
            raw_get(&url, &redis_key).await.as_deref(),
            Some(value.as_bytes()),
            "{name}: the value was left as it is"
        );
    }
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn a_key_of_another_redis_type_is_corrupt() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let prefix = unique_prefix("wrongtype");
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .key_prefix(prefix.clone());
    let mut admin = admin(&url).await;
    let redis_key = format!("{prefix}k");
    let () = redis::pipe()
        .cmd("RPUSH")
        .arg(&redis_key)
        .arg("x")
        .ignore()
        .cmd("PEXPIRE")
        .arg(&redis_key)
        .arg(60_000)
        .ignore()
        .query_async(&mut admin)
        .await
        .unwrap();

    let err = store.reserve("k", fp(1), LEASE).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "reserve: {err}");
    let outcome = Outcome::sent(Receipt::new("m", "test"));
    let err = store
        .complete("k", Token::new(), fp(1), &outcome, TTL)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "complete: {err}");
    let err = store.release("k", Token::new()).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "release: {err}");
    let err = store.extend("k", Token::new(), LEASE).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "extend: {err}");
    let len: i64 = redis::cmd("LLEN")
        .arg(&redis_key)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(len, 1, "the list was left as it is");
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn zero_and_huge_leases_and_ttls_are_clamped_not_refused() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let prefix = unique_prefix("clamp");
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .key_prefix(prefix.clone());
    let mut admin = admin(&url).await;
    let outcome = Outcome::sent(Receipt::new("m", "test"));
    for (name, d) in [("zero", Duration::ZERO), ("max", Duration::MAX)] {
        let key = format!("lease-{name}");
        let Reservation::Reserved { token } = store.reserve(&key, fp(1), d).await.unwrap() else {
            panic!("fresh key held")
        };
        // A zero lease is 1 ms, which may already have passed: either answer is fine, an
        // error is not.
        let extended = store.extend(&key, token, d).await.unwrap();
        assert!(extended || d == Duration::ZERO, "{key} extended");
        let done = format!("ttl-{name}");
        assert!(
            store
                .complete(&done, token, fp(1), &outcome, d)
                .await
                .unwrap()
        );
        if d == Duration::MAX {
            for key in [&key, &done] {
                let pttl: i64 = redis::cmd("PTTL")
                    .arg(format!("{prefix}{key}"))
                    .query_async(&mut admin)
                    .await
                    .unwrap();
                assert!(pttl > 0, "{key} has an expiry, {pttl}");
                // Leave nothing for 100 years.
                let _: i64 = redis::cmd("DEL")
                    .arg(format!("{prefix}{key}"))
                    .query_async(&mut admin)
                    .await
                    .unwrap();
            }
        }
    }
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn scripts_are_loaded_again_after_script_flush() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .key_prefix(unique_prefix("noscript"));
    let Reservation::Reserved { token } = store.reserve("k", fp(1), LEASE).await.unwrap() else {
        panic!("fresh key held")
    };
    // Other tests' EVALSHA recover the same way, so flushing under them is harmless.
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut admin(&url).await)
        .await
        .unwrap();
    assert!(store.extend("k", token, LEASE).await.unwrap());
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut admin(&url).await)
        .await
        .unwrap();
    assert!(store.release("k", token).await.unwrap());
}

/// The key outlives the lease by the time a pending record is kept (`kept_after_lease_ms` in
/// the record); extend moves the key's expiry, and the first attempt's time relative to it
/// so that its age stays, and changes nothing else in the record.
#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn extend_moves_the_lease_in_the_record_and_the_expiry_with_it() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let prefix = unique_prefix("extend-pttl");
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .key_prefix(prefix.clone());
    let redis_key = format!("{prefix}k");
    let Reservation::Reserved { token } = store.reserve("k", fp(1), LEASE).await.unwrap() else {
        panic!("fresh key held")
    };
    // The record's times: how long before its key's expiry the first attempt began, and how
    // long the record is kept after its lease.
    let times = |value: &[u8]| -> (i64, i64) {
        let text = std::str::from_utf8(&value[102..]).unwrap();
        let (times, _) = text.split_once('\n').expect("the times end the first line");
        let (first, kept) = times.split_once(',').unwrap();
        (first.parse().unwrap(), kept.parse().unwrap())
    };
    let before = raw_get(&url, &redis_key).await.expect("the pending record");
    let mut admin = admin(&url).await;
    let pttl = redis::cmd("PTTL").arg(&redis_key).clone();
    let kept = tower_idempotency::store::redis::DEFAULT_PENDING_KEPT.as_millis() as i64;
    let first: i64 = pttl.query_async(&mut admin).await.unwrap();
    assert!(first > kept && first <= kept + LEASE.as_millis() as i64);
    assert!(store.extend("k", token, LEASE * 10).await.unwrap());
    let moved: i64 = pttl.query_async(&mut admin).await.unwrap();
    assert!(
        moved > kept + LEASE.as_millis() as i64 * 9,
        "the key now lives about ten leases and the kept time from now, {moved} ms"
    );
    let after = raw_get(&url, &redis_key).await.expect("the pending record");
    let ((first_before, kept_before), (first_after, kept_after)) = (times(&before), times(&after));
    assert_eq!((kept_before, kept_after), (kept, kept));
    // The first attempt stays where it was: its age, the time before expiry less the time
    // left, is the same within the milliseconds between the reads.
    let (age_before, age_after) = (first_before - first, first_after - moved);
    assert!(
        (age_before..=age_before + 1_000).contains(&age_after),
        "the first attempt's age was {age_before} ms, is {age_after} ms"
    );
    assert_eq!(after[..102], before[..102], "nothing else changed");
    assert!(store.release("k", token).await.unwrap());
}

/// A TCP listener that accepts connections and never answers.
async fn silent_server() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (url, task)
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let (url, server) = silent_server().await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let manager = ConnectionManager::new_lazy_with_config(
        client,
        ConnectionManagerConfig::new().set_number_of_retries(0),
    )
    .unwrap();
    let store = RedisStore::new(manager).timeout(Duration::from_millis(200));
    // The bound the layer trusts in place of its own timer: kept, below.
    assert_eq!(store.call_timeout(), Some(Duration::from_millis(200)));
    let err = store.reserve("k", fp(1), LEASE).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err}");
    let outcome = Outcome::sent(Receipt::new("m", "test"));
    let err = store
        .complete("k", Token::new(), fp(1), &outcome, TTL)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err}");
    server.abort();
}

#[tokio::test]
async fn connecting_to_nothing_fails_with_a_store_error() {
    // A port nothing listens on: bind one, then free it.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let err = RedisStore::connect(&format!("redis://{addr}"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.kind(),
            StoreErrorKind::Unavailable | StoreErrorKind::Timeout
        ),
        "{err}"
    );
    let err = RedisStore::connect("not a url").await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Misconfigured, "{err}");
}

/// Runs `op` until it succeeds, at most `attempts` times, each bounded by the store's own
/// timeout; answers the errors seen on the way.
async fn eventually<T, F, Fut>(attempts: usize, mut op: F) -> (T, Vec<StoreError>)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut errors = Vec::new();
    for _ in 0..attempts {
        match op().await {
            Ok(value) => return (value, errors),
            Err(e) => errors.push(e),
        }
    }
    panic!("no success in {attempts} attempts: {errors:?}")
}

async fn client_id(manager: &ConnectionManager) -> Result<i64, StoreError> {
    redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut manager.clone())
        .await
        .map_err(StoreError::unavailable)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn operations_recover_by_themselves_after_the_connection_is_killed() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let client = redis::Client::open(url.as_str()).unwrap();
    let manager = ConnectionManager::new(client).await.unwrap();
    let store = RedisStore::new(manager.clone())
        .key_prefix(unique_prefix("killed"))
        .timeout(Duration::from_millis(500));
    let mut admin = admin(&url).await;
    let outcome = Outcome::sent(Receipt::new("m", "test"));

    let mut ids = Vec::new();
    for round in 0..5 {
        let (id, _) = eventually(20, || client_id(&manager)).await;
        ids.push(id);

        // Operations in flight while the connection dies.
        let in_flight: Vec<_> = (0..16)
            .map(|i| {
                let store = store.clone();
                let outcome = outcome.clone();
                tokio::spawn(async move {
                    let key = format!("flight-{round}-{i}");
                    match store.reserve(&key, fp(1), LEASE).await {
                        Ok(Reservation::Reserved { token }) => store
                            .complete(&key, token, fp(1), &outcome, TTL)
                            .await
                            .map(|_| ()),
                        Ok(Reservation::Held { .. }) => Ok(()),
                        Ok(other) => panic!("unexpected reservation {other:?}"),
                        Err(e) => Err(e),
                    }
                })
            })
            .collect();
        // Only the store's connection: other tests share this server. `SKIPME yes` spares
        // the admin connection whatever the filter.
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query_async(&mut admin)
            .await
            .unwrap();
        assert_eq!(
            killed, 1,
            "round {round}: the store's connection was killed"
        );
        let mut failed = 0;
        for task in in_flight {
            // Each may fail as a StoreError; none may panic.
            if task.await.expect("no panic").is_err() {
                failed += 1;
            }
        }

        // Later operations succeed with no action by the caller.
        let key = format!("after-{round}");
        let (reservation, errors) = eventually(20, || store.reserve(&key, fp(1), LEASE)).await;
        eprintln!(
            "round {round}: {failed} of 16 in flight failed, {} retries after",
            errors.len()
        );
        for e in &errors {
            assert!(
                matches!(
                    e.kind(),
                    StoreErrorKind::Unavailable | StoreErrorKind::Timeout
                ),
                "{e}"
            );
        }
        let token = match reservation {
            Reservation::Reserved { token } => token,
            // A failed attempt may have reserved it before its answer was lost.
            Reservation::Held { record } => {
                assert_eq!(record.state, RecordState::Pending);
                continue;
            }
            other => panic!("unexpected reservation {other:?}"),
        };
        assert!(
            store
                .complete(&key, token, fp(1), &outcome, TTL)
                .await
                .unwrap()
        );
        assert!(!store.release(&key, token).await.unwrap());
    }
    let (id, _) = eventually(20, || client_id(&manager)).await;
    ids.push(id);
    ids.dedup();
    assert_eq!(ids.len(), 6, "a new connection after each kill: {ids:?}");
}

#[cfg(feature = "redis-cluster")]
mod cluster {
    use super::*;

    fn urls() -> Option<Vec<String>> {
        backend_url("REDIS_CLUSTER_URLS").map(|s| s.split(',').map(str::to_owned).collect())
    }

    /// Every node, as `(url, connection)`, straight (not through the cluster client).
    async fn nodes(urls: &[String]) -> Vec<MultiplexedConnection> {
        let mut nodes = Vec::new();
        for url in urls {
            nodes.push(admin(url).await);
        }
        nodes
    }

    #[tokio::test]
    #[cfg_attr(
        not(backend_redis_cluster),
        ignore = "no Redis Cluster at REDIS_CLUSTER_URLS or 127.0.0.1:7001-7003"
    )]
    async fn cluster_keys_in_every_slot_range_reserve_complete_and_release() {
        let Some(urls) = urls() else {
            return;
        };
        let store = RedisStore::connect_cluster(urls.iter().map(String::as_str))
            .await
            .unwrap()
            .key_prefix(unique_prefix("cluster-slots"));
        let outcome = Outcome::sent(Receipt::new("m", "test"));
        // 64 keys land on every node of a 3-node cluster with overwhelming likelihood.
        for i in 0..64 {
            let key = format!("k{i}");
            let Reservation::Reserved { token } = store.reserve(&key, fp(1), LEASE).await.unwrap()
            else {
                panic!("fresh key held")
            };
            if i % 2 == 0 {
                assert!(store.release(&key, token).await.unwrap());
            } else {
                assert!(
                    store
                        .complete(&key, token, fp(1), &outcome, TTL)
                        .await
                        .unwrap()
                );
            }
        }
    }

    /// On a cluster, records spread over every node while the index lives on one: a batch
    /// of unknown completions is indexed, the listing reads each record on its own node, and
    /// a key settled by hand leaves it.
    #[tokio::test]
    #[cfg_attr(
        not(backend_redis_cluster),
        ignore = "no Redis Cluster at REDIS_CLUSTER_URLS or 127.0.0.1:7001-7003"
    )]
    async fn cluster_lists_unknown_keys_from_every_node() {
        let Some(urls) = urls() else {
            return;
        };
        let store = RedisStore::connect_cluster(urls.iter().map(String::as_str))
            .await
            .unwrap()
            .key_prefix(unique_prefix("cluster-list"));
        // 64 keys land on every node of a 3-node cluster with overwhelming likelihood.
        let keys: Vec<String> = (0..64).map(|i| format!("ns:k{i:02}")).collect();
        keep_unknown(&store, &keys).await;
        let (listed, pages) = list_all(&store, 10).await;
        assert!(pages >= 7, "{pages} pages of 10 for 64 keys");
        let mut sorted = listed.clone();
        sorted.sort();
        assert_eq!(sorted, keys);
        let resolution = Resolution::delivered(Receipt::new("m", "test"), TTL);
        assert_eq!(
            store
                .resolve(&keys[0], &resolution, Force::No)
                .await
                .unwrap(),
            AdminOutcome::Done
        );
        let (listed, _) = list_all(&store, 100).await;
        assert_eq!(listed.len(), 63);
        assert!(!listed.contains(&keys[0]));
    }

    #[tokio::test]
    #[cfg_attr(
        not(backend_redis_cluster),
        ignore = "no Redis Cluster at REDIS_CLUSTER_URLS or 127.0.0.1:7001-7003"
    )]
    async fn cluster_garbage_is_corrupt() {
        let Some(urls) = urls() else {
            return;
        };
        let prefix = unique_prefix("cluster-garbage");
        let store = RedisStore::connect_cluster(urls.iter().map(String::as_str))
            .await
            .unwrap()
            .key_prefix(prefix.clone());
        let client = redis::cluster::ClusterClient::new(urls.clone()).unwrap();
        let mut raw = client.get_async_connection().await.unwrap();
        let () = redis::cmd("SET")
            .arg(format!("{prefix}k"))
            .arg("garbage")
            .arg("PX")
            .arg(60_000)
            .query_async(&mut raw)
            .await
            .unwrap();
        let err = store.reserve("k", fp(1), LEASE).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt);
        let err = store.release("k", Token::new()).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt);
    }

    /// Keys of one batch in many slots: a corrupt value fails its entry alone, as on one node.
    #[tokio::test]
    #[cfg_attr(
        not(backend_redis_cluster),
        ignore = "no Redis Cluster at REDIS_CLUSTER_URLS or 127.0.0.1:7001-7003"
    )]
    async fn cluster_batch_with_corrupt_values_fails_those_entries_alone() {
        let Some(urls) = urls() else {
            return;
        };
        let prefix = unique_prefix("cluster-batch-corrupt");
        let store = RedisStore::connect_cluster(urls.iter().map(String::as_str))
            .await
            .unwrap()
            .key_prefix(prefix.clone());
        let client = redis::cluster::ClusterClient::new(urls.clone()).unwrap();
        let mut raw = client.get_async_connection().await.unwrap();
        for (i, value) in [(1, &b"garbage"[..]), (4, b"null")] {
            let () = redis::cmd("SET")
                .arg(format!("{prefix}k{i}"))
                .arg(value)
                .arg("PX")
                .arg(60_000)
                .query_async(&mut raw)
                .await
                .unwrap();
        }
        assert_batch_corrupt_entries_alone(&store, &[1, 4]).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg_attr(
        not(backend_redis_cluster),
        ignore = "no Redis Cluster at REDIS_CLUSTER_URLS or 127.0.0.1:7001-7003"
    )]
    async fn cluster_operations_recover_after_connections_are_killed() {
        let Some(urls) = urls() else {
            return;
        };
        // A user of its own, so the kill reaches this store's connections only, on every
        // node, whatever their ids and however often they reconnect.
        let user = format!("tower-idem-{}", Token::new());
        let password = Token::new().to_string();
        let mut nodes = nodes(&urls).await;
        for node in &mut nodes {
            let () = redis::cmd("ACL")
                .arg("SETUSER")
                .arg(&user)
                .arg("on")
                .arg(format!(">{password}"))
                .arg("~*")
                .arg("&*")
                .arg("+@all")
                .query_async(node)
                .await
                .unwrap();
        }
        let authed: Vec<String> = urls
            .iter()
            .map(|u| u.replacen("redis://", &format!("redis://{user}:{password}@"), 1))
            .collect();
        let store = RedisStore::connect_cluster(authed.iter().map(String::as_str))
            .await
            .unwrap()
            .key_prefix(unique_prefix("cluster-killed"))
            .timeout(Duration::from_millis(1500));
        let outcome = Outcome::sent(Receipt::new("m", "test"));

        for round in 0..3 {
            for i in 0..8 {
                store
                    .reserve(&format!("before-{round}-{i}"), fp(1), LEASE)
                    .await
                    .unwrap();
            }
            let mut killed = 0;
            for node in &mut nodes {
                let n: i64 = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("USER")
                    .arg(&user)
                    .arg("SKIPME")
                    .arg("yes")
                    .query_async(node)
                    .await
                    .unwrap();
                killed += n;
            }
            assert!(killed >= 1, "round {round}: some connection was killed");
            for i in 0..8 {
                let key = format!("after-{round}-{i}");
                let (reservation, errors) =
                    eventually(20, || store.reserve(&key, fp(1), LEASE)).await;
                if !errors.is_empty() {
                    eprintln!("round {round}: {key} succeeded after {errors:?}");
                }
                if let Reservation::Reserved { token } = reservation {
                    let (wrote, _) =
                        eventually(20, || store.complete(&key, token, fp(1), &outcome, TTL)).await;
                    assert!(wrote);
                }
            }
        }
        for node in &mut nodes {
            let _: i64 = redis::cmd("ACL")
                .arg("DELUSER")
                .arg(&user)
                .query_async(node)
                .await
                .unwrap();
        }
    }
}

/// A `redis-server` of the test's own on a free loopback port, so its statistics count this
/// test's commands alone; killed when dropped. Its tests are ignored where the binaries are
/// missing, so here they are on PATH.
async fn private_server() -> RedisServer {
    RedisServer::start()
        .await
        .expect("redis-server on PATH (CI starts its Redis with it)")
}

/// Counts round trips between a client and a server by standing between them.
///
/// A round trip is counted each time the client sends after the server last sent (or first):
/// the client had to wait for an answer before it could speak again. Each direction marks
/// itself before it forwards its bytes, so a client that waits for a reply before its next
/// command is always counted once per command; a pipeline that the kernel splits while the
/// server already answers can only be counted more than once, never less.
struct RoundTrips {
    url: String,
    count: Arc<std::sync::Mutex<(u64, bool)>>,
    task: tokio::task::JoinHandle<()>,
}

impl RoundTrips {
    async fn between(upstream: &str) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let upstream = upstream.trim_start_matches("redis://").to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("redis://{}", listener.local_addr().unwrap());
        // (round trips, whether the client spoke last)
        let count = Arc::new(std::sync::Mutex::new((0u64, false)));
        let shared = Arc::clone(&count);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                let (mut client_rx, mut client_tx) = client.into_split();
                let (mut server_rx, mut server_tx) = server.into_split();
                let up = Arc::clone(&shared);
                tokio::spawn(async move {
                    let mut buf = vec![0; 64 * 1024];
                    while let Ok(n @ 1..) = client_rx.read(&mut buf).await {
                        {
                            let mut c = up.lock().unwrap();
                            if !c.1 {
                                c.0 += 1;
                                c.1 = true;
                            }
                        }
                        if server_tx.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
                let down = Arc::clone(&shared);
                tokio::spawn(async move {
                    let mut buf = vec![0; 64 * 1024];
                    while let Ok(n @ 1..) = server_rx.read(&mut buf).await {
                        down.lock().unwrap().1 = false;
                        if client_tx.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Self { url, count, task }
    }

    fn so_far(&self) -> u64 {
        self.count.lock().unwrap().0
    }
}

impl Drop for RoundTrips {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The `calls` of each command in `INFO commandstats`, by command name.
async fn command_calls(
    admin: &mut MultiplexedConnection,
) -> std::collections::HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|s| s.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

async fn reset_stats(admin: &mut MultiplexedConnection) {
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(admin)
        .await
        .unwrap();
}

/// Each command's calls, without the ones the test's own admin connection makes.
fn store_calls(calls: &std::collections::HashMap<String, u64>) -> Vec<(String, u64)> {
    let mut calls: Vec<(String, u64)> = calls
        .iter()
        .filter(|(name, _)| !["info", "config|resetstat"].contains(&name.as_str()))
        .map(|(name, n)| (name.clone(), *n))
        .collect();
    calls.sort();
    calls
}

fn calls(list: &[(&str, u64)]) -> Vec<(String, u64)> {
    let mut calls: Vec<(String, u64)> = list.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect();
    calls.sort();
    calls
}

/// A replay of a sent key is one `SET NX GET`, its record answered without its first
/// attempt's age; a repeat of a key of unknown delivery also runs the reserve script, which
/// reads its `PTTL` for the age a re-send inside the provider's window is decided on.
/// Counted by a private server's `INFO commandstats`.
#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn a_replay_is_one_command_and_only_unknown_delivery_asks_the_clock() {
    let server = private_server().await;
    let store = RedisStore::connect(&server.url)
        .await
        .unwrap()
        .key_prefix(unique_prefix("replay-commands"));
    let mut admin = admin(&server.url).await;
    let sent = Outcome::sent(Receipt::new("m", "test"));
    let unknown = Outcome::failed(SendError::unknown_delivery("provider.timeout", "timed out"));
    for (key, outcome) in [("sent", &sent), ("unknown", &unknown)] {
        let Reservation::Reserved { token } = store.reserve(key, fp(1), LEASE).await.unwrap()
        else {
            panic!("a fresh key is reserved")
        };
        assert!(
            store
                .complete(key, token, fp(1), outcome, TTL)
                .await
                .unwrap()
        );
    }

    reset_stats(&mut admin).await;
    let Reservation::Held { record } = store.reserve("sent", fp(1), LEASE).await.unwrap() else {
        panic!("a sent key is held")
    };
    assert_eq!(record.outcome.unwrap().replay().unwrap().id, "m");
    assert_eq!(record.first_attempt_age, None);
    assert_eq!(
        store_calls(&command_calls(&mut admin).await),
        calls(&[("set", 1)])
    );

    // The server learns the reserve script on its first use (`NOSCRIPT`, then `SCRIPT LOAD`).
    store.reserve("unknown", fp(1), LEASE).await.unwrap();
    reset_stats(&mut admin).await;
    let Reservation::Held { record } = store.reserve("unknown", fp(1), LEASE).await.unwrap() else {
        panic!("a key of unknown delivery is held")
    };
    assert!(record.is_unknown_delivery());
    assert!(
        record.first_attempt_age.is_some_and(|age| age < LEASE),
        "{record:?}"
    );
    assert_eq!(
        store_calls(&command_calls(&mut admin).await),
        calls(&[("set", 1), ("evalsha", 1), ("get", 1), ("pttl", 1)])
    );
}

/// 100 keys through `reserve_many`, `complete_many` and `release_many` cost one round trip
/// each (three for the call that finds its script flushed), and exactly one command per key.
///
/// Round trips are counted by a proxy between the store and a private `redis-server` (see
/// [`RoundTrips`]): no server statistic counts them. Commands are counted by that server's
/// `INFO commandstats`, which no other test touches. The commands a script runs count under
/// their own names, so each complete shows as one `evalsha`, one `get` and one `set`.
#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn a_batch_of_100_keys_costs_one_round_trip_per_call() {
    let server = private_server().await;
    let trips = RoundTrips::between(&server.url).await;
    let store = RedisStore::connect(&trips.url)
        .await
        .unwrap()
        .key_prefix(unique_prefix("round-trips"));
    let mut admin = admin(&server.url).await;
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    let requests: Vec<(&str, Fingerprint)> = keys.iter().map(|k| (k.as_str(), fp(1))).collect();

    // The server knows the reserve script, as after any earlier reserve: one pipeline.
    store.reserve("warm-reserve", fp(1), LEASE).await.unwrap();
    reset_stats(&mut admin).await;
    let before = trips.so_far();
    let tokens: Vec<Token> = store
        .reserve_many(&requests, LEASE)
        .await
        .unwrap()
        .into_iter()
        .map(|r| match r {
            Ok(Reservation::Reserved { token }) => token,
            other => panic!("fresh key: {other:?}"),
        })
        .collect();
    let reserve_trips = trips.so_far() - before;
    // Each reserve of a free key is one `SET NX GET`: no script.
    assert_eq!(
        store_calls(&command_calls(&mut admin).await),
        calls(&[("set", 100)])
    );

    // The server knows the complete script, as after any earlier complete: one pipeline.
    let outcome = Outcome::sent(Receipt::new("m", "test"));
    let warm = match store.reserve("warm-complete", fp(1), LEASE).await.unwrap() {
        Reservation::Reserved { token } => token,
        other => panic!("fresh key: {other:?}"),
    };
    let kept = store.complete("warm-complete", warm, fp(1), &outcome, TTL);
    assert!(kept.await.unwrap());
    let completions: Vec<Completion<'_>> = keys
        .iter()
        .zip(&tokens)
        .map(|(key, token)| Completion {
            key,
            token: *token,
            fingerprint: fp(1),
            outcome: &outcome,
        })
        .collect();
    reset_stats(&mut admin).await;
    let before = trips.so_far();
    let written = store.complete_many(&completions, TTL).await.unwrap();
    let complete_trips = trips.so_far() - before;
    assert_eq!(written, vec![true; 100]);
    // The fenced write of a receipt reads the key and writes it: a known outcome keeps no
    // first attempt's time, so no `PTTL`.
    assert_eq!(
        store_calls(&command_calls(&mut admin).await),
        calls(&[("evalsha", 100), ("get", 100), ("set", 100)])
    );

    // The server forgot its scripts: NOSCRIPT for all, one SCRIPT LOAD, the pipeline again.
    let fresh: Vec<String> = (0..100).map(|i| format!("fresh{i}")).collect();
    let requests: Vec<(&str, Fingerprint)> = fresh.iter().map(|k| (k.as_str(), fp(1))).collect();
    let releases: Vec<(&str, Token)> = store
        .reserve_many(&requests, LEASE)
        .await
        .unwrap()
        .into_iter()
        .zip(&fresh)
        .map(|(r, key)| match r {
            Ok(Reservation::Reserved { token }) => (key.as_str(), token),
            other => panic!("fresh key: {other:?}"),
        })
        .collect();
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut admin)
        .await
        .unwrap();
    reset_stats(&mut admin).await;
    let before = trips.so_far();
    let released = store.release_many(&releases).await.unwrap();
    let release_trips = trips.so_far() - before;
    assert_eq!(released, vec![true; 100]);
    let seen = store_calls(&command_calls(&mut admin).await);
    eprintln!("release_many after SCRIPT FLUSH: {seen:?}");
    assert_eq!(
        seen,
        // 100 EVALSHA answered NOSCRIPT, then 100 that ran, each a GET and a DEL.
        calls(&[
            ("evalsha", 200),
            ("script|load", 1),
            ("get", 100),
            ("del", 100)
        ])
    );

    // The yardstick: 100 single reserves wait for each answer (the script flushed above is
    // loaded again first, by an earlier reserve).
    store.reserve("warm-again", fp(1), LEASE).await.unwrap();
    let before = trips.so_far();
    for i in 0..100 {
        store
            .reserve(&format!("single{i}"), fp(1), LEASE)
            .await
            .unwrap();
    }
    let single_trips = trips.so_far() - before;
    eprintln!(
        "round trips for 100 keys: reserve_many {reserve_trips}, complete_many \
         {complete_trips}, release_many after SCRIPT FLUSH {release_trips}, 100 reserves \
         {single_trips}"
    );
    assert_eq!(single_trips, 100, "the counter sees every round trip");
    // One pipeline; a second only if the kernel split it while the server already answered.
    assert!(reserve_trips <= 2, "reserve_many: {reserve_trips}");
    assert!(complete_trips <= 2, "complete_many: {complete_trips}");
    // Pipeline, SCRIPT LOAD, the pipeline again.
    assert!(
        (3..=4).contains(&release_trips),
        "release_many: {release_trips}"
    );
}

/// A batch with unreadable values among fresh keys, as each single operation would answer it:
/// `reserve_many` fails only those entries (`Corrupt`) and reserves the others;
/// `complete_many` and `release_many`, whose answers are one `bool` per key, fail as a whole
/// with `Corrupt`, as `complete` and `release` fail. The other keys of that call were still
/// acted on (the pipeline runs every script), and the unreadable values are left as they are.
async fn assert_batch_corrupt_entries_alone(store: &RedisStore, planted: &[usize]) {
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    let requests: Vec<(&str, Fingerprint)> = keys.iter().map(|k| (k.as_str(), fp(1))).collect();
    let answers = store.reserve_many(&requests, LEASE).await.unwrap();
    assert_eq!(answers.len(), keys.len());
    let mut tokens = Vec::new();
    for (i, answer) in answers.into_iter().enumerate() {
        if planted.contains(&i) {
            let err = answer.expect_err("an unreadable value is an error for its entry");
            assert_eq!(err.kind(), StoreErrorKind::Corrupt, "entry {i}: {err}");
            tokens.push(Token::new());
        } else {
            match answer {
                Ok(Reservation::Reserved { token }) => tokens.push(token),
                other => panic!("entry {i} is a fresh key: {other:?}"),
            }
        }
    }

    let outcome = Outcome::sent(Receipt::new("m", "test"));
    let completions: Vec<Completion<'_>> = keys
        .iter()
        .zip(&tokens)
        .map(|(key, token)| Completion {
            key,
            token: *token,
            fingerprint: fp(1),
            outcome: &outcome,
        })
        .collect();
    let err = store.complete_many(&completions, TTL).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "complete_many: {err}");
    let releases: Vec<(&str, Token)> = keys.iter().map(|k| k.as_str()).zip(tokens).collect();
    let err = store.release_many(&releases).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "release_many: {err}");

    // The readable keys were completed, so their releases changed nothing.
    let states = store.reserve_many(&requests, LEASE).await.unwrap();
    for (i, state) in states.into_iter().enumerate() {
        if !planted.contains(&i) {
            assert!(
                matches!(&state, Ok(Reservation::Held { record }) if record.state == RecordState::Done),
                "entry {i}: {state:?}"
            );
        }
    }
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn a_corrupt_value_in_a_batch_fails_its_entry_alone() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let prefix = unique_prefix("batch-corrupt");
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .key_prefix(prefix.clone());
    plant(&url, &format!("{prefix}k2"), b"garbage").await;
    let done_without_outcome = format!("\x02D{}{},\n", Token::new(), fp(1));
    plant(
        &url,
        &format!("{prefix}k5"),
        done_without_outcome.as_bytes(),
    )
    .await;
    let mut admin = admin(&url).await;
    let () = redis::pipe()
        .cmd("RPUSH")
        .arg(format!("{prefix}k7"))
        .arg("x")
        .ignore()
        .cmd("PEXPIRE")
        .arg(format!("{prefix}k7"))
        .arg(60_000)
        .ignore()
        .query_async(&mut admin)
        .await
        .unwrap();

    // k5 is corrupt only to reserve: the scripts read its token, which another holds.
    let keys = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];
    let answers = store
        .reserve_many(&keys.iter().map(|k| (*k, fp(1))).collect::<Vec<_>>(), LEASE)
        .await
        .unwrap();
    for (i, answer) in answers.iter().enumerate() {
        match i {
            2 | 5 | 7 => assert!(
                matches!(answer, Err(e) if e.kind() == StoreErrorKind::Corrupt),
                "k{i}: {answer:?}"
            ),
            _ => assert!(
                matches!(answer, Ok(Reservation::Reserved { .. })),
                "k{i}: {answer:?}"
            ),
        }
    }
    // The same, through a fresh prefix, with the complete and release of the whole batch.
    let prefix = unique_prefix("batch-corrupt-all");
    let store = store.key_prefix(prefix.clone());
    plant(&url, &format!("{prefix}k2"), b"garbage").await;
    plant(&url, &format!("{prefix}k6"), b"\xff\xfe").await;
    assert_batch_corrupt_entries_alone(&store, &[2, 6]).await;
    assert_eq!(
        raw_get(&url, &format!("{prefix}k2")).await.as_deref(),
        Some(&b"garbage"[..])
    );
    assert_eq!(
        raw_get(&url, &format!("{prefix}k6")).await.as_deref(),
        Some(&b"\xff\xfe"[..])
    );
}

#[tokio::test]
async fn a_batch_on_a_server_that_never_answers_times_out_as_a_whole() {
    let (url, server) = silent_server().await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let manager = ConnectionManager::new_lazy_with_config(
        client,
        ConnectionManagerConfig::new().set_number_of_retries(0),
    )
    .unwrap();
    let store = RedisStore::new(manager).timeout(Duration::from_millis(200));
    let err = store
        .reserve_many(&[("a", fp(1)), ("b", fp(1))], LEASE)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err}");
    let err = store
        .release_many(&[("a", Token::new()), ("b", Token::new())])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err}");
    server.abort();
}

/// Keeps `keys` as unknown delivery through `reserve_many` and `complete_many`, as the
/// layer's batches keep them.
async fn keep_unknown(store: &RedisStore, keys: &[String]) {
    let requests: Vec<(&str, Fingerprint)> = keys.iter().map(|k| (k.as_str(), fp(1))).collect();
    let tokens: Vec<Token> = store
        .reserve_many(&requests, LEASE)
        .await
        .unwrap()
        .into_iter()
        .map(|r| match r {
            Ok(Reservation::Reserved { token }) => token,
            other => panic!("fresh key: {other:?}"),
        })
        .collect();
    let outcome = Outcome::failed(SendError::unknown_delivery("provider.timeout", "timed out"));
    let completions: Vec<Completion<'_>> = keys
        .iter()
        .zip(&tokens)
        .map(|(key, token)| Completion {
            key,
            token: *token,
            fingerprint: fp(1),
            outcome: &outcome,
        })
        .collect();
    let written = store.complete_many(&completions, TTL).await.unwrap();
    assert!(written.iter().all(|w| *w));
}

/// Pages through the whole listing, `page` keys at a time; answers the keys and the pages.
async fn list_all(store: &RedisStore, page: usize) -> (Vec<String>, usize) {
    let mut keys = Vec::new();
    let mut cursor: Option<Cursor> = None;
    for pages in 1..=100_000 {
        let answer = store.list(cursor.as_ref(), page).await.unwrap();
        keys.extend(answer.entries.into_iter().map(|e| e.key));
        match answer.next {
            Some(next) => cursor = Some(next),
            None => return (keys, pages),
        }
    }
    panic!("the listing did not end");
}

/// The listing pages through 10,000 keys of unknown delivery from the index, one `ZRANGE` per
/// page, each key once; its search for stale pending keys walks the keyspace once with
/// `SCAN` (never `KEYS`), a thousand slots a call. Counted by a private server's
/// `INFO commandstats`, which no other test touches.
#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn listing_10_000_unknown_keys_reads_the_index_and_scans_the_keyspace_once() {
    let server = private_server().await;
    let store = RedisStore::connect(&server.url)
        .await
        .unwrap()
        .key_prefix(unique_prefix("list-10k"))
        .timeout(Duration::from_secs(30));
    let mut admin = admin(&server.url).await;
    let keys: Vec<String> = (0..10_000).map(|i| format!("ns:k{i:05}")).collect();
    for chunk in keys.chunks(2_500) {
        keep_unknown(&store, chunk).await;
    }
    // Noise the listing must not list: 1,000 keys pending within their lease.
    let pending: Vec<String> = (0..1_000).map(|i| format!("ns:pending{i}")).collect();
    let requests: Vec<(&str, Fingerprint)> = pending.iter().map(|k| (k.as_str(), fp(1))).collect();
    for r in store.reserve_many(&requests, LEASE).await.unwrap() {
        assert!(matches!(r, Ok(Reservation::Reserved { .. })), "{r:?}");
    }

    reset_stats(&mut admin).await;
    let (listed, pages) = list_all(&store, 500).await;
    let calls = command_calls(&mut admin).await;
    for scan in ["keys", "zscan", "sscan", "hscan"] {
        assert_eq!(calls.get(scan), None, "{scan} was called: {calls:?}");
    }
    let scans = calls.get("scan").copied().unwrap_or(0);
    assert!(
        (11..=13).contains(&scans),
        "11,001 keys, a thousand slots a SCAN, once through: {calls:?}"
    );
    let zranges = calls.get("zrange").copied().unwrap_or(0);
    assert!(
        (20..=pages as u64).contains(&zranges),
        "one ZRANGE per page of the index, {pages} pages in all: {calls:?}"
    );
    assert_eq!(listed.len(), 10_000);
    let distinct: std::collections::HashSet<&String> = listed.iter().collect();
    assert_eq!(distinct.len(), 10_000, "a key was listed twice");
    let mut expected = keys.clone();
    expected.sort();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(sorted, expected);
}

/// The index heals itself: an entry whose record went around the store (deleted by hand, or
/// expired) is skipped by the listing and dropped from the index; a key settled by hand
/// leaves it at once; a key kept as delivered never enters it.
#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn the_unknown_index_drops_entries_whose_record_is_gone() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .key_prefix(unique_prefix("index-heal"));
    let mut admin = admin(&url).await;
    let keys: Vec<String> = (0..4).map(|i| format!("ns:k{i}")).collect();
    keep_unknown(&store, &keys).await;
    let index = store.unknown_index_key();
    let card = |mut admin: MultiplexedConnection, index: String| async move {
        let n: u64 = redis::cmd("ZCARD")
            .arg(&index)
            .query_async(&mut admin)
            .await
            .unwrap();
        n
    };
    assert_eq!(card(admin.clone(), index.clone()).await, 4);

    let () = redis::cmd("DEL")
        .arg(format!("{}{}", store_prefix(&store), keys[0]))
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(
        store
            .resolve(&keys[1], &Resolution::not_sent(), Force::No)
            .await
            .unwrap(),
        AdminOutcome::Done
    );
    assert_eq!(
        card(admin.clone(), index.clone()).await,
        3,
        "resolve unindexes"
    );
    let (listed, _) = list_all(&store, 10).await;
    assert_eq!(listed, keys[2..]);
    assert_eq!(
        card(admin.clone(), index.clone()).await,
        2,
        "the listing drops what it skipped"
    );

    let sent = "ns:sent".to_owned();
    let Reservation::Reserved { token } = store.reserve(&sent, fp(1), LEASE).await.unwrap() else {
        panic!("fresh key")
    };
    let outcome = Outcome::sent(Receipt::new("m", "test"));
    assert!(
        store
            .complete(&sent, token, fp(1), &outcome, TTL)
            .await
            .unwrap()
    );
    assert_eq!(
        card(admin, index).await,
        2,
        "a delivered key is not indexed"
    );
}

/// The prefix a store was given, read back from its index's name.
fn store_prefix(store: &RedisStore) -> String {
    let index = store.unknown_index_key();
    index
        .strip_suffix(tower_idempotency::store::redis::UNKNOWN_INDEX_SUFFIX)
        .unwrap()
        .to_owned()
}

/// The record a reserve writes carries the first attempt's time and the time kept after the
/// lease relative to its key's expiry, so `SET NX PX` needs no clock; the done record keeps
/// the first attempt's time, relative to its own expiry.
#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn a_pending_record_carries_its_times_in_the_stored_form() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let prefix = unique_prefix("stored-times");
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .key_prefix(prefix.clone());
    let Reservation::Reserved { token } = store.reserve("k", fp(1), LEASE).await.unwrap() else {
        panic!("fresh key held")
    };
    let value = String::from_utf8(raw_get(&url, &format!("{prefix}k")).await.unwrap()).unwrap();
    let kept = tower_idempotency::store::redis::DEFAULT_PENDING_KEPT.as_millis();
    let px = LEASE.as_millis() + kept;
    assert_eq!(
        value,
        format!("\x02P{token}{}{px},{kept}\n", fp(1)),
        "the first attempt began when the key's {px} ms started; its lease ends {kept} ms \
         before the key expires"
    );
    let outcome = Outcome::failed(SendError::unknown_delivery("provider.timeout", "timed out"));
    assert!(
        store
            .complete("k", token, fp(1), &outcome, TTL)
            .await
            .unwrap()
    );
    let done = String::from_utf8(raw_get(&url, &format!("{prefix}k")).await.unwrap()).unwrap();
    let head = format!("\x02D{token}{}", fp(1));
    let times = done.strip_prefix(&head).expect("the done record's front");
    let (first, rest) = times.split_once(",\n").expect("a done record's times");
    let first: u128 = first
        .parse()
        .expect("the done record keeps the first attempt");
    // The first attempt began a few ms before the complete, whose key lives the ttl.
    assert!(
        (TTL.as_millis()..TTL.as_millis() + 1_000).contains(&first),
        "{done}"
    );
    assert!(rest.starts_with(r#"{"failed":"#), "{done}");
}

/// Every pending record the store writes carries its times: one without them is no record of
/// this store. A reserve, its holder's extend and an inspect report it corrupt, and it is
/// left as it is.
#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn a_pending_record_without_its_times_is_corrupt_and_left_alone() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let prefix = unique_prefix("pending-without-times");
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .key_prefix(prefix.clone());
    let token = Token::new();
    let pending = format!("\x02P{token}{},\n", fp(1));
    let redis_key = format!("{prefix}k");
    plant(&url, &redis_key, pending.as_bytes()).await;

    let err = store.reserve("k", fp(1), LEASE).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "reserve: {err}");
    let err = store.extend("k", token, LEASE).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "extend: {err}");
    let err = store.inspect("k").await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "inspect: {err}");
    assert_eq!(
        raw_get(&url, &redis_key).await.as_deref(),
        Some(pending.as_bytes()),
        "the value was left as it is"
    );
}

/// A done record completed after its own pending record was gone carries no first attempt:
/// its age is unknown, and a retake never takes it back.
#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn a_done_record_completed_without_its_pending_record_is_never_taken_back() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let prefix = unique_prefix("done-without-first-attempt");
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .key_prefix(prefix.clone());
    let outcome = Outcome::failed(SendError::unknown_delivery("provider.timeout", "timed out"));
    assert!(
        store
            .complete("k", Token::new(), fp(1), &outcome, TTL)
            .await
            .unwrap()
    );
    let window = Duration::from_secs(3600);
    assert_eq!(store.retake("k", fp(1), LEASE, window).await.unwrap(), None);
    match store.reserve("k", fp(1), LEASE).await.unwrap() {
        Reservation::Held { record } => {
            assert!(record.is_unknown_delivery());
            assert_eq!(record.first_attempt_age, None);
        }
        other => panic!("a kept outcome: {other:?}"),
    }
}

/// A send that crashed leaves its key pending past its lease: the listing shows it, as every
/// store does, to an operator and to the reconciler. Live pending keys and kept receipts are
/// not listed; small pages list each crashed key once.
#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn a_crash_left_key_shows_in_the_listing() {
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .key_prefix(unique_prefix("crash-left"));
    let short = Duration::from_millis(100);
    let crashed: Vec<String> = (0..5).map(|i| format!("crashed:{i}")).collect();
    for key in &crashed {
        // Reserved, and its sender never settled it.
        assert!(matches!(
            store.reserve(key, fp(1), short).await.unwrap(),
            Reservation::Reserved { .. }
        ));
    }
    for i in 0..3 {
        store
            .reserve(&format!("live:{i}"), fp(1), LEASE)
            .await
            .unwrap();
    }
    for i in 0..2 {
        let key = format!("sent:{i}");
        let Reservation::Reserved { token } = store.reserve(&key, fp(1), LEASE).await.unwrap()
        else {
            panic!("a fresh key is reserved")
        };
        let outcome = Outcome::sent(Receipt::new("m", "test"));
        assert!(
            store
                .complete(&key, token, fp(1), &outcome, TTL)
                .await
                .unwrap()
        );
    }
    let stale: Vec<&str> = crashed.iter().map(String::as_str).collect();
    until_expired(&store, &stale).await;

    let mut listed = Vec::new();
    let mut cursor: Option<Cursor> = None;
    for _ in 0..1_000 {
        let page = store.list(cursor.as_ref(), 2).await.unwrap();
        assert!(page.entries.len() <= 2, "a page longer than asked");
        listed.extend(page.entries);
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert!(listed.iter().all(|e| e.is_stale()), "{listed:?}");
    let mut keys: Vec<String> = listed.into_iter().map(|e| e.key).collect();
    keys.sort();
    assert_eq!(keys, crashed, "each crashed key once, and nothing else");
    // Listed as stale, it needs no force to forget.
    assert_eq!(
        store.forget(&crashed[0], Force::No).await.unwrap(),
        AdminOutcome::Done
    );
}

/// A reserve that lands after its caller stopped waiting (here the server holds every write
/// for a second, and the store's timeout is 200 ms) would hold its key for the whole lease
/// with nobody sending: every repeat answered "in flight". The store releases it once it
/// lands, so a repeat soon reserves the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn a_reserve_whose_answer_was_lost_frees_its_key_soon_after_it_lands() {
    let server = private_server().await;
    let store = RedisStore::connect(&server.url)
        .await
        .unwrap()
        .key_prefix(unique_prefix("lost-answer"))
        .timeout(Duration::from_millis(200));
    let mut admin = admin(&server.url).await;
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_000)
        .arg("WRITE")
        .query_async(&mut admin)
        .await
        .expect("pause writes");
    let error = store
        .reserve("k", fp(1), LEASE)
        .await
        .expect_err("the server holds the write past the timeout");
    assert_eq!(error.kind(), StoreErrorKind::Timeout, "{error}");
    poll_until(
        "the lost reserve's key is freed within seconds, not at its lease's end",
        Duration::from_secs(10),
        || async {
            match store.reserve("k", fp(1), LEASE).await {
                Ok(Reservation::Reserved { .. }) => true,
                Ok(Reservation::Held { record }) => {
                    assert_eq!(record.state, RecordState::Pending);
                    false
                }
                // Still paused: this reserve is lost too, and released the same way.
                Err(error) if error.kind() == StoreErrorKind::Timeout => false,
                other => panic!("a repeat after the lost reserve: {other:?}"),
            }
        },
    )
    .await;
}
