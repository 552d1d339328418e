//! [`ResponseFuture`]: the future of an [`HttpTransport`](super::HttpTransport) send.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http_body::Body;
use http_body_util::combinators::Collect;
use http_body_util::{BodyExt, Limited};
use pin_project_lite::pin_project;

use super::codec::Codec;
use super::status::{self, NotSentFn};
use crate::message::Message;
use crate::outcome::{BoxError, Receipt, SendError};

pin_project! {
    /// The future of a send through [`HttpTransport`](super::HttpTransport): waits for the
    /// answer, reads its body (bounded) and maps it to an outcome.
    pub struct ResponseFuture<F, B, C>
    where
        B: Body,
        B::Error: Into<BoxError>,
    {
        #[pin]
        state: State<F, B>,
        codec: Arc<C>,
        message: Message,
        max_body: usize,
        not_sent: NotSentFn,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B>
    where
        B: Body,
        B::Error: Into<BoxError>,
    {
        // The codec refused the message; the client was never called.
        Rejected { error: Option<SendError> },
        Calling { #[pin] future: F },
        Reading {
            #[pin]
            body: Collect<Limited<B>>,
            parts: Option<http::response::Parts>,
        },
    }
}

impl<F, B, C> ResponseFuture<F, B, C>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    pub(crate) fn new(
        future: F,
        codec: Arc<C>,
        message: Message,
        max_body: usize,
        not_sent: NotSentFn,
    ) -> Self {
        Self {
            state: State::Calling { future },
            codec,
            message,
            max_body,
            not_sent,
        }
    }

    pub(crate) fn rejected(error: SendError, codec: Arc<C>, message: Message) -> Self {
        Self {
            state: State::Rejected { error: Some(error) },
            codec,
            message,
            max_body: 0,
            not_sent: status::connection_refused,
        }
    }
}

impl<F, B, C, E> Future for ResponseFuture<F, B, C>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    E: Into<BoxError>,
    B: Body,
    B::Error: Into<BoxError>,
    C: Codec,
{
    type Output = Result<Receipt, SendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.state.as_mut().project() {
                StateProj::Rejected { error } => {
                    return Poll::Ready(Err(error.take().unwrap_or_else(polled_after_completion)));
                }
                StateProj::Calling { future } => match ready!(future.poll(cx)) {
                    Err(error) => {
                        return Poll::Ready(Err(status::from_inner_error(
                            error.into(),
                            *this.not_sent,
                        )));
                    }
                    Ok(response) => {
                        let (parts, body) = response.into_parts();
                        this.state.set(State::Reading {
                            body: Limited::new(body, *this.max_body).collect(),
                            parts: Some(parts),
                        });
                    }
                },
                StateProj::Reading { body, parts } => {
                    let collected = ready!(body.poll(cx));
                    let Some(parts) = parts.take() else {
                        return Poll::Ready(Err(polled_after_completion()));
                    };
                    let codec: &C = this.codec;
                    return Poll::Ready(match collected {
                        Ok(collected) => status::from_response(
                            codec,
                            this.message,
                            &http::Response::from_parts(parts, collected.to_bytes()),
                        ),
                        Err(error) => Err(status::from_unread_body(
                            codec,
                            parts,
                            error,
                            *this.max_body,
                        )),
                    });
                }
            }
        }
    }
}

fn polled_after_completion() -> SendError {
    SendError::unknown_delivery(
        crate::outcome::codes::UNKNOWN,
        "the send future was polled after it completed",
    )
}

impl<F, B, C> fmt::Debug for ResponseFuture<F, B, C>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Rejected { .. } => "rejected",
            State::Calling { .. } => "calling",
            State::Reading { .. } => "reading",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
