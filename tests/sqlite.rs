//! `SqliteStore`: the conformance suite; two OS processes over one file; a process killed
//! while it holds a key; a locked or unreadable file; the purge; claim-then-send.
//!
//! The multi-process tests spawn this test binary again as their children, each running only
//! the test that spawned it, which plays the child's part ([`child`]). Parent and children
//! talk over the children's stdin and stdout, so every step waits for a signal, never for a
//! guessed time.

// Beside this file rather than `tests/child.rs`, which cargo would take for a test of its own.
#[path = "sqlite/child.rs"]
mod child;
mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use rusqlite::{Connection, TransactionBehavior};
use support::stores::{SqliteDir, broken_records, fp, until_expired};
use support::{Provider, message, poll_until, send};
use tokio::sync::mpsc;
use tower::ServiceBuilder;
use tower_idempotency::SqliteStore;
use tower_idempotency::outcome::codes;
use tower_idempotency::store::StoreErrorKind;
use tower_idempotency::store::admin::{Expiry, KeyState, StoreAdmin};
use tower_idempotency::store::conformance::Conformance;
use tower_idempotency::{IdempotencyLayer, Message};

mod sqlite_conformance {
    use super::*;

    /// Every case opens a store of its own on one file shared by all of them (and by any run
    /// of this binary at the same time): the cases' keys have random prefixes, and a file
    /// many connections use at once is the store's normal life.
    async fn suite() -> Option<Conformance> {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("sqlite-conformance");
        std::fs::create_dir_all(&dir).expect("a directory for the SQLite file");
        let store = SqliteStore::open(dir.join("idempotency.sqlite3"))
            .await
            .expect("open the SQLite file");
        // A lease of 1 s, not the suite's 300 ms: on a loaded 2-core machine a case's own
        // pending key outlived 300 ms and was listed as stale by the listing case.
        Some(Conformance::with_admin(store).lease(Duration::from_secs(1)))
    }

    tower_idempotency::store_conformance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        suite()
    );
}

/// How many duplicates each child sends at once.
const DUPLICATES: usize = 50;
/// The lease of the key the killed child holds.
const HOLD_LEASE: Duration = Duration::from_secs(1);
/// Every wait on a child is bounded by this.
const CHILD_BOUND: Duration = Duration::from_secs(60);

fn layer(store: SqliteStore, lease: Duration) -> IdempotencyLayer {
    IdempotencyLayer::builder()
        .store(store)
        .namespace("multi-process")
        .lease(lease)
        .build()
        .expect("a valid layer")
}

fn alert() -> Message {
    message(Some("order.created:ord_1"), "Order ord_1 paid.")
}

/// A child process in `role` on the file at `path`, running the test `test` (the caller),
/// with its stdout read line by line.
///
/// Plain `std::process`, so the tests need no tokio `process` feature: a thread of its own
/// reads the child's stdout and hands each line over a channel, so waiting for a line is an
/// async wait bounded by a timeout.
struct ChildProcess {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl ChildProcess {
    fn spawn(test: &str, path: &std::path::Path, role: &str) -> Self {
        let mut child = child::command(test, path, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the child process");
        let stdout = child.stdout.take().expect("the child's stdout");
        let (sender, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// The text after `CHILD <word>` on the child's next such line.
    async fn said(&mut self, word: &str) -> String {
        let prefix = format!("CHILD {word}");
        let found = tokio::time::timeout(CHILD_BOUND, async {
            while let Some(line) = self.lines.recv().await {
                if let Some(rest) = line.strip_prefix(&prefix) {
                    return Some(rest.trim().to_owned());
                }
            }
            None
        })
        .await
        .unwrap_or_else(|_| panic!("the child did not say {word:?} in time"));
        found.unwrap_or_else(|| panic!("the child ended without saying {word:?}"))
    }

    fn go(&mut self) {
        let stdin = self.child.stdin.as_mut().expect("the child's stdin");
        stdin.write_all(b"go\n").expect("tell the child go");
        stdin.flush().expect("flush the child's stdin");
    }

    /// The child's exit status, once it closed its stdout (bounded) and ended.
    async fn exit(&mut self) -> std::process::ExitStatus {
        tokio::time::timeout(CHILD_BOUND, async {
            while self.lines.recv().await.is_some() {}
        })
        .await
        .expect("the child closes its stdout");
        tokio::task::block_in_place(|| self.child.wait()).expect("wait for the child")
    }

    /// SIGKILL: no destructor, no release.
    fn kill(&mut self) {
        self.child.kill().expect("kill the child");
        self.child.wait().expect("reap the killed child");
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        // A test that failed half-way leaves no child behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `name=value` from a child's result line.
fn count(result: &str, name: &str) -> usize {
    result
        .split_whitespace()
        .find_map(|part| part.strip_prefix(&format!("{name}=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {result:?}"))
}

/// The next test's name: its children run it (see [`child::command`]).
const TWO_PROCESSES: &str = "two_processes_sending_fifty_duplicates_each_reach_the_provider_once";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_sending_fifty_duplicates_each_reach_the_provider_once() {
    if child::play_if_child().await {
        return;
    }
    let dir = SqliteDir::new("two-processes");
    let path = dir.file();
    // The file exists, in WAL mode with its table, before the children race on it.
    let store = SqliteStore::open(&path).await.unwrap();

    let mut children = [
        ChildProcess::spawn(TWO_PROCESSES, &path, "duplicates"),
        ChildProcess::spawn(TWO_PROCESSES, &path, "duplicates"),
    ];
    for child in &mut children {
        child.said("ready").await;
    }
    for child in &mut children {
        child.go();
    }
    let mut results = Vec::new();
    for child in &mut children {
        results.push(child.said("result").await);
    }
    let total = |name| results.iter().map(|r| count(r, name)).sum::<usize>();
    assert_eq!(
        total("calls"),
        1,
        "provider calls over both processes: {results:?}"
    );
    assert_eq!(total("sent"), 1, "{results:?}");
    assert_eq!(total("other"), 0, "{results:?}");
    assert_eq!(
        total("sent") + total("replayed") + total("in_flight"),
        2 * DUPLICATES,
        "{results:?}"
    );
    for child in &mut children {
        let status = child.exit().await;
        assert!(status.success(), "{status}");
    }

    // A third process (this one) finds the message sent and replays it.
    let provider = Provider::ok();
    let mut service = ServiceBuilder::new()
        .layer(layer(store, Duration::from_secs(30)))
        .service(provider.clone());
    let receipt = send(&mut service, alert()).await.unwrap();
    assert!(receipt.replayed);
    assert_eq!(provider.calls(), 0);
}

/// The next test's name: its child runs it (see [`child::command`]).
const SIGKILL: &str = "a_key_held_by_a_process_killed_with_sigkill_is_free_after_its_lease";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_by_a_process_killed_with_sigkill_is_free_after_its_lease() {
    if child::play_if_child().await {
        return;
    }
    let dir = SqliteDir::new("sigkill");
    let path = dir.file();
    let store = SqliteStore::open(&path).await.unwrap();
    let provider = Provider::ok();
    let mut service = ServiceBuilder::new()
        .layer(layer(store.clone(), HOLD_LEASE))
        .service(provider.clone());

    let mut child = ChildProcess::spawn(SIGKILL, &path, "hold");
    child.said("holding").await;
    let error = send(&mut service, alert()).await.unwrap_err();
    assert_eq!(error.code(), codes::IN_FLIGHT, "the child holds the key");

    // SIGKILL: no destructor, no release; only the lease can free the key.
    child.kill();
    let key = "multi-process:order.created:ord_1";
    let record = store
        .inspect(key)
        .await
        .unwrap()
        .expect("the child's record stays");
    assert_eq!(record.state, KeyState::Pending);
    let Expiry::In(left) = record.expires else {
        panic!("the lease was renewed until the kill: {:?}", record.expires)
    };
    assert!(left <= HOLD_LEASE, "{left:?}");
    assert_eq!(provider.calls(), 0);

    // Once the lease has passed on the database's clock, the key is free.
    until_expired(&store, &[key]).await;
    let record = store
        .inspect(key)
        .await
        .unwrap()
        .expect("kept until purged");
    assert!(record.is_stale(), "{record:?}");
    let receipt = send(&mut service, alert()).await.unwrap();
    assert!(!receipt.replayed);
    assert_eq!(provider.calls(), 1, "the next send goes");
    let receipt = send(&mut service, alert()).await.unwrap();
    assert!(receipt.replayed);
    assert_eq!(provider.calls(), 1, "and goes once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_database_fails_the_send_as_store_failed_and_sends_nothing() {
    let dir = SqliteDir::new("locked");
    let store = SqliteStore::builder(dir.file())
        .timeout(Duration::from_millis(300))
        .open()
        .await
        .unwrap();
    let provider = Provider::ok();
    let mut service = ServiceBuilder::new()
        .layer(layer(store.clone(), Duration::from_secs(30)))
        .service(provider.clone());

    // Another connection (as another process would) takes the write lock and keeps it.
    let lock = Connection::open(dir.file()).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    let error = send(&mut service, alert()).await.unwrap_err();
    assert_eq!(error.code(), codes::STORE_FAILED, "{error}");
    assert_eq!(provider.calls(), 0, "nothing is sent without a reservation");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by the timeout"
    );

    lock.execute_batch("ROLLBACK").unwrap();
    send(&mut service, alert()).await.unwrap();
    assert_eq!(
        provider.calls(),
        1,
        "the store works again once the lock is gone"
    );
}

#[tokio::test]
async fn a_file_that_is_not_a_database_fails_open_with_a_store_error() {
    let dir = SqliteDir::new("garbage");
    std::fs::write(dir.file(), vec![0x5a; 8192]).unwrap();
    let error = SqliteStore::open(dir.file()).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured);
    assert!(error.to_string().contains("is not a database"), "{error}");

    // A directory where the file should be.
    let error = SqliteStore::open(&dir.0).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
}

/// Keeps `key` done for a millisecond.
async fn briefly_done(store: &SqliteStore, key: &str) {
    use tower_idempotency::store::{Reservation, Store};
    use tower_idempotency::{Outcome, Receipt};
    let Reservation::Reserved { token } = store.reserve(key, fp(1), LEASE).await.unwrap() else {
        panic!("{key} is free")
    };
    let outcome = Outcome::sent(Receipt::new("m", "fake"));
    let ttl = Duration::from_millis(1);
    assert!(
        store
            .complete(key, token, fp(1), &outcome, ttl)
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn purge_deletes_expired_rows_and_leaves_live_ones_and_recent_stale_sends() {
    use tower_idempotency::store::Store;
    let dir = SqliteDir::new("purge");
    let store = SqliteStore::builder(dir.file())
        .purge_every(None)
        .purge_batch(2)
        .open()
        .await
        .unwrap();
    for key in ["gone-1", "gone-2", "gone-3"] {
        briefly_done(&store, key).await;
    }
    store.reserve("live", fp(1), LEASE).await.unwrap();
    store
        .reserve("crashed", fp(1), Duration::from_millis(1))
        .await
        .unwrap();
    until_expired(&store, &["gone-1", "gone-2", "gone-3", "crashed"]).await;
    assert!(store.inspect("crashed").await.unwrap().unwrap().is_stale());

    assert_eq!(store.purge_expired().await.unwrap(), 3, "in batches of two");
    assert!(store.inspect("gone-1").await.unwrap().is_none());
    assert!(store.inspect("live").await.unwrap().is_some());
    // Kept for an hour, so the next reserve reports the takeover of a crashed send.
    assert!(store.inspect("crashed").await.unwrap().is_some());
    assert_eq!(store.purge_expired().await.unwrap(), 0);
}

#[tokio::test]
async fn the_store_thread_purges_on_its_own_while_idle() {
    let dir = SqliteDir::new("auto-purge");
    let store = SqliteStore::builder(dir.file())
        .purge_every(Some(Duration::from_millis(20)))
        .open()
        .await
        .unwrap();
    briefly_done(&store, "gone").await;
    poll_until(
        "the idle store thread purges the expired row",
        Duration::from_secs(5),
        || async { store.inspect("gone").await.unwrap().is_none() },
    )
    .await;
}

/// A row completed after its own pending row was gone does not know its first attempt: its
/// age is unknown, and a retake never takes it back.
#[tokio::test]
async fn a_row_completed_without_its_pending_row_is_never_taken_back() {
    use tower_idempotency::store::{Reservation, Store, Token};
    use tower_idempotency::{Outcome, SendError};
    let dir = SqliteDir::new("done-without-first-attempt");
    let store = SqliteStore::open(dir.file()).await.unwrap();
    let outcome = Outcome::failed(SendError::unknown_delivery("provider.timeout", "timed out"));
    let window = Duration::from_secs(3600);
    assert!(
        store
            .complete("k", Token::new(), fp(1), &outcome, window)
            .await
            .unwrap()
    );
    assert_eq!(
        store.retake("k", fp(1), LEASE, window).await.unwrap(),
        None,
        "a first attempt of unknown age is never sent again"
    );
    let Reservation::Held { record } = store.reserve("k", fp(1), LEASE).await.unwrap() else {
        panic!("the kept outcome holds its key")
    };
    assert!(record.is_unknown_delivery());
    assert_eq!(record.first_attempt_age, None, "unknown, not made up");
}

#[tokio::test]
async fn a_claim_committed_with_the_callers_rows_is_taken_by_the_send() {
    let dir = SqliteDir::new("claim");
    let store = SqliteStore::open(dir.file()).await.unwrap();
    let layer = layer(store.clone(), Duration::from_secs(30));
    let provider = Provider::ok();
    let mut service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(provider.clone());
    let mut connection = Connection::open(dir.file()).unwrap();
    connection.busy_timeout(Duration::from_secs(5)).unwrap();
    connection
        .execute_batch("CREATE TABLE orders (id TEXT PRIMARY KEY)")
        .unwrap();

    // Rolled back: no claim.
    let tx = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    let claim = layer
        .claim(&alert())
        .unwrap()
        .expect("the message has a key");
    assert!(store.claim_in(&tx, &claim).unwrap());
    tx.rollback().unwrap();
    assert!(store.claims(10).await.unwrap().is_empty());

    // Committed: the claim waits, and the send takes it and goes once.
    let tx = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("INSERT INTO orders VALUES ('ord_1')", [])
        .unwrap();
    assert!(store.claim_in(&tx, &claim).unwrap());
    tx.commit().unwrap();
    let waiting = store.claims(10).await.unwrap();
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert!(waiting[0].is_claim_of(&claim), "{waiting:?}");
    assert!(
        !store.claim_in(&connection, &claim).unwrap(),
        "a live claim holds the key"
    );

    let receipt = send(&mut service, alert()).await.unwrap();
    assert!(!receipt.replayed);
    assert_eq!(provider.calls(), 1);
    assert!(store.claims(10).await.unwrap().is_empty());
    assert!(send(&mut service, alert()).await.unwrap().replayed);
    assert_eq!(provider.calls(), 1);
}

#[tokio::test]
async fn rows_that_do_not_decode_or_break_the_record_rules_are_corrupt_never_a_panic() {
    use tower_idempotency::store::{Reservation, Store};
    let dir = SqliteDir::new("corrupt");
    let store = SqliteStore::open(dir.file()).await.unwrap();
    let other = Connection::open(dir.file()).unwrap();
    let fingerprint = rusqlite_value(vec![1u8; 32]);
    let text = |t: &str| rusqlite_value(t.to_owned());
    // (name, state, token, fingerprint, outcome): garbage of every column, and the broken
    // records every store reports alike.
    let mut rows = vec![
        (
            "bad-state",
            text("weird"),
            rusqlite_value(vec![0u8; 16]),
            fingerprint.clone(),
            Null,
        ),
        (
            "bad-outcome",
            text("done"),
            rusqlite_value(vec![0u8; 16]),
            fingerprint.clone(),
            text(r#"{"nope": 1}"#),
        ),
        (
            "done-without-outcome",
            text("done"),
            rusqlite_value(vec![0u8; 16]),
            fingerprint.clone(),
            Null,
        ),
        (
            "short-fingerprint",
            text("pending"),
            rusqlite_value(vec![0u8; 16]),
            rusqlite_value(vec![1u8, 2, 3]),
            Null,
        ),
        (
            "fingerprint-as-a-number",
            text("pending"),
            rusqlite_value(vec![0u8; 16]),
            Integer(7),
            Null,
        ),
        (
            "state-as-a-number",
            Integer(1),
            rusqlite_value(vec![0u8; 16]),
            fingerprint.clone(),
            Null,
        ),
        (
            "token-as-text",
            text("pending"),
            text("not a token"),
            fingerprint.clone(),
            Null,
        ),
        (
            "outcome-as-a-number",
            text("done"),
            rusqlite_value(vec![0u8; 16]),
            fingerprint.clone(),
            Integer(42),
        ),
    ];
    for (name, state, outcome) in broken_records::PARTS {
        rows.push((
            name,
            text(state),
            rusqlite_value(vec![0u8; 16]),
            fingerprint.clone(),
            text(outcome),
        ));
    }
    for (name, state, token, fingerprint, outcome) in rows {
        let key = format!("corrupt:{name}");
        other
            .execute(
                "INSERT INTO idempotency_keys (key, state, token, fingerprint, outcome, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5,
                     CAST(unixepoch('subsec') * 1000 AS INTEGER) + 3600000)",
                (&key, state, token, fingerprint, outcome),
            )
            .unwrap();
        let error = store.reserve(&key, fp(1), LEASE).await.unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Corrupt, "{name}: {error}");
        // Inspect shows no token, so a row whose only damage is its token reads fine there.
        if name != "token-as-text" {
            let error = store.inspect(&key).await.unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::Corrupt, "{name}: {error}");
        }
        let fresh = format!("{key}-fresh");
        let answers = store
            .reserve_many(&[(&key, fp(1)), (&fresh, fp(1))], LEASE)
            .await
            .expect("the batch as a whole succeeds");
        assert!(
            matches!(&answers[0], Err(e) if e.kind() == StoreErrorKind::Corrupt),
            "{name}: {:?}",
            answers[0]
        );
        assert!(
            matches!(answers[1], Ok(Reservation::Reserved { .. })),
            "{name}"
        );
        let left: String = other
            .query_row(
                "SELECT typeof(state) FROM idempotency_keys WHERE key = ?1",
                [&key],
                |row| row.get(0),
            )
            .unwrap();
        assert!(!left.is_empty(), "{name}: the row was left in place");
    }

    // A garbage row whose time has passed is simply taken over.
    other
        .execute(
            "INSERT INTO idempotency_keys (key, state, token, fingerprint, outcome, expires_at)
                 VALUES ('corrupt:expired', 'weird', x'00', x'00', '[]',
                 CAST(unixepoch('subsec') * 1000 AS INTEGER) - 1000)",
            [],
        )
        .unwrap();
    assert!(matches!(
        store
            .reserve("corrupt:expired", fp(1), LEASE)
            .await
            .unwrap(),
        Reservation::Reserved { .. }
    ));
}

const LEASE: Duration = Duration::from_secs(60);

use rusqlite::types::Value::{self, Integer, Null};

fn rusqlite_value(value: impl Into<Value>) -> Value {
    value.into()
}
