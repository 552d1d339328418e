//! The main job on the in-memory store, no server needed: `cargo run --example quickstart`.
//!
//! A fake provider counts and prints what it sends. Behind `IdempotencyLayer`, a first send
//! goes, the same send again is answered from the store, another message under the same key
//! is refused, and 20 concurrent duplicates reach the provider once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::outcome::codes;
use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message, Receipt};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
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
        .store(MemoryStore::new())
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

    let stats = layer.stats();
    println!(
        "summary: provider calls = {} (expected 2); layer: sent {}, replayed {}, in flight {}, key reused {}",
        calls.load(Ordering::SeqCst),
        stats.sent,
        stats.replayed,
        stats.in_flight,
        stats.key_reused
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "each alert reached the provider once"
    );
    Ok(())
}
