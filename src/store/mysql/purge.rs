//! Deleting expired rows: [`MySqlStore::purge_expired`], and the background [`PurgeTask`]
//! that [`MySqlStore::spawn_purge`] runs it in.

use std::time::Duration;

use super::MySqlStore;
use crate::store::StoreError;
use crate::store::sql::{self, SqlPurge};

impl MySqlStore {
    /// Deletes every expired row, in statements of at most
    /// [`purge_batch`](Self::purge_batch) rows (oldest first), until a statement finds fewer;
    /// answers how many rows went. Live rows are never touched: each row's expiry is checked
    /// as it is deleted. Each statement is bounded by the operation timeout.
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

impl SqlPurge for MySqlStore {
    fn purge_rows(&self) -> u32 {
        self.purge_batch
    }

    fn table_name(&self) -> &str {
        &self.table.name
    }

    async fn purge_once(&self) -> Result<u64, StoreError> {
        let mut conn = self.conn().await?;
        self.write(
            &mut conn,
            &self.table.sql.purge,
            vec![self.purge_batch.into()],
        )
        .await
    }
}

/// The background purge started by [`MySqlStore::spawn_purge`]; dropping it stops the task.
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
