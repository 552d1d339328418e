//! The outbox at a provider's pace: messages per second drained from a table of waiting rows
//! through a real HTTP provider on loopback that answers each request after a fixed delay,
//! by the outbox's workers and, in the same run, by the statements a user would write
//! instead.
//!
//! - `worker/1` and `worker/4`: one and four [`Worker`]s at a concurrency of 64 on one
//!   table, each sending through an [`HttpTransport`] with the Resend codec.
//! - `raw/1` and `raw/4`: 64 and 256 tasks (the same sends in flight), each a hand-written
//!   loop of `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING`, the
//!   send through the same transport, and an `UPDATE` of the row to done: the drain a user
//!   writes without the outbox, with the same claim lease and no transaction open during
//!   the send.
//!
//! The provider answers after [`DELAY`] in `… 50ms`, and at once in `… 0ms`, where the
//! provider no longer sets the pace and what is left is the database and the machine. Both
//! sides share one pool of [`POOL`] connections and one HTTP client.
//!
//! Runs when `DATABASE_URL` is set, on a table of its own that it drops at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Notify;
use tokio_postgres::NoTls;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::resend::ResendCodec;
use tower_idempotency::outbox::Outbox;
use tower_idempotency::{BoxError, Message, Receipt};
use uuid::Uuid;

/// Rows drained per measured iteration.
const ROWS: usize = 1000;
/// Sends in flight per worker, and hand-written tasks per worker in the baseline.
const CONCURRENCY: u32 = 64;
const WORKERS: [usize; 2] = [1, 4];
/// The provider's answer time that sets the pace.
const DELAY: Duration = Duration::from_millis(50);
/// Connections in the pool both sides share.
const POOL: usize = 16;
const LEASE_MS: i64 = 300_000;
const MESSAGE: &str = r#"{"v":1,"key":"k","from":"shop@example.com","to":["seller@example.com"],"subject":"New order","text":"Sold."}"#;

fn fill_sql(table: &str) -> String {
    format!(
        "INSERT INTO \"{table}\" (key, message)
         SELECT $1 || g, $2::text::jsonb FROM generate_series(1, $3::int) AS g"
    )
}

/// The hand-written claim of one row, under a lease, reading the message's fields.
fn raw_claim_sql(table: &str) -> String {
    format!(
        "UPDATE \"{table}\" SET claimed_until = now() + $1::bigint * interval '1 millisecond'
         WHERE id IN (
             SELECT id FROM \"{table}\"
             WHERE state = 'waiting' AND (claimed_until IS NULL OR claimed_until <= now())
             ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
         RETURNING id, key, message->>'from', message->'to'->>0, message->>'subject',
             message->>'text'"
    )
}

fn raw_done_sql(table: &str) -> String {
    format!(
        "UPDATE \"{table}\" SET state = 'done', finished_at = now(), provider_id = $2,
             claimed_until = NULL
         WHERE id = $1"
    )
}

/// The provider: `POST /emails` answered as Resend answers, after `delay`.
async fn provider(delay: Duration) -> String {
    let app = Router::new().route(
        "/emails",
        post(move || async move {
            tokio::time::sleep(delay).await;
            axum::Json(serde_json::json!({ "id": "49a3999c-0ce1-4ea6-ab68-afcd6dc2e794" }))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

type Transport = tower::util::BoxCloneService<Message, Receipt, BoxError>;

/// The provider's transport over one pooled HTTP client.
fn transport(base_url: &str) -> Transport {
    let client = ServiceBuilder::new()
        .map_request(|request: http::Request<Bytes>| request.map(Full::new))
        .service(Client::builder(TokioExecutor::new()).build_http());
    let codec = ResendCodec::new("re_bench").base_url(base_url.parse().expect("base URL"));
    let transport =
        ServiceExt::<Message>::map_err(HttpTransport::new(client, codec), BoxError::from);
    tower::util::BoxCloneService::new(transport)
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

/// `workers` outbox workers drain `ROWS` rows; the time from start to the last one sent.
async fn drain_with_workers(outbox: &Outbox, transport: &Transport, workers: usize) -> Duration {
    let sent = Arc::new(AtomicUsize::new(0));
    let all_sent = Arc::new(Notify::new());
    let start = Instant::now();
    let runs: Vec<_> = (0..workers)
        .map(|_| {
            let (done, counted) = (Arc::clone(&all_sent), Arc::clone(&sent));
            let (sent, all_sent) = (Arc::clone(&sent), Arc::clone(&all_sent));
            let service = transport.clone().map_response(move |receipt| {
                if sent.fetch_add(1, Ordering::SeqCst) + 1 == ROWS {
                    all_sent.notify_waiters();
                }
                receipt
            });
            let worker = outbox
                .worker(service)
                .concurrency(CONCURRENCY)
                .poll_interval(Duration::from_millis(10));
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

/// `tasks` hand-written loops drain `ROWS` rows through the same transport and pool.
async fn drain_raw(pool: &Pool, table: &str, transport: &Transport, tasks: usize) -> Duration {
    let start = Instant::now();
    let tasks: Vec<_> = (0..tasks)
        .map(|_| {
            let (pool, transport) = (pool.clone(), transport.clone());
            let (claim, done) = (raw_claim_sql(table), raw_done_sql(table));
            tokio::spawn(async move {
                loop {
                    let row = {
                        let client = pool.get().await.expect("connection");
                        let claim = client.prepare_cached(&claim).await.expect("prepare");
                        let rows = client.query(&claim, &[&LEASE_MS]).await.expect("claim");
                        let Some(row) = rows.into_iter().next() else {
                            return;
                        };
                        row
                    };
                    let id: i64 = row.get(0);
                    let message = Message::builder()
                        .idempotency_key(row.get::<_, String>(1))
                        .from(row.get::<_, String>(2))
                        .to(row.get::<_, String>(3))
                        .subject(row.get::<_, String>(4))
                        .text(row.get::<_, String>(5))
                        .build()
                        .expect("message");
                    let receipt = transport.clone().oneshot(message).await.expect("sent");
                    let client = pool.get().await.expect("connection");
                    let done = client.prepare_cached(&done).await.expect("prepare");
                    client
                        .execute(&done, &[&id, &receipt.id])
                        .await
                        .expect("done");
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
        let pool = Pool::builder(manager).max_size(POOL).build().expect("pool");
        let outbox = Outbox::new(pool.clone()).table(&table).expect("table name");
        outbox.migrate().await.expect("migrate");
        (outbox, pool)
    });
    let round = AtomicUsize::new(0);

    for delay in [DELAY, Duration::ZERO] {
        let transport = runtime.block_on(async { transport(&provider(delay).await) });
        let name = format!(
            "outbox drain, provider answering in {}ms",
            delay.as_millis()
        );
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Elements(ROWS as u64));
        group.sampling_mode(SamplingMode::Flat);
        group.sample_size(10);
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(5));
        for workers in WORKERS {
            group.bench_with_input(BenchmarkId::new("worker", workers), &workers, |b, &n| {
                b.iter_custom(|iters| {
                    runtime.block_on(async {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            fill(&pool, &table, round.fetch_add(1, Ordering::Relaxed)).await;
                            total += drain_with_workers(&outbox, &transport, n).await;
                        }
                        total
                    })
                });
            });
            let tasks = workers * CONCURRENCY as usize;
            group.bench_with_input(BenchmarkId::new("raw", workers), &tasks, |b, &n| {
                b.iter_custom(|iters| {
                    runtime.block_on(async {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            fill(&pool, &table, round.fetch_add(1, Ordering::Relaxed)).await;
                            total += drain_raw(&pool, &table, &transport, n).await;
                        }
                        total
                    })
                });
            });
        }
        group.finish();
    }
    runtime.block_on(async {
        let client = pool.get().await.expect("connection");
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS \"{table}\""))
            .await
            .expect("drop");
    });
}
