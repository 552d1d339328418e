//! The middleware: [`IdempotencyLayer`], the [`Idempotency`] service and its future.

mod classify;
mod future;
#[allow(clippy::module_inception)]
mod layer;
mod service;
mod settle;
mod stats;

pub use classify::default_classifier;
pub use future::ResponseFuture;
pub use layer::{
    ConfigError, DEFAULT_LEASE, DEFAULT_NAMESPACE, DEFAULT_RESERVE_TIMEOUT, DEFAULT_TTL,
    IdempotencyLayer, IdempotencyLayerBuilder,
};
pub use service::{Idempotency, IdempotentRequest, LayerOptions};
pub use stats::Stats;

/// What the batch send shares with the single send.
pub(crate) mod internals {
    pub(crate) use super::classify::classify;
    pub(crate) use super::layer::Config;
    pub(crate) use super::service::{KeyOf, answer_held, key_hash, store_key};
    pub(crate) use super::settle::{Finish, Held, Settle, reserve_many};
    pub(crate) use super::stats::bump;
}
