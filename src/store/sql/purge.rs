//! The purge the SQL stores share: [`purge_expired`]'s loop of bounded statements, and the
//! background task of [`spawn_purge`], over each backend's [`SqlPurge`] statement.

use std::future::Future;
use std::time::Duration;

use super::SqlOperations;
use crate::store::{StoreError, StoreErrorKind};

/// One SQL backend's purge statement; [`purge_expired`] and [`spawn_purge`] run it.
pub(crate) trait SqlPurge: SqlOperations {
    /// The most rows one purge statement deletes.
    fn purge_rows(&self) -> u32;

    /// The table's name, for the background purge's logs.
    fn table_name(&self) -> &str;

    /// Deletes at most [`purge_rows`](Self::purge_rows) expired rows, answering how many went.
    fn purge_once(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// A SQL store's `purge_expired`: purge statements, each bounded by the operation timeout,
/// until one finds fewer rows than it may delete.
pub(crate) async fn purge_expired<S: SqlPurge>(store: &S) -> Result<u64, StoreError> {
    let batch = u64::from(store.purge_rows());
    let mut purged = 0;
    loop {
        let deleted = store.bounded(|| store.purge_once()).await?;
        purged += deleted;
        if deleted < batch {
            return Ok(purged);
        }
    }
}

/// A SQL store's `spawn_purge`: [`purge_expired`] now and then every `every` (at least 1 ms)
/// on the current Tokio runtime, a failure logged and tried again next time.
pub(crate) fn spawn_purge<S: SqlPurge>(
    store: &S,
    every: Duration,
) -> Result<tokio::task::JoinHandle<()>, StoreError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
        StoreError::new(
            StoreErrorKind::Unavailable,
            "spawn_purge must be called within a Tokio runtime",
        )
        .with_source(e)
    })?;
    let store = store.clone();
    let every = every.max(Duration::from_millis(1));
    Ok(runtime.spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match purge_expired(&store).await {
                Ok(0) => {}
                Ok(purged) => tracing::debug!(
                    table = %store.table_name(),
                    purged,
                    "purged expired idempotency keys"
                ),
                Err(error) => tracing::warn!(
                    table = %store.table_name(),
                    error = %error,
                    "purging expired idempotency keys failed"
                ),
            }
        }
    }))
}
