//! An SMS through Twilio, once per key: `cargo run --example twilio_sms`.
//!
//! Twilio's Messages API takes no idempotency key, so the idempotency store is the only net:
//! the second send of the same one-time code is answered from the store, and Twilio sees one
//! request. The example starts its own fake Twilio on 127.0.0.1 that prints what it gets.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::twilio::TwilioCodec;
use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message};

const ACCOUNT_SID: &str = "AC0123456789abcdef0123456789abcdef";

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let base_url = start_fake_twilio().await?;
    let client = ServiceBuilder::new()
        .map_request(|request: http::Request<Bytes>| request.map(Full::new))
        .service(Client::builder(TokioExecutor::new()).build_http());
    let codec = TwilioCodec::new(ACCOUNT_SID, "auth-token").base_url(base_url);
    let sms = ServiceBuilder::new()
        .layer(
            IdempotencyLayer::builder()
                .store(MemoryStore::new())
                .namespace("sms")
                .build()?,
        )
        .service(HttpTransport::new(client, codec));

    // E.164 numbers, checked when the message is built.
    let code = Message::sms()
        .from_number("+14155552345")
        .to("+15558675310")
        .text("Your login code is 314159")
        .idempotency_key("login:u_42:otp:1")
        .build()?;

    let first = sms.clone().oneshot(code.clone()).await?;
    println!("sent as {} (replayed: {})", first.id, first.replayed);
    let again = sms.clone().oneshot(code).await?;
    println!("sent again: {} (replayed: {})", again.id, again.replayed);

    // Twilio sends SMS only: an email is refused before any request.
    let email = Message::builder()
        .from("shop@example.com")
        .to("user@example.com")
        .text("hi")
        .build()?;
    let refused = sms.oneshot(email).await.expect_err("Twilio sends SMS only");
    println!("an email: {} ({})", refused.code(), refused.message());
    Ok(())
}

/// A fake Twilio on 127.0.0.1 that answers every message `201 Created`.
async fn start_fake_twilio() -> Result<http::Uri, BoxError> {
    async fn create(State(count): State<Arc<AtomicUsize>>, body: String) -> (StatusCode, String) {
        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
        println!("   twilio: request #{n}: {body}");
        let sid = format!("SM{n:032x}");
        (
            StatusCode::CREATED,
            format!(r#"{{"sid":"{sid}","status":"queued"}}"#),
        )
    }
    let app = Router::new()
        .route(
            &format!("/2010-04-01/Accounts/{ACCOUNT_SID}/Messages.json"),
            axum::routing::post(create),
        )
        .with_state(Arc::new(AtomicUsize::new(0)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base_url = format!("http://{}", listener.local_addr()?).parse()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(base_url)
}
