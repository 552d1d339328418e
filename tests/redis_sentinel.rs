//! `RedisStore` over Redis Sentinel, on a primary, replicas and three sentinels of each test's
//! own (`support::servers::sentinel::SentinelGroup`): the stores' conformance suite; sends
//! resume by themselves after a failover, no message sent twice; with `require_replicas` a
//! failover that loses the primary's last writes sends no reserved message twice, without it
//! the lost ones go again; a primary with no live replica refuses every send and holds no
//! key; a primary that hangs is left for the one the sentinels promote, and so is one that
//! answers `READONLY`.
#![cfg(feature = "redis-sentinel")]

mod support;

use std::time::{Duration, Instant};

use support::replicated::{assert_only_lost_writes_went_again, layer, send};
use support::servers::sentinel::{SentinelGroup, ask, cut_replication};
use support::stores::unique_prefix;
use support::{Provider, SendLog};
use tower_idempotency::outcome::codes;
use tower_idempotency::store::StoreErrorKind;
use tower_idempotency::store::admin::StoreAdmin;
use tower_idempotency::{IdempotencyLayer, RedisStore};

const NAMESPACE: &str = "sentinel";
/// Bounds each store operation: short, so a send during a failover fails soon.
const STORE_TIMEOUT: Duration = Duration::from_millis(700);
/// How long the primary waits for a replica's acknowledgement.
const WAIT: Duration = Duration::from_millis(200);
/// The bound on sends resuming after a failover: the sentinels' own, and a few timeouts.
const RESUME_BOUND: Duration = Duration::from_secs(15);

/// A group shared by the tests that do not fail it over, started by the first of them; its
/// processes stop when the test binary exits.
async fn shared_group() -> Option<&'static SentinelGroup> {
    static GROUP: tokio::sync::OnceCell<Option<SentinelGroup>> = tokio::sync::OnceCell::const_new();
    GROUP.get_or_init(|| SentinelGroup::start(1)).await.as_ref()
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn a_name_the_sentinels_do_not_know_is_unavailable_naming_it() {
    let Some(group) = shared_group().await else {
        return;
    };
    let error = RedisStore::connect_sentinel(group.sentinel_urls(), "no-such-primary")
        .await
        .expect_err("the sentinels know no such primary");

    assert_eq!(error.kind(), StoreErrorKind::Unavailable, "{error}");
    assert!(error.to_string().contains("no-such-primary"), "{error}");
}

/// The conformance suite every store passes, on a store that follows a primary through
/// Sentinel: one group for the binary's conformance tests, started by the first of them.
mod sentinel_conformance {
    use super::*;
    use tower_idempotency::store::conformance::Conformance;

    async fn suite() -> Option<Conformance> {
        let group = shared_group().await?;
        let store = group
            .store(
                unique_prefix("sentinel-conformance"),
                Duration::from_secs(2),
            )
            .await;
        Some(Conformance::with_admin(store))
    }

    tower_idempotency::store_conformance_tests!(
        #[tokio::test]
        #[cfg_attr(
            not(backend_redis_binaries),
            ignore = "no redis-server and redis-cli on PATH"
        )]
        suite()
    );
}

/// Sends fresh keys (`<prefix>:<n>`) until one goes; fails the test past [`RESUME_BOUND`].
/// Answers the keys tried, the one that went last.
async fn resumes(layer: &IdempotencyLayer, provider: &Provider, prefix: &str) -> Vec<String> {
    let start = Instant::now();
    let mut tried = Vec::new();
    loop {
        let key = format!("{prefix}:{}", tried.len());
        let last = send(layer, provider, &key).await;
        tried.push(key);
        if last.is_ok() {
            return tried;
        }
        assert!(
            start.elapsed() < RESUME_BOUND,
            "no send went within {RESUME_BOUND:?} of the failover; last: {last:?}"
        );
        // Polls real servers; each send is bounded by the store's timeout.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends each key again; answers the errors' codes of those that did not go or replay.
async fn repeat_all(layer: &IdempotencyLayer, provider: &Provider, keys: &[String]) -> Vec<String> {
    let mut failed = Vec::new();
    for key in keys {
        if let Err(error) = send(layer, provider, key).await {
            failed.push(format!("{key}: {}", error.code()));
        }
    }
    failed
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn sends_resume_after_a_failover_and_a_killed_primary_with_no_message_sent_twice() {
    let Some(mut group) = SentinelGroup::start(2).await else {
        return;
    };
    let store = group
        .store(unique_prefix("sentinel-resume"), STORE_TIMEOUT)
        .await;
    let layer = layer(store, NAMESPACE);
    let sends = SendLog::default();
    let provider = sends.provider();
    let mut keys: Vec<String> = (0..5).map(|i| format!("before:{i}")).collect();
    for key in &keys {
        send(&layer, &provider, key).await.expect("sent");
    }

    // An operator's failover: the sentinels close the old primary's clients.
    group.synced().await;
    let first = group.primary().await;
    group.failover().await;
    let second = group.new_primary(first).await;
    keys.extend(resumes(&layer, &provider, "after-failover").await);

    // The new primary dies: the store finds the one the sentinels promote next.
    group.synced().await;
    group.kill(second);
    let third = group.new_primary(second).await;
    assert_ne!(third, second);
    keys.extend(resumes(&layer, &provider, "after-kill").await);

    let failed = repeat_all(&layer, &provider, &keys).await;
    assert!(failed.is_empty(), "repeats failed: {failed:?}");
    assert_eq!(sends.extra(), 0, "sent twice: {:?}", sends.per_key());
    assert_eq!(
        sends.per_key().len(),
        keys.len(),
        "every key went once: {:?}",
        sends.per_key()
    );
}

/// A primary that holds every call without closing its connections (a hung server, a host
/// gone without a goodbye) is left once calls go unanswered for `heal_after`: the store asks
/// the sentinels again and finds the replica they promoted.
#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn a_primary_that_stops_answering_is_left_for_the_one_the_sentinels_promote() {
    let Some(group) = SentinelGroup::start(1).await else {
        return;
    };
    let store = group
        .store(unique_prefix("sentinel-hung"), STORE_TIMEOUT)
        .await
        .heal_after(STORE_TIMEOUT * 2);
    let layer = layer(store, NAMESPACE);
    let sends = SendLog::default();
    let provider = sends.provider();
    let mut keys: Vec<String> = (0..5).map(|i| format!("before:{i}")).collect();
    for key in &keys {
        send(&layer, &provider, key).await.expect("sent");
    }

    group.synced().await;
    let hung = group.primary().await;
    group.hang(hung).await;
    group.new_primary(hung).await;
    keys.extend(resumes(&layer, &provider, "after-hang").await);

    let failed = repeat_all(&layer, &provider, &keys).await;
    assert!(failed.is_empty(), "repeats failed: {failed:?}");
    assert_eq!(sends.extra(), 0, "sent twice: {:?}", sends.per_key());
}

/// A primary turned replica under the store's connection answers writes `READONLY` without
/// closing it: the send fails as a store failure, nothing sent, the store drops the connection
/// and asks the sentinels again, and sends resume once they name a primary.
#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn a_primary_that_answers_readonly_is_left_and_the_sentinels_asked_again() {
    let Some(group) = SentinelGroup::start(1).await else {
        return;
    };
    let (logs, _capturing) = support::capture();
    let store = group
        .store(unique_prefix("sentinel-readonly"), STORE_TIMEOUT)
        .await;
    let layer = layer(store, NAMESPACE);
    let provider = Provider::ok();
    send(&layer, &provider, "before").await.expect("sent");

    // A replica of nothing that answers: read-only, its clients' connections kept.
    let primary = group.primary().await;
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let demote = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(nowhere)
        .clone();
    let () = ask(primary, &demote).await.expect("REPLICAOF");
    let refused = send(&layer, &provider, "while-read-only")
        .await
        .expect_err("a replica takes no write");

    assert_eq!(refused.code(), codes::STORE_FAILED, "{refused}");
    assert_eq!(provider.calls(), 1, "a send went on a replica");
    let lines = logs.lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("READONLY") && l.contains("asking the sentinels")),
        "{lines:?}"
    );

    let promote = redis::cmd("REPLICAOF").arg("NO").arg("ONE").clone();
    let () = ask(primary, &promote).await.expect("REPLICAOF NO ONE");
    resumes(&layer, &provider, "after").await;
    send(&layer, &provider, "before").await.expect("replayed");
}

/// Keys sent, the replica cut off, more keys sent (refused with `require_replicas`), the
/// primary killed, the replica promoted, the old primary back as its replica, then every key
/// sent again: answers the provider's sends per key and how many were sent twice.
async fn failover_after_replication_stopped(require_replicas: bool) -> (SendLog, usize) {
    let group = SentinelGroup::start(1).await;
    let mut group = group.expect("redis-server is installed");
    let store = group
        .store(unique_prefix("sentinel-lost"), STORE_TIMEOUT)
        .await;
    let store = if require_replicas {
        store.require_replicas(1, WAIT)
    } else {
        store
    };
    let layer = layer(store, NAMESPACE);
    let sends = SendLog::default();
    let provider = sends.provider();
    let acked: Vec<String> = (0..10).map(|i| format!("acked:{i}")).collect();
    for key in &acked {
        send(&layer, &provider, key).await.expect("sent");
    }

    let primary = group.primary().await;
    let replica = group.replicas().await[0];
    group.synced().await;
    cut_replication(replica, primary, 0).await;
    let lost: Vec<String> = (0..10).map(|i| format!("lost:{i}")).collect();
    for key in &lost {
        let sent = send(&layer, &provider, key).await;
        if require_replicas {
            let refused = sent.expect_err("no replica acknowledges the reservation");
            assert_eq!(refused.code(), codes::STORE_FAILED, "{refused}");
        } else {
            sent.expect("sent on the primary alone");
        }
    }

    group.kill(primary);
    assert_eq!(group.new_primary(primary).await, replica);
    // The old primary comes back empty, as the new one's replica, so the option can be met.
    group.restart_as_replica(primary).await;
    let mut keys = resumes(&layer, &provider, "probe").await;
    keys.extend(acked);
    keys.extend(lost);
    let failed = repeat_all(&layer, &provider, &keys).await;
    assert!(failed.is_empty(), "repeats failed: {failed:?}");
    let extra = sends.extra();
    (sends, extra)
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn with_require_replicas_a_failover_that_loses_the_last_writes_sends_no_message_twice() {
    let (sends, extra) = failover_after_replication_stopped(true).await;

    assert_eq!(extra, 0, "sent twice: {:?}", sends.per_key());
    // Each key went once: the acknowledged ones before the failover, the refused ones after.
    let per_key = sends.per_key();
    let refused_then_sent = per_key.keys().filter(|k| k.contains("lost:")).count();
    assert_eq!(refused_then_sent, 10, "{per_key:?}");
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn without_require_replicas_a_failover_that_loses_the_last_writes_sends_them_again() {
    let (sends, extra) = failover_after_replication_stopped(false).await;

    // The reservations and receipts written after replication stopped died with the primary:
    // those messages went again. The acknowledged ones replayed.
    assert_only_lost_writes_went_again(&sends, extra);
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn a_primary_with_no_live_replica_refuses_sends_holds_no_key_and_sends_once_one_is_back() {
    let Some(mut group) = SentinelGroup::start(1).await else {
        return;
    };
    // Longer bounds than the failover tests': a replica back from the dead may take a while
    // to acknowledge its first write on a loaded machine, and only one send here waits out
    // the whole bound (the refused one).
    let store = group
        .store(unique_prefix("sentinel-alone"), Duration::from_secs(4))
        .await
        .require_replicas(1, Duration::from_secs(2));
    let layer = layer(store.clone(), NAMESPACE);
    let provider = Provider::ok();
    send(&layer, &provider, "with-replica")
        .await
        .expect("sent with the replica up");

    let replica = group.replicas().await[0];
    group.kill(replica);
    let refused = send(&layer, &provider, "alone")
        .await
        .expect_err("no replica acknowledges the reservation");

    assert_eq!(refused.code(), codes::STORE_FAILED, "{refused}");
    assert_eq!(provider.calls(), 1, "a send went with no replica");
    let held = store
        .inspect(&format!("{NAMESPACE}:alone"))
        .await
        .expect("inspect");
    assert!(
        held.is_none(),
        "the refused reservation holds the key: {held:?}"
    );

    group.restart_as_replica(replica).await;
    send(&layer, &provider, "alone")
        .await
        .expect("sent once a replica acknowledges");
    send(&layer, &provider, "alone").await.expect("replayed");
    assert_eq!(provider.calls(), 2);
}
