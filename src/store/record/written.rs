//! Reading a record in the exact form [`record_json_at`](super::record_json_at) writes: the
//! fixed fields (state, token, fingerprint) by position, and only the rest (the outcome, the
//! times), which holds a provider's strings, through serde_json. A replay on a networked
//! store decodes a record per call, and a general JSON parse of the fixed fields (six
//! strings scanned for escapes, UTF-8 checked, matched by name) was most of its work.
//!
//! Anything not in that exact form (another field order, spaces, an earlier release's
//! writing, damage) is left to the general decoder, and so is anything this reader would
//! refuse: it answers only what the general decoder answers for the same bytes (a unit test
//! holds the two together).

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny};

use super::{OutcomeIn, Times};
use crate::fingerprint::Fingerprint;
use crate::store::{RecordState, Token};

/// What the fixed fields of a record in the written form say, and the rest to decode.
pub(super) struct Written {
    pub(super) state: RecordState,
    pub(super) token: Token,
    pub(super) fingerprint: Fingerprint,
    pub(super) outcome: Option<OutcomeIn>,
    pub(super) times: Times,
}

/// The record in `bytes`, when they are in the written form; `None` otherwise, for the
/// general decoder to read or refuse.
pub(super) fn read(bytes: &[u8]) -> Option<Written> {
    let rest = bytes.strip_prefix(b"{\"state\":\"")?;
    let (state, rest) = if let Some(rest) = rest.strip_prefix(b"pending") {
        (RecordState::Pending, rest)
    } else {
        (RecordState::Done, rest.strip_prefix(b"done")?)
    };
    let rest = rest.strip_prefix(b"\",\"token\":\"")?;
    let (token, rest) = rest.split_at_checked(36)?;
    let token = Token::from(uuid::Uuid::try_parse_ascii(token).ok()?);
    let rest = rest.strip_prefix(b"\",\"fingerprint\":\"")?;
    let (fingerprint, rest) = rest.split_at_checked(64)?;
    let fingerprint: Fingerprint = std::str::from_utf8(fingerprint).ok()?.parse().ok()?;
    let rest = rest.strip_prefix(b"\"")?;
    let tail = match rest {
        b"}" => Tail::default(),
        [b',', fields @ ..] => {
            // The remaining fields as an object of their own: `{` in place of the comma.
            let mut object = Vec::with_capacity(fields.len() + 1);
            object.push(b'{');
            object.extend_from_slice(fields);
            let tail: Tail = serde_json::from_slice(&object).ok()?;
            if tail.repeats_a_fixed_field {
                return None;
            }
            tail
        }
        _ => return None,
    };
    Some(Written {
        state,
        token,
        fingerprint,
        outcome: tail.outcome,
        times: Times {
            first_attempt_at_ms: tail.first_attempt_at_ms,
            lease_until_ms: tail.lease_until_ms,
        },
    })
}

/// The fields after the fingerprint, as the general decoder reads them. A fixed field seen
/// again here is a record the general decoder refuses (a duplicate field).
#[derive(Default, Deserialize)]
struct Tail {
    #[serde(default)]
    outcome: Option<OutcomeIn>,
    #[serde(default)]
    first_attempt_at_ms: Option<u64>,
    #[serde(default)]
    lease_until_ms: Option<u64>,
    #[serde(
        default,
        alias = "state",
        alias = "token",
        alias = "fingerprint",
        deserialize_with = "present"
    )]
    repeats_a_fixed_field: bool,
}

/// Whether the field is there, whatever its value.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    IgnoredAny::deserialize(deserializer).map(|_| true)
}
