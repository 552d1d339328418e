//! Settling the keys a send reserved once it is over: kept with the outcome or freed, even
//! when the caller drops the send first, and retried on transient store errors until the
//! settlement lands or the lease is about to end.
//!
//! The caller waits for a settlement at most the settle timeout; past it, and whenever the
//! caller drops the send, the settlement goes on in a task of its own. While it retries it
//! keeps renewing the lease, so a store that flickers does not free a key whose message went.

use std::future::{Future, poll_fn};
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::config::Config;
use super::key::key_hash;
use super::renew::{Backoff, Held, Lease, after, has_runtime, hold, renew_once, transient, within};
use super::reserve::spawn_detached;
use super::stats::{bump, bump_by};
use crate::outcome::{Outcome, Receipt, SendError, codes};
use crate::store::{Completion, StoreError};

/// What to do with a reserved key once its send is over.
pub(crate) enum Finish {
    /// Keep it done with this outcome.
    Complete(Outcome),
    /// Free it: the message certainly did not go.
    Release,
}

impl Finish {
    /// The finish for a send's result: keep what may have gone, free what certainly did not.
    /// `recipients` are the message's, by which a receipt's accepted addresses are kept.
    pub(crate) fn for_result(result: &Result<Receipt, SendError>, recipients: &[&str]) -> Self {
        match result {
            Err(error) if !error.delivery_unknown() => Self::Release,
            _ => Self::Complete(Outcome::kept(result, recipients)),
        }
    }

    fn action(&self) -> &'static str {
        match self {
            Self::Complete(_) => "keep the outcome",
            Self::Release => "free the key",
        }
    }
}

/// Keeps or frees the keys a send reserved once it is over: in the caller's task for at most
/// the settle timeout, in a task of its own for what is left past it.
pub(crate) struct Settle {
    state: State,
}

enum State {
    /// Reserved and not yet settled: the layer's configuration, the keys and their lease.
    Holding(Arc<Config>, Vec<Held>, Lease),
    /// Their settlement, under way in the caller's task; boxed, so that what is left of it
    /// can move to a task of its own.
    Settling(BoxFuture<'static, ()>),
    /// Nothing left here: settled, or handed to a task of its own.
    Done,
}

impl Settle {
    pub(crate) fn new(config: Arc<Config>, held: Vec<Held>, lease: Lease) -> Self {
        Self {
            state: State::Holding(config, held, lease),
        }
    }

    /// Runs the send while holding its keys: their lease renewed, the send given up
    /// (`None`) past the maximum hold. See [`hold`].
    ///
    /// Takes `&mut self` though it changes nothing: a `Settle` is `Send` but not `Sync` (a
    /// settlement under way is not), and a shared borrow across an await would need both.
    pub(crate) async fn hold<F: Future>(&mut self, send: F) -> Option<F::Output> {
        match &self.state {
            State::Holding(config, held, lease) => hold(config, held, lease, send).await,
            State::Settling(_) | State::Done => Some(send.await),
        }
    }

    /// Settles each held key by its finish (one per key, in order) in the caller's task, and
    /// returns once that is over or the settle timeout passed. What is left then goes on in a
    /// task of its own, as it does when the caller drops this future (see the `Drop` below).
    /// Without a runtime there is no timer and no task: the settlement's one attempt.
    pub(crate) async fn run(&mut self, finishes: Vec<Finish>) {
        let State::Holding(config, held, lease) = mem::replace(&mut self.state, State::Done) else {
            return;
        };
        // A store that answers at once keeps a single send's outcome with no future or timer.
        if let ([h], [Finish::Complete(outcome)]) = (held.as_slice(), finishes.as_slice())
            && let Some(Ok(written)) =
                (config.store).complete_now(&h.key, h.token, h.fingerprint, outcome, config.ttl)
        {
            if !written {
                lease_lost(&config, h);
            }
            return;
        }
        let settle_timeout = config.settle_timeout;
        // Boxed at once, on both paths: awaited inline, its state would size the future of
        // every send, replays too.
        let settlement = settlement(config, held, lease, finishes).boxed();
        if !has_runtime() {
            return settlement.await;
        }
        self.state = State::Settling(settlement);
        let in_place = poll_fn(|cx| self.poll_settling(cx));
        if let Err(_elapsed) = tokio::time::timeout(settle_timeout, in_place).await {
            self.hand_over();
        }
    }

    fn poll_settling(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let State::Settling(settlement) = &mut self.state {
            ready!(settlement.poll_unpin(cx));
            self.state = State::Done;
        }
        Poll::Ready(())
    }

    /// Moves a settlement under way to a task of its own, to finish there.
    fn hand_over(&mut self) {
        if let State::Settling(rest) = mem::replace(&mut self.state, State::Done) {
            spawn_detached(rest);
        }
    }
}

impl Drop for Settle {
    /// A drop never frees a key: once a `Settle` exists its message may have gone. Keys not
    /// yet settled are kept `idempotency.aborted`; a settlement under way goes on.
    fn drop(&mut self) {
        match mem::replace(&mut self.state, State::Done) {
            State::Holding(config, held, lease) => {
                if held.is_empty() {
                    return;
                }
                let finishes = held
                    .iter()
                    .map(|_| {
                        bump(&config.counters.aborted);
                        Finish::Complete(Outcome::failed(SendError::aborted()))
                    })
                    .collect();
                spawn_detached(settlement(config, held, lease, finishes));
            }
            State::Settling(rest) => spawn_detached(rest),
            State::Done => {}
        }
    }
}

/// How close to the lease's end a settlement stops retrying: a tenth of the lease, at most
/// a second.
fn margin(lease: Duration) -> Duration {
    (lease / 10).min(Duration::from_secs(1))
}

/// Settles `held[i]` by `finishes[i]`, retrying the keys the store failed on transiently
/// (with jittered backoff, renewing their lease when due) until each landed, was refused,
/// failed for good, or the lease is about to end. Without a runtime, one attempt.
async fn settlement(config: Arc<Config>, held: Vec<Held>, lease: Lease, finishes: Vec<Finish>) {
    // Set at the first failure: a settlement that lands at once reads no clock. Retries
    // need a runtime to sleep on, asked only once something failed.
    let mut started = None;
    let mut backoff = Backoff::default();
    let mut open: Option<Vec<usize>> = None; // None: every key, on the first attempt
    let mut attempts = 1u32;
    loop {
        let mut again = Vec::new();
        let answered = |i: usize, answer: Result<bool, Arc<StoreError>>| match answer {
            Err(error) if transient(&error) && has_runtime() => again.push((i, error)),
            Ok(true) => {}
            Ok(false) => not_written(&config, &held[i], &finishes[i], attempts > 1),
            Err(error) => gave_up(&config, &held[i], &finishes[i], &error, &lease, attempts),
        };
        attempt(
            &config,
            &held,
            &finishes,
            open.as_deref(),
            attempts > 1,
            answered,
        )
        .await;
        if again.is_empty() {
            return;
        }
        // The keys settled for good: a renewal while the rest retry would find them lost.
        for i in positions(open.as_deref(), held.len()) {
            if !again.iter().any(|(j, _)| *j == i) {
                lease.stop_renewing(i);
            }
        }
        let now = Instant::now();
        let started = *started.get_or_insert(now);
        let resume = after(now, backoff.next_delay());
        if after(resume, margin(config.lease)) >= lease.ends()
            || resume >= after(started, config.max_hold)
        {
            for (i, error) in &again {
                gave_up(&config, &held[*i], &finishes[*i], error, &lease, attempts);
            }
            return;
        }
        tokio::time::sleep_until(resume).await;
        if lease.renewal_due(Instant::now()) {
            renew_once(&config, &held, &lease).await;
        }
        open = Some(again.into_iter().map(|(i, _)| i).collect());
        attempts += 1;
    }
}

/// The positions of the keys an attempt settles: those at `open`, or every key when `None`.
fn positions(open: Option<&[usize]>, keys: usize) -> impl Iterator<Item = usize> + '_ {
    let every = open.is_none().then_some(0..keys);
    open.into_iter()
        .flatten()
        .copied()
        .chain(every.into_iter().flatten())
}

/// One attempt at settling the keys at `open` (every key when `None`), telling `answered`
/// the store's answer for each key, by position. A `retry` counts its store calls in
/// `settle_retries`.
async fn attempt(
    config: &Config,
    held: &[Held],
    finishes: &[Finish],
    open: Option<&[usize]>,
    retry: bool,
    mut answered: impl FnMut(usize, Result<bool, Arc<StoreError>>),
) {
    let counted = |calls: usize| {
        if retry {
            bump_by(&config.counters.settle_retries, calls);
        }
    };
    let single = match open {
        Some(&[i]) => Some(i),
        None if held.len() == 1 => Some(0),
        _ => None,
    };
    if let Some(i) = single {
        counted(1);
        // One key settles through the store's single-key operation, several through its
        // batch operations.
        let h = &held[i];
        let call = match &finishes[i] {
            Finish::Complete(outcome) => {
                config
                    .store
                    .complete(&h.key, h.token, h.fingerprint, outcome, config.ttl)
            }
            Finish::Release => config.store.release(&h.key, h.token),
        };
        answered(i, within(config, call).await.map_err(Arc::new));
        return;
    }
    let mut completions = Vec::new();
    let mut completed = Vec::new();
    let mut releases = Vec::new();
    let mut released = Vec::new();
    for i in positions(open, held.len()) {
        let h = &held[i];
        match &finishes[i] {
            Finish::Complete(outcome) => {
                completions.push(Completion {
                    key: &h.key,
                    token: h.token,
                    fingerprint: h.fingerprint,
                    outcome,
                });
                completed.push(i);
            }
            Finish::Release => {
                releases.push((h.key.as_ref(), h.token));
                released.push(i);
            }
        }
    }
    counted(usize::from(!completions.is_empty()) + usize::from(!releases.is_empty()));
    if !completions.is_empty() {
        let result = within(config, config.store.complete_many(&completions, config.ttl)).await;
        spread(&mut answered, completed, result);
    }
    if !releases.is_empty() {
        let result = within(config, config.store.release_many(&releases)).await;
        spread(&mut answered, released, result);
    }
}

/// One answer per key from a batch call's answer; a missing answer counts as not written.
fn spread(
    answered: &mut impl FnMut(usize, Result<bool, Arc<StoreError>>),
    keys: Vec<usize>,
    result: Result<Vec<bool>, StoreError>,
) {
    match result {
        Ok(written) => {
            let written = written.into_iter().chain(std::iter::repeat(false));
            for (i, w) in keys.into_iter().zip(written) {
                answered(i, Ok(w));
            }
        }
        Err(error) => {
            let error = Arc::new(error);
            for i in keys {
                answered(i, Err(Arc::clone(&error)));
            }
        }
    }
}

/// The store refused to settle the key: another send holds it. A release tried again after
/// a failed attempt may find the key already freed by that attempt, so it says nothing.
fn not_written(config: &Config, h: &Held, finish: &Finish, retried: bool) {
    if retried && matches!(finish, Finish::Release) {
        tracing::debug!(
            namespace = %config.namespace,
            key_hash = %key_hash(&h.key),
            "the key was already free when a release was tried again"
        );
        return;
    }
    lease_lost(config, h);
}

/// Another send holds the key this one reserved: counted and warned.
fn lease_lost(config: &Config, h: &Held) {
    bump(&config.counters.lease_lost);
    tracing::warn!(
        namespace = %config.namespace,
        key_hash = %key_hash(&h.key),
        code = codes::STORE_FAILED_WARNING,
        "the lease passed before the send finished and another send holds the key; make the \
         lease longer than the store outages you expect (or than a send with all its retries, \
         without renewal)"
    );
}

/// The settlement of a key gave up: counted and warned, saying when the key is free again.
fn gave_up(
    config: &Config,
    h: &Held,
    finish: &Finish,
    error: &StoreError,
    lease: &Lease,
    attempts: u32,
) {
    bump(&config.counters.store_failed_after_send);
    let free_in = lease.ends().saturating_duration_since(Instant::now());
    let action = finish.action();
    match finish {
        Finish::Complete(_) => tracing::warn!(
            namespace = %config.namespace,
            key_hash = %key_hash(&h.key),
            code = codes::STORE_FAILED_WARNING,
            error = %error,
            attempts,
            free_in = ?free_in,
            "idempotency store failed to {action} after the send; the caller got the real \
             outcome; the key stays pending until its lease ends (free_in), and a repeat after \
             that is sent again"
        ),
        Finish::Release => tracing::warn!(
            namespace = %config.namespace,
            key_hash = %key_hash(&h.key),
            code = codes::STORE_FAILED_WARNING,
            error = %error,
            attempts,
            free_in = ?free_in,
            "idempotency store failed to {action} after a send that did not go; the caller got \
             the real outcome; the key frees itself when its lease ends (free_in)"
        ),
    }
}
