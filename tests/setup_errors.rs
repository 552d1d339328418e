//! Errors of a store set up wrong: they name what is wrong (the address and the cause, the
//! path), and a configuration that no retry mends is `Misconfigured`, answered
//! `idempotency.store_misconfigured` and never retried.
#![cfg(all(feature = "redis", feature = "sqlite", feature = "postgres"))]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use support::stores::SqliteDir;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::{Category, Outcome, codes};
use tower_idempotency::store::{Reservation, Store, StoreError, StoreErrorKind, Token};
use tower_idempotency::{
    BoxError, IdempotencyLayer, Message, PostgresStore, Receipt, RedisStore, SqliteStore,
};

/// The whole chain of `error`'s messages, as a `main` that returns it prints them.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        text.push_str(&format!(": {e}"));
        next = e.source();
    }
    text
}

#[tokio::test]
async fn redis_connect_to_a_closed_port_is_unavailable_naming_the_address_and_the_refusal() {
    // A port the kernel just handed out and that nothing listens on any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    // Bounded well below the store's 2 s timeout: a refusal answers at once, and a
    // connect that waited out the timeout would fail this test.
    let url = format!("redis://127.0.0.1:{port}");
    let connect = RedisStore::connect(&url);
    let error = tokio::time::timeout(Duration::from_millis(1500), connect)
        .await
        .expect("a refused connect answers before the timeout")
        .expect_err("nothing listens there");
    assert_eq!(error.kind(), StoreErrorKind::Unavailable, "{error}");
    let text = chain(&error);
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.to_lowercase().contains("refused"), "{text}");
}

/// A loopback port the kernel just handed out and that nothing listens on any more.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

#[tokio::test]
async fn postgres_connect_to_a_closed_port_is_unavailable_naming_the_address_and_the_refusal() {
    let port = closed_port();
    let url = format!("postgres://postgres:s3cret@127.0.0.1:{port}/test");
    let error = tokio::time::timeout(Duration::from_millis(1500), PostgresStore::connect(&url))
        .await
        .expect("a refused connect answers before the timeout")
        .expect_err("nothing listens there");
    assert_eq!(error.kind(), StoreErrorKind::Unavailable, "{error}");
    let text = chain(&error);
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
}

#[tokio::test]
async fn postgres_connect_with_an_invalid_url_is_misconfigured() {
    let error = PostgresStore::connect("postgres://127.0.0.1:notaport/test")
        .await
        .expect_err("not a PostgreSQL URL");
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_connect_with_an_invalid_url_is_misconfigured() {
    let error = tower_idempotency::MySqlStore::connect("mysql://127.0.0.1:notaport/test")
        .await
        .expect_err("not a MySQL URL");
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
}

#[tokio::test]
async fn redis_connect_with_an_invalid_url_is_misconfigured_and_hides_the_password() {
    let error = RedisStore::connect("http://user:s3cret@127.0.0.1:6379")
        .await
        .expect_err("not a Redis URL");
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
    let text = chain(&error);
    assert!(text.contains("Redis URL"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
}

#[cfg(feature = "redis-sentinel")]
#[tokio::test]
async fn redis_sentinel_with_an_invalid_url_is_misconfigured_and_hides_the_password() {
    let error = RedisStore::connect_sentinel(["http://user:s3cret@127.0.0.1:26379"], "primary")
        .await
        .expect_err("not a Redis URL");
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
    let text = chain(&error);
    assert!(text.contains("Sentinel address"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
}

#[cfg(feature = "redis-sentinel")]
#[tokio::test]
async fn redis_sentinel_at_a_closed_port_is_unavailable_naming_the_primary() {
    let url = format!("redis://127.0.0.1:{}", closed_port());
    let connect = RedisStore::connect_sentinel([url.as_str()], "billing-primary");
    let error = tokio::time::timeout(Duration::from_millis(1500), connect)
        .await
        .expect("a refused connect answers before the timeout")
        .expect_err("no sentinel listens there");
    assert_eq!(error.kind(), StoreErrorKind::Unavailable, "{error}");
    let text = chain(&error);
    assert!(text.contains("billing-primary"), "{text}");
    assert!(text.to_lowercase().contains("refused"), "{text}");
}

#[tokio::test]
async fn sqlite_path_that_is_a_directory_is_misconfigured() {
    let dir = SqliteDir::new("directory");
    let error = SqliteStore::open(&dir.0).await.expect_err("a directory");
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
    let text = chain(&error);
    assert!(text.contains("is a directory"), "{text}");
    assert!(text.contains(&dir.0.display().to_string()), "{text}");
}

#[tokio::test]
async fn sqlite_file_that_is_not_a_database_is_misconfigured() {
    let dir = SqliteDir::new("not-a-database");
    let file = dir.file();
    std::fs::write(
        &file,
        "these are the notes of an operator, not a database\n".repeat(100),
    )
    .unwrap();
    let error = SqliteStore::open(&file).await.expect_err("not a database");
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
    let text = chain(&error);
    assert!(text.contains("is not a database"), "{text}");
    assert!(text.contains(&file.display().to_string()), "{text}");
}

#[tokio::test]
async fn sqlite_file_in_a_missing_directory_is_misconfigured() {
    let dir = SqliteDir::new("missing-parent");
    let file = dir.0.join("no-such-directory").join("keys.sqlite3");
    let error = SqliteStore::open(&file)
        .await
        .expect_err("no such directory");
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
}

/// A store whose every reserve fails as set up wrong, as a store whose file was replaced by
/// something else would; counts its reserves.
#[derive(Clone, Default)]
struct SetUpWrong {
    reserves: Arc<AtomicUsize>,
}

impl Store for SetUpWrong {
    fn reserve<'a>(
        &'a self,
        _key: &'a str,
        _fingerprint: Fingerprint,
        _lease: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        self.reserves.fetch_add(1, Ordering::SeqCst);
        async {
            Err(StoreError::misconfigured(
                "the store's file is not a database",
            ))
        }
        .boxed()
    }

    fn complete<'a>(
        &'a self,
        _key: &'a str,
        _token: Token,
        _fingerprint: Fingerprint,
        _outcome: &'a Outcome,
        _ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        async {
            Err(StoreError::misconfigured(
                "the store's file is not a database",
            ))
        }
        .boxed()
    }

    fn release<'a>(
        &'a self,
        _key: &'a str,
        _token: Token,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        async {
            Err(StoreError::misconfigured(
                "the store's file is not a database",
            ))
        }
        .boxed()
    }
}

#[tokio::test]
async fn a_reserve_on_a_misconfigured_store_is_answered_permanent_and_nothing_is_sent() {
    let store = SetUpWrong::default();
    let sends = Arc::new(AtomicUsize::new(0));
    let provider = {
        let sends = Arc::clone(&sends);
        tower::service_fn(move |_m: Message| {
            sends.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, BoxError>(Receipt::new("msg", "fake")) }
        })
    };
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .build()
        .unwrap();
    let mut service = ServiceBuilder::new().layer(layer).service(provider);
    let message = Message::builder()
        .from("shop@example.com")
        .to("user@example.com")
        .text("Welcome aboard.")
        .idempotency_key("welcome:user-42")
        .build()
        .unwrap();
    let error = service
        .ready()
        .await
        .unwrap()
        .call(message)
        .await
        .expect_err("the store cannot reserve");
    assert_eq!(error.code(), codes::STORE_MISCONFIGURED);
    assert_eq!(error.category(), Category::Permanent);
    assert!(!error.is_retryable(), "no retry mends a configuration");
    assert!(chain(&error).contains("not a database"), "{error}");
    assert_eq!(sends.load(Ordering::SeqCst), 0, "nothing was sent");
    assert_eq!(store.reserves.load(Ordering::SeqCst), 1);
}
