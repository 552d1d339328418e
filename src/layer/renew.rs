//! Holding the keys of a send while it runs: the lease's end by the local clock, its renewal
//! ([`Store::extend`](crate::store::Store::extend)) every third of the lease, the maximum
//! hold, and the bounded, jittered retries a settlement shares with renewal.
//!
//! The lease's end is tracked from the moment the reserve (or the last renewal) was *asked*,
//! so it falls no later than the store's own expiry: the layer's view of the lease errs on
//! the short side.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::Duration;

use futures_util::future::{BoxFuture, join_all};
use tokio::time::Instant;

use super::config::Config;
use super::key::key_hash;
use super::stats::{bump, bump_by};
use crate::fingerprint::Fingerprint;
use crate::outcome::{SendError, codes};
use crate::store::{StoreError, StoreErrorKind, Token};

/// A key this send reserved.
#[derive(Clone)]
pub(crate) struct Held {
    pub(crate) key: Arc<str>,
    pub(crate) token: Token,
    pub(crate) fingerprint: Fingerprint,
}

/// Whether a store error may pass by itself, so the call is worth trying again.
pub(crate) fn transient(error: &StoreError) -> bool {
    matches!(
        error.kind(),
        StoreErrorKind::Unavailable | StoreErrorKind::Timeout
    )
}

/// `at + d`, saturating far in the future instead of overflowing.
pub(crate) fn after(at: Instant, d: Duration) -> Instant {
    const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    at.checked_add(d)
        .or_else(|| at.checked_add(FOREVER))
        .unwrap_or(at)
}

/// Whether a tokio runtime is there to sleep, time out and spawn on.
pub(crate) fn has_runtime() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
}

/// Exponential backoff with full jitter: a uniform delay below a ceiling that starts at
/// 10 ms and doubles up to 1 s, so that senders that failed together do not retry together.
#[derive(Default)]
pub(crate) struct Backoff {
    tries: u32,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(1);

    pub(crate) fn next_delay(&mut self) -> Duration {
        let ceiling = Self::FIRST
            .checked_mul(2u32.saturating_pow(self.tries))
            .map_or(Self::MAX, |d| d.min(Self::MAX));
        self.tries = self.tries.saturating_add(1);
        ceiling.mul_f64(crate::retry::unit_random())
    }

    fn reset(&mut self) {
        self.tries = 0;
    }
}

/// Awaits one store call, failing it as timed out past the reserve timeout; a store that
/// bounds its own calls within it gets no second timer
/// ([`Store::call_timeout`](crate::store::Store::call_timeout)). Without a tokio runtime there
/// is no timer, and the call is awaited unbounded (the layer's timeouts need a runtime, as
/// documented).
pub(crate) async fn within<T>(
    config: &Config,
    call: BoxFuture<'_, Result<T, StoreError>>,
) -> Result<T, StoreError> {
    if config.store_bounds_calls() || !has_runtime() {
        return call.await;
    }
    tokio::time::timeout(config.reserve_timeout, call)
        .await
        .unwrap_or_else(|_elapsed| Err(StoreError::timeout()))
}

/// The lease of the keys a send holds, as this process sees it: when it ends, and which keys
/// are no longer renewed (lost, or settled).
pub(crate) struct Lease {
    length: Duration,
    state: Mutex<LeaseState>,
}

struct LeaseState {
    ends: Instant,
    /// Positions of held keys not to renew again. Empty, and so unallocated, on the usual
    /// path.
    stopped: Vec<usize>,
}

impl Lease {
    /// The lease of a reservation asked at `asked_at`.
    pub(crate) fn new(config: &Config, asked_at: Instant) -> Self {
        Self {
            length: config.lease,
            state: Mutex::new(LeaseState {
                ends: after(asked_at, config.lease),
                stopped: Vec::new(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, LeaseState> {
        // Every update below is a single assignment or push: a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// When the lease ends, by the local clock (no later than by the store's).
    pub(crate) fn ends(&self) -> Instant {
        self.state().ends
    }

    /// When the next renewal is due: once a third of the lease has passed since it was last
    /// set, leaving two thirds of it to ride out a store outage.
    fn renew_at(&self) -> Instant {
        let ends = self.ends();
        ends.checked_sub(self.length * 2 / 3).unwrap_or(ends)
    }

    /// Whether a renewal is due at `now`.
    pub(crate) fn renewal_due(&self, now: Instant) -> bool {
        now >= self.renew_at()
    }

    /// Stops renewing the key at position `i` of the send's held keys.
    pub(crate) fn stop_renewing(&self, i: usize) {
        let mut state = self.state();
        if !state.stopped.contains(&i) {
            state.stopped.push(i);
        }
    }

    fn renewing(&self, i: usize) -> bool {
        !self.state().stopped.contains(&i)
    }

    fn renewed(&self, ends: Instant) {
        self.state().ends = ends;
    }
}

/// Whether the layer renews leases at all: turned on, and the store not known to lack
/// `extend`.
fn renewal_on(config: &Config) -> bool {
    config.renew && !config.extend_unsupported.load(Ordering::Relaxed)
}

/// What one round of renewal did.
pub(crate) enum Renewal {
    /// Every key still renewed got a fresh lease.
    Renewed,
    /// A transient store error: try again soon; the lease's end is unchanged.
    Retry,
    /// Nothing is left to renew (renewal off, keys lost, or the store cannot extend).
    Stopped,
}

/// Extends the lease of every held key still renewed, in one concurrent round.
pub(crate) async fn renew_once(config: &Config, held: &[Held], lease: &Lease) -> Renewal {
    if !renewal_on(config) {
        return Renewal::Stopped;
    }
    let renewed: Vec<(usize, &Held)> = held
        .iter()
        .enumerate()
        .filter(|(i, _)| lease.renewing(*i))
        .collect();
    if renewed.is_empty() {
        return Renewal::Stopped;
    }
    let asked_at = Instant::now();
    let answers = join_all(
        renewed
            .iter()
            .map(|(_, h)| within(config, config.store.extend(&h.key, h.token, config.lease))),
    )
    .await;
    let mut retry = false;
    let mut extended = false;
    for ((i, h), answer) in renewed.into_iter().zip(answers) {
        match answer {
            Ok(true) => extended = true,
            Ok(false) => {
                lease.stop_renewing(i);
                bump(&config.counters.renewal_lost);
                tracing::warn!(
                    namespace = %config.namespace,
                    key_hash = %key_hash(&h.key),
                    code = codes::STORE_FAILED_WARNING,
                    "the lease of a running send passed before it could be renewed: a repeat \
                     may reserve the key and send again; make the lease longer than the store \
                     outages you expect"
                );
            }
            Err(error) if error.kind() == StoreErrorKind::Unsupported => {
                if !config.extend_unsupported.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        namespace = %config.namespace,
                        code = codes::STORE_FAILED_WARNING,
                        error = %error,
                        "the idempotency store cannot extend a lease: keys are held for the \
                         lease given at reserve time only, so the lease must be longer than a \
                         send with all its retries"
                    );
                }
                return Renewal::Stopped;
            }
            Err(error) if transient(&error) => retry = true,
            Err(error) => {
                lease.stop_renewing(i);
                tracing::warn!(
                    namespace = %config.namespace,
                    key_hash = %key_hash(&h.key),
                    code = codes::STORE_FAILED_WARNING,
                    error = %error,
                    "the idempotency store refused to renew a lease; the key is held until \
                     its lease ends"
                );
            }
        }
    }
    if retry {
        Renewal::Retry
    } else if extended {
        lease.renewed(after(asked_at, config.lease));
        Renewal::Renewed
    } else {
        Renewal::Stopped
    }
}

/// Renews the lease of `held` for as long as it is polled, and finishes once it has been
/// polled for the maximum hold. Without a tokio runtime it never finishes and renews nothing.
async fn watch(config: &Config, held: &[Held], lease: &Lease) {
    if !has_runtime() {
        return std::future::pending().await;
    }
    let give_up_at = after(Instant::now(), config.max_hold);
    let mut backoff = Backoff::default();
    let mut renewing = renewal_on(config);
    let mut next = lease.renew_at();
    loop {
        if !renewing || next >= give_up_at {
            tokio::time::sleep_until(give_up_at).await;
            return;
        }
        tokio::time::sleep_until(next).await;
        match renew_once(config, held, lease).await {
            Renewal::Renewed => {
                backoff.reset();
                next = lease.renew_at();
            }
            Renewal::Retry => next = after(Instant::now(), backoff.next_delay()),
            Renewal::Stopped => renewing = false,
        }
    }
}

/// Runs a send while holding its keys: renews their lease while it runs, and gives it up
/// (`None`, the send dropped) once it has run for the maximum hold.
///
/// The watch starts only once the send is pending, so a send that is over at its first poll
/// arms no timer. Without a tokio runtime the send runs unwatched: no renewal, no maximum
/// hold.
pub(crate) async fn hold<F: Future>(
    config: &Config,
    held: &[Held],
    lease: &Lease,
    send: F,
) -> Option<F::Output> {
    let mut send = pin!(send);
    let mut watch = pin!(watch(config, held, lease));
    poll_fn(|cx| {
        if let Poll::Ready(output) = send.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        watch.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// The answer to a send given up after the maximum hold: counted once per key it held,
/// warned once.
pub(crate) fn given_up(config: &Config, keys: usize) -> SendError {
    bump_by(&config.counters.max_hold, keys);
    tracing::warn!(
        namespace = %config.namespace,
        code = codes::MAX_HOLD,
        max_hold = ?config.max_hold,
        keys,
        "the inner service ran longer than the maximum hold: the send was given up and its \
         keys kept as of unknown delivery"
    );
    SendError::max_hold()
}
