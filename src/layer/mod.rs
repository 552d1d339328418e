//! The middleware: [`IdempotencyLayer`], the [`Idempotency`] service and its future.

mod classify;
mod future;
#[allow(clippy::module_inception)]
mod layer;
mod service;
mod stats;

pub use classify::default_classifier;
pub use future::ResponseFuture;
pub use layer::{
    ConfigError, DEFAULT_LEASE, DEFAULT_NAMESPACE, DEFAULT_RESERVE_TIMEOUT, DEFAULT_TTL,
    IdempotencyLayer, IdempotencyLayerBuilder,
};
pub use service::{Idempotency, IdempotentRequest, LayerOptions};
pub use stats::Stats;
