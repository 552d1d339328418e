//! `RedisStore` against the minimal commands a user would write instead, in one run: reserve +
//! complete pairs per second at concurrency 1 and 64. "minimal" is a `SET NX GET` then a fenced
//! write of the done record (`stores/raw_redis.rs`), through the same connection.
//!
//! `redis/batch-100` puts 100 keys through `reserve_many` then `complete_many` (two
//! pipelines) against 100 `reserve` + `complete` pairs one after the other, and 100 pairs all
//! in flight together on the one connection.
//!
//! Runs when `REDIS_URL` is set: `REDIS_URL=redis://127.0.0.1:6379 cargo bench --all-features
//! --bench stores -- redis`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use futures_util::future::join_all;
use redis::aio::ConnectionManager;

use crate::raw_redis::MinimalRedis;
use tower_idempotency::RedisStore;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::{Outcome, Receipt};
use tower_idempotency::store::{Completion, Reservation, Store, Token};

/// Short, so the keys a run makes leave the server soon after.
const LEASE: Duration = Duration::from_secs(10);
const TTL: Duration = Duration::from_secs(10);

struct Fixture {
    store: RedisStore,
    manager: ConnectionManager,
    raw: MinimalRedis,
    prefix: String,
    fingerprint: Fingerprint,
    outcome: Outcome,
    next: AtomicU64,
}

impl Fixture {
    fn key(&self) -> String {
        format!("k{}", self.next.fetch_add(1, Ordering::Relaxed))
    }

    async fn ours(&self) {
        let key = self.key();
        match self.store.reserve(&key, self.fingerprint, LEASE).await {
            Ok(Reservation::Reserved { token }) => {
                let wrote = self
                    .store
                    .complete(&key, token, self.fingerprint, &self.outcome, TTL)
                    .await;
                assert!(matches!(wrote, Ok(true)), "complete: {wrote:?}");
            }
            other => panic!("reserve of a fresh key: {other:?}"),
        }
    }

    async fn batch(&self, n: usize) {
        let keys: Vec<String> = (0..n).map(|_| self.key()).collect();
        let requests: Vec<(&str, Fingerprint)> = keys
            .iter()
            .map(|k| (k.as_str(), self.fingerprint))
            .collect();
        let answers = self
            .store
            .reserve_many(&requests, LEASE)
            .await
            .expect("reserve_many");
        let completions: Vec<Completion<'_>> = answers
            .into_iter()
            .zip(&keys)
            .map(|(answer, key)| match answer {
                Ok(Reservation::Reserved { token }) => Completion {
                    key,
                    token,
                    fingerprint: self.fingerprint,
                    outcome: &self.outcome,
                },
                other => panic!("reserve of a fresh key: {other:?}"),
            })
            .collect();
        let wrote = self
            .store
            .complete_many(&completions, TTL)
            .await
            .expect("complete_many");
        assert!(wrote.iter().all(|w| *w), "complete_many: {wrote:?}");
    }

    async fn raw(&self) {
        let key = format!("{}{}", self.prefix, self.key());
        let mut connection = self.manager.clone();
        let free = self.raw.send(&mut connection, &key, LEASE, TTL).await;
        assert!(free, "fresh key held");
    }
}

/// Benchmarks `RedisStore` and the minimal commands on `REDIS_URL`; skips when it is unset.
pub fn bench(c: &mut Criterion) {
    let Some(url) = std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()) else {
        eprintln!("skipped: REDIS_URL is not set (redis store benchmark)");
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let prefix = format!("bench:{}:", Token::new());
    let fixture = runtime.block_on(async {
        let client = redis::Client::open(url.as_str()).expect("valid REDIS_URL");
        let mut manager = ConnectionManager::new(client)
            .await
            .expect("connect to REDIS_URL");
        let raw = MinimalRedis::load(&mut manager).await;
        Fixture {
            store: RedisStore::new(manager.clone()).key_prefix(prefix.clone()),
            manager,
            raw,
            prefix,
            fingerprint: Fingerprint::from_bytes([7; 32]),
            outcome: Outcome::sent(Receipt::new("msg-1", "bench")),
            next: AtomicU64::new(0),
        }
    });

    let mut group = c.benchmark_group("redis/reserve+complete");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for concurrency in [1usize, 64] {
        // One iteration is `concurrency` pairs in flight together on the one connection.
        group.throughput(Throughput::Elements(concurrency as u64));
        let fixture = &fixture;
        group.bench_function(BenchmarkId::new("RedisStore", concurrency), |b| {
            b.to_async(&runtime)
                .iter(|| join_all((0..concurrency).map(|_| fixture.ours())));
        });
        group.bench_function(BenchmarkId::new("minimal", concurrency), |b| {
            b.to_async(&runtime)
                .iter(|| join_all((0..concurrency).map(|_| fixture.raw())));
        });
    }
    group.finish();

    let mut group = c.benchmark_group("redis/batch-100");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(100));
    let fixture = &fixture;
    group.bench_function("reserve_many+complete_many", |b| {
        b.to_async(&runtime).iter(|| fixture.batch(100));
    });
    group.bench_function("sequential reserve+complete", |b| {
        b.to_async(&runtime).iter(|| async {
            for _ in 0..100 {
                fixture.ours().await;
            }
        });
    });
    group.bench_function("concurrent reserve+complete", |b| {
        b.to_async(&runtime)
            .iter(|| join_all((0..100).map(|_| fixture.ours())));
    });
    group.finish();
}
