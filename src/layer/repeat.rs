//! Answering a repeat: the store already holds the request's key, so the request is not sent
//! and is answered from the record (replayed, in flight, key reused).

use super::config::Config;
use super::key::key_hash;
use super::request::IdempotentRequest;
use super::stats::bump;
use crate::fingerprint::Fingerprint;
use crate::outcome::{Receipt, SendError, codes};
use crate::store::{Record, RecordState, StoreError};

/// The answer to `request` when the store holds its key in `record`: the kept outcome of the
/// same message (replayed), `idempotency.in_flight` while its send runs,
/// `idempotency.key_reused` for another message.
pub(crate) fn answer_held<R: IdempotentRequest>(
    config: &Config,
    store_key: &str,
    fingerprint: Fingerprint,
    record: Record,
    request: &R,
) -> Result<Receipt, SendError> {
    let counters = &config.counters;
    if record.fingerprint != fingerprint {
        bump(&counters.key_reused);
        tracing::warn!(
            namespace = %config.namespace,
            key_hash = %key_hash(store_key),
            code = codes::KEY_REUSED,
            "idempotency key reused for a different message; not sent"
        );
        return Err(SendError::key_reused());
    }
    match (record.state, record.outcome) {
        (RecordState::Pending, _) => {
            bump(&counters.in_flight);
            tracing::info!(
                namespace = %config.namespace,
                key_hash = %key_hash(store_key),
                code = codes::IN_FLIGHT,
                "send under this idempotency key is in flight; not sent"
            );
            Err(SendError::in_flight())
        }
        (RecordState::Done, Some(outcome)) => {
            bump(&counters.replayed);
            tracing::debug!(
                namespace = %config.namespace,
                key_hash = %key_hash(store_key),
                "answered from the idempotency store"
            );
            let recipients = if outcome.names_recipients() {
                request.recipients()
            } else {
                Vec::new()
            };
            outcome.into_replay_for(&recipients)
        }
        (RecordState::Done, None) => {
            bump(&counters.store_failed);
            tracing::warn!(
                namespace = %config.namespace,
                key_hash = %key_hash(store_key),
                code = codes::STORE_FAILED,
                "idempotency store answered a done record without an outcome; not sent"
            );
            Err(SendError::store_failed(StoreError::corrupt(
                "a done record has no outcome",
            )))
        }
    }
}
