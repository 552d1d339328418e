//! Deleting expired rows: [`SqliteStore::purge_expired`], which the store's thread also runs
//! on its own while idle (see [`SqliteStoreBuilder::purge_every`](super::SqliteStoreBuilder::purge_every)).

use super::session::{Session, failure};
use super::{SqliteStore, sql};
use crate::store::StoreError;

impl SqliteStore {
    /// Deletes every expired row, in statements of at most
    /// [`purge_batch`](super::SqliteStoreBuilder::purge_batch) rows, each in a transaction
    /// of its own, until one finds fewer; answers how many rows went. Live rows are never
    /// touched. Each statement is bounded by the timeout.
    pub async fn purge_expired(&self) -> Result<u64, StoreError> {
        let batch = self.inner.purge_batch;
        let mut purged = 0;
        loop {
            let path = self.inner.path.clone();
            let deleted = self
                .call(move |session| purge(session, batch).map_err(|e| failure(&e, &path)))
                .await?;
            purged += deleted;
            if deleted < u64::from(batch) {
                return Ok(purged);
            }
        }
    }
}

/// One purge statement: deletes at most `batch` expired rows, answering how many it did.
fn purge(session: &mut Session<'_>, batch: u32) -> rusqlite::Result<u64> {
    let deleted = session.statement(sql::PURGE)?.execute([i64::from(batch)])?;
    Ok(u64::try_from(deleted).unwrap_or(u64::MAX))
}

/// Every expired row, one transaction per batch: the thread's own purge, outside any
/// transaction of the queue.
pub(super) fn purge_all(session: &mut Session<'_>, batch: u32) -> rusqlite::Result<u64> {
    let connection = session.connection();
    let mut purged = 0;
    loop {
        connection.execute_batch("BEGIN IMMEDIATE")?;
        let deleted = match purge(session, batch) {
            Ok(deleted) => deleted,
            Err(error) => {
                let _ = connection.execute_batch("ROLLBACK");
                return Err(error);
            }
        };
        connection.execute_batch("COMMIT")?;
        purged += deleted;
        if deleted < u64::from(batch) {
            return Ok(purged);
        }
    }
}
