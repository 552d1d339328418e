//! The stored form of records and outcomes: what a networked store writes, versioned, kept
//! apart from the public types.
//!
//! [`Receipt`], [`SendError`] and [`Outcome`] are the crate's API and may change from one
//! release to the next; what a store wrote must keep reading, since during a rolling deploy
//! processes of two releases read each other's records. So the stored form is made of
//! private structs here, converted to and from the public types in this one place, and
//! pinned byte for byte by golden tests (`tests/stored_format.rs` and the unit tests here).
//!
//! # Versions
//!
//! A stored value says its version by its first byte:
//!
//! | first byte | form |
//! |---|---|
//! | `{` | version 1, JSON: an outcome, below |
//! | `0x02` | version 2: a whole record, below |
//! | another byte below `0x20`, other than JSON whitespace | the version byte of a later form: refused as [`Corrupt`](super::StoreErrorKind::Corrupt), naming the version |
//! | anything else | not a record: [`Corrupt`](super::StoreErrorKind::Corrupt) |
//!
//! A later form starts with its version byte (3 and up), which no JSON document can start
//! with, so a release that writes it still tells the others apart.
//!
//! # Version 1: an outcome
//!
//! An outcome, as [`encode_outcome`] writes it (and `PostgresStore` keeps in its `outcome`
//! column, and a version-2 record at its end):
//!
//! ```json
//! {"sent":{"id":"msg_1","transport":"resend","accepted":[],"replayed":false,"accepted_at":[0,1]}}
//! {"failed":{"code":"provider.timeout","category":"unknown","retryable":false,"message":"timed out","retry_after_ms":1500,"source":"socket closed"}}
//! ```
//!
//! - `sent`: the provider's message `id`, the `transport`'s name, the `accepted` recipients
//!   (empty when the layer kept them as positions), `replayed`, and `accepted_at`: the
//!   accepted recipients as positions in the message's recipient list, so no address is
//!   stored (left out when empty).
//! - `failed`: the error's stable `code`, its `category` (`retryable`, `permanent`,
//!   `validation` or `unknown`; `delivered` is a name of the form but contradicts a failure,
//!   see [the rules](#the-record-rules)), `retryable`, the `message`, and, when set,
//!   `retry_after_ms` and `source`, the text of the source error (its type does not survive
//!   the store).
//!
//! # Version 2: a whole record
//!
//! A whole record, as [`encode_record`] writes it (and `RedisStore` keeps under each key), is
//! one line of fixed places, then the outcome:
//!
//! | bytes | what |
//! |---|---|
//! | 0 | `0x02`, the version |
//! | 1 | the state: `P` pending, `D` done |
//! | 2–37 | the token, the reservation's UUID, hyphenated, lowercase |
//! | 38–101 | the message fingerprint, 64 lowercase hex digits |
//! | 102– | `first_attempt_before_expiry_ms`, `,`, `kept_after_lease_ms`, `\n`: each decimal digits, or nothing when absent |
//! | after the `\n` | the outcome in version 1 (done records only; nothing for a pending one) |
//!
//! ```text
//! \x02P6f1c2a4e-8b3d-4f5a-9c7e-1d2b3c4d5e6f0909…0909120000,60000\n
//! \x02D6f1c2a4e-8b3d-4f5a-9c7e-1d2b3c4d5e6f0909…090986400000,\n{"failed":{…"category":"unknown"…}}
//! \x02D6f1c2a4e-8b3d-4f5a-9c7e-1d2b3c4d5e6f0909…0909,\n{"sent":{…}}
//! ```
//!
//! The token and state sit at fixed places so that a store's server compares the front of
//! the value to fence a write, without decoding it. The times are relative to the expiry of
//! the value that holds the record, so the store's clock places them (`RedisStore`: `PX`
//! when written, `PTTL` when read) and the writer needs none:
//!
//! - `first_attempt_before_expiry_ms`: how long before the value expires the first attempt
//!   under the key began (kept through retakes and takeovers of the same message): its age
//!   is this minus the time the value has left; a store reports it as
//!   [`Record::first_attempt_age`](super::Record::first_attempt_age). Every pending record
//!   carries it. A done record of unknown delivery carries it when the holder of such a
//!   pending record completed it, and not otherwise (completed after its own pending record
//!   was gone, or resolved by an operator): its first attempt is unknown, and it is never
//!   re-sent. A done record of known delivery is never re-sent, and carries none.
//! - `kept_after_lease_ms`: how long a pending record outlives its lease: the lease ends
//!   this long before the value expires. On every pending record and on no done one. A
//!   pending record outlives its lease so that a reserve after it can tell it took the key
//!   over from a holder that never settled it
//!   ([`Reservation::TakenOver`](super::Reservation::TakenOver)).
//!
//! Such a store reads a pending record without both as
//! [`Corrupt`](super::StoreErrorKind::Corrupt): it could not tell when its lease ends.
//! [`encode_record`] has no value to be relative to and writes neither; [`decode_record`]
//! reads a record with or without them.
//!
//! # The record rules
//!
//! What decodes must also make sense, or it is [`Corrupt`](super::StoreErrorKind::Corrupt):
//!
//! - a pending record carries no outcome: a send holds the key and has not finished, so an
//!   outcome beside it says the record was damaged or written by something else;
//! - a done record carries an outcome: there must be something to replay;
//! - a kept failure is not of category `delivered`: a failure is no delivery, and no
//!   [`SendError`] of this crate can be of that category;
//! - a kept receipt's accepted positions lie within the recipients of the message it is
//!   replayed for: a position beyond them is refused when the receipt is replayed, never
//!   read as "accepted nobody".
//!
//! Every networked store reads through this module ([`decode_record`], and, for a store that
//! keeps state and outcome in fields of their own, [`decode_outcome`] and the same rules), so
//! every store answers the same for the same damage: `RedisStore` and `PostgresStore` both
//! report a pending record with an outcome as corrupt. [`encode_record`] refuses to write a
//! record that breaks the first two rules.
//!
//! # For a third-party store
//!
//! A store that keeps the outcome in a field of its own (a column) writes
//! [`encode_outcome`] and reads [`decode_outcome`]; a store that keeps each key as one value
//! writes [`encode_record`] and reads [`decode_record`]. Treat the bytes as opaque: a later
//! release may write a form that it, but not this release, reads.
//!
//! ```
//! use tower_idempotency::store::record::{decode_outcome, encode_outcome};
//! use tower_idempotency::{Outcome, Receipt};
//!
//! let bytes = encode_outcome(&Outcome::sent(Receipt::new("msg_1", "resend")))?;
//! assert_eq!(
//!     bytes,
//!     br#"{"sent":{"id":"msg_1","transport":"resend","accepted":[],"replayed":false}}"#
//! );
//! let kept = decode_outcome(&bytes)?;
//! assert_eq!(kept.replay().unwrap().id, "msg_1");
//! # Ok::<(), tower_idempotency::StoreError>(())
//! ```

use std::error::Error;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Record, RecordState, StoreError, Token};
use crate::fingerprint::Fingerprint;
use crate::outcome::{Category, Kept, Outcome, Receipt, SendError};
pub(crate) use value::Times;

/// Encodes `outcome` in the stored form this release writes (version 1).
pub fn encode_outcome(outcome: &Outcome) -> Result<Vec<u8>, StoreError> {
    outcome_json(outcome).map(String::into_bytes)
}

/// Decodes an outcome [`encode_outcome`] wrote, in this release or an earlier one.
///
/// Fails with a [`Corrupt`](super::StoreErrorKind::Corrupt) error when `bytes` are not an
/// outcome, break [the record rules](self#the-record-rules) (a failure of category
/// `delivered`), or are of a later version than this release reads.
pub fn decode_outcome(bytes: &[u8]) -> Result<Outcome, StoreError> {
    let stored: OutcomeIn = read(bytes, "the stored outcome is not an outcome")?;
    stored.try_into()
}

/// Encodes `record`, held under `token`, in the stored form this release writes for a whole
/// record (version 2), without times.
///
/// The token fences the reservation: a store that keeps each key as one value compares it
/// before it overwrites or deletes the value (as `RedisStore`'s scripts do, on the value's
/// front).
///
/// Fails with a [`Corrupt`](super::StoreErrorKind::Corrupt) error, writing nothing, when the
/// record breaks [the record rules](self#the-record-rules): a pending record with an outcome,
/// or a done one without.
pub fn encode_record(token: Token, record: &Record) -> Result<Vec<u8>, StoreError> {
    value::encode(
        record.state,
        token,
        record.fingerprint,
        record.outcome.as_ref(),
        Times::default(),
    )
}

/// Decodes a record [`encode_record`] wrote, with the token that holds it.
///
/// Fails with a [`Corrupt`](super::StoreErrorKind::Corrupt) error when `bytes` are not a
/// record, break [the record rules](self#the-record-rules) (a pending record with an outcome,
/// a done one without, a failure of category `delivered`), or are of a later version than
/// this release reads.
pub fn decode_record(bytes: &[u8]) -> Result<(Token, Record), StoreError> {
    read_record(bytes).map(|(token, record, _)| (token, record))
}

/// A record with its times, as a store that keeps them in the record (`RedisStore`) reads
/// it: a pending record without both is corrupt.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn decode_record_times(bytes: &[u8]) -> Result<(Token, Record, Times), StoreError> {
    let (token, record, times) = read_record(bytes)?;
    if record.state == RecordState::Pending
        && (times.first_attempt_before_expiry_ms.is_none() || times.kept_after_lease_ms.is_none())
    {
        return Err(StoreError::corrupt(
            "a pending record carries no first attempt's time or no time kept after its \
             lease: every reserve writes both",
        ));
    }
    Ok((token, record, times))
}

/// [`decode_record`], with whatever times the record carries.
fn read_record(bytes: &[u8]) -> Result<(Token, Record, Times), StoreError> {
    match Form::of(bytes) {
        Form::RecordV2 => value::decode(bytes),
        Form::JsonV1 => Err(StoreError::corrupt(
            "the value under the key is not a record (a record starts with its version byte)",
        )),
        Form::Later(version) => Err(later(version)),
    }
}

/// The accepted recipients a kept receipt names by position, read from `recipients` (the
/// repeat's, the same as the original's since their fingerprints match).
///
/// A position outside `recipients` is [`Corrupt`](super::StoreErrorKind::Corrupt): the
/// record was damaged or written for another message, and replaying it as "accepted nobody"
/// would tell the caller something the provider never said.
fn accepted_recipients(positions: &[u32], recipients: &[&str]) -> Result<Vec<String>, StoreError> {
    positions
        .iter()
        .map(|&i| {
            usize::try_from(i)
                .ok()
                .and_then(|i| recipients.get(i))
                .map(|r| (*r).to_owned())
                .ok_or_else(|| {
                    StoreError::corrupt(format!(
                        "the kept receipt names accepted recipient {i} of a message with {}",
                        recipients.len()
                    ))
                })
        })
        .collect()
}

// Here, beside the rule on kept positions it applies, so `outcome` names no store type.
impl Outcome {
    /// Whether [`into_replay_for`](Self::into_replay_for) reads its recipients: only a kept
    /// receipt that names accepted recipients (by position in the request's list) does.
    pub(crate) fn names_recipients(&self) -> bool {
        matches!(&self.0, Kept::Sent { accepted_at, .. } if !accepted_at.is_empty())
    }

    /// The kept outcome as the caller sees it when a repeat of the message is answered from
    /// the store: marked replayed, its accepted recipients restored from the repeat's
    /// `recipients` (the same as the original's, as their fingerprints match).
    /// A position outside `recipients` is a damaged record: `idempotency.store_failed`,
    /// never a receipt that accepted nobody.
    pub(crate) fn into_replay_for(self, recipients: &[&str]) -> Result<Receipt, SendError> {
        match self.0 {
            Kept::Sent {
                mut receipt,
                accepted_at,
            } => {
                if !accepted_at.is_empty() {
                    receipt.accepted = accepted_recipients(&accepted_at, recipients)
                        .map_err(SendError::store_failed)?;
                }
                receipt.replayed = true;
                Ok(receipt)
            }
            Kept::Failed(error) => Err(error.replayed()),
        }
    }
}

/// The record a store read, once it passes [the record rules](self#the-record-rules) on its
/// shape: the one check behind [`decode_record`] and `PostgresStore`'s rows, so every store
/// answers the same for the same damage. `outcome` is already decoded, by [`decode_outcome`]
/// or as part of a record, and so has passed the rule on outcomes.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn checked_record(
    state: RecordState,
    fingerprint: Fingerprint,
    outcome: Option<Outcome>,
) -> Result<Record, StoreError> {
    check_shape(state, outcome.is_some())?;
    Ok(Record {
        state,
        fingerprint,
        outcome,
        first_attempt_age: None,
    })
}

/// A pending record carries no outcome, a done record carries one.
fn check_shape(state: RecordState, has_outcome: bool) -> Result<(), StoreError> {
    match (state, has_outcome) {
        (RecordState::Pending, true) => Err(StoreError::corrupt(
            "a pending record carries an outcome: a send that has not finished has none",
        )),
        (RecordState::Done, false) => Err(StoreError::corrupt(
            "a done record carries no outcome: there is nothing to replay",
        )),
        _ => Ok(()),
    }
}

/// The outcome as version-1 JSON, for a store that keeps it as text (`PostgresStore`'s
/// `jsonb` column).
pub(crate) fn outcome_json(outcome: &Outcome) -> Result<String, StoreError> {
    serde_json::to_string(&OutcomeOut::from(outcome)).map_err(unencodable)
}

/// A pending record with its times, as `RedisStore` writes it.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn pending_value(
    token: Token,
    fingerprint: Fingerprint,
    times: Times,
) -> Result<Vec<u8>, StoreError> {
    value::encode(RecordState::Pending, token, fingerprint, None, times)
}

/// A done record without times, as `RedisStore` hands it to its complete script, which adds
/// the first attempt's time it keeps.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn done_value(
    token: Token,
    fingerprint: Fingerprint,
    outcome: &Outcome,
) -> Result<Vec<u8>, StoreError> {
    value::encode(
        RecordState::Done,
        token,
        fingerprint,
        Some(outcome),
        Times::default(),
    )
}

fn unencodable(error: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::corrupt("the record could not be encoded").with_source(error)
}

/// How a stored value says its version; see the [module docs](self#versions).
#[derive(Debug, PartialEq, Eq)]
enum Form {
    /// Version 1: JSON, with no version field: an outcome.
    JsonV1,
    /// Version 2: a whole record.
    RecordV2,
    /// A version byte this release does not read.
    Later(u8),
}

impl Form {
    fn of(bytes: &[u8]) -> Self {
        match bytes.first() {
            Some(&value::VERSION) => Self::RecordV2,
            Some(&byte) if byte < 0x20 && !matches!(byte, b'\t' | b'\n' | b'\r') => {
                Self::Later(byte)
            }
            // Anything else is read as JSON, which refuses what is not an outcome.
            _ => Self::JsonV1,
        }
    }
}

fn later(version: u8) -> StoreError {
    StoreError::corrupt(format!(
        "the stored value is of version {version}, which this release does not read \
         (written by a later release?)"
    ))
}

/// Reads a stored outcome; `not_an_outcome` describes a value that does not decode.
fn read<'de, T: Deserialize<'de>>(bytes: &'de [u8], not_an_outcome: &str) -> Result<T, StoreError> {
    match Form::of(bytes) {
        Form::JsonV1 => serde_json::from_slice(bytes)
            .map_err(|e| StoreError::corrupt(not_an_outcome).with_source(e)),
        Form::RecordV2 => Err(StoreError::corrupt(format!(
            "{not_an_outcome}: it is a whole record (version 2)"
        ))),
        Form::Later(version) => Err(later(version)),
    }
}

// Version 1. The structs below are the stored form: renaming or reordering a field changes
// what is written, and the golden tests fail.

#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum OutcomeOut<'a> {
    Sent(ReceiptOut<'a>),
    Failed(ErrorOut<'a>),
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum OutcomeIn {
    Sent(ReceiptIn),
    Failed(ErrorIn),
}

#[derive(Serialize)]
struct ReceiptOut<'a> {
    id: &'a str,
    transport: &'a str,
    accepted: &'a [String],
    replayed: bool,
    #[serde(skip_serializing_if = "<[u32]>::is_empty")]
    accepted_at: &'a [u32],
}

#[derive(Deserialize)]
struct ReceiptIn {
    id: String,
    transport: String,
    accepted: Vec<String>,
    replayed: bool,
    #[serde(default)]
    accepted_at: Vec<u32>,
}

#[derive(Serialize)]
struct ErrorOut<'a> {
    code: &'a str,
    category: CategoryV1,
    retryable: bool,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<String>,
}

#[derive(Deserialize)]
struct ErrorIn {
    code: String,
    category: CategoryV1,
    retryable: bool,
    message: String,
    #[serde(default)]
    retry_after_ms: Option<u64>,
    #[serde(default)]
    source: Option<String>,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum CategoryV1 {
    Delivered,
    Retryable,
    Permanent,
    Validation,
    Unknown,
}

impl<'a> From<&'a Outcome> for OutcomeOut<'a> {
    fn from(outcome: &'a Outcome) -> Self {
        match &outcome.0 {
            Kept::Sent {
                receipt,
                accepted_at,
            } => Self::Sent(ReceiptOut {
                id: &receipt.id,
                transport: &receipt.transport,
                accepted: &receipt.accepted,
                replayed: receipt.replayed,
                accepted_at,
            }),
            Kept::Failed(error) => Self::Failed(ErrorOut {
                code: error.code(),
                category: error.category().into(),
                retryable: error.is_retryable(),
                message: error.message(),
                retry_after_ms: error
                    .retry_after()
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                source: Error::source(error).map(ToString::to_string),
            }),
        }
    }
}

/// The rule on outcomes lives here, where every stored outcome becomes an [`Outcome`]: a
/// failure of category `delivered` contradicts itself.
impl TryFrom<OutcomeIn> for Outcome {
    type Error = StoreError;

    fn try_from(stored: OutcomeIn) -> Result<Self, StoreError> {
        Ok(match stored {
            OutcomeIn::Sent(r) => Self(Kept::Sent {
                receipt: Receipt {
                    id: r.id,
                    transport: r.transport,
                    accepted: r.accepted,
                    replayed: r.replayed,
                },
                accepted_at: r.accepted_at,
            }),
            OutcomeIn::Failed(ErrorIn {
                category: CategoryV1::Delivered,
                ..
            }) => {
                return Err(StoreError::corrupt(
                    "the stored outcome is a failure of category delivered: a failure is no \
                     delivery",
                ));
            }
            OutcomeIn::Failed(e) => {
                let mut error = SendError::new(e.code, e.category.into(), e.retryable, e.message);
                if let Some(ms) = e.retry_after_ms {
                    error = error.with_retry_after(Duration::from_millis(ms));
                }
                if let Some(text) = e.source {
                    error = error.with_source(KeptSource(text));
                }
                Self::failed(error)
            }
        })
    }
}

impl From<Category> for CategoryV1 {
    fn from(category: Category) -> Self {
        match category {
            Category::Delivered => Self::Delivered,
            Category::Retryable => Self::Retryable,
            Category::Permanent => Self::Permanent,
            Category::Validation => Self::Validation,
            Category::Unknown => Self::Unknown,
        }
    }
}

impl From<CategoryV1> for Category {
    fn from(category: CategoryV1) -> Self {
        match category {
            CategoryV1::Delivered => Self::Delivered,
            CategoryV1::Retryable => Self::Retryable,
            CategoryV1::Permanent => Self::Permanent,
            CategoryV1::Validation => Self::Validation,
            CategoryV1::Unknown => Self::Unknown,
        }
    }
}

/// The text of a source error that came back from a store: the original type is gone.
#[derive(Debug)]
struct KeptSource(String);

impl fmt::Display for KeptSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for KeptSource {}

mod value;

#[cfg(test)]
mod tests;
