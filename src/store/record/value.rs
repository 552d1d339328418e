//! Version 2: a whole record as one value, its token and state at fixed places so that a
//! server script fences on a prefix, and its times relative to the value's expiry so that
//! the server's clock (`PX`, `PTTL`) carries them. See the [module docs](super#version-2).

use std::time::Duration;

use super::{check_shape, decode_outcome, outcome_json};
use crate::fingerprint::Fingerprint;
use crate::store::{Record, RecordState, StoreError, Token};

/// The first byte of a version-2 record.
pub(crate) const VERSION: u8 = 2;
/// Where the token starts (0-based): after the version byte and the state byte.
const TOKEN_AT: usize = 2;
/// A token is a hyphenated UUID.
const TOKEN_LEN: usize = 36;
/// Where the fingerprint starts.
const FINGERPRINT_AT: usize = TOKEN_AT + TOKEN_LEN;
/// Where the times start, after the fingerprint's 64 hex digits. `RedisStore`'s scripts
/// address the same places, 1-based.
pub(crate) const TIMES_AT: usize = FINGERPRINT_AT + 64;

/// The times a version-2 record carries, in milliseconds before or after the expiry of the
/// value that holds it, so that the store's clock, not the writer's, places them: the age of
/// the first attempt is `first_attempt_before_expiry_ms` minus the time the value has left,
/// and a pending record's lease ends `kept_after_lease_ms` before the value expires.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Times {
    /// How long before the value's expiry the first attempt under the key began: on every
    /// pending record, on a done one when it is known.
    pub(crate) first_attempt_before_expiry_ms: Option<u64>,
    /// How long a pending record is kept after its lease ended: on every pending record.
    pub(crate) kept_after_lease_ms: Option<u64>,
}

impl Times {
    /// The first attempt's age when the value has `left_ms` to live.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn first_attempt_age(&self, left_ms: u64) -> Option<Duration> {
        self.first_attempt_before_expiry_ms
            .map(|before| Duration::from_millis(before.saturating_sub(left_ms)))
    }

    /// What is left of a pending record's lease when the value has `left_ms` to live; zero
    /// once the lease passed.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn lease_left(&self, left_ms: u64) -> Duration {
        let kept = self.kept_after_lease_ms.unwrap_or(0);
        Duration::from_millis(left_ms.saturating_sub(kept))
    }
}

/// A record in the version-2 form, with `times`. Writes nothing that breaks the record rules
/// on shape (a pending record with an outcome, a done one without).
pub(crate) fn encode(
    state: RecordState,
    token: Token,
    fingerprint: Fingerprint,
    outcome: Option<&crate::outcome::Outcome>,
    times: Times,
) -> Result<Vec<u8>, StoreError> {
    check_shape(state, outcome.is_some())?;
    let json = outcome.map(outcome_json).transpose()?.unwrap_or_default();
    let mut head = String::with_capacity(TIMES_AT + 24 + json.len());
    head.push(char::from(VERSION));
    head.push(match state {
        RecordState::Pending => 'P',
        RecordState::Done => 'D',
    });
    // Written without `core::fmt`, as every reserve and complete writes one.
    head.push_str(token.text().as_str());
    head.push_str(std::str::from_utf8(&fingerprint.hex()).unwrap_or_default());
    let mut digits = itoa::Buffer::new();
    if let Some(ms) = times.first_attempt_before_expiry_ms {
        head.push_str(digits.format(ms));
    }
    head.push(',');
    if let Some(ms) = times.kept_after_lease_ms {
        head.push_str(digits.format(ms));
    }
    head.push('\n');
    head.push_str(&json);
    Ok(head.into_bytes())
}

/// Reads a version-2 record with its times. `bytes` start with [`VERSION`].
pub(crate) fn decode(bytes: &[u8]) -> Result<(Token, Record, Times), StoreError> {
    let bad = |what: &str| {
        StoreError::corrupt(format!("the value under the key is not a record: {what}"))
    };
    if bytes.len() < TIMES_AT || bytes[0] != VERSION {
        return Err(bad("too short for a record"));
    }
    let state = match bytes[1] {
        b'P' => RecordState::Pending,
        b'D' => RecordState::Done,
        _ => return Err(bad("an unknown state")),
    };
    let token = std::str::from_utf8(&bytes[TOKEN_AT..FINGERPRINT_AT])
        .ok()
        .and_then(|t| t.parse::<Token>().ok())
        .ok_or_else(|| bad("no token"))?;
    let fingerprint = Fingerprint::from_hex(&bytes[FINGERPRINT_AT..TIMES_AT])
        .ok_or_else(|| bad("no fingerprint"))?;
    let rest = &bytes[TIMES_AT..];
    let end = rest
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| bad("its times are not closed"))?;
    let (times, outcome) = (&rest[..end], &rest[end + 1..]);
    let comma = times
        .iter()
        .position(|&b| b == b',')
        .ok_or_else(|| bad("its times are not two"))?;
    let times = Times {
        first_attempt_before_expiry_ms: millis(&times[..comma])
            .map_err(|()| bad("a time is not a number"))?,
        kept_after_lease_ms: millis(&times[comma + 1..])
            .map_err(|()| bad("a time is not a number"))?,
    };
    let outcome = (!outcome.is_empty())
        .then(|| decode_outcome(outcome))
        .transpose()?;
    check_shape(state, outcome.is_some()).map_err(|e| {
        StoreError::corrupt("the value under the key is not a usable record").with_source(e)
    })?;
    let record = Record {
        state,
        fingerprint,
        outcome,
        first_attempt_age: None,
    };
    Ok((token, record, times))
}

/// Decimal digits, or nothing.
fn millis(digits: &[u8]) -> Result<Option<u64>, ()> {
    if digits.is_empty() {
        return Ok(None);
    }
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err(());
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse().ok())
        .map(Some)
        .ok_or(())
}
