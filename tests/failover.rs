//! What a PostgreSQL failover keeps and loses, on a primary and a standby of the test's own
//! (`support::servers::PrimaryAndStandby`): with asynchronous replication (PostgreSQL's
//! default) a reservation the standby never received is gone after a promotion, and a repeat
//! sends again; with a synchronous standby the reservation's commit waits for the standby, so
//! a reservation it cannot get is a store failure, nothing is sent, and after the failover the
//! message goes once. `PostgresStore`'s docs ("Failover") say the same.
#![cfg(feature = "postgres")]

mod support;

use std::time::Duration;

use support::servers::PrimaryAndStandby;
use support::stores::unique;
use support::{Provider, message, send};
use tower::ServiceBuilder;
use tower_idempotency::{IdempotencyLayer, PostgresStore};

/// Bounds each store operation, so a commit waiting for a standby that is gone fails soon.
const STORE_TIMEOUT: Duration = Duration::from_millis(500);

async fn store(url: &str, table: &str) -> PostgresStore {
    let store = PostgresStore::connect(url)
        .await
        .expect("connect")
        .table(table)
        .expect("a valid table name")
        .timeout(STORE_TIMEOUT);
    store.migrate().await.expect("migrate");
    store
}

/// Sends the alert of `key` through a layer over `store` to `provider`; answers the error
/// code, if any.
async fn send_alert(store: PostgresStore, provider: &Provider, key: &str) -> Option<String> {
    let layer = IdempotencyLayer::builder()
        .store(store)
        .namespace("failover")
        .build()
        .expect("valid layer");
    let mut service = ServiceBuilder::new().layer(layer).service(provider.clone());
    send(
        &mut service,
        message(Some(key), "Vintage Nikon FM2 just sold."),
    )
    .await
    .err()
    .map(|e| e.code().to_owned())
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres_binaries),
    ignore = "no PostgreSQL server binaries"
)]
async fn an_asynchronous_standby_promoted_after_a_cut_has_lost_the_reservation() {
    let Some(servers) = PrimaryAndStandby::start(false) else {
        return;
    };
    let table = unique("failover");
    let primary = store(&servers.primary_url(), &table).await;
    servers.caught_up().await;
    servers.cut().await;

    let provider = Provider::ok();
    let key = unique("alert");
    assert_eq!(send_alert(primary, &provider, &key).await, None);
    assert_eq!(provider.calls(), 1);

    // The primary is lost; the standby, which never got the reservation, takes over.
    servers.promote().await;
    let promoted = store(&servers.standby_url(), &table).await;
    assert_eq!(send_alert(promoted, &provider, &key).await, None);
    assert_eq!(
        provider.calls(),
        2,
        "the promoted standby had no record of the key, so the repeat sent again"
    );
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres_binaries),
    ignore = "no PostgreSQL server binaries"
)]
async fn with_a_synchronous_standby_a_failover_sends_each_message_once() {
    let Some(servers) = PrimaryAndStandby::start(true) else {
        return;
    };
    let table = unique("failover");
    let primary = store(&servers.primary_url(), &table).await;
    let provider = Provider::ok();

    // Sent while the standby follows: its commit waited for the standby, which keeps it.
    let sent_before = unique("alert");
    assert_eq!(
        send_alert(primary.clone(), &provider, &sent_before).await,
        None
    );
    assert_eq!(provider.calls(), 1);

    servers.cut().await;
    // No standby confirms the reservation's commit: the reserve fails, nothing is sent.
    let key = unique("alert");
    assert_eq!(
        send_alert(primary, &provider, &key).await.as_deref(),
        Some("idempotency.store_failed")
    );
    assert_eq!(provider.calls(), 1);

    servers.promote().await;
    let promoted = store(&servers.standby_url(), &table).await;
    // The standby has the first send's record: its repeat replays.
    assert_eq!(
        send_alert(promoted.clone(), &provider, &sent_before).await,
        None
    );
    assert_eq!(
        provider.calls(),
        1,
        "the replicated record answered the repeat"
    );
    // The message whose reserve failed goes now, once.
    assert_eq!(send_alert(promoted, &provider, &key).await, None);
    assert_eq!(provider.calls(), 2);
}
