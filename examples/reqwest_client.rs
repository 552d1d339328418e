//! Your own provider client on reqwest, behind the layer, with no error mapping of yours:
//! `cargo run --example reqwest_client` (the `reqwest` feature).
//!
//! The client is a `tower::service_fn` that posts the message as JSON and answers its errors
//! with `?`. With the `reqwest` feature the layer reads those `reqwest::Error`s itself: a
//! refused connection did not send (the key is freed), a status from `error_for_status()` is
//! placed as `HttpTransport` places it (429 and 503 retryable, 422 permanent), a timeout after
//! the request left may have sent (the key is kept, a repeat is not sent again). The provider
//! is a fake the example starts on 127.0.0.1; it answers by the recipient.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use tower::{Layer, ServiceExt};
use tower_idempotency::{BoxError, IdempotencyLayer, Message, Receipt, SendError};

/// A provider client over reqwest: any `Service<Message, Response = Receipt>` will do.
fn provider(
    client: reqwest::Client,
    url: String,
) -> impl tower::Service<Message, Response = Receipt, Error = BoxError, Future: Send> + Clone {
    tower::service_fn(move |message: Message| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let key = message.idempotency_key().map(|k| k.as_str().to_owned());
            let body = serde_json::json!({ "to": message.to(), "text": message.text() });
            let response = client
                .post(&url)
                // A provider that deduplicates on it is a second net behind the store.
                .header("Idempotency-Key", key.unwrap_or_default())
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await?
                .error_for_status()?;
            let sent: serde_json::Value = serde_json::from_str(&response.text().await?)?;
            let id = sent["id"].as_str().ok_or("the provider answered no id")?;
            Ok(Receipt::new(id, "example-provider"))
        }
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (url, calls) = start_fake_provider().await?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()?;
    let layer = IdempotencyLayer::in_memory();
    let service = layer.layer(provider(client.clone(), url));

    let alert = |to: &str, key: &str| {
        Message::builder()
            .from("shop@example.com")
            .to(to)
            .text("Your order shipped.")
            .idempotency_key(key)
            .build()
    };
    let show = |what: &str, answer: &Result<Receipt, SendError>| match answer {
        Ok(receipt) => println!(
            "{what}: sent as {} (replayed: {})",
            receipt.id, receipt.replayed
        ),
        Err(e) => println!(
            "{what}: {} (category {:?}, may have sent: {}, replayed: {})\n    {e}",
            e.code(),
            e.category(),
            e.delivery_unknown(),
            e.is_replayed()
        ),
    };

    for (what, to, key) in [
        ("a send", "ok@example.com", "order:1"),
        ("the same send again", "ok@example.com", "order:1"),
        ("a 429", "busy@example.com", "order:2"),
        ("a 422", "invalid@example.com", "order:3"),
        (
            "a timeout after the request left",
            "slow@example.com",
            "order:4",
        ),
        ("the same send again", "slow@example.com", "order:4"),
    ] {
        show(what, &service.clone().oneshot(alert(to, key)?).await);
    }

    // Nothing listens on this port: the connection is refused, nothing was written.
    let nowhere = format!("http://{}/emails", free_address()?);
    let unreachable = layer.layer(provider(client, nowhere));
    let answer = unreachable
        .oneshot(alert("ok@example.com", "order:5")?)
        .await;
    show("a refused connection", &answer);

    println!(
        "the provider was called {} times for 7 sends",
        calls.load(Ordering::SeqCst)
    );
    Ok(())
}

/// The fake provider: answers by the recipient, counting the calls that reach it.
async fn start_fake_provider() -> Result<(String, Arc<AtomicUsize>), BoxError> {
    async fn send(State(calls): State<Arc<AtomicUsize>>, body: String) -> (StatusCode, String) {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        if body.contains("busy@") {
            (StatusCode::TOO_MANY_REQUESTS, "slow down".into())
        } else if body.contains("invalid@") {
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid recipient".into())
        } else if body.contains("slow@") {
            // Takes the message, then answers after the client gave up.
            tokio::time::sleep(Duration::from_secs(2)).await;
            (StatusCode::OK, format!(r#"{{"id":"msg_{n}"}}"#))
        } else {
            (StatusCode::OK, format!(r#"{{"id":"msg_{n}"}}"#))
        }
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/emails", post(send))
        .with_state(Arc::clone(&calls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/emails", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((url, calls))
}

/// A loopback address nothing listens on.
fn free_address() -> std::io::Result<std::net::SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}
