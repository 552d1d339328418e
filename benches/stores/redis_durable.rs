//! `RedisStore::require_replicas`: a fresh reserve, from 1 and 32 tasks at once, on a primary
//! with one replica, with the option off and with `require_replicas(1, 100 ms)` (`WAIT 1 100`
//! in the reserve's pipeline).
//!
//! Runs when `REDIS_REPLICATED_URL` names a primary with at least one live replica:
//! `redis-server --port 6390 --save ''` and `redis-server --port 6391 --save '' --replicaof
//! 127.0.0.1 6390`, then `REDIS_REPLICATED_URL=redis://127.0.0.1:6390 cargo bench --features
//! redis --bench stores -- redis-durable`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use futures_util::future::join_all;

use tower_idempotency::RedisStore;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::store::{Store, Token};

/// Short, so the keys a run makes leave the server soon after.
const LEASE: Duration = Duration::from_secs(10);

/// Benchmarks reserves with and without replicas acknowledging; skips without a primary.
pub fn bench(c: &mut Criterion) {
    let Some(url) = std::env::var("REDIS_REPLICATED_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!("skipped: REDIS_REPLICATED_URL is not set (redis durability benchmark)");
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let prefix = format!("bench:{}:", Token::new());
    let plain = runtime
        .block_on(RedisStore::connect(&url))
        .expect("connect to REDIS_REPLICATED_URL")
        .key_prefix(prefix);
    let durable = plain
        .clone()
        .require_replicas(1, Duration::from_millis(100));
    let next = AtomicU64::new(0);
    let fingerprint = Fingerprint::from_bytes([7; 32]);
    let reserve = |store: &RedisStore| {
        let key = format!("k{}", next.fetch_add(1, Ordering::Relaxed));
        let store = store.clone();
        async move {
            let reserved = store.reserve(&key, fingerprint, LEASE).await;
            assert!(
                matches!(&reserved, Ok(r) if r.token().is_some()),
                "reserve: {reserved:?}"
            );
        }
    };

    let mut group = c.benchmark_group("redis-durable/reserve");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for concurrency in [1usize, 32] {
        group.throughput(Throughput::Elements(concurrency as u64));
        for (name, store) in [("off", &plain), ("require_replicas(1)", &durable)] {
            group.bench_function(BenchmarkId::new(name, concurrency), |b| {
                b.to_async(&runtime)
                    .iter(|| join_all((0..concurrency).map(|_| reserve(store))));
            });
        }
    }
    group.finish();
}
