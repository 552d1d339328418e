//! What a [`Worker`](super::Worker) does, apart from the service it sends through: its
//! options and its counters. The drain and the statements on its rows share them, so they
//! stand below both, and import nothing of either.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::Outbox;

/// What a worker does, apart from the service it sends through: nothing here is generic, so
/// the drain shares it (in an `Arc`) with the statements it runs beside its sends.
pub(super) struct Settings {
    pub(super) outbox: Outbox,
    pub(super) concurrency: u32,
    pub(super) batch: u32,
    pub(super) claim_lease: Duration,
    pub(super) poll_interval: Duration,
    pub(super) max_attempts: u32,
    pub(super) backoff_base: Duration,
    pub(super) backoff_max: Duration,
    pub(super) counters: Arc<Counters>,
}

/// What the worker has done so far, counted as it goes; [`WorkerStats`](super::WorkerStats)
/// is their snapshot.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) claimed: AtomicU64,
    pub(super) polls: AtomicU64,
    pub(super) sent: AtomicU64,
    pub(super) retried: AtomicU64,
    pub(super) dead_lettered: AtomicU64,
    pub(super) released: AtomicU64,
    pub(super) last_lag_ms: AtomicU64,
}

impl Counters {
    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

impl Settings {
    /// Starts the task that wakes the worker when rows are enqueued, where the database has
    /// one (PostgreSQL's `LISTEN`, when the outbox has a connection to open); `None`:
    /// polling only.
    pub(super) fn listen(&self, wake: &Arc<Notify>) -> Option<JoinHandle<()>> {
        on_backend!(&self.outbox.backend, db => db.listen(self.outbox.timeout, wake))
    }
}
