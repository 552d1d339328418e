//! Reconciling an unknown outcome: a send times out after the provider took the message, so
//! its key is kept as of unknown delivery; a reconciler asks the provider what it accepted,
//! settles the key as delivered with the provider's id, and the repeat is replayed with that
//! id, never sent again.
//!
//! The provider is a fake one on 127.0.0.1, started by the example: `POST /emails` takes a
//! message (deduplicating on the `Idempotency-Key` header, like Resend) and answers late when
//! asked to; `GET /emails` lists what it accepted under the `Idempotency-Key` it is given. The store is
//! a `MemoryStore`.
//!
//! ```sh
//! cargo run --example reconcile
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::reconcile::Reconciler;
use tower_idempotency::verify::{Verified, Verify};
use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message, Receipt};

/// What the fake provider accepted: idempotency key → message id.
type Accepted = Arc<Mutex<HashMap<String, String>>>;

/// The `Idempotency-Key` header of a request.
fn key_of(headers: &HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Takes a message once per `Idempotency-Key`; with `x-slow` answers after 5 s.
async fn send_email(
    State(accepted): State<Accepted>,
    headers: HeaderMap,
) -> Json<serde_json::Value> {
    let key = key_of(&headers);
    let id = {
        let mut accepted = accepted.lock().unwrap_or_else(|e| e.into_inner());
        let next = format!("msg_{}", accepted.len() + 1);
        accepted.entry(key).or_insert(next).clone()
    };
    if headers.contains_key("x-slow") {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    Json(serde_json::json!({ "id": id }))
}

/// Lists the messages accepted under the `Idempotency-Key` header.
async fn list_emails(
    State(accepted): State<Accepted>,
    headers: HeaderMap,
) -> Json<serde_json::Value> {
    let key = key_of(&headers);
    let accepted = accepted.lock().unwrap_or_else(|e| e.into_inner());
    let data: Vec<_> = accepted
        .get(&key)
        .map(|id| serde_json::json!({ "id": id, "idempotency_key": key }))
        .into_iter()
        .collect();
    Json(serde_json::json!({ "data": data }))
}

/// The provider client: a `Service<Message>` over reqwest.
async fn post_email(
    http: reqwest::Client,
    base: String,
    message: Message,
    slow: bool,
) -> Result<Receipt, BoxError> {
    // The key the layer holds for this send (namespaced), as `HttpTransport` sends it.
    let key = message.provider_key().unwrap_or_default().to_owned();
    let mut request = http
        .post(format!("{base}/emails"))
        .header("idempotency-key", key);
    if slow {
        request = request.header("x-slow", "1");
    }
    let body = request.send().await?.error_for_status()?.text().await?;
    let value: serde_json::Value = serde_json::from_str(&body)?;
    let id = value["id"].as_str().ok_or("no id in the answer")?;
    Ok(Receipt::new(id, "fake"))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The fake provider.
    let accepted: Accepted = Arc::default();
    let app = Router::new()
        .route("/emails", post(send_email).get(list_emails))
        .with_state(accepted.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    // The stack: the layer, then a 1 s timeout, then the client. The first send asks the
    // provider to answer slowly, as a provider under load would.
    let http = reqwest::Client::new();
    let slow = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let client = {
        let (http, base, slow) = (http.clone(), base.clone(), slow.clone());
        tower::service_fn(move |message: Message| {
            let slow = slow.swap(false, std::sync::atomic::Ordering::SeqCst);
            post_email(http.clone(), base.clone(), message, slow)
        })
    };
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("alerts")
        .build()?;
    let keys = layer.stored_keys();
    let service = ServiceBuilder::new()
        .layer(layer)
        .timeout(Duration::from_secs(1))
        .service(client);

    let alert = Message::builder()
        .from("orders@marketplace.example")
        .to("seller@example.com")
        .subject("New order ord_20481")
        .text("Vintage Nikon FM2 just sold.")
        .idempotency_key("order.created:ord_20481:email")
        .build()?;

    let first = service.clone().oneshot(alert.clone()).await;
    let error = first.err().ok_or("the first send was meant to time out")?;
    println!(
        "first send: {} (delivery unknown: {})",
        error.code(),
        error.delivery_unknown()
    );
    let blocked = service.clone().oneshot(alert.clone()).await;
    let blocked = blocked.err().ok_or("the key was meant to stay unknown")?;
    println!(
        "a repeat before reconciling: {} (replayed: {})",
        blocked.code(),
        blocked.is_replayed()
    );

    // The verification service: asks the provider what it accepted under the key.
    let verify = tower::service_fn(move |question: Verify| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            // The provider was sent the stored key, so the stored key finds the message,
            // with raw and hashed keys alike.
            let body = http
                .get(format!("{base}/emails"))
                .header("idempotency-key", question.stored_key)
                .send()
                .await?
                .error_for_status()?
                .text()
                .await?;
            let listed: serde_json::Value = serde_json::from_str(&body)?;
            Ok::<_, BoxError>(match listed["data"][0]["id"].as_str() {
                Some(id) => Verified::Delivered(Receipt::new(id, "fake")),
                None => Verified::NotSent,
            })
        }
    });
    let mut reconciler = Reconciler::new(store, verify).stored_keys(keys);
    let report = reconciler.run_once().await;
    println!(
        "reconciler: checked {}, delivered {}, not sent {}, unknown {}",
        report.checked, report.delivered, report.not_sent, report.unknown
    );

    let again = service.oneshot(alert).await?;
    println!(
        "a repeat after reconciling: {} (replayed: {})",
        again.id, again.replayed
    );
    let taken = accepted.lock().unwrap_or_else(|e| e.into_inner()).len();
    println!("messages the provider took: {taken}");
    if !(again.replayed && report.delivered == 1 && taken == 1) {
        return Err("the message was not settled as delivered".into());
    }
    Ok(())
}
