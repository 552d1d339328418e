//! The worker's drain: it claims rows as send slots free up, hands them to the stack, up to
//! the worker's concurrency at once, and records their answers in batches, all in the task
//! that runs the worker (no send outlives it).
//!
//! One task drives every part, so a statement in flight never stalls a send in flight:
//!
//! - a claim asks for a row for every free slot, and runs while the last claim found as many
//!   rows as it asked for, once a batch of slots is free; otherwise when a notification or
//!   the poll interval wakes the worker;
//! - a claimed row waits in `queued` until the stack is ready (a limit in the stack holds it
//!   there), then its send joins `sends`;
//! - each answer becomes a mark, and one statement records every mark made while the last
//!   one ran, so the marks batch themselves as the load grows;
//! - told to stop, the drain claims nothing more, puts back what is queued, lets the sends in
//!   hand answer, records them, and ends.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::rows::{Claimed, Mark, Row, Verdict};
use super::settings::Settings;
use crate::classify::{Classifier, into_send_error};
use crate::message::Message;
use crate::outcome::{BoxError, Receipt};
use crate::store::StoreError;

/// A claimed row whose message waits for the stack to be ready.
struct Queued {
    row: Row,
    message: Message,
}

/// A send in flight, named so the drain can hold many of them.
struct Sending<F> {
    row: Row,
    // Boxed: the stack's future need not be `Unpin`.
    future: Pin<Box<F>>,
}

impl<F, E> Future for Sending<F>
where
    F: Future<Output = Result<Receipt, E>>,
    E: Into<BoxError>,
{
    type Output = (Row, Result<Receipt, BoxError>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let result = ready!(self.future.as_mut().poll(cx));
        // Converted at once: the stack's error type need not be `Send`.
        Poll::Ready((self.row, result.map_err(Into::into)))
    }
}

/// The drain's state; [`Drain::poll_drain`] drives it until it is told to stop and done.
pub(super) struct Drain<S: Service<Message>> {
    settings: Arc<Settings>,
    service: S,
    classifier: Classifier,
    wake: Arc<Notify>,
    notified: BoxFuture<'static, ()>,
    tick: Pin<Box<Sleep>>,
    listener: Option<JoinHandle<()>>,
    /// A claim is wanted: the worker was woken, or it just started.
    woken: bool,
    /// The last claim found as many rows as it asked for: more are likely waiting.
    more_waiting: bool,
    claiming: Option<BoxFuture<'static, Result<Vec<Claimed>, StoreError>>>,
    /// How many rows the running claim asked for.
    asked: usize,
    queued: VecDeque<Queued>,
    sends: FuturesUnordered<Sending<S::Future>>,
    marks: Vec<Mark>,
    marking: Option<BoxFuture<'static, ()>>,
    releasing: Option<BoxFuture<'static, ()>>,
    stopping: bool,
}

impl<S: Service<Message>> Drop for Drain<S> {
    fn drop(&mut self) {
        // A worker dropped mid-run (its task aborted) must not leave its LISTEN connection.
        if let Some(listener) = self.listener.take() {
            listener.abort();
        }
    }
}

impl<S> Drain<S>
where
    S: Service<Message, Response = Receipt>,
    S::Error: Into<BoxError>,
{
    pub(super) fn new(settings: Settings, service: S) -> Self {
        let settings = Arc::new(settings);
        let wake = Arc::new(Notify::new());
        let tick = Box::pin(tokio::time::sleep(settings.poll_interval));
        let listener = settings.listen(&wake);
        Self {
            notified: notified(&wake),
            wake,
            tick,
            listener,
            settings,
            service,
            classifier: Classifier::default(),
            woken: true,
            more_waiting: false,
            claiming: None,
            asked: 0,
            queued: VecDeque::new(),
            sends: FuturesUnordered::new(),
            marks: Vec::new(),
            marking: None,
            releasing: None,
            stopping: false,
        }
    }

    /// Drives every part of the drain until none can move; ready once `shutdown` completed
    /// and everything claimed is recorded or put back.
    pub(super) fn poll_drain(
        &mut self,
        cx: &mut Context<'_>,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> Poll<()> {
        loop {
            let mut moved = false;
            if !self.stopping && shutdown.as_mut().poll(cx).is_ready() {
                self.stopping = true;
                moved = true;
            }
            moved |= self.poll_claim(cx);
            moved |= self.start_sends(cx);
            moved |= self.poll_sends(cx);
            moved |= self.poll_marks(cx);
            moved |= self.poll_release(cx);
            if self.stopping {
                if self.finished() {
                    return Poll::Ready(());
                }
            } else {
                moved |= self.poll_wake(cx);
                moved |= self.start_claim();
            }
            // Anything started above is polled, and so registered, on the next turn.
            if !moved {
                return Poll::Pending;
            }
        }
    }

    fn finished(&self) -> bool {
        self.claiming.is_none()
            && self.queued.is_empty()
            && self.sends.is_empty()
            && self.marks.is_empty()
            && self.marking.is_none()
            && self.releasing.is_none()
    }

    /// Starts a claim when slots are free and one is wanted.
    fn start_claim(&mut self) -> bool {
        if self.claiming.is_some() {
            return false;
        }
        let settings = &self.settings;
        let busy = self.sends.len() + self.queued.len();
        let free = (settings.concurrency as usize).saturating_sub(busy);
        let batch = settings.batch.min(settings.concurrency) as usize;
        let wanted = self.woken || (self.more_waiting && free >= batch);
        if free == 0 || !wanted {
            return false;
        }
        // Every free slot: slots free up while a claim runs, so under load claims grow with
        // the rate of answers, as the marks do.
        self.asked = free;
        self.woken = false;
        self.tick
            .as_mut()
            .reset(Instant::now() + settings.poll_interval);
        // `asked` is at most the concurrency, a `u32`.
        let rows = u32::try_from(self.asked).unwrap_or(settings.concurrency);
        self.claiming = Some(Arc::clone(settings).claim(rows).boxed());
        true
    }

    fn poll_claim(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(claiming) = &mut self.claiming else {
            return false;
        };
        let Poll::Ready(answer) = claiming.poll_unpin(cx) else {
            return false;
        };
        self.claiming = None;
        match answer {
            Ok(claimed) => {
                self.more_waiting = claimed.len() >= self.asked;
                for Claimed { row, message } in claimed {
                    match message {
                        Ok(message) => self.queued.push_back(Queued { row, message }),
                        Err(error) => self.marks.push(Mark {
                            row,
                            verdict: Verdict::Dead(format!("outbox.corrupt: {error}")),
                        }),
                    }
                }
            }
            Err(error) => {
                self.more_waiting = false;
                tracing::warn!(error = %error, table = %self.settings.outbox.table_name(), "outbox claim failed; trying again at the next poll");
            }
        }
        true
    }

    /// Hands queued rows to the stack while it is ready.
    fn start_sends(&mut self, cx: &mut Context<'_>) -> bool {
        if self.stopping {
            return false;
        }
        let mut started = false;
        while !self.queued.is_empty() {
            let ready = match self.service.poll_ready(cx) {
                Poll::Pending => break,
                Poll::Ready(ready) => ready,
            };
            let Some(Queued { row, message }) = self.queued.pop_front() else {
                break;
            };
            match ready {
                Ok(()) => self.sends.push(Sending {
                    row,
                    future: Box::pin(self.service.call(message)),
                }),
                Err(error) => {
                    let error = into_send_error(&self.classifier, error.into());
                    self.marks.push(self.settings.judge(row, Err(error)));
                }
            }
            started = true;
        }
        started
    }

    fn poll_sends(&mut self, cx: &mut Context<'_>) -> bool {
        let mut answered = false;
        while let Poll::Ready(Some((row, result))) = self.sends.poll_next_unpin(cx) {
            let result = result.map_err(|error| into_send_error(&self.classifier, error));
            self.marks.push(self.settings.judge(row, result));
            answered = true;
        }
        answered
    }

    /// Polls the running mark statement; when none runs, starts one with every mark made.
    fn poll_marks(&mut self, cx: &mut Context<'_>) -> bool {
        let mut moved = false;
        if let Some(marking) = &mut self.marking {
            if marking.poll_unpin(cx).is_pending() {
                return false;
            }
            self.marking = None;
            moved = true;
        }
        if !self.marks.is_empty() {
            let marks = std::mem::take(&mut self.marks);
            self.marking = Some(Arc::clone(&self.settings).mark(marks).boxed());
            moved = true;
        }
        moved
    }

    /// Once told to stop, puts back the rows claimed and not handed to the stack.
    fn poll_release(&mut self, cx: &mut Context<'_>) -> bool {
        let mut moved = false;
        if let Some(releasing) = &mut self.releasing {
            if releasing.poll_unpin(cx).is_pending() {
                return false;
            }
            self.releasing = None;
            moved = true;
        }
        if self.stopping && !self.queued.is_empty() {
            let rows = self.queued.drain(..).map(|q| q.row).collect();
            self.releasing = Some(Arc::clone(&self.settings).release(rows).boxed());
            moved = true;
        }
        moved
    }

    /// A notification or the poll interval asks for a claim; the poll also starts the
    /// `LISTEN` task again when its connection ended.
    fn poll_wake(&mut self, cx: &mut Context<'_>) -> bool {
        let mut moved = false;
        if self.notified.poll_unpin(cx).is_ready() {
            self.notified = notified(&self.wake);
            self.woken = true;
            moved = true;
        }
        if self.tick.as_mut().poll(cx).is_ready() {
            let next = Instant::now() + self.settings.poll_interval;
            self.tick.as_mut().reset(next);
            self.woken = true;
            if self.listener.as_ref().is_none_or(JoinHandle::is_finished) {
                self.listener = self.settings.listen(&self.wake);
            }
            moved = true;
        }
        moved
    }
}

fn notified(wake: &Arc<Notify>) -> BoxFuture<'static, ()> {
    let wake = Arc::clone(wake);
    async move { wake.notified().await }.boxed()
}
