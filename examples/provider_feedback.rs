//! Delivery truth from the provider: `cargo run --example provider_feedback` (the `http`
//! feature).
//!
//! Two sends leave their keys of unknown delivery: the client times out on the first, and
//! the provider answers 500 to the second after taking it. Each is settled from what the
//! provider says, so neither message ever goes twice:
//!
//! - the first by Resend's webhook: the provider posts a Svix-signed `email.delivered` event
//!   to the app's axum route, where a [`ResendWebhook`] checks the signature and settles the
//!   key with the provider's id;
//! - the second by the [`Reconciler`], running on a timer with the shipped Resend lookup
//!   ([`ListingLookup`] over `GET /emails`), which finds the message by the mark the codec
//!   put on it.
//!
//! The example starts its own fake Resend on 127.0.0.1 (it takes messages, lists them as
//! Resend's `GET /emails` does, and signs its webhook as Svix documents) and its own app
//! server. It runs in about a second.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::lookup::ListingLookup;
use tower_idempotency::http::lookup::resend::ResendListing;
use tower_idempotency::http::resend::ResendCodec;
use tower_idempotency::http::webhook::resend::{ResendEvents, ResendWebhook};
use tower_idempotency::reconcile::Reconciler;
use tower_idempotency::store::admin::StoreAdmin;
use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message};

/// The app's webhook signing secret, as Resend's dashboard shows it (Svix's example secret).
const SIGNING_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("orders")
        .build()?;

    // The app: the webhook receiver on an axum route.
    let receiver = ResendWebhook::new(store.clone(), ResendEvents::new(SIGNING_SECRET)?);
    let webhook_stats = receiver.stats();
    let app = Router::new().route_service("/webhooks/resend", receiver);
    let app_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let webhook_url = format!("http://{}/webhooks/resend", app_listener.local_addr()?);
    tokio::spawn(async move { axum::serve(app_listener, app).await });

    let resend = FakeResend::start(webhook_url).await?;

    // The reconciler, on a timer, with the shipped lookup.
    let client = ServiceBuilder::new()
        .map_request(|request: http::Request<Bytes>| request.map(Full::new))
        .service(Client::builder(TokioExecutor::new()).build_http());
    let lookup = ListingLookup::new(
        client.clone(),
        // Every keyed message here lets the codec set its Message-ID, so a message missing
        // from the listing past its delay was not sent.
        ResendListing::new("re_example")
            .base_url(resend.base_url.parse()?)
            .every_message_marked(),
    );
    let reconciler = Reconciler::new(store.clone(), lookup).stored_keys(layer.stored_keys());
    let counters = reconciler.counters();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let reconciling = tokio::spawn(reconciler.run(Duration::from_millis(100), async move {
        let _ = stopped.await;
    }));

    let send = |message: Message| {
        let transport = HttpTransport::new(
            client.clone(),
            ResendCodec::new("re_example").base_url(resend.base_url.parse().expect("a URI")),
        );
        ServiceBuilder::new()
            .layer(layer.clone())
            .timeout(Duration::from_millis(300))
            .service(transport)
            .oneshot(message)
    };
    let order = |key: &str| {
        Message::builder()
            .from("Shop <orders@shop.example>")
            .to("seller@example.com")
            .subject("New order")
            .text("Sold.")
            .idempotency_key(key)
            .build()
    };

    // 1. The client times out; the provider took it and will say so by webhook.
    resend.next(Behaviour::TakeThenHang);
    let timed_out = send(order("order:1")?)
        .await
        .expect_err("the client times out");
    println!(
        "order:1  -> {} (delivery unknown: {})",
        timed_out.code(),
        timed_out.delivery_unknown()
    );
    resend.post_webhook(0, "email.delivered").await?;

    // 2. The provider takes it and answers 500; no webhook: the reconciler's lookup finds it.
    resend.next(Behaviour::TakeThen500);
    let failed = send(order("order:2")?).await.expect_err("a 500");
    println!(
        "order:2  -> {} (delivery unknown: {})",
        failed.code(),
        failed.delivery_unknown()
    );

    // Wait (bounded) until both keys hold the provider's receipt.
    for _ in 0..50 {
        let settled = ["orders:order:1", "orders:order:2"].iter().map(|key| {
            let store = store.clone();
            async move {
                store
                    .inspect(key)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|r| !r.is_unknown_delivery())
            }
        });
        if futures_util::future::join_all(settled)
            .await
            .into_iter()
            .all(|s| s)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    for key in ["order:1", "order:2"] {
        let again = send(order(key)?).await?;
        println!(
            "{key}  repeat -> {} (replayed: {})",
            again.id, again.replayed
        );
        assert!(again.replayed);
    }
    println!(
        "webhook settled {}, reconciler settled {}; the fake provider received {} sends",
        webhook_stats.delivered(),
        counters.totals().delivered,
        resend.sends()
    );
    assert_eq!(resend.sends(), 2, "no message went twice");
    let _ = stop.send(());
    reconciling.await?;
    Ok(())
}

/// What the fake does with the next `POST /emails`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    TakeThenHang,
    TakeThen500,
}

#[derive(Default)]
struct Taken {
    emails: Vec<Value>,
    next: Vec<Behaviour>,
    sends: usize,
}

/// A fake Resend: takes emails, lists them (`GET /emails`), and signs its webhook as Svix does.
#[derive(Clone)]
struct FakeResend {
    base_url: String,
    webhook_url: String,
    taken: Arc<Mutex<Taken>>,
}

impl FakeResend {
    async fn start(webhook_url: String) -> Result<Self, BoxError> {
        let taken: Arc<Mutex<Taken>> = Arc::default();
        let app = Router::new()
            .route("/emails", get(list).post(take))
            .with_state(taken.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base_url = format!("http://{}", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self {
            base_url,
            webhook_url,
            taken,
        })
    }

    fn next(&self, behaviour: Behaviour) {
        self.taken
            .lock()
            .expect("not poisoned")
            .next
            .push(behaviour);
    }

    fn sends(&self) -> usize {
        self.taken.lock().expect("not poisoned").sends
    }

    /// Posts a Svix-signed event about the `n`-th email taken to the app.
    async fn post_webhook(&self, n: usize, kind: &str) -> Result<(), BoxError> {
        let email = self.taken.lock().expect("not poisoned").emails[n].clone();
        let body = json!({
            "type": kind,
            "created_at": "2024-11-22T23:41:12.126Z",
            "data": { "email_id": email["id"], "tags": email["tags"] },
        })
        .to_string();
        let id = format!("msg_{n}");
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)?
            .as_secs()
            .to_string();
        let key = base64_decode(SIGNING_SECRET.trim_start_matches("whsec_"));
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key)?;
        mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
        let signature = base64_encode(&mac.finalize().into_bytes());
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let request = http::Request::post(&self.webhook_url)
            .header("svix-id", id)
            .header("svix-timestamp", timestamp)
            .header("svix-signature", format!("v1,{signature}"))
            .body(Full::new(Bytes::from(body)))?;
        let status = client.request(request).await?.status();
        println!("webhook  -> the app answered {status}");
        Ok(())
    }
}

async fn take(State(taken): State<Arc<Mutex<Taken>>>, body: Bytes) -> (StatusCode, String) {
    let (behaviour, id) = {
        let mut taken = taken.lock().expect("not poisoned");
        taken.sends += 1;
        let behaviour = if taken.next.is_empty() {
            None
        } else {
            Some(taken.next.remove(0))
        };
        let sent: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let id = format!("re-{}", taken.emails.len());
        // Resend lists `message_id`; its webhook events carry the tags as an object.
        let tags: serde_json::Map<String, Value> = sent["tags"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| Some((t["name"].as_str()?.to_owned(), t["value"].clone())))
            .collect();
        taken.emails.push(json!({
            "id": id,
            "message_id": sent["headers"]["Message-ID"],
            "created_at": "2099-01-01 00:00:00.000000+00",
            "tags": tags,
        }));
        (behaviour, id)
    };
    match behaviour {
        Some(Behaviour::TakeThenHang) => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            (StatusCode::OK, json!({ "id": id }).to_string())
        }
        Some(Behaviour::TakeThen500) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            r#"{"name":"internal_server_error"}"#.into(),
        ),
        None => (StatusCode::OK, json!({ "id": id }).to_string()),
    }
}

async fn list(State(taken): State<Arc<Mutex<Taken>>>) -> String {
    let taken = taken.lock().expect("not poisoned");
    let data: Vec<&Value> = taken.emails.iter().rev().collect();
    json!({ "object": "list", "has_more": false, "data": data }).to_string()
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            out.push(if i <= chunk.len() {
                ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}

fn base64_decode(text: &str) -> Vec<u8> {
    let (mut bits, mut count, mut out) = (0u32, 0, Vec::new());
    for c in text.bytes().filter(|c| *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c).unwrap_or(0) as u32;
        bits = bits << 6 | v;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    out
}
