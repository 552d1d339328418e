//! The transactional outbox: an order and its alert commit in one transaction, a worker sends
//! the alert through the idempotency layer, and running the example again sends nothing twice.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example outbox
//! ```
//!
//! (`postgres://postgres@127.0.0.1:5432/test` is the default.) Start over with
//! `DROP TABLE example_orders, example_outbox, example_keys;`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tower::ServiceBuilder;
use tower_idempotency::outbox::{Enqueued, Outbox};
use tower_idempotency::store::postgres::PostgresStore;
use tower_idempotency::{BoxError, IdempotencyLayer, Message, Receipt};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let outbox = Outbox::connect(&url).await?.table("example_outbox")?;
    outbox.migrate().await?;
    let store = PostgresStore::connect(&url).await?.table("example_keys")?;
    store.migrate().await?;

    // The business transaction: the order and its alert commit together, or not at all.
    let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS example_orders (id text PRIMARY KEY)")
        .await?;
    let tx = client.transaction().await?;
    tx.execute(
        "INSERT INTO example_orders (id) VALUES ($1) ON CONFLICT DO NOTHING",
        &[&"ord_20481"],
    )
    .await?;
    let alert = Message::builder()
        .from("orders@marketplace.example")
        .to("seller@example.com")
        .subject("New order ord_20481")
        .text("Vintage Nikon FM2 just sold.")
        .idempotency_key("order.created:ord_20481:email")
        .build()?;
    match outbox.enqueue(&tx, &alert).await? {
        Enqueued::New(id) => println!("order committed with its alert (outbox row {id})"),
        Enqueued::AlreadyThere => println!("this order's alert is already in the outbox"),
        _ => {}
    }
    tx.commit().await?;

    // The worker: drains the outbox through the idempotency layer, over a provider that
    // counts what it is asked to send.
    let calls = Arc::new(AtomicUsize::new(0));
    let provider = {
        let calls = Arc::clone(&calls);
        tower::service_fn(move |_m: Message| {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            async move { Ok::<_, BoxError>(Receipt::new(format!("msg_{n}"), "example")) }
        })
    };
    let stack = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store))
        .service(provider);
    let worker = outbox
        .worker(stack)
        .poll_interval(Duration::from_millis(50));
    let stats = worker.stats();
    let watched = outbox.clone();
    let run = tokio::spawn(worker.run(async move {
        // Stop once nothing is waiting; a real worker runs until its process is told to stop.
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if watched.counts().await.is_ok_and(|c| c.waiting == 0) {
                break;
            }
        }
    }));
    run.await??;
    println!(
        "the provider was called {} time(s) by this run ({} row(s) sent)",
        calls.load(Ordering::SeqCst),
        stats.get().sent
    );
    println!("run it again: the order and its alert are there already, and nothing is sent");
    Ok(())
}
