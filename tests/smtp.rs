//! SMTP through `SmtpTransport` against a real SMTP server on loopback: aiosmtpd with the
//! handler in tests/support/smtp_server.py, whose behaviour each message picks by its first
//! recipient. One message per key under retries; 421 and 451 retried; a drop after the final
//! `.` keeps the key of unknown delivery; 550 and a drop before `DATA` free it.
#![cfg(feature = "smtp")]

mod support;

use std::time::Duration;

use support::python::SmtpServer;
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::outcome::{Category, codes};
use tower_idempotency::smtp::SmtpTransport;
use tower_idempotency::{
    Envelope, IdempotencyLayer, MemoryStore, Message, RawMessage, Receipt, RetryPolicy, SendError,
};

/// A bound on each SMTP step: never reached when the tests pass.
const STEP: Duration = Duration::from_secs(10);

fn relay(server: &SmtpServer) -> SmtpTransport {
    SmtpTransport::unencrypted("127.0.0.1")
        .port(server.addr.port())
        .step_timeout(STEP)
}

/// The stack a user builds: the layer outside a retry (three attempts) and a timeout.
fn stack<R>(
    layer: &IdempotencyLayer,
    server: &SmtpServer,
) -> impl Service<R, Response = Receipt, Error = SendError> + use<R>
where
    R: tower_idempotency::layer::IdempotentRequest + Clone,
    SmtpTransport: Service<R, Response = Receipt, Error = SendError>,
    <SmtpTransport as Service<R>>::Future: Send + 'static,
{
    let retry = RetryPolicy::new()
        .max_attempts(3)
        .base_delay(Duration::from_millis(10))
        .classifier(layer.classifier());
    ServiceBuilder::new()
        .layer(layer.clone())
        .layer(RetryLayer::new(retry))
        .timeout(Duration::from_secs(30))
        .service(relay(server))
}

fn message(to: &str, key: &str) -> Message {
    Message::builder()
        .from("Shop <shop@shop.example>")
        .to(to)
        .bcc("audit@shop.example")
        .subject("Your order")
        .text("It ships today.")
        .idempotency_key(key)
        .build()
        .unwrap()
}

async fn send<S, R>(service: &mut S, request: R) -> Result<Receipt, SendError>
where
    S: Service<R, Response = Receipt, Error = SendError>,
{
    service.ready().await?.call(request).await
}

#[cfg_attr(
    not(backend_aiosmtpd),
    ignore = "aiosmtpd not found: run .ci/python-fakes.sh"
)]
#[tokio::test]
async fn a_greylisted_message_is_retried_and_taken_once_per_key() {
    let server = SmtpServer::start();
    let mut smtp = stack(&IdempotencyLayer::in_memory(), &server);

    let receipt = send(&mut smtp, message("greylist@example.com", "order:1:email"))
        .await
        .unwrap();
    assert!(!receipt.replayed);
    assert_eq!(receipt.transport, "smtp");
    let id = format!("<{}>", receipt.id);
    assert!(id.ends_with(".idempotency@shop.example>"), "{id}");
    assert_eq!(server.taken_with_id(&id), 1);
    // The envelope held the bcc recipient; the header did not.
    let taken = &server.taken()[0];
    assert_eq!(taken["rcpt_tos"][1], "audit@shop.example");

    let again = send(&mut smtp, message("greylist@example.com", "order:1:email"))
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.id, receipt.id);
    assert_eq!(server.taken().len(), 1, "a replay sends nothing");
}

#[cfg_attr(
    not(backend_aiosmtpd),
    ignore = "aiosmtpd not found: run .ci/python-fakes.sh"
)]
#[tokio::test]
async fn a_421_is_retried_and_the_message_taken_once() {
    let server = SmtpServer::start();
    let mut smtp = stack(&IdempotencyLayer::in_memory(), &server);
    let receipt = send(&mut smtp, message("closing@example.com", "order:2:email"))
        .await
        .unwrap();
    assert_eq!(server.taken_with_id(&format!("<{}>", receipt.id)), 1);
    assert_eq!(server.taken().len(), 1);
}

#[cfg_attr(
    not(backend_aiosmtpd),
    ignore = "aiosmtpd not found: run .ci/python-fakes.sh"
)]
#[tokio::test]
async fn a_connection_dropped_after_the_final_dot_keeps_the_key_of_unknown_delivery() {
    let server = SmtpServer::start();
    let mut smtp = stack(&IdempotencyLayer::in_memory(), &server);
    let error = send(&mut smtp, message("drop-data@example.com", "order:3:email"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), codes::CONNECTION_LOST);
    assert_eq!(error.category(), Category::Unknown);
    assert_eq!(
        server.taken().len(),
        1,
        "the server took it, once: no retry"
    );

    // The key is kept: the same send is answered from the store, the server not called.
    let again = send(&mut smtp, message("drop-data@example.com", "order:3:email"))
        .await
        .unwrap_err();
    assert!(again.is_replayed());
    assert_eq!(again.code(), codes::CONNECTION_LOST);
    assert_eq!(server.taken().len(), 1);
}

#[cfg_attr(
    not(backend_aiosmtpd),
    ignore = "aiosmtpd not found: run .ci/python-fakes.sh"
)]
#[tokio::test]
async fn a_550_frees_the_key_with_a_permanent_error() {
    let server = SmtpServer::start();
    let mut smtp = stack(&IdempotencyLayer::in_memory(), &server);
    let error = send(&mut smtp, message("unknown@example.com", "order:4:email"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), codes::REJECTED);
    assert_eq!(error.category(), Category::Permanent);
    assert!(error.message().contains("550"), "{error}");
    assert!(server.taken().is_empty());

    // Freed: the corrected message goes under the same key.
    let receipt = send(&mut smtp, message("ok@example.com", "order:4:email"))
        .await
        .unwrap();
    assert!(!receipt.replayed);
    assert_eq!(server.taken().len(), 1);
}

#[cfg_attr(
    not(backend_aiosmtpd),
    ignore = "aiosmtpd not found: run .ci/python-fakes.sh"
)]
#[tokio::test]
async fn a_refusal_after_the_body_is_judged_by_its_enhanced_code_and_frees_the_key() {
    let server = SmtpServer::start();
    let mut smtp = stack(&IdempotencyLayer::in_memory(), &server);
    let error = send(&mut smtp, message("content@example.com", "order:5:email"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), codes::VALIDATION_ERROR);
    assert_eq!(error.category(), Category::Validation);
    let receipt = send(&mut smtp, message("ok@example.com", "order:5:email")).await;
    assert!(receipt.is_ok_and(|r| !r.replayed));
}

#[cfg_attr(
    not(backend_aiosmtpd),
    ignore = "aiosmtpd not found: run .ci/python-fakes.sh"
)]
#[tokio::test]
async fn a_connection_dropped_before_data_frees_the_key() {
    let server = SmtpServer::start();
    let mut smtp = stack(&IdempotencyLayer::in_memory(), &server);
    let error = send(&mut smtp, message("drop-rcpt@example.com", "order:6:email"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), codes::CONNECT);
    assert_eq!(error.category(), Category::Retryable);
    assert!(server.taken().is_empty());
    let receipt = send(&mut smtp, message("ok@example.com", "order:6:email")).await;
    assert!(receipt.is_ok_and(|r| !r.replayed));
    assert_eq!(server.taken().len(), 1);
}

#[cfg_attr(
    not(backend_aiosmtpd),
    ignore = "aiosmtpd not found: run .ci/python-fakes.sh"
)]
#[tokio::test]
async fn the_message_id_comes_from_the_stored_key_in_every_process() {
    let server = SmtpServer::start();
    // Two processes, each with a store of its own: both send, under one Message-ID.
    let mut first = stack(&IdempotencyLayer::in_memory(), &server);
    let mut second = stack(&IdempotencyLayer::in_memory(), &server);
    let a = send(&mut first, message("ok@example.com", "order:7:email"))
        .await
        .unwrap();
    let b = send(&mut second, message("ok@example.com", "order:7:email"))
        .await
        .unwrap();
    assert_eq!(a.id, b.id);
    assert_eq!(server.taken_with_id(&format!("<{}>", a.id)), 2);
    let other = send(&mut first, message("ok@example.com", "order:8:email"))
        .await
        .unwrap();
    assert_ne!(other.id, a.id);
}

#[cfg_attr(
    not(backend_aiosmtpd),
    ignore = "aiosmtpd not found: run .ci/python-fakes.sh"
)]
#[tokio::test]
async fn a_raw_message_goes_to_its_envelope_once_per_key() {
    let server = SmtpServer::start();
    let layer = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .raw_key(|_: &RawMessage| Some("raw:invoice:9".to_owned()))
        .build()
        .unwrap();
    let mut smtp = stack(&layer, &server);
    let raw = || {
        RawMessage::new(
            Envelope::new("shop@shop.example", ["ok@example.com"]).unwrap(),
            &b"Message-ID: <raw-9@shop.example>\r\nSubject: Invoice\r\n\r\nAttached.\r\n"[..],
        )
    };
    let receipt = send(&mut smtp, raw()).await.unwrap();
    assert!(receipt.id.contains("queued"), "{}", receipt.id);
    let again = send(&mut smtp, raw()).await.unwrap();
    assert!(again.replayed);
    assert_eq!(server.taken_with_id("<raw-9@shop.example>"), 1);
}
