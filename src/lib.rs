//! Send each email or SMS once per business event.
//!
//! `tower-idempotency` is a [tower] middleware, [`IdempotencyLayer`], that wraps any provider
//! client (a `Service<Message>`: a REST API over hyper or reqwest, an SMTP relay, a test
//! double) and, before the provider is called, reserves the message's idempotency key in a
//! [`Store`]. A job that runs twice, or a retry after a timeout, does not send twice.
//!
//! ```
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message, Receipt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! // Your provider client: any tower Service<Message, Response = Receipt>.
//! let provider = tower::service_fn(|message: Message| async move {
//!     Ok::<_, BoxError>(Receipt::new("msg_1", "my-provider"))
//! });
//!
//! let service = ServiceBuilder::new()
//!     // Outermost: one reservation covers every attempt below it.
//!     .layer(IdempotencyLayer::builder().store(MemoryStore::new()).namespace("alerts").build()?)
//!     // Retry, circuit breaker and concurrency limit go here.
//!     .timeout(Duration::from_secs(10)) // a timeout after the request left = delivery unknown
//!     .service(provider);
//!
//! let alert = Message::builder()
//!     .from("orders@marketplace.example")
//!     .to("seller@example.com")
//!     .subject("New order ord_20481")
//!     .text("Vintage Nikon FM2 just sold.")
//!     // Derive the key from the business event, never from the clock or a random id.
//!     .idempotency_key("order.created:ord_20481:email")
//!     .build()?;
//!
//! let first = service.clone().oneshot(alert.clone()).await?;
//! let again = service.clone().oneshot(alert).await?; // the job ran twice
//! assert_eq!(first.id, again.id);
//! assert!(again.replayed); // answered from the store; the provider was called once
//! # Ok(()) }
//! ```
//!
//! # The contract
//!
//! | found in the store under the key | answer | provider called? |
//! |---|---|---|
//! | nothing (or an expired record) | the key is reserved and the message sent | yes |
//! | a pending record, same fingerprint | [`SendError`] `idempotency.in_flight` (delivery unknown) | no |
//! | a done record, same fingerprint | the kept outcome, marked replayed | no |
//! | any record, another [fingerprint] | [`SendError`] `idempotency.key_reused` (validation) | no |
//! | no key on the message | sent as it is; the store is not touched | yes |
//!
//! After the provider answers:
//! - success: the key is kept done with the [`Receipt`] for the ttl (default 24 h);
//! - a failure that certainly did not send (retryable, permanent, validation): the key is
//!   freed, so a later attempt may send;
//! - a failure of unknown delivery (a timeout, an error the [classifier] cannot place): the
//!   key is kept with that outcome, as the message may have gone;
//! - the caller drops the send after the provider was called: the key is kept with an
//!   `idempotency.aborted` outcome, written by a task spawned on the current tokio runtime.
//!   Without a runtime, nothing can be written and the key stays pending until its lease
//!   ends. A drop never frees a key.
//!
//! When the store fails to reserve (an error, a timeout, a corrupt record) that message alone
//! fails with `idempotency.store_failed`, retryable, and is not sent. When it fails to keep
//! the outcome after a send went, the caller still gets the real outcome and a `tracing`
//! warning with code `IDEMPOTENCY_STORE_FAILED` is emitted (and
//! [`Stats::store_failed_after_send`](layer::Stats) counts it).
//!
//! Every answer the layer makes itself except `key_reused` is of
//! [`Category::Unknown`]; [`counts_against_provider`] is the predicate that keeps them out of
//! a circuit breaker's failure count.
//!
//! # The guarantee, honestly
//!
//! This is **at-least-once delivery with deduplication, not exactly-once.** The lease
//! (default 10 minutes) bounds how long a crashed process holds a key; it must be longer than
//! a send takes with all its retries. A crash after the provider took the message but before
//! its receipt was kept lets the message go again once the lease has passed, unless the
//! provider also deduplicates on the `Idempotency-Key` you forward to it.
//!
//! # Decisions
//!
//! - **Namespace default.** Keys are stored as `namespace:key`. The default namespace is the
//!   constant `"default"`, not a name derived from the wrapped service's type: Rust type
//!   names are not stable across compiler releases or refactors, and a namespace that changes
//!   on deploy would let every live key send again. Set one per provider or tenant.
//! - **Logs.** Events carry the namespace and a 12-hex-digit hash of the key, never the key
//!   (keys often embed an address) and never message content. Stores keep the key,
//!   fingerprint, state, token and outcome only, and a kept receipt's accepted recipients are
//!   their positions in the message's recipient list: no address reaches a store. A replay
//!   restores them from the repeated message, whose fingerprint proves it has the same ones.
//! - **Readiness.** `poll_ready` is the inner service's; a replay still waits for the inner
//!   service to be ready.
//! - **The store is chosen, never defaulted.** [`IdempotencyLayerBuilder::build`] without a
//!   store is [`ConfigError::MissingStore`](layer::ConfigError::MissingStore): a store local
//!   to one process deduplicates nothing across processes. [`IdempotencyLayer::in_memory`]
//!   is the explicit one-process choice.
//! - **One judge of "was it sent?".** The layer, [`RetryPolicy`], the HTTP transport and
//!   [`counts_against_provider`] read errors through [`classify`]: a [`SendError`] anywhere
//!   in the source chain, then a timeout, then the one [`Classifier`](classify::Classifier)
//!   hook.
//!
//! # Modules
//!
//! - [`message`]: [`Message`], [`RawMessage`], [`Envelope`], [`IdempotencyKey`].
//! - [`fingerprint`]: the versioned canonical encoding, its SHA-256 [`Fingerprint`], and the
//!   [`Encoder`](fingerprint::Encoder) for your own request types.
//! - [`outcome`]: [`Receipt`], [`SendError`], [`Category`], the codes.
//! - [`classify`]: the one judge of whether an error sent the message, and
//!   [`counts_against_provider`].
//! - [`store`]: the [`Store`] trait, [`MemoryStore`], the Redis and PostgreSQL stores behind
//!   the `redis` and `postgres` features, and the conformance suite behind `test-util`.
//! - [`layer`]: [`IdempotencyLayer`], its builder, the [`Idempotency`] service and its stats,
//!   and [`IdempotentRequest`](layer::IdempotentRequest) for your own request types.
//! - [`batch`]: [`Batch`](batch::Batch) and its outcomes, for providers that take batches.
//! - [`retry`]: [`RetryPolicy`], which retries only what certainly did not go.
//!
//! [tower]: https://docs.rs/tower
//! [fingerprint]: crate::fingerprint
//! [classifier]: classify::default_classifier
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(any(feature = "http", feature = "postgres"))]
mod base64;
pub mod batch;
pub mod classify;
pub mod fingerprint;
#[cfg(feature = "http")]
pub mod http;
pub mod layer;
pub mod message;
#[cfg(feature = "postgres")]
pub mod outbox;
pub mod outcome;
pub mod retry;
pub mod store;

pub use classify::counts_against_provider;
pub use fingerprint::{Fingerprint, Fingerprinted};
#[cfg(feature = "http")]
pub use http::HttpTransport;
pub use layer::{Idempotency, IdempotencyLayer, IdempotencyLayerBuilder};
pub use message::{Attachment, Envelope, IdempotencyKey, Message, MessageBuilder, RawMessage};
pub use outcome::{BoxError, Category, Outcome, Receipt, SendError};
pub use retry::RetryPolicy;
pub use store::{MemoryStore, Store, StoreError};

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
