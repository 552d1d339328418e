//! Batch sends: [`Batch`] and the layer as a `Service<Batch<R>>`.
//!
//! Providers take batches (Resend's `/emails/batch`, SES bulk); a batch gets the same
//! guarantee as single sends, message by message. Over an inner service that sends a batch
//! and answers one outcome per message, in order ([`BatchOutcomes`]), the layer:
//!
//! 1. reserves every keyed message's key in one store call
//!    ([`Store::reserve_many`](crate::Store::reserve_many));
//! 2. answers in place the messages found in the store (replayed, in flight, key reused,
//!    store failed) and those whose key is invalid;
//! 3. answers a key that appears again in the same batch as a repeat of its first
//!    occurrence: same fingerprint, the first one's outcome (marked replayed); another
//!    fingerprint, `idempotency.key_reused`;
//! 4. sends the rest (the newly reserved and the unkeyed) as **one** inner batch, in input
//!    order;
//! 5. keeps or frees each key by its own outcome, in one call each for the kept and the freed.
//!
//! The answer has one outcome per input message, in input order. An inner batch that fails as
//! a whole gives every sent message that error (and keeps or frees their keys by it); an
//! inner answer with a different number of outcomes than messages is the error
//! `provider.batch_mismatch`, of unknown delivery, and every key sent in it is kept, not
//! freed, as any of those messages may have gone.
//!
//! ```
//! use tower::{Service, ServiceExt};
//! use tower_idempotency::batch::{Batch, BatchOutcomes};
//! use tower_idempotency::{BoxError, IdempotencyLayer, Message, Receipt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), BoxError> {
//! // A provider that takes batches.
//! let provider = tower::service_fn(|batch: Batch| async move {
//!     let outcomes: BatchOutcomes = batch
//!         .iter()
//!         .enumerate()
//!         .map(|(i, _)| Ok(Receipt::new(format!("msg-{i}"), "bulk")))
//!         .collect();
//!     Ok::<_, BoxError>(outcomes)
//! });
//! let mut service = tower::Layer::layer(&IdempotencyLayer::in_memory(), provider);
//!
//! let m = |key: &str| Message::builder().from("a@example.com").to("b@example.com")
//!     .text("hi").idempotency_key(key).build();
//! let first = service.ready().await?.call(Batch::from(vec![m("k1")?, m("k2")?])).await?;
//! assert!(first.iter().all(|o| o.as_ref().is_ok_and(|r| !r.replayed)));
//! // k1 again, plus k3 twice: k1 is replayed, k3 sent once and its repeat answered in place.
//! let second = service.ready().await?.call(Batch::from(vec![m("k1")?, m("k3")?, m("k3")?])).await?;
//! assert!(second[0].as_ref().unwrap().replayed);
//! assert!(!second[1].as_ref().unwrap().replayed);
//! assert!(second[2].as_ref().unwrap().replayed);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tower_service::Service;

use crate::fingerprint::Fingerprint;
use crate::layer::Idempotency;
use crate::layer::IdempotentRequest;
use crate::layer::internals::{
    Config, Finish, Held, KeyOf, Settle, answer_held, bump, classify, key_hash, reserve_many,
    store_key,
};
use crate::message::Message;
use crate::outcome::{BoxError, Outcome, Receipt, SendError, codes};
use crate::store::{Reservation, StoreError, Token};

/// The outcomes of a batch: one per message, in the batch's order.
pub type BatchOutcomes = Vec<Result<Receipt, SendError>>;

/// A list of messages sent together. Cheap to build from a `Vec`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch<R = Message> {
    items: Vec<R>,
}

impl<R> Batch<R> {
    /// A batch of `items`, in order.
    pub fn new(items: Vec<R>) -> Self {
        Self { items }
    }

    /// The messages, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, R> {
        self.items.iter()
    }

    /// The messages, in order.
    pub fn as_slice(&self) -> &[R] {
        &self.items
    }

    /// The messages, in order.
    pub fn into_vec(self) -> Vec<R> {
        self.items
    }

    /// How many messages.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether it has no message.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl<R> From<Vec<R>> for Batch<R> {
    fn from(items: Vec<R>) -> Self {
        Self::new(items)
    }
}

impl<R> FromIterator<R> for Batch<R> {
    fn from_iter<I: IntoIterator<Item = R>>(iter: I) -> Self {
        Self::new(iter.into_iter().collect())
    }
}

impl<R> IntoIterator for Batch<R> {
    type Item = R;
    type IntoIter = std::vec::IntoIter<R>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

impl<'a, R> IntoIterator for &'a Batch<R> {
    type Item = &'a R;
    type IntoIter = std::slice::Iter<'a, R>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

/// The future of a batch send through the layer.
pub struct BatchFuture {
    inner: BoxFuture<'static, Result<BatchOutcomes, SendError>>,
}

impl std::future::Future for BatchFuture {
    type Output = Result<BatchOutcomes, SendError>;
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl std::fmt::Debug for BatchFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchFuture").finish_non_exhaustive()
    }
}

impl<S, R> Service<Batch<R>> for Idempotency<S>
where
    R: IdempotentRequest,
    S: Service<Batch<R>, Response = BatchOutcomes> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = BatchOutcomes;
    type Error = SendError;
    type Future = BatchFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let config = Arc::clone(self.config());
        self.get_mut()
            .poll_ready(cx)
            .map_err(|e| classify(&config, e.into()))
    }

    fn call(&mut self, batch: Batch<R>) -> Self::Future {
        let clone = self.get_ref().clone();
        let inner = std::mem::replace(self.get_mut(), clone);
        BatchFuture {
            inner: send_batch(Arc::clone(self.config()), inner, batch).boxed(),
        }
    }
}

/// Where a message of the batch stands.
#[derive(Clone, Copy)]
enum Plan {
    /// Answered without the provider; its answer is in place.
    Answered,
    /// Its key is being reserved as `keyed[i]`.
    Reserving(usize),
    /// Goes to the provider; `Some(h)` when it holds `held[h]`.
    Send(Option<usize>),
    /// A repeat of the message at this input position, under the same key.
    RepeatOf(usize),
}

async fn send_batch<S, R>(
    config: Arc<Config>,
    mut inner: S,
    batch: Batch<R>,
) -> Result<BatchOutcomes, SendError>
where
    R: IdempotentRequest,
    S: Service<Batch<R>, Response = BatchOutcomes>,
    S::Error: Into<BoxError>,
{
    let items = batch.into_vec();
    let mut answers: Vec<Option<Result<Receipt, SendError>>> = vec![None; items.len()];
    let mut plans = Vec::with_capacity(items.len());
    let mut keyed: Vec<(Arc<str>, Fingerprint)> = Vec::new();
    let mut first_of: HashMap<Arc<str>, (usize, Fingerprint)> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        plans.push(match store_key(&config, item) {
            KeyOf::Unkeyed => Plan::Send(None),
            KeyOf::Invalid(error) => {
                answers[i] = Some(Err(error));
                Plan::Answered
            }
            KeyOf::Keyed(key) => {
                let fingerprint = item.fingerprint();
                match first_of.get(&key) {
                    Some(&(first, fp)) if fp == fingerprint => Plan::RepeatOf(first),
                    Some(_) => {
                        bump(&config.counters.key_reused);
                        answers[i] = Some(Err(SendError::key_reused()));
                        Plan::Answered
                    }
                    None => {
                        first_of.insert(Arc::clone(&key), (i, fingerprint));
                        keyed.push((key, fingerprint));
                        Plan::Reserving(keyed.len() - 1)
                    }
                }
            }
        });
    }

    let held = reserve_keyed(&config, keyed, &items, &mut plans, &mut answers).await;

    // The messages that go, in input order, as one inner batch.
    let mut outbound = Vec::new();
    let mut positions = Vec::new();
    // The held messages again, for the recipients their kept receipts point into.
    let mut kept = Vec::with_capacity(held.len());
    for (i, item) in items.into_iter().enumerate() {
        if let Plan::Send(held_at) = plans[i] {
            if held_at.is_some() {
                kept.push(item.clone());
            }
            outbound.push(item);
            positions.push(i);
        }
    }
    if !outbound.is_empty() {
        let holds = held.len();
        let mut settle = Settle::new(Arc::clone(&config), held);
        bump_by(&config.counters.sent, holds);
        let sent = outbound.len();
        let outcomes = match inner
            .call(Batch::new(outbound))
            .await
            .map_err(|e| classify(&config, e.into()))
        {
            Ok(outcomes) if outcomes.len() == sent => outcomes,
            Ok(outcomes) => {
                let error = SendError::unknown_delivery(
                    codes::BATCH_MISMATCH,
                    format!(
                        "the provider answered {} outcomes for {sent} messages; any of them \
                         may have gone",
                        outcomes.len()
                    ),
                );
                vec![Err(error); sent]
            }
            Err(error) => vec![Err(error); sent],
        };
        let mut finishes: Vec<Option<Finish>> = (0..holds).map(|_| None).collect();
        for (&position, outcome) in positions.iter().zip(outcomes) {
            if let Plan::Send(Some(h)) = plans[position]
                && let Some(message) = kept.get(h)
            {
                finishes[h] = Some(Finish::for_result(&outcome, &message.recipient_list()));
            }
            answers[position] = Some(outcome);
        }
        // Every held key got its outcome above; the fallback keeps a key rather than free it.
        let finishes = finishes
            .into_iter()
            .map(|f| f.unwrap_or_else(|| Finish::Complete(Outcome::Failed(SendError::aborted()))))
            .collect();
        settle.run(finishes).await;
    }

    // Repeats within the batch take their first occurrence's answer.
    for i in 0..plans.len() {
        if let Plan::RepeatOf(first) = plans[i] {
            let was_sent = matches!(plans[first], Plan::Send(Some(_)));
            answers[i] = Some(match answers[first].clone() {
                Some(Ok(receipt)) => {
                    bump(&config.counters.replayed);
                    Ok(Receipt {
                        replayed: true,
                        ..receipt
                    })
                }
                Some(Err(error)) if was_sent => Err(error.replayed()),
                Some(Err(error)) => Err(error),
                None => Err(SendError::aborted()),
            });
        }
    }
    Ok(answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(SendError::aborted())))
        .collect())
}

/// Reserves the first occurrence of every key in one store call and plans each by the
/// answer; answers those found in the store in place. Returns the keys now held.
async fn reserve_keyed<R: IdempotentRequest>(
    config: &Arc<Config>,
    keyed: Vec<(Arc<str>, Fingerprint)>,
    items: &[R],
    plans: &mut [Plan],
    answers: &mut [Option<Result<Receipt, SendError>>],
) -> Vec<Held> {
    let mut held = Vec::new();
    if keyed.is_empty() {
        return held;
    }
    let requests: Arc<[(Arc<str>, Fingerprint)]> = Arc::from(keyed);
    let mut reservations = match reserve_many(config, Arc::clone(&requests)).await {
        Ok(reservations) if reservations.len() == requests.len() => reservations,
        Ok(reservations) => {
            // Unmatched answers: free whatever was reserved (a token frees only its own key)
            // and fail the keyed messages unsent.
            let reserved: Vec<(&str, Token)> = requests
                .iter()
                .zip(&reservations)
                .filter_map(|((key, _), r)| match r {
                    Ok(Reservation::Reserved { token }) => Some((key.as_ref(), *token)),
                    _ => None,
                })
                .collect();
            let _ = config.store.release_many(&reserved).await;
            let error = StoreError::corrupt(format!(
                "reserve_many answered {} entries for {} keys",
                reservations.len(),
                requests.len()
            ));
            fail_unsent(config, plans, answers, error);
            return held;
        }
        Err(error) => {
            fail_unsent(config, plans, answers, error);
            return held;
        }
    }
    .into_iter()
    .map(Some)
    .collect::<Vec<_>>();
    for (i, plan) in plans.iter_mut().enumerate() {
        let Plan::Reserving(k) = *plan else { continue };
        let (key, fingerprint) = &requests[k];
        let Some(reservation) = reservations[k].take() else {
            continue;
        };
        *plan = match reservation {
            Ok(Reservation::Reserved { token }) => {
                held.push(Held {
                    key: Arc::clone(key),
                    token,
                    fingerprint: *fingerprint,
                });
                Plan::Send(Some(held.len() - 1))
            }
            Ok(Reservation::Held { record }) => {
                answers[i] = Some(answer_held(config, key, *fingerprint, record, &items[i]));
                Plan::Answered
            }
            Err(error) => {
                bump(&config.counters.store_failed);
                tracing::warn!(
                    namespace = %config.namespace,
                    key_hash = %key_hash(key),
                    code = codes::STORE_FAILED,
                    error = %error,
                    "idempotency store failed to reserve; message not sent"
                );
                answers[i] = Some(Err(SendError::store_failed(error)));
                Plan::Answered
            }
        };
    }
    held
}

fn bump_by(counter: &std::sync::atomic::AtomicU64, n: usize) {
    counter.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
}

/// The store failed for the whole reservation: every keyed message fails unsent.
fn fail_unsent(
    config: &Config,
    plans: &mut [Plan],
    answers: &mut [Option<Result<Receipt, SendError>>],
    error: StoreError,
) {
    let error = SendError::store_failed(error);
    tracing::warn!(
        namespace = %config.namespace,
        code = codes::STORE_FAILED,
        error = %error,
        "idempotency store failed to reserve a batch; its keyed messages were not sent"
    );
    for (plan, answer) in plans.iter_mut().zip(answers.iter_mut()) {
        if let Plan::Reserving(_) = plan {
            bump(&config.counters.store_failed);
            *answer = Some(Err(error.clone()));
            *plan = Plan::Answered;
        }
    }
}
