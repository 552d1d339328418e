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
