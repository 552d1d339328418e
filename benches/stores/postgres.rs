//! `PostgresStore` against a hand-written claim through the same pool (`minimal`: an
//! `INSERT … ON CONFLICT DO NOTHING` to reserve, an `UPDATE` fenced by the token to complete),
//! at concurrency 1 and 64: reserve + complete pairs per second, and so the cost of the
//! store's guarantees and of our code over what a user would write instead.
//!
//! Then 100 keys through `reserve_many` + `complete_many` (two statements) against the same
//! 100 keys as single reserve + complete pairs, one caller: keys per second.
//!
//! Runs when `DATABASE_URL` is set, on a table of its own that it drops at the end.
//! With `STORES_INTERLEAVED=<rounds>` the pairs of the store and of minimal run instead in
//! alternating slices, at 1 and at 64, and print the median ratio (see [`interleaved`]):
//! `DATABASE_URL=… STORES_INTERLEAVED=21 cargo bench --bench stores -- '^postgres'`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;
use tower_idempotency::PostgresStore;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::{Outcome, Receipt};
use tower_idempotency::store::{Completion, Reservation, Store, Token};
use uuid::Uuid;

use crate::interleave::{Compared, alternate};

const CONCURRENCY: [usize; 2] = [1, 64];
const LEASE: Duration = Duration::from_secs(600);
const TTL: Duration = Duration::from_secs(3600);
const BATCH: usize = 100;

/// The hand-written claim: a reserve that inserts the key or does nothing, and a complete
/// that writes the outcome while the token still holds the key.
fn minimal_reserve_sql(table: &str) -> String {
    format!(
        "INSERT INTO \"{table}\" (key, state, token, fingerprint, expires_at)
         VALUES ($1, 'pending', $2, $3, now() + $4::bigint * interval '1 millisecond')
         ON CONFLICT (key) DO NOTHING"
    )
}

fn minimal_complete_sql(table: &str) -> String {
    format!(
        "UPDATE \"{table}\" SET state = 'done', outcome = $3::text::jsonb,
             expires_at = now() + $4::bigint * interval '1 millisecond'
         WHERE key = $1 AND token = $2"
    )
}

/// Which side issues a pair.
#[derive(Clone, Copy)]
enum Side {
    /// `PostgresStore`.
    Store,
    /// The hand-written claim through the same pool.
    Minimal,
}

/// What a pair needs, shared by the tasks of one measurement.
struct Bench {
    store: PostgresStore,
    pool: Pool,
    /// The hand-written reserve and complete.
    minimal: [String; 2],
    prefix: String,
    next: AtomicU64,
    outcome: Outcome,
    outcome_json: String,
}

impl Bench {
    fn key(&self) -> String {
        format!(
            "{}:{}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }

    async fn store_pair(&self) {
        let key = self.key();
        let fingerprint = Fingerprint::from_bytes([7; 32]);
        let Ok(Reservation::Reserved { token }) =
            self.store.reserve(&key, fingerprint, LEASE).await
        else {
            panic!("a fresh key was not reserved")
        };
        let written = self
            .store
            .complete(&key, token, fingerprint, &self.outcome, TTL)
            .await
            .expect("complete");
        assert!(written);
    }

    /// `BATCH` fresh keys reserved and completed in one `reserve_many` and one
    /// `complete_many`.
    async fn store_batch(&self) {
        let keys: Vec<String> = (0..BATCH).map(|_| self.key()).collect();
        let fingerprint = Fingerprint::from_bytes([7; 32]);
        let requests: Vec<(&str, Fingerprint)> =
            keys.iter().map(|key| (key.as_str(), fingerprint)).collect();
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
                    fingerprint,
                    outcome: &self.outcome,
                },
                _ => panic!("a fresh key was not reserved"),
            })
            .collect();
        let written = self
            .store
            .complete_many(&completions, TTL)
            .await
            .expect("complete_many");
        assert!(written.iter().all(|w| *w));
    }

    /// A pair of the hand-written statements through the pool.
    async fn minimal_pair(&self) {
        let [reserve, complete] = &self.minimal;
        let key = self.key();
        let token = Token::new();
        let fingerprint: &[u8] = &[7; 32];
        let lease = LEASE.as_millis() as i64;
        let ttl = TTL.as_millis() as i64;
        let client = self.pool.get().await.expect("connection");
        let statement = client.prepare_cached(reserve).await.expect("prepare");
        let reserved = client
            .execute(
                &statement,
                &[&key, &Uuid::from(token), &fingerprint, &lease],
            )
            .await
            .expect("reserve");
        assert_eq!(reserved, 1, "a fresh key was not reserved");
        drop(client);
        let client = self.pool.get().await.expect("connection");
        let statement = client.prepare_cached(complete).await.expect("prepare");
        let written = client
            .execute(
                &statement,
                &[&key, &Uuid::from(token), &self.outcome_json, &ttl],
            )
            .await
            .expect("complete");
        assert_eq!(written, 1);
    }
}

/// Runs `iters` pairs spread over `concurrency` tasks; answers the wall time.
async fn run(bench: &Arc<Bench>, iters: u64, concurrency: usize, side: Side) -> Duration {
    let tasks = concurrency as u64;
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let bench = Arc::clone(bench);
            let pairs = iters / tasks + u64::from(task < iters % tasks);
            tokio::spawn(async move {
                for _ in 0..pairs {
                    match side {
                        Side::Store => bench.store_pair().await,
                        Side::Minimal => bench.minimal_pair().await,
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.expect("bench task");
    }
    start.elapsed()
}

/// Measures reserve + complete pairs per second: ours and the hand-written claim.
pub fn bench(c: &mut Criterion) {
    let rounds = crate::interleave::rounds("STORES_INTERLEAVED");
    if rounds.is_some() && !crate::filter::selected("postgres/reserve+complete") {
        return;
    }
    let Some(url) = std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let table = format!("idem_bench_{}", Uuid::new_v4().simple());
    let max = CONCURRENCY.into_iter().max().unwrap_or(1);

    let bench = runtime.block_on(async {
        let config: tokio_postgres::Config = url.parse().expect("DATABASE_URL");
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager).max_size(max).build().expect("pool");
        let store = PostgresStore::new(pool.clone())
            .table(&table)
            .expect("table name")
            .timeout(Duration::from_secs(30));
        store.migrate().await.expect("migrate");
        // Open every connection up front, so no measurement pays for connecting.
        let clients = futures_util::future::try_join_all((0..max).map(|_| pool.get()))
            .await
            .expect("connections");
        let version: String = clients[0]
            .query_one("SHOW server_version", &[])
            .await
            .expect("version")
            .get(0);
        eprintln!("postgres bench: PostgreSQL {version}, pool of {max}, table {table}");
        drop(clients);
        let outcome = Outcome::sent(Receipt::new("msg_0123456789", "bench").with_accepted(["a@x"]));
        Arc::new(Bench {
            outcome_json: String::from_utf8(
                tower_idempotency::store::record::encode_outcome(&outcome).expect("outcome"),
            )
            .expect("UTF-8"),
            outcome,
            store,
            pool,
            minimal: [minimal_reserve_sql(&table), minimal_complete_sql(&table)],
            prefix: format!("bench:{}", Uuid::new_v4().simple()),
            next: AtomicU64::new(0),
        })
    });

    if let Some(rounds) = rounds {
        for concurrency in CONCURRENCY {
            interleaved(&runtime, &bench, concurrency, rounds);
        }
    } else {
        groups(c, &runtime, &bench);
    }

    runtime.block_on(async {
        let client = bench.pool.get().await.expect("connection");
        client
            .batch_execute(&format!("DROP TABLE \"{table}\""))
            .await
            .expect("drop the bench table");
    });
}

/// Times the store's pairs and minimal's in alternating slices of about 0.3 s each (which goes
/// first alternates too), `rounds` times, and prints each side's median time per pair and
/// the median over the rounds of minimal's time ÷ ours (above 1: we are faster). Criterion runs
/// the two sides seconds apart, and a shared machine's load moved their ratio by up to 0.2
/// between two runs of the same code; a round's two slices run moments apart.
fn interleaved(
    runtime: &tokio::runtime::Runtime,
    bench: &Arc<Bench>,
    concurrency: usize,
    rounds: usize,
) {
    let probe = runtime.block_on(run(bench, 64, concurrency, Side::Store));
    let pairs = ((0.3 / probe.as_secs_f64()) * 64.0) as u64;
    let pairs = pairs.clamp(64, 100_000);
    let per_pair = |d: Duration| d.as_secs_f64() * 1e6 / pairs as f64;
    let timed = alternate(
        rounds,
        || runtime.block_on(run(bench, pairs, concurrency, Side::Store)),
        || runtime.block_on(run(bench, pairs, concurrency, Side::Minimal)),
    );
    let c = Compared::of(&timed, per_pair);
    let ratios = c.b_over_a;
    println!(
        "postgres/reserve+complete/{concurrency}: ours {:.1} µs, minimal {:.1} µs a pair \
         (medians of {rounds} slices of {pairs} pairs); minimal ÷ ours: median {:.2}, range {:.2} to {:.2}",
        c.a.median, c.b.median, ratios.median, ratios.low, ratios.high,
    );
}

/// The criterion benchmarks: pairs at each concurrency on every side, then batches.
fn groups(c: &mut Criterion, runtime: &tokio::runtime::Runtime, bench: &Arc<Bench>) {
    let mut group = c.benchmark_group("postgres");
    group
        .throughput(Throughput::Elements(1))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for concurrency in CONCURRENCY {
        let sides = [("store", Side::Store), ("minimal", Side::Minimal)];
        for (name, side) in sides {
            group.bench_with_input(
                BenchmarkId::new(format!("reserve+complete/{name}"), concurrency),
                &concurrency,
                |b, &concurrency| {
                    b.to_async(runtime)
                        .iter_custom(|iters| run(bench, iters, concurrency, side));
                },
            );
        }
    }
    group.finish();

    let mut group = c.benchmark_group("postgres/100 keys");
    group
        .throughput(Throughput::Elements(BATCH as u64))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    group.bench_function("reserve_many+complete_many", |b| {
        b.to_async(runtime).iter_custom(|iters| {
            let bench = Arc::clone(bench);
            async move {
                let start = Instant::now();
                for _ in 0..iters {
                    bench.store_batch().await;
                }
                start.elapsed()
            }
        });
    });
    group.bench_function("100 × reserve+complete", |b| {
        b.to_async(runtime)
            .iter_custom(|iters| run(bench, iters * BATCH as u64, 1, Side::Store));
    });
    group.finish();
}
