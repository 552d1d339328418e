//! `MySqlStore` against a hand-written claim through the same pool (`minimal`: an
//! `INSERT IGNORE` to reserve, an `UPDATE` fenced by the token to complete, each an
//! autocommit statement as the store's are), at concurrency 1 and 16: reserve + complete
//! pairs per second, and so the cost of the store's guarantees and of our code over what a
//! user would write instead. The pool is the one `MySqlStore::connect` builds, so the store is
//! measured as a user who hands it a URL gets it, and minimal runs on the same connections.
//!
//! Then a claim in the caller's transaction (`START TRANSACTION`, the claim, `COMMIT`):
//! `claim_in` against the hand-written claim's `INSERT IGNORE`, at 1 and 16.
//!
//! Then 100 keys through `reserve_many` + `complete_many` against the same 100 keys as
//! single reserve + complete pairs, one caller: keys per second.
//!
//! Runs when `MYSQL_URL` is set, on a table of its own that it drops at the end:
//! `MYSQL_URL=mysql://root@127.0.0.1:3306/test cargo bench --bench stores -- '^mysql'`.
//! With `STORES_INTERLEAVED=<rounds>` the pairs of the store and of minimal run instead in
//! alternating slices, at 1 and at 16, and print the median ratio (see [`interleaved`]):
//! `MYSQL_URL=… STORES_INTERLEAVED=11 cargo bench --bench stores -- '^mysql'`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use mysql_async::prelude::Queryable;
use mysql_async::{Pool, TxOpts};
use tower_idempotency::MySqlStore;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::{Outcome, Receipt};
use tower_idempotency::store::{Claim, Completion, Reservation, Store, Token};
use uuid::Uuid;

use crate::interleave::{Compared, alternate};

const CONCURRENCY: [usize; 2] = [1, 16];
const LEASE: Duration = Duration::from_secs(600);
const TTL: Duration = Duration::from_secs(3600);
const BATCH: usize = 100;

/// The hand-written claim: a reserve that inserts the key or does nothing, and a complete
/// that writes the outcome while the token still holds the key.
fn minimal_sql(table: &str) -> [String; 3] {
    [
        format!(
            "INSERT IGNORE INTO `{table}` (`key`, state, token, fingerprint, expires_at)
             VALUES (?, 'pending', ?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)"
        ),
        format!(
            "UPDATE `{table}` SET state = 'done', outcome = ?,
                 expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
             WHERE `key` = ? AND token = ?"
        ),
        // The hand-written claim in a transaction of the caller's: the key inserted, or
        // nothing when a row holds it.
        format!(
            "INSERT IGNORE INTO `{table}` (`key`, state, token, fingerprint, expires_at)
             VALUES (?, 'claimed', ?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)"
        ),
    ]
}

/// Which side issues a pair.
#[derive(Clone, Copy)]
enum Side {
    /// `MySqlStore`.
    Store,
    /// The hand-written claim through the same pool.
    Minimal,
    /// `MySqlStore::claim_in`, in a transaction begun and committed around it.
    ClaimStore,
    /// The hand-written claim's `INSERT IGNORE` in the same transaction.
    ClaimMinimal,
}

/// What a pair needs, shared by the tasks of one measurement.
struct Bench {
    store: MySqlStore,
    pool: Pool,
    minimal: [String; 3],
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

    /// A pair of the hand-written statements through the pool, a connection each, as the
    /// store takes them.
    async fn minimal_pair(&self) {
        let [reserve, complete, _] = &self.minimal;
        let key = self.key();
        let token = Uuid::from(Token::new()).as_bytes().to_vec();
        let lease = LEASE.as_micros() as i64;
        let ttl = TTL.as_micros() as i64;
        let mut conn = self.pool.get_conn().await.expect("connection");
        conn.exec_drop(reserve, (&key, &token, vec![7u8; 32], lease))
            .await
            .expect("reserve");
        assert_eq!(conn.affected_rows(), 1, "a fresh key was not reserved");
        drop(conn);
        let mut conn = self.pool.get_conn().await.expect("connection");
        conn.exec_drop(complete, (&self.outcome_json, ttl, &key, &token))
            .await
            .expect("complete");
        assert_eq!(conn.affected_rows(), 1);
    }

    /// A fresh key claimed in a transaction of its own: by the store (`ours`) or by the
    /// hand-written `INSERT IGNORE`.
    async fn claim(&self, ours: bool) {
        let key = self.key();
        let mut tx = self
            .pool
            .start_transaction(TxOpts::default())
            .await
            .expect("transaction");
        let claimed = if ours {
            let claim = Claim::new(key, Fingerprint::from_bytes([7; 32]), TTL);
            self.store.claim_in(&mut tx, &claim).await.expect("claim")
        } else {
            let token = Uuid::from(Token::new()).as_bytes().to_vec();
            tx.exec_drop(
                &self.minimal[2],
                (&key, &token, vec![7u8; 32], TTL.as_micros() as i64),
            )
            .await
            .expect("claim");
            tx.affected_rows() == 1
        };
        assert!(claimed, "a fresh key was not claimed");
        tx.commit().await.expect("commit");
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
                        Side::ClaimStore => bench.claim(true).await,
                        Side::ClaimMinimal => bench.claim(false).await,
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

/// Measures reserve + complete pairs per second, ours and the hand-written claim's, then
/// batches.
pub fn bench(c: &mut Criterion) {
    let Some(url) = std::env::var("MYSQL_URL").ok().filter(|u| !u.is_empty()) else {
        eprintln!("skipped: MYSQL_URL is not set");
        return;
    };
    let rounds = crate::interleave::rounds("STORES_INTERLEAVED");
    let compared = [
        ("reserve+complete", Side::Store, Side::Minimal),
        ("claim", Side::ClaimStore, Side::ClaimMinimal),
    ];
    let selected = |what: &str| crate::filter::selected(&format!("mysql/{what}"));
    if rounds.is_some() && !compared.iter().any(|sides| selected(sides.0)) {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let table = format!("idem_bench_{}", Uuid::new_v4().simple());
    let max = CONCURRENCY.into_iter().max().unwrap_or(1);

    let bench = runtime.block_on(async {
        let store = MySqlStore::connect(&url)
            .await
            .expect("connect")
            .table(&table)
            .expect("table name")
            .timeout(Duration::from_secs(30));
        store.migrate().await.expect("migrate");
        let pool = store.pool().clone();
        // Open every connection up front, so no measurement pays for connecting.
        let conns = futures_util::future::try_join_all((0..max).map(|_| pool.get_conn()))
            .await
            .expect("connections");
        let version: Option<String> = conns
            .into_iter()
            .next()
            .expect("a connection")
            .query_first("SELECT VERSION()")
            .await
            .expect("version");
        eprintln!(
            "mysql bench: {}, pool of {max}, table {table}",
            version.unwrap_or_default()
        );
        let outcome = Outcome::sent(Receipt::new("msg_0123456789", "bench").with_accepted(["a@x"]));
        Arc::new(Bench {
            outcome_json: String::from_utf8(
                tower_idempotency::store::record::encode_outcome(&outcome).expect("outcome"),
            )
            .expect("UTF-8"),
            outcome,
            store,
            pool,
            minimal: minimal_sql(&table),
            prefix: format!("bench:{}", Uuid::new_v4().simple()),
            next: AtomicU64::new(0),
        })
    });

    if let Some(rounds) = rounds {
        for sides in compared {
            if selected(sides.0) {
                for concurrency in CONCURRENCY {
                    interleaved(&runtime, &bench, concurrency, rounds, sides);
                }
            }
        }
    } else {
        groups(c, &runtime, &bench);
    }

    runtime.block_on(async {
        let mut conn = bench.pool.get_conn().await.expect("connection");
        conn.query_drop(format!("DROP TABLE `{table}`"))
            .await
            .expect("drop the bench table");
    });
}

/// Times the store's side and minimal's in alternating slices of about 0.3 s each, `rounds`
/// times, and prints each side's median time per operation and the median over the rounds
/// of minimal's time ÷ ours (above 1: we are faster), as the PostgreSQL bench does.
fn interleaved(
    runtime: &tokio::runtime::Runtime,
    bench: &Arc<Bench>,
    concurrency: usize,
    rounds: usize,
    (what, ours, minimal): (&str, Side, Side),
) {
    let probe = runtime.block_on(run(bench, 64, concurrency, ours));
    let ops = ((0.3 / probe.as_secs_f64()) * 64.0) as u64;
    let ops = ops.clamp(64, 100_000);
    let per_op = |d: Duration| d.as_secs_f64() * 1e6 / ops as f64;
    let timed = alternate(
        rounds,
        || runtime.block_on(run(bench, ops, concurrency, ours)),
        || runtime.block_on(run(bench, ops, concurrency, minimal)),
    );
    let c = Compared::of(&timed, per_op);
    let ratios = c.b_over_a;
    println!(
        "mysql/{what}/{concurrency}: ours {:.1} µs, minimal {:.1} µs each \
         (medians of {rounds} slices of {ops}); minimal ÷ ours: median {:.2}, range {:.2} to {:.2}",
        c.a.median, c.b.median, ratios.median, ratios.low, ratios.high,
    );
}

/// The criterion benchmarks: pairs at each concurrency on every side, then batches.
fn groups(c: &mut Criterion, runtime: &tokio::runtime::Runtime, bench: &Arc<Bench>) {
    let mut group = c.benchmark_group("mysql");
    group
        .throughput(Throughput::Elements(1))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for concurrency in CONCURRENCY {
        let sides = [
            ("reserve+complete/store", Side::Store),
            ("reserve+complete/minimal", Side::Minimal),
            ("claim/store", Side::ClaimStore),
            ("claim/minimal", Side::ClaimMinimal),
        ];
        for (name, side) in sides {
            group.bench_with_input(
                BenchmarkId::new(name, concurrency),
                &concurrency,
                |b, &concurrency| {
                    b.to_async(runtime)
                        .iter_custom(|iters| run(bench, iters, concurrency, side));
                },
            );
        }
    }
    group.finish();

    let mut group = c.benchmark_group("mysql/100 keys");
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
