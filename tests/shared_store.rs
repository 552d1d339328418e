//! Two "processes" (two layers, two store clients) over one shared server: 50 concurrent
//! duplicates spread across both reach the provider once. Runs against `REDIS_URL` /
//! `DATABASE_URL` or the default local servers; reported as ignored when a server did not
//! answer as the suite was built.
#![cfg(any(feature = "redis", feature = "postgres"))]

mod support;

use std::sync::Arc;

use support::stores::{backend_url, unique};
use support::{Provider, message};
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::outcome::codes;
use tower_idempotency::{IdempotencyLayer, Store};

/// Sends 50 duplicates, alternating between two layers over `a` and `b`; answers the
/// namespace it used.
async fn fifty_duplicates_across_two_processes(a: impl Store, b: impl Store) -> String {
    let provider = Provider::answering(|n, _| async move {
        // Let the other duplicates arrive while this send is in flight.
        tokio::task::yield_now().await;
        Ok(tower_idempotency::Receipt::new(format!("msg-{n}"), "fake"))
    });
    let namespace = unique("e2e");
    let layer = |store| {
        IdempotencyLayer::builder()
            .shared_store(store)
            .namespace(namespace.clone())
            // Short-lived: nothing of this test outlives it for long.
            .lease(std::time::Duration::from_secs(30))
            .ttl(std::time::Duration::from_secs(60))
            .build()
            .unwrap()
    };
    let first = ServiceBuilder::new()
        .layer(layer(Arc::new(a)))
        .service(provider.clone());
    let second = ServiceBuilder::new()
        .layer(layer(Arc::new(b)))
        .service(provider.clone());
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let svc = if i % 2 == 0 {
                first.clone()
            } else {
                second.clone()
            };
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                svc.oneshot(message(Some("order.created:ord_1:email"), "one alert"))
                    .await
            })
        })
        .collect();
    let mut sent = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(receipt) if !receipt.replayed => sent += 1,
            Ok(receipt) => assert_eq!(receipt.id, "msg-1"),
            Err(e) => assert_eq!(e.code(), codes::IN_FLIGHT, "{e}"),
        }
    }
    assert_eq!(sent, 1);
    assert_eq!(provider.calls(), 1);
    namespace
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn redis_two_processes_fifty_duplicates_one_send() {
    use tower_idempotency::RedisStore;
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let a = RedisStore::connect(&url).await.unwrap();
    let b = RedisStore::connect(&url).await.unwrap();
    fifty_duplicates_across_two_processes(a, b).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn postgres_two_processes_fifty_duplicates_one_send() {
    use tower_idempotency::PostgresStore;
    let Some(url) = backend_url("DATABASE_URL") else {
        return;
    };
    let a = PostgresStore::connect(&url).await.unwrap();
    a.migrate().await.unwrap();
    let b = PostgresStore::connect(&url).await.unwrap();
    let pool = a.pool().clone();
    let namespace = fifty_duplicates_across_two_processes(a, b).await;
    let client = pool.get().await.unwrap();
    client
        .execute(
            "DELETE FROM idempotency_keys WHERE key LIKE $1",
            &[&format!("{namespace}:%")],
        )
        .await
        .unwrap();
}
