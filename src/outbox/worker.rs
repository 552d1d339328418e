//! [`Worker`]: drains an [`Outbox`] through a `Service<Message>` stack.

use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::{Either, select};
use futures_util::{FutureExt, StreamExt};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, NoTls};
use tower_service::Service;
use uuid::Uuid;

use super::{Outbox, stored};
use crate::classify::{Classifier, into_send_error};
use crate::message::Message;
use crate::outcome::{BoxError, Receipt, SendError};
use crate::retry::unit_random;
use crate::store::StoreError;

/// Rows one claim takes, by default.
pub const DEFAULT_BATCH: u32 = 16;
/// How long a claim holds its rows, by default: longer than a send with every retry of the
/// stack, or a slow send's row is claimed again (and answered by the idempotency layer).
pub const DEFAULT_CLAIM_LEASE: Duration = Duration::from_secs(5 * 60);
/// How often an idle worker looks for rows when no notification wakes it, by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// Attempts before a retryable failure becomes dead, by default.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

/// Sends the messages of an [`Outbox`] through a `Service<Message>`; see the
/// [module docs](super) for what it does with each answer. Made by [`Outbox::worker`],
/// started by [`run`](Self::run). Run as many as you like, in as many processes.
///
/// | option | default |
/// |---|---|
/// | [`batch`](Self::batch) | [`DEFAULT_BATCH`] rows per claim |
/// | [`claim_lease`](Self::claim_lease) | [`DEFAULT_CLAIM_LEASE`] (5 minutes) |
/// | [`poll_interval`](Self::poll_interval) | [`DEFAULT_POLL_INTERVAL`] (5 s) |
/// | [`max_attempts`](Self::max_attempts) | [`DEFAULT_MAX_ATTEMPTS`] |
/// | [`backoff`](Self::backoff) | 1 s doubling to 5 minutes, jittered |
pub struct Worker<S> {
    settings: Settings,
    service: S,
}

/// What a worker does, apart from the service it sends through: nothing here is generic, so
/// the run's future holds no borrow of the service across a statement.
struct Settings {
    outbox: Outbox,
    batch: u32,
    claim_lease: Duration,
    poll_interval: Duration,
    max_attempts: u32,
    backoff_base: Duration,
    backoff_max: Duration,
    counters: Arc<Counters>,
}

impl<S> fmt::Debug for Worker<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        f.debug_struct("Worker")
            .field("outbox", &s.outbox)
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

#[derive(Default)]
struct Counters {
    claimed: AtomicU64,
    polls: AtomicU64,
    sent: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    released: AtomicU64,
    last_lag_ms: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn snapshot(&self) -> WorkerStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WorkerStats {
            claimed: get(&self.claimed),
            polls: get(&self.polls),
            sent: get(&self.sent),
            retried: get(&self.retried),
            dead_lettered: get(&self.dead_lettered),
            released: get(&self.released),
            last_lag_ms: get(&self.last_lag_ms),
        }
    }
}

/// A live view of a worker's [`WorkerStats`], usable while it runs.
#[derive(Clone)]
pub struct WorkerStatsHandle(Arc<Counters>);

impl WorkerStatsHandle {
    /// The stats now.
    pub fn get(&self) -> WorkerStats {
        self.0.snapshot()
    }
}

impl fmt::Debug for WorkerStatsHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.get().fmt(f)
    }
}

/// A row this worker claimed.
struct Claimed {
    id: i64,
    message: String,
    attempts: i32,
}

/// What the worker does with a row after its send.
enum Verdict {
    Done(Receipt),
    Retry { after: Duration, error: SendError },
    Dead(String),
}

impl<S> Worker<S> {
    pub(super) fn new(outbox: Outbox, service: S) -> Self {
        Self {
            settings: Settings {
                outbox,
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

    /// How many rows one claim takes (at least 1). They are sent one after the other; run
    /// more workers for more sends at once.
    #[must_use]
    pub fn batch(mut self, rows: u32) -> Self {
        self.settings.batch = rows.max(1);
        self
    }

    /// How long a claim holds its rows. Make it longer than the worker takes to send a
    /// whole batch through the stack, retries included: a row whose claim passed is claimed
    /// again by another worker (which the idempotency layer then answers), and the first
    /// worker's answer is not written.
    #[must_use]
    pub fn claim_lease(mut self, lease: Duration) -> Self {
        self.settings.claim_lease = lease.max(Duration::from_millis(1));
        self
    }

    /// How often an idle worker looks for rows when no notification wakes it.
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
    /// Drains the outbox until `shutdown` completes, then finishes the send in hand, puts
    /// back the rows it claimed but did not send, and returns its stats.
    ///
    /// A failed claim (the database is down) is logged and tried again at the next poll;
    /// the worker never gives up on its own.
    pub async fn run(
        mut self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<WorkerStats, StoreError> {
        let mut shutdown = pin!(shutdown.fuse());
        let wake = Arc::new(Notify::new());
        let mut listener: Option<JoinHandle<()>> = None;
        let token = Uuid::new_v4();
        'drain: loop {
            if listener.as_ref().is_none_or(JoinHandle::is_finished) {
                listener = self.settings.listen(&wake);
            }
            if shutdown.as_mut().now_or_never().is_some() {
                break;
            }
            let claimed = match self.settings.claim(token).await {
                Ok(claimed) => claimed,
                Err(error) => {
                    tracing::warn!(error = %error, table = %self.settings.outbox.table_name(), "outbox claim failed; trying again at the next poll");
                    Vec::new()
                }
            };
            if claimed.is_empty() {
                let notified = pin!(wake.notified());
                let slept = pin!(tokio::time::sleep(self.settings.poll_interval));
                let idle = select(notified, slept);
                if let Either::Left(_) = select(shutdown.as_mut(), idle).await {
                    break;
                }
                continue;
            }
            let mut rows = claimed.into_iter();
            while let Some(row) = rows.next() {
                if shutdown.as_mut().now_or_never().is_some() {
                    let unsent: Vec<i64> =
                        std::iter::once(row.id).chain(rows.map(|r| r.id)).collect();
                    self.settings.release(token, &unsent).await;
                    break 'drain;
                }
                self.send(token, row).await;
            }
        }
        if let Some(listener) = listener {
            listener.abort();
        }
        Ok(self.settings.counters.snapshot())
    }

    async fn send(&mut self, token: Uuid, row: Claimed) {
        let Self { settings, service } = self;
        let verdict = match stored::decode(&row.message) {
            Err(error) => Verdict::Dead(format!("outbox.corrupt: {error}")),
            Ok(message) => {
                let classifier = Classifier::default();
                // Judged before anything else is awaited: the service's error type need
                // not be `Send`.
                let ready = poll_fn(|cx| service.poll_ready(cx))
                    .await
                    .map_err(|error| into_send_error(&classifier, error.into()));
                let result = match ready {
                    Err(error) => Err(error),
                    Ok(()) => {
                        let answer = service.call(message).await;
                        answer.map_err(|error| into_send_error(&classifier, error.into()))
                    }
                };
                settings.judge(result, row.attempts)
            }
        };
        let sql = &settings.outbox.sql;
        let marked = match &verdict {
            Verdict::Done(receipt) => {
                settings
                    .execute(
                        &sql.done,
                        &[&row.id, &token, &receipt.id, &receipt.transport],
                    )
                    .await
            }
            Verdict::Retry { after, error } => {
                let after_ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
                let last = format!("{}: {}", error.code(), error.message());
                settings
                    .execute(&sql.retry, &[&row.id, &token, &after_ms, &last])
                    .await
            }
            Verdict::Dead(why) => settings.execute(&sql.dead, &[&row.id, &token, why]).await,
        };
        match (&verdict, marked) {
            (_, Err(error)) => tracing::warn!(
                row = row.id,
                error = %error,
                "outbox could not record a send's answer; the row is sent again when its claim passes, and the idempotency layer answers that repeat"
            ),
            (_, Ok(0)) => tracing::warn!(
                row = row.id,
                "outbox claim passed before the send's answer was recorded; another worker holds the row"
            ),
            (Verdict::Done(_), Ok(_)) => {
                Counters::add(&settings.counters.sent, 1);
                tracing::debug!(row = row.id, attempts = row.attempts, "outbox message sent");
            }
            (Verdict::Retry { after, error }, Ok(_)) => {
                Counters::add(&settings.counters.retried, 1);
                tracing::info!(
                    row = row.id,
                    attempts = row.attempts,
                    code = error.code(),
                    retry_in_ms = after.as_millis() as u64,
                    "outbox message will be tried again"
                );
            }
            (Verdict::Dead(why), Ok(_)) => {
                Counters::add(&settings.counters.dead_lettered, 1);
                tracing::warn!(row = row.id, attempts = row.attempts, error = %why, "outbox message moved to the dead-letter state");
            }
        }
    }
}

impl Settings {
    fn wait_before(&self, attempts: i32) -> Duration {
        let doublings = u32::try_from(attempts.saturating_sub(1))
            .unwrap_or(0)
            .min(30);
        let full = self
            .backoff_base
            .saturating_mul(1 << doublings)
            .min(self.backoff_max);
        full.mul_f64(0.5 + 0.5 * unit_random())
    }

    fn judge(&self, result: Result<Receipt, SendError>, attempts: i32) -> Verdict {
        let error = match result {
            Ok(receipt) => return Verdict::Done(receipt),
            Err(error) => error,
        };
        let out_of_attempts = u32::try_from(attempts).unwrap_or(u32::MAX) >= self.max_attempts;
        if error.is_retryable() && !out_of_attempts {
            let after = self
                .wait_before(attempts)
                .max(error.retry_after().unwrap_or_default());
            return Verdict::Retry { after, error };
        }
        let why = if error.is_retryable() {
            "out of attempts"
        } else if error.delivery_unknown() {
            "delivery unknown: the message may have gone"
        } else {
            "refused"
        };
        Verdict::Dead(format!("{} ({why}): {}", error.code(), error.message()))
    }

    async fn claim(&self, token: Uuid) -> Result<Vec<Claimed>, StoreError> {
        let lease_ms = i64::try_from(self.claim_lease.as_millis()).unwrap_or(i64::MAX);
        let outbox = &self.outbox;
        let rows = outbox
            .bounded(async {
                let client = outbox.client().await?;
                let statement = client
                    .prepare_cached(&outbox.sql.claim)
                    .await
                    .map_err(|e| outbox.db_error(e))?;
                client
                    .query(&statement, &[&token, &lease_ms, &i64::from(self.batch)])
                    .await
                    .map_err(|e| outbox.db_error(e))
            })
            .await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in rows {
            let waited_ms: Option<i64> = row.try_get(3).map_err(|e| outbox.db_error(e))?;
            self.counters.last_lag_ms.store(
                u64::try_from(waited_ms.unwrap_or(0)).unwrap_or(0),
                Ordering::Relaxed,
            );
            claimed.push(Claimed {
                id: row.try_get(0).map_err(|e| outbox.db_error(e))?,
                message: row.try_get(1).map_err(|e| outbox.db_error(e))?,
                attempts: row.try_get(2).map_err(|e| outbox.db_error(e))?,
            });
        }
        Counters::add(&self.counters.claimed, claimed.len() as u64);
        Counters::add(&self.counters.polls, 1);
        if !claimed.is_empty() {
            tracing::debug!(
                rows = claimed.len(),
                lag_ms = self.counters.last_lag_ms.load(Ordering::Relaxed),
                "outbox rows claimed"
            );
        }
        Ok(claimed)
    }

    async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let outbox = &self.outbox;
        outbox
            .bounded(async {
                let client = outbox.client().await?;
                let statement = client
                    .prepare_cached(sql)
                    .await
                    .map_err(|e| outbox.db_error(e))?;
                client
                    .execute(&statement, params)
                    .await
                    .map_err(|e| outbox.db_error(e))
            })
            .await
    }

    /// Puts back rows claimed but not sent, so another worker takes them at once.
    async fn release(&self, token: Uuid, ids: &[i64]) {
        match self
            .execute(&self.outbox.sql.release, &[&ids, &token])
            .await
        {
            Ok(released) => Counters::add(&self.counters.released, released),
            Err(error) => tracing::warn!(
                rows = ids.len(),
                error = %error,
                "outbox could not put back unsent rows; they return when their claim passes"
            ),
        }
    }

    /// Starts the `LISTEN` task, when the outbox has a connection to open: it wakes the
    /// worker on every notification, and once when it starts listening (for what was
    /// enqueued meanwhile). When the connection fails the task ends, the worker keeps
    /// polling, and the next loop starts it again.
    fn listen(&self, wake: &Arc<Notify>) -> Option<JoinHandle<()>> {
        let config = self.outbox.listen.clone()?;
        let listen = format!("LISTEN \"{}\"", self.outbox.sql.channel);
        let timeout = self.outbox.timeout;
        let wake = Arc::clone(wake);
        Some(tokio::spawn(async move {
            let Ok(Ok((client, mut connection))) =
                tokio::time::timeout(timeout, config.connect(NoTls)).await
            else {
                tracing::debug!("outbox LISTEN connection failed; polling");
                return;
            };
            // Polling the connection drives it: the LISTEN statement and every notification.
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            let mut listening = pin!(client.batch_execute(&listen));
            loop {
                match select(listening.as_mut(), messages.next()).await {
                    Either::Left((Ok(()), _)) => break,
                    Either::Left((Err(_), _)) | Either::Right((None | Some(Err(_)), _)) => {
                        return;
                    }
                    Either::Right((Some(Ok(_)), _)) => {}
                }
            }
            wake.notify_one();
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(_) = message {
                    wake.notify_one();
                }
            }
        }))
    }
}
