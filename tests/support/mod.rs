//! What the integration tests share, one module per area. Here: messages, a counting
//! provider and a batch one, a store wrapper that counts calls and fails on command, a
//! tracing capture and a bounded wait. [`stores`]: the backend tests' servers and admin
//! connections. [`probe`]: which servers and server binaries this machine has (read by
//! build.rs too).
//! [`servers`]: servers of the tests' own, for the tests that kill connections.
//! [`http`]: the one fake HTTP provider and the real clients. [`python`]: the Python fakes of
//! SES (moto) and SMTP (aiosmtpd).
//!
//! [`claims`]: claim-then-send's message, layer and send, for every store.
//! [`sqlx_transactions`]: claims and outbox messages in the caller's sqlx transaction, one
//! suite for every database.
//!
//! Every test binary declares `mod support;` and uses the part it needs.
// Each binary uses a part of this module; the rest would be dead code in that binary.
#![allow(dead_code)]

pub mod claims;
#[cfg(feature = "http")]
pub mod http;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod outbox;
pub mod probe;
#[cfg(any(feature = "ses", feature = "smtp"))]
pub mod python;
#[cfg(feature = "redis")]
pub mod replicated;
pub mod servers;
#[cfg(feature = "sqlx")]
pub mod sqlx_transactions;
pub mod stores;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::sync::Semaphore;
use tower_idempotency::batch::{Batch, BatchOutcomes};
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::Outcome;
use tower_idempotency::store::{Reservation, Store, StoreError, StoreErrorKind, Token};
use tower_idempotency::{BoxError, MemoryStore, Message, Receipt, SendError};
use tower_resilience_circuitbreaker::CircuitBreakerError;

/// A message to `to` with `text`, under `key` when given.
pub fn message(key: Option<&str>, text: &str) -> Message {
    let b = Message::builder()
        .from("shop@example.com")
        .to("seller@example.com")
        .subject("New order")
        .text(text);
    match key {
        Some(k) => b.idempotency_key(k),
        None => b,
    }
    .build()
    .expect("valid test message")
}

type Answer =
    dyn Fn(usize, &Message) -> BoxFuture<'static, Result<Receipt, BoxError>> + Send + Sync;

/// A provider that counts its calls and answers by a script.
#[derive(Clone)]
pub struct Provider {
    pub calls: Arc<AtomicUsize>,
    answer: Arc<Answer>,
}

impl Provider {
    /// Answers every call with a receipt `msg-<n>`.
    pub fn ok() -> Self {
        Self::answering(|n, _| async move { Ok(Receipt::new(format!("msg-{n}"), "fake")) })
    }

    /// Answers call `n` (from 1) with `f(n, message)`.
    pub fn answering<F, Fut>(f: F) -> Self
    where
        F: Fn(usize, &Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Receipt, BoxError>> + Send + 'static,
    {
        Self {
            calls: Arc::new(AtomicUsize::new(0)),
            answer: Arc::new(move |n, m| f(n, m).boxed()),
        }
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl tower::Service<Message> for Provider {
    type Response = Receipt;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Receipt, BoxError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, m: Message) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        (self.answer)(n, &m)
    }
}

type Script = Arc<dyn Fn(&[Message]) -> Result<BatchOutcomes, BoxError> + Send + Sync>;

/// A batch provider that records every batch it gets (as texts) and answers by a script.
#[derive(Clone)]
pub struct BatchProvider {
    seen: Arc<Mutex<Vec<Vec<String>>>>,
    script: Script,
}

impl BatchProvider {
    /// Answers every message with a receipt `id-<text>`.
    pub fn ok() -> Self {
        Self::answering(|batch| {
            Ok(batch
                .iter()
                .map(|m| {
                    Ok(Receipt::new(
                        format!("id-{}", m.text().unwrap_or_default()),
                        "bulk",
                    ))
                })
                .collect())
        })
    }

    /// Answers every batch with `f(messages)`.
    pub fn answering(
        f: impl Fn(&[Message]) -> Result<BatchOutcomes, BoxError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            seen: Arc::default(),
            script: Arc::new(f),
        }
    }

    /// The batches it got, as the texts of their messages, in order.
    pub fn batches(&self) -> Vec<Vec<String>> {
        self.seen.lock().unwrap().clone()
    }
}

impl tower::Service<Batch> for BatchProvider {
    type Response = BatchOutcomes;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<BatchOutcomes, BoxError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, batch: Batch) -> Self::Future {
        let texts = batch
            .iter()
            .map(|m| m.text().unwrap_or_default().to_owned())
            .collect();
        self.seen.lock().unwrap().push(texts);
        let answer = (self.script)(batch.as_slice());
        std::future::ready(answer).boxed()
    }
}

/// A circuit breaker's open circuit means "not sent": maps it to the error the layer frees the
/// key on.
pub fn breaker_error(e: CircuitBreakerError<BoxError>) -> BoxError {
    match e {
        CircuitBreakerError::OpenCircuit => SendError::circuit_open().into(),
        CircuitBreakerError::Inner(e) => e,
    }
}

/// Wraps a [`MemoryStore`]: counts calls, fails on command, and can hold reserves at a gate.
#[derive(Clone, Default)]
pub struct TestStore {
    pub inner: MemoryStore,
    pub reserves: Arc<AtomicUsize>,
    /// Calls of `reserve` or `reserve_many` the store has answered (past the gate, if one is
    /// closed).
    pub reserves_answered: Arc<AtomicUsize>,
    pub completes: Arc<AtomicUsize>,
    pub releases: Arc<AtomicUsize>,
    /// Calls of the batch operations.
    pub reserve_many_calls: Arc<AtomicUsize>,
    pub complete_many_calls: Arc<AtomicUsize>,
    pub release_many_calls: Arc<AtomicUsize>,
    pub fail_reserve: Arc<AtomicBool>,
    pub fail_complete: Arc<AtomicBool>,
    pub fail_release: Arc<AtomicBool>,
    /// Calls of `extend`.
    pub extends: Arc<AtomicUsize>,
    /// When set, `extend` fails as unavailable.
    pub fail_extend: Arc<AtomicBool>,
    /// When set, `extend` answers `Unsupported`, as a store that keeps the trait's default.
    pub extend_unsupported: Arc<AtomicBool>,
    /// The next this many calls of complete, complete_many, release or release_many fail as
    /// unavailable (a dropped connection), then the store answers again.
    pub fail_next_settlements: Arc<AtomicUsize>,
    /// When set, complete answers a corrupt-record error, which retrying cannot mend.
    pub corrupt_complete: Arc<AtomicBool>,
    /// When set, `complete_now` answers unavailable, as a store that answers at once and
    /// fails; otherwise it answers `None`, as every other call here goes through the futures.
    pub fail_complete_now: Arc<AtomicBool>,
    /// When set, calls of `reserve` and `reserve_many` wait for a permit, one a call.
    pub gate: Arc<Mutex<Option<Arc<Semaphore>>>>,
    /// When set, reserve answers this record instead of asking the inner store.
    pub forced: Arc<Mutex<Option<Reservation>>>,
    /// The bound the store says it keeps on its calls (`Store::call_timeout`); it keeps
    /// none, so a gated reserve past it shows whether the layer trusted it.
    pub call_timeout: Option<Duration>,
}

impl TestStore {
    pub fn extends(&self) -> usize {
        self.extends.load(Ordering::SeqCst)
    }

    pub fn total_calls(&self) -> usize {
        self.reserves.load(Ordering::SeqCst)
            + self.completes.load(Ordering::SeqCst)
            + self.releases.load(Ordering::SeqCst)
    }

    /// Calls of `reserve` and `reserve_many` made, answered or not.
    pub fn reserve_calls(&self) -> usize {
        self.reserves.load(Ordering::SeqCst) + self.reserve_many_calls.load(Ordering::SeqCst)
    }

    /// Makes calls of `reserve` and `reserve_many` wait until a permit is added to the
    /// returned semaphore.
    pub fn close_gate(&self) -> Arc<Semaphore> {
        let gate = Arc::new(Semaphore::new(0));
        *self.gate.lock().unwrap() = Some(Arc::clone(&gate));
        gate
    }
}

fn failure() -> StoreError {
    StoreError::unavailable(std::io::Error::other("injected store failure"))
}

impl TestStore {
    /// Whether this settlement call fails: always while `flag` is set, or while failures
    /// were asked for the next settlements (one is used up).
    fn settlement_fails(&self, flag: &AtomicBool) -> bool {
        flag.load(Ordering::SeqCst)
            || self
                .fail_next_settlements
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
    }
}

impl Store for TestStore {
    fn call_timeout(&self) -> Option<Duration> {
        self.call_timeout
    }

    fn reserve<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        async move {
            self.reserves.fetch_add(1, Ordering::SeqCst);
            let gate = self.gate.lock().unwrap().clone();
            if let Some(gate) = gate {
                gate.acquire().await.expect("gate open").forget();
            }
            let answer = if self.fail_reserve.load(Ordering::SeqCst) {
                Err(failure())
            } else if let Some(forced) = self.forced.lock().unwrap().clone() {
                Ok(forced)
            } else {
                self.inner.reserve(key, fingerprint, lease).await
            };
            self.reserves_answered.fetch_add(1, Ordering::SeqCst);
            answer
        }
        .boxed()
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        async move {
            self.completes.fetch_add(1, Ordering::SeqCst);
            if self.corrupt_complete.load(Ordering::SeqCst) {
                return Err(StoreError::corrupt("injected corrupt record"));
            }
            if self.settlement_fails(&self.fail_complete) {
                return Err(failure());
            }
            self.inner
                .complete(key, token, fingerprint, outcome, ttl)
                .await
        }
        .boxed()
    }

    fn complete_now(
        &self,
        _key: &Arc<str>,
        _token: Token,
        _fingerprint: Fingerprint,
        _outcome: &Outcome,
        _ttl: Duration,
    ) -> Option<Result<bool, StoreError>> {
        self.fail_complete_now
            .load(Ordering::SeqCst)
            .then(|| Err(failure()))
    }

    fn reserve_many<'a>(
        &'a self,
        requests: &'a [(&'a str, Fingerprint)],
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<Result<Reservation, StoreError>>, StoreError>> {
        async move {
            self.reserve_many_calls.fetch_add(1, Ordering::SeqCst);
            let gate = self.gate.lock().unwrap().clone();
            if let Some(gate) = gate {
                gate.acquire().await.expect("gate open").forget();
            }
            let answer = if self.fail_reserve.load(Ordering::SeqCst) {
                Err(failure())
            } else {
                self.inner.reserve_many(requests, lease).await
            };
            self.reserves_answered.fetch_add(1, Ordering::SeqCst);
            answer
        }
        .boxed()
    }

    fn complete_many<'a>(
        &'a self,
        completions: &'a [tower_idempotency::store::Completion<'a>],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        async move {
            self.complete_many_calls.fetch_add(1, Ordering::SeqCst);
            if self.settlement_fails(&self.fail_complete) {
                return Err(failure());
            }
            self.inner.complete_many(completions, ttl).await
        }
        .boxed()
    }

    fn release_many<'a>(
        &'a self,
        releases: &'a [(&'a str, Token)],
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        async move {
            self.release_many_calls.fetch_add(1, Ordering::SeqCst);
            if self.settlement_fails(&self.fail_release) {
                return Err(failure());
            }
            self.inner.release_many(releases).await
        }
        .boxed()
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        async move {
            self.extends.fetch_add(1, Ordering::SeqCst);
            if self.extend_unsupported.load(Ordering::SeqCst) {
                return Err(StoreError::new(
                    StoreErrorKind::Unsupported,
                    "this store cannot extend a lease",
                ));
            }
            if self.fail_extend.load(Ordering::SeqCst) {
                return Err(failure());
            }
            self.inner.extend(key, token, lease).await
        }
        .boxed()
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        async move {
            self.releases.fetch_add(1, Ordering::SeqCst);
            if self.settlement_fails(&self.fail_release) {
                return Err(failure());
            }
            self.inner.release(key, token).await
        }
        .boxed()
    }
}

/// Captures the tracing events emitted on this thread as `LEVEL fields` lines.
#[derive(Clone, Default)]
pub struct Captured(pub Arc<Mutex<Vec<String>>>);

impl Captured {
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

thread_local! {
    static SINK: std::cell::RefCell<Option<Captured>> = const { std::cell::RefCell::new(None) };
}

/// One global subscriber, installed once, that hands each event to the capture of the thread
/// that emitted it. (A per-test `set_default` races with tracing's callsite interest cache
/// when tests run in parallel and loses events.)
struct ThreadSink;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ThreadSink {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!(" {}={:?}", field.name(), value));
            }
        }
        SINK.with(|sink| {
            if let Some(captured) = &*sink.borrow() {
                let mut fields = Fields(format!("{}", event.metadata().level()));
                event.record(&mut fields);
                captured.0.lock().unwrap().push(fields.0);
            }
        });
    }
}

/// Stops capturing on this thread when dropped.
pub struct CaptureGuard;

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        SINK.with(|sink| sink.borrow_mut().take());
    }
}

/// Captures the events of this thread (a current-thread tokio test runs its tasks here) until
/// the guard drops.
pub fn capture() -> (Captured, CaptureGuard) {
    use tracing_subscriber::layer::SubscriberExt;
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::registry().with(ThreadSink);
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
    // A callsite first hit by another test while the subscriber was being installed can
    // keep the interest it had with none (never): tracing rebuilds the callsites it knows of
    // when a subscriber is set, and one registering at that moment can miss the rebuild.
    // Rebuilding again, with the subscriber surely in place, makes every event count.
    tracing::callsite::rebuild_interest_cache();
    let captured = Captured::default();
    SINK.with(|sink| *sink.borrow_mut() = Some(captured.clone()));
    (captured, CaptureGuard)
}

/// An SMS from a number to a number, with `text`.
pub fn sms(text: &str) -> Message {
    Message::sms()
        .from_number("+14155552345")
        .to("+15558675310")
        .text(text)
        .build()
        .unwrap()
}

/// A provider that notes the key of every message it is given.
#[derive(Clone, Default)]
pub struct SendLog(Arc<Mutex<Vec<String>>>);

impl SendLog {
    /// A provider that answers every call with a receipt and notes its message's key.
    pub fn provider(&self) -> Provider {
        let sent = self.0.clone();
        Provider::answering(move |n, m| {
            let key = m
                .idempotency_key()
                .map(|k| k.as_str().to_owned())
                .unwrap_or_default();
            sent.lock().expect("not poisoned").push(key);
            async move { Ok(Receipt::new(format!("msg-{n}"), "fake")) }
        })
    }

    /// How many times each key was sent.
    pub fn per_key(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for key in self.0.lock().expect("not poisoned").iter() {
            *counts.entry(key.clone()).or_insert(0) += 1;
        }
        counts
    }

    /// The sends beyond each key's first.
    pub fn extra(&self) -> usize {
        self.per_key().values().map(|n| n - 1).sum()
    }
}

/// Sends `m` through `service` once it is ready, as a caller of the layer does.
pub async fn send<S>(service: &mut S, m: Message) -> Result<Receipt, SendError>
where
    S: tower::Service<Message, Response = Receipt, Error = SendError>,
{
    use tower::ServiceExt;
    service.ready().await?.call(m).await
}

/// Sends `messages` as one batch through `service` once it is ready; the batch's outcomes.
pub async fn send_batch<S>(service: &mut S, messages: Vec<Message>) -> BatchOutcomes
where
    S: tower::Service<Batch, Response = BatchOutcomes, Error = SendError>,
{
    use tower::ServiceExt;
    ServiceExt::<Batch>::ready(service)
        .await
        .expect("the service becomes ready")
        .call(Batch::from(messages))
        .await
        .expect("a batch call fails only when the service is not ready")
}

/// How often [`poll_until`] asks: it only spaces the questions, nothing waits on its length.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Asks `condition` every [`POLL_INTERVAL`] until it holds; fails the test, saying `what`,
/// after `limit` instead of hanging it. For a state a real server or process decides (a
/// lease passing by the store's clock, a row purged, a replica caught up): the test asks for
/// the state itself rather than sleeping for as long as it should take.
pub async fn poll_until<F, Fut>(what: &str, limit: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let polled = tokio::time::timeout(limit, async {
        while !condition().await {
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    })
    .await;
    assert!(polled.is_ok(), "{what}: not within {limit:?}");
}

/// Yields until `condition` holds; fails the test after 5 s instead of hanging it.
pub async fn wait_until(mut condition: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        while !condition() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(waited.is_ok(), "the condition did not hold within 5 s");
}
