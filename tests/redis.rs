//! `RedisStore` against a real server: the conformance suite on one node (`REDIS_URL`) and on a
//! cluster (`REDIS_CLUSTER_URLS`, comma separated; `.ci/redis-cluster.sh` starts one), plus
//! races across connections, corrupt values and connections killed under the store.
#![cfg(all(feature = "redis", feature = "test-util"))]

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::{Outcome, Receipt};
use tower_idempotency::store::conformance::{Conformance, backend_url};
use tower_idempotency::store::{
    RecordState, RedisStore, Reservation, Store, StoreError, StoreErrorKind, Token,
};

const LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(60);

fn fp(n: u8) -> Fingerprint {
    Fingerprint::from_bytes([n; 32])
}

/// A prefix no other test or run shares.
fn unique_prefix(test: &str) -> String {
    format!("test:{test}:{}:", Token::new())
}

async fn admin(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("valid REDIS_URL")
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection")
}

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
        Some(Conformance::new(store))
    }

    tower_idempotency::store_conformance_tests!(
        #[tokio::test]
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
        Some(Conformance::new(store))
    }

    tower_idempotency::store_conformance_tests!(
        #[tokio::test]
        suite()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
            Err(e) => panic!("reserve failed: {e}"),
        }
    }
    assert_eq!(reserved, 1, "{TASKS} connections raced for one key");
}

#[tokio::test]
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

    let outcome = Outcome::Sent(Receipt::new("msg-a", "test"));
    assert!(a.complete("k", token, fp(1), &outcome, TTL).await.unwrap());
    let Reservation::Held { record } = b.reserve("k", fp(1), LEASE).await.unwrap() else {
        panic!("b reserved a done key")
    };
    assert_eq!(record.state, RecordState::Done);
    assert_eq!(record.outcome.unwrap().replay().unwrap().id, "msg-a");
}

#[tokio::test]
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
    let outcome = Outcome::Sent(Receipt::new("m", "test"));
    let err = store
        .complete("k", Token::new(), fp(1), &outcome, TTL)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "complete: {err}");
    let err = store.release("k", Token::new()).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "release: {err}");
    assert_eq!(
        raw_get(url, &redis_key).await.as_deref(),
        Some(value),
        "the value was left as it is"
    );
}

#[tokio::test]
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
        format!(
            r#"{{"state":"done","token":"{token}","fingerprint":"{}"}}"#,
            fp(1)
        ),
        // A state the store does not know.
        format!(
            r#"{{"state":"sent","token":"{token}","fingerprint":"{}"}}"#,
            fp(1)
        ),
        // A fingerprint that is not 32 bytes of hex.
        format!(r#"{{"state":"pending","token":"{token}","fingerprint":"abc"}}"#),
    ];
    for (i, value) in cases.iter().enumerate() {
        let key = format!("k{i}");
        plant(&url, &format!("{prefix}{key}"), value.as_bytes()).await;
        let err = store.reserve(&key, fp(1), LEASE).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{value}: {err}");
        // The scripts read only the token: its holder may still overwrite or, if pending,
        // release it; another token may not.
        let outcome = Outcome::Sent(Receipt::new("m", "test"));
        assert!(
            !store
                .complete(&key, Token::new(), fp(1), &outcome, TTL)
                .await
                .unwrap()
        );
        assert!(!store.release(&key, Token::new()).await.unwrap());
    }
    // The holder's complete repairs a done record without an outcome.
    let outcome = Outcome::Sent(Receipt::new("repaired", "test"));
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

#[tokio::test]
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
    let outcome = Outcome::Sent(Receipt::new("m", "test"));
    let err = store
        .complete("k", Token::new(), fp(1), &outcome, TTL)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "complete: {err}");
    let err = store.release("k", Token::new()).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "release: {err}");
    let len: i64 = redis::cmd("LLEN")
        .arg(&redis_key)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(len, 1, "the list was left as it is");
}

#[tokio::test]
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
    let outcome = Outcome::Sent(Receipt::new("m", "test"));
    for (name, d) in [("zero", Duration::ZERO), ("max", Duration::MAX)] {
        let key = format!("lease-{name}");
        let Reservation::Reserved { token } = store.reserve(&key, fp(1), d).await.unwrap() else {
            panic!("fresh key held")
        };
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
    let err = store.reserve("k", fp(1), LEASE).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err}");
    let outcome = Outcome::Sent(Receipt::new("m", "test"));
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
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
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
    let outcome = Outcome::Sent(Receipt::new("m", "test"));

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
    async fn cluster_keys_in_every_slot_range_reserve_complete_and_release() {
        let Some(urls) = urls() else {
            return;
        };
        let store = RedisStore::connect_cluster(urls.iter().map(String::as_str))
            .await
            .unwrap()
            .key_prefix(unique_prefix("cluster-slots"));
        let outcome = Outcome::Sent(Receipt::new("m", "test"));
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

    #[tokio::test]
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
        let outcome = Outcome::Sent(Receipt::new("m", "test"));

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
