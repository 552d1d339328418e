//! The child process of the multi-process tests in `tests/sqlite.rs`: a process of its own
//! over one SQLite file, told what to do by two environment variables and stepped by its
//! parent over stdin and stdout (`CHILD <word>` lines), so every step waits for a signal.
//!
//! A binary of the `suite` package (not a test), so a normal test run never reports it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::SqliteStore;
use tower_idempotency::outcome::codes;
use tower_idempotency::{BoxError, IdempotencyLayer, Message, Receipt};

/// The database file the child opens.
const CHILD_DB: &str = "TOWER_IDEMPOTENCY_SQLITE_CHILD_DB";
/// What the child does: `duplicates` or `hold`.
const CHILD_ROLE: &str = "TOWER_IDEMPOTENCY_SQLITE_CHILD_ROLE";
/// How many duplicates the child sends at once; `tests/sqlite.rs` expects the same number.
const DUPLICATES: usize = 50;
/// The lease of the key a `hold` child holds; `tests/sqlite.rs` waits it out.
const HOLD_LEASE: Duration = Duration::from_secs(1);

fn layer(store: SqliteStore, lease: Duration) -> IdempotencyLayer {
    IdempotencyLayer::builder()
        .store(store)
        .namespace("multi-process")
        .lease(lease)
        .build()
        .expect("a valid layer")
}

/// The one message every process sends (the tests' `support::message` shape).
fn alert() -> Message {
    Message::builder()
        .from("shop@example.com")
        .to("seller@example.com")
        .subject("New order")
        .text("Order ord_1 paid.")
        .idempotency_key("order.created:ord_1")
        .build()
        .expect("valid test message")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (Ok(path), Ok(role)) = (std::env::var(CHILD_DB), std::env::var(CHILD_ROLE)) else {
        eprintln!(
            "sqlite-child runs under tests/sqlite.rs, which sets {CHILD_DB} and {CHILD_ROLE}"
        );
        std::process::exit(2);
    };
    let store = SqliteStore::open(&path)
        .await
        .expect("the child opens the file");
    match role.as_str() {
        "duplicates" => child_sends_duplicates(store).await,
        "hold" => child_holds_a_key(store).await,
        other => panic!("unknown child role {other:?}"),
    }
}

/// Says `ready`, waits for `go` on stdin, sends [`DUPLICATES`] copies of one message at
/// once, and says how they were answered.
async fn child_sends_duplicates(store: SqliteStore) {
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
    BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await
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
async fn child_holds_a_key(store: SqliteStore) {
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
