//! One timer per store call: the layer's bound on a call and a networked store's own timeout,
//! armed as a single timer.
//!
//! The layer bounds every store call it makes (its reserve timeout); [`RedisStore`] and
//! [`PostgresStore`] bound each operation by their own timeout too, so that a store called
//! without the layer is bounded as well. Armed separately, that is two timers per call. Here
//! the layer, while it polls a store call ([`within`]), says what its deadline is; a store's
//! own bound ([`store_call`]) then arms its one timer at the earlier of its own deadline and
//! the layer's, and tells the layer so, which then arms none. Either way the call fails with
//! a [`Timeout`](super::StoreErrorKind::Timeout) error when the earlier deadline passes.
//!
//! The layer arms a timer of its own whenever it waits on something no such store bound
//! covers: a store of another kind, or a step of a store that wraps ours and waits on
//! something else. A call polled outside the layer sees no layer deadline and is bounded by
//! the store's own timeout alone.
//!
//! The two talk through a thread-local set for the length of one poll: a poll runs on one
//! thread from start to end, and it holds plain values, so nothing outlives the poll.
//!
//! [`RedisStore`]: super::RedisStore
//! [`PostgresStore`]: super::PostgresStore

use std::cell::Cell;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use super::StoreError;

/// The layer's bound on the store call being polled on this thread, if any.
#[derive(Clone, Copy, Debug)]
struct Bound {
    deadline: Deadline,
    /// Whether a store's own timer, at or before the deadline, waits with this poll.
    covered: bool,
    /// Whether a store's timer found the deadline passed in this poll.
    passed: bool,
}

#[derive(Clone, Copy, Debug)]
enum Deadline {
    /// Not yet fixed: the call's first poll that needs the time reads the clock. A store that
    /// answers at once (an in-process one) then costs no clock read.
    After(Duration),
    At(Instant),
}

impl Bound {
    /// The deadline, fixed from `now()` if it was not yet.
    fn fix(&mut self, now: impl FnOnce() -> Instant) -> Instant {
        match self.deadline {
            Deadline::At(at) => at,
            Deadline::After(timeout) => {
                let at = later(now(), timeout);
                self.deadline = Deadline::At(at);
                at
            }
        }
    }
}

thread_local! {
    static LAYER: Cell<Option<Bound>> = const { Cell::new(None) };
}

/// Changes the layer's bound of the current poll, if a layer is polling.
#[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
fn with_layer<R>(change: impl FnOnce(&mut Bound) -> R) -> Option<R> {
    LAYER.get().map(|mut bound| {
        let answer = change(&mut bound);
        LAYER.set(Some(bound));
        answer
    })
}

/// `now + timeout`, or a far future (30 years) when that does not fit in an `Instant`, as
/// tokio's own timeout does.
fn later(now: Instant, timeout: Duration) -> Instant {
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 24 * 3600))
}

/// Awaits `call` under the layer's bound `timeout`: fails with a
/// [`Timeout`](super::StoreErrorKind::Timeout) error if it has not answered by then, and
/// drops it (the caller may still finish it: see `layer::reserve`). An answer ready at its
/// first poll arms no timer and reads no clock; a store bound ([`store_call`]) covering the
/// deadline arms the only timer; otherwise the layer arms its own, once. Without a tokio
/// runtime the call is awaited unbounded (the layer's timeouts need a runtime, as
/// documented).
pub(crate) async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let mut call = pin!(call);
    // Boxed when armed: most calls arm none (an in-process store, or a store bound covering
    // the wait), and a send's future then keeps no room for a timer.
    let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let mut deadline = Deadline::After(timeout);
    poll_fn(|cx| {
        let outer = LAYER.replace(Some(Bound {
            deadline,
            covered: false,
            passed: false,
        }));
        let answer = call.as_mut().poll(cx);
        let Some(mut bound) = LAYER.replace(outer) else {
            return answer;
        };
        deadline = bound.deadline;
        if answer.is_ready() {
            return answer;
        }
        if bound.passed {
            return Poll::Ready(Err(StoreError::timeout()));
        }
        if bound.covered {
            return Poll::Pending;
        }
        if timer.is_none() {
            if tokio::runtime::Handle::try_current().is_err() {
                return Poll::Pending;
            }
            let at = bound.fix(Instant::now);
            deadline = bound.deadline;
            timer = Some(Box::pin(tokio::time::sleep_until(at)));
        }
        match timer.as_mut().map(|sleep| sleep.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err(StoreError::timeout())),
            Some(Poll::Pending) | None => Poll::Pending,
        }
    })
    .await
}

/// A networked store's bound on one operation: fails `work` with a
/// [`Timeout`](super::StoreErrorKind::Timeout) error when `timeout` has passed. One timer,
/// armed at the first poll, at the earlier of that and the deadline of the layer polling
/// this call, if any; the layer arms none while this one covers the wait.
///
/// When the layer's deadline is the earlier, it passes with the work still under way: the
/// layer then fails the call and may finish the work in the background (to free what a
/// reservation it gave up on took), and the same timer is moved to this call's own deadline.
#[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
pub(crate) async fn store_call<T, F>(
    timeout: Duration,
    work: impl FnOnce() -> F,
) -> Result<T, StoreError>
where
    F: Future<Output = Result<T, StoreError>>,
{
    let now = Instant::now();
    let own = later(now, timeout);
    let first = with_layer(|bound| bound.fix(|| now)).map_or(own, |layer| layer.min(own));
    // Made here, in the slot it is polled from, rather than moved in.
    let mut work = pin!(work());
    let mut timer = pin!(tokio::time::sleep_until(first));
    poll_fn(|cx| {
        if let Poll::Ready(answer) = work.as_mut().poll(cx) {
            return Poll::Ready(answer);
        }
        while timer.as_mut().poll(cx).is_ready() {
            if timer.deadline() >= own {
                return Poll::Ready(Err(StoreError::timeout()));
            }
            // The layer's deadline passed: it gives up on this call; our own bound remains.
            with_layer(|bound| bound.passed = true);
            timer.as_mut().reset(own);
        }
        let at = timer.deadline();
        with_layer(|bound| bound.covered |= at <= bound.fix(Instant::now));
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::future::pending;

    use super::*;
    use crate::store::StoreErrorKind;

    const SECOND: Duration = Duration::from_secs(1);

    /// The number of timers the runtime has armed and not yet fired or dropped is not
    /// observable; what is: which deadline ends the call, and that the layer's bound holds
    /// when the store's own is longer, shorter, or absent.
    async fn ends_after<T: std::fmt::Debug>(
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Duration {
        let started = Instant::now();
        let answer = call.await;
        assert_eq!(
            answer.expect_err("timed out").kind(),
            StoreErrorKind::Timeout
        );
        started.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn the_earlier_deadline_ends_the_call() {
        let store = |t| store_call(t, pending::<Result<(), StoreError>>);
        assert_eq!(ends_after(within(SECOND, store(5 * SECOND))).await, SECOND);
        assert_eq!(ends_after(within(5 * SECOND, store(SECOND))).await, SECOND);
        assert_eq!(ends_after(store(3 * SECOND)).await, 3 * SECOND);
        // A call no store bound covers is ended by the layer alone.
        assert_eq!(
            ends_after(within(2 * SECOND, pending::<Result<(), StoreError>>())).await,
            2 * SECOND
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wrapping_store_that_waits_on_something_else_is_still_bounded_by_the_layer() {
        // First a bounded store call that answers, then a wait nothing bounds.
        let wrapper = async {
            store_call(10 * SECOND, || async {
                tokio::time::sleep(SECOND).await;
                Ok(())
            })
            .await?;
            pending::<Result<(), StoreError>>().await
        };
        assert_eq!(ends_after(within(3 * SECOND, wrapper)).await, 3 * SECOND);
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_call_started_later_keeps_the_layer_deadline_of_the_first_poll() {
        // Two store calls one after the other: the second may not stretch the layer's bound.
        let calls = async {
            store_call(10 * SECOND, || async {
                tokio::time::sleep(2 * SECOND).await;
                Ok(())
            })
            .await?;
            store_call(10 * SECOND, pending::<Result<(), StoreError>>).await
        };
        assert_eq!(ends_after(within(3 * SECOND, calls)).await, 3 * SECOND);
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_layer_deadline_the_work_can_still_finish_within_the_store_bound() {
        let mut call = Box::pin(store_call(5 * SECOND, || async {
            tokio::time::sleep(2 * SECOND).await;
            Ok::<_, StoreError>(7)
        }));
        assert_eq!(ends_after(within(SECOND, &mut call)).await, SECOND);
        // Finished in the background (as the layer does with an abandoned reservation).
        let started = Instant::now();
        assert_eq!(call.await.unwrap(), 7);
        assert_eq!(started.elapsed(), SECOND);
        // And the store's own bound still ends work that never answers.
        let mut stuck = Box::pin(store_call(5 * SECOND, || {
            pending::<Result<(), StoreError>>()
        }));
        assert_eq!(ends_after(within(SECOND, &mut stuck)).await, SECOND);
        assert_eq!(ends_after(stuck).await, 4 * SECOND);
    }

    #[tokio::test(start_paused = true)]
    async fn answers_in_time_are_answers() {
        let answer = within(
            SECOND,
            store_call(SECOND, || async {
                tokio::time::sleep(SECOND / 2).await;
                Ok::<_, StoreError>(7)
            }),
        )
        .await;
        assert_eq!(answer.unwrap(), 7);
        assert_eq!(
            within(SECOND, std::future::ready(Ok::<_, StoreError>(8)))
                .await
                .unwrap(),
            8
        );
    }

    #[test]
    fn without_a_runtime_an_answer_ready_at_once_needs_no_timer() {
        let answer = futures_util::FutureExt::now_or_never(within(
            SECOND,
            std::future::ready(Ok::<_, StoreError>(1)),
        ));
        assert_eq!(answer.map(Result::unwrap), Some(1));
    }
}
