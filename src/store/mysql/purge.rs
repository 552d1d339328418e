//! Deleting expired rows: [`MySqlStore::purge_expired`], and the background [`PurgeTask`]
//! that [`MySqlStore::spawn_purge`] runs it in.

use std::time::Duration;

use super::MySqlStore;
use crate::store::sql::SqlOperations;
use crate::store::{StoreError, StoreErrorKind};

impl MySqlStore {
    /// Deletes every expired row, in statements of at most
    /// [`purge_batch`](Self::purge_batch) rows (oldest first), until a statement finds fewer;
    /// answers how many rows went. Live rows are never touched: each row's expiry is checked
    /// as it is deleted. Each statement is bounded by the operation timeout.
    pub async fn purge_expired(&self) -> Result<u64, StoreError> {
        let batch = u64::from(self.purge_batch);
        let mut purged = 0;
        loop {
            let deleted = self
                .bounded(|| async {
                    let mut conn = self.conn().await?;
                    self.write(
                        &mut conn,
                        &self.table.sql.purge,
                        vec![self.purge_batch.into()],
                    )
                    .await
                })
                .await?;
            purged += deleted;
            if deleted < batch {
                return Ok(purged);
            }
        }
    }

    /// Runs [`purge_expired`](Self::purge_expired) now and then every `every` (at least
    /// 1 ms) on the current Tokio runtime, until the returned [`PurgeTask`] is dropped or
    /// aborted. A failed purge is logged with `tracing::warn!` and tried again next time.
    ///
    /// Fails when called outside a Tokio runtime.
    pub fn spawn_purge(&self, every: Duration) -> Result<PurgeTask, StoreError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            StoreError::new(
                StoreErrorKind::Unavailable,
                "spawn_purge must be called within a Tokio runtime",
            )
            .with_source(e)
        })?;
        let store = self.clone();
        let every = every.max(Duration::from_millis(1));
        let handle = runtime.spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                match store.purge_expired().await {
                    Ok(0) => {}
                    Ok(purged) => tracing::debug!(
                        table = %store.table.name,
                        purged,
                        "purged expired idempotency keys"
                    ),
                    Err(error) => tracing::warn!(
                        table = %store.table.name,
                        error = %error,
                        "purging expired idempotency keys failed"
                    ),
                }
            }
        });
        Ok(PurgeTask { handle })
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
