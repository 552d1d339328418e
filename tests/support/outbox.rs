//! What the outbox tests share, on either database: messages, a provider that counts its
//! calls per key, a gate that holds sends in flight, a bounded wait, and a worker's run.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::sync::{Notify, Semaphore, oneshot};
use tower::ServiceExt;

use tower_idempotency::outbox::{Worker, WorkerStats};
use tower_idempotency::{BoxError, Message, Receipt, SendError};

pub fn message(key: &str) -> Message {
    Message::builder()
        .from("orders@shop.example")
        .to("seller@example.com")
        .subject("New order")
        .text(format!("{key} sold."))
        .idempotency_key(key)
        .build()
        .expect("valid message")
}

/// How a test provider answers a key.
pub type Answer = dyn Fn(&str) -> Result<Receipt, SendError> + Send + Sync;

/// A provider that counts its calls per key and answers by `answer`.
#[derive(Clone)]
pub struct Provider {
    pub calls: Arc<Mutex<HashMap<String, usize>>>,
    pub answer: Arc<Answer>,
}

impl Provider {
    pub fn ok() -> Self {
        Self::answering(|key| Ok(Receipt::new(format!("id-{key}"), "fake")))
    }

    pub fn answering(
        answer: impl Fn(&str) -> Result<Receipt, SendError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            calls: Arc::default(),
            answer: Arc::new(answer),
        }
    }

    pub fn calls(&self, key: &str) -> usize {
        self.calls.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.calls.lock().unwrap().values().sum()
    }

    pub fn service(
        &self,
    ) -> impl tower::Service<
        Message,
        Response = Receipt,
        Error = BoxError,
        Future = BoxFuture<'static, Result<Receipt, BoxError>>,
    > + Clone
    + Send
    + 'static {
        let provider = self.clone();
        tower::service_fn(move |m: Message| {
            let key = m
                .idempotency_key()
                .map(|k| k.as_str().to_owned())
                .unwrap_or_default();
            *provider
                .calls
                .lock()
                .unwrap()
                .entry(key.clone())
                .or_default() += 1;
            let answer = (provider.answer)(&key).map_err(BoxError::from);
            async move { answer }.boxed()
        })
    }
}

/// Waits until `condition` holds on the outbox, polling it; fails after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let waited = tokio::time::timeout(limit, async {
        while !condition().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "the condition did not hold within {limit:?}"
    );
}

/// A worker's run, and the switch that stops it.
pub struct Running {
    pub stop: oneshot::Sender<()>,
    pub task: tokio::task::JoinHandle<WorkerStats>,
}

impl Running {
    pub async fn stop(self) -> WorkerStats {
        let _ = self.stop.send(());
        self.task.await.expect("the worker does not panic")
    }
}

pub fn start<S>(worker: Worker<S>) -> Running
where
    S: tower::Service<Message, Response = Receipt> + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        worker
            .run(async {
                let _ = stopped.await;
            })
            .await
            .expect("the worker runs")
    });
    Running { stop, task }
}

/// A stack in front of `provider` whose sends each wait for a permit of `gate`, and that
/// counts the sends in flight: `peak` is the most at once, and `reached` fires once `n` are.
#[derive(Clone)]
pub struct Gated {
    pub gate: Arc<Semaphore>,
    pub in_flight: Arc<AtomicUsize>,
    pub peak: Arc<AtomicUsize>,
    pub reached: Arc<Notify>,
}

impl Gated {
    pub fn new() -> Self {
        Self {
            gate: Arc::new(Semaphore::new(0)),
            in_flight: Arc::default(),
            peak: Arc::default(),
            reached: Arc::default(),
        }
    }

    pub fn service(
        &self,
        provider: &Provider,
        n: usize,
    ) -> impl tower::Service<
        Message,
        Response = Receipt,
        Error = BoxError,
        Future = BoxFuture<'static, Result<Receipt, BoxError>>,
    > + Clone
    + Send
    + 'static {
        let (gated, inner) = (self.clone(), provider.service());
        tower::service_fn(move |m: Message| {
            let (gated, inner) = (gated.clone(), inner.clone());
            async move {
                let now = gated.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                gated.peak.fetch_max(now, Ordering::SeqCst);
                if now == n {
                    gated.reached.notify_one();
                }
                gated.gate.acquire().await.expect("never closed").forget();
                gated.in_flight.fetch_sub(1, Ordering::SeqCst);
                inner.oneshot(m).await
            }
            .boxed()
        })
    }
}

/// The cases both databases run, on an outbox whose rows the test enqueued (one committed
/// transaction); each test reads its own rows around the outbox afterwards where it needs to.
pub mod cases {
    use super::*;
    use tower_idempotency::outbox::Outbox;

    /// Four workers drain the rows of `keys` (a thousand): each is sent exactly once.
    pub async fn four_workers_send_each_message_once(outbox: &Outbox, keys: &[String]) {
        let provider = Provider::ok();
        let workers: Vec<Running> = (0..4)
            .map(|_| {
                start(
                    outbox
                        .worker(provider.service())
                        .batch(25)
                        .poll_interval(Duration::from_millis(20)),
                )
            })
            .collect();
        let total = keys.len() as u64;
        eventually(Duration::from_secs(60), || async {
            outbox.counts().await.unwrap().done == total
        })
        .await;
        let mut sent = 0;
        for worker in workers {
            sent += worker.stop().await.sent;
        }
        assert_eq!(sent, total);
        let calls = provider.calls.lock().unwrap().clone();
        assert_eq!(calls.len(), keys.len());
        assert!(calls.values().all(|&n| n == 1), "a message went twice");
    }

    /// A worker whose stack never answers is killed holding the row of `key`: the row goes
    /// to the next worker once the claim passes, not before.
    pub async fn a_killed_workers_row_goes_once_its_claim_passes(outbox: &Outbox, key: &str) {
        let provider = Provider::ok();
        // A stack that never gets to the provider: the process dies first.
        let stalled =
            tower::service_fn(|_m: Message| std::future::pending::<Result<Receipt, BoxError>>());
        let doomed = outbox
            .worker(stalled)
            .claim_lease(Duration::from_millis(300));
        let doomed_stats = doomed.stats();
        let doomed = tokio::spawn(doomed.run(std::future::pending()));
        eventually(Duration::from_secs(5), || async {
            doomed_stats.get().claimed == 1
        })
        .await;
        doomed.abort(); // killed: no release, no answer
        let _ = doomed.await;

        // Within the lease, nobody takes the row.
        let early = outbox
            .worker(provider.service())
            .poll_interval(Duration::from_millis(5))
            .run(tokio::time::sleep(Duration::from_millis(50)))
            .await
            .unwrap();
        assert_eq!(early.claimed, 0, "the claim still holds the row");

        let next = start(
            outbox
                .worker(provider.service())
                .poll_interval(Duration::from_millis(20)),
        );
        eventually(Duration::from_secs(5), || async {
            outbox.counts().await.unwrap().done == 1
        })
        .await;
        next.stop().await;
        assert_eq!(provider.calls(key), 1);
    }

    /// A worker told to stop with two sends in hand and four rows queued (of the ten of
    /// `keys`) lets the two answer and puts the four back, which the next worker sends at
    /// once, each message once.
    pub async fn a_stopped_worker_puts_back_the_rows_it_did_not_start(
        outbox: &Outbox,
        keys: &[String],
    ) {
        assert_eq!(keys.len(), 10);
        let provider = Provider::ok();
        let gated = Gated::new();
        // The stack takes two sends at a time: of the six rows the worker claims, four wait
        // for it to be ready.
        let stack = tower::ServiceBuilder::new()
            .concurrency_limit(2)
            .service(gated.service(&provider, 2));
        let worker = outbox
            .worker(stack)
            .concurrency(6)
            .batch(6)
            .claim_lease(Duration::from_secs(3600));
        let stats_handle = worker.stats();
        let worker = start(worker);
        tokio::time::timeout(Duration::from_secs(5), gated.reached.notified())
            .await
            .expect("two sends in flight");
        eventually(Duration::from_secs(5), || async {
            stats_handle.get().claimed == 6
        })
        .await;
        // The stop is asked while two sends are in hand; then their provider answers.
        let Running { stop, task } = worker;
        let _ = stop.send(());
        gated.gate.add_permits(2);
        let stats = task.await.unwrap();
        assert_eq!((stats.claimed, stats.sent, stats.released), (6, 2, 4));
        let counts = outbox.counts().await.unwrap();
        assert_eq!((counts.done, counts.waiting), (2, 8));

        // The four put back go at once, without waiting for the hour-long claim.
        let next = start(
            outbox
                .worker(provider.service())
                .poll_interval(Duration::from_millis(20)),
        );
        eventually(Duration::from_secs(5), || async {
            outbox.counts().await.unwrap().done == 10
        })
        .await;
        next.stop().await;
        assert!(
            keys.iter().all(|key| provider.calls(key) == 1),
            "nothing went twice"
        );
    }
}
