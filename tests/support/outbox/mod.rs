//! The outbox's behaviour, one suite every database runs (the [`cases`], through
//! [`outbox_suite!`] and a [`Database`] of the test file's), and what its cases share:
//! messages, a provider that counts its calls per key, a gate that holds sends in flight,
//! and a worker's run.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::sync::{Notify, Semaphore, oneshot};
use tower::ServiceExt;

use super::poll_until;
use super::stores::{backend_url, unique};
use tower_idempotency::outbox::{Enqueued, Outbox, OutboxCounts, Worker, WorkerStats};
use tower_idempotency::store::StoreError;
use tower_idempotency::{BoxError, Message, Receipt, SendError};

pub mod cases;

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

/// One database's side of the [`cases`]: the caller's transaction, and the reads that go
/// around the outbox. Each test file implements it for its database and runs the suite with
/// [`outbox_suite!`].
pub trait Database {
    /// The variable that names the server's URL (see [`backend_url`]).
    const URL_VAR: &'static str;

    /// Enqueues `messages` in one transaction of the caller's, then commits it, or rolls it
    /// back; the answer to each enqueue, in order.
    async fn enqueue_in_transaction(
        url: &str,
        outbox: &Outbox,
        messages: &[Message],
        commit: bool,
    ) -> Vec<Result<Enqueued, StoreError>>;

    /// Every row, read around the outbox, in the order enqueued.
    async fn rows(url: &str, outbox: &Outbox) -> Vec<Row>;

    /// Drops the test's own `table`, as its last step.
    async fn drop_table(url: &str, table: &str);
}

/// A row as the database holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub key: String,
    pub state: String,
    pub attempts: i32,
    pub provider_id: Option<String>,
    /// Its next attempt is at least 59 minutes away: a `Retry-After` of an hour holds it.
    pub held_an_hour: bool,
}

/// A fresh outbox table of the test's own on database `D`, migrated.
pub struct Table<D> {
    pub url: String,
    pub outbox: Outbox,
    database: PhantomData<D>,
}

impl<D: Database> Table<D> {
    /// See [`backend_url`] for the `Option`.
    pub async fn fresh() -> Option<Self> {
        let url = backend_url(D::URL_VAR)?;
        let outbox = Outbox::connect(&url)
            .await
            .expect("connect")
            .table(&unique("outbox"))
            .expect("valid table name");
        outbox.migrate().await.expect("migrate");
        Some(Self {
            url,
            outbox,
            database: PhantomData,
        })
    }

    /// Enqueues a message for each of `keys` in one committed transaction.
    pub async fn enqueue(&self, keys: impl IntoIterator<Item = String>) {
        let messages: Vec<Message> = keys.into_iter().map(|key| message(&key)).collect();
        self.enqueue_messages(&messages).await;
    }

    /// Enqueues `messages` in one committed transaction.
    pub async fn enqueue_messages(&self, messages: &[Message]) {
        for answer in D::enqueue_in_transaction(&self.url, &self.outbox, messages, true).await {
            answer.expect("enqueue");
        }
    }

    /// A worker on this table that polls every few milliseconds, so a case never waits
    /// long for rows that no notification announces.
    pub fn worker<S>(&self, stack: S) -> Worker<S> {
        self.outbox
            .worker(stack)
            .poll_interval(Duration::from_millis(20))
    }

    /// Runs a worker that polls busily until it has run `polls` claims (a few milliseconds
    /// apart; fails the test past 5 s), then stops; its stats. Counts the worker's own
    /// claims, each a chance to take a row, rather than timing a span.
    pub async fn polls<S>(&self, stack: S, polls: u64) -> WorkerStats
    where
        S: tower::Service<Message, Response = Receipt> + Send,
        S::Error: Into<BoxError>,
        S::Future: Send,
    {
        let worker = self
            .outbox
            .worker(stack)
            .poll_interval(Duration::from_millis(5));
        let counted = worker.stats();
        let polled = async move {
            let what = format!("the worker runs {polls} claims");
            poll_until(&what, Duration::from_secs(5), || async {
                counted.get().polls >= polls
            })
            .await;
        };
        worker.run(polled).await.expect("the worker runs")
    }

    /// Waits until the outbox's counts satisfy `holds`; fails after `limit`.
    pub async fn until(&self, limit: Duration, holds: impl Fn(OutboxCounts) -> bool) {
        poll_until("the outbox's counts", limit, || async {
            holds(self.outbox.counts().await.expect("counts"))
        })
        .await;
    }

    /// Waits until `done` rows are sent and marked done.
    pub async fn until_done(&self, done: u64) {
        self.until(Duration::from_secs(10), |counts| counts.done == done)
            .await;
    }

    /// Runs `worker` until `done` rows are done, then stops it; its stats.
    pub async fn drain<S>(&self, worker: Worker<S>, done: u64) -> WorkerStats
    where
        S: tower::Service<Message, Response = Receipt> + Send + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send,
    {
        let running = start(worker);
        self.until_done(done).await;
        running.stop().await
    }

    pub async fn rows(&self) -> Vec<Row> {
        D::rows(&self.url, &self.outbox).await
    }

    /// The row of `key`.
    pub async fn row(&self, key: &str) -> Row {
        let rows = self.rows().await;
        rows.into_iter()
            .find(|row| row.key == key)
            .unwrap_or_else(|| panic!("no row for {key}"))
    }

    pub async fn drop_table(self) {
        D::drop_table(&self.url, self.outbox.table_name()).await;
    }
}

/// Runs every case of [`cases`] as a test of its own on a fresh table of the database `$db`
/// (a [`Database`]); `#[$ignore]` marks them ignored where its server is missing.
// Only the outbox's test binaries run the suite; the rest compile this module too.
#[allow(unused_macros)]
macro_rules! outbox_suite {
    (#[$ignore:meta] $db:ty) => {
        $crate::support::outbox::outbox_suite!(@cases #[$ignore] $db;
            [#[tokio::test]] a_message_commits_or_rolls_back_with_the_callers_transaction,
            [#[tokio::test]] a_worker_sends_each_message_once_as_it_was_enqueued_and_a_second_worker_finds_nothing_to_send,
            [#[tokio::test]] done_rows_are_purged_after_their_retention_and_lag_reads_the_oldest_waiting_row,
            [#[tokio::test(flavor = "multi_thread", worker_threads = 2)]] four_workers_on_one_table_send_a_thousand_messages_exactly_once,
            [#[tokio::test]] retries_retry_after_and_dead_letters_then_a_requeue_sends_again,
            [#[tokio::test(flavor = "multi_thread", worker_threads = 2)]] retries_retry_after_and_dead_letters_hold_with_many_sends_in_flight,
            [#[tokio::test]] a_worker_has_as_many_sends_in_flight_as_its_concurrency_and_no_more,
            [#[tokio::test]] a_worker_told_to_stop_lets_its_sends_answer_and_puts_back_the_rows_it_did_not_start,
            [#[tokio::test]] a_worker_killed_before_sending_leaves_its_rows_to_the_next_once_the_claim_passes,
            [#[tokio::test]] a_worker_killed_after_the_provider_took_the_message_does_not_send_it_again,
            [#[tokio::test]] the_late_answer_of_a_claim_that_passed_is_not_recorded_over_the_next_claims,
            [#[tokio::test]] a_schedule_with_sub_millisecond_digits_is_sent_once_through_the_outbox,
            [#[tokio::test]] an_outbox_refuses_bad_table_names_other_schemes_and_a_missing_table,
        );
    };
    (@cases #[$ignore:meta] $db:ty; $([#[$test:meta]] $case:ident),* $(,)?) => {$(
        #[$test]
        #[$ignore]
        async fn $case() {
            let Some(table) = $crate::support::outbox::Table::<$db>::fresh().await else {
                return;
            };
            $crate::support::outbox::cases::$case(&table).await;
            table.drop_table().await;
        }
    )*};
}
#[allow(unused_imports)]
pub(crate) use outbox_suite;
