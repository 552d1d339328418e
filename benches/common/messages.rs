//! The message and the instant provider the layer's benches send through, one definition
//! for `layer.rs` and `sends.rs`.

use tower::Service;
use tower_idempotency::outcome::Receipt;
use tower_idempotency::{BoxError, Message};

/// A message with a text body of `body_len` bytes, under `key` when given.
pub(crate) fn message(body_len: usize, key: Option<String>) -> Message {
    let builder = Message::builder()
        .from("orders@marketplace.example")
        .to("seller@example.com")
        .subject("New order ord_20481")
        .text("x".repeat(body_len));
    match key {
        Some(key) => builder.idempotency_key(key),
        None => builder,
    }
    .build()
    .expect("valid message")
}

/// A provider that answers a ready receipt at once.
pub(crate) fn provider()
-> impl Service<Message, Response = Receipt, Error = BoxError, Future: Send> + Clone + Send {
    tower::service_fn(|_m: Message| {
        std::future::ready(Ok::<_, BoxError>(Receipt::new("msg_1", "bench")))
    })
}
