//! [`ResponseFuture`]: the future of a send through the layer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;

use crate::outcome::{Receipt, SendError};

/// The response future of [`Idempotency`](super::Idempotency).
///
/// Dropping it is safe at any point: before the provider was called the key is freed (or
/// never taken); after, the key is kept with an `idempotency.aborted` outcome, written by a
/// task spawned on the current tokio runtime; once the provider answered, the settlement of
/// its outcome goes on in the background. The renewal of the key's lease stops with it.
pub struct ResponseFuture {
    inner: BoxFuture<'static, Result<Receipt, SendError>>,
}

impl ResponseFuture {
    pub(crate) fn new(inner: BoxFuture<'static, Result<Receipt, SendError>>) -> Self {
        Self { inner }
    }
}

impl Future for ResponseFuture {
    type Output = Result<Receipt, SendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
