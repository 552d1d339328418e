//! A record read back with the time left on it: the reply of a read script, judged, and the
//! record as an operator sees it. Shared by the admin operations and the stale listing.

use std::time::Duration;

use redis::Value;

use super::server_error;
use crate::store::admin::{Expiry, Inspected, KeyState};
use crate::store::{RecordState, StoreError, StoreErrorKind, record};

/// A value read under a key, before it is judged.
pub(super) enum Raw {
    Nothing,
    OtherType,
    Value { bytes: Vec<u8>, pttl: i64 },
}

/// The error for a reply that is not of the shape the command answers.
pub(super) fn garbage(what: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        format!("the server answered {what} with something unexpected"),
    )
}

/// The reply of a read script (`{0}`, `{2}` or `{1, value, pttl}`), taken apart.
pub(super) fn raw(reply: Value) -> Result<Raw, StoreError> {
    let reply = reply.extract_error().map_err(server_error)?;
    let Value::Array(parts) = reply else {
        return Err(garbage("a read"));
    };
    let mut parts = parts.into_iter();
    let tag: i64 = match parts.next() {
        Some(v) => redis::from_redis_value(v).map_err(|_| garbage("a read"))?,
        None => return Err(garbage("a read")),
    };
    match tag {
        0 => Ok(Raw::Nothing),
        2 => Ok(Raw::OtherType),
        1 => {
            let bytes: Vec<u8> = parts
                .next()
                .map(redis::from_redis_value)
                .transpose()
                .map_err(|_| garbage("a read"))?
                .ok_or_else(|| garbage("a read"))?;
            let pttl: i64 = parts
                .next()
                .map(redis::from_redis_value)
                .transpose()
                .map_err(|_| garbage("a read"))?
                .ok_or_else(|| garbage("a read"))?;
            Ok(Raw::Value { bytes, pttl })
        }
        _ => Err(garbage("a read")),
    }
}

/// The value and `PTTL` a read answered, `None` when it found no record.
pub(super) fn raw_value(reply: Value) -> Result<Option<(Vec<u8>, i64)>, StoreError> {
    Ok(match raw(reply)? {
        Raw::Value { bytes, pttl } => Some((bytes, pttl)),
        Raw::Nothing | Raw::OtherType => None,
    })
}

/// Whether a record read with `pttl` left is a pending one within its lease.
pub(super) fn held_live(state: RecordState, times: record::Times, pttl: i64) -> bool {
    state == RecordState::Pending && lease_left(times, pttl) > Duration::ZERO
}

/// What is left of a pending record's lease when its key has `pttl` left (a key without
/// expiry has no lease left).
fn lease_left(times: record::Times, pttl: i64) -> Duration {
    u64::try_from(pttl).map_or(Duration::ZERO, |left| times.lease_left(left))
}

/// The record in `bytes`, as an operator sees it; `None` when the key expired as it was read.
/// A pending record's expiry is its lease's end, `kept_after_lease_ms` before its key's.
pub(super) fn inspected(
    key: &str,
    bytes: &[u8],
    pttl: i64,
) -> Result<Option<Inspected>, StoreError> {
    let (_, record, times) = record::decode_record_times(bytes)?;
    let expires = match (pttl, record.state) {
        (-2, _) => return Ok(None),
        (_, RecordState::Pending) => match lease_left(times, pttl) {
            Duration::ZERO => Expiry::Passed,
            left => Expiry::In(left),
        },
        (ms, _) if ms > 0 => Expiry::In(Duration::from_millis(ms.unsigned_abs())),
        (0, _) => Expiry::Passed,
        _ => Expiry::Unknown,
    };
    let state = match record.state {
        RecordState::Pending => KeyState::Pending,
        _ => KeyState::Done,
    };
    Ok(Some(Inspected::new(
        key,
        state,
        record.fingerprint,
        record.outcome,
        expires,
    )))
}
