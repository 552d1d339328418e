//! `RedisStore::require_replicas`, on a primary and a replica of the test's own: a write the
//! replica acknowledged sends once and replays; a write no replica acknowledged is a store
//! failure, nothing is sent and the key is left free; with the option off a lone primary
//! works as ever. A failover (the replica promoted by hand, the store pointed at it) after
//! replication stopped sends no reserved message twice with the option, and sends the lost
//! ones again without it.
#![cfg(feature = "redis")]

mod support;

use std::time::Duration;

use support::replicated::{assert_only_lost_writes_went_again, layer, send};
use support::servers::RedisServer;
use support::servers::sentinel::{cut_replication, replication};
use support::stores::unique_prefix;
use support::{Provider, SendLog, poll_until};
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::codes;
use tower_idempotency::store::StoreErrorKind;
use tower_idempotency::store::admin::StoreAdmin;
use tower_idempotency::{RedisStore, Store};

const NAMESPACE: &str = "durable";
/// How long the primary waits for the replica's acknowledgement.
const WAIT: Duration = Duration::from_millis(300);
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

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
    let layer = layer(store, NAMESPACE);
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
    let layer = layer(store.clone(), NAMESPACE);
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
    let layer = layer(store, NAMESPACE);
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
    let layer = layer(store.clone(), NAMESPACE);
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

/// A release waits for the replicas too: one they did not acknowledge freed the key on the
/// primary but fails, so the layer's settlement retry releases it again (on a new primary
/// after a failover); a release that freed nothing is not refused. A lease renewal is not
/// waited for: the next renewal heals a lost one.
#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn a_release_no_replica_acknowledged_fails_though_the_key_is_free_and_a_renewal_goes_on() {
    let Some(primary) = RedisServer::start().await else {
        return;
    };
    let Some(replica) = RedisServer::start_replica_of(&primary).await else {
        return;
    };
    let store = primary
        .store(unique_prefix("durable-release"), STORE_TIMEOUT)
        .await
        .require_replicas(1, WAIT);
    let lease = Duration::from_secs(60);
    let fingerprint = Fingerprint::from_bytes([5; 32]);
    let reserved = |key: &'static str| {
        let store = store.clone();
        async move {
            store
                .reserve(key, fingerprint, lease)
                .await
                .expect("reserved with the replica up")
                .token()
                .expect("the key is ours")
        }
    };
    let released = reserved("released").await;
    let renewed = reserved("renewed").await;
    let released_many = reserved("released-many").await;
    cut_replication(replica.port(), primary.port(), 0).await;

    let error = store
        .release("released", released)
        .await
        .expect_err("no replica acknowledged the release");
    assert_eq!(error.kind(), StoreErrorKind::Unavailable, "{error}");
    assert!(error.to_string().contains("0 acknowledged"), "{error}");
    assert!(store.inspect("released").await.expect("inspect").is_none());
    let again = store.release("released", released).await;
    assert!(
        matches!(again, Ok(false)),
        "a release that freed nothing: {again:?}"
    );

    let many = store
        .release_many(&[("released-many", released_many)])
        .await;
    assert!(
        many.is_err(),
        "no replica acknowledged the batch's release: {many:?}"
    );
    assert!(
        store
            .inspect("released-many")
            .await
            .expect("inspect")
            .is_none()
    );

    let extended = store.extend("renewed", renewed, lease).await;
    assert!(
        matches!(extended, Ok(true)),
        "a renewal with no replica: {extended:?}"
    );
}

/// Keys sent, the replica cut off, more keys sent (refused with `require_replicas`), the
/// primary killed and the replica promoted (`REPLICAOF NO ONE`, as an operator or a failover
/// script does), a store on it, then every key sent again: answers the sends per key and how
/// many went twice.
async fn failover_after_replication_stopped(require_replicas: bool) -> (SendLog, usize) {
    let primary = RedisServer::start().await.expect("redis-server");
    let replica = RedisServer::start_replica_of(&primary)
        .await
        .expect("redis-server");
    let prefix = unique_prefix("durable-failover");
    let with_option = |store: RedisStore| {
        if require_replicas {
            store.require_replicas(1, WAIT)
        } else {
            store
        }
    };
    let before = layer(
        with_option(primary.store(prefix.clone(), STORE_TIMEOUT).await),
        NAMESPACE,
    );
    let sends = SendLog::default();
    let provider = sends.provider();
    let acked: Vec<String> = (0..10).map(|i| format!("acked:{i}")).collect();
    for key in &acked {
        send(&before, &provider, key).await.expect("sent");
    }
    let offset = |port: u16, field: &'static str| async move {
        replication(port)
            .await
            .and_then(|info| info.get(field)?.parse::<u64>().ok())
    };
    let written = offset(primary.port(), "master_repl_offset").await;
    poll_until(
        "the replica catches up",
        Duration::from_secs(10),
        || async { offset(replica.port(), "slave_repl_offset").await >= written },
    )
    .await;
    cut_replication(replica.port(), primary.port(), 0).await;
    let lost: Vec<String> = (0..10).map(|i| format!("lost:{i}")).collect();
    for key in &lost {
        let sent = send(&before, &provider, key).await;
        if require_replicas {
            let refused = sent.expect_err("no replica acknowledges the reservation");
            assert_eq!(refused.code(), codes::STORE_FAILED, "{refused}");
        } else {
            sent.expect("sent on the primary alone");
        }
    }

    drop(primary);
    let mut admin = support::stores::redis_admin::admin(&replica.url).await;
    let () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut admin)
        .await
        .expect("promote the replica");
    // A replica of the new primary, so the option can be met.
    let _replica_of_new = RedisServer::start_replica_of(&replica)
        .await
        .expect("redis-server");
    let after = layer(
        with_option(replica.store(prefix, STORE_TIMEOUT).await),
        NAMESPACE,
    );
    for key in acked.iter().chain(&lost) {
        send(&after, &provider, key)
            .await
            .expect("sent or replayed after the failover");
    }
    let extra = sends.extra();
    (sends, extra)
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn with_require_replicas_a_promoted_replica_sends_no_reserved_message_twice() {
    let (sends, extra) = failover_after_replication_stopped(true).await;

    assert_eq!(extra, 0, "sent twice: {:?}", sends.per_key());
    assert_eq!(sends.per_key().len(), 20, "{:?}", sends.per_key());
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn without_require_replicas_a_promoted_replica_sends_the_lost_messages_again() {
    let (sends, extra) = failover_after_replication_stopped(false).await;

    // What the replica never received is gone: those messages went again; the ones it had
    // replayed.
    assert_only_lost_writes_went_again(&sends, extra);
}
