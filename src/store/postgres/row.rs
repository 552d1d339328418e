//! Row mapping: what the rows a statement returned say, as records and reservations, and
//! the matching of a batch statement's rows to the keys asked.

use std::collections::HashMap;
use std::time::Duration;

use tokio_postgres::Row;
use uuid::Uuid;

use super::PostgresStore;
use crate::fingerprint::Fingerprint;
use crate::store::{Record, RecordState, Reservation, StoreError, StoreErrorKind, Token, record};

impl PostgresStore {
    pub(super) fn corrupt(&self, what: &str) -> StoreError {
        StoreError::corrupt(format!("a row of table {:?} {what}", self.table.name))
    }

    /// Decodes a row of (state, token, fingerprint, outcome text).
    pub(super) fn record(&self, row: &Row) -> Result<Record, StoreError> {
        let state: &str = row
            .try_get(0)
            .map_err(|e| self.corrupt("has no readable state").with_source(e))?;
        let state = match state {
            // A claim not yet taken holds the key like a send under way.
            "pending" | "claimed" => RecordState::Pending,
            "done" => RecordState::Done,
            _ => return Err(self.corrupt("has an unknown state")),
        };
        self.checked(row, state, 2, 3)
    }

    /// The record of a row in `state` whose fingerprint and outcome text are in the columns
    /// `fingerprint_at` and `outcome_at`, held to the record rules of the stored form, so
    /// this store answers as every other does, whichever statement read the row.
    pub(super) fn checked(
        &self,
        row: &Row,
        state: RecordState,
        fingerprint_at: usize,
        outcome_at: usize,
    ) -> Result<Record, StoreError> {
        let fingerprint: &[u8] = row
            .try_get(fingerprint_at)
            .map_err(|e| self.corrupt("has no readable fingerprint").with_source(e))?;
        let fingerprint = <[u8; 32]>::try_from(fingerprint)
            .map(Fingerprint::from_bytes)
            .map_err(|_| self.corrupt("has a fingerprint that is not 32 bytes"))?;
        let outcome: Option<&str> = row
            .try_get(outcome_at)
            .map_err(|e| self.corrupt("has no readable outcome").with_source(e))?;
        let outcome = outcome
            .map(|json| record::decode_outcome(json.as_bytes()))
            .transpose()
            .map_err(|e| self.corrupt("holds an unreadable outcome").with_source(e))?;
        record::checked_record(state, fingerprint, outcome)
            .map_err(|e| self.corrupt("breaks the record rules").with_source(e))
    }

    /// What a reserve found, from the row it returned: ours when it holds our `token`.
    pub(super) fn reservation(&self, row: &Row, token: Token) -> Result<Reservation, StoreError> {
        let holder: Uuid = row
            .try_get(1)
            .map_err(|e| self.corrupt("has no readable token").with_source(e))?;
        if holder == Uuid::from(token) {
            return Ok(Reservation::Reserved { token });
        }
        self.record(row).map(|record| Reservation::Held { record })
    }

    /// What a single reserve found, from the row it returned with the row its snapshot saw
    /// (columns 5 to 9): ours, taken over from a pending row whose lease had passed, or the
    /// live record that holds the key, each with its first attempt's age (column 4).
    pub(super) fn reported_reservation(
        &self,
        row: &Row,
        token: Token,
    ) -> Result<Reservation, StoreError> {
        let age = |column| self.first_attempt_age(row, column);
        match self.reservation(row, token)? {
            Reservation::Held { mut record } => {
                record.first_attempt_age = age(4)?;
                Ok(Reservation::Held { record })
            }
            reserved => {
                let old_state: Option<&str> = row
                    .try_get(5)
                    .map_err(|e| self.corrupt("has no readable state").with_source(e))?;
                let old_expired: Option<bool> = row
                    .try_get(8)
                    .map_err(|e| self.corrupt("has no readable expiry").with_source(e))?;
                if old_state != Some("pending") || old_expired != Some(true) {
                    return Ok(reserved);
                }
                let mut previous = self.checked(row, RecordState::Pending, 6, 7)?;
                previous.first_attempt_age = age(9)?;
                Ok(Reservation::TakenOver { token, previous })
            }
        }
    }

    /// The record of a row read by `peek` when a live send or a kept outcome holds the key
    /// against a reserve of `fingerprint`; `None` when the reserve would take it (it expired,
    /// or it is a claim of that message).
    pub(super) fn held(&self, row: &Row, fingerprint: &[u8]) -> Result<Option<Record>, StoreError> {
        let state: &str = row
            .try_get(0)
            .map_err(|e| self.corrupt("has no readable state").with_source(e))?;
        let stored: &[u8] = row
            .try_get(2)
            .map_err(|e| self.corrupt("has no readable fingerprint").with_source(e))?;
        let expired: bool = row
            .try_get(5)
            .map_err(|e| self.corrupt("has no readable expiry").with_source(e))?;
        if expired || (state == "claimed" && stored == fingerprint) {
            return Ok(None);
        }
        let mut record = self.record(row)?;
        record.first_attempt_age = self.first_attempt_age(row, 4)?;
        Ok(Some(record))
    }

    /// The first attempt's age a statement computed in `column` (whole milliseconds; NULL
    /// when the row does not know it).
    fn first_attempt_age(&self, row: &Row, column: usize) -> Result<Option<Duration>, StoreError> {
        let ms: Option<i64> = row
            .try_get(column)
            .map_err(|e| self.corrupt("has no readable first attempt").with_source(e))?;
        Ok(ms.map(|ms| Duration::from_millis(ms.max(0).unsigned_abs())))
    }

    /// Where the key a batch statement returned in `column` was asked, marking it answered.
    ///
    /// A key nobody asked for, or one returned twice, means the answer cannot be matched to
    /// the requests, so the whole call fails rather than guess.
    pub(super) fn position(
        &self,
        positions: &HashMap<&str, usize>,
        row: &Row,
        column: usize,
        answered: &mut [bool],
    ) -> Result<usize, StoreError> {
        let mismatch = |detail: &str| {
            StoreError::new(
                StoreErrorKind::Unavailable,
                format!("a batch statement on table {:?} {detail}", self.table.name),
            )
        };
        let key: &str = row
            .try_get(column)
            .map_err(|e| mismatch("answered a row without a readable key").with_source(e))?;
        let at = *positions
            .get(key)
            .ok_or_else(|| mismatch("answered a key that was not asked for"))?;
        if std::mem::replace(&mut answered[at], true) {
            return Err(mismatch("answered a key twice"));
        }
        Ok(at)
    }
}

/// The position of each key of a batch call; refuses a key given twice, which one statement
/// could not answer for separately (and PostgreSQL would refuse to upsert twice).
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
