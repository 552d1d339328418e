//! An email through Amazon SES (API v2), once per key: `cargo run --example ses`.
//!
//! SES has no idempotency key of its own, so the idempotency store is the only net: the second
//! send of the same order email is answered from the store, and SES sees one request. The key
//! rides as the message tag `idempotency-key` (its SHA-256), so the SES events of a
//! configuration set map back to it.
//!
//! With `SES_ENDPOINT` unset the example starts its own fake SES on 127.0.0.1 that prints what
//! it gets. Set `SES_ENDPOINT` (moto's server: `moto_server -p 5000`, then
//! `SES_ENDPOINT=http://127.0.0.1:5000`) to send elsewhere; credentials come from
//! `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` when set. Real SES is https: build the client
//! over an HTTPS connector such as hyper-rustls.

use std::time::Duration;

use aws_credential_types::Credentials;
use axum::Router;
use axum::http::StatusCode;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::retry::RetryLayer;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::ses::SesCodec;
use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message, RetryPolicy};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let endpoint = match std::env::var("SES_ENDPOINT") {
        Ok(url) => url,
        Err(_) => start_fake_ses().await?,
    };
    let credentials = Credentials::new(
        std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_else(|_| "AKIDEXAMPLE".into()),
        std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|_| "example-secret".into()),
        std::env::var("AWS_SESSION_TOKEN").ok(),
        None,
        "environment",
    );
    let codec = SesCodec::new("us-east-1", credentials)
        .configuration_set("transactional")
        .base_url(endpoint.parse()?);
    let client = ServiceBuilder::new()
        .map_request(|request: http::Request<Bytes>| request.map(Full::new))
        .service(Client::builder(TokioExecutor::new()).build_http());

    let layer = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .namespace("email")
        .build()?;
    let retry = RetryPolicy::new()
        .max_attempts(3)
        .classifier(layer.classifier());
    let ses = ServiceBuilder::new()
        .layer(layer)
        // Throttles (429 TooManyRequestsException) are retried under the same key.
        .layer(RetryLayer::new(retry))
        .timeout(Duration::from_secs(10))
        .service(HttpTransport::new(client, codec));

    let shipped = Message::builder()
        .from("orders@shop.example")
        .to("buyer@example.com")
        .subject("Your order ord_20481 shipped")
        .text("It is on its way.")
        .metadata("kind", "order_shipped")
        .idempotency_key("order.shipped:ord_20481:email")
        .build()?;

    let first = ses.clone().oneshot(shipped.clone()).await?;
    println!("sent as {} (replayed: {})", first.id, first.replayed);
    let again = ses.oneshot(shipped).await?;
    println!("sent again: {} (replayed: {})", again.id, again.replayed);
    Ok(())
}

/// A fake SES v2 `SendEmail` on 127.0.0.1 that prints each request's tags and answers a
/// `MessageId`.
async fn start_fake_ses() -> Result<String, BoxError> {
    let app = Router::new().route(
        "/v2/email/outbound-emails",
        axum::routing::post(|body: Bytes| async move {
            let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            println!("fake SES got a message, tags {}", request["EmailTags"]);
            (
                StatusCode::OK,
                [("content-type", "application/json")],
                r#"{"MessageId":"0100018f-fake-ses-message"}"#,
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}"))
}
