//! Waiting for an in-flight send: a repeat that finds its key pending under the same
//! fingerprint asks the store again, with backoff, until the first send is over or the bound
//! set by [`wait_for_in_flight`](super::IdempotencyLayerBuilder::wait_for_in_flight) passes.
//!
//! Each poll is a reserve, never a read: if the first send freed the key (its message
//! certainly did not go) or its lease passed, the poll takes the key, and the repeat is sent,
//! exactly as a repeat arriving a moment later would be. A reserve that wins is therefore the
//! end of waiting, for a batch too: what is reserved must be sent without delay.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::config::Config;
use super::renew::{Backoff, after, has_runtime};
use super::reserve::{reserve_many, reserve_one};
use super::stats::{bump, bump_by};
use crate::fingerprint::Fingerprint;
use crate::store::{Record, RecordState, Reservation, StoreError, Token};

/// Whether a record is the in-flight send of the same message.
fn in_flight(record: &Record, fingerprint: Fingerprint) -> bool {
    record.state == RecordState::Pending && record.fingerprint == fingerprint
}

/// Polls with the settlements' backoff (a jittered gap from 10 ms doubling to 1 s), so
/// that repeats that arrived together do not poll together, until the bound.
struct Polls {
    backoff: Backoff,
    until: Instant,
}

impl Polls {
    fn new(bound: Duration) -> Self {
        Self {
            backoff: Backoff::default(),
            until: after(Instant::now(), bound),
        }
    }

    /// Sleeps until the next poll; `false` once the bound has passed.
    async fn next(&mut self) -> bool {
        let now = Instant::now();
        if now >= self.until {
            return false;
        }
        let gap = self.backoff.next_delay();
        tokio::time::sleep_until(after(now, gap).min(self.until)).await;
        true
    }
}

/// The bound to wait for, if this layer waits and can.
fn bound(config: &Config) -> Option<Duration> {
    config.wait_for_in_flight.filter(|_| has_runtime())
}

/// What the store answers a single repeat once its wait is over: `record` itself when the
/// layer does not wait or the record is not the same message in flight; else the last
/// answer of polling (a reservation to send under, a kept outcome, or the pending record at
/// the bound). A store error while polling ends the wait with the last record seen.
///
/// `asked_at` becomes the moment the winning reserve was asked, where the key's lease starts.
pub(crate) async fn wait_one(
    config: &Arc<Config>,
    key: &Arc<str>,
    fingerprint: Fingerprint,
    record: Record,
    asked_at: &mut Instant,
) -> Result<Reservation, StoreError> {
    match bound(config).filter(|_| in_flight(&record, fingerprint)) {
        None => Ok(Reservation::Held { record }),
        Some(bound) => poll_one(config, key, fingerprint, record, asked_at, bound).await,
    }
}

/// [`wait_one`]'s polling, up to `bound`.
async fn poll_one(
    config: &Arc<Config>,
    key: &Arc<str>,
    fingerprint: Fingerprint,
    record: Record,
    asked_at: &mut Instant,
    bound: Duration,
) -> Result<Reservation, StoreError> {
    bump(&config.counters.waited);
    let mut polls = Polls::new(bound);
    let mut last = record;
    while polls.next().await {
        *asked_at = Instant::now();
        match reserve_one(config, key, fingerprint).await {
            Ok(Reservation::Held { record }) if in_flight(&record, fingerprint) => last = record,
            Ok(answer) => return Ok(answer),
            Err(_) => break,
        }
    }
    Ok(Reservation::Held { record: last })
}

/// [`wait_one`] for the keys of a batch, in one store call per poll: replaces in `answers`
/// (one per entry of `requests`) each in-flight record by the answer it ends with. Polling
/// stops at the bound, when no key is in flight any more, or as soon as one is reserved.
///
/// A batch that already holds keys waits at most a third of the lease: nothing renews them
/// while it waits. `asked_at` becomes the moment of the winning poll when the batch held no
/// key before it.
pub(crate) async fn wait_many(
    config: &Arc<Config>,
    requests: &[(Arc<str>, Fingerprint)],
    answers: &mut [Option<Result<Reservation, StoreError>>],
    asked_at: &mut Instant,
) {
    let Some(mut bound) = bound(config) else {
        return;
    };
    let holding = answers
        .iter()
        .any(|a| matches!(a, Some(Ok(r)) if r.token().is_some()));
    if holding {
        bound = bound.min(config.lease / 3);
    }
    let mut waiting: Vec<usize> = (0..requests.len())
        .filter(|&k| {
            matches!(&answers[k], Some(Ok(Reservation::Held { record }))
                if in_flight(record, requests[k].1))
        })
        .collect();
    if waiting.is_empty() {
        return;
    }
    bump_by(&config.counters.waited, waiting.len());
    let mut polls = Polls::new(bound);
    while !waiting.is_empty() && polls.next().await {
        let asked: Arc<[(Arc<str>, Fingerprint)]> = waiting
            .iter()
            .map(|&k| (Arc::clone(&requests[k].0), requests[k].1))
            .collect();
        let polled_at = Instant::now();
        let polled = match reserve_many(config, Arc::clone(&asked)).await {
            Ok(polled) if polled.len() == waiting.len() => polled,
            Ok(unmatched) => {
                // Answers that match no key: free what they reserved (a token frees only its
                // own key), and keep the last answers.
                let reserved: Vec<(&str, Token)> = asked
                    .iter()
                    .zip(&unmatched)
                    .filter_map(|((key, _), answer)| match answer {
                        // Not a takeover: see `reserve::reserve_one`.
                        Ok(Reservation::Reserved { token }) => Some((key.as_ref(), *token)),
                        _ => None,
                    })
                    .collect();
                let _ = config.store.release_many(&reserved).await;
                return;
            }
            // A failed poll: keep the last answers.
            Err(_) => return,
        };
        let mut reserved = false;
        let mut still = Vec::new();
        for (k, answer) in waiting.into_iter().zip(polled) {
            match answer {
                Ok(Reservation::Held { record }) if in_flight(&record, requests[k].1) => {
                    still.push(k);
                }
                Ok(answer) => {
                    // A takeover holds the key as well: stop waiting and send.
                    reserved |= answer.token().is_some();
                    answers[k] = Some(Ok(answer));
                }
                // That key alone failed: it keeps its last answer.
                Err(_) => {}
            }
        }
        if reserved {
            if !holding {
                *asked_at = polled_at;
            }
            return;
        }
        waiting = still;
    }
}
