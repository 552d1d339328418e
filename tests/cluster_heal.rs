//! A Redis Cluster store replaces a connection that stops answering: a connection
//! that cannot recover is replaced by one from the store's client, and after a storm of killed
//! connections every sender sends again within 5 s, no key sent twice.
//!
//! Both run on this binary's private cluster (`support::servers::RedisCluster`), each test
//! killing only the connections of its own ACL users.
#![cfg(feature = "redis-cluster")]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::servers::{ClusterUser, RedisCluster};
use support::stores::{redis_admin, unique_prefix};
use support::{Provider, message};
use tower::retry::RetryLayer;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::{IdempotencyLayer, Receipt, RedisStore, RetryPolicy, SendError, Store};

/// The bound on each store operation here: short, for the suite to stay fast.
const STORE_TIMEOUT: Duration = Duration::from_millis(300);
/// How long calls may go unanswered before a store replaces its connection here.
const HEAL_AFTER: Duration = Duration::from_secs(1);

/// A cluster client for `user`, each attempt bounded by `STORE_TIMEOUT`.
fn client(user: &ClusterUser) -> redis::cluster::ClusterClient {
    redis::cluster::ClusterClientBuilder::new(user.urls.clone())
        .connection_timeout(STORE_TIMEOUT)
        .response_timeout(STORE_TIMEOUT)
        .build()
        .expect("valid cluster URLs")
}

/// Turns `user` off on every node and kills its connections: a connection of its can never
/// reconnect.
async fn lock_out(cluster: &RedisCluster, user: &mut ClusterUser) {
    for url in cluster.urls() {
        let mut admin = redis_admin::admin(&url).await;
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&user.name)
            .arg("off")
            .query_async(&mut admin)
            .await
            .expect("ACL SETUSER off");
    }
    user.kill_connections().await.expect("CLIENT KILL");
}

async fn reserve(store: &RedisStore, key: &str) -> Result<(), String> {
    store
        .reserve(
            key,
            Fingerprint::from_bytes([7; 32]),
            Duration::from_secs(60),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Reserves fresh keys until one succeeds; answers how long that took, failing the test past
/// `bound`.
async fn succeeds_within(bound: Duration, store: &RedisStore, prefix: &str) -> Duration {
    let start = Instant::now();
    let mut n = 0;
    loop {
        n += 1;
        let last = reserve(store, &format!("{prefix}:{n}")).await;
        if last.is_ok() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < bound,
            "no call succeeded within {bound:?}; last: {last:?}"
        );
        // Polls a real cluster; each call is bounded by the store's timeout.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The connection a store was handed can never reconnect (its user is locked out), while its
/// client opens new ones that work: the store replaces it, and calls succeed again within
/// the heal bound and a few timeouts, and the replacement is logged. A store on the same connection without its client
/// stays failed, which shows the connection was stuck.
#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn a_connection_that_cannot_recover_is_replaced_by_one_from_the_client() {
    let Some(cluster) = RedisCluster::shared() else {
        return;
    };
    let (logs, _capturing) = support::capture();
    let mut locked_out = cluster.user().await;
    let healthy = cluster.user().await;
    let connection = client(&locked_out)
        .get_async_connection()
        .await
        .expect("connect to the private cluster");
    let prefix = unique_prefix("heal");
    let heals = RedisStore::from_cluster_client(client(&healthy), connection.clone())
        .key_prefix(prefix.clone())
        .timeout(STORE_TIMEOUT)
        .heal_after(HEAL_AFTER);
    let cannot_heal = RedisStore::from_cluster(connection)
        .key_prefix(prefix)
        .timeout(STORE_TIMEOUT);
    reserve(&heals, "before")
        .await
        .expect("the connection works");
    reserve(&cannot_heal, "before-too")
        .await
        .expect("the connection works");

    lock_out(cluster, &mut locked_out).await;
    let failed = reserve(&heals, "locked-out").await;
    assert!(failed.is_err(), "the locked-out connection still answers");

    // The heal bound, a new connection (bounded by the client's timeouts) and a few calls.
    succeeds_within(HEAL_AFTER + Duration::from_secs(4), &heals, "after").await;
    let warned = logs
        .lines()
        .into_iter()
        .any(|line| line.starts_with("WARN") && line.contains("replaced with a new one"));
    assert!(warned, "the replacement was not logged: {:?}", logs.lines());
    let still = reserve(&cannot_heal, "without-client").await;
    assert!(
        still.is_err(),
        "the connection recovered by itself, so this test shows nothing: {still:?}"
    );
}

/// 32 senders go through the production stack while every connection of the store's user
/// is killed about ten times a second for five seconds; once the kills stop, every sender
/// succeeds again within 5 s, and no key reached the provider twice. Without healing
/// (`heal_after` of days) this failed in 1 of 2 runs, the cluster client stuck for good; with
/// 30 s of kills, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn after_a_storm_of_killed_connections_every_sender_sends_again() {
    const SENDERS: usize = 32;
    const STORM: Duration = Duration::from_secs(5);
    let Some(cluster) = RedisCluster::shared() else {
        return;
    };
    let mut user = cluster.user().await;
    let store = RedisStore::connect_cluster(user.urls.iter().map(String::as_str))
        .await
        .expect("connect to the private cluster")
        .key_prefix(unique_prefix("storm"))
        .timeout(STORE_TIMEOUT)
        .heal_after(HEAL_AFTER);
    let sent: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let per_key = Arc::clone(&sent);
    let provider = Provider::answering(move |n, m| {
        let key = m
            .idempotency_key()
            .map(|k| k.as_str().to_owned())
            .unwrap_or_default();
        *per_key
            .lock()
            .expect("no panic holds the map")
            .entry(key)
            .or_default() += 1;
        async move { Ok(Receipt::new(format!("msg-{n}"), "fake")) }
    });
    let layer = IdempotencyLayer::builder()
        .store(store)
        .namespace("storm")
        .lease(Duration::from_secs(30))
        .build()
        .expect("valid layer");
    let retry = RetryPolicy::new()
        .max_attempts(3)
        .base_delay(Duration::from_millis(20))
        .classifier(layer.classifier());
    let service = ServiceBuilder::new()
        .layer(layer.clone())
        .layer(RetryLayer::new(retry))
        .concurrency_limit(16)
        .timeout(Duration::from_secs(1))
        .service(provider.clone());

    let calm = Arc::new(AtomicBool::new(false));
    let mut senders = Vec::new();
    for s in 0..SENDERS {
        let service = service.clone();
        let calm = Arc::clone(&calm);
        senders.push(tokio::spawn(async move {
            let mut keys = Vec::new();
            let mut calm_since: Option<Instant> = None;
            for n in 0.. {
                let key = format!("order.paid:s{s}:{n}:email");
                keys.push(key.clone());
                let result: Result<Receipt, SendError> =
                    service.clone().oneshot(message(Some(&key), "Paid.")).await;
                if let Some(since) = calm_since {
                    if result.is_ok() {
                        return (since.elapsed(), keys);
                    }
                    assert!(
                        since.elapsed() < Duration::from_secs(5),
                        "sender {s}: no send succeeded within 5 s of calm; last {result:?}"
                    );
                } else if calm.load(Ordering::SeqCst) {
                    calm_since = Some(Instant::now());
                }
                // Paces the senders; the calls themselves are bounded by the store's timeout.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            unreachable!("the loop returns")
        }));
    }

    let start = Instant::now();
    let mut kills = 0;
    let mut killed = 0;
    while start.elapsed() < STORM {
        killed += user.kill_connections().await.expect("CLIENT KILL");
        kills += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    calm.store(true, Ordering::SeqCst);
    assert!(
        killed > 0,
        "the storm killed no connection in {kills} rounds"
    );

    let mut every_key = Vec::new();
    for sender in senders {
        let (took, keys) = sender.await.expect("the sender did not panic");
        assert!(took < Duration::from_secs(5), "{took:?}");
        every_key.extend(keys);
    }
    // Every key once more, after calm: kept outcomes are replayed, held ones refused.
    for key in &every_key {
        let _ = service.clone().oneshot(message(Some(key), "Paid.")).await;
    }
    let sent = sent.lock().expect("no panic holds the map");
    let twice: Vec<_> = sent.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "sent more than once: {twice:?}");
    assert!(!sent.is_empty(), "nothing was sent at all");
    eprintln!(
        "storm: {kills} rounds killed {killed} connections; {} keys, {} sent; stats {:?}",
        every_key.len(),
        sent.len(),
        layer.stats()
    );
}
