//! [`Worker`]: drains an [`Outbox`] through a `Service<Message>` stack.

use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use tower_service::Service;

use super::Outbox;
use super::drain::Drain;
use super::settings::{Counters, Settings};
use crate::message::Message;
use crate::outcome::{BoxError, Receipt};
use crate::store::StoreError;

/// Sends a worker has in flight at once, by default: enough for one worker to keep pace with
/// a provider that answers in tens of milliseconds (64 sends of 50 ms each allow 1,280 a
/// second), few enough that the stack and its HTTP client's connection pool see a modest
/// number of calls at once. A provider's rate limit belongs in the stack (see [`Worker`]).
pub const DEFAULT_CONCURRENCY: u32 = 64;
/// Free send slots that start the next claim while rows keep coming, by default: a quarter of
/// [`DEFAULT_CONCURRENCY`], so sends keep flowing while the next claim runs.
pub const DEFAULT_BATCH: u32 = 16;
/// How long a claim holds its rows, by default: longer than a send with every retry of the
/// stack, or a slow send's row is claimed again (and answered by the idempotency layer).
pub const DEFAULT_CLAIM_LEASE: Duration = Duration::from_secs(5 * 60);
/// How often an idle worker looks for rows when no notification wakes it, by default (on
/// MySQL, which has no notifications, how often it looks).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// Attempts before a retryable failure becomes dead, by default.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

/// Sends the messages of an [`Outbox`] through a `Service<Message>`; see the
/// [module docs](super) for what it does with each answer. Made by [`Outbox::worker`],
/// started by [`run`](Self::run). Run as many as you like, in as many processes.
///
/// It sends claimed rows concurrently, up to its [`concurrency`](Self::concurrency), and
/// records their answers in batches (one statement for the answers that arrived while the
/// last one ran), each row fenced by the token of the claim that took it. It claims a row
/// only when a send slot is free for it, so a row waits in the worker no longer than the
/// stack takes to be ready. The stack's readiness paces it: put a rate limit in the stack
/// (`tower::limit::RateLimitLayer`) at your provider's plan, and the worker sends no faster;
/// a provider's `429` with `Retry-After` puts the row back for at least that long.
///
/// ```no_run
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_idempotency::outbox::Outbox;
/// use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message, Receipt};
///
/// # async fn run(outbox: Outbox, shutdown: tokio::sync::oneshot::Receiver<()>) -> Result<(), BoxError> {
/// let provider = tower::service_fn(|_m: Message| async { Ok::<_, BoxError>(Receipt::new("id", "fake")) });
/// let stack = ServiceBuilder::new()
///     .rate_limit(100, Duration::from_secs(1)) // the provider's plan: 100 a second
///     .layer(IdempotencyLayer::new(MemoryStore::new()))
///     .service(provider);
/// let stats = outbox
///     .worker(stack)
///     .concurrency(32)
///     .poll_interval(Duration::from_secs(1))
///     .run(async { let _ = shutdown.await; })
///     .await?;
/// println!("sent {}", stats.sent);
/// # Ok(()) }
/// ```
///
/// | option | default |
/// |---|---|
/// | [`concurrency`](Self::concurrency) | [`DEFAULT_CONCURRENCY`] sends in flight |
/// | [`batch`](Self::batch) | [`DEFAULT_BATCH`] free slots before a claim |
/// | [`claim_lease`](Self::claim_lease) | [`DEFAULT_CLAIM_LEASE`] (5 minutes) |
/// | [`poll_interval`](Self::poll_interval) | [`DEFAULT_POLL_INTERVAL`] (5 s) |
/// | [`max_attempts`](Self::max_attempts) | [`DEFAULT_MAX_ATTEMPTS`] |
/// | [`backoff`](Self::backoff) | 1 s doubling to 5 minutes, jittered |
pub struct Worker<S> {
    settings: Settings,
    service: S,
}

impl<S> fmt::Debug for Worker<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        f.debug_struct("Worker")
            .field("outbox", &s.outbox)
            .field("concurrency", &s.concurrency)
            .field("batch", &s.batch)
            .field("claim_lease", &s.claim_lease)
            .field("poll_interval", &s.poll_interval)
            .field("max_attempts", &s.max_attempts)
            .finish_non_exhaustive()
    }
}

/// What a [`Worker`] has done; [`Worker::stats`] reads it live, [`Worker::run`] returns the
/// last one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerStats {
    /// Rows claimed (a row claimed again after a retry counts again).
    pub claimed: u64,
    /// Claim statements run, whether they found rows or not: a worker whose polls grow is
    /// alive, one whose polls stand still while rows wait is stuck or idle.
    pub polls: u64,
    /// Rows sent and marked done.
    pub sent: u64,
    /// Rows put back for a later attempt.
    pub retried: u64,
    /// Rows moved to the dead-letter state.
    pub dead_lettered: u64,
    /// Rows claimed but put back unsent because the worker was told to stop.
    pub released: u64,
    /// How long the last claimed row had been ready before it was claimed, in milliseconds:
    /// the lag the worker sees.
    pub last_lag_ms: u64,
}

/// The stats the counters hold now.
fn snapshot(counters: &Counters) -> WorkerStats {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    WorkerStats {
        claimed: get(&counters.claimed),
        polls: get(&counters.polls),
        sent: get(&counters.sent),
        retried: get(&counters.retried),
        dead_lettered: get(&counters.dead_lettered),
        released: get(&counters.released),
        last_lag_ms: get(&counters.last_lag_ms),
    }
}

/// A live view of a worker's [`WorkerStats`], usable while it runs.
#[derive(Clone)]
pub struct WorkerStatsHandle(Arc<Counters>);

impl WorkerStatsHandle {
    /// The stats now.
    pub fn get(&self) -> WorkerStats {
        snapshot(&self.0)
    }
}

impl fmt::Debug for WorkerStatsHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.get().fmt(f)
    }
}

impl<S> Worker<S> {
    pub(super) fn new(outbox: Outbox, service: S) -> Self {
        Self {
            settings: Settings {
                outbox,
                concurrency: DEFAULT_CONCURRENCY,
                batch: DEFAULT_BATCH,
                claim_lease: DEFAULT_CLAIM_LEASE,
                poll_interval: DEFAULT_POLL_INTERVAL,
                max_attempts: DEFAULT_MAX_ATTEMPTS,
                backoff_base: Duration::from_secs(1),
                backoff_max: Duration::from_secs(5 * 60),
                counters: Arc::default(),
            },
            service,
        }
    }

    /// How many sends the worker has in flight at once (at least 1): calls to the stack
    /// whose answers it awaits together. `1` sends one row after the other.
    #[must_use]
    pub fn concurrency(mut self, sends: u32) -> Self {
        self.settings.concurrency = sends.max(1);
        self
    }

    /// How many send slots must be free before the worker claims again while rows keep
    /// coming (at least 1); a claim then asks for a row for every free slot, so claims grow
    /// as answers come faster. Larger batches run fewer claim statements but leave more
    /// slots idle meanwhile: keep it well below the [`concurrency`](Self::concurrency).
    #[must_use]
    pub fn batch(mut self, rows: u32) -> Self {
        self.settings.batch = rows.max(1);
        self
    }

    /// How long a claim holds its rows. Make it longer than one send through the stack takes,
    /// retries and the wait for the stack's readiness included: a row whose claim passed is
    /// claimed again (which the idempotency layer then answers), and the first claim's
    /// answer is not written.
    #[must_use]
    pub fn claim_lease(mut self, lease: Duration) -> Self {
        self.settings.claim_lease = lease.max(Duration::from_millis(1));
        self
    }

    /// How often an idle worker looks for rows when no notification wakes it. On MySQL,
    /// which has no notifications, this is how long a message enqueued into an idle outbox
    /// may wait before it is sent: a worker that keeps finding rows claims again at once.
    #[must_use]
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.settings.poll_interval = every.max(Duration::from_millis(1));
        self
    }

    /// Attempts before a row whose failures are retryable becomes dead (at least 1).
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.settings.max_attempts = attempts.max(1);
        self
    }

    /// The wait before attempt `n + 1`: `base` doubled `n - 1` times, at most `max`, jittered
    /// down by up to half; a provider's `Retry-After` that asks for longer wins.
    #[must_use]
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.settings.backoff_base = base;
        self.settings.backoff_max = max.max(base);
        self
    }

    /// A live view of what this worker does, to read while it runs.
    pub fn stats(&self) -> WorkerStatsHandle {
        WorkerStatsHandle(Arc::clone(&self.settings.counters))
    }
}

impl<S> Worker<S>
where
    S: Service<Message, Response = Receipt> + Send,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    /// Drains the outbox until `shutdown` completes, then lets the sends in flight answer
    /// and records them, puts back the rows it claimed but did not hand to the stack, and
    /// returns its stats.
    ///
    /// A failed claim (the database is down) is logged and tried again at the next poll;
    /// the worker never gives up on its own.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<WorkerStats, StoreError> {
        let counters = Arc::clone(&self.settings.counters);
        let mut shutdown = pin!(shutdown.fuse());
        let mut drain = Drain::new(self.settings, self.service);
        poll_fn(|cx| drain.poll_drain(cx, shutdown.as_mut())).await;
        drop(drain);
        Ok(snapshot(&counters))
    }
}
