//! The batch send flow: the layer as a `Service<Batch<R>>`; see [`crate::batch`] for what it
//! promises.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use futures_util::future::join_all;
use tokio::time::Instant;
use tower_service::Service;

use super::config::Config;
use super::key::{KeyOf, key_hash, raw_key, store_key};
use super::renew::{Held, Lease, given_up};
use super::repeat::answer_held;
use super::request::IdempotentRequest;
use super::reserve::reserve_many;
use super::service::Idempotency;
use super::settle::{Finish, Settle};
use super::stats::{bump, bump_by};
use super::takeover::{Takeover, after_takeover};
use super::wait::wait_many;
use crate::batch::{Batch, BatchFuture, BatchOutcomes};
use crate::classify::into_send_error;
use crate::fingerprint::Fingerprint;
use crate::outcome::{BoxError, Outcome, Receipt, SendError, codes};
use crate::store::{Record, Reservation, StoreError, StoreErrorKind, Token};

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
        self.inner
            .poll_ready(cx)
            .map_err(|e| into_send_error(&self.config.classifier, e.into()))
    }

    fn call(&mut self, batch: Batch<R>) -> Self::Future {
        let inner = self.take_ready();
        BatchFuture::new(send_batch(Arc::clone(&self.config), inner, batch).boxed())
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
    /// Another message under the key of `keyed[k]`: judged, like a single send, against what
    /// the store answered for that key.
    Differs(usize),
}

/// One batch: reserve every key in one store call, answer repeats in place, send the rest
/// as one inner batch and settle each key by its own outcome.
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
    // Per key: the input position of its first occurrence, its fingerprint, its `keyed` index.
    let mut first_of: HashMap<Arc<str>, (usize, Fingerprint, usize)> = HashMap::new();
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
                    Some(&(first, fp, _)) if fp == fingerprint => Plan::RepeatOf(first),
                    Some(&(_, _, k)) => Plan::Differs(k),
                    None => {
                        first_of.insert(Arc::clone(&key), (i, fingerprint, keyed.len()));
                        keyed.push((key, fingerprint));
                        Plan::Reserving(keyed.len() - 1)
                    }
                }
            }
        });
    }

    let mut asked_at = Instant::now();
    let held = reserve_keyed(
        &config,
        keyed,
        &items,
        &mut plans,
        &mut answers,
        &mut asked_at,
    )
    .await;

    // The messages that go, in input order, as one inner batch.
    let mut outbound = Vec::new();
    let mut positions = Vec::new();
    // The held messages again, for the recipients their kept receipts point into.
    let mut kept = Vec::with_capacity(held.len());
    for (i, item) in items.into_iter().enumerate() {
        if let Plan::Send(held_at) = plans[i] {
            // The provider sees the key the store holds, and none for an unkeyed message.
            let item = item.with_stored_key(held_at.and_then(|h| held.get(h)).map(|h| &h.key));
            if held_at.is_some() {
                kept.push(item.clone());
            }
            outbound.push(item);
            positions.push(i);
        }
    }
    if !outbound.is_empty() {
        let holds = held.len();
        let mut settle = Settle::new(Arc::clone(&config), held, Lease::new(&config, asked_at));
        bump_by(&config.counters.sent, holds);
        let sent = outbound.len();
        let outcomes = match settle.hold(inner.call(Batch::new(outbound))).await {
            Some(result) => result.map_err(|e| into_send_error(&config.classifier, e.into())),
            None => Err(given_up(&config, holds)),
        };
        let outcomes = match outcomes {
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
                finishes[h] = Some(Finish::for_result(&outcome, &message.recipients()));
            }
            answers[position] = Some(outcome);
        }
        // Every held key got its outcome above; the fallback keeps a key rather than free it.
        let finishes = finishes
            .into_iter()
            .map(|f| f.unwrap_or_else(|| Finish::Complete(Outcome::failed(SendError::aborted()))))
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

/// Reserves the first occurrence of every key in one store call (waiting for those in flight,
/// when the layer waits) and plans each by the answer; answers those found in the store in
/// place. Returns the keys now held; `asked_at` is when their lease started.
async fn reserve_keyed<R: IdempotentRequest>(
    config: &Arc<Config>,
    keyed: Vec<(Arc<str>, Fingerprint)>,
    items: &[R],
    plans: &mut [Plan],
    answers: &mut [Option<Result<Receipt, SendError>>],
    asked_at: &mut Instant,
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
                    // Not a takeover: see `reserve::reserve_one`.
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
    wait_many(config, &requests, &mut reservations, asked_at).await;
    // What the store answered each key, for the other messages under it (`Plan::Differs`).
    let mut judged: Vec<Option<Judged>> = (0..requests.len()).map(|_| None).collect();
    // Keys taken over from a holder that never settled them: decided below, each as a single
    // send decides it, before any is sent.
    let mut taken_over = Vec::new();
    for (i, plan) in plans.iter_mut().enumerate() {
        if let Plan::Differs(k) = *plan {
            let (key, _) = &requests[k];
            answers[i] = Some(judge_other(config, key, judged[k].as_ref(), &items[i]));
            *plan = Plan::Answered;
            continue;
        }
        let Plan::Reserving(k) = *plan else { continue };
        let (key, fingerprint) = &requests[k];
        let Some(reservation) = reservations[k].take() else {
            continue;
        };
        *plan = match reservation {
            Ok(Reservation::Reserved { token }) => {
                judged[k] = Some(Judged::Reserved(*fingerprint));
                held.push(Held {
                    key: Arc::clone(key),
                    token,
                    fingerprint: *fingerprint,
                });
                Plan::Send(Some(held.len() - 1))
            }
            Ok(Reservation::TakenOver { token, previous }) => {
                // Held by this batch whatever the check decides: another message under the
                // key is judged as under a key in flight.
                judged[k] = Some(Judged::Reserved(*fingerprint));
                let took = Held {
                    key: Arc::clone(key),
                    token,
                    fingerprint: *fingerprint,
                };
                taken_over.push((i, took, previous));
                Plan::Answered
            }
            Ok(Reservation::Held { record }) => {
                judged[k] = Some(Judged::Held(record.clone()));
                answers[i] = Some(answer_held(config, key, *fingerprint, record, &items[i]));
                Plan::Answered
            }
            Err(error) => {
                bump(&config.counters.store_failed);
                let error = SendError::store_failed(error);
                tracing::warn!(
                    namespace = %config.namespace,
                    key_hash = %key_hash(key),
                    code = error.code(),
                    error = %error,
                    "idempotency store failed to reserve; message not sent"
                );
                judged[k] = Some(Judged::Failed(error.clone()));
                answers[i] = Some(Err(error));
                Plan::Answered
            }
        };
    }
    decide_takeovers(
        config, taken_over, items, plans, answers, &mut held, *asked_at,
    )
    .await;
    held
}

/// Decides each key the batch took over as a single send would (see
/// [`after_takeover`](super::takeover::after_takeover)), the keys concurrently: the ones to
/// send join `held` and the send, the others are answered in place (the check kept their
/// key).
async fn decide_takeovers<R: IdempotentRequest>(
    config: &Arc<Config>,
    taken_over: Vec<(usize, Held, Record)>,
    items: &[R],
    plans: &mut [Plan],
    answers: &mut [Option<Result<Receipt, SendError>>],
    held: &mut Vec<Held>,
    asked_at: Instant,
) {
    if taken_over.is_empty() {
        return;
    }
    let decisions = join_all(
        taken_over
            .into_iter()
            .map(|(i, took, previous)| async move {
                let item = &items[i];
                let recipients = item.recipients();
                let raw = raw_key(config, item);
                let decided =
                    after_takeover(config, took.clone(), previous, raw, &recipients, asked_at)
                        .await;
                (i, took, decided)
            }),
    )
    .await;
    for (i, took, decided) in decisions {
        match decided {
            Takeover::Send => {
                held.push(took);
                plans[i] = Plan::Send(Some(held.len() - 1));
            }
            Takeover::Answered(answer) => answers[i] = Some(answer),
        }
    }
}

/// What the store answered for a key of the batch.
enum Judged {
    /// Reserved by this batch, for the message with this fingerprint.
    Reserved(Fingerprint),
    /// Held by this record.
    Held(Record),
    /// The store failed for it, with this answer.
    Failed(SendError),
}

/// The answer to a message under a key whose first occurrence in the batch is another
/// message: what a single send would get after that first occurrence, judged by the store's
/// answer for the key (a kept outcome of this very message is replayed).
fn judge_other<R: IdempotentRequest>(
    config: &Config,
    key: &str,
    judged: Option<&Judged>,
    item: &R,
) -> Result<Receipt, SendError> {
    let fingerprint = item.fingerprint();
    match judged {
        // This batch now holds the key for another message.
        Some(Judged::Reserved(first)) => {
            answer_held(config, key, fingerprint, Record::pending(*first), item)
        }
        Some(Judged::Held(record)) => answer_held(config, key, fingerprint, record.clone(), item),
        Some(Judged::Failed(error)) => {
            bump(&config.counters.store_failed);
            Err(error.clone())
        }
        // The key was not answered (the whole reservation failed, and `fail_unsent` answered
        // the first occurrence): so is this message, the same way.
        None => {
            bump(&config.counters.store_failed);
            Err(SendError::store_failed(StoreError::new(
                StoreErrorKind::Unavailable,
                "the idempotency store failed to reserve the batch",
            )))
        }
    }
}

/// The store failed for the whole reservation: every keyed message still to be judged fails
/// unsent.
fn fail_unsent(
    config: &Config,
    plans: &mut [Plan],
    answers: &mut [Option<Result<Receipt, SendError>>],
    error: StoreError,
) {
    let error = SendError::store_failed(error);
    tracing::warn!(
        namespace = %config.namespace,
        code = error.code(),
        error = %error,
        "idempotency store failed to reserve a batch; its keyed messages were not sent"
    );
    for (plan, answer) in plans.iter_mut().zip(answers.iter_mut()) {
        if let Plan::Reserving(_) | Plan::Differs(_) = plan {
            bump(&config.counters.store_failed);
            *answer = Some(Err(error.clone()));
            *plan = Plan::Answered;
        }
    }
}
