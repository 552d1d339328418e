//! [`IdempotencyLayer`], its builder and its options.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::service::Idempotency;
use super::stats::{Counters, Stats};
use crate::message::{Message, RawMessage};
use crate::outcome::Category;
use crate::store::{MemoryStore, Store};

/// The default lease: how long a reservation holds a key while its send runs.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10 * 60);
/// The default ttl: how long the outcome of a send is kept under its key.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The default bound on a reservation's round trip to the store.
pub const DEFAULT_RESERVE_TIMEOUT: Duration = Duration::from_secs(5);
/// The default namespace.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Extracts the idempotency key of a request; `None` sends it without one.
pub(crate) type KeyFn<R> = Arc<dyn Fn(&R) -> Option<String> + Send + Sync>;

/// Judges an inner error that is neither a [`SendError`](crate::SendError) nor a timeout.
pub(crate) type ClassifyFn = Arc<dyn Fn(&(dyn Error + 'static)) -> Category + Send + Sync>;

pub(crate) struct Config {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) lease: Duration,
    pub(crate) ttl: Duration,
    pub(crate) reserve_timeout: Duration,
    pub(crate) namespace: Arc<str>,
    pub(crate) key: Option<KeyFn<Message>>,
    pub(crate) raw_key: Option<KeyFn<RawMessage>>,
    pub(crate) classify: ClassifyFn,
    pub(crate) counters: Counters,
}

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

    /// A layer over a fresh [`MemoryStore`] with every option at its default. Clones of the
    /// layer share the store.
    pub fn in_memory() -> Self {
        Self::new(MemoryStore::new())
    }

    /// Starts a builder, for options that may be invalid.
    pub fn builder() -> IdempotencyLayerBuilder {
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
}

impl Default for IdempotencyLayer {
    fn default() -> Self {
        Self::in_memory()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::from_parts(inner, Arc::clone(&self.config))
    }
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("namespace", &self.namespace)
            .field("lease", &self.lease)
            .field("ttl", &self.ttl)
            .field("reserve_timeout", &self.reserve_timeout)
            .field("custom_key", &self.key.is_some())
            .field("raw_key", &self.raw_key.is_some())
            .finish_non_exhaustive()
    }
}

impl Config {
    fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            lease: DEFAULT_LEASE,
            ttl: DEFAULT_TTL,
            reserve_timeout: DEFAULT_RESERVE_TIMEOUT,
            namespace: Arc::from(DEFAULT_NAMESPACE),
            key: None,
            raw_key: None,
            classify: Arc::new(super::classify::default_classifier),
            counters: Counters::default(),
        }
    }
}

/// Why a layer could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The namespace is empty, longer than 64 bytes, or holds `:` or a control character.
    InvalidNamespace(String),
    /// A duration option is zero.
    ZeroDuration(&'static str),
    /// The ttl is shorter than the lease: a done record would expire before a pending one.
    TtlShorterThanLease,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidNamespace(ns) => write!(
                f,
                "invalid namespace {ns:?}: 1 to 64 bytes, no ':' and no control characters"
            ),
            Self::ZeroDuration(option) => write!(f, "the {option} must be longer than zero"),
            Self::TtlShorterThanLease => f.write_str("the ttl must be at least the lease"),
        }
    }
}

impl Error for ConfigError {}

/// Builds an [`IdempotencyLayer`]; [`build`](Self::build) checks the options.
///
/// | option | default |
/// |---|---|
/// | [`store`](Self::store) | a new [`MemoryStore`] |
/// | [`lease`](Self::lease) | [`DEFAULT_LEASE`] (10 minutes) |
/// | [`ttl`](Self::ttl) | [`DEFAULT_TTL`] (24 hours) |
/// | [`reserve_timeout`](Self::reserve_timeout) | [`DEFAULT_RESERVE_TIMEOUT`] (5 s) |
/// | [`namespace`](Self::namespace) | [`DEFAULT_NAMESPACE`] (`"default"`) |
/// | [`key`](Self::key) | the message's own [`idempotency_key`](Message::idempotency_key) |
/// | [`raw_key`](Self::raw_key) | none: raw messages are sent without deduplication |
/// | [`classify`](Self::classify) | see [`default_classifier`](super::default_classifier) |
#[must_use]
pub struct IdempotencyLayerBuilder {
    store: Option<Arc<dyn Store>>,
    lease: Duration,
    ttl: Duration,
    reserve_timeout: Duration,
    namespace: String,
    key: Option<KeyFn<Message>>,
    raw_key: Option<KeyFn<RawMessage>>,
    classify: Option<ClassifyFn>,
}

impl Default for IdempotencyLayerBuilder {
    fn default() -> Self {
        Self {
            store: None,
            lease: DEFAULT_LEASE,
            ttl: DEFAULT_TTL,
            reserve_timeout: DEFAULT_RESERVE_TIMEOUT,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            key: None,
            raw_key: None,
            classify: None,
        }
    }
}

impl fmt::Debug for IdempotencyLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayerBuilder")
            .field("namespace", &self.namespace)
            .field("lease", &self.lease)
            .field("ttl", &self.ttl)
            .field("reserve_timeout", &self.reserve_timeout)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayerBuilder {
    /// The store of keys. Layers given the same store (or clones of it) deduplicate together.
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// A store already shared as `Arc<dyn Store>`.
    pub fn shared_store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// How long a reservation holds a key while its send runs. It must be longer than a send
    /// takes with all its retries, or a second send may go while the first is still out; and
    /// it bounds how long a crashed process holds a key.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long the outcome of a send is kept under its key.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The bound on the store's answer to a reservation; past it the message fails with
    /// `idempotency.store_failed` and is not sent. Needs a tokio runtime to take effect.
    pub fn reserve_timeout(mut self, timeout: Duration) -> Self {
        self.reserve_timeout = timeout;
        self
    }

    /// The prefix of keys in the store (`namespace:key`). Layers with different namespaces
    /// never see each other's keys. Use one per provider or tenant. 1 to 64 bytes, no `:`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Derives the key of a [`Message`] instead of reading its own. `None` sends the message
    /// without deduplication. The key is checked like [`IdempotencyKey`](crate::IdempotencyKey);
    /// a bad one is refused with `idempotency.invalid_key` before the store is asked.
    pub fn key<F>(mut self, key: F) -> Self
    where
        F: Fn(&Message) -> Option<String> + Send + Sync + 'static,
    {
        self.key = Some(Arc::new(key));
        self
    }

    /// Gives a [`RawMessage`] a key; without it raw messages are sent without deduplication.
    pub fn raw_key<F>(mut self, key: F) -> Self
    where
        F: Fn(&RawMessage) -> Option<String> + Send + Sync + 'static,
    {
        self.raw_key = Some(Arc::new(key));
        self
    }

    /// Judges inner errors that are neither a [`SendError`](crate::SendError) nor a timeout:
    /// answer [`Category::Unknown`] to keep the key (the message may have gone), or a
    /// not-sent category to free it.
    pub fn classify<F>(mut self, classify: F) -> Self
    where
        F: Fn(&(dyn Error + 'static)) -> Category + Send + Sync + 'static,
    {
        self.classify = Some(Arc::new(classify));
        self
    }

    /// Checks the options and builds the layer.
    ///
    /// # Errors
    /// [`ConfigError`] for an invalid namespace, a zero duration, or a ttl shorter than the
    /// lease.
    pub fn build(self) -> Result<IdempotencyLayer, ConfigError> {
        validate_namespace(&self.namespace)?;
        for (name, d) in [
            ("lease", self.lease),
            ("ttl", self.ttl),
            ("reserve timeout", self.reserve_timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError::ZeroDuration(name));
            }
        }
        if self.ttl < self.lease {
            return Err(ConfigError::TtlShorterThanLease);
        }
        let mut config = Config::new(
            self.store
                .unwrap_or_else(|| Arc::new(MemoryStore::new()) as Arc<dyn Store>),
        );
        config.lease = self.lease;
        config.ttl = self.ttl;
        config.reserve_timeout = self.reserve_timeout;
        config.namespace = Arc::from(self.namespace);
        config.key = self.key;
        config.raw_key = self.raw_key;
        if let Some(classify) = self.classify {
            config.classify = classify;
        }
        Ok(IdempotencyLayer::from_config(config))
    }
}

fn validate_namespace(ns: &str) -> Result<(), ConfigError> {
    let ok = !ns.is_empty() && ns.len() <= 64 && !ns.chars().any(|c| c == ':' || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(ConfigError::InvalidNamespace(ns.to_owned()))
    }
}
