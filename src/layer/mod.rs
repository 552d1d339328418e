//! The middleware: [`IdempotencyLayer`], the [`Idempotency`] service and its future.
//!
//! # Layout
//!
//! The files of this module import one way: each uses only files above it in this list.
//!
//! | file | holds | imports from the layer |
//! |---|---|---|
//! | `stats.rs` | [`Stats`] and the counters behind it | nothing |
//! | `future.rs` | [`ResponseFuture`] | nothing |
//! | `config.rs` | [`IdempotencyLayerBuilder`], [`ConfigError`], [`KeyForm`], the defaults, the shared `Config` | stats |
//! | `request.rs` | [`IdempotentRequest`], for `Message` and `RawMessage` | nothing |
//! | `key.rs` | key derivation: the store key in the layer's [`KeyForm`] ([`StoredKeys`]), `key_hash` for logs | config, request, stats |
//! | `reserve.rs` | reservations bounded by the reserve timeout, freed in the background when abandoned; `spawn_detached` | config |
//! | `renew.rs` | holding the reserved keys while a send runs: the lease's end by the local clock, renewal every third of the lease, the maximum hold; the backoff and bounded store call settlements share | config, key, stats |
//! | `wait.rs` | a repeat waiting for the in-flight send of the same message (opt-in), polling with reserves | config, renew, reserve, stats |
//! | `repeat.rs` | answering a request whose key the store holds (replay, in flight, key reused) | config, request, key, stats |
//! | `settle.rs` | keeping or freeing the reserved keys once a send is over, also after a drop; retried on transient store errors in the background, renewing the lease meanwhile | config, key, renew, reserve, stats |
//! | `resend.rs` | re-sending inside the provider's window: taking back a key kept with an outcome of unknown delivery ([`provider_window`](IdempotencyLayerBuilder::provider_window)) | config, key, renew, reserve, stats, wait |
//! | `takeover.rs` | a send that took its key over from a holder that never settled it: re-send inside the window, or ask the verification service first ([`verify_takeovers`](IdempotencyLayerBuilder::verify_takeovers)) | config, key, renew, resend, settle, stats |
//! | `service.rs` | [`Idempotency`] and the single send flow | stats, future, config, request, key, renew, reserve, wait, repeat, settle, resend, takeover |
//! | `batch.rs` | the batch send flow: `Service<Batch<R>>` for [`Idempotency`] | stats, config, request, key, renew, reserve, wait, repeat, settle, service |
//! | `layer.rs` | [`IdempotencyLayer`] (and the builder's `build`, which makes it; its claims) | config, key, request, service, stats |
//!
//! The crate-level modules it uses import nothing from it: [`crate::classify`] judges
//! errors, [`crate::batch`] holds the public batch types, [`crate::store`] keeps the keys,
//! [`crate::verify`] holds the question the layer asks before sending a key taken over.
//! [`crate::reconcile`] sits above the layer: it reads stored keys through [`StoredKeys`] and
//! logs them with the layer's `key_hash`.

mod batch;
mod config;
mod error;
mod future;
mod key;
#[allow(clippy::module_inception)]
mod layer;
mod renew;
mod repeat;
mod request;
mod resend;
mod reserve;
mod service;
mod settle;
mod stats;
mod takeover;
mod wait;

pub use config::{
    DEFAULT_LEASE, DEFAULT_MAX_HOLD, DEFAULT_NAMESPACE, DEFAULT_RESERVE_TIMEOUT,
    DEFAULT_SETTLE_TIMEOUT, DEFAULT_TTL, DEFAULT_VERIFY_TIMEOUT, IdempotencyLayerBuilder, KeyForm,
    NoStore, WithStore,
};
pub use error::ConfigError;
pub use future::ResponseFuture;
pub use key::StoredKeys;
pub(crate) use key::key_hash;
pub use layer::IdempotencyLayer;
pub use request::IdempotentRequest;
pub use service::Idempotency;
pub use stats::Stats;
