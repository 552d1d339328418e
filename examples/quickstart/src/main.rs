//! The main job, on a store that survives the process: `cargo run -p quickstart`,
//! then run it again.
//!
//! A fake provider counts and prints what it sends. Behind `IdempotencyLayer`, on a
//! `SqliteStore` in a file under the OS temp dir (no server), a first send goes, the same send
//! again is answered from the store, another message under the same key is refused, and 20
//! concurrent duplicates reach the provider once. A second run is the real case, a job that
//! ran twice: every send is answered from the file, and the provider is called zero times.
//! `cargo run -p quickstart -- --fresh` deletes the file first.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::outcome::codes;
use tower_idempotency::{BoxError, IdempotencyLayer, Message, Receipt, SqliteStore};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = std::env::temp_dir().join("tower-idempotency-quickstart");
    if std::env::args().any(|arg| arg == "--fresh") && dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    run(&dir.join("keys.sqlite3")).await?;
    Ok(())
}

/// One run of the job on the store at `path`; answers how many times the provider was called.
pub async fn run(path: &Path) -> Result<usize, BoxError> {
    let first_run = !path.exists();
    println!("store: {}", path.display());
    if first_run {
        println!("first run: a new file, so the sends below go to the provider\n");
    } else {
        println!(
            "second run (or later): the file kept what the first run sent, so every send \
             below is answered from the store, nothing sent again\n(start over with \
             `cargo run -p quickstart -- --fresh`)\n"
        );
    }

    // The provider: a stand-in for a REST client that counts what it sends.
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let provider = tower::service_fn(move |message: Message| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            // A real provider takes a while; duplicates arriving meanwhile must not send.
            tokio::time::sleep(Duration::from_millis(50)).await;
            println!("  provider: sent #{n} to {}", message.to().join(", "));
            Ok::<_, BoxError>(Receipt::new(format!("msg_{n}"), "fake-provider"))
        }
    });

    let layer = IdempotencyLayer::builder()
        .store(SqliteStore::open(path).await?)
        .namespace("order-alerts")
        .build()?;
    let service = ServiceBuilder::new().layer(layer.clone()).service(provider);

    let alert = |text: &str| {
        Message::builder()
            .from("orders@marketplace.example")
            .to("seller@example.com")
            .subject("New order ord_20481")
            .text(text)
            .idempotency_key("order.created:ord_20481:email")
            .build()
    };

    println!("1. first send");
    let receipt = service
        .clone()
        .oneshot(alert("Vintage Nikon FM2 just sold.")?)
        .await?;
    println!(
        "   -> receipt {} (replayed: {})",
        receipt.id, receipt.replayed
    );

    println!("2. the same send again (a job that ran twice)");
    let receipt = service
        .clone()
        .oneshot(alert("Vintage Nikon FM2 just sold.")?)
        .await?;
    println!(
        "   -> receipt {} (replayed: {})",
        receipt.id, receipt.replayed
    );

    println!("3. another message under the same key");
    match service
        .clone()
        .oneshot(alert("Something else entirely.")?)
        .await
    {
        Ok(receipt) => println!("   -> unexpectedly sent: {}", receipt.id),
        Err(error) => println!("   -> refused: {} ({:?})", error.code(), error.category()),
    }

    println!("4. 20 concurrent duplicates of a new alert");
    let shipped = Message::builder()
        .from("orders@marketplace.example")
        .to("seller@example.com")
        .text("Order ord_20482 shipped.")
        .idempotency_key("order.shipped:ord_20482:sms")
        .build()?;
    let tasks: Vec<_> = (0..20)
        .map(|_| tokio::spawn(service.clone().oneshot(shipped.clone())))
        .collect();
    let (mut sent, mut replayed, mut in_flight) = (0, 0, 0);
    for task in tasks {
        match task.await? {
            Ok(receipt) if receipt.replayed => replayed += 1,
            Ok(_) => sent += 1,
            Err(error) if error.code() == codes::IN_FLIGHT => in_flight += 1,
            Err(error) => return Err(error.into()),
        }
    }
    println!("   -> {sent} sent, {in_flight} answered in flight, {replayed} replayed");

    let calls = calls.load(Ordering::SeqCst);
    let expected = if first_run { 2 } else { 0 };
    let stats = layer.stats();
    println!(
        "\nprovider calls this run: {calls} (expected {expected}); layer: sent {}, replayed {}, \
         in flight {}, key reused {}",
        stats.sent, stats.replayed, stats.in_flight, stats.key_reused
    );
    if first_run {
        println!("run it again: the second run sends nothing");
    }
    Ok(calls)
}
