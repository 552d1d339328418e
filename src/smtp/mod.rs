//! [`SmtpTransport`]: SMTP through lettre on tokio, as a `Service<Message>` and a
//! `Service<RawMessage>` whose errors say whether the server can have taken the message.
//! Enabled by the `smtp` feature.
//!
//! SMTP has no idempotency key: the idempotency layer is the only net in front of a relay, so
//! the transport tells apart what happened before the message's body was written (nothing
//! can have been taken: the key is freed) from what happened after (the server may hold it:
//! the key is kept).
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_idempotency::smtp::SmtpTransport;
//! use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message, RetryPolicy};
//!
//! # #[tokio::main] async fn main() -> Result<(), BoxError> {
//! let relay = SmtpTransport::starttls_relay("smtp.example.com")
//!     .credentials(std::env::var("SMTP_USER")?, std::env::var("SMTP_PASSWORD")?);
//! let smtp = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::builder().store(MemoryStore::new()).build()?)
//!     .layer(tower::retry::RetryLayer::new(RetryPolicy::new()))
//!     .timeout(Duration::from_secs(60))
//!     .service(relay);
//!
//! let message = Message::builder()
//!     .from("Shop <orders@shop.example>")
//!     .to("seller@example.com")
//!     .subject("New order ord_20481")
//!     .text("Vintage Nikon FM2 just sold.")
//!     .idempotency_key("order.created:ord_20481:email")
//!     .build()?;
//! let receipt = smtp.oneshot(message).await?;
//! println!("sent as Message-ID <{}>", receipt.id);
//! # Ok(()) }
//! ```
//!
//! # A send
//!
//! Each call is one SMTP session on a new connection: connect (with TLS as
//! [`Encryption`] says), `STARTTLS`, `AUTH`, `MAIL FROM`, one `RCPT TO` per recipient (to, cc
//! and bcc; `Bcc` is not written in the header), `DATA`, the message and its final `.`, then
//! `QUIT`. One connection per message keeps every failure attached to the one message it
//! concerns; lettre's pooled `AsyncSmtpTransport` reports its errors without the step they
//! came in, which is what decides the key here, so its connection
//! ([`AsyncSmtpConnection`](lettre::transport::smtp::client::AsyncSmtpConnection)) is driven
//! step by step instead. A refused recipient fails the whole message before `DATA`: nothing is
//! sent, to anyone.
//!
//! A [`Message`](crate::Message) is written as MIME by lettre's builder. Its `Message-ID` is
//! derived from the stored key ([`provider_key`](crate::Message::provider_key)):
//! `<`32 hex digits of a SHA-256 of the key`.idempotency@`the sender's domain`>`, the same on
//! every attempt and every process, so a copy that went twice (a reply lost, then a send after
//! the lease) carries one id that the recipient's client and an operator's search can match.
//! A message with its own `Message-ID` keeps it. The receipt's id is the `Message-ID` without
//! its angle brackets. Tracking flags and metadata are not sent: SMTP has neither. A
//! [`RawMessage`](crate::RawMessage) goes as its bytes to its envelope; its receipt's id is the
//! server's reply to the message (`2.0.0 Ok: queued as …`).
//!
//! # Errors
//!
//! | what happened | outcome | code |
//! |---|---|---|
//! | connect, TLS, EHLO or a command before the body failed without a reply (refused, reset, closed) | retryable: not sent | [`provider.connect`](codes::CONNECT) |
//! | a step before the body overran [`step_timeout`](SmtpTransport::step_timeout) | retryable: not sent | [`provider.not_sent`](codes::NOT_SENT) |
//! | a reply 421 (the server closes), at any step | retryable: not sent | [`provider.unavailable`](codes::UNAVAILABLE) |
//! | another 4xx reply (greylisting `451`, a full queue `452`), at any step | retryable: not sent | [`provider.deferred`](codes::DEFERRED) |
//! | a 5xx reply whose enhanced code is x.5.x (syntax), x.6.x (content), x.3.4 (too big), x.1.3 or x.1.7 (address syntax); without one, 500-504 and 555 | validation: not sent | [`provider.validation_error`](codes::VALIDATION_ERROR) |
//! | any other 5xx reply (`550 5.1.1` unknown user, `5.7.1` policy, `554`) | permanent: not sent | [`provider.rejected`](codes::REJECTED) |
//! | the client cannot send it to this server (no `STARTTLS` offered, no common `AUTH`, 8-bit content without `8BITMIME`) | permanent or validation: not sent | [`provider.rejected`](codes::REJECTED), [`provider.invalid_request`](codes::INVALID_REQUEST) |
//! | the connection failed while the body or its final `.` was written, or before the reply to it | unknown delivery: the key is kept | [`provider.connection_lost`](codes::CONNECTION_LOST) |
//! | the reply to the message overran the step timeout | unknown delivery | [`provider.timeout`](codes::TIMEOUT) |
//!
//! A reply to the final `.` is the server's decision about the message: a 4xx or 5xx there
//! means it did not take it, and frees the key as before `DATA`. lettre writes the body and the
//! final `.` in one call, so a connection lost while the body is written is judged as one
//! lost after the `.`: of unknown delivery, the safe side (a server that never saw the `.`
//! took nothing, but the client cannot know the `.` was not written). Error texts hold the
//! server's reply (at most 300 characters), never the message.
//!
//! For batches, [`PerMessage`](crate::batch::PerMessage) sends a batch's messages one session
//! each.

mod reply;
mod transport;

#[allow(unused_imports)]
use crate::outcome::codes;
pub use transport::{DEFAULT_STEP_TIMEOUT, Encryption, ResponseFuture, SMTP, SmtpTransport};
