//! The reconciler: a message the provider already took never goes out twice; one it never
//! took goes once; what the provider cannot tell is left; a live holder is never touched;
//! each pass is bounded and resumes where the last stopped. On MemoryStore with a paused
//! clock, and end to end on real Redis and PostgreSQL.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use support::{message, send};
use tower::{BoxError, Service, ServiceBuilder};
use tower_idempotency::layer::StoredKeys;
use tower_idempotency::outcome::codes;
use tower_idempotency::reconcile::Reconciler;
use tower_idempotency::store::admin::{KeyState, StoreAdmin};
use tower_idempotency::store::{Reservation, Store};
use tower_idempotency::verify::{Verified, Verify};
use tower_idempotency::{
    Fingerprint, IdempotencyLayer, MemoryStore, Message, Outcome, Receipt, SendError,
};

const NAMESPACE: &str = "alerts";
const CLIENT_TIMEOUT: Duration = Duration::from_millis(300);

/// What the fake provider does with the next call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Takes the message, then answers far past the client's timeout.
    TakeThenHang,
    /// Never takes it, and answers far past the client's timeout.
    HangWithoutTaking,
    /// Takes it and answers.
    Answer,
}

/// A provider that deduplicates on the idempotency key like Resend, and can list what it took.
#[derive(Clone)]
struct FakeProvider {
    taken: Arc<Mutex<HashMap<String, String>>>,
    calls: Arc<AtomicUsize>,
    mode: Arc<Mutex<Mode>>,
}

impl FakeProvider {
    fn new(mode: Mode) -> Self {
        Self {
            taken: Arc::default(),
            calls: Arc::default(),
            mode: Arc::new(Mutex::new(mode)),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn set_mode(&self, mode: Mode) {
        *self.mode.lock().expect("mode") = mode;
    }

    /// The id of the message it took under `key`, if any.
    fn lookup(&self, key: &str) -> Option<String> {
        self.taken.lock().expect("taken").get(key).cloned()
    }

    /// A verification service over what it took: by raw key.
    fn verifier(
        &self,
    ) -> impl Service<
        Verify,
        Response = Verified,
        Error = BoxError,
        Future = BoxFuture<'static, Result<Verified, BoxError>>,
    > + Clone {
        let provider = self.clone();
        tower::service_fn(move |question: Verify| {
            let found = question.raw_key.as_deref().map(|k| provider.lookup(k));
            Box::pin(async move {
                Ok(match found {
                    Some(Some(id)) => Verified::Delivered(Receipt::new(id, "fake")),
                    Some(None) => Verified::NotSent,
                    None => Verified::Unknown,
                })
            }) as BoxFuture<'static, _>
        })
    }
}

impl Service<Message> for FakeProvider {
    type Response = Receipt;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Receipt, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, message: Message) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let mode = *self.mode.lock().expect("mode");
        let key = message
            .idempotency_key()
            .map(|k| k.as_str().to_owned())
            .unwrap_or_default();
        let id = if mode == Mode::HangWithoutTaking {
            None
        } else {
            let mut taken = self.taken.lock().expect("taken");
            Some(
                taken
                    .entry(key)
                    .or_insert_with(|| format!("msg-{n}"))
                    .clone(),
            )
        };
        Box::pin(async move {
            if mode != Mode::Answer {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            Ok(Receipt::new(id.unwrap_or_default(), "fake"))
        })
    }
}

fn layer<S: Store + Clone + 'static>(store: S) -> IdempotencyLayer {
    IdempotencyLayer::builder()
        .store(store)
        .namespace(NAMESPACE)
        .build()
        .expect("valid layer")
}

fn keys() -> StoredKeys {
    StoredKeys::new(NAMESPACE, tower_idempotency::layer::KeyForm::Raw).expect("namespace")
}

/// The seed's claim, on any store: a send the provider took but whose outcome is unknown is
/// settled as delivered by the reconciler, and the repeat is replayed with the provider's id.
async fn delivered_claim_never_goes_twice<S>(store: S)
where
    S: StoreAdmin + Store + Clone + 'static,
{
    let provider = FakeProvider::new(Mode::TakeThenHang);
    let mut svc = ServiceBuilder::new()
        .layer(layer(store.clone()))
        .timeout(CLIENT_TIMEOUT)
        .service(provider.clone());
    let first = send(&mut svc, message(Some("order:1"), "hi"))
        .await
        .expect_err("the client times out");
    assert_eq!(first.code(), codes::TIMEOUT);
    let blocked = send(&mut svc, message(Some("order:1"), "hi"))
        .await
        .expect_err("unknown is kept");
    assert!(blocked.is_replayed());
    let id = provider.lookup("order:1").expect("the provider took it");

    let mut reconciler = Reconciler::new(store.clone(), provider.verifier()).stored_keys(keys());
    let report = reconciler.run_once().await;
    assert_eq!((report.checked, report.delivered, report.errors), (1, 1, 0));

    provider.set_mode(Mode::Answer);
    let again = send(&mut svc, message(Some("order:1"), "hi"))
        .await
        .expect("replayed with the provider's receipt");
    assert_eq!(again.id, id);
    assert!(again.replayed);
    assert_eq!(provider.calls(), 1, "the provider was called once");
    // Nothing is left to reconcile.
    assert_eq!(reconciler.run_once().await.checked, 0);
}

#[tokio::test(start_paused = true)]
async fn memory_a_claim_already_delivered_never_goes_out_twice() {
    delivered_claim_never_goes_twice(MemoryStore::new()).await;
}

#[tokio::test(start_paused = true)]
async fn not_sent_frees_the_key_and_the_next_send_goes_once() {
    let store = MemoryStore::new();
    let provider = FakeProvider::new(Mode::HangWithoutTaking);
    let mut svc = ServiceBuilder::new()
        .layer(layer(store.clone()))
        .timeout(CLIENT_TIMEOUT)
        .service(provider.clone());
    send(&mut svc, message(Some("order:2"), "hi"))
        .await
        .expect_err("times out");

    let mut reconciler = Reconciler::new(store.clone(), provider.verifier()).stored_keys(keys());
    let report = reconciler.run_once().await;
    assert_eq!((report.checked, report.not_sent), (1, 1));
    assert!(
        store
            .inspect("alerts:order:2")
            .await
            .expect("inspect")
            .is_none()
    );

    provider.set_mode(Mode::Answer);
    let sent = send(&mut svc, message(Some("order:2"), "hi"))
        .await
        .expect("sent");
    assert!(!sent.replayed);
    let again = send(&mut svc, message(Some("order:2"), "hi"))
        .await
        .expect("replayed");
    assert!(again.replayed);
    assert_eq!(again.id, sent.id);
    assert_eq!(provider.calls(), 2, "the hung call and the one send");
}

#[tokio::test(start_paused = true)]
async fn unknown_and_service_errors_leave_the_key_and_its_stored_error() {
    let store = MemoryStore::new();
    let provider = FakeProvider::new(Mode::TakeThenHang);
    let mut svc = ServiceBuilder::new()
        .layer(layer(store.clone()))
        .timeout(CLIENT_TIMEOUT)
        .service(provider.clone());
    send(&mut svc, message(Some("order:3"), "hi"))
        .await
        .expect_err("times out");

    let unknown = tower::service_fn(|_: Verify| async { Ok::<_, BoxError>(Verified::Unknown) });
    let report = Reconciler::new(store.clone(), unknown).run_once().await;
    assert_eq!(
        (report.checked, report.unknown, report.delivered),
        (1, 1, 0)
    );

    let failing = tower::service_fn(|_: Verify| async {
        Err::<Verified, BoxError>("provider API down".into())
    });
    let report = Reconciler::new(store.clone(), failing).run_once().await;
    assert_eq!((report.checked, report.errors, report.delivered), (1, 1, 0));

    let again = send(&mut svc, message(Some("order:3"), "hi"))
        .await
        .expect_err("the stored error");
    assert!(again.is_replayed());
    assert_eq!(again.code(), codes::TIMEOUT);
    assert_eq!(provider.calls(), 1);
}

/// Keeps a record of unknown delivery under `key`, directly in the store.
async fn keep_unknown(store: &MemoryStore, key: &str, ttl: Duration) {
    let fp = Fingerprint::from_bytes([7; 32]);
    let Reservation::Reserved { token } = store
        .reserve(key, fp, Duration::from_secs(60))
        .await
        .expect("reserve")
    else {
        panic!("{key} was free");
    };
    let timeout = Outcome::failed(SendError::unknown_delivery(codes::TIMEOUT, "timed out"));
    store
        .complete(key, token, fp, &timeout, ttl)
        .await
        .expect("complete");
}

#[tokio::test(start_paused = true)]
async fn a_live_holder_is_never_touched() {
    let store = MemoryStore::new();
    let fp = Fingerprint::from_bytes([9; 32]);
    // A live send: not listed, so never asked about.
    assert!(matches!(
        store
            .reserve("alerts:live", fp, Duration::from_secs(60))
            .await,
        Ok(Reservation::Reserved { .. })
    ));
    // A crashed send whose lease passed: listed; a new send takes the key while the
    // provider is being asked, and the answer must not take it from that send.
    assert!(matches!(
        store
            .reserve("alerts:stale", fp, Duration::from_secs(1))
            .await,
        Ok(Reservation::Reserved { .. })
    ));
    tokio::time::advance(Duration::from_secs(2)).await;

    let asked = Arc::new(Mutex::new(Vec::new()));
    let verify = {
        let store = store.clone();
        let asked = asked.clone();
        tower::service_fn(move |question: Verify| {
            let store = store.clone();
            asked
                .lock()
                .expect("asked")
                .push(question.stored_key.clone());
            async move {
                let taken = store
                    .reserve(&question.stored_key, fp, Duration::from_secs(60))
                    .await?;
                // A takeover of the crashed send's record.
                assert!(matches!(taken, Reservation::TakenOver { .. }), "{taken:?}");
                Ok::<_, BoxError>(Verified::NotSent)
            }
        })
    };
    let report = Reconciler::new(store.clone(), verify).run_once().await;
    assert_eq!(
        *asked.lock().expect("asked"),
        vec!["alerts:stale".to_owned()]
    );
    assert_eq!(
        (report.checked, report.skipped_live, report.not_sent),
        (1, 1, 0)
    );
    for key in ["alerts:live", "alerts:stale"] {
        let record = store.inspect(key).await.expect("inspect").expect("kept");
        assert_eq!(record.state, KeyState::Pending, "{key}");
        assert!(record.is_held_live(), "{key}");
    }
}

#[tokio::test(start_paused = true)]
async fn each_pass_is_bounded_resumes_and_wraps_around() {
    let store = MemoryStore::new();
    for n in 1..=5u64 {
        keep_unknown(
            &store,
            &format!("alerts:k{n}"),
            Duration::from_secs(3600 + n),
        )
        .await;
    }
    let asked = Arc::new(Mutex::new(Vec::new()));
    let verify = {
        let asked = asked.clone();
        tower::service_fn(move |question: Verify| {
            asked.lock().expect("asked").push(question.stored_key);
            async { Ok::<_, BoxError>(Verified::Unknown) }
        })
    };
    let mut reconciler = Reconciler::new(store.clone(), verify)
        .max_keys_per_pass(2)
        .page_size(1);
    let checked: Vec<u64> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(reconciler.run_once().await.checked);
        }
        v
    };
    assert_eq!(checked, vec![2, 2, 1, 2]);
    let asked = asked.lock().expect("asked").clone();
    let expected: Vec<String> = [1, 2, 3, 4, 5, 1, 2]
        .iter()
        .map(|n| format!("alerts:k{n}"))
        .collect();
    assert_eq!(
        asked, expected,
        "oldest first, resumed, then from the oldest again"
    );
    assert_eq!(reconciler.counters().passes(), 4);
    assert_eq!(reconciler.counters().totals().unknown, 7);
}

#[tokio::test(start_paused = true)]
async fn settling_passes_walk_every_key_once() {
    let store = MemoryStore::new();
    for n in 1..=5u64 {
        keep_unknown(
            &store,
            &format!("alerts:k{n}"),
            Duration::from_secs(3600 + n),
        )
        .await;
    }
    let verify = tower::service_fn(|question: Verify| async move {
        Ok::<_, BoxError>(Verified::Delivered(Receipt::new(
            format!("id-{}", question.raw_key.unwrap_or_default()),
            "fake",
        )))
    });
    let mut reconciler = Reconciler::new(store.clone(), verify)
        .stored_keys(keys())
        .max_keys_per_pass(2);
    let delivered: Vec<u64> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(reconciler.run_once().await.delivered);
        }
        v
    };
    assert_eq!(delivered, vec![2, 2, 1, 0]);
    let record = store
        .inspect("alerts:k3")
        .await
        .expect("inspect")
        .expect("kept");
    let id = record
        .outcome
        .and_then(|o| o.receipt().map(|r| r.id.clone()));
    assert_eq!(id.as_deref(), Some("id-k3"));
}

#[tokio::test(start_paused = true)]
async fn run_stops_on_shutdown() {
    let store = MemoryStore::new();
    keep_unknown(&store, "alerts:k1", Duration::from_secs(3600)).await;
    let verify = tower::service_fn(|_: Verify| async { Ok::<_, BoxError>(Verified::NotSent) });
    let reconciler = Reconciler::new(store.clone(), verify);
    let counters = reconciler.counters();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(reconciler.run(Duration::from_secs(10), async move {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(counters.passes(), 3, "at 0 s, 10 s and 20 s");
    assert_eq!(counters.totals().not_sent, 1);
    stop.send(()).expect("the task listens");
    task.await.expect("the reconciler stops");
}

#[cfg(feature = "redis")]
#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn redis_a_claim_already_delivered_never_goes_out_twice() {
    use support::stores::{backend_url, unique_prefix};
    use tower_idempotency::store::redis::RedisStore;
    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let store = RedisStore::connect(&url)
        .await
        .expect("connect")
        .key_prefix(unique_prefix("reconcile"));
    delivered_claim_never_goes_twice(store).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
#[cfg_attr(
    not(backend_postgres),
    ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
)]
async fn postgres_a_claim_already_delivered_never_goes_out_twice() {
    use support::stores::postgres_admin::admin;
    use support::stores::{backend_url, unique};
    use tower_idempotency::store::postgres::PostgresStore;
    let Some(url) = backend_url("DATABASE_URL") else {
        return;
    };
    let store = PostgresStore::connect(&url)
        .await
        .expect("connect")
        .table(&unique("reconcile"))
        .expect("valid table name");
    store.migrate().await.expect("migrate");
    delivered_claim_never_goes_twice(store.clone()).await;
    let sql = format!("DROP TABLE IF EXISTS \"{}\"", store.table_name());
    admin(&url).await.batch_execute(&sql).await.expect("drop");
}

#[tokio::test(start_paused = true)]
async fn hashed_keys_are_matched_by_hashing_the_providers_keys() {
    use tower_idempotency::layer::KeyForm;
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace(NAMESPACE)
        .key_form(KeyForm::Hashed)
        .build()
        .expect("valid layer");
    let keys = layer.stored_keys();
    let provider = FakeProvider::new(Mode::TakeThenHang);
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .timeout(CLIENT_TIMEOUT)
        .service(provider.clone());
    send(&mut svc, message(Some("order:7:seller@example.com"), "hi"))
        .await
        .expect_err("times out");

    // The service is told only the stored key, and hashes what the provider lists.
    let verify = {
        let (provider, keys) = (provider.clone(), keys.clone());
        tower::service_fn(move |question: Verify| {
            assert_eq!(
                question.raw_key, None,
                "a hashed store never knew the raw key"
            );
            let taken = provider.taken.lock().expect("taken").clone();
            let found = taken.into_iter().find(|(key, _)| {
                keys.of(key).ok().as_deref() == Some(question.stored_key.as_str())
            });
            async move {
                Ok::<_, BoxError>(match found {
                    Some((_, id)) => Verified::Delivered(Receipt::new(id, "fake")),
                    None => Verified::NotSent,
                })
            }
        })
    };
    let report = Reconciler::new(store.clone(), verify)
        .stored_keys(keys)
        .run_once()
        .await;
    assert_eq!((report.checked, report.delivered), (1, 1));

    provider.set_mode(Mode::Answer);
    let again = send(&mut svc, message(Some("order:7:seller@example.com"), "hi"))
        .await
        .expect("replayed");
    assert!(again.replayed);
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn events_name_keys_by_hash_never_by_key() {
    use sha2::{Digest, Sha256};
    let store = MemoryStore::new();
    keep_unknown(
        &store,
        "alerts:order:9:seller@example.com",
        Duration::from_secs(3600),
    )
    .await;
    let (captured, _guard) = support::capture();
    let verify = tower::service_fn(|_: Verify| async {
        Ok::<_, BoxError>(Verified::Delivered(Receipt::new("msg_9", "fake")))
    });
    let mut reconciler = Reconciler::new(store, verify);
    assert_eq!(reconciler.run_once().await.delivered, 1);

    let digest = Sha256::digest(b"alerts:order:9:seller@example.com");
    let hash: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    let lines = captured.lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("key settled") && l.contains(&hash)),
        "{lines:?}"
    );
    assert!(
        lines.iter().all(|l| !l.contains("seller@example.com")),
        "{lines:?}"
    );
}

/// A verification service that cannot take questions.
#[derive(Clone)]
struct Broken;

impl Service<Verify> for Broken {
    type Response = Verified;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Verified, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Err("closed".into()))
    }

    fn call(&mut self, _: Verify) -> Self::Future {
        panic!("called without being ready")
    }
}

#[tokio::test(start_paused = true)]
async fn a_service_that_is_not_ready_is_not_asked_and_the_pass_stops() {
    let store = MemoryStore::new();
    for n in 1..=3u64 {
        keep_unknown(
            &store,
            &format!("alerts:k{n}"),
            Duration::from_secs(3600 + n),
        )
        .await;
    }
    let report = Reconciler::new(store.clone(), Broken).run_once().await;
    assert_eq!((report.checked, report.errors), (0, 1));
    assert_eq!(store.list(None, 10).await.expect("list").entries.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_record_replaced_while_the_provider_is_asked_is_left() {
    use tower_idempotency::store::admin::Force;
    let store = MemoryStore::new();
    keep_unknown(&store, "alerts:k1", Duration::from_secs(3600)).await;
    // While the provider is asked, the record goes and a new send delivers under the key.
    let verify = {
        let store = store.clone();
        tower::service_fn(move |question: Verify| {
            let store = store.clone();
            async move {
                let key = question.stored_key;
                store.forget(&key, Force::Yes).await?;
                let fp = Fingerprint::from_bytes([8; 32]);
                let Reservation::Reserved { token } =
                    store.reserve(&key, fp, Duration::from_secs(60)).await?
                else {
                    return Err::<Verified, BoxError>("the key was not free".into());
                };
                let sent = Outcome::sent(Receipt::new("msg_new", "fake"));
                store
                    .complete(&key, token, fp, &sent, Duration::from_secs(3600))
                    .await?;
                Ok(Verified::NotSent)
            }
        })
    };
    let report = Reconciler::new(store.clone(), verify).run_once().await;
    assert_eq!((report.checked, report.not_sent, report.errors), (1, 0, 0));
    let record = store
        .inspect("alerts:k1")
        .await
        .expect("inspect")
        .expect("kept");
    let id = record
        .outcome
        .and_then(|o| o.receipt().map(|r| r.id.clone()));
    assert_eq!(
        id.as_deref(),
        Some("msg_new"),
        "the new send's receipt is kept"
    );
}

#[test]
fn a_question_about_a_key_without_a_listed_record_reads_as_stale() {
    let question = Verify::for_key(
        "alerts:order:1",
        Some("order:1".to_owned()),
        Fingerprint::from_bytes([3; 32]),
    );
    assert_eq!(question.stored_key, "alerts:order:1");
    assert_eq!(question.raw_key.as_deref(), Some("order:1"));
    assert!(question.record.is_stale());
    assert!(!question.record.is_held_live());
}
