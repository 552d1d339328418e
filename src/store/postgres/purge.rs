//! Deleting expired rows: [`PostgresStore::purge_expired`], and the background
//! [`PurgeTask`] that [`PostgresStore::spawn_purge`] runs it in.

use std::time::Duration;

use super::PostgresStore;
use crate::store::StoreError;
use crate::store::sql::{self, SqlPurge};

impl PostgresStore {
    /// Deletes every expired row, in statements of at most
    /// [`purge_batch`](Self::purge_batch) rows, until a statement finds fewer; answers how
    /// many rows went. Live rows are never touched. Each statement is bounded by the
    /// operation timeout.
    pub async fn purge_expired(&self) -> Result<u64, StoreError> {
        sql::purge_expired(self).await
    }

    /// Runs [`purge_expired`](Self::purge_expired) now and then every `every` (at least
    /// 1 ms) on the current Tokio runtime, until the returned [`PurgeTask`] is dropped or
    /// aborted. A failed purge is logged with `tracing::warn!` and tried again next time.
    ///
    /// Fails when called outside a Tokio runtime.
    pub fn spawn_purge(&self, every: Duration) -> Result<PurgeTask, StoreError> {
        sql::spawn_purge(self, every).map(|handle| PurgeTask { handle })
    }
}

impl SqlPurge for PostgresStore {
    fn purge_rows(&self) -> u32 {
        self.purge_batch
    }

    fn table_name(&self) -> &str {
        &self.table.name
    }

    async fn purge_once(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.table.sql.purge)
            .await
            .map_err(|e| self.db_error(e))?;
        client
            .execute(&statement, &[&i64::from(self.purge_batch)])
            .await
            .map_err(|e| self.db_error(e))
    }
}

/// The background purge started by [`PostgresStore::spawn_purge`]; dropping it stops the
/// task.
#[derive(Debug)]
pub struct PurgeTask {
    handle: tokio::task::JoinHandle<()>,
}

impl PurgeTask {
    /// Stops the task (as dropping the handle does).
    pub fn abort(&self) {
        self.handle.abort();
    }

    /// Whether the task has stopped.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

impl Drop for PurgeTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}
