//! `RedisStore::require_replicas`, on a primary and a replica of the test's own: a write the
//! replica acknowledged sends once and replays; a write no replica acknowledged is a store
//! failure, nothing is sent and the key is left free; with the option off a lone primary
//! works as ever.
#![cfg(feature = "redis")]

mod support;

use std::time::Duration;

use support::servers::RedisServer;
use support::stores::unique_prefix;
use support::{Provider, message};
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::codes;
use tower_idempotency::store::StoreErrorKind;
use tower_idempotency::store::admin::StoreAdmin;
use tower_idempotency::{IdempotencyLayer, RedisStore, Store};

const NAMESPACE: &str = "durable";
/// How long the primary waits for the replica's acknowledgement.
const WAIT: Duration = Duration::from_millis(300);
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

fn layer(store: RedisStore) -> IdempotencyLayer {
    IdempotencyLayer::builder()
        .store(store)
        .namespace(NAMESPACE)
        .build()
        .expect("valid layer")
}

async fn send(
    layer: &IdempotencyLayer,
    provider: &Provider,
    key: &str,
) -> Result<tower_idempotency::Receipt, tower_idempotency::SendError> {
    ServiceBuilder::new()
        .layer(layer.clone())
        .service(provider.clone())
        .oneshot(message(Some(key), "order ord_1 created"))
        .await
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn a_send_its_replica_acknowledged_goes_once_and_replays() {
    let Some(primary) = RedisServer::start().await else {
        return;
    };
    let Some(replica) = RedisServer::start_replica_of(&primary).await else {
        return;
    };
    let prefix = unique_prefix("durable-acked");
    let store = primary
        .store(prefix.clone(), STORE_TIMEOUT)
        .await
        .require_replicas(1, WAIT);
    let layer = layer(store);
    let provider = Provider::ok();

    let first = send(&layer, &provider, "ord_1:email").await.expect("sent");
    let again = send(&layer, &provider, "ord_1:email")
        .await
        .expect("replayed");

    assert_eq!(provider.calls(), 1, "stats {:?}", layer.stats());
    assert_eq!(first.id, again.id);
    // The completion reached the replica before the send answered.
    let on_replica = replica.store(prefix, STORE_TIMEOUT).await;
    let record = on_replica
        .inspect(&format!("{NAMESPACE}:ord_1:email"))
        .await
        .expect("inspect on the replica");
    assert!(record.is_some(), "the replica has no record of the send");
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn a_send_no_replica_acknowledged_fails_sends_nothing_and_frees_the_key() {
    let Some(primary) = RedisServer::start().await else {
        return;
    };
    let Some(replica) = RedisServer::start_replica_of(&primary).await else {
        return;
    };
    let store = primary
        .store(unique_prefix("durable-refused"), STORE_TIMEOUT)
        .await
        .require_replicas(1, WAIT);
    let layer = layer(store.clone());
    let provider = Provider::ok();
    drop(replica);

    let refused = send(&layer, &provider, "ord_1:email")
        .await
        .expect_err("no replica acknowledged the reservation");

    assert_eq!(refused.code(), codes::STORE_FAILED, "{refused}");
    assert_eq!(provider.calls(), 0, "a send went with no replica");
    let key = format!("{NAMESPACE}:ord_1:email");
    let held = store.inspect(&key).await.expect("inspect");
    assert!(
        held.is_none(),
        "the refused reservation holds the key: {held:?}"
    );

    // The store's own answer names how many replicas acknowledged.
    let error = store
        .reserve("direct", Fingerprint::from_bytes([1; 32]), WAIT * 10)
        .await
        .expect_err("no replica");
    assert_eq!(error.kind(), StoreErrorKind::Unavailable);
    assert!(error.to_string().contains("0 acknowledged"), "{error}");
    assert!(store.inspect("direct").await.expect("inspect").is_none());

    // A batch refuses each key it took, and frees it.
    let keys = [
        ("batch:a", Fingerprint::from_bytes([2; 32])),
        ("batch:b", Fingerprint::from_bytes([3; 32])),
    ];
    let answers = store
        .reserve_many(&keys, WAIT * 10)
        .await
        .expect("the batch answers per key");
    for ((key, _), answer) in keys.iter().zip(&answers) {
        assert!(answer.is_err(), "{key} was reserved: {answer:?}");
        assert!(store.inspect(key).await.expect("inspect").is_none());
    }

    // With a replica back, the same message sends, once.
    let Some(_replica) = RedisServer::start_replica_of(&primary).await else {
        return;
    };
    send(&layer, &provider, "ord_1:email")
        .await
        .expect("sent once a replica acknowledges");
    send(&layer, &provider, "ord_1:email")
        .await
        .expect("replayed");
    assert_eq!(provider.calls(), 1, "stats {:?}", layer.stats());
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn with_the_option_off_a_primary_without_replicas_sends() {
    let Some(primary) = RedisServer::start().await else {
        return;
    };
    let store = primary
        .store(unique_prefix("durable-off"), STORE_TIMEOUT)
        .await;
    let layer = layer(store);
    let provider = Provider::ok();

    send(&layer, &provider, "ord_1:email").await.expect("sent");
    send(&layer, &provider, "ord_1:email")
        .await
        .expect("replayed");

    assert_eq!(provider.calls(), 1, "stats {:?}", layer.stats());
}

/// Each slot's pipeline carries its own `WAIT` to the key's node; the private cluster's
/// primaries have no replica, so with the option on every shard refuses every send.
#[cfg(feature = "redis-cluster")]
#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn a_cluster_shard_without_a_replica_refuses_every_send_and_frees_its_keys() {
    let Some(cluster) = support::servers::RedisCluster::shared() else {
        return;
    };
    let user = cluster.user().await;
    let store = RedisStore::connect_cluster(user.urls.iter().map(String::as_str))
        .await
        .expect("connect to the private cluster")
        .key_prefix(unique_prefix("durable-cluster"))
        .timeout(STORE_TIMEOUT)
        .require_replicas(1, WAIT);
    let layer = layer(store.clone());
    let provider = Provider::ok();

    // Keys without a hash tag: several slots, on several primaries.
    let keys: Vec<String> = (0..6).map(|i| format!("ord_{i}:email")).collect();
    for key in &keys {
        let refused = send(&layer, &provider, key)
            .await
            .expect_err("no replica acknowledged the reservation");
        assert_eq!(refused.code(), codes::STORE_FAILED, "{refused}");
    }
    let requests: Vec<(&str, Fingerprint)> = keys
        .iter()
        .map(|k| (k.as_str(), Fingerprint::from_bytes([4; 32])))
        .collect();
    let answers = store
        .reserve_many(&requests, WAIT * 10)
        .await
        .expect("the batch answers per key");

    assert_eq!(provider.calls(), 0, "a send went with no replica");
    for (key, answer) in keys.iter().zip(&answers) {
        assert!(answer.is_err(), "{key} was reserved: {answer:?}");
        assert!(store.inspect(key).await.expect("inspect").is_none());
        let layered = format!("{NAMESPACE}:{key}");
        assert!(store.inspect(&layered).await.expect("inspect").is_none());
    }
}
