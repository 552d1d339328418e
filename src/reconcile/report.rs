//! What a pass did ([`ReconcileReport`]), and the totals over every pass ([`ReconcileCounters`]).

use std::ops::AddAssign;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What one pass of a [`Reconciler`](super::Reconciler) did, or the totals of many.
///
/// Later releases may add fields; build one with `Default` and read the fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ReconcileReport {
    /// Keys the verification service was asked about.
    pub checked: u64,
    /// Keys settled as delivered, with the provider's receipt.
    pub delivered: u64,
    /// Keys freed because the provider never took their message.
    pub not_sent: u64,
    /// Keys left as they are because the provider could not tell.
    pub unknown: u64,
    /// Keys left alone because a live send (or a claim waiting for its send) held them.
    pub skipped_live: u64,
    /// Errors: of the verification service (the key is left, as for `unknown`) or of the
    /// store (the pass stops, and the next one starts where it stood).
    pub errors: u64,
}

impl AddAssign for ReconcileReport {
    fn add_assign(&mut self, other: Self) {
        self.checked += other.checked;
        self.delivered += other.delivered;
        self.not_sent += other.not_sent;
        self.unknown += other.unknown;
        self.skipped_live += other.skipped_live;
        self.errors += other.errors;
    }
}

/// The totals of a [`Reconciler`](super::Reconciler) over all its passes, readable while
/// the reconciler runs in a task of its own (from
/// [`Reconciler::counters`](super::Reconciler::counters)). Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct ReconcileCounters {
    inner: Arc<Totals>,
}

#[derive(Debug, Default)]
struct Totals {
    passes: AtomicU64,
    checked: AtomicU64,
    delivered: AtomicU64,
    not_sent: AtomicU64,
    unknown: AtomicU64,
    skipped_live: AtomicU64,
    errors: AtomicU64,
}

impl ReconcileCounters {
    /// Passes finished (a pass a store error stopped counts).
    pub fn passes(&self) -> u64 {
        self.inner.passes.load(Ordering::Relaxed)
    }

    /// The totals of every pass so far.
    pub fn totals(&self) -> ReconcileReport {
        let t = &self.inner;
        ReconcileReport {
            checked: t.checked.load(Ordering::Relaxed),
            delivered: t.delivered.load(Ordering::Relaxed),
            not_sent: t.not_sent.load(Ordering::Relaxed),
            unknown: t.unknown.load(Ordering::Relaxed),
            skipped_live: t.skipped_live.load(Ordering::Relaxed),
            errors: t.errors.load(Ordering::Relaxed),
        }
    }

    pub(super) fn add_pass(&self, report: &ReconcileReport) {
        let t = &self.inner;
        t.passes.fetch_add(1, Ordering::Relaxed);
        t.checked.fetch_add(report.checked, Ordering::Relaxed);
        t.delivered.fetch_add(report.delivered, Ordering::Relaxed);
        t.not_sent.fetch_add(report.not_sent, Ordering::Relaxed);
        t.unknown.fetch_add(report.unknown, Ordering::Relaxed);
        t.skipped_live
            .fetch_add(report.skipped_live, Ordering::Relaxed);
        t.errors.fetch_add(report.errors, Ordering::Relaxed);
    }
}
