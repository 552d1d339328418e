//! Row mapping: what a row says, as records and reservations, held to the record rules of
//! the stored form so this store answers as every other does for the same damage.

use std::path::Path;
use std::time::Duration;

use rusqlite::Row;
use rusqlite::types::ValueRef;

use crate::fingerprint::Fingerprint;
use crate::outcome::Outcome;
use crate::store::admin::KeyState;
use crate::store::{Record, RecordState, Reservation, StoreError, Token, record};

/// A row as read, before it is checked: state, token, fingerprint, outcome, the first
/// attempt's age in ms.
pub(super) struct Found {
    state: Option<String>,
    token: Option<Vec<u8>>,
    fingerprint: Option<Vec<u8>>,
    outcome: Option<Vec<u8>>,
    age: Option<i64>,
}

/// The row a reserve replaced, as it was: state, fingerprint, outcome, whether its time had
/// passed, the first attempt's age in ms.
pub(super) struct Before {
    state: Option<String>,
    fingerprint: Option<Vec<u8>>,
    outcome: Option<Vec<u8>>,
    expired: bool,
    age: Option<i64>,
}

impl Before {
    /// Reads the columns of [`BEFORE_RESERVE`](super::sql::BEFORE_RESERVE).
    pub(super) fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            state: text(row, 0),
            fingerprint: bytes(row, 1),
            outcome: bytes(row, 2),
            expired: row.get::<_, bool>(3).unwrap_or(false),
            age: row.get::<_, Option<i64>>(4).ok().flatten(),
        })
    }

    /// Whether a reserve that took the key took it over from a send never settled.
    fn was_stale_pending(&self) -> bool {
        self.expired && self.state.as_deref() == Some("pending")
    }
}

impl Found {
    /// Reads the columns (state, token, fingerprint, outcome, age) of a reserve's answer.
    /// Values of the wrong type are kept as absent and reported as corrupt when checked, so a
    /// damaged row never fails the statement that met it.
    pub(super) fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            state: text(row, 0),
            token: bytes(row, 1),
            fingerprint: bytes(row, 2),
            outcome: bytes(row, 3),
            age: row.get::<_, Option<i64>>(4).ok().flatten(),
        })
    }

    /// What a reserve found: ours when the row holds our `token` (taken over when `before`
    /// was a pending row whose lease had passed), held otherwise.
    pub(super) fn reservation(
        self,
        token: Token,
        before: Option<Before>,
        path: &Path,
    ) -> Result<Reservation, StoreError> {
        match self.token.as_deref() {
            Some(holder) if holder == &token.as_bytes()[..] => {
                return match before.filter(Before::was_stale_pending) {
                    Some(before) => {
                        let previous = record(
                            KeyState::Pending,
                            before.fingerprint.as_deref(),
                            before.outcome.as_deref(),
                            before.age,
                            path,
                        )?;
                        Ok(Reservation::TakenOver { token, previous })
                    }
                    None => Ok(Reservation::Reserved { token }),
                };
            }
            // No holder could ever settle a row whose token is not a UUID.
            Some(holder) if holder.len() == 16 => {}
            _ => return Err(corrupt(path, "has a token that is not 16 bytes")),
        }
        let state = key_state(self.state.as_deref(), path)?;
        record(
            state,
            self.fingerprint.as_deref(),
            self.outcome.as_deref(),
            self.age,
            path,
        )
        .map(|record| Reservation::Held { record })
    }
}

/// The column at `at` as text, or `None` when it is not text.
pub(super) fn text(row: &Row<'_>, at: usize) -> Option<String> {
    match row.get_ref(at) {
        Ok(ValueRef::Text(text)) => String::from_utf8(text.to_vec()).ok(),
        _ => None,
    }
}

/// The column at `at` as bytes (text or blob), or `None` when it is NULL or a number.
pub(super) fn bytes(row: &Row<'_>, at: usize) -> Option<Vec<u8>> {
    match row.get_ref(at) {
        Ok(ValueRef::Blob(bytes) | ValueRef::Text(bytes)) => Some(bytes.to_vec()),
        _ => None,
    }
}

pub(super) fn corrupt(path: &Path, what: &str) -> StoreError {
    StoreError::corrupt(format!(
        "a row of the SQLite database {} {what}",
        path.display()
    ))
}

/// The state a row's text names.
pub(super) fn key_state(state: Option<&str>, path: &Path) -> Result<KeyState, StoreError> {
    match state {
        Some("pending") => Ok(KeyState::Pending),
        Some("claimed") => Ok(KeyState::Claimed),
        Some("done") => Ok(KeyState::Done),
        _ => Err(corrupt(path, "has an unknown state")),
    }
}

/// The record of a row in `state`, checked: a fingerprint of 32 bytes, an outcome of the
/// stored form, and the record rules (a claim holds the key like a send under way).
pub(super) fn record(
    state: KeyState,
    fingerprint: Option<&[u8]>,
    outcome: Option<&[u8]>,
    first_attempt_age: Option<i64>,
    path: &Path,
) -> Result<Record, StoreError> {
    let fingerprint = fingerprint
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .map(Fingerprint::from_bytes)
        .ok_or_else(|| corrupt(path, "has a fingerprint that is not 32 bytes"))?;
    let outcome: Option<Outcome> = outcome
        .map(record::decode_outcome)
        .transpose()
        .map_err(|e| corrupt(path, "holds an unreadable outcome").with_source(e))?;
    let state = match state {
        KeyState::Done => RecordState::Done,
        _ => RecordState::Pending,
    };
    let record = record::checked_record(state, fingerprint, outcome)
        .map_err(|e| corrupt(path, "breaks the record rules").with_source(e))?;
    // By SQLite's clock; a clock stepped back reads as no time passed, never a negative one.
    Ok(match first_attempt_age {
        Some(ms) => record.with_first_attempt_age(Duration::from_millis(ms.max(0).unsigned_abs())),
        None => record,
    })
}
