//! [`IdempotencyLayer`]: the tower `Layer`, last in the layer's order.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::config::{Config, IdempotencyLayerBuilder, KeyForm, NoStore, WithStore};
use super::error::ConfigError;
use super::key::{StoredKeys, derive_key};
use super::request::IdempotentRequest;
use super::service::Idempotency;
use super::stats::Stats;
use crate::classify::Classifier;
use crate::message::KeyError;
use crate::outcome::SendError;
use crate::store::memory::MemoryStore;
use crate::store::{Claim, Store};

/// A tower [`Layer`] that sends each keyed message once: it reserves the message's
/// idempotency key in a [`Store`] before the inner service is called, answers repeats from the
/// store, and keeps or frees the key by what the send did.
///
/// Put it outermost in a `ServiceBuilder`, outside retry, breaker, concurrency limit and
/// timeout, so one reservation covers every attempt. See the [crate docs](crate) for the
/// contract and [`IdempotencyLayerBuilder`] for every option.
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_idempotency::{IdempotencyLayer, MemoryStore, Message, Receipt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use tower::{Service, ServiceExt};
/// let provider = tower::service_fn(|m: Message| async move {
///     Ok::<_, tower_idempotency::BoxError>(Receipt::new(format!("id-{}", m.to()[0]), "fake"))
/// });
/// let layer = IdempotencyLayer::builder()
///     .store(MemoryStore::new())
///     .namespace("welcome-emails")
///     .ttl(Duration::from_secs(3600))
///     .build()?;
/// let mut service = ServiceBuilder::new().layer(layer).service(provider);
///
/// let message = Message::builder()
///     .from("shop@example.com").to("user@example.com").text("Welcome aboard.")
///     .idempotency_key("welcome:user-42")
///     .build()?;
/// let first = service.ready().await?.call(message.clone()).await?;
/// let again = service.ready().await?.call(message).await?;
/// assert_eq!(first.id, again.id);
/// assert!(again.replayed);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

impl IdempotencyLayer {
    /// A layer over `store` with every other option at its default.
    pub fn new(store: impl Store) -> Self {
        Self::from_config(Config::new(Arc::new(store)))
    }

    /// A layer over a fresh [`MemoryStore`] with every option at its default: the explicit
    /// choice of deduplicating within this process only. Clones of the layer share the store.
    pub fn in_memory() -> Self {
        Self::new(MemoryStore::new())
    }

    /// Starts a builder, for options that may be invalid. The store is required: the
    /// builder has no [`build`](IdempotencyLayerBuilder::build) until
    /// [`store`](IdempotencyLayerBuilder::store) is called.
    pub fn builder() -> IdempotencyLayerBuilder<NoStore> {
        IdempotencyLayerBuilder::default()
    }

    fn from_config(config: Config) -> Self {
        Self {
            config: Arc::new(config),
        }
    }

    /// What the layer (and every service it made) has done so far.
    pub fn stats(&self) -> Stats {
        self.config.counters.snapshot()
    }

    /// The namespace prefixed to every key in the store.
    pub fn namespace(&self) -> &str {
        &self.config.namespace
    }

    /// How the layer writes keys into the store ([`key_form`](IdempotencyLayerBuilder::key_form)).
    pub fn key_form(&self) -> KeyForm {
        self.config.key_form
    }

    /// The stored form of this layer's keys (its namespace and [`KeyForm`]), for tools that
    /// find records by key without a request.
    pub fn stored_keys(&self) -> StoredKeys {
        StoredKeys::checked(self.config.namespace.clone(), self.config.key_form)
    }

    /// The key `key` is stored under by this layer: `namespace:key`, or
    /// `namespace:h1:<hex digest>` with [`KeyForm::Hashed`]. An operator who has a key (from
    /// a provider's dashboard, say) finds its record under this key in the store.
    ///
    /// `key` is the key as the layer sees it: the message's own, or what the layer's
    /// [key function](IdempotencyLayerBuilder::key_for) derives.
    ///
    /// # Errors
    /// [`KeyError`] for a key the layer refuses; the layer never stores one.
    pub fn stored_key_for(&self, key: &str) -> Result<String, KeyError> {
        self.stored_keys().of(key)
    }

    /// The key this layer stores `request` under, after the key function and in the layer's
    /// [`KeyForm`]. `Ok(None)` for a request without a key, which the layer sends without
    /// touching the store.
    ///
    /// # Errors
    /// The layer's `idempotency.invalid_key` error for a key the rules refuse, as a send
    /// would answer.
    pub fn store_key<R: IdempotentRequest>(
        &self,
        request: &R,
    ) -> Result<Option<String>, SendError> {
        match derive_key(&self.config, request) {
            None => Ok(None),
            Some(Err(error)) => Err(SendError::invalid_key(error)),
            Some(Ok(key)) => Ok(Some(key.as_ref().to_owned())),
        }
    }

    /// The classifier the layer judges inner errors with
    /// ([`classify`](IdempotencyLayerBuilder::classify)): give it to
    /// [`RetryPolicy::classifier`](crate::RetryPolicy::classifier) so the retry policy retries
    /// exactly what the layer frees the key of.
    pub fn classifier(&self) -> Classifier {
        self.config.classifier.clone()
    }
}

// `build` lives here, next to the type it makes, so that the builder's module imports nothing
// from the rest of the layer.
impl IdempotencyLayerBuilder<WithStore> {
    /// Checks the options and builds the layer. Only a builder given a
    /// [`store`](Self::store) has it (use [`IdempotencyLayer::in_memory`] for one process).
    ///
    /// # Errors
    /// [`ConfigError`] for an invalid namespace, a zero duration, or a ttl shorter than the
    /// lease.
    pub fn build(self) -> Result<IdempotencyLayer, ConfigError> {
        self.into_config().map(IdempotencyLayer::from_config)
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::new(inner, Arc::clone(&self.config))
    }
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

// Claims: what a store writes in the caller's own transaction (claim-then-send), so the
// message's key is held from the moment the business rows commit.
impl IdempotencyLayer {
    /// The claim this layer would hold for `request`: its key as stored (after the key
    /// function, in the layer's [`KeyForm`]: see [`store_key`](Self::store_key)), its
    /// fingerprint and the layer's ttl. `Ok(None)` for a
    /// request without a key.
    ///
    /// Write it in your own transaction with a store that can, such as
    /// `PostgresStore::claim_in` (feature `postgres`) or `SqliteStore::claim_in` (feature
    /// `sqlite`); the layer's send of the same request then takes the claim as its
    /// own.
    ///
    /// # Errors
    /// The layer's `idempotency.invalid_key` error for a key the rules refuse.
    pub fn claim<R: IdempotentRequest>(&self, request: &R) -> Result<Option<Claim>, SendError> {
        match derive_key(&self.config, request) {
            None => Ok(None),
            Some(Err(error)) => Err(SendError::invalid_key(error)),
            Some(Ok(key)) => Ok(Some(Claim::new(
                key.as_ref(),
                request.fingerprint(),
                self.config.ttl,
            ))),
        }
    }
}
