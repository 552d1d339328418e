//! [`RetryPolicy`]: a `tower::retry::Policy` for sends that retries only what certainly did
//! not go.
//!
//! Put it inside [`IdempotencyLayer`](crate::IdempotencyLayer), so one reservation covers
//! every attempt, and every attempt carries the same message and key:
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower::retry::RetryLayer;
//! use tower_idempotency::{retry::RetryPolicy, BoxError, IdempotencyLayer, Message, Receipt};
//!
//! # fn provider() -> impl tower::Service<Message, Response = Receipt, Error = BoxError, Future: Send> + Clone + Send + 'static {
//! #     tower::service_fn(|_m: Message| async { Ok::<_, BoxError>(Receipt::new("m", "p")) })
//! # }
//! let policy = RetryPolicy::new()
//!     .max_attempts(4)
//!     .base_delay(Duration::from_millis(200))
//!     .max_elapsed(Duration::from_secs(30));
//! let service = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::in_memory())
//!     .layer(RetryLayer::new(policy))
//!     .timeout(Duration::from_secs(10))
//!     .service(provider());
//! # let _ = service;
//! ```
//!
//! What it retries:
//!
//! | error | retried? |
//! |---|---|
//! | [`SendError`] that [`is_retryable`](SendError::is_retryable) (429, 502/503/504, connection refused) | yes, after the backoff or the provider's `retry_after` |
//! | validation or permanent | never |
//! | unknown delivery (a timeout after the request left, a 500) | only with [`retry_unknown_delivery(true)`](RetryPolicy::retry_unknown_delivery): safe only when the provider deduplicates on the forwarded `Idempotency-Key` |
//! | a timeout (`tower::timeout`, `tokio::time`) | as unknown delivery |
//! | another error | judged by the policy's [`Classifier`] ([`default_classifier`] unless set) |
//!
//! Errors are judged by [`crate::classify`], exactly as the layer judges them: a [`SendError`]
//! anywhere in the source chain first. Give the policy the classifier the layer uses, so both
//! agree on whether an error sent the message:
//!
//! ```
//! use tower_idempotency::{IdempotencyLayer, MemoryStore, RetryPolicy};
//! use tower_idempotency::outcome::Category;
//!
//! # fn main() -> Result<(), tower_idempotency::layer::ConfigError> {
//! let layer = IdempotencyLayer::builder()
//!     .store(MemoryStore::new())
//!     .classify(|e| if e.to_string().contains("quota") { Category::Retryable } else { Category::Unknown })
//!     .build()?;
//! let policy = RetryPolicy::new().classifier(layer.classifier());
//! # let _ = policy;
//! # Ok(()) }
//! ```
//!
//! Attempts are bounded in number ([`max_attempts`](RetryPolicy::max_attempts)) and in total
//! time ([`max_elapsed`](RetryPolicy::max_elapsed)): a `retry_after` that would end past the
//! budget ends the retries instead.

use std::error::Error;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::retry::Policy;

use crate::classify::{AsSendError, Classifier, Verdict, judge};
use crate::outcome::Category;
#[cfg(doc)]
use crate::{classify::default_classifier, outcome::SendError};

/// Retries retryable send failures with exponential backoff and jitter; see the
/// [module docs](self).
///
/// Each request gets its own copy (tower clones the policy per request), which counts that
/// request's attempts and time.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    max_attempts: u32,
    base_delay: Duration,
    max_delay: Duration,
    max_elapsed: Duration,
    retry_unknown: bool,
    classifier: Classifier,
    attempts: u32,
    started: Option<Instant>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// Three attempts in all, a 200 ms base delay doubling up to 10 s, a 60 s budget, unknown
    /// delivery not retried.
    pub fn new() -> Self {
        Self {
            max_attempts: 3,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(10),
            max_elapsed: Duration::from_secs(60),
            retry_unknown: false,
            classifier: Classifier::default(),
            attempts: 1,
            started: None,
        }
    }

    /// Attempts in all, the first included; `0` and `1` both mean no retry.
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The delay before the first retry; each later one doubles it, up to
    /// [`max_delay`](Self::max_delay). The actual wait is drawn between half and all of it.
    #[must_use]
    pub fn base_delay(mut self, delay: Duration) -> Self {
        self.base_delay = delay;
        self
    }

    /// The longest backoff between two attempts (a provider's `retry_after` may ask for more,
    /// within the budget).
    #[must_use]
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// The time budget, counted from the first failure: no retry starts after it.
    #[must_use]
    pub fn max_elapsed(mut self, budget: Duration) -> Self {
        self.max_elapsed = budget;
        self
    }

    /// Also retry failures of unknown delivery. Safe only when the provider deduplicates on
    /// the `Idempotency-Key` header the transport forwards; otherwise a retry may send twice.
    #[must_use]
    pub fn retry_unknown_delivery(mut self, retry: bool) -> Self {
        self.retry_unknown = retry;
        self
    }

    /// Judges errors that hold no [`SendError`] and are no timeout with `classifier`, instead
    /// of [`default_classifier`]. Pass the layer's
    /// ([`IdempotencyLayer::classifier`](crate::IdempotencyLayer::classifier)) so the policy
    /// retries exactly what the layer frees the key of.
    #[must_use]
    pub fn classifier(mut self, classifier: Classifier) -> Self {
        self.classifier = classifier;
        self
    }

    /// Whether `error` may be retried, and the wait the provider asked for.
    fn judge(&self, error: &(dyn Error + 'static)) -> (bool, Option<Duration>) {
        match judge(error, &self.classifier) {
            Verdict::Answered(send) => {
                let retry = send.is_retryable() || (self.retry_unknown && send.delivery_unknown());
                (retry, send.retry_after())
            }
            Verdict::TimedOut | Verdict::Classified(Category::Unknown) => {
                (self.retry_unknown, None)
            }
            Verdict::Classified(Category::Retryable) => (true, None),
            Verdict::Classified(_) => (false, None),
        }
    }

    /// The backoff before retry number `retry` (1 for the first), with jitter in [½, 1].
    fn backoff(&self, retry: u32) -> Duration {
        let factor = 2u32.saturating_pow(retry.saturating_sub(1));
        let full = self
            .base_delay
            .checked_mul(factor)
            .unwrap_or(self.max_delay)
            .min(self.max_delay);
        full.mul_f64(0.5 + 0.5 * unit_random())
    }
}

/// A uniform draw in [0, 1) from the std hasher's random keys: fresh for every call, so
/// concurrent requests do not back off in lockstep.
pub(crate) fn unit_random() -> f64 {
    let bits = RandomState::new().hash_one(std::time::SystemTime::now());
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

impl<Req, Res, E> Policy<Req, Res, E> for RetryPolicy
where
    Req: Clone,
    E: AsSendError,
{
    type Future = Sleep;

    fn retry(&mut self, _req: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
        let error = result.as_ref().err()?;
        if self.attempts >= self.max_attempts {
            return None;
        }
        let (retry, retry_after) = self.judge(error.as_error());
        if !retry {
            return None;
        }
        let now = Instant::now();
        let started = *self.started.get_or_insert(now);
        let wait = retry_after.unwrap_or_else(|| self.backoff(self.attempts));
        let resume = now.checked_add(wait)?;
        if resume.duration_since(started) > self.max_elapsed {
            return None;
        }
        self.attempts += 1;
        Some(tokio::time::sleep_until(resume))
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        // Called on the service's own policy too, so it must not touch the per-request state.
        Some(req.clone())
    }
}
