//! The options of a layer: [`IdempotencyLayerBuilder`], what it checks ([`ConfigError`]) and
//! the [`Config`] every service of the layer shares.
//!
//! First in the layer's order: it imports nothing from the layer but the counters.

use std::any::{Any, TypeId};
use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::stats::Counters;
use crate::classify::Classifier;
use crate::message::{Message, RawMessage};
use crate::outcome::Category;
use crate::store::Store;

/// The default lease: how long a reservation holds a key while its send runs.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10 * 60);
/// The default ttl: how long the outcome of a send is kept under its key.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The default bound on a reservation's round trip to the store.
pub const DEFAULT_RESERVE_TIMEOUT: Duration = Duration::from_secs(5);
/// The default namespace.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Derives the idempotency key of a request; `None` sends it without one.
pub(crate) type KeyFn<R> = Arc<dyn Fn(&R) -> Option<String> + Send + Sync>;

/// The key functions set on the builder, one per request type.
///
/// A list, not a map: a layer has one or two, and a scan of that beats hashing a `TypeId` on
/// every send.
#[derive(Default)]
pub(crate) struct KeyFns(Vec<(TypeId, Arc<dyn Any + Send + Sync>)>);

impl KeyFns {
    fn insert<R: 'static>(&mut self, key: KeyFn<R>) {
        let id = TypeId::of::<R>();
        self.0.retain(|(other, _)| *other != id);
        self.0.push((id, Arc::new(key)));
    }

    /// The key function for requests of type `R`, if one was set.
    pub(crate) fn get<R: 'static>(&self) -> Option<&KeyFn<R>> {
        let id = TypeId::of::<R>();
        self.0
            .iter()
            .find(|(other, _)| *other == id)
            .and_then(|(_, key)| key.downcast_ref::<KeyFn<R>>())
    }

    fn has<R: 'static>(&self) -> bool {
        self.get::<R>().is_some()
    }
}

/// What every service of a layer shares: the checked options and the counters.
pub(crate) struct Config {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) lease: Duration,
    pub(crate) ttl: Duration,
    pub(crate) reserve_timeout: Duration,
    pub(crate) namespace: Arc<str>,
    pub(crate) keys: KeyFns,
    pub(crate) classifier: Classifier,
    pub(crate) counters: Counters,
}

impl Config {
    /// Every option at its default, over `store`.
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            lease: DEFAULT_LEASE,
            ttl: DEFAULT_TTL,
            reserve_timeout: DEFAULT_RESERVE_TIMEOUT,
            namespace: Arc::from(DEFAULT_NAMESPACE),
            keys: KeyFns::default(),
            classifier: Classifier::default(),
            counters: Counters::default(),
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("namespace", &self.namespace)
            .field("lease", &self.lease)
            .field("ttl", &self.ttl)
            .field("reserve_timeout", &self.reserve_timeout)
            .field("custom_key", &self.keys.has::<Message>())
            .field("raw_key", &self.keys.has::<RawMessage>())
            .field("key_functions", &self.keys.0.len())
            .finish_non_exhaustive()
    }
}

/// Why a layer could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// No store was given: the builder does not choose one, as a store local to the process
    /// deduplicates nothing across processes.
    MissingStore,
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
            Self::MissingStore => f.write_str(
                "no idempotency store: call `.store(..)` on the builder (a store shared by every \
                 process that sends), or use `IdempotencyLayer::in_memory()` for one process",
            ),
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

/// Builds an [`IdempotencyLayer`](super::IdempotencyLayer);
/// [`build`](Self::build) checks the options.
///
/// | option | default |
/// |---|---|
/// | [`store`](Self::store) | none: required, [`build`](Self::build) fails with [`ConfigError::MissingStore`] without it |
/// | [`lease`](Self::lease) | [`DEFAULT_LEASE`] (10 minutes) |
/// | [`ttl`](Self::ttl) | [`DEFAULT_TTL`] (24 hours) |
/// | [`reserve_timeout`](Self::reserve_timeout) | [`DEFAULT_RESERVE_TIMEOUT`] (5 s) |
/// | [`namespace`](Self::namespace) | [`DEFAULT_NAMESPACE`] (`"default"`) |
/// | [`key`](Self::key), [`raw_key`](Self::raw_key), [`key_for`](Self::key_for) | the request's own [`idempotency_key`](super::IdempotentRequest::idempotency_key) (a [`RawMessage`] has none) |
/// | [`classify`](Self::classify) | [`default_classifier`](crate::classify::default_classifier) |
///
/// For one process, [`IdempotencyLayer::in_memory`](super::IdempotencyLayer::in_memory) is
/// the explicit choice of a [`MemoryStore`](crate::MemoryStore).
#[must_use]
pub struct IdempotencyLayerBuilder {
    store: Option<Arc<dyn Store>>,
    lease: Duration,
    ttl: Duration,
    reserve_timeout: Duration,
    namespace: String,
    keys: KeyFns,
    classifier: Classifier,
}

impl Default for IdempotencyLayerBuilder {
    fn default() -> Self {
        Self {
            store: None,
            lease: DEFAULT_LEASE,
            ttl: DEFAULT_TTL,
            reserve_timeout: DEFAULT_RESERVE_TIMEOUT,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            keys: KeyFns::default(),
            classifier: Classifier::default(),
        }
    }
}

impl fmt::Debug for IdempotencyLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayerBuilder")
            .field("store", &self.store.is_some())
            .field("namespace", &self.namespace)
            .field("lease", &self.lease)
            .field("ttl", &self.ttl)
            .field("reserve_timeout", &self.reserve_timeout)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayerBuilder {
    /// The store of keys (required). Layers given the same store (or clones of it)
    /// deduplicate together; give every process that sends the same networked store.
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

    /// Derives the key of a [`Message`] instead of reading its own: shorthand for
    /// [`key_for::<Message>`](Self::key_for).
    pub fn key<F>(self, key: F) -> Self
    where
        F: Fn(&Message) -> Option<String> + Send + Sync + 'static,
    {
        self.key_for::<Message>(key)
    }

    /// Gives a [`RawMessage`] a key; without it raw messages are sent without deduplication.
    /// Shorthand for [`key_for::<RawMessage>`](Self::key_for).
    pub fn raw_key<F>(self, key: F) -> Self
    where
        F: Fn(&RawMessage) -> Option<String> + Send + Sync + 'static,
    {
        self.key_for::<RawMessage>(key)
    }

    /// Derives the key of requests of type `R` instead of asking the request
    /// ([`IdempotentRequest::idempotency_key`](super::IdempotentRequest::idempotency_key)).
    /// `None` sends the request without deduplication. The key is checked like
    /// [`IdempotencyKey`](crate::IdempotencyKey); a bad one is refused with
    /// `idempotency.invalid_key` before the store is asked. A second function for the same
    /// type replaces the first.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore, Message};
    ///
    /// // Keyed by the first recipient and the subject, whatever key the message carries.
    /// let layer = IdempotencyLayer::builder()
    ///     .store(MemoryStore::new())
    ///     .key_for::<Message>(|m| Some(format!("{}:{}", m.to()[0], m.subject()?)))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), tower_idempotency::layer::ConfigError>(())
    /// ```
    pub fn key_for<R: 'static>(
        mut self,
        key: impl Fn(&R) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.keys.insert::<R>(Arc::new(key));
        self
    }

    /// Judges inner errors that are neither a [`SendError`](crate::SendError) nor a timeout:
    /// answer [`Category::Unknown`] to keep the key (the message may have gone), or a
    /// not-sent category to free it. See [`crate::classify`]; give the same function to the
    /// retry policy through [`IdempotencyLayer::classifier`](super::IdempotencyLayer::classifier).
    pub fn classify<F>(self, classify: F) -> Self
    where
        F: Fn(&(dyn Error + 'static)) -> Category + Send + Sync + 'static,
    {
        self.classifier(Classifier::new(classify))
    }

    /// [`classify`](Self::classify), with a [`Classifier`] already made.
    pub fn classifier(mut self, classifier: Classifier) -> Self {
        self.classifier = classifier;
        self
    }

    /// Checks the options: what [`build`](Self::build) does before it makes the layer.
    pub(crate) fn into_config(self) -> Result<Config, ConfigError> {
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
        let store = self.store.ok_or(ConfigError::MissingStore)?;
        Ok(Config {
            lease: self.lease,
            ttl: self.ttl,
            reserve_timeout: self.reserve_timeout,
            namespace: Arc::from(self.namespace),
            keys: self.keys,
            classifier: self.classifier,
            ..Config::new(store)
        })
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
