//! `RedisStore` against the minimal commands a user would write instead, in one run: reserve +
//! complete pairs per second at concurrency 1 and 64. "minimal" is a `SET NX GET` then a fenced
//! write of the done record (`stores/raw_redis.rs`), through the same connection.
//!
//! `redis/batch-100` puts 100 keys through `reserve_many` then `complete_many` (two
//! pipelines) against 100 `reserve` + `complete` pairs one after the other, and 100 pairs all
//! in flight together on the one connection.
//!
//! `redis/replay` answers a key already done, from 1 and 64 tasks: our `reserve` against the
//! minimal `SET NX GET` that finds the key held.
//!
//! Then, outside criterion, it prints the server's time per replay and per fresh pair by `INFO
//! commandstats` (the time the server spends running the commands, the whole of each call
//! counted): ours against the minimal commands. Run it on a server no other client uses, or
//! the others' commands count too.
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

    /// Our replay of `key`, done.
    async fn ours_replay(&self, key: &str) {
        match self.store.reserve(key, self.fingerprint, LEASE).await {
            Ok(Reservation::Held { record }) => assert!(record.outcome.is_some()),
            other => panic!("reserve of a done key: {other:?}"),
        }
    }

    /// The minimal replay of `key` (with the prefix), done: `SET NX GET` finds it held.
    async fn raw_replay(&self, key: &str) {
        let mut connection = self.manager.clone();
        let free = self.raw.send(&mut connection, key, LEASE, TTL).await;
        assert!(!free, "done key free");
    }

    /// A done key of ours and one of the minimal commands, to replay.
    async fn done_keys(&self) -> (String, String) {
        let ours = self.key();
        self.ours_at(&ours).await;
        let raw = format!("{}{}", self.prefix, self.key());
        let mut connection = self.manager.clone();
        assert!(
            self.raw
                .send(&mut connection, &raw, TTL * 30, TTL * 30)
                .await
        );
        (ours, raw)
    }

    async fn ours_at(&self, key: &str) {
        let Ok(Reservation::Reserved { token }) =
            self.store.reserve(key, self.fingerprint, TTL * 30).await
        else {
            panic!("reserve of a fresh key")
        };
        let wrote = self
            .store
            .complete(key, token, self.fingerprint, &self.outcome, TTL * 30)
            .await;
        assert!(matches!(wrote, Ok(true)), "complete: {wrote:?}");
    }

    /// The server's time for all commands so far, in µs, and their calls.
    async fn server_usec(&self) -> (u64, u64) {
        let mut connection = self.manager.clone();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut connection)
            .await
            .expect("INFO commandstats");
        let field = |line: &str, name: &str| -> u64 {
            line.split([':', ','])
                .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        info.lines()
            .filter(|line| line.starts_with("cmdstat_") && !line.starts_with("cmdstat_info"))
            .fold((0, 0), |(usec, calls), line| {
                (usec + field(line, "usec"), calls + field(line, "calls"))
            })
    }

    /// Server µs and commands per call of `op`, run `n` times one after another.
    async fn server_cost<F: Future<Output = ()>>(&self, n: u64, op: impl Fn() -> F) -> (f64, f64) {
        let (usec, calls) = self.server_usec().await;
        for _ in 0..n {
            op().await;
        }
        let (usec_after, calls_after) = self.server_usec().await;
        (
            (usec_after - usec) as f64 / n as f64,
            // The second INFO is counted once, after the run.
            (calls_after - calls) as f64 / n as f64,
        )
    }
}

/// Prints the server's time per replay and per fresh pair, ours against the minimal commands.
fn server_time(runtime: &tokio::runtime::Runtime, fixture: &Fixture) {
    const N: u64 = 10_000;
    runtime.block_on(async {
        let (ours_key, raw_key) = fixture.done_keys().await;
        let ours = fixture
            .server_cost(N, || fixture.ours_replay(&ours_key))
            .await;
        let raw = fixture
            .server_cost(N, || fixture.raw_replay(&raw_key))
            .await;
        println!(
            "redis/server-time/replay: ours {:.2} µs in {:.1} commands, SET NX GET {:.2} µs in \
             {:.1}: {:.2} ×",
            ours.0,
            ours.1,
            raw.0,
            raw.1,
            ours.0 / raw.0
        );
        let ours = fixture.server_cost(N, || fixture.ours()).await;
        let raw = fixture.server_cost(N, || fixture.raw()).await;
        println!(
            "redis/server-time/fresh: ours {:.2} µs in {:.1} commands, minimal {:.2} µs in \
             {:.1}: {:.2} ×",
            ours.0,
            ours.1,
            raw.0,
            raw.1,
            ours.0 / raw.0
        );
    });
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

    let mut group = c.benchmark_group("redis/replay");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let (ours_key, raw_key) = runtime.block_on(fixture.done_keys());
    for concurrency in [1usize, 64] {
        group.throughput(Throughput::Elements(concurrency as u64));
        let (fixture, ours_key, raw_key) = (&fixture, &ours_key, &raw_key);
        group.bench_function(BenchmarkId::new("RedisStore", concurrency), |b| {
            b.to_async(&runtime)
                .iter(|| join_all((0..concurrency).map(|_| fixture.ours_replay(ours_key))));
        });
        group.bench_function(BenchmarkId::new("minimal", concurrency), |b| {
            b.to_async(&runtime)
                .iter(|| join_all((0..concurrency).map(|_| fixture.raw_replay(raw_key))));
        });
    }
    group.finish();
    server_time(&runtime, &fixture);

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
