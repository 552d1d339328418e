//! Unknown is not forever: re-sends inside the provider's window
//! and takeovers that check first, end to end through the HTTP transport against the fake
//! provider that deduplicates on `Idempotency-Key` like Resend, on every store (memory,
//! Redis, Redis Cluster, PostgreSQL). Each test counts the messages the provider took per key.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use support::http::{ClientKind, DEADLINE, FakeProvider, Fault, Ledger};
use support::poll_until;
use support::stores::{backend_url, until_expired};
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::resend::ResendCodec;
use tower_idempotency::layer::IdempotencyLayerBuilder;
use tower_idempotency::outcome::codes;
use tower_idempotency::store::admin::StoreAdmin;
use tower_idempotency::store::{Reservation, Store};
use tower_idempotency::verify::{Verified, Verify};
use tower_idempotency::{IdempotencyLayer, MemoryStore, Message, Receipt, SendError};

/// The lease every test holds keys for: short, so that a crashed owner's passes quickly.
const LEASE: Duration = Duration::from_millis(400);
/// A window far longer than any test.
const WINDOW: Duration = Duration::from_secs(60);

/// Which store a test runs on.
#[derive(Clone, Copy, Debug)]
enum Backend {
    Memory,
    Redis,
    Cluster,
    Postgres,
}

impl Backend {
    /// A store of this backend under names no other test shares (`Option` for the
    /// `let Some(..) else` of its callers; see `backend_url`).
    async fn store(self) -> Option<Arc<dyn StoreAdmin>> {
        use support::stores::{unique, unique_prefix};
        use tower_idempotency::{PostgresStore, RedisStore};
        Some(match self {
            Self::Memory => Arc::new(MemoryStore::new()),
            Self::Redis => {
                let url = backend_url("REDIS_URL")?;
                Arc::new(
                    RedisStore::connect(&url)
                        .await
                        .expect("connect to REDIS_URL")
                        .key_prefix(unique_prefix("resend")),
                )
            }
            Self::Cluster => {
                let urls = backend_url("REDIS_CLUSTER_URLS")?;
                Arc::new(
                    RedisStore::connect_cluster(urls.split(','))
                        .await
                        .expect("connect to REDIS_CLUSTER_URLS")
                        .key_prefix(unique_prefix("resend")),
                )
            }
            Self::Postgres => {
                let url = backend_url("DATABASE_URL")?;
                let store = PostgresStore::connect(&url)
                    .await
                    .expect("connect to DATABASE_URL")
                    .table(&format!("public.{}", unique("resend")))
                    .expect("valid table name");
                store.migrate().await.expect("migrate");
                Arc::new(store)
            }
        })
    }
}

/// One test per backend for each test body.
macro_rules! on_every_store {
    ($($body:ident),* $(,)?) => {
        mod memory { $( #[tokio::test] async fn $body() { super::$body(super::Backend::Memory).await } )* }
        mod redis { $(
            #[tokio::test]
            #[cfg_attr(not(backend_redis), ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379")]
            async fn $body() { super::$body(super::Backend::Redis).await }
        )* }
        mod cluster { $(
            #[tokio::test]
            #[cfg_attr(not(backend_redis_cluster), ignore = "no Redis Cluster at REDIS_CLUSTER_URLS or 127.0.0.1:7001-7003")]
            async fn $body() { super::$body(super::Backend::Cluster).await }
        )* }
        mod postgres { $(
            #[tokio::test]
            #[cfg_attr(not(backend_postgres), ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test")]
            async fn $body() { super::$body(super::Backend::Postgres).await }
        )* }
    };
}

on_every_store!(
    a_500_then_a_repeat_inside_the_window_answers_the_providers_original_id,
    a_repeat_outside_the_window_answers_the_stored_error,
    a_connection_broken_before_the_request_left_is_delivered_once_by_the_repeat,
    concurrent_repeats_inside_the_window_take_the_key_back_once,
    a_crashed_owner_is_verified_first_and_a_delivered_claim_never_goes_out_twice,
    a_crashed_owner_inside_the_window_is_sent_again_under_the_same_key,
    a_crashed_owner_the_provider_never_saw_is_sent_once,
    a_crashed_owner_the_provider_cannot_vouch_for_is_kept_unsent,
);

const KEY: &str = "order.created:ord_1:email";
/// The key the provider sees: the layer's stored key (`namespace:key`), which the fake
/// provider deduplicates on.
const SENT_KEY: &str = "resend:order.created:ord_1:email";

fn order(key: &str) -> Message {
    support::message(Some(key), "Sold.")
}

/// The layer's options every test shares, over `store`.
fn layer(store: &Arc<dyn StoreAdmin>) -> IdempotencyLayerBuilder {
    IdempotencyLayer::builder()
        .shared_store(Arc::clone(store) as Arc<dyn Store>)
        .namespace("resend")
        .lease(LEASE)
}

type Sender = tower::util::BoxCloneService<Message, Receipt, SendError>;

/// The layer over the Resend transport to `provider`, with no retry: every repeat is the
/// caller's own.
fn stack(layer: IdempotencyLayer, provider: &FakeProvider) -> Sender {
    stack_to(layer, provider.base_url())
}

fn stack_to(layer: IdempotencyLayer, base: http::Uri) -> Sender {
    let transport = HttpTransport::new(
        ClientKind::HyperUtil.client(),
        ResendCodec::new("re_test").base_url(base),
    );
    let service = ServiceBuilder::new().layer(layer).service(transport);
    tower::util::BoxCloneService::new(service)
}

/// A verification service over what the provider took, by the raw key, counting questions.
#[derive(Clone)]
struct Verifier {
    ledger: Arc<Ledger>,
    asked: Arc<AtomicUsize>,
    /// Answers `Unknown` whatever the provider took.
    blind: bool,
}

impl Verifier {
    fn new(ledger: &Arc<Ledger>) -> Self {
        Self {
            ledger: Arc::clone(ledger),
            asked: Arc::default(),
            blind: false,
        }
    }

    fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }

    fn service(
        &self,
    ) -> impl tower::Service<
        Verify,
        Response = Verified,
        Error = BoxError,
        Future = std::future::Ready<Result<Verified, BoxError>>,
    > + Clone
    + Send
    + Sync
    + 'static {
        let this = self.clone();
        tower::service_fn(move |question: Verify| {
            this.asked.fetch_add(1, Ordering::SeqCst);
            // The provider knows the message by the key it was sent under: the stored key.
            let taken = this.ledger.taken(&question.stored_key);
            std::future::ready(Ok(match taken {
                _ if this.blind => Verified::Unknown,
                Some(id) => Verified::Delivered(Receipt::new(id, "resend")),
                None => Verified::NotSent,
            }))
        })
    }
}

/// Runs a first send of `message` in a runtime of its own and shuts that runtime down once
/// the provider received it: the process holding the key dies mid-call, nothing settles
/// the key (no drop handler runs a settlement on a runtime that is gone), and its lease is
/// then let pass.
async fn crash_mid_send(store: &Arc<dyn StoreAdmin>, provider: &FakeProvider, message: Message) {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let stored_key = layer(store)
        .build()
        .expect("valid layer")
        .store_key(&message)
        .expect("a valid key")
        .expect("the message has a key");
    let crashing = Arc::clone(store);
    let base = provider.base_url();
    let received_before = provider.requests().len();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the process that crashes");
        runtime.spawn(async move {
            let service = stack_to(layer(&crashing).build().expect("valid layer"), base);
            let _ = started_tx.send(());
            let _ = service.oneshot(message).await;
        });
        // Held until the test has seen the request arrive; then the process is gone.
        let _ = stop_rx.recv_timeout(DEADLINE);
        runtime.shutdown_background();
    });
    let _ = tokio::time::timeout(DEADLINE, started_rx).await;
    provider.received(received_before + 1).await;
    stop_tx.send(()).expect("the crashing process waits");
    thread.join().expect("the crashing process ends");
    until_expired(store.as_ref(), &[&stored_key]).await;
}

async fn a_500_then_a_repeat_inside_the_window_answers_the_providers_original_id(backend: Backend) {
    let Some(store) = backend.store().await else {
        return;
    };
    let ledger = Ledger::new([Fault::TakeThen500]);
    let provider = FakeProvider::start(ledger.script()).await;
    let layer = layer(&store).provider_window(WINDOW).build().unwrap();
    let stats = layer.clone();
    assert_eq!(layer.stored_key_for(KEY).unwrap(), SENT_KEY);
    let service = stack(layer, &provider);

    let first = service.clone().oneshot(order(KEY)).await.unwrap_err();
    assert!(
        first.delivery_unknown(),
        "a 500 leaves delivery unknown: {first:?}"
    );
    let again = service
        .clone()
        .oneshot(order(KEY))
        .await
        .expect("the repeat is answered");
    assert_eq!(
        again.id,
        ledger.taken(SENT_KEY).unwrap(),
        "the provider's original id"
    );
    // Kept: a third send is a replay, the provider not asked again.
    let third = service.oneshot(order(KEY)).await.unwrap();
    assert_eq!(third.id, again.id);
    assert!(third.replayed);

    assert_eq!(ledger.messages(SENT_KEY), 1, "one provider message");
    assert_eq!(
        provider.requests().len(),
        2,
        "the first send and one re-send"
    );
    let keys: Vec<_> = provider.requests().iter().map(|r| r.key.clone()).collect();
    assert_eq!(
        keys,
        [Some(SENT_KEY.to_owned()), Some(SENT_KEY.to_owned())],
        "the same key forwarded"
    );
    assert_eq!(stats.stats().resent, 1);
}

async fn a_repeat_outside_the_window_answers_the_stored_error(backend: Backend) {
    let Some(store) = backend.store().await else {
        return;
    };
    let window = Duration::from_millis(300);
    let ledger = Ledger::new([Fault::TakeThen500]);
    let provider = FakeProvider::start(ledger.script()).await;
    let service = stack(
        layer(&store).provider_window(window).build().unwrap(),
        &provider,
    );

    let first = service.clone().oneshot(order(KEY)).await.unwrap_err();
    // The window passes on the store's clock: ask the store the first attempt's age, as the
    // repeat's reserve will read it (a reserve of a kept record changes nothing).
    let fingerprint = Fingerprint::of(&order(KEY));
    poll_until(
        "the first attempt outlives the window on the store's clock",
        Duration::from_secs(10),
        || async {
            match store
                .reserve(SENT_KEY, fingerprint, LEASE)
                .await
                .expect("reserve")
            {
                Reservation::Held { record } => record.first_attempt_age >= Some(window),
                other => panic!("the kept outcome holds the key: {other:?}"),
            }
        },
    )
    .await;
    let again = service.oneshot(order(KEY)).await.unwrap_err();
    assert_eq!(again.code(), first.code(), "today's stored error");
    assert!(again.is_replayed());
    assert_eq!(provider.requests().len(), 1, "never sent again");
    assert_eq!(ledger.messages(SENT_KEY), 1);
}

async fn a_connection_broken_before_the_request_left_is_delivered_once_by_the_repeat(
    backend: Backend,
) {
    let Some(store) = backend.store().await else {
        return;
    };
    let ledger = Ledger::new([]);
    // The first connection is closed unread: the provider never sees that request.
    let provider = FakeProvider::start_dropping(ledger.script(), 1).await;
    let service = stack(
        layer(&store).provider_window(WINDOW).build().unwrap(),
        &provider,
    );

    let first = service.clone().oneshot(order(KEY)).await.unwrap_err();
    assert!(first.delivery_unknown(), "a broken connection: {first:?}");
    assert_eq!(ledger.messages(SENT_KEY), 0);
    let again = service
        .clone()
        .oneshot(order(KEY))
        .await
        .expect("delivered by the repeat");
    assert_eq!(Some(again.id.clone()), ledger.taken(SENT_KEY));
    let third = service.oneshot(order(KEY)).await.unwrap();
    assert!(third.replayed);
    assert_eq!(ledger.messages(SENT_KEY), 1, "delivered once");
    assert_eq!(provider.requests().len(), 1);
}

async fn concurrent_repeats_inside_the_window_take_the_key_back_once(backend: Backend) {
    let Some(store) = backend.store().await else {
        return;
    };
    let ledger = Ledger::new([Fault::TakeThen500]);
    let provider = FakeProvider::start(ledger.script()).await;
    let layer = layer(&store)
        .provider_window(WINDOW)
        .wait_for_in_flight(DEADLINE)
        .build()
        .unwrap();
    let stats = layer.clone();
    let service = stack(layer, &provider);
    service.clone().oneshot(order(KEY)).await.unwrap_err();

    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let repeats: Vec<_> = (0..16)
        .map(|_| {
            let service = service.clone();
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                service.oneshot(order(KEY)).await
            })
        })
        .collect();
    let original = ledger.taken(SENT_KEY).unwrap();
    for repeat in repeats {
        let receipt = repeat
            .await
            .unwrap()
            .expect("every repeat gets the provider's answer");
        assert_eq!(receipt.id, original);
    }
    assert_eq!(
        stats.stats().resent,
        1,
        "exactly one repeat took the key back"
    );
    assert_eq!(
        provider.requests().len(),
        2,
        "the first send and one re-send"
    );
    assert_eq!(ledger.messages(SENT_KEY), 1);
}

async fn a_crashed_owner_is_verified_first_and_a_delivered_claim_never_goes_out_twice(
    backend: Backend,
) {
    let Some(store) = backend.store().await else {
        return;
    };
    let ledger = Ledger::new([Fault::TakeThenStall]);
    let provider = FakeProvider::start(ledger.script()).await;
    crash_mid_send(&store, &provider, order(KEY)).await;

    let verifier = Verifier::new(&ledger);
    let layer = layer(&store)
        .verify_takeovers(verifier.service())
        .build()
        .unwrap();
    let stats = layer.clone();
    let service = stack(layer, &provider);
    let next = service
        .clone()
        .oneshot(order(KEY))
        .await
        .expect("the provider's receipt");
    assert_eq!(verifier.asked(), 1, "asked before the send");
    assert_eq!(Some(next.id.clone()), ledger.taken(SENT_KEY));
    assert!(next.replayed, "answered, not sent");
    for _ in 0..3 {
        let again = service.clone().oneshot(order(KEY)).await.unwrap();
        assert_eq!(again.id, next.id);
        assert!(again.replayed);
    }
    assert_eq!(verifier.asked(), 1, "kept: nothing left to verify");
    assert_eq!(provider.requests().len(), 1, "no second send");
    assert_eq!(ledger.messages(SENT_KEY), 1);
    let stats = stats.stats();
    assert_eq!(
        (stats.taken_over, stats.verified_delivered, stats.sent),
        (1, 1, 0)
    );
}

async fn a_crashed_owner_inside_the_window_is_sent_again_under_the_same_key(backend: Backend) {
    let Some(store) = backend.store().await else {
        return;
    };
    let ledger = Ledger::new([Fault::TakeThenStall]);
    let provider = FakeProvider::start(ledger.script()).await;
    crash_mid_send(&store, &provider, order(KEY)).await;

    // The window is tried before the verification service: it is not asked.
    let verifier = Verifier::new(&ledger);
    let layer = layer(&store)
        .provider_window(WINDOW)
        .verify_takeovers(verifier.service())
        .build()
        .unwrap();
    let stats = layer.clone();
    let next = stack(layer, &provider).oneshot(order(KEY)).await.unwrap();
    assert_eq!(
        Some(next.id),
        ledger.taken(SENT_KEY),
        "the provider's original message"
    );
    assert_eq!(verifier.asked(), 0);
    assert_eq!(provider.requests().len(), 2, "re-sent under the same key");
    assert_eq!(ledger.messages(SENT_KEY), 1, "deduplicated by the provider");
    assert_eq!((stats.stats().taken_over, stats.stats().resent), (1, 1));
}

async fn a_crashed_owner_the_provider_never_saw_is_sent_once(backend: Backend) {
    let Some(store) = backend.store().await else {
        return;
    };
    // The crashed send reaches a provider that never takes it (another key's ledger).
    let elsewhere = Ledger::new([Fault::TakeThenStall]);
    let stalled = FakeProvider::start(elsewhere.script()).await;
    crash_mid_send(&store, &stalled, order(KEY)).await;

    let ledger = Ledger::new([]);
    let provider = FakeProvider::start(ledger.script()).await;
    let verifier = Verifier::new(&ledger);
    let layer = layer(&store)
        .verify_takeovers(verifier.service())
        .build()
        .unwrap();
    let service = stack(layer, &provider);
    let sent = service.clone().oneshot(order(KEY)).await.unwrap();
    assert!(!sent.replayed, "sent by this call");
    assert_eq!(verifier.asked(), 1);
    let again = service.oneshot(order(KEY)).await.unwrap();
    assert!(again.replayed);
    assert_eq!(ledger.messages(SENT_KEY), 1, "sent once");
}

async fn a_crashed_owner_the_provider_cannot_vouch_for_is_kept_unsent(backend: Backend) {
    let Some(store) = backend.store().await else {
        return;
    };
    let ledger = Ledger::new([Fault::TakeThenStall]);
    let provider = FakeProvider::start(ledger.script()).await;
    crash_mid_send(&store, &provider, order(KEY)).await;

    let mut verifier = Verifier::new(&ledger);
    verifier.blind = true;
    let layer = layer(&store)
        .verify_takeovers(verifier.service())
        .build()
        .unwrap();
    let stats = layer.clone();
    let service = stack(layer, &provider);
    let error = service.clone().oneshot(order(KEY)).await.unwrap_err();
    assert_eq!(error.code(), codes::UNVERIFIED);
    assert!(error.delivery_unknown());
    // Kept as unknown delivery: the repeat gets the stored error, nothing sent.
    let again = service.oneshot(order(KEY)).await.unwrap_err();
    assert_eq!(again.code(), codes::UNVERIFIED);
    assert!(again.is_replayed());
    assert_eq!(provider.requests().len(), 1);
    assert_eq!(stats.stats().verify_inconclusive, 1);
}

/// A third-party store without `Store::retake` keeps the plain behaviour: the
/// kept error is replayed, nothing is sent again.
#[tokio::test]
async fn a_store_without_retake_replays_the_kept_error_as_before() {
    let store = support::TestStore::default();
    let ledger = Ledger::new([Fault::TakeThen500]);
    let provider = FakeProvider::start(ledger.script()).await;
    let layer = IdempotencyLayer::builder()
        .store(store)
        .namespace("resend")
        .provider_window(WINDOW)
        .build()
        .unwrap();
    let stats = layer.clone();
    let service = stack(layer, &provider);
    let first = service.clone().oneshot(order(KEY)).await.unwrap_err();
    let again = service.oneshot(order(KEY)).await.unwrap_err();
    assert_eq!(again.code(), first.code());
    assert!(again.is_replayed());
    assert_eq!(provider.requests().len(), 1);
    assert_eq!(stats.stats().resent, 0);
}

/// A verification service that does not answer within the verify timeout counts as unknown:
/// the taken-over key is kept, nothing is sent.
#[tokio::test]
async fn a_verifier_that_does_not_answer_in_time_keeps_the_key_unsent() {
    let store: Arc<dyn StoreAdmin> = Arc::new(MemoryStore::new());
    let ledger = Ledger::new([Fault::TakeThenStall]);
    let provider = FakeProvider::start(ledger.script()).await;
    crash_mid_send(&store, &provider, order(KEY)).await;

    let silent =
        tower::service_fn(|_question: Verify| std::future::pending::<Result<Verified, BoxError>>());
    let layer = layer(&store)
        .verify_takeovers(silent)
        .verify_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let stats = layer.clone();
    let error = stack(layer, &provider)
        .oneshot(order(KEY))
        .await
        .unwrap_err();
    assert_eq!(error.code(), codes::UNVERIFIED);
    assert_eq!(provider.requests().len(), 1, "not sent again");
    assert_eq!(stats.stats().verify_inconclusive, 1);
}
