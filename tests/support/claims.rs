//! Claim-then-send, shared by the tests of every store and driver: the alert a test claims,
//! the layer a run of the application builds, and what the send after a committed claim
//! must do.

use tower::{Layer, ServiceExt};
use tower_idempotency::{IdempotencyLayer, Message, Store};

use super::Provider;

/// The alert of an order, under the key every claim test uses; `text` tells two apart.
pub fn alert(text: &str) -> Message {
    Message::builder()
        .from("orders@shop.example")
        .to("seller@example.com")
        .subject("New order")
        .text(text)
        .idempotency_key("order.created:ord_1:email")
        .build()
        .expect("valid message")
}

/// The layer a run of the application builds over `store`.
pub fn layer(store: impl Store + 'static) -> IdempotencyLayer {
    IdempotencyLayer::builder()
        .store(store)
        .namespace("alerts")
        .build()
        .expect("valid layer")
}

/// After `alert("sold")` was claimed and committed: another message under the key is
/// `key_reused` and not sent, the claimed one goes once, and a repeat replays its receipt.
pub async fn the_send_takes_the_claim_once(layer: &IdempotencyLayer) {
    let provider = Provider::ok();
    let service = layer.layer(provider.clone());
    let error = service
        .clone()
        .oneshot(alert("a different text"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), "idempotency.key_reused");
    assert_eq!(provider.calls(), 0);
    let first = service.clone().oneshot(alert("sold")).await.unwrap();
    assert!(!first.replayed);
    let repeat = service.oneshot(alert("sold")).await.unwrap();
    assert!(repeat.replayed);
    assert_eq!((repeat.id, provider.calls()), (first.id, 1));
}
