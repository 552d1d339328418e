//! The child process of the multi-process tests: this test binary started again by the test
//! that needs a second process, to run only that test (`--exact`), which plays the child's
//! part before anything else when the variables below say so. The child works on one SQLite
//! file and is stepped by its parent over stdin and stdout (`CHILD <word>` lines), so every
//! step waits for a signal.

use std::io::BufRead;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::SqliteStore;
use tower_idempotency::outcome::codes;
use tower_idempotency::{BoxError, Message, Receipt};

use super::{DUPLICATES, HOLD_LEASE, alert, layer};

/// The database file the child opens.
const CHILD_DB: &str = "TOWER_IDEMPOTENCY_SQLITE_CHILD_DB";
/// What the child does: `duplicates` or `hold`. Set only in a child.
const CHILD_ROLE: &str = "TOWER_IDEMPOTENCY_SQLITE_CHILD_ROLE";

/// This test binary, to run only `test` as a child in `role` on the file at `path`. `test` is
/// the name of the test that spawns it: the child runs that test, which plays the role
/// (see [`play_if_child`]). A name that matches no test runs none, and the child ends
/// without a word, which fails its parent.
pub fn command(test: &str, path: &Path, role: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("the test binary's path"));
    // `--nocapture`: the child's lines reach its stdout; `--quiet`: libtest writes no
    // `test <name> ...` before them.
    command
        .args([test, "--exact", "--nocapture", "--quiet"])
        .env(CHILD_DB, path)
        .env(CHILD_ROLE, role);
    command
}

/// In a child, plays the role its variables name and answers `true`: the calling test then
/// ends there. In the parent (no role set) does nothing and answers `false`.
pub async fn play_if_child() -> bool {
    let Ok(role) = std::env::var(CHILD_ROLE) else {
        return false;
    };
    let path = std::env::var_os(CHILD_DB).expect("a child is told its file");
    let store = SqliteStore::open(&path)
        .await
        .expect("the child opens the file");
    match role.as_str() {
        "duplicates" => sends_duplicates(store).await,
        "hold" => holds_a_key(store).await,
        other => panic!("unknown child role {other:?}"),
    }
    true
}

/// Says `ready`, waits for `go` on stdin, sends [`DUPLICATES`] copies of one message at
/// once, and says how they were answered.
async fn sends_duplicates(store: SqliteStore) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    // Slow enough that the duplicates of both processes arrive while the send runs.
    let provider = tower::service_fn(move |_: Message| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok::<_, BoxError>(Receipt::new(format!("msg-{n}"), "fake"))
        }
    });
    let service = ServiceBuilder::new()
        .layer(layer(store, Duration::from_secs(30)))
        .service(provider);
    println!("CHILD ready");
    let mut line = String::new();
    tokio::task::block_in_place(|| std::io::stdin().lock().read_line(&mut line))
        .expect("the parent says go");
    let tasks: Vec<_> = (0..DUPLICATES)
        .map(|_| tokio::spawn(service.clone().oneshot(alert())))
        .collect();
    let (mut sent, mut replayed, mut in_flight, mut other) = (0, 0, 0, 0);
    for task in tasks {
        match task.await.expect("a send task") {
            Ok(receipt) if receipt.replayed => replayed += 1,
            Ok(_) => sent += 1,
            Err(e) if e.code() == codes::IN_FLIGHT => in_flight += 1,
            Err(e) => {
                println!("CHILD error {e}");
                other += 1;
            }
        }
    }
    println!(
        "CHILD result calls={} sent={sent} replayed={replayed} in_flight={in_flight} other={other}",
        calls.load(Ordering::SeqCst)
    );
}

/// Sends a message whose provider never answers, says `holding` once the provider has it
/// (the key is then reserved, its lease renewed), and waits to be killed.
async fn holds_a_key(store: SqliteStore) {
    let provider = tower::service_fn(|_: Message| async {
        println!("CHILD holding");
        std::future::pending::<Result<Receipt, BoxError>>().await
    });
    let mut service = ServiceBuilder::new()
        .layer(layer(store, HOLD_LEASE))
        .service(provider);
    let _ = service.ready().await.expect("ready").call(alert()).await;
    panic!("the held send ended");
}
