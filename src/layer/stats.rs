//! Counters of what the layer did, for dashboards and alerts.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of what an [`IdempotencyLayer`](super::IdempotencyLayer) and its services did.
///
/// Every answer of the layer is counted once. Alert on `store_failed_after_send`,
/// `lease_lost` and `renewal_lost`: each may let a repeat send again, and each has its
/// `IDEMPOTENCY_STORE_FAILED` warning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Keyed messages passed to the inner service.
    pub sent: u64,
    /// Messages without a key, passed through untouched.
    pub unkeyed: u64,
    /// Repeats answered with the kept outcome.
    pub replayed: u64,
    /// Repeats answered `idempotency.in_flight`.
    pub in_flight: u64,
    /// Messages refused `idempotency.key_reused`.
    pub key_reused: u64,
    /// Messages refused `idempotency.invalid_key`.
    pub invalid_key: u64,
    /// Messages not sent because the store failed to reserve (`idempotency.store_failed`).
    pub store_failed: u64,
    /// Keys whose settlement gave up: the store failed to keep the outcome or free the key
    /// through every retry until the lease was about to end (or answered an error that
    /// retrying cannot mend). Each has its `IDEMPOTENCY_STORE_FAILED` warning.
    pub store_failed_after_send: u64,
    /// Sends whose settlement found another owner holding the key: their lease had passed
    /// (renewal off or failing) and a repeat took the key.
    pub lease_lost: u64,
    /// Sends dropped by the caller after the inner service was called.
    pub aborted: u64,
    /// Store calls of a settlement (complete or release after a send) tried again after a
    /// transient store error.
    pub settle_retries: u64,
    /// Lease renewals that found the key no longer held by its send: its lease had passed, so
    /// a repeat may have sent as well.
    pub renewal_lost: u64,
    /// Keyed messages whose send was given up after the maximum hold: the inner future was
    /// dropped and the key kept as `idempotency.max_hold`.
    pub max_hold: u64,
    /// Repeats that waited for an in-flight send under their key
    /// ([`wait_for_in_flight`](super::IdempotencyLayerBuilder::wait_for_in_flight)).
    pub waited: u64,
    /// Repeats of a message of unknown delivery sent again under the same key inside the
    /// [`provider_window`](super::IdempotencyLayerBuilder::provider_window): retaken keys
    /// and takeovers inside the window.
    pub resent: u64,
    /// Sends that took over a key of the same message from a holder that never settled it
    /// (its lease passed).
    pub taken_over: u64,
    /// Takeovers the verification service answered delivered: the receipt was kept, nothing
    /// sent.
    pub verified_delivered: u64,
    /// Takeovers the verification service answered not sent: sent.
    pub verified_not_sent: u64,
    /// Takeovers the verification service could not settle (unknown, an error, no answer in
    /// time): kept as `idempotency.unverified`, not sent.
    pub verify_inconclusive: u64,
}

/// On cache lines of their own (and so the layer's `Arc` count on its own too, the
/// configuration being aligned as they are): every send writes a counter, and beside the
/// options every send reads it would make each thread's next read of them miss after
/// another thread's send.
#[derive(Default)]
#[repr(align(64))]
pub(crate) struct Counters {
    pub(crate) sent: AtomicU64,
    pub(crate) unkeyed: AtomicU64,
    pub(crate) replayed: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) key_reused: AtomicU64,
    pub(crate) invalid_key: AtomicU64,
    pub(crate) store_failed: AtomicU64,
    pub(crate) store_failed_after_send: AtomicU64,
    pub(crate) lease_lost: AtomicU64,
    pub(crate) aborted: AtomicU64,
    pub(crate) settle_retries: AtomicU64,
    pub(crate) renewal_lost: AtomicU64,
    pub(crate) max_hold: AtomicU64,
    pub(crate) waited: AtomicU64,
    pub(crate) resent: AtomicU64,
    pub(crate) taken_over: AtomicU64,
    pub(crate) verified_delivered: AtomicU64,
    pub(crate) verified_not_sent: AtomicU64,
    pub(crate) verify_inconclusive: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            sent: get(&self.sent),
            unkeyed: get(&self.unkeyed),
            replayed: get(&self.replayed),
            in_flight: get(&self.in_flight),
            key_reused: get(&self.key_reused),
            invalid_key: get(&self.invalid_key),
            store_failed: get(&self.store_failed),
            store_failed_after_send: get(&self.store_failed_after_send),
            lease_lost: get(&self.lease_lost),
            aborted: get(&self.aborted),
            settle_retries: get(&self.settle_retries),
            renewal_lost: get(&self.renewal_lost),
            max_hold: get(&self.max_hold),
            waited: get(&self.waited),
            resent: get(&self.resent),
            taken_over: get(&self.taken_over),
            verified_delivered: get(&self.verified_delivered),
            verified_not_sent: get(&self.verified_not_sent),
            verify_inconclusive: get(&self.verify_inconclusive),
        }
    }
}

pub(crate) fn bump_by(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Ordering::Relaxed);
}
