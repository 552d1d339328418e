//! A claim in a sqlx transaction: `PostgresStore::claim_in_sqlx` against the hand-written
//! `INSERT … ON CONFLICT DO NOTHING` a sqlx user would write instead, each as
//! `BEGIN`, the claim, `COMMIT` on the same sqlx pool, at concurrency 1 and 16: claims per
//! second, and so the cost of the claim's statement (which also takes over an expired row)
//! and of our code around it.
//!
//! Runs when `DATABASE_URL` is set, on a table of its own that it drops at the end. With
//! `STORES_INTERLEAVED=<rounds>` the two sides run instead in alternating slices and print
//! the median ratio: `DATABASE_URL=… STORES_INTERLEAVED=11 cargo bench --bench stores --
//! '^claim_sqlx'`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tower_idempotency::PostgresStore;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::store::{Claim, Token};
use uuid::Uuid;

use crate::interleave::{Compared, alternate};

const CONCURRENCY: [usize; 2] = [1, 16];
const TTL: Duration = Duration::from_secs(3600);

/// Which side writes a claim.
#[derive(Clone, Copy)]
enum Side {
    /// `PostgresStore::claim_in_sqlx`.
    Store,
    /// The hand-written insert through the same pool.
    Minimal,
}

/// What a claim needs, shared by the tasks of one measurement.
struct Bench {
    store: PostgresStore,
    pool: PgPool,
    /// The hand-written claim.
    minimal: String,
    prefix: String,
    next: AtomicU64,
}

impl Bench {
    fn claim(&self) -> Claim {
        let key = format!(
            "{}:{}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        Claim::new(key, Fingerprint::from_bytes([7; 32]), TTL)
    }

    async fn store_claim(&self) {
        let claim = self.claim();
        let mut tx = self.pool.begin().await.expect("begin");
        let claimed = self
            .store
            .claim_in_sqlx(&mut *tx, &claim)
            .await
            .expect("claim");
        assert!(claimed, "a fresh key was not claimed");
        tx.commit().await.expect("commit");
    }

    async fn minimal_claim(&self) {
        let claim = self.claim();
        let mut tx = self.pool.begin().await.expect("begin");
        let done = sqlx::query(&self.minimal)
            .bind(claim.key.as_str())
            .bind(Token::new().to_string())
            .bind(&claim.fingerprint.as_bytes()[..])
            .bind(TTL.as_millis() as i64)
            .execute(&mut *tx)
            .await
            .expect("claim");
        assert_eq!(done.rows_affected(), 1, "a fresh key was not claimed");
        tx.commit().await.expect("commit");
    }
}

/// Runs `iters` claims spread over `concurrency` tasks; answers the wall time.
async fn run(bench: &Arc<Bench>, iters: u64, concurrency: usize, side: Side) -> Duration {
    let tasks = concurrency as u64;
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let bench = Arc::clone(bench);
            let claims = iters / tasks + u64::from(task < iters % tasks);
            tokio::spawn(async move {
                for _ in 0..claims {
                    match side {
                        Side::Store => bench.store_claim().await,
                        Side::Minimal => bench.minimal_claim().await,
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

/// Measures claims per second in a sqlx transaction: ours and the hand-written insert.
pub fn bench(c: &mut Criterion) {
    let rounds = crate::interleave::rounds("STORES_INTERLEAVED");
    if rounds.is_some() && !crate::filter::selected("claim_sqlx/claim") {
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
    let table = format!("idem_bench_sqlx_{}", Uuid::new_v4().simple());
    let max = CONCURRENCY.into_iter().max().unwrap_or(1);

    let bench = runtime.block_on(async {
        let store = PostgresStore::connect(&url)
            .await
            .expect("connect")
            .table(&table)
            .expect("table name");
        store.migrate().await.expect("migrate");
        let pool = PgPoolOptions::new()
            .max_connections(max as u32)
            .min_connections(max as u32)
            .connect(&url)
            .await
            .expect("sqlx pool");
        // Open every connection up front, so no measurement pays for connecting.
        let mut held = Vec::new();
        for _ in 0..max {
            held.push(pool.acquire().await.expect("connection"));
        }
        drop(held);
        eprintln!("claim_sqlx bench: sqlx pool of {max}, table {table}");
        Arc::new(Bench {
            store,
            pool,
            minimal: format!(
                "INSERT INTO \"{table}\" (key, state, token, fingerprint, expires_at)
                 VALUES ($1, 'claimed', $2::uuid, $3,
                         now() + $4::bigint * interval '1 millisecond')
                 ON CONFLICT (key) DO NOTHING"
            ),
            prefix: format!("bench:{}", Uuid::new_v4().simple()),
            next: AtomicU64::new(0),
        })
    });

    if let Some(rounds) = rounds {
        for concurrency in CONCURRENCY {
            interleaved(&runtime, &bench, concurrency, rounds);
        }
    } else {
        let mut group = c.benchmark_group("claim_sqlx");
        group
            .throughput(Throughput::Elements(1))
            .sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(4));
        for concurrency in CONCURRENCY {
            for (name, side) in [("store", Side::Store), ("minimal", Side::Minimal)] {
                group.bench_with_input(
                    BenchmarkId::new(format!("claim/{name}"), concurrency),
                    &concurrency,
                    |b, &concurrency| {
                        b.to_async(&runtime)
                            .iter_custom(|iters| run(&bench, iters, concurrency, side));
                    },
                );
            }
        }
        group.finish();
    }

    runtime.block_on(async {
        sqlx::query(&format!("DROP TABLE \"{table}\""))
            .execute(&bench.pool)
            .await
            .expect("drop the bench table");
    });
}

/// The two sides in alternating slices of about 0.3 s each, `rounds` times; prints each
/// side's median time per claim and the median of minimal's ÷ ours (above 1: we are faster).
fn interleaved(
    runtime: &tokio::runtime::Runtime,
    bench: &Arc<Bench>,
    concurrency: usize,
    rounds: usize,
) {
    let probe = runtime.block_on(run(bench, 64, concurrency, Side::Store));
    let claims = ((0.3 / probe.as_secs_f64()) * 64.0) as u64;
    let claims = claims.clamp(64, 100_000);
    let per_claim = |d: Duration| d.as_secs_f64() * 1e6 / claims as f64;
    let timed = alternate(
        rounds,
        || runtime.block_on(run(bench, claims, concurrency, Side::Store)),
        || runtime.block_on(run(bench, claims, concurrency, Side::Minimal)),
    );
    let c = Compared::of(&timed, per_claim);
    let ratios = c.b_over_a;
    println!(
        "claim_sqlx/claim/{concurrency}: ours {:.1} µs, minimal {:.1} µs a claim \
         (medians of {rounds} slices of {claims} claims); minimal ÷ ours: median {:.2}, \
         range {:.2} to {:.2}",
        c.a.median, c.b.median, ratios.median, ratios.low, ratios.high,
    );
}
