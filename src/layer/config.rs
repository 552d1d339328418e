//! The options of a layer: [`IdempotencyLayerBuilder`], what it checks ([`ConfigError`]) and
//! the [`Config`] every service of the layer shares.
//!
//! First in the layer's order: it imports nothing from the layer but the counters.

use std::any::{Any, TypeId};
use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tower::ServiceExt as _;
use tower_service::Service;

use super::error::ConfigError;
use super::stats::Counters;
use crate::classify::Classifier;
use crate::message::{Message, RawMessage};
use crate::outcome::{BoxError, Category};
use crate::store::Store;
use crate::verify::{Verified, Verify};

/// The default lease: how long a reservation holds a key before it must be renewed, and so
/// how long a crashed process holds its keys.
///
/// Two minutes, renewed every 40 s while the send and its settlement run: a crashed process
/// frees its keys within two minutes (the lease was ten before renewal existed), renewals
/// ride out store outages of up to 80 s (a Redis or PostgreSQL failover), and a store
/// without [`Store::extend`] still holds a key longer than the default
/// [`RetryPolicy`](crate::RetryPolicy) retries (60 s).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(2 * 60);
/// The default ttl: how long the outcome of a send is kept under its key.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The default bound on a reservation's round trip to the store.
pub const DEFAULT_RESERVE_TIMEOUT: Duration = Duration::from_secs(5);
/// The default bound on how long the caller waits for its key to be settled after the send;
/// the settlement goes on in the background past it.
pub const DEFAULT_SETTLE_TIMEOUT: Duration = Duration::from_secs(5);
/// The default maximum hold: a send whose inner future runs longer is given up, its key kept
/// as `idempotency.max_hold`.
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(15 * 60);
/// The default namespace.
pub const DEFAULT_NAMESPACE: &str = "default";
/// The default bound on the verification service's answer about a key taken over from a
/// holder that never settled it ([`IdempotencyLayerBuilder::verify_takeovers`]).
pub const DEFAULT_VERIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// The verification service of a layer, cloned for each question (it was polled ready
/// before each call).
#[derive(Clone)]
pub(crate) struct Verifier(
    Arc<dyn Fn(Verify) -> BoxFuture<'static, Result<Verified, BoxError>> + Send + Sync>,
);

impl Verifier {
    fn new<V>(service: V) -> Self
    where
        V: Service<Verify, Response = Verified> + Clone + Send + Sync + 'static,
        V::Error: Into<BoxError>,
        V::Future: Send + 'static,
    {
        Self(Arc::new(move |question| {
            let service = service.clone();
            Box::pin(async move { service.oneshot(question).await.map_err(Into::into) })
        }))
    }

    /// Asks the service about one key.
    pub(crate) fn ask(&self, question: Verify) -> BoxFuture<'static, Result<Verified, BoxError>> {
        (self.0)(question)
    }
}

/// How a key is written into the store: as it is, or as a digest that holds no personal data.
///
/// | form | stored key | example (namespace `alerts`, key `order.created:ord_1:email:seller@example.com`) |
/// |---|---|---|
/// | [`Raw`](Self::Raw) (default) | `namespace:key` | `alerts:order.created:ord_1:email:seller@example.com` |
/// | [`Hashed`](Self::Hashed) | `namespace:h1:` and the 64 lowercase hex digits of SHA-256 over the bytes of `namespace:key` | `alerts:h1:` and 64 hex digits |
///
/// Keys often embed an address or a customer id; with [`Hashed`](Self::Hashed) none of it
/// reaches Redis or PostgreSQL, and every stored key of a namespace has the same length,
/// whatever the key's. The namespace stays readable, so a store can still be grouped or
/// listed by namespace. `h1` marks version 1 of the form: the form is stored data, pinned by
/// a golden test, and a later form would get another marker.
///
/// The key rules are the same in both forms (1 to [`MAX_KEY_LEN`](crate::message::MAX_KEY_LEN)
/// bytes, no control characters), so switching forms never turns a valid key invalid or back.
///
/// **Choosing the form is choosing where keys live.** Every process that sends under a
/// namespace must use the same form: a process storing raw keys and one storing hashed keys
/// do not see each other's records, and both send the same message. So switch a namespace's
/// form only with every process at once (stop the old ones before the new ones send), and
/// expect a repeat of a message sent before the switch, within its ttl, to be sent again:
/// the provider's `Idempotency-Key` is the stored key, which the switch changes too, so the
/// provider does not catch that repeat either. `Raw` stays the
/// default for that reason: changing it in a release would send such duplicates during a
/// rolling deploy.
///
/// With `Hashed`, an operator can no longer read keys in the store; to find the record of a
/// key, compute its stored form with [`StoredKeys`](super::StoredKeys) (or
/// [`IdempotencyLayer::stored_key_for`](super::IdempotencyLayer::stored_key_for)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyForm {
    /// `namespace:key`: readable in the store, and holding whatever the key holds.
    #[default]
    Raw,
    /// `namespace:h1:<hex of SHA-256(namespace:key)>`: 68 bytes after the namespace, no
    /// personal data.
    Hashed,
}

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

// The counters' alignment makes the configuration's: its `Arc` counts, before it, then
// have a cache line of their own.
const _: () = assert!(std::mem::align_of::<Config>() >= 64);

/// What every service of a layer shares: the checked options and the counters.
pub(crate) struct Config {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) lease: Duration,
    pub(crate) ttl: Duration,
    pub(crate) reserve_timeout: Duration,
    pub(crate) settle_timeout: Duration,
    pub(crate) renew: bool,
    pub(crate) max_hold: Duration,
    pub(crate) wait_for_in_flight: Option<Duration>,
    pub(crate) provider_window: Option<Duration>,
    pub(crate) verifier: Option<Verifier>,
    pub(crate) verify_timeout: Duration,
    pub(crate) namespace: Arc<str>,
    pub(crate) key_form: KeyForm,
    pub(crate) keys: KeyFns,
    pub(crate) classifier: Classifier,
    pub(crate) counters: Counters,
    /// Set once the store answered `Unsupported` to a renewal: the layer stops renewing, and
    /// warns once.
    pub(crate) extend_unsupported: AtomicBool,
    /// Set once the store answered `Unsupported` to a retake: warned once.
    pub(crate) retake_unsupported: AtomicBool,
}

impl Config {
    /// Whether the store bounds each of its calls within the reserve timeout
    /// ([`Store::call_timeout`]): the layer's own timer on a store call could then never fire
    /// first, and is not set.
    pub(crate) fn store_bounds_calls(&self) -> bool {
        self.store
            .call_timeout()
            .is_some_and(|bound| bound <= self.reserve_timeout)
    }

    /// Every option at its default, over `store`.
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            lease: DEFAULT_LEASE,
            ttl: DEFAULT_TTL,
            reserve_timeout: DEFAULT_RESERVE_TIMEOUT,
            settle_timeout: DEFAULT_SETTLE_TIMEOUT,
            renew: true,
            max_hold: DEFAULT_MAX_HOLD,
            wait_for_in_flight: None,
            provider_window: None,
            verifier: None,
            verify_timeout: DEFAULT_VERIFY_TIMEOUT,
            namespace: Arc::from(DEFAULT_NAMESPACE),
            key_form: KeyForm::Raw,
            keys: KeyFns::default(),
            classifier: Classifier::default(),
            counters: Counters::default(),
            extend_unsupported: AtomicBool::new(false),
            retake_unsupported: AtomicBool::new(false),
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("namespace", &self.namespace)
            .field("key_form", &self.key_form)
            .field("lease", &self.lease)
            .field("ttl", &self.ttl)
            .field("reserve_timeout", &self.reserve_timeout)
            .field("settle_timeout", &self.settle_timeout)
            .field("renew", &self.renew)
            .field("max_hold", &self.max_hold)
            .field("wait_for_in_flight", &self.wait_for_in_flight)
            .field("provider_window", &self.provider_window)
            .field("verify_takeovers", &self.verifier.is_some())
            .field("verify_timeout", &self.verify_timeout)
            .field("custom_key", &self.keys.has::<Message>())
            .field("raw_key", &self.keys.has::<RawMessage>())
            .field("key_functions", &self.keys.0.len())
            .finish_non_exhaustive()
    }
}

/// The state of an [`IdempotencyLayerBuilder`] that has no store yet: it has no
/// [`build`](IdempotencyLayerBuilder::build) until [`store`](IdempotencyLayerBuilder::store)
/// gives it one.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoStore;

/// The state of an [`IdempotencyLayerBuilder`] given a store: it can
/// [`build`](IdempotencyLayerBuilder::build).
#[derive(Clone)]
pub struct WithStore(Arc<dyn Store>);

impl fmt::Debug for WithStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WithStore")
    }
}

/// Builds an [`IdempotencyLayer`](super::IdempotencyLayer);
/// [`build`](Self::build) checks the options.
///
/// The store is required, and the type says so: [`IdempotencyLayer::builder`](super::IdempotencyLayer::builder)
/// starts an `IdempotencyLayerBuilder<NoStore>`, which has every setter but no `build`;
/// [`store`](Self::store) (or [`shared_store`](Self::shared_store)) makes it an
/// `IdempotencyLayerBuilder<WithStore>`, which builds. A builder without a store does not
/// compile:
///
/// ```compile_fail,E0599
/// use tower_idempotency::IdempotencyLayer;
///
/// let layer = IdempotencyLayer::builder().namespace("alerts").build();
/// ```
///
/// ```
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
///
/// let layer = IdempotencyLayer::builder()
///     .namespace("alerts")
///     .store(MemoryStore::new())
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), tower_idempotency::layer::ConfigError>(())
/// ```
///
/// | option | default |
/// |---|---|
/// | [`store`](Self::store) | none: required, [`build`](Self::build) exists only once it is set |
/// | [`lease`](Self::lease) | [`DEFAULT_LEASE`] (2 minutes, renewed every 40 s while the send runs) |
/// | [`renew`](Self::renew) | on |
/// | [`max_hold`](Self::max_hold) | [`DEFAULT_MAX_HOLD`] (15 minutes) |
/// | [`ttl`](Self::ttl) | [`DEFAULT_TTL`] (24 hours) |
/// | [`reserve_timeout`](Self::reserve_timeout) | [`DEFAULT_RESERVE_TIMEOUT`] (5 s) |
/// | [`settle_timeout`](Self::settle_timeout) | [`DEFAULT_SETTLE_TIMEOUT`] (5 s) |
/// | [`wait_for_in_flight`](Self::wait_for_in_flight) | off: a repeat of an in-flight send is answered `idempotency.in_flight` at once |
/// | [`provider_window`](Self::provider_window) | off: a repeat of a send of unknown delivery is answered with the kept error for the ttl |
/// | [`verify_takeovers`](Self::verify_takeovers), [`verify_timeout`](Self::verify_timeout) | off; [`DEFAULT_VERIFY_TIMEOUT`] (5 s) |
/// | [`namespace`](Self::namespace) | [`DEFAULT_NAMESPACE`] (`"default"`) |
/// | [`key_form`](Self::key_form) | [`KeyForm::Raw`]: keys stored as `namespace:key` |
/// | [`key`](Self::key), [`raw_key`](Self::raw_key), [`key_for`](Self::key_for) | the request's own [`idempotency_key`](super::IdempotentRequest::idempotency_key) (a [`RawMessage`] has none) |
/// | [`classify`](Self::classify) | [`default_classifier`](crate::classify::default_classifier) |
///
/// For one process, [`IdempotencyLayer::in_memory`](super::IdempotencyLayer::in_memory) is
/// the explicit choice of a [`MemoryStore`](crate::MemoryStore).
///
/// `S` defaults to [`WithStore`], so a function that takes a builder ready to build names it
/// `IdempotencyLayerBuilder`.
#[must_use]
pub struct IdempotencyLayerBuilder<S = WithStore> {
    store: S,
    lease: Duration,
    ttl: Duration,
    reserve_timeout: Duration,
    settle_timeout: Duration,
    renew: bool,
    max_hold: Duration,
    wait_for_in_flight: Option<Duration>,
    provider_window: Option<Duration>,
    verifier: Option<Verifier>,
    verify_timeout: Duration,
    namespace: String,
    key_form: KeyForm,
    keys: KeyFns,
    classifier: Classifier,
}

impl Default for IdempotencyLayerBuilder<NoStore> {
    fn default() -> Self {
        Self {
            store: NoStore,
            lease: DEFAULT_LEASE,
            ttl: DEFAULT_TTL,
            reserve_timeout: DEFAULT_RESERVE_TIMEOUT,
            settle_timeout: DEFAULT_SETTLE_TIMEOUT,
            renew: true,
            max_hold: DEFAULT_MAX_HOLD,
            wait_for_in_flight: None,
            provider_window: None,
            verifier: None,
            verify_timeout: DEFAULT_VERIFY_TIMEOUT,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            key_form: KeyForm::Raw,
            keys: KeyFns::default(),
            classifier: Classifier::default(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for IdempotencyLayerBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayerBuilder")
            .field("store", &self.store)
            .field("namespace", &self.namespace)
            .field("key_form", &self.key_form)
            .field("lease", &self.lease)
            .field("ttl", &self.ttl)
            .field("reserve_timeout", &self.reserve_timeout)
            .field("settle_timeout", &self.settle_timeout)
            .field("renew", &self.renew)
            .field("max_hold", &self.max_hold)
            .field("wait_for_in_flight", &self.wait_for_in_flight)
            .field("provider_window", &self.provider_window)
            .field("verify_takeovers", &self.verifier.is_some())
            .field("verify_timeout", &self.verify_timeout)
            .finish_non_exhaustive()
    }
}

impl<S> IdempotencyLayerBuilder<S> {
    /// The store of keys (required). Layers given the same store (or clones of it)
    /// deduplicate together; give every process that sends the same networked store.
    pub fn store(self, store: impl Store) -> IdempotencyLayerBuilder<WithStore> {
        self.shared_store(Arc::new(store))
    }

    /// A store already shared as `Arc<dyn Store>`.
    pub fn shared_store(self, store: Arc<dyn Store>) -> IdempotencyLayerBuilder<WithStore> {
        let Self {
            store: _,
            lease,
            ttl,
            reserve_timeout,
            settle_timeout,
            renew,
            max_hold,
            wait_for_in_flight,
            provider_window,
            verifier,
            verify_timeout,
            namespace,
            key_form,
            keys,
            classifier,
        } = self;
        IdempotencyLayerBuilder {
            store: WithStore(store),
            lease,
            ttl,
            reserve_timeout,
            settle_timeout,
            renew,
            max_hold,
            wait_for_in_flight,
            provider_window,
            verifier,
            verify_timeout,
            namespace,
            key_form,
            keys,
            classifier,
        }
    }

    /// How long a reservation holds a key without renewal, by the store's clock: it bounds
    /// how long a crashed process holds its keys.
    ///
    /// While a send runs, and while its settlement is retried, the layer renews the lease
    /// ([`Store::extend`]) every third of it, so a send may take longer than the lease. A
    /// renewal that fails on a transient store error is retried sooner; a store outage
    /// longer than the rest of the lease (two thirds of it) loses the key, and a repeat may
    /// then send again. Choose a lease longer than the store outages you want to ride out.
    /// Without renewal ([`renew(false)`](Self::renew), or a store that does not implement
    /// `extend`) the lease must be longer than a send takes with all its retries.
    ///
    /// Default [`DEFAULT_LEASE`], two minutes; see there why.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Whether the layer renews the lease of a key while its send and its settlement run
    /// (default `true`).
    ///
    /// With `false`, a reservation holds its key for the lease given at reserve time only: a
    /// send slower than the lease lets a repeat reserve the key and send again. Renewal costs nothing for a send that finishes within a third of the
    /// lease, and one store call per third of the lease for a slower one.
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// The longest the layer lets an inner service work on one send (default
    /// [`DEFAULT_MAX_HOLD`], 15 minutes).
    ///
    /// Renewal would otherwise hold the key of an inner future that never ends for ever. Past
    /// the maximum hold the inner future is dropped, the caller gets a [`SendError`] of code
    /// `idempotency.max_hold` (delivery unknown) and the key is kept with that outcome, never
    /// freed: the provider may have taken the message. Put a timeout inside the stack for
    /// the bound you mean on a send; this one is the backstop. It also bounds how long a
    /// settlement is retried while its lease is renewed. Needs a tokio runtime.
    ///
    /// [`SendError`]: crate::SendError
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = max_hold;
        self
    }

    /// The longest the caller waits for its key to be settled once the inner service
    /// answered (default [`DEFAULT_SETTLE_TIMEOUT`], 5 s, like the reserve timeout).
    ///
    /// Keeping the outcome (or freeing the key) is retried on transient store errors, with
    /// jittered exponential backoff from 10 ms to 1 s, until it lands, the store answers that
    /// another send holds the key, or the lease is about to end. The caller gets the inner
    /// service's answer as soon as the settlement landed or this bound passed, whichever
    /// comes first; the retries go on in the background, also when the caller drops the
    /// send. Only a settlement that finally gives up emits the `IDEMPOTENCY_STORE_FAILED`
    /// warning. Without a tokio runtime there is one attempt and no bound.
    pub fn settle_timeout(mut self, timeout: Duration) -> Self {
        self.settle_timeout = timeout;
        self
    }

    /// Lets a repeat that finds its key held by an in-flight send of the same message wait up
    /// to `bound` for that send to finish, instead of being answered `idempotency.in_flight`
    /// at once (off by default).
    ///
    /// The repeat asks the store again (a reserve) with backoff, from 10 ms doubling to 1 s,
    /// until the bound: once the first send's outcome is kept it is answered as a replay;
    /// if the first send freed the key (its message certainly did not go) or its lease
    /// passed, the repeat's reserve takes the key and the repeat is **sent**, exactly as it
    /// would have been had it arrived a moment later. Still pending at the bound, it is
    /// answered `idempotency.in_flight`. A batch waits for all its in-flight keys together,
    /// and stops waiting (and sends) as soon as one of them is reserved; a batch that already
    /// reserved other keys waits at most a third of the lease, as nothing renews those while
    /// it waits. A key taken after waiting holds a lease from that moment. Needs a tokio
    /// runtime; a zero bound turns waiting off.
    pub fn wait_for_in_flight(mut self, bound: Duration) -> Self {
        self.wait_for_in_flight = (!bound.is_zero()).then_some(bound);
        self
    }

    /// Re-sends a message of unknown delivery under the same key while the provider still
    /// deduplicates on it: for a transport that forwards the key to a provider that
    /// deduplicates on it for at least `window` (Resend: 24 hours). Off by default.
    ///
    /// With it, a repeat that finds its key done with an outcome of unknown delivery (a
    /// timeout after the request left, an unclear 5xx, a broken connection, a send dropped
    /// mid-call, the provider's own in-flight answer such as Resend's 409
    /// `concurrent_idempotent_requests`), for the same message, whose first attempt began
    /// less than `window` ago, takes the key back ([`Store::retake`]) and sends again under
    /// the same key. The provider answers with the message it took the first time, or takes
    /// it now; the layer keeps that answer. Of concurrent repeats exactly one takes the key
    /// back; the others find it pending, and are answered (or wait) as for any send in
    /// flight. The same rule applies to a send that takes a key over from a holder that
    /// never settled it (a crashed process, see [`verify_takeovers`](Self::verify_takeovers)).
    ///
    /// Outside the window, with a record whose first attempt's time the store does not know,
    /// or without this option, the kept error is replayed. A
    /// [`Batch`](crate::batch::Batch) replays kept outcomes (taking a kept outcome back is for
    /// single sends); a key a batch takes over is decided as a single send's is.
    ///
    /// **When a re-send is safe.** Only when all of these hold:
    ///
    /// - the provider deduplicates on the forwarded key for at least `window`, counted from
    ///   the first request it received (the `http` feature's transport forwards the
    ///   key as `Idempotency-Key`; Resend keeps it for 24 hours);
    /// - every attempt forwards the same key (the layer's key, unchanged, on every retry):
    ///   a transport that derives another key per attempt gets a second message;
    /// - the message is the same: the layer retakes only for the same fingerprint, and a
    ///   provider that compares payloads refuses another one under the key;
    /// - `window` leaves a margin below the provider's. It is measured from the first
    ///   attempt's reserve by the store's clock (Redis `TIME`, PostgreSQL `now()`, the
    ///   process's monotonic clock), which starts before the provider's; but it bounds when
    ///   a re-send *starts*, and the provider counts to when the re-send *arrives*, so take
    ///   off the longest a send may take (your timeout, at most the
    ///   [`max_hold`](Self::max_hold)); and a store clock stepped back (NTP, a failover to a
    ///   server whose clock is behind) makes the first attempt look younger, so take off the
    ///   worst step you expect too. An hour off Resend's 24 is generous. (The model check in
    ///   `tests/protocol_model.rs` finds the duplicate a window as long as the provider's
    ///   allows.)
    ///
    /// Needs a store that implements [`Store::retake`] and keeps the first attempt's time
    /// (every store of this crate); with one that does not, the kept error is replayed and a
    /// warning says so once.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// // Resend deduplicates for 24 hours; keep an hour's margin.
    /// let layer = IdempotencyLayer::builder()
    ///     .store(MemoryStore::new())
    ///     .provider_window(Duration::from_secs(23 * 60 * 60))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), tower_idempotency::layer::ConfigError>(())
    /// ```
    ///
    /// [`Store::retake`]: crate::store::Store::retake
    pub fn provider_window(mut self, window: Duration) -> Self {
        self.provider_window = (!window.is_zero()).then_some(window);
        self
    }

    /// Asks `service` before sending under a key taken over from a holder that never settled
    /// it (its lease passed: a crashed process), "did the provider take this message?".
    /// Off by default.
    ///
    /// When a store reports such a takeover
    /// ([`Reservation::TakenOver`](crate::store::Reservation::TakenOver)) of the same
    /// message, the layer:
    ///
    /// 1. re-sends under the same key when the first attempt is inside the
    ///    [`provider_window`](Self::provider_window) (the provider deduplicates);
    /// 2. else asks `service` a [`Verify::for_key`] question (the stored key, the raw key
    ///    the message carried, the fingerprint), bounded by the
    ///    [`verify_timeout`](Self::verify_timeout), and acts on its answer:
    ///    [`Delivered`](Verified::Delivered) keeps the key done with the provider's receipt
    ///    and answers it (marked replayed), with no send; [`NotSent`](Verified::NotSent)
    ///    sends; [`Unknown`](Verified::Unknown), an error or no answer in time keeps the key
    ///    with an outcome of unknown delivery (`idempotency.unverified`) and does not send,
    ///    leaving it to a [`Reconciler`](crate::reconcile::Reconciler) or an operator.
    ///
    /// Without either option the send goes: that is the one duplicate the guarantee allows.
    /// A takeover of a key held by another message is sent too. A
    /// [`Batch`](crate::batch::Batch) decides each key it took over the same way, before it
    /// sends.
    /// The same service can serve a [`Reconciler`](crate::reconcile::Reconciler).
    ///
    /// ```
    /// use tower_idempotency::verify::{Verified, Verify};
    /// use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore};
    ///
    /// // A real service would look the key up at the provider.
    /// let verify = tower::service_fn(|_question: Verify| async { Ok::<_, BoxError>(Verified::Unknown) });
    /// let layer = IdempotencyLayer::builder()
    ///     .store(MemoryStore::new())
    ///     .verify_takeovers(verify)
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), tower_idempotency::layer::ConfigError>(())
    /// ```
    pub fn verify_takeovers<V>(mut self, service: V) -> Self
    where
        V: Service<Verify, Response = Verified> + Clone + Send + Sync + 'static,
        V::Error: Into<BoxError>,
        V::Future: Send + 'static,
    {
        self.verifier = Some(Verifier::new(service));
        self
    }

    /// The bound on the verification service's answer about a taken-over key (default
    /// [`DEFAULT_VERIFY_TIMEOUT`], 5 s); no answer in time counts as
    /// [`Verified::Unknown`]. It is cut to a third of the lease, which the question holds
    /// without renewal.
    pub fn verify_timeout(mut self, timeout: Duration) -> Self {
        self.verify_timeout = timeout;
        self
    }

    /// How long the outcome of a send is kept under its key.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The bound on the store's answer to a reservation; past it the message fails with
    /// `idempotency.store_failed` and is not sent. It also bounds each attempt of a
    /// settlement or a lease renewal (a timed-out attempt counts as a transient error). Needs
    /// a tokio runtime to take effect.
    ///
    /// A store that bounds its own calls ([`Store::call_timeout`]: `RedisStore`,
    /// `PostgresStore` and `MySqlStore` by their `timeout`) fails them at its own bound
    /// when that is shorter, and the layer then sets no timer of its own on its calls.
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

    /// How keys are written into the store (default [`KeyForm::Raw`], `namespace:key`).
    ///
    /// [`KeyForm::Hashed`] stores `namespace:h1:<hex of SHA-256(namespace:key)>`, so no
    /// address or id embedded in a key reaches the store; every store operation of the layer
    /// (sends, batches, claims, waiting repeats, renewals, settlements) uses that form. Every
    /// process sending under the namespace must use the same form: see [`KeyForm`] before
    /// switching a namespace that is already in use.
    ///
    /// ```
    /// use tower_idempotency::layer::KeyForm;
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore, Message};
    ///
    /// let layer = IdempotencyLayer::builder()
    ///     .store(MemoryStore::new())
    ///     .namespace("alerts")
    ///     .key_form(KeyForm::Hashed)
    ///     .build()?;
    /// let stored = layer.stored_key_for("order.created:ord_1:email:seller@example.com")?;
    /// assert!(stored.starts_with("alerts:h1:"));
    /// assert!(!stored.contains("seller"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key_form(mut self, form: KeyForm) -> Self {
        self.key_form = form;
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
}

impl IdempotencyLayerBuilder<WithStore> {
    /// Checks the options: what [`build`](Self::build) does before it makes the layer.
    pub(crate) fn into_config(self) -> Result<Config, ConfigError> {
        validate_namespace(&self.namespace)?;
        for (name, d) in [
            ("lease", self.lease),
            ("ttl", self.ttl),
            ("reserve timeout", self.reserve_timeout),
            ("settle timeout", self.settle_timeout),
            ("max hold", self.max_hold),
            ("verify timeout", self.verify_timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError::ZeroDuration(name));
            }
        }
        if self.ttl < self.lease {
            return Err(ConfigError::TtlShorterThanLease);
        }
        Ok(Config {
            lease: self.lease,
            ttl: self.ttl,
            reserve_timeout: self.reserve_timeout,
            settle_timeout: self.settle_timeout,
            renew: self.renew,
            max_hold: self.max_hold,
            wait_for_in_flight: self.wait_for_in_flight,
            provider_window: self.provider_window,
            verifier: self.verifier,
            verify_timeout: self.verify_timeout.min(self.lease / 3),
            namespace: Arc::from(self.namespace),
            key_form: self.key_form,
            keys: self.keys,
            classifier: self.classifier,
            ..Config::new(self.store.0)
        })
    }
}

/// Checks a namespace: 1 to 64 bytes, no `:` (it ends the namespace in a stored key) and no
/// control characters.
pub(crate) fn validate_namespace(ns: &str) -> Result<(), ConfigError> {
    let ok = !ns.is_empty() && ns.len() <= 64 && !ns.chars().any(|c| c == ':' || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(ConfigError::InvalidNamespace(ns.to_owned()))
    }
}
