//! Settling the keys a send reserved once it is over: kept with the outcome or freed, even
//! when the caller drops the send first.

use std::sync::Arc;

use super::config::Config;
use super::key::key_hash;
use super::reserve::spawn_detached;
use super::stats::bump;
use crate::fingerprint::Fingerprint;
use crate::outcome::{Outcome, Receipt, SendError, codes};
use crate::store::{Completion, StoreError, Token};

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
}

/// A key this send reserved.
pub(crate) struct Held {
    pub(crate) key: Arc<str>,
    pub(crate) token: Token,
    pub(crate) fingerprint: Fingerprint,
}

/// Keeps or frees the keys a send reserved once it is over, and, when the caller drops the
/// send first, keeps them with an `idempotency.aborted` outcome from a background task. From
/// the moment it exists the message may go: a drop must never free a key.
pub(crate) struct Settle {
    config: Arc<Config>,
    held: Vec<Held>,
    finishes: Option<Vec<Finish>>,
    done: bool,
}

impl Settle {
    pub(crate) fn new(config: Arc<Config>, held: Vec<Held>) -> Self {
        Self {
            config,
            held,
            finishes: None,
            done: false,
        }
    }

    /// Settles each held key by its finish (one per key, in order).
    pub(crate) async fn run(&mut self, finishes: Vec<Finish>) {
        let finishes = self.finishes.insert(finishes);
        apply(&self.config, &self.held, finishes).await;
        self.done = true;
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        if self.done || self.held.is_empty() {
            return;
        }
        let finishes = self.finishes.take().unwrap_or_else(|| {
            self.held
                .iter()
                .map(|_| {
                    bump(&self.config.counters.aborted);
                    Finish::Complete(Outcome::failed(SendError::aborted()))
                })
                .collect()
        });
        let config = Arc::clone(&self.config);
        let held = std::mem::take(&mut self.held);
        spawn_detached(async move {
            apply(&config, &held, &finishes).await;
        });
    }
}

async fn apply(config: &Config, held: &[Held], finishes: &[Finish]) {
    if let ([one], [finish]) = (held, finishes) {
        // The single send: one plain call, no batch bookkeeping on the hot path.
        let result = match finish {
            Finish::Complete(outcome) => {
                config
                    .store
                    .complete(&one.key, one.token, one.fingerprint, outcome, config.ttl)
                    .await
            }
            Finish::Release => config.store.release(&one.key, one.token).await,
        };
        report(
            config,
            std::iter::once(one),
            finish_name(finish),
            result.map(|w| vec![w]),
        );
        return;
    }
    let mut completions = Vec::new();
    let mut completed = Vec::new();
    let mut releases = Vec::new();
    let mut released = Vec::new();
    for (h, finish) in held.iter().zip(finishes) {
        match finish {
            Finish::Complete(outcome) => {
                completions.push(Completion {
                    key: &h.key,
                    token: h.token,
                    fingerprint: h.fingerprint,
                    outcome,
                });
                completed.push(h);
            }
            Finish::Release => {
                releases.push((h.key.as_ref(), h.token));
                released.push(h);
            }
        }
    }
    if !completions.is_empty() {
        let result = config.store.complete_many(&completions, config.ttl).await;
        report(config, completed.into_iter(), "keep the outcome", result);
    }
    if !releases.is_empty() {
        let result = config.store.release_many(&releases).await;
        report(config, released.into_iter(), "free the key", result);
    }
}

fn finish_name(finish: &Finish) -> &'static str {
    match finish {
        Finish::Complete(_) => "keep the outcome",
        Finish::Release => "free the key",
    }
}

/// Turns the store's answers after a send into warnings and counters; the caller already has
/// the real outcome.
fn report<'h>(
    config: &Config,
    held: impl ExactSizeIterator<Item = &'h Held>,
    action: &str,
    result: Result<Vec<bool>, StoreError>,
) {
    match result {
        Ok(written) => {
            for (h, written) in held.zip(written.into_iter().chain(std::iter::repeat(false))) {
                if !written {
                    bump(&config.counters.lease_lost);
                    tracing::warn!(
                        namespace = %config.namespace,
                        key_hash = %key_hash(&h.key),
                        code = codes::STORE_FAILED_WARNING,
                        "the lease passed before the send finished and another send holds the \
                         key; make the lease longer than a send with all its retries"
                    );
                }
            }
        }
        Err(error) => {
            for h in held {
                bump(&config.counters.store_failed_after_send);
                tracing::warn!(
                    namespace = %config.namespace,
                    key_hash = %key_hash(&h.key),
                    code = codes::STORE_FAILED_WARNING,
                    error = %error,
                    "idempotency store failed to {action} after the send; the caller got the \
                     real outcome"
                );
            }
        }
    }
}
