//! The production stack against an HTTP provider:
//! `cargo run --example provider_stack` (the `http` feature).
//!
//! ```text
//! IdempotencyLayer          one reservation for all attempts
//!   RetryLayer(RetryPolicy) the same message and key on every attempt
//!     circuit breaker       counts provider failures only; open = not sent
//!       concurrency limit
//!         timeout           per attempt; a timeout after the request left = delivery unknown
//!           HttpTransport   hyper-util client, Resend's API, Idempotency-Key header
//! ```
//!
//! The example starts its own fake Resend on 127.0.0.1 that prints every request it gets
//! and answers by a script: the first send is accepted, the second message meets a 503 once,
//! and the third one is never answered. It runs in about a second.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::retry::RetryLayer;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::resend::ResendCodec;
use tower_idempotency::{
    BoxError, IdempotencyLayer, MemoryStore, Message, Receipt, RetryPolicy, SendError,
    counts_against_provider,
};
use tower_resilience_circuitbreaker::{CircuitBreakerError, CircuitBreakerLayer};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (base_url, requests) = start_fake_resend().await?;
    let requests_so_far = || requests.load(Ordering::SeqCst);

    // hyper-util's client takes a body type: `Full` wraps the bytes the codec makes.
    let client = ServiceBuilder::new()
        .map_request(|request: http::Request<Bytes>| request.map(Full::new))
        .service(Client::builder(TokioExecutor::new()).build_http());
    let transport = HttpTransport::new(client, ResendCodec::new("re_example").base_url(base_url));

    let layer = IdempotencyLayer::builder()
        .store(MemoryStore::new()) // RedisStore or PostgresStore when several processes send
        .namespace("resend")
        .build()?;
    let breaker = CircuitBreakerLayer::builder()
        .sliding_window_size(20)
        .minimum_number_of_calls(10)
        .failure_rate_threshold(0.5)
        // Replays, in-flight answers and invalid messages say nothing about the provider.
        .failure_classifier(|r: &Result<Receipt, BoxError>| counts_against_provider(r))
        .build()?;
    let resend = ServiceBuilder::new()
        .layer(layer.clone())
        .layer(RetryLayer::new(
            RetryPolicy::new()
                .max_attempts(3)
                .base_delay(Duration::from_millis(100))
                // Judge errors as the layer does, so both agree on what did not go.
                .classifier(layer.classifier()),
        ))
        .map_err(breaker_error)
        .layer(breaker)
        .concurrency_limit(16)
        .timeout(Duration::from_millis(500))
        .service(transport);

    println!("1. first send");
    let receipt = resend.clone().oneshot(order_email("ord_1")?).await?;
    println!(
        "   -> sent as {} (replayed: {})",
        receipt.id, receipt.replayed
    );

    println!("2. another order; the provider answers 503 once, the retry goes through");
    let receipt = resend.clone().oneshot(order_email("ord_2")?).await?;
    println!(
        "   -> sent as {} (replayed: {})",
        receipt.id, receipt.replayed
    );

    println!("3. the first order again (a job that ran twice)");
    let receipt = resend.clone().oneshot(order_email("ord_1")?).await?;
    println!(
        "   -> answered from the store: {} (replayed: {}); provider requests so far: {}",
        receipt.id,
        receipt.replayed,
        requests_so_far()
    );

    println!("4. a third order; the provider takes the request and never answers");
    let error = resend
        .clone()
        .oneshot(order_email("ord_3")?)
        .await
        .expect_err("the provider does not answer");
    println!(
        "   -> {} after the 500 ms attempt timeout (delivery unknown: {}); not retried, \
         the key is kept; provider requests so far: {}",
        error.code(),
        error.delivery_unknown(),
        requests_so_far()
    );
    let again = resend
        .clone()
        .oneshot(order_email("ord_3")?)
        .await
        .expect_err("the kept outcome is the timeout");
    println!(
        "   -> sent again: {} (replayed: {}); provider requests so far: {}",
        again.code(),
        again.is_replayed(),
        requests_so_far()
    );
    println!("   (a message of unknown delivery: check with the provider before sending it anew)");

    let stats = layer.stats();
    println!(
        "layer: {} sends reached the stack, {} answered from the store",
        stats.sent, stats.replayed
    );
    Ok(())
}

/// The breaker's own error hides what an open circuit means: not sent, so the key is freed.
fn breaker_error(e: CircuitBreakerError<BoxError>) -> BoxError {
    match e {
        CircuitBreakerError::OpenCircuit => SendError::circuit_open().into(),
        CircuitBreakerError::Inner(e) => e,
    }
}

fn order_email(order: &str) -> Result<Message, BoxError> {
    Ok(Message::builder()
        .from("orders@marketplace.example")
        .to("seller@example.com")
        .subject(format!("New order {order}"))
        .text("Your item just sold.")
        // Derived from the business event: the same order always has the same key.
        .idempotency_key(format!("order.created:{order}:email"))
        .build()?)
}

/// Starts a fake Resend on 127.0.0.1 and returns its base URL and its request count. It
/// answers its n-th request: 1 accepted; 2 a 503; 3 accepted; 4 never.
async fn start_fake_resend() -> Result<(http::Uri, Arc<AtomicUsize>), BoxError> {
    async fn emails(
        State(requests): State<Arc<AtomicUsize>>,
        headers: HeaderMap,
    ) -> (StatusCode, String) {
        let n = requests.fetch_add(1, Ordering::SeqCst) + 1;
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("(none)");
        match n {
            2 => {
                println!("   provider: request #{n}, Idempotency-Key {key} -> 503");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    r#"{"statusCode":503,"name":"service_unavailable","message":"try later"}"#
                        .to_owned(),
                )
            }
            4 => {
                println!("   provider: request #{n}, Idempotency-Key {key} -> (no answer)");
                std::future::pending().await
            }
            _ => {
                println!("   provider: request #{n}, Idempotency-Key {key} -> 200 msg-{n}");
                (StatusCode::OK, format!(r#"{{"id":"msg-{n}"}}"#))
            }
        }
    }

    let requests = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/emails", axum::routing::post(emails))
        .with_state(Arc::clone(&requests));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base_url = format!("http://{}", listener.local_addr()?).parse()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((base_url, requests))
}
