//! Re-sending inside the provider's window: a repeat that finds its message kept with an
//! outcome of unknown delivery, its first attempt younger than the
//! [`provider_window`](super::IdempotencyLayerBuilder::provider_window), takes the key back
//! ([`Store::retake`](crate::store::Store::retake)) and is sent again under the same key,
//! which the provider deduplicates on.
//!
//! The retake is one atomic step in the store, so of concurrent repeats exactly one takes
//! the key back; the others ask again and find it pending (answered, or waiting, as for any
//! send in flight).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::config::Config;
use super::key::key_hash;
use super::renew::within;
use super::reserve::reserve_one;
use super::stats::bump;
use super::wait::wait_one;
use crate::fingerprint::Fingerprint;
use crate::outcome::codes;
use crate::store::{Record, Reservation, StoreError, StoreErrorKind};

/// Whether `record` is the same message, kept with an outcome of unknown delivery, whose
/// first attempt (by the store's clock) is known and younger than `window`.
pub(crate) fn inside_window(record: &Record, fingerprint: Fingerprint, window: Duration) -> bool {
    record.fingerprint == fingerprint && record.first_attempt_age.is_some_and(|age| age < window)
}

/// What a single send's reservation becomes once the provider's window is applied: a held
/// record of unknown delivery inside the window is taken back (a reservation to send
/// under); one another repeat took back first is asked about again. Every other answer is
/// returned as it is. `asked_at` becomes the moment the key's new lease began.
pub(crate) async fn take_back(
    config: &Arc<Config>,
    key: &Arc<str>,
    fingerprint: Fingerprint,
    reservation: Result<Reservation, StoreError>,
    asked_at: &mut Instant,
) -> Result<Reservation, StoreError> {
    let window = config.provider_window.filter(|&window| {
        matches!(&reservation, Ok(Reservation::Held { record })
            if record.is_unknown_delivery() && inside_window(record, fingerprint, window))
    });
    match window {
        None => reservation,
        Some(window) => retake(config, key, fingerprint, window, reservation, asked_at).await,
    }
}

/// [`take_back`] for a held record inside the window: the retake, and what follows it.
async fn retake(
    config: &Arc<Config>,
    key: &Arc<str>,
    fingerprint: Fingerprint,
    window: Duration,
    reservation: Result<Reservation, StoreError>,
    asked_at: &mut Instant,
) -> Result<Reservation, StoreError> {
    let retake_at = Instant::now();
    let answer = within(
        config,
        config.store.retake(key, fingerprint, config.lease, window),
    )
    .await;
    match answer {
        Ok(Some(token)) => {
            *asked_at = retake_at;
            bump(&config.counters.resent);
            tracing::info!(
                namespace = %config.namespace,
                key_hash = %key_hash(key),
                "delivery unknown inside the provider's window: sending again under the same key"
            );
            Ok(Reservation::Reserved { token })
        }
        // Another repeat took it back first, or the record changed: a repeat like any other.
        Ok(None) => {
            *asked_at = Instant::now();
            match reserve_one(config, key, fingerprint).await {
                Ok(Reservation::Held { record }) => {
                    wait_one(config, key, fingerprint, record, asked_at).await
                }
                other => other,
            }
        }
        Err(error) => {
            let unsupported = error.kind() == StoreErrorKind::Unsupported;
            if !unsupported || !config.retake_unsupported.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    namespace = %config.namespace,
                    key_hash = %key_hash(key),
                    code = codes::STORE_FAILED_WARNING,
                    error = %error,
                    "the store could not take the key back for a re-send inside the \
                     provider's window; the kept outcome is answered"
                );
            }
            reservation
        }
    }
}
