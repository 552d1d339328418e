//! `SqliteStore` against a hand-written claim run through rusqlite directly, in one run:
//! reserve + complete pairs per second with 1 and 8 concurrent writers in one process, and
//! with two processes of 4 writers each on one file. In one process the claim runs twice: on
//! threads of its own (the floor: nothing async), and as an async service would run it, each
//! statement through `spawn_blocking` (what a user of tower writes instead of the store).
//!
//! `cargo bench --features sqlite --bench sqlite`. The file lives under the target dir (a
//! real disk, so commits pay for their sync), one per measurement, in the same mode as the
//! store's: WAL, `synchronous = FULL`, a busy timeout.
//!
//! The two-process figures are not criterion's: this binary spawns itself as the second
//! process, both run for a fixed time once told to start, and the pairs both did are added.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use rusqlite::{Connection, Statement, params};
use tower_idempotency::SqliteStore;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::{Outcome, Receipt};
use tower_idempotency::store::{Reservation, Store, Token};

/// What a user would write instead of the store: a claims table, a reserve that takes a free
/// or expired key in one statement, and a complete fenced by the token, with expiry by
/// SQLite's clock in milliseconds.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS claims (
    key         TEXT    PRIMARY KEY,
    token       BLOB    NOT NULL,
    fingerprint BLOB    NOT NULL,
    state       TEXT    NOT NULL,
    outcome     TEXT,
    expires_at  INTEGER NOT NULL
) WITHOUT ROWID";
const RESERVE: &str = "INSERT INTO claims (key, token, fingerprint, state, expires_at)
    VALUES (?1, ?2, ?3, 'pending', CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?4)
    ON CONFLICT (key) DO UPDATE SET token = excluded.token, fingerprint = excluded.fingerprint,
        state = 'pending', outcome = NULL, expires_at = excluded.expires_at
    WHERE claims.expires_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)
    RETURNING token";
const COMPLETE: &str = "UPDATE claims SET state = 'done', outcome = ?3,
        expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?4
    WHERE key = ?1 AND token = ?2 AND state = 'pending'";

const WRITERS: [usize; 2] = [1, 8];
const LEASE: Duration = Duration::from_secs(600);
const TTL: Duration = Duration::from_secs(3600);
const FINGERPRINT: [u8; 32] = [7; 32];
/// The second process of the two-process measurement: the file, `store` or `raw`.
const CHILD_VAR: &str = "TOWER_IDEMPOTENCY_SQLITE_BENCH_CHILD";
/// How long each process of the two-process measurement runs.
const TWO_PROCESS_RUN: Duration = Duration::from_secs(3);
const PER_PROCESS_WRITERS: usize = 4;

fn outcome() -> Outcome {
    Outcome::sent(Receipt::new("msg_0123456789", "bench").with_accepted(["a@x"]))
}

fn bench_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sqlite-bench");
    std::fs::create_dir_all(&dir).expect("bench dir");
    dir
}

/// A fresh database file path for one measurement.
fn fresh_file(name: &str) -> PathBuf {
    let path = bench_dir().join(format!(
        "{name}-{}.sqlite3",
        uuid::Uuid::from(Token::new()).simple()
    ));
    let _ = std::fs::remove_file(&path);
    path
}

/// Fresh keys for one writer of one process.
struct Keys {
    prefix: String,
    next: AtomicU64,
}

impl Keys {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            prefix: uuid::Uuid::from(Token::new()).simple().to_string(),
            next: AtomicU64::new(0),
        })
    }

    fn next(&self) -> String {
        format!(
            "bench:{}:{}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }
}

async fn store_pair(store: &SqliteStore, keys: &Keys, outcome: &Outcome) {
    let key = keys.next();
    let fingerprint = Fingerprint::from_bytes(FINGERPRINT);
    let Ok(Reservation::Reserved { token }) = store.reserve(&key, fingerprint, LEASE).await else {
        panic!("a fresh key was not reserved")
    };
    let written = store
        .complete(&key, token, fingerprint, outcome, TTL)
        .await
        .expect("complete");
    assert!(written);
}

/// A connection as a user of rusqlite would open it for the same file: the store's mode.
fn raw_connection(path: &Path) -> Connection {
    let connection = Connection::open(path).expect("open");
    connection
        .busy_timeout(Duration::from_secs(30))
        .expect("busy timeout");
    let _: String = connection
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .expect("WAL");
    connection
        .pragma_update(None, "synchronous", "FULL")
        .expect("sync");
    connection.execute_batch(SCHEMA).expect("schema");
    connection
}

/// The hand-written statements, prepared once on a connection.
struct RawStatements<'c> {
    reserve: Statement<'c>,
    complete: Statement<'c>,
}

impl<'c> RawStatements<'c> {
    fn prepare(connection: &'c Connection) -> Self {
        Self {
            reserve: connection.prepare(RESERVE).expect("prepare"),
            complete: connection.prepare(COMPLETE).expect("prepare"),
        }
    }
}

/// A reserve and a complete, each one autocommit transaction.
fn raw_pair(statements: &mut RawStatements<'_>, keys: &Keys, outcome_json: &str) {
    let key = keys.next();
    let token = Token::new();
    let holder: Vec<u8> = statements
        .reserve
        .query_row(
            params![
                key,
                &token.as_bytes()[..],
                &FINGERPRINT[..],
                LEASE.as_millis() as i64
            ],
            |row| row.get(0),
        )
        .expect("reserve");
    assert_eq!(holder, token.as_bytes());
    let written = statements
        .complete
        .execute(params![
            key,
            &token.as_bytes()[..],
            outcome_json,
            TTL.as_millis() as i64
        ])
        .expect("complete");
    assert_eq!(written, 1);
}

fn outcome_json() -> String {
    String::from_utf8(tower_idempotency::store::record::encode_outcome(&outcome()).expect("json"))
        .expect("UTF-8")
}

/// `iters` pairs through the store, spread over `writers` tasks; the wall time.
fn run_store(
    runtime: &tokio::runtime::Runtime,
    store: &SqliteStore,
    writers: usize,
    iters: u64,
) -> Duration {
    runtime.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..writers as u64)
            .map(|w| {
                let (store, keys) = (store.clone(), Keys::new());
                let pairs = iters / writers as u64 + u64::from(w < iters % writers as u64);
                tokio::spawn(async move {
                    let outcome = outcome();
                    for _ in 0..pairs {
                        store_pair(&store, &keys, &outcome).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("writer");
        }
        start.elapsed()
    })
}

/// `iters` pairs through rusqlite, spread over `writers` threads of a connection each.
fn run_raw(connections: &[Arc<std::sync::Mutex<Connection>>], iters: u64) -> Duration {
    let writers = connections.len() as u64;
    let start = Instant::now();
    std::thread::scope(|scope| {
        for (w, connection) in connections.iter().enumerate() {
            let pairs = iters / writers + u64::from((w as u64) < iters % writers);
            scope.spawn(move || {
                let (keys, json) = (Keys::new(), outcome_json());
                let connection = connection.lock().expect("connection");
                let mut statements = RawStatements::prepare(&connection);
                for _ in 0..pairs {
                    raw_pair(&mut statements, &keys, &json);
                }
            });
        }
    });
    start.elapsed()
}

/// `iters` pairs through rusqlite as an async service would call it, spread over `writers`
/// tasks of a connection each: every statement on tokio's blocking pool (`spawn_blocking`),
/// as a reserve runs before the send and a complete after it, each awaited by the send.
fn run_raw_async(
    runtime: &tokio::runtime::Runtime,
    connections: &[Arc<std::sync::Mutex<Connection>>],
    iters: u64,
) -> Duration {
    let writers = connections.len() as u64;
    runtime.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = connections
            .iter()
            .enumerate()
            .map(|(w, connection)| {
                let pairs = iters / writers + u64::from((w as u64) < iters % writers);
                let (connection, keys) = (Arc::clone(connection), Keys::new());
                let json: Arc<str> = outcome_json().into();
                tokio::spawn(async move {
                    for _ in 0..pairs {
                        let (key, token) = (keys.next(), Token::new());
                        let (c, k) = (Arc::clone(&connection), key.clone());
                        tokio::task::spawn_blocking(move || {
                            let connection = c.lock().expect("connection");
                            let mut reserve = connection.prepare_cached(RESERVE).expect("prepare");
                            let holder: Vec<u8> = reserve
                                .query_row(
                                    params![
                                        k,
                                        &token.as_bytes()[..],
                                        &FINGERPRINT[..],
                                        LEASE.as_millis() as i64
                                    ],
                                    |row| row.get(0),
                                )
                                .expect("reserve");
                            assert_eq!(holder, token.as_bytes());
                        })
                        .await
                        .expect("reserve task");
                        let (c, json) = (Arc::clone(&connection), Arc::clone(&json));
                        tokio::task::spawn_blocking(move || {
                            let connection = c.lock().expect("connection");
                            let mut complete =
                                connection.prepare_cached(COMPLETE).expect("prepare");
                            let written = complete
                                .execute(params![
                                    key,
                                    &token.as_bytes()[..],
                                    &*json,
                                    TTL.as_millis() as i64
                                ])
                                .expect("complete");
                            assert_eq!(written, 1);
                        })
                        .await
                        .expect("complete task");
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("writer");
        }
        start.elapsed()
    })
}

fn one_process(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("sqlite");
    group.throughput(Throughput::Elements(1)).sample_size(10);
    for writers in WRITERS {
        let store = runtime
            .block_on(SqliteStore::open(fresh_file("store")))
            .expect("open");
        group.bench_with_input(
            BenchmarkId::new("reserve+complete/store", writers),
            &writers,
            |b, &writers| b.iter_custom(|iters| run_store(&runtime, &store, writers, iters)),
        );
        let path = fresh_file("raw");
        let connections: Vec<_> = (0..writers)
            .map(|_| Arc::new(std::sync::Mutex::new(raw_connection(&path))))
            .collect();
        group.bench_with_input(
            BenchmarkId::new("reserve+complete/raw", writers),
            &writers,
            |b, _| b.iter_custom(|iters| run_raw(&connections, iters)),
        );
        let path = fresh_file("raw-async");
        let connections: Vec<_> = (0..writers)
            .map(|_| Arc::new(std::sync::Mutex::new(raw_connection(&path))))
            .collect();
        group.bench_with_input(
            BenchmarkId::new("reserve+complete/raw-spawn-blocking", writers),
            &writers,
            |b, _| b.iter_custom(|iters| run_raw_async(&runtime, &connections, iters)),
        );
    }
    group.finish();
}

/// Runs `PER_PROCESS_WRITERS` writers of `mode` on `path` for `TWO_PROCESS_RUN`; the pairs
/// done.
fn run_for(path: &Path, mode: &str) -> u64 {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + TWO_PROCESS_RUN;
    if mode == "store" {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let store = SqliteStore::open(path).await.expect("open");
            let tasks: Vec<_> = (0..PER_PROCESS_WRITERS)
                .map(|_| {
                    let (store, keys, done) = (store.clone(), Keys::new(), Arc::clone(&done));
                    tokio::spawn(async move {
                        let outcome = outcome();
                        while Instant::now() < deadline {
                            store_pair(&store, &keys, &outcome).await;
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("writer");
            }
        });
    } else {
        std::thread::scope(|scope| {
            for _ in 0..PER_PROCESS_WRITERS {
                let done = Arc::clone(&done);
                scope.spawn(move || {
                    let connection = raw_connection(path);
                    let mut statements = RawStatements::prepare(&connection);
                    let (keys, json) = (Keys::new(), outcome_json());
                    while Instant::now() < deadline {
                        raw_pair(&mut statements, &keys, &json);
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
    }
    done.load(Ordering::Relaxed)
}

/// The second process: waits for `go`, runs, says how many pairs it did.
fn child(spec: &str) {
    let (mode, path) = spec.split_once(':').expect("mode:path");
    println!("ready");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).expect("go");
    println!("pairs={}", run_for(Path::new(path), mode));
}

fn two_processes(_: &mut Criterion) {
    for mode in ["store", "raw"] {
        let path = fresh_file(&format!("two-{mode}"));
        drop(raw_connection(&path));
        let mut second = Command::new(std::env::current_exe().expect("this binary"))
            .env(CHILD_VAR, format!("{mode}:{}", path.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the second process");
        let mut lines = std::io::BufReader::new(second.stdout.take().expect("stdout")).lines();
        let ready = lines.next().expect("a line").expect("read");
        assert_eq!(ready, "ready");
        writeln!(second.stdin.as_mut().expect("stdin"), "go").expect("go");
        let start = Instant::now();
        let here = run_for(&path, mode);
        let there: u64 = lines
            .next()
            .expect("a line")
            .expect("read")
            .strip_prefix("pairs=")
            .and_then(|n| n.parse().ok())
            .expect("pairs=N");
        let elapsed = start.elapsed();
        second.wait().expect("the second process ends");
        let rate = (here + there) as f64 / elapsed.as_secs_f64();
        println!(
            "sqlite/two-processes/{mode}: {rate:.0} pairs/s ({here} + {there} pairs in {:.2} s, \
             {PER_PROCESS_WRITERS} writers per process)",
            elapsed.as_secs_f64()
        );
    }
}

criterion_group!(benches, one_process, two_processes);

fn main() {
    if let Ok(spec) = std::env::var(CHILD_VAR) {
        child(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
