//! The outbox worker against the raw `SKIP LOCKED` statements it issues, in one run: messages
//! per second drained from a table of waiting rows through an instant inner service, by one
//! and by four workers (or raw loops).
//!
//! The raw loop claims a batch with the worker's claim statement and marks each row done with
//! its done statement, through the same pool: what is left is the cost of our code (decoding
//! the stored message, the service call, judging the answer, the counters).
//!
//! Runs when `DATABASE_URL` is set, on a table of its own that it drops at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio::sync::Notify;
use tokio_postgres::NoTls;
use tower_idempotency::outbox::Outbox;
use tower_idempotency::{BoxError, Message, Receipt};
use uuid::Uuid;

/// Rows drained per measured iteration.
const ROWS: usize = 400;
const BATCH: u32 = 16;
const WORKERS: [usize; 2] = [1, 4];
const MESSAGE: &str = r#"{"v":1,"key":"k","from":"shop@example.com","to":["seller@example.com"],"subject":"New order","text":"Sold."}"#;

fn fill_sql(table: &str) -> String {
    format!(
        "INSERT INTO \"{table}\" (key, message)
         SELECT $1 || g, $2::text::jsonb FROM generate_series(1, $3::int) AS g"
    )
}

/// The worker's claim and done statements, as `Outbox` writes them.
fn claim_sql(table: &str) -> String {
    format!(
        "UPDATE \"{table}\" AS o
         SET claim_token = $1, claimed_until = now() + $2::bigint * interval '1 millisecond',
             attempts = o.attempts + 1
         WHERE o.id IN (
             SELECT id FROM \"{table}\"
             WHERE state = 'waiting' AND available_at <= now()
               AND (claimed_until IS NULL OR claimed_until <= now())
             ORDER BY available_at, id LIMIT $3 FOR UPDATE SKIP LOCKED)
         RETURNING o.id, o.message::text, o.attempts,
             (extract(epoch FROM now() - o.available_at) * 1000)::bigint"
    )
}

fn done_sql(table: &str) -> String {
    format!(
        "UPDATE \"{table}\" SET state = 'done', finished_at = now(), provider_id = $3,
             transport = $4, last_error = NULL, claim_token = NULL, claimed_until = NULL
         WHERE id = $1 AND claim_token = $2"
    )
}

/// A table of `ROWS` waiting rows and nothing else, so every measurement starts alike (no
/// dead tuples left by the one before).
async fn fill(pool: &Pool, table: &str, round: usize) {
    let client = pool.get().await.expect("connection");
    client
        .batch_execute(&format!("TRUNCATE \"{table}\""))
        .await
        .expect("truncate");
    let prefix = format!("r{round}-");
    client
        .execute(&fill_sql(table), &[&prefix, &MESSAGE, &(ROWS as i32)])
        .await
        .expect("fill");
}

/// `workers` outbox workers drain `ROWS` rows; the time from start to the last one done.
async fn drain_with_workers(outbox: &Outbox, workers: usize) -> Duration {
    let sent = Arc::new(AtomicUsize::new(0));
    let all_sent = Arc::new(Notify::new());
    let start = Instant::now();
    let runs: Vec<_> = (0..workers)
        .map(|_| {
            let (done, counted) = (Arc::clone(&all_sent), Arc::clone(&sent));
            let (sent, all_sent) = (Arc::clone(&sent), Arc::clone(&all_sent));
            let service = tower::service_fn(move |_m: Message| {
                if sent.fetch_add(1, Ordering::SeqCst) + 1 == ROWS {
                    all_sent.notify_waiters();
                }
                async { Ok::<_, BoxError>(Receipt::new("id", "bench")) }
            });
            let worker = outbox
                .worker(service)
                .batch(BATCH)
                .poll_interval(Duration::from_millis(1));
            tokio::spawn(worker.run(async move {
                let notified = done.notified();
                if counted.load(Ordering::SeqCst) < ROWS {
                    notified.await;
                }
            }))
        })
        .collect();
    for run in runs {
        run.await.expect("worker task").expect("worker");
    }
    start.elapsed()
}

/// `loops` raw claim-and-mark loops drain `ROWS` rows through the same statements.
async fn drain_raw(pool: &Pool, table: &str, loops: usize) -> Duration {
    let start = Instant::now();
    let tasks: Vec<_> = (0..loops)
        .map(|_| {
            let pool = pool.clone();
            let (claim, done) = (claim_sql(table), done_sql(table));
            tokio::spawn(async move {
                let token = Uuid::new_v4();
                let client = pool.get().await.expect("connection");
                let claim = client.prepare_cached(&claim).await.expect("prepare");
                let done = client.prepare_cached(&done).await.expect("prepare");
                loop {
                    let rows = client
                        .query(&claim, &[&token, &300_000i64, &i64::from(BATCH)])
                        .await
                        .expect("claim");
                    if rows.is_empty() {
                        return;
                    }
                    for row in rows {
                        let id: i64 = row.get(0);
                        client
                            .execute(&done, &[&id, &token, &"id", &"bench"])
                            .await
                            .expect("done");
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("raw loop");
    }
    start.elapsed()
}

pub fn bench(c: &mut Criterion) {
    let Some(url) = std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let table = format!("outbox_bench_{}", Uuid::new_v4().simple());
    let (outbox, pool) = runtime.block_on(async {
        let manager = Manager::from_config(
            url.parse().expect("DATABASE_URL"),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager).max_size(16).build().expect("pool");
        let outbox = Outbox::new(pool.clone()).table(&table).expect("table name");
        outbox.migrate().await.expect("migrate");
        (outbox, pool)
    });
    let round = AtomicUsize::new(0);

    let mut group = c.benchmark_group("outbox drain");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(6));
    for workers in WORKERS {
        group.bench_with_input(BenchmarkId::new("worker", workers), &workers, |b, &n| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        fill(&pool, &table, round.fetch_add(1, Ordering::Relaxed)).await;
                        total += drain_with_workers(&outbox, n).await;
                    }
                    total
                })
            });
        });
        group.bench_with_input(BenchmarkId::new("raw", workers), &workers, |b, &n| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        fill(&pool, &table, round.fetch_add(1, Ordering::Relaxed)).await;
                        total += drain_raw(&pool, &table, n).await;
                    }
                    total
                })
            });
        });
    }
    group.finish();
    runtime.block_on(async {
        let client = pool.get().await.expect("connection");
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS \"{table}\""))
            .await
            .expect("drop");
    });
}
