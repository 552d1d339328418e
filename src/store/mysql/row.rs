//! Row mapping: what the rows a statement returned say, as records and reservations, and
//! the matching of a batch statement's rows to the keys asked.

use std::collections::HashMap;
use std::time::Duration;

use mysql_async::Row;
use mysql_async::prelude::FromValue;

use super::MySqlStore;
use crate::fingerprint::Fingerprint;
use crate::store::{Record, RecordState, Reservation, StoreError, StoreErrorKind, Token, record};

/// What a reserve needs of a row to decide: its state, token and fingerprint as stored, and
/// whether it expired by the server's clock.
pub(super) struct Peeked {
    pub(super) state: String,
    pub(super) token: Vec<u8>,
    pub(super) fingerprint: Vec<u8>,
    pub(super) expired: bool,
}

impl Peeked {
    /// Whether a reserve of `fingerprint` takes this row: it expired, or it is a claim of
    /// that message (claim-then-send).
    pub(super) fn takeable_by(&self, fingerprint: &[u8]) -> bool {
        self.expired || (self.state == "claimed" && self.fingerprint == fingerprint)
    }
}

/// A row a batch locked: its state and token, and whether it expired.
pub(super) struct Locked {
    pub(super) state: String,
    pub(super) token: Vec<u8>,
    pub(super) expired: bool,
}

impl MySqlStore {
    pub(super) fn corrupt(&self, what: &str) -> StoreError {
        StoreError::corrupt(format!("a row of table {:?} {what}", self.table.name))
    }

    /// Column `at` of `row`, of type `T` (an `Option` for a nullable column).
    pub(super) fn column<T: FromValue>(
        &self,
        row: &Row,
        at: usize,
        what: &str,
    ) -> Result<T, StoreError> {
        match row.get_opt::<T, usize>(at) {
            Some(Ok(value)) => Ok(value),
            Some(Err(e)) => Err(self.corrupt(what).with_source(e)),
            None => Err(self.corrupt(what)),
        }
    }

    /// Reads the row of [`RECORD_COLUMNS`](super::sql::RECORD_COLUMNS) starting at column
    /// `from`, as far as a reserve needs to decide.
    pub(super) fn peeked(&self, row: &Row, from: usize) -> Result<Peeked, StoreError> {
        let state: String = self.column(row, from, "has no readable state")?;
        let expired: i64 = self.column(row, from + 5, "has no readable expiry")?;
        Ok(Peeked {
            state,
            token: self.column(row, from + 1, "has no readable token")?,
            fingerprint: self.column(row, from + 2, "has no readable fingerprint")?,
            expired: expired != 0,
        })
    }

    /// The record of the row of [`RECORD_COLUMNS`](super::sql::RECORD_COLUMNS) starting at
    /// column `from`, with its first attempt's age.
    pub(super) fn record(&self, row: &Row, from: usize) -> Result<Record, StoreError> {
        let state: String = self.column(row, from, "has no readable state")?;
        let state = match state.as_str() {
            // A claim not yet taken holds the key like a send under way.
            "pending" | "claimed" => RecordState::Pending,
            "done" => RecordState::Done,
            _ => return Err(self.corrupt("has an unknown state")),
        };
        let mut record = self.checked(row, state, from + 2, from + 3)?;
        record.first_attempt_age = self.first_attempt_age(row, from + 4)?;
        Ok(record)
    }

    /// The record of a row in `state` whose fingerprint and outcome are in the columns
    /// `fingerprint_at` and `outcome_at`, held to the record rules of the stored form, so
    /// this store answers as every other does.
    pub(super) fn checked(
        &self,
        row: &Row,
        state: RecordState,
        fingerprint_at: usize,
        outcome_at: usize,
    ) -> Result<Record, StoreError> {
        let fingerprint: Vec<u8> =
            self.column(row, fingerprint_at, "has no readable fingerprint")?;
        let fingerprint = <[u8; 32]>::try_from(fingerprint.as_slice())
            .map(Fingerprint::from_bytes)
            .map_err(|_| self.corrupt("has a fingerprint that is not 32 bytes"))?;
        let outcome: Option<Vec<u8>> = self.column(row, outcome_at, "has no readable outcome")?;
        let outcome = outcome
            .map(|json| record::decode_outcome(&json))
            .transpose()
            .map_err(|e| self.corrupt("holds an unreadable outcome").with_source(e))?;
        record::checked_record(state, fingerprint, outcome)
            .map_err(|e| self.corrupt("breaks the record rules").with_source(e))
    }

    /// What a reserve that took the row it `peeked` (the row of `RECORD_COLUMNS` at column 0)
    /// answers: a takeover when that row was pending past its lease, else a reservation.
    pub(super) fn taken(
        &self,
        row: &Row,
        peeked: &Peeked,
        token: Token,
    ) -> Result<Reservation, StoreError> {
        if peeked.state != "pending" || !peeked.expired {
            return Ok(Reservation::Reserved { token });
        }
        let mut previous = self.checked(row, RecordState::Pending, 2, 3)?;
        previous.first_attempt_age = self.first_attempt_age(row, 4)?;
        Ok(Reservation::TakenOver { token, previous })
    }

    /// A row of a batch's lock: key, state, token, whether expired.
    pub(super) fn locked(&self, row: &Row) -> Result<Locked, StoreError> {
        let expired: i64 = self.column(row, 3, "has no readable expiry")?;
        Ok(Locked {
            state: self.column(row, 1, "has no readable state")?,
            token: self.column(row, 2, "has no readable token")?,
            expired: expired != 0,
        })
    }

    /// The first attempt's age a statement computed in `column` (whole milliseconds; NULL
    /// when the row does not know it).
    fn first_attempt_age(&self, row: &Row, column: usize) -> Result<Option<Duration>, StoreError> {
        let ms: Option<i64> = self.column(row, column, "has no readable first attempt")?;
        Ok(ms.map(|ms| Duration::from_millis(ms.max(0).unsigned_abs())))
    }

    /// Where the key a batch statement returned in column 0 was asked, marking it answered.
    ///
    /// A key nobody asked for, or one returned twice, means the answer cannot be matched to
    /// the requests, so the whole call fails rather than guess.
    pub(super) fn position(
        &self,
        positions: &HashMap<&str, usize>,
        row: &Row,
        answered: &mut [bool],
    ) -> Result<usize, StoreError> {
        let mismatch = |detail: &str| {
            StoreError::new(
                StoreErrorKind::Unavailable,
                format!("a batch statement on table {:?} {detail}", self.table.name),
            )
        };
        let key: Vec<u8> = match row.get_opt(0) {
            Some(Ok(key)) => key,
            _ => return Err(mismatch("answered a row without a readable key")),
        };
        let at = std::str::from_utf8(&key)
            .ok()
            .and_then(|key| positions.get(key))
            .copied()
            .ok_or_else(|| mismatch("answered a key that was not asked for"))?;
        if std::mem::replace(&mut answered[at], true) {
            return Err(mismatch("answered a key twice"));
        }
        Ok(at)
    }
}

/// The position of each key of a batch call; refuses a key given twice, which one statement
/// could not answer for separately.
pub(super) fn positions<'k>(
    operation: &str,
    keys: impl Iterator<Item = &'k str>,
) -> Result<HashMap<&'k str, usize>, StoreError> {
    let mut positions = HashMap::new();
    for (at, key) in keys.enumerate() {
        if let Some(first) = positions.insert(key, at) {
            return Err(StoreError::new(
                StoreErrorKind::InvalidInput,
                format!(
                    "{operation} was given one key at positions {first} and {at}: \
                     the keys of one call must be distinct"
                ),
            ));
        }
    }
    Ok(positions)
}
