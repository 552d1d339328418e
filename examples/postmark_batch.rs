//! A batch through Postmark, with one inactive recipient:
//! `cargo run --example postmark_batch`.
//!
//! Postmark answers a batch `200 OK` with one result per message. The one to an inactive
//! address (`ErrorCode` 406) fails alone: its key is freed, the others are kept done, so the
//! same batch sent again is answered from the store except for that one. The example starts
//! its own fake Postmark on 127.0.0.1.

use axum::Json;
use axum::Router;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::batch::Batch;
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::postmark::PostmarkCodec;
use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let base_url = start_fake_postmark().await?;
    let client = ServiceBuilder::new()
        .map_request(|request: http::Request<Bytes>| request.map(Full::new))
        .service(Client::builder(TokioExecutor::new()).build_http());
    let mut postmark = ServiceBuilder::new()
        .layer(
            IdempotencyLayer::builder()
                .store(MemoryStore::new())
                .namespace("receipts")
                .build()?,
        )
        .service(HttpTransport::new(
            client,
            PostmarkCodec::new("server-token").base_url(base_url),
        ));

    let receipt = |to: &str| -> Result<Message, BoxError> {
        Ok(Message::builder()
            .from("Shop <hello@shop.example>")
            .to(to)
            .subject("Your receipt")
            .text("Thanks for your order.")
            .idempotency_key(format!("receipt:{to}"))
            .build()?)
    };
    let batch = || -> Result<Batch, BoxError> {
        Ok(Batch::from(vec![
            receipt("ann@example.com")?,
            receipt("bounced@example.com")?,
            receipt("bob@example.com")?,
        ]))
    };

    for round in ["first", "again"] {
        println!("{round}:");
        let outcomes = ServiceExt::<Batch>::ready(&mut postmark)
            .await?
            .call(batch()?)
            .await?;
        for outcome in outcomes {
            match outcome {
                Ok(r) => println!("   sent as {} (replayed: {})", r.id, r.replayed),
                Err(e) => println!("   {} (key freed: {})", e.code(), !e.delivery_unknown()),
            }
        }
    }
    Ok(())
}

/// A fake Postmark on 127.0.0.1: every message of a batch is sent, except to an address
/// holding "bounced", answered `ErrorCode` 406.
async fn start_fake_postmark() -> Result<http::Uri, BoxError> {
    async fn batch(Json(messages): Json<Vec<Value>>) -> Json<Value> {
        println!("   postmark: a batch of {}", messages.len());
        let results: Vec<Value> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let to = m["To"].as_str().unwrap_or_default();
                if to.contains("bounced") {
                    json!({ "ErrorCode": 406, "Message": "inactive recipient" })
                } else {
                    json!({ "ErrorCode": 0, "Message": "OK", "To": to, "MessageID": format!("pm-{i}-{to}") })
                }
            })
            .collect();
        Json(Value::Array(results))
    }
    let app = Router::new().route("/email/batch", axum::routing::post(batch));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base_url = format!("http://{}", listener.local_addr()?).parse()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(base_url)
}
