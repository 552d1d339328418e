//! Reconciliation: ask the provider what became of the messages whose delivery is unknown,
//! and settle their keys.
//!
//! A send that timed out after its request left, or that was dropped mid-call, keeps its key
//! with an outcome of unknown delivery: every repeat for the ttl is answered with that error,
//! so the message never goes twice, but never goes at all if it did not go the first time.
//! A [`Reconciler`] walks those keys (and the pending keys whose lease passed, where the
//! store lists them: in memory and on PostgreSQL, not on Redis) through [`StoreAdmin::list`](crate::store::admin::StoreAdmin::list),
//! asks a verification service the user supplies, "did you take this message?", about each,
//! and settles what it learns:
//!
//! | the provider says | the key | the next send of the message |
//! |---|---|---|
//! | [`Delivered`](crate::verify::Verified::Delivered) with its receipt | kept done with that receipt | replayed with the provider's id, never sent |
//! | [`NotSent`](crate::verify::Verified::NotSent) | freed | sent, once |
//! | [`Unknown`](crate::verify::Verified::Unknown), or the service fails | left as it is | the stored error, replayed |
//!
//! So a message the provider already took never goes out twice, and one it never took is no
//! longer blocked for the whole ttl. A key a live send holds is never touched.
//!
//! The same service can check a send before it goes: given to
//! [`IdempotencyLayerBuilder::verify_takeovers`](crate::IdempotencyLayerBuilder::verify_takeovers),
//! it is asked about a key a send takes over from a crashed holder, before that send.
//!
//! The verification service is a tower [`Service<Verify>`](tower_service::Service)
//! answering [`Verified`](crate::verify::Verified), both in [`verify`](crate::verify) as the
//! layer asks them too; see [`Verify`](crate::verify::Verify) for what it is told, and for
//! what a service must do when the layer stores hashed keys. Its `poll_ready` is respected,
//! so a rate limit or a concurrency limit from tower bounds the questions a pass asks.
//!
//! Each pass does bounded work ([`Reconciler::max_keys_per_pass`]) and resumes where the last
//! one stopped. Call [`Reconciler::run_once`] on a timer of your own, or spawn
//! [`Reconciler::run`]. Every pass emits a `tracing` event (target
//! `tower_idempotency::reconcile`) with its [`ReconcileReport`], and each settled key one
//! with the key's hash (12 hex digits of its SHA-256), never the key itself;
//! [`Reconciler::counters`] keeps the totals.
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_idempotency::reconcile::Reconciler;
//! use tower_idempotency::verify::{Verified, Verify};
//! use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message, Receipt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! // A provider that takes every message (keeping what it took, by idempotency key) and
//! // then answers too late: the client's timeout leaves the delivery unknown.
//! let accepted: Arc<Mutex<HashMap<String, String>>> = Arc::default();
//! let taken = accepted.clone();
//! let provider = tower::service_fn(move |message: Message| {
//!     let taken = taken.clone();
//!     async move {
//!         let key = message.idempotency_key().map(|k| k.as_str().to_owned()).unwrap_or_default();
//!         taken.lock().unwrap().insert(key, "msg_81".to_owned());
//!         tokio::time::sleep(Duration::from_secs(60)).await;
//!         Ok::<_, BoxError>(Receipt::new("msg_81", "fake"))
//!     }
//! });
//! let store = MemoryStore::new();
//! let layer = IdempotencyLayer::builder().store(store.clone()).namespace("alerts").build()?;
//! let keys = layer.stored_keys();
//! let service = ServiceBuilder::new().layer(layer).timeout(Duration::from_secs(1)).service(provider);
//!
//! let alert = Message::builder()
//!     .from("orders@marketplace.example")
//!     .to("seller@example.com")
//!     .subject("New order")
//!     .text("Sold.")
//!     .idempotency_key("order.created:ord_1:email")
//!     .build()?;
//! let timed_out = service.clone().oneshot(alert.clone()).await.unwrap_err();
//! assert!(timed_out.delivery_unknown());
//!
//! // The verification service asks the provider about the raw key.
//! let verify = tower::service_fn(move |question: Verify| {
//!     let found = question.raw_key.as_ref().and_then(|k| accepted.lock().unwrap().get(k).cloned());
//!     async move {
//!         Ok::<_, BoxError>(match found {
//!             Some(id) => Verified::Delivered(Receipt::new(id, "fake")),
//!             None => Verified::NotSent,
//!         })
//!     }
//! });
//! let mut reconciler = Reconciler::new(store, verify).stored_keys(keys);
//! let report = reconciler.run_once().await;
//! assert_eq!(report.delivered, 1);
//!
//! // The repeat is answered with the provider's id, and not sent again.
//! let again = service.oneshot(alert).await?;
//! assert_eq!(again.id, "msg_81");
//! assert!(again.replayed);
//! # Ok(()) }
//! ```

mod reconciler;
mod report;

pub use reconciler::{DEFAULT_DELIVERED_TTL, DEFAULT_MAX_KEYS_PER_PASS, Reconciler};
pub use report::{ReconcileCounters, ReconcileReport};

/// The `tracing` target of the reconciler's events.
const TARGET: &str = "tower_idempotency::reconcile";

// The hash that stands for a stored key in logs is the layer's, so one key has one hash in
// every event.
use crate::layer::key_hash;
