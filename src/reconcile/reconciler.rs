//! The [`Reconciler`]: walks the store's listing and settles what the provider knows.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures_util::future::{self, Either};
use tower::ServiceExt;
use tower_service::Service;

use super::report::{ReconcileCounters, ReconcileReport};
use super::{TARGET, key_hash};
use crate::layer::{KeyForm, StoredKeys};
use crate::outcome::BoxError;
use crate::store::admin::{AdminOutcome, Cursor, Force, Inspected, Resolution, StoreAdmin};
use crate::verify::{Verified, Verify};

/// How many keys one pass checks unless told otherwise.
pub const DEFAULT_MAX_KEYS_PER_PASS: usize = 100;
/// How long a key settled as delivered stays done unless told otherwise (24 h, the layer's
/// default ttl).
pub const DEFAULT_DELIVERED_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Walks the keys of unknown delivery (and the pending keys whose lease passed) of a
/// [`StoreAdmin`], asks a verification service about each, and settles what it learns; see
/// the [module docs](super).
///
/// | the service answers | the reconciler |
/// |---|---|
/// | [`Verified::Delivered`] | resolves the key as delivered with the receipt, for [`delivered_ttl`](Self::delivered_ttl): a repeat is replayed with it |
/// | [`Verified::NotSent`] | resolves the key as not sent: the next send goes |
/// | [`Verified::Unknown`], or an error | leaves the key as it is |
///
/// A key a live send holds (within its lease, or a claim waiting for its send) is never
/// touched: it is not asked about, and a resolve that finds one answers
/// [`AdminOutcome::HeldByLiveSend`] and changes nothing ([`Force::No`]). Before settling, the
/// record is read again and settled only if it is still the one asked about (same
/// fingerprint, still of unknown delivery or stale); the read and the resolve are two steps,
/// so a record that ends and is replaced by a finished send in between (within one store
/// round trip, at the very end of its ttl) could still be settled by the answer about the
/// old one.
///
/// Each pass checks at most [`max_keys_per_pass`](Self::max_keys_per_pass) keys and keeps its
/// place: the next pass resumes after the last key it listed, and starts again from the
/// oldest once the listing ended.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::layer::{KeyForm, StoredKeys};
/// use tower_idempotency::reconcile::Reconciler;
/// use tower_idempotency::verify::{Verified, Verify};
/// use tower_idempotency::{BoxError, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), BoxError> {
/// // Asks the provider's API; here, a provider that never heard of anything.
/// let verify = tower::service_fn(|question: Verify| async move {
///     let _key = question.raw_key; // look the message up by it
///     Ok::<_, BoxError>(Verified::NotSent)
/// });
/// let mut reconciler = Reconciler::new(MemoryStore::new(), verify)
///     .stored_keys(StoredKeys::new("alerts", KeyForm::Raw)?)
///     .max_keys_per_pass(50)
///     .delivered_ttl(Duration::from_secs(24 * 3600));
/// let report = reconciler.run_once().await; // call it on a timer, or spawn `run`
/// assert_eq!(report.checked, 0);
/// # Ok(()) }
/// ```
pub struct Reconciler<S, V> {
    store: S,
    verify: V,
    keys: Option<StoredKeys>,
    max_keys_per_pass: usize,
    page_size: usize,
    delivered_ttl: Duration,
    cursor: Option<Cursor>,
    counters: ReconcileCounters,
}

impl<S, V> fmt::Debug for Reconciler<S, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reconciler")
            .field("keys", &self.keys)
            .field("max_keys_per_pass", &self.max_keys_per_pass)
            .field("page_size", &self.page_size)
            .field("delivered_ttl", &self.delivered_ttl)
            .field("cursor", &self.cursor)
            .finish_non_exhaustive()
    }
}

impl<S, V> Reconciler<S, V>
where
    S: StoreAdmin,
    V: Service<Verify, Response = Verified>,
    V::Error: Into<BoxError>,
{
    /// A reconciler of `store` that asks `verify` about each key.
    pub fn new(store: S, verify: V) -> Self {
        Self {
            store,
            verify,
            keys: None,
            max_keys_per_pass: DEFAULT_MAX_KEYS_PER_PASS,
            page_size: DEFAULT_MAX_KEYS_PER_PASS,
            delivered_ttl: DEFAULT_DELIVERED_TTL,
            cursor: None,
            counters: ReconcileCounters::default(),
        }
    }

    /// Checks at most `n` keys per pass (default 100; at least 1).
    pub fn max_keys_per_pass(mut self, n: usize) -> Self {
        self.max_keys_per_pass = n.max(1);
        self
    }

    /// Lists at most `n` keys per store call (default 100; at least 1). A pass never lists
    /// more than it has left to check.
    pub fn page_size(mut self, n: usize) -> Self {
        self.page_size = n.max(1);
        self
    }

    /// How long a key settled as delivered stays done, from the moment it is settled
    /// (default 24 h). Keep it at least the layer's ttl.
    pub fn delivered_ttl(mut self, ttl: Duration) -> Self {
        self.delivered_ttl = ttl;
        self
    }

    /// Only the keys of this namespace (those beginning with its
    /// [`prefix`](StoredKeys::prefix)) are checked; others are passed over (they still count
    /// against [`max_keys_per_pass`](Self::max_keys_per_pass), which bounds the keys listed).
    /// With [`KeyForm::Raw`], the service is also told the raw key ([`Verify::raw_key`]),
    /// except for a key in the hashed form (`h1:` and 64 hex digits after the namespace), left
    /// by a layer of the same namespace that stored hashed keys.
    pub fn stored_keys(mut self, keys: StoredKeys) -> Self {
        self.keys = Some(keys);
        self
    }

    /// The totals of every pass, readable from elsewhere while [`run`](Self::run) owns the
    /// reconciler.
    pub fn counters(&self) -> ReconcileCounters {
        self.counters.clone()
    }

    /// One pass: lists up to [`max_keys_per_pass`](Self::max_keys_per_pass) keys from where
    /// the last pass stopped, asks the verification service about each, and settles what it
    /// learns.
    ///
    /// A store error ends the pass early (counted in [`ReconcileReport::errors`]); the next
    /// pass lists again from where this one stood. So does an error of the service's
    /// `poll_ready` (the service cannot take questions).
    pub async fn run_once(&mut self) -> ReconcileReport {
        let mut report = ReconcileReport::default();
        let mut budget = self.max_keys_per_pass;
        // A store may answer empty pages while the listing goes on: bound the store calls too.
        let mut pages_left = self.max_keys_per_pass.saturating_add(4);
        while budget > 0 && pages_left > 0 {
            pages_left -= 1;
            let limit = budget.min(self.page_size);
            let page = match self.store.list(self.cursor.as_ref(), limit).await {
                Ok(page) => page,
                Err(error) => {
                    tracing::warn!(target: TARGET, %error, "reconcile: the store failed to list");
                    report.errors += 1;
                    break;
                }
            };
            let mut stopped = false;
            for entry in page.entries {
                budget = budget.saturating_sub(1);
                if !self.check(entry, &mut report).await {
                    stopped = true;
                    break;
                }
            }
            if stopped {
                // The rest of the page is listed again next pass.
                break;
            }
            match page.next {
                Some(next) => self.cursor = Some(next),
                None => {
                    // The listing ended: the next pass starts from the oldest again.
                    self.cursor = None;
                    break;
                }
            }
        }
        self.counters.add_pass(&report);
        if report == ReconcileReport::default() {
            tracing::debug!(target: TARGET, "reconcile: pass done, nothing to check");
        } else {
            tracing::info!(
                target: TARGET,
                checked = report.checked,
                delivered = report.delivered,
                not_sent = report.not_sent,
                unknown = report.unknown,
                skipped_live = report.skipped_live,
                errors = report.errors,
                "reconcile: pass done"
            );
        }
        report
    }

    /// Runs a pass every `interval` until `shutdown` completes; meant for a tokio task of
    /// its own. A pass under way when `shutdown` completes is dropped: each settlement is
    /// one atomic step in the store, so nothing is left half done.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_idempotency::{MemoryStore, reconcile::Reconciler, verify::{Verified, Verify}};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let verify = tower::service_fn(|_: Verify| async { Ok::<_, std::convert::Infallible>(Verified::Unknown) });
    /// let reconciler = Reconciler::new(MemoryStore::new(), verify);
    /// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// let task = tokio::spawn(reconciler.run(Duration::from_secs(60), async move { let _ = stopped.await; }));
    /// let _ = stop.send(());
    /// task.await.expect("the reconciler stops");
    /// # }
    /// ```
    pub async fn run(mut self, interval: Duration, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            {
                let pass = std::pin::pin!(self.run_once());
                if let Either::Right(_) = future::select(pass, shutdown.as_mut()).await {
                    return;
                }
            }
            let sleep = std::pin::pin!(tokio::time::sleep(interval));
            if let Either::Right(_) = future::select(sleep, shutdown.as_mut()).await {
                return;
            }
        }
    }

    /// Checks one listed key. `false` when the pass must stop (the service cannot take
    /// questions, or the store failed).
    async fn check(&mut self, entry: Inspected, report: &mut ReconcileReport) -> bool {
        let hash = key_hash(&entry.key);
        let raw_key = match &self.keys {
            Some(keys) => {
                let prefix = keys.prefix();
                let Some(rest) = entry.key.strip_prefix(prefix.as_str()) else {
                    return true; // another namespace's key
                };
                (keys.form() == KeyForm::Raw && !looks_hashed(rest)).then(|| rest.to_owned())
            }
            None => None,
        };
        if entry.is_held_live() {
            report.skipped_live += 1;
            tracing::debug!(target: TARGET, key_hash = %hash, "reconcile: a live send holds the key");
            return true;
        }
        let ready = match self.verify.ready().await {
            Ok(ready) => ready,
            Err(error) => {
                let error: BoxError = error.into();
                tracing::warn!(target: TARGET, %error, "reconcile: the verification service is not ready");
                report.errors += 1;
                return false;
            }
        };
        report.checked += 1;
        let key = entry.key.clone();
        let fingerprint = entry.fingerprint;
        let answer = ready.call(Verify::new(entry, raw_key)).await;
        let resolution = match answer {
            Ok(Verified::Delivered(receipt)) => Resolution::delivered(receipt, self.delivered_ttl),
            Ok(Verified::NotSent) => Resolution::not_sent(),
            Ok(Verified::Unknown) => {
                report.unknown += 1;
                tracing::debug!(target: TARGET, key_hash = %hash, "reconcile: the provider cannot tell; left");
                return true;
            }
            Err(error) => {
                let error: BoxError = error.into();
                report.errors += 1;
                tracing::warn!(target: TARGET, key_hash = %hash, %error, "reconcile: the verification service failed; left");
                return true;
            }
        };
        // The record may have changed while the provider was asked (its ttl ended and a new
        // send took the key, or it was settled): settle only the record that was asked about.
        match self.store.inspect(&key).await {
            Ok(Some(now)) if now.is_held_live() => {
                report.skipped_live += 1;
                tracing::debug!(target: TARGET, key_hash = %hash, "reconcile: a live send took the key meanwhile; left");
                return true;
            }
            Ok(Some(now))
                if now.fingerprint == fingerprint
                    && (now.is_unknown_delivery() || now.is_stale()) => {}
            Ok(_) => {
                tracing::debug!(target: TARGET, key_hash = %hash, "reconcile: the key changed meanwhile; left");
                return true;
            }
            Err(error) => {
                report.errors += 1;
                tracing::warn!(target: TARGET, key_hash = %hash, %error, "reconcile: the store failed to read the key");
                return false;
            }
        }
        let delivered = matches!(resolution, Resolution::Delivered { .. });
        match self.store.resolve(&key, &resolution, Force::No).await {
            Ok(AdminOutcome::Done) => {
                if delivered {
                    report.delivered += 1;
                } else {
                    report.not_sent += 1;
                }
                tracing::info!(
                    target: TARGET,
                    key_hash = %hash,
                    settled = if delivered { "delivered" } else { "not_sent" },
                    "reconcile: key settled"
                );
            }
            Ok(AdminOutcome::HeldByLiveSend) => {
                report.skipped_live += 1;
                tracing::debug!(target: TARGET, key_hash = %hash, "reconcile: a live send took the key meanwhile; left");
            }
            Ok(_) => {
                // Gone meanwhile (its ttl ended, or someone settled it): nothing to do.
                tracing::debug!(target: TARGET, key_hash = %hash, "reconcile: the key went meanwhile");
            }
            Err(error) => {
                report.errors += 1;
                tracing::warn!(target: TARGET, key_hash = %hash, %error, "reconcile: the store failed to settle the key");
                return false;
            }
        }
        true
    }
}

/// Whether the part of a stored key after `namespace:` is in the hashed form: `h1:` and 64
/// lowercase hex digits.
fn looks_hashed(rest: &str) -> bool {
    rest.strip_prefix("h1:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}
