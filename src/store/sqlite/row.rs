//! Row mapping: what a row says, as records and reservations, held to the record rules of
//! the stored form so this store answers as every other does for the same damage.

use std::path::Path;

use rusqlite::Row;
use rusqlite::types::ValueRef;

use crate::fingerprint::Fingerprint;
use crate::outcome::Outcome;
use crate::store::admin::KeyState;
use crate::store::{Record, RecordState, Reservation, StoreError, Token, record};

/// A row as read, before it is checked: state, token, fingerprint, outcome.
pub(super) struct Found {
    state: Option<String>,
    token: Option<Vec<u8>>,
    fingerprint: Option<Vec<u8>>,
    outcome: Option<Vec<u8>>,
}

impl Found {
    /// Reads the columns (state, token, fingerprint, outcome) of a reserve's answer. Values
    /// of the wrong type are kept as absent and reported as corrupt when checked, so a
    /// damaged row never fails the statement that met it.
    pub(super) fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            state: text(row, 0),
            token: bytes(row, 1),
            fingerprint: bytes(row, 2),
            outcome: bytes(row, 3),
        })
    }

    /// What a reserve found: ours when the row holds our `token`.
    pub(super) fn reservation(self, token: Token, path: &Path) -> Result<Reservation, StoreError> {
        match self.token.as_deref() {
            Some(holder) if holder == &token.as_uuid().as_bytes()[..] => {
                return Ok(Reservation::Reserved { token });
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
    record::checked_record(state, fingerprint, outcome)
        .map_err(|e| corrupt(path, "breaks the record rules").with_source(e))
}
