//! The futures of [`HttpTransport`](super::HttpTransport): [`ResponseFuture`] for a message,
//! [`BatchResponseFuture`] for a batch. Both drive one [`Exchange`]: call the client, then read
//! the body (bounded).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::Body;
use http_body_util::combinators::Collect;
use http_body_util::{BodyExt, Limited};
use pin_project_lite::pin_project;

use super::codec::{BatchCodec, Codec};
use super::status;
use crate::batch::BatchOutcomes;
use crate::classify::Classifier;
use crate::message::Message;
use crate::outcome::{BoxError, Receipt, SendError};

pin_project! {
    /// One request and its answer: the client's future, then the body read up to a bound.
    #[project = ExchangeProj]
    pub(crate) enum Exchange<F, B>
    where
        B: Body,
        B::Error: Into<BoxError>,
    {
        Calling { #[pin] future: F, max_body: usize },
        Reading {
            #[pin]
            body: Collect<Limited<B>>,
            parts: Option<http::response::Parts>,
            max_body: usize,
        },
        // Nothing to send, or the answer was handed out.
        Done,
    }
}

/// How an [`Exchange`] ended.
pub(crate) enum Exchanged {
    /// The whole answer.
    Answered(http::Response<Bytes>),
    /// The status came but the body could not be read (too long, cut off).
    Unread {
        parts: http::response::Parts,
        error: BoxError,
        max_body: usize,
    },
    /// The client failed: no answer.
    Failed(BoxError),
    /// Polled after it ended, or with nothing to send.
    Spent,
}

impl<F, B> Exchange<F, B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    pub(crate) fn new(future: F, max_body: usize) -> Self {
        Self::Calling { future, max_body }
    }
}

impl<F, B, E> Future for Exchange<F, B>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    E: Into<BoxError>,
    B: Body,
    B::Error: Into<BoxError>,
{
    type Output = Exchanged;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Exchanged> {
        loop {
            match self.as_mut().project() {
                ExchangeProj::Calling { future, max_body } => {
                    let max_body = *max_body;
                    match ready!(future.poll(cx)) {
                        Err(error) => {
                            self.set(Self::Done);
                            return Poll::Ready(Exchanged::Failed(error.into()));
                        }
                        Ok(response) => {
                            let (parts, body) = response.into_parts();
                            self.set(Self::Reading {
                                body: Limited::new(body, max_body).collect(),
                                parts: Some(parts),
                                max_body,
                            });
                        }
                    }
                }
                ExchangeProj::Reading {
                    body,
                    parts,
                    max_body,
                } => {
                    let collected = ready!(body.poll(cx));
                    let max_body = *max_body;
                    let parts = parts.take();
                    self.set(Self::Done);
                    let Some(parts) = parts else {
                        return Poll::Ready(Exchanged::Spent);
                    };
                    return Poll::Ready(match collected {
                        Ok(collected) => Exchanged::Answered(http::Response::from_parts(
                            parts,
                            collected.to_bytes(),
                        )),
                        Err(error) => Exchanged::Unread {
                            parts,
                            error,
                            max_body,
                        },
                    });
                }
                ExchangeProj::Done => return Poll::Ready(Exchanged::Spent),
            }
        }
    }
}

pin_project! {
    /// The future of a send through [`HttpTransport`](super::HttpTransport): waits for the
    /// answer, reads its body (bounded) and maps it to an outcome.
    pub struct ResponseFuture<F, B, C>
    where
        B: Body,
        B::Error: Into<BoxError>,
    {
        #[pin]
        exchange: Exchange<F, B>,
        // The codec refused the message; the client was never called.
        rejected: Option<SendError>,
        codec: Arc<C>,
        message: Message,
        classifier: Classifier,
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
        classifier: Classifier,
    ) -> Self {
        Self {
            exchange: Exchange::new(future, max_body),
            rejected: None,
            codec,
            message,
            classifier,
        }
    }

    pub(crate) fn rejected(error: SendError, codec: Arc<C>, message: Message) -> Self {
        Self {
            exchange: Exchange::Done,
            rejected: Some(error),
            codec,
            message,
            // Never read: the client was not called.
            classifier: Classifier::default(),
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

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Some(error) = this.rejected.take() {
            return Poll::Ready(Err(error));
        }
        let codec: &C = this.codec;
        Poll::Ready(match ready!(this.exchange.poll(cx)) {
            Exchanged::Answered(response) => status::from_response(codec, this.message, &response),
            Exchanged::Unread {
                parts,
                error,
                max_body,
            } => Err(status::from_unread_body(codec, parts, error, max_body)),
            Exchanged::Failed(error) => Err(status::from_inner_error(error, this.classifier)),
            Exchanged::Spent => Err(polled_after_completion()),
        })
    }
}

impl<F, B, C> fmt::Debug for ResponseFuture<F, B, C>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match (&self.rejected, &self.exchange) {
            (Some(_), _) => "rejected",
            (None, exchange) => exchange.state(),
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The future of a batch send through [`HttpTransport`](super::HttpTransport): waits for
    /// the answer to the one batch request, reads its body (bounded) and answers one outcome
    /// per message of the batch, in order.
    pub struct BatchResponseFuture<F, B, C>
    where
        B: Body,
        B::Error: Into<BoxError>,
    {
        #[pin]
        exchange: Exchange<F, B>,
        codec: Arc<C>,
        // The messages in the request, and where each stands in the batch.
        sent: Vec<Message>,
        positions: Vec<usize>,
        // One per message of the batch; those left out of the request are answered already.
        answers: Vec<Option<Result<Receipt, SendError>>>,
        classifier: Classifier,
    }
}

impl<F, B, C> BatchResponseFuture<F, B, C>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    pub(crate) fn new(
        exchange: Exchange<F, B>,
        codec: Arc<C>,
        sent: Vec<Message>,
        positions: Vec<usize>,
        answers: Vec<Option<Result<Receipt, SendError>>>,
        classifier: Classifier,
    ) -> Self {
        Self {
            exchange,
            codec,
            sent,
            positions,
            answers,
            classifier,
        }
    }

    /// Every message is answered already: no request.
    pub(crate) fn answered(
        codec: Arc<C>,
        answers: Vec<Option<Result<Receipt, SendError>>>,
    ) -> Self {
        Self::new(
            Exchange::Done,
            codec,
            Vec::new(),
            Vec::new(),
            answers,
            // Never read: no request goes.
            Classifier::default(),
        )
    }
}

impl<F, B, C, E> Future for BatchResponseFuture<F, B, C>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    E: Into<BoxError>,
    B: Body,
    B::Error: Into<BoxError>,
    C: BatchCodec,
{
    type Output = Result<BatchOutcomes, SendError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if !this.positions.is_empty() {
            let codec: &C = this.codec;
            let outcomes = match ready!(this.exchange.poll(cx)) {
                Exchanged::Answered(response) => {
                    status::from_batch_response(codec, this.sent, &response)
                }
                Exchanged::Unread {
                    parts,
                    error,
                    max_body,
                } => every(
                    status::from_unread_body(codec, parts, error, max_body),
                    this.sent.len(),
                ),
                Exchanged::Failed(error) => every(
                    status::from_inner_error(error, this.classifier),
                    this.sent.len(),
                ),
                Exchanged::Spent => every(polled_after_completion(), this.sent.len()),
            };
            for (&position, outcome) in this.positions.iter().zip(outcomes) {
                if let Some(answer) = this.answers.get_mut(position) {
                    *answer = Some(outcome);
                }
            }
            this.positions.clear();
        }
        Poll::Ready(Ok(std::mem::take(this.answers)
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(polled_after_completion())))
            .collect()))
    }
}

fn every(error: SendError, n: usize) -> BatchOutcomes {
    vec![Err(error); n]
}

impl<F, B, C> fmt::Debug for BatchResponseFuture<F, B, C>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = if self.positions.is_empty() {
            "answered"
        } else {
            self.exchange.state()
        };
        f.debug_struct("BatchResponseFuture")
            .field("state", &state)
            .field("messages", &self.answers.len())
            .field("sent", &self.sent.len())
            .finish_non_exhaustive()
    }
}

impl<F, B> Exchange<F, B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    fn state(&self) -> &'static str {
        match self {
            Self::Calling { .. } => "calling",
            Self::Reading { .. } => "reading",
            Self::Done => "done",
        }
    }
}

fn polled_after_completion() -> SendError {
    SendError::unknown_delivery(
        crate::outcome::codes::UNKNOWN,
        "the send future was polled after it completed",
    )
}
