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
//! | a pending record, same fingerprint | [`SendError`] `idempotency.in_flight` (delivery unknown); with [`wait_for_in_flight`](IdempotencyLayerBuilder::wait_for_in_flight), the first send's outcome once it is kept | no |
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
//!   ends. A drop never frees a key;
//! - the inner service runs longer than the [maximum hold](IdempotencyLayerBuilder::max_hold)
//!   (15 minutes): it is given up, and the key kept as `idempotency.max_hold` (unknown
//!   delivery).
//!
//! While the send runs, the layer renews its key's lease every third of the lease
//! ([`Store::extend`]), so a send may take longer than its lease.
//!
//! When the store fails to reserve (an error, a timeout, a corrupt record) that message alone
//! fails with `idempotency.store_failed`, retryable, and is not sent. When it fails to keep
//! the outcome (or free the key) after the send, the caller still gets the real outcome, and
//! the settlement is retried on transient errors, with jittered backoff and in the
//! background once the caller has waited the
//! [settle timeout](IdempotencyLayerBuilder::settle_timeout), until it lands or the lease is
//! about to end (its lease renewed meanwhile). Only a settlement that finally gives up emits
//! a `tracing` warning with code `IDEMPOTENCY_STORE_FAILED`, saying when the key will be
//! free again (and [`Stats::store_failed_after_send`](layer::Stats) counts it).
//!
//! Every answer the layer makes itself except `key_reused` is of
//! [`Category::Unknown`]; [`counts_against_provider`] is the predicate that keeps them out of
//! a circuit breaker's failure count.
//!
//! # The guarantee, honestly
//!
//! This is **at-least-once delivery with deduplication, not exactly-once.** Without a crash,
//! a key reaches the provider once: the layer renews a key's lease while its send runs and
//! while its settlement is retried, and retries the settlement on transient store errors
//! until it lands. A crash after the provider took the message but before its receipt was
//! kept lets the message go again once the lease has passed (default 2 minutes), unless the
//! provider also deduplicates on the `Idempotency-Key` you forward to it.
//!
//! Two options close that gap, and give a send of unknown delivery a way back:
//! [`provider_window`](IdempotencyLayerBuilder::provider_window) re-sends under the same key
//! while the provider still deduplicates on it (a repeat of a kept unknown outcome, or a
//! takeover from a crashed holder, whose first attempt by the store's clock is inside the
//! window), and [`verify_takeovers`](IdempotencyLayerBuilder::verify_takeovers) asks your
//! verification service before sending a key taken over from a crashed holder. With both,
//! and a layer window no longer than the provider's, the model check finds no interleaving,
//! crashes included, in which a key makes two provider messages.
//!
//! That holds under one assumption: **store outages are shorter than the renewal window**,
//! the two thirds of the lease left when a renewal is due (80 s with the default lease). A
//! store unreachable for longer while a send runs lets the lease pass; a repeat may then
//! reserve the key and send again, and the layer says so ([`Stats::renewal_lost`] and a
//! warning). `tests/protocol_model.rs` checks the protocol exhaustively for small bounds:
//! every interleaving of reserves, sends, settlements, renewals, store faults, lease expiry
//! and crashes keeps the guarantee, and it breaks as soon as settlement retries or renewal
//! are switched off, or the faults outlast the renewal window.
//!
//! **Why a 2-minute lease.** Without renewal a lease would have to outlast a send with all
//! its retries, and a crashed process would hold its keys that long. Renewed every 40 s, a
//! 2-minute lease frees a crashed process's keys within two minutes, rides out the
//! store outages of a Redis or PostgreSQL failover (up to 80 s), and still outlasts the
//! default [`RetryPolicy`] (60 s) for a store that cannot renew (a third-party [`Store`]
//! without `extend`) or a layer built with [`renew(false)`](IdempotencyLayerBuilder::renew).
//! Choose a longer lease if your store's outages can last longer.
//!
//! [`Stats::renewal_lost`]: layer::Stats::renewal_lost
//!
//! # Decisions
//!
//! - **Namespace default.** Keys are stored as `namespace:key`. The default namespace is the
//!   constant `"default"`, not a name derived from the wrapped service's type: Rust type
//!   names are not stable across compiler releases or refactors, and a namespace that changes
//!   on deploy would let every live key send again. Set one per provider or tenant.
//! - **Keys that hold no personal data, by choice.** Keys often embed an address;
//!   [`KeyForm::Hashed`](layer::KeyForm::Hashed) stores `namespace:h1:<hex of
//!   SHA-256(namespace:key)>` instead of the key, in every store operation. It is opt-in:
//!   processes storing one namespace in different forms do not see each other's records, so
//!   a default that changed between releases would send duplicates during a rolling deploy.
//!   Switch a namespace with every process at once (see [`KeyForm`](layer::KeyForm)). An
//!   operator finds the record of a key with [`StoredKeys`](layer::StoredKeys) or
//!   [`IdempotencyLayer::stored_key_for`]. The key rules (1 to 256 bytes, no control
//!   characters) are the same in both forms.
//! - **Logs.** Events carry the namespace and a 12-hex-digit hash of the stored key, never the key
//!   (keys often embed an address) and never message content. Stores keep the key,
//!   fingerprint, state, token and outcome only, and a kept receipt's accepted recipients are
//!   their positions in the message's recipient list: no address reaches a store. A replay
//!   restores them from the repeated message, whose fingerprint proves it has the same ones.
//! - **Readiness.** `poll_ready` is the inner service's; a replay still waits for the inner
//!   service to be ready.
//! - **The store is chosen, never defaulted.** [`IdempotencyLayerBuilder::build`] exists only
//!   once a store is given (the builder's type says so): a store local to one process
//!   deduplicates nothing across processes. [`IdempotencyLayer::in_memory`] is the explicit
//!   one-process choice.
//! - **Settlements the caller does not wait for.** The caller waits for its key to be
//!   settled at most the settle timeout (5 s, like the reserve timeout), then gets the
//!   provider's answer; the settlement goes on in a task of its own, so a repeat right after
//!   a store blip may still see the key pending (`idempotency.in_flight`) for a moment, never
//!   free. Retries use full-jitter backoff from 10 ms to 1 s, so senders that failed together
//!   do not retry together.
//! - **A repeat waits by reserving.** [`wait_for_in_flight`](IdempotencyLayerBuilder::wait_for_in_flight)
//!   polls with `reserve`, not a read the [`Store`] trait does not have: if the first send
//!   freed the key (its message certainly did not go) the waiting repeat takes it and sends,
//!   which is what it would have done a moment later. Waiting is off by default, as a caller
//!   that retries on `idempotency.in_flight` already waits its own way.
//! - **A maximum hold, not a maximum send time.** Renewal would hold the key of an inner
//!   future that never ends for ever; past [`max_hold`](IdempotencyLayerBuilder::max_hold)
//!   (15 minutes, far above the default retry budget) the future is dropped and the key kept
//!   as of unknown delivery. It is a backstop: bound sends with a timeout inside the stack.
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
//! - [`outcome`]: [`Receipt`], [`SendError`], [`Category`], and every error code of the crate
//!   in one list, [`outcome::codes`].
//! - [`classify`]: the one judge of whether an error sent the message, and
//!   [`counts_against_provider`].
//! - [`store`]: the [`Store`] trait and its records, [`admin`](store::admin) for settling
//!   keys by hand, one module per store ([`store::memory`], and `store::redis`,
//!   `store::postgres`, `store::sqlite`, `store::mysql` behind their features), and the
//!   conformance suite behind `test-util`. Every store is at the crate root too:
//!   [`MemoryStore`], `RedisStore`, `PostgresStore`, `SqliteStore`, `MySqlStore`.
//! - [`layer`]: [`IdempotencyLayer`], its builder, the [`Idempotency`] service and its stats,
//!   and [`IdempotentRequest`](layer::IdempotentRequest) for your own request types.
//! - [`batch`]: [`Batch`](batch::Batch) and its outcomes, for providers that take batches.
//! - [`retry`]: [`RetryPolicy`], which retries only what certainly did not go.
//! - [`verify`]: [`Verify`](verify::Verify), the question "did the provider take this
//!   message?" a service of yours answers ([`Verified`](verify::Verified)), for the
//!   reconciler and for takeovers.
//! - [`reconcile`]: the [`Reconciler`](reconcile::Reconciler), which asks the provider what
//!   became of the messages of unknown delivery and settles their keys.
//! - `http` (feature `http`): `HttpTransport`, a provider client over any HTTP client, and
//!   one module per provider with its codec (`http::resend`, `http::postmark`,
//!   `http::twilio`).
//! - `outbox` (feature `postgres` or `mysql`): the transactional outbox, messages committed
//!   with your business rows and sent by a worker.
//!
//! # Features
//!
//! | feature | adds | to hand in your own driver's types, add |
//! |---|---|---|
//! | `redis` | `RedisStore` | `redis = "1"` (`RedisStore::new`) |
//! | `redis-cluster` | `RedisStore` over Redis Cluster | `redis = "1"` with `cluster-async` (`RedisStore::from_cluster`) |
//! | `redis-sentinel` | `RedisStore` on the primary Redis Sentinel names, followed through failovers | `redis = "1"` with `sentinel` (`RedisStore::from_sentinel_client`) |
//! | `postgres` | `PostgresStore`, the `outbox` | `deadpool-postgres = "0.14"`, `tokio-postgres = "0.7"` (`PostgresStore::new`, `claim_in`, `Outbox::new`, `enqueue`) |
//! | `sqlite` | `SqliteStore` | `rusqlite = "0.40"` (`SqliteStore::claim_in`) |
//! | `mysql` | `MySqlStore` (MySQL 8, MariaDB 10.6+), the `outbox` | `mysql_async = "0.37"` (`MySqlStore::new`, `claim_in`, `Outbox::mysql`, `enqueue_mysql`); with `sqlx` too, `sqlx = "0.8"` with `mysql` (`claim_in_sqlx`, `enqueue_sqlx_mysql`) |
//! | `http` | `HttpTransport` and the provider codecs | `http = "1"`, `bytes = "1"` (your client is a `Service<http::Request<Bytes>>`) |
//! | `reqwest` | the default classifier reads `reqwest::Error` | `reqwest = "0.13"` |
//! | `test-util` | the store conformance suite, `store::conformance` | |
//!
//! With no feature: the layer, [`MemoryStore`], [`RetryPolicy`], batches and reconciliation;
//! `store::Token` converts to and from `uuid::Uuid` (`uuid = "1"`). The crate re-exports no
//! dependency. Every store and the outbox also open from a URL or a
//! path (`connect`, `open`), which needs none of the drivers in your dependencies.
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

#[cfg(any(feature = "http", feature = "postgres", feature = "mysql"))]
mod base64;
pub mod batch;
pub mod classify;
pub mod fingerprint;
mod hex;
#[cfg(feature = "http")]
pub mod http;
pub mod layer;
pub mod message;
#[cfg(any(feature = "ses", feature = "smtp"))]
mod mime;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod outbox;
pub mod outcome;
pub mod reconcile;
pub mod retry;
#[cfg(feature = "smtp")]
pub mod smtp;
pub mod store;
pub mod verify;

pub use classify::counts_against_provider;
pub use fingerprint::{Fingerprint, Fingerprinted};
#[cfg(feature = "http")]
pub use http::HttpTransport;
pub use layer::{Idempotency, IdempotencyLayer, IdempotencyLayerBuilder};
pub use message::{Attachment, Envelope, IdempotencyKey, Message, MessageBuilder, RawMessage};
pub use outcome::{BoxError, Category, Outcome, Receipt, SendError};
pub use retry::RetryPolicy;
pub use store::memory::MemoryStore;
#[cfg(feature = "mysql")]
pub use store::mysql::MySqlStore;
#[cfg(feature = "postgres")]
pub use store::postgres::PostgresStore;
#[cfg(feature = "redis")]
pub use store::redis::RedisStore;
#[cfg(feature = "sqlite")]
pub use store::sqlite::SqliteStore;
pub use store::{Store, StoreError};

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
