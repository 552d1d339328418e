//! An email over SMTP, once per key: `cargo run --example smtp`.
//!
//! SMTP has no idempotency key, so the idempotency store is the only net: the second send of
//! the same order email is answered from the store, and the relay sees one message. Its
//! `Message-ID` is derived from the key, so a copy that did go twice carries one id.
//!
//! With `SMTP_RELAY` set, the example sends through that relay on port 587 with `STARTTLS`,
//! logging in as `SMTP_USER` / `SMTP_PASSWORD`. Unset, it sends unencrypted to a relay on
//! 127.0.0.1:2525, such as `python -m aiosmtpd -n -l 127.0.0.1:2525` (which prints each
//! message).

use std::time::Duration;

use tower::retry::RetryLayer;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::smtp::SmtpTransport;
use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message, RetryPolicy};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let relay = match std::env::var("SMTP_RELAY") {
        Ok(host) => SmtpTransport::starttls_relay(host)
            .credentials(std::env::var("SMTP_USER")?, std::env::var("SMTP_PASSWORD")?),
        Err(_) => SmtpTransport::unencrypted("127.0.0.1").port(2525),
    };
    let layer = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .namespace("email")
        .build()?;
    // 421 and 4xx replies (greylisting) are retried under the same key and Message-ID.
    let retry = RetryPolicy::new()
        .max_attempts(3)
        .classifier(layer.classifier());
    let smtp = ServiceBuilder::new()
        .layer(layer)
        .layer(RetryLayer::new(retry))
        .timeout(Duration::from_secs(60))
        .service(relay);

    let shipped = Message::builder()
        .from("Shop <orders@shop.example>")
        .to("buyer@example.com")
        .subject("Your order ord_20481 shipped")
        .text("It is on its way.")
        .idempotency_key("order.shipped:ord_20481:email")
        .build()?;

    match smtp.clone().oneshot(shipped.clone()).await {
        Ok(first) => println!(
            "sent as Message-ID <{}> (replayed: {})",
            first.id, first.replayed
        ),
        Err(error) => {
            println!(
                "not sent: {} ({}): is a relay listening?",
                error.code(),
                error.message()
            );
            return Ok(());
        }
    }
    let again = smtp.oneshot(shipped).await?;
    println!("sent again: <{}> (replayed: {})", again.id, again.replayed);
    Ok(())
}
