//! The worker's statements on its rows: the claim, the marks that record sends' answers (many
//! rows to a statement), and the release of rows claimed but not sent. Every write is fenced
//! by the token of the claim that took the row.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use uuid::Uuid;

use super::settings::{Counters, Settings};
use super::stored;
use crate::message::Message;
use crate::outcome::{Receipt, SendError};
use crate::retry::unit_random;
use crate::store::StoreError;
use crate::store::millis::millis;

/// The waits before a failed statement that records answers is asked again: a database
/// often answers again within seconds (a dropped connection, a failover), and every answer
/// it loses sends its message again. Bounded, as a graceful stop waits for the marks.
pub(super) const MARK_RETRIES: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_millis(500),
    Duration::from_secs(2),
];

/// A row a claim took: what the worker needs to record its answer. Each claim statement has
/// a token of its own, so a row claimed again after its lease passed, even by the same
/// worker, is fenced from the first claim's late answer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Row {
    pub(super) id: i64,
    pub(super) token: Uuid,
    pub(super) attempts: i32,
}

/// A claimed row and its message, or why the message cannot be read.
pub(super) struct Claimed {
    pub(super) row: Row,
    pub(super) message: Result<Message, StoreError>,
}

/// A row as a claim statement read it, before its message is decoded.
pub(super) struct ClaimedRow {
    pub(super) id: i64,
    /// The stored form (see [`stored`]).
    pub(super) message: String,
    /// Attempts, this claim's included.
    pub(super) attempts: i32,
    /// How long the row had been ready when claimed, in milliseconds.
    pub(super) waited_ms: Option<i64>,
}

/// What the worker does with a row after its send.
pub(super) enum Verdict {
    Done(Receipt),
    Retry { after: Duration, error: SendError },
    Dead(String),
}

impl Verdict {
    /// The row's state once recorded.
    pub(super) fn state(&self) -> &'static str {
        match self {
            Verdict::Done(_) => "done",
            Verdict::Retry { .. } => "waiting",
            Verdict::Dead(_) => "dead",
        }
    }

    /// The error the row keeps: code and text, never content.
    pub(super) fn last_error(&self) -> Option<String> {
        match self {
            Verdict::Done(_) => None,
            Verdict::Retry { error, .. } => Some(format!("{}: {}", error.code(), error.message())),
            Verdict::Dead(why) => Some(why.clone()),
        }
    }

    /// How long a row put back waits before its next attempt, in milliseconds.
    pub(super) fn after_ms(&self) -> i64 {
        match self {
            Verdict::Retry { after, .. } => millis(*after),
            _ => 0,
        }
    }
}

/// A row's verdict, waiting for the next mark statement.
pub(super) struct Mark {
    pub(super) row: Row,
    pub(super) verdict: Verdict,
}

impl Settings {
    fn wait_before(&self, attempts: i32) -> Duration {
        let doublings = u32::try_from(attempts.saturating_sub(1))
            .unwrap_or(0)
            .min(30);
        let full = self
            .backoff_base
            .saturating_mul(1 << doublings)
            .min(self.backoff_max);
        full.mul_f64(0.5 + 0.5 * unit_random())
    }

    /// What to do with `row` after the stack answered `result`.
    pub(super) fn judge(&self, row: Row, result: Result<Receipt, SendError>) -> Mark {
        let error = match result {
            Ok(receipt) => {
                return Mark {
                    row,
                    verdict: Verdict::Done(receipt),
                };
            }
            Err(error) => error,
        };
        let out_of_attempts = u32::try_from(row.attempts).unwrap_or(u32::MAX) >= self.max_attempts;
        let verdict = if error.is_retryable() && !out_of_attempts {
            let after = self
                .wait_before(row.attempts)
                .max(error.retry_after().unwrap_or_default());
            Verdict::Retry { after, error }
        } else {
            let why = if error.is_retryable() {
                "out of attempts"
            } else if error.delivery_unknown() {
                "delivery unknown: the message may have gone"
            } else {
                "refused"
            };
            Verdict::Dead(format!("{} ({why}): {}", error.code(), error.message()))
        };
        Mark { row, verdict }
    }

    /// Claims up to `rows` waiting rows under a new token, and reads their messages.
    pub(super) async fn claim(self: Arc<Self>, rows: u32) -> Result<Vec<Claimed>, StoreError> {
        let token = Uuid::new_v4();
        let lease_ms = millis(self.claim_lease);
        let outbox = &self.outbox;
        let answer = outbox
            .bounded(async {
                on_backend!(&outbox.backend, db => db.claim(token, lease_ms, rows).await)
            })
            .await;
        Counters::add(&self.counters.polls, 1);
        let claimed: Vec<Claimed> = answer?
            .into_iter()
            .map(|row| {
                self.counters.last_lag_ms.store(
                    u64::try_from(row.waited_ms.unwrap_or(0)).unwrap_or(0),
                    Ordering::Relaxed,
                );
                Claimed {
                    row: Row {
                        id: row.id,
                        token,
                        attempts: row.attempts,
                    },
                    message: stored::decode(&row.message),
                }
            })
            .collect();
        Counters::add(&self.counters.claimed, claimed.len() as u64);
        if !claimed.is_empty() {
            tracing::debug!(
                rows = claimed.len(),
                lag_ms = self.counters.last_lag_ms.load(Ordering::Relaxed),
                "outbox rows claimed"
            );
        }
        Ok(claimed)
    }

    /// Records the verdicts of `marks` in one statement, then counts and logs each row.
    ///
    /// A statement that fails is asked again after each of [`MARK_RETRIES`]: an answer not
    /// recorded leaves its row claimed, and its message is sent again once the claim passes.
    /// Asking again is safe, as each mark is fenced by its claim's token: a statement that
    /// ran though its answer was lost makes the next one match nothing.
    pub(super) async fn mark(self: Arc<Self>, marks: Vec<Mark>) {
        let outbox = &self.outbox;
        let mut waits = MARK_RETRIES.iter();
        let mut marked = loop {
            let answer = outbox
                .bounded(async { on_backend!(&outbox.backend, db => db.mark(&marks).await) })
                .await;
            let error = match answer {
                Ok(marked) => break marked,
                Err(error) => error,
            };
            let Some(wait) = waits.next() else {
                tracing::warn!(
                    rows = marks.len(),
                    error = %error,
                    "outbox could not record the answers of its sends; the rows are sent again when their claims pass, and the idempotency layer answers those repeats"
                );
                return;
            };
            tracing::info!(
                rows = marks.len(),
                error = %error,
                retry_in_ms = millis(*wait),
                "outbox could not record the answers of its sends; asking again"
            );
            tokio::time::sleep(*wait).await;
        };
        marked.sort_unstable();
        for Mark { row, verdict } in &marks {
            if marked.binary_search(&(row.id, row.token)).is_err() {
                tracing::warn!(
                    row = row.id,
                    "outbox claim passed before the send's answer was recorded; another claim holds the row"
                );
                continue;
            }
            self.count(row, verdict);
        }
    }

    fn count(&self, row: &Row, verdict: &Verdict) {
        match verdict {
            Verdict::Done(_) => {
                Counters::add(&self.counters.sent, 1);
                tracing::debug!(row = row.id, attempts = row.attempts, "outbox message sent");
            }
            Verdict::Retry { after, error } => {
                Counters::add(&self.counters.retried, 1);
                tracing::info!(
                    row = row.id,
                    attempts = row.attempts,
                    code = error.code(),
                    retry_in_ms = after.as_millis() as u64,
                    "outbox message will be tried again"
                );
            }
            Verdict::Dead(why) => {
                Counters::add(&self.counters.dead_lettered, 1);
                tracing::warn!(row = row.id, attempts = row.attempts, error = %why, "outbox message moved to the dead-letter state");
            }
        }
    }

    /// Puts back rows claimed but not sent, so another worker takes them at once.
    pub(super) async fn release(self: Arc<Self>, rows: Vec<Row>) {
        let outbox = &self.outbox;
        let answer = outbox
            .bounded(async { on_backend!(&outbox.backend, db => db.release(&rows).await) })
            .await;
        match answer {
            Ok(released) => Counters::add(&self.counters.released, released),
            Err(error) => tracing::warn!(
                rows = rows.len(),
                error = %error,
                "outbox could not put back unsent rows; they return when their claims pass"
            ),
        }
    }
}
