//! What the tests of a replicated Redis share (`redis_durability` promotes a replica by hand,
//! `redis_sentinel` lets the sentinels do it): the layer under test, a send through it, and
//! the verdict on a failover that lost the primary's last writes.

use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::{IdempotencyLayer, Receipt, RedisStore, SendError};

use super::{Provider, SendLog, message};

/// The layer under test, on `store`, in `namespace`.
pub fn layer(store: RedisStore, namespace: &str) -> IdempotencyLayer {
    IdempotencyLayer::builder()
        .store(store)
        .namespace(namespace)
        .build()
        .expect("valid layer")
}

/// One message under `key` through `layer` to `provider`.
pub async fn send(
    layer: &IdempotencyLayer,
    provider: &Provider,
    key: &str,
) -> Result<Receipt, SendError> {
    ServiceBuilder::new()
        .layer(layer.clone())
        .service(provider.clone())
        .oneshot(message(Some(key), "order created"))
        .await
}

/// Without `require_replicas`, a failover after replication stopped: the reservations and
/// receipts written after it died with the primary, so some of those messages (`lost:` keys)
/// went again (`extra` sends beyond one a key); the ones the replica had (`acked:` keys)
/// replayed.
pub fn assert_only_lost_writes_went_again(sends: &SendLog, extra: usize) {
    eprintln!("extra sends without require_replicas: {extra} of 10");
    assert!(extra > 0, "no send was lost: {:?}", sends.per_key());
    let per_key = sends.per_key();
    let acked_again = per_key
        .iter()
        .filter(|(k, n)| k.contains("acked:") && **n > 1)
        .count();
    assert_eq!(acked_again, 0, "{per_key:?}");
}
