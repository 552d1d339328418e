//! Keys that hold no personal data: with `KeyForm::Hashed` the layer stores
//! `namespace:h1:<hex of SHA-256(namespace:key)>`, in every store operation it does, and the
//! contract holds as with raw keys. The form is stored data: pinned here by golden values.
//!
//! The backend tests run against `REDIS_URL` / `DATABASE_URL` or the default local servers;
//! each is reported as ignored when its server did not answer as the suite was built (see
//! `support::stores`).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use support::{BatchProvider, Provider, capture, message};
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_idempotency::batch::Batch;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::layer::{ConfigError, KeyForm, StoredKeys};
use tower_idempotency::message::{KeyError, MAX_KEY_LEN};
use tower_idempotency::outcome::{Outcome, codes};
use tower_idempotency::store::{Reservation, Store, StoreError, Token};
use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message, Receipt, SendError};

/// A key such as the source documents use: it ends in the recipient's address.
const KEY: &str = "order.created:ord_1:email:seller@example.com";
const ADDRESS: &str = "seller@example.com";

/// `printf '%s' 'alerts:order.created:ord_1:email:seller@example.com' | sha256sum`
const ALERTS_KEY_HASHED: &str =
    "alerts:h1:3fe27542fc36623d90c18721d253bc1d2c85db29c0947b0d9bb39d1cf8c18b5e";
/// `printf '%s' 'billing:order.created:ord_1:email:seller@example.com' | sha256sum`
const BILLING_KEY_HASHED: &str =
    "billing:h1:356c2bfbe77a05bba0c1fbe5e4989ee66d620bcccc4bea6d55885aa33cce38f8";

fn hashed_layer(store: impl Store) -> IdempotencyLayer {
    IdempotencyLayer::builder()
        .store(store)
        .namespace("alerts")
        .key_form(KeyForm::Hashed)
        .build()
        .expect("valid layer")
}

/// Whether `stored` is the hashed form under `namespace`: the namespace, `h1`, 64 lowercase
/// hex digits.
fn is_hashed_form(stored: &str, namespace: &str) -> bool {
    stored
        .strip_prefix(namespace)
        .and_then(|rest| rest.strip_prefix(":h1:"))
        .is_some_and(|hex| {
            hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

// ---- The form ------------------------------------------------------------------------------

#[test]
fn the_hashed_form_is_pinned() {
    let hashed = StoredKeys::new("alerts", KeyForm::Hashed).unwrap();
    assert_eq!(hashed.of(KEY).unwrap(), ALERTS_KEY_HASHED);
    assert_eq!(
        StoredKeys::new("default", KeyForm::Hashed)
            .unwrap()
            .of("k")
            .unwrap(),
        "default:h1:bce3b2e08325b227a99ae8e9127395773782eb146143fe39fd95e594dc614b1e"
    );
    assert_eq!(hashed.prefix(), "alerts:h1:");
    assert_eq!(hashed.namespace(), "alerts");
    assert_eq!(hashed.form(), KeyForm::Hashed);

    let raw = StoredKeys::new("alerts", KeyForm::Raw).unwrap();
    assert_eq!(raw.of(KEY).unwrap(), format!("alerts:{KEY}"));
    assert_eq!(raw.prefix(), "alerts:");
}

#[test]
fn two_namespaces_hash_the_same_key_differently() {
    let billing = StoredKeys::new("billing", KeyForm::Hashed).unwrap();
    assert_eq!(billing.of(KEY).unwrap(), BILLING_KEY_HASHED);
    assert_ne!(
        billing.of(KEY).unwrap()["billing:h1:".len()..],
        ALERTS_KEY_HASHED["alerts:h1:".len()..]
    );
}

#[test]
fn every_hashed_key_of_a_namespace_has_the_same_length_and_no_trace_of_the_key() {
    let hashed = StoredKeys::new("alerts", KeyForm::Hashed).unwrap();
    for key in ["k", KEY, &"é".repeat(MAX_KEY_LEN / 2), "h1:x"] {
        let stored = hashed.of(key).unwrap();
        assert!(is_hashed_form(&stored, "alerts"), "{stored}");
        assert_eq!(stored.len(), "alerts:h1:".len() + 64);
        assert!(stored.is_ascii());
        assert!(!stored.contains("example"), "{stored}");
    }
}

#[test]
fn hashing_keeps_the_one_key_rule() {
    let hashed = StoredKeys::new("alerts", KeyForm::Hashed).unwrap();
    assert_eq!(hashed.of(""), Err(KeyError::Empty));
    assert!(matches!(
        hashed.of(&"k".repeat(MAX_KEY_LEN + 1)),
        Err(KeyError::TooLong { .. })
    ));
    assert!(matches!(
        hashed.of("a\nb"),
        Err(KeyError::ControlCharacter { position: 1 })
    ));
    assert!(hashed.of(&"k".repeat(MAX_KEY_LEN)).is_ok());
    assert!(matches!(
        StoredKeys::new("al:erts", KeyForm::Hashed),
        Err(ConfigError::InvalidNamespace(_))
    ));
    assert!(StoredKeys::new("", KeyForm::Raw).is_err());
}

#[test]
fn the_layer_tells_the_stored_key_of_a_request_and_of_a_raw_key() {
    let layer = hashed_layer(MemoryStore::new());
    assert_eq!(layer.key_form(), KeyForm::Hashed);
    assert_eq!(layer.stored_key_for(KEY).unwrap(), ALERTS_KEY_HASHED);
    assert_eq!(layer.stored_keys().of(KEY).unwrap(), ALERTS_KEY_HASHED);
    let stored = layer.store_key(&message(Some(KEY), "sold")).unwrap();
    assert_eq!(stored.as_deref(), Some(ALERTS_KEY_HASHED));
    assert_eq!(layer.store_key(&message(None, "sold")).unwrap(), None);

    // A key function's key is the one hashed.
    let by_subject = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .namespace("alerts")
        .key_form(KeyForm::Hashed)
        .key(|_| Some(KEY.to_owned()))
        .build()
        .unwrap();
    let stored = by_subject
        .store_key(&message(Some("other"), "sold"))
        .unwrap();
    assert_eq!(stored.as_deref(), Some(ALERTS_KEY_HASHED));
    let claim = by_subject
        .claim(&message(Some("other"), "sold"))
        .unwrap()
        .expect("keyed");
    assert_eq!(claim.key, ALERTS_KEY_HASHED);

    // The default stays raw.
    let raw = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .namespace("alerts")
        .build()
        .unwrap();
    assert_eq!(raw.key_form(), KeyForm::Raw);
    assert_eq!(raw.stored_key_for(KEY).unwrap(), format!("alerts:{KEY}"));
}

#[tokio::test]
async fn a_key_the_rules_refuse_is_refused_in_the_hashed_form_too() {
    let provider = Provider::ok();
    // A message's own key is checked when it is built; a key function's, by the layer.
    let layer = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .namespace("alerts")
        .key_form(KeyForm::Hashed)
        .key(|_| Some("k".repeat(MAX_KEY_LEN + 1)))
        .build()
        .unwrap();
    let request = message(Some(KEY), "sold");
    assert_eq!(
        layer.store_key(&request).unwrap_err().code(),
        codes::INVALID_KEY
    );
    let err = layer
        .layer(provider.clone())
        .oneshot(request)
        .await
        .unwrap_err();
    assert_eq!(err.code(), codes::INVALID_KEY);
    assert_eq!(provider.calls(), 0);
}

// ---- Every store operation, in memory --------------------------------------------------------

/// A memory store that records every key it is asked about, by every operation. The batch
/// operations are the trait's defaults, which call the single ones.
#[derive(Clone, Default)]
struct Recording {
    inner: MemoryStore,
    keys: Arc<Mutex<Vec<(&'static str, String)>>>,
}

impl Recording {
    fn record(&self, op: &'static str, key: &str) {
        self.keys.lock().unwrap().push((op, key.to_owned()));
    }

    fn seen(&self) -> Vec<(&'static str, String)> {
        self.keys.lock().unwrap().clone()
    }

    fn ops(&self) -> Vec<&'static str> {
        self.seen().into_iter().map(|(op, _)| op).collect()
    }

    /// Fails the test if any key the store saw is not in the hashed form, or holds the key.
    fn assert_only_hashed_keys(&self) {
        let seen = self.seen();
        assert!(!seen.is_empty());
        for (op, key) in seen {
            assert!(is_hashed_form(&key, "alerts"), "{op} saw {key:?}");
            assert!(
                !key.contains(ADDRESS) && !key.contains("ord_"),
                "{op}: {key}"
            );
        }
    }
}

impl Store for Recording {
    fn reserve<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        self.record("reserve", key);
        self.inner.reserve(key, fingerprint, lease)
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.record("complete", key);
        self.inner.complete(key, token, fingerprint, outcome, ttl)
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.record("release", key);
        self.inner.release(key, token)
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.record("extend", key);
        self.inner.extend(key, token, lease)
    }
}

#[tokio::test]
async fn a_repeat_is_replayed_and_another_message_under_the_key_is_refused() {
    let store = Recording::default();
    let provider = Provider::ok();
    let svc = hashed_layer(store.clone()).layer(provider.clone());

    let first = svc
        .clone()
        .oneshot(message(Some(KEY), "sold"))
        .await
        .unwrap();
    let again = svc
        .clone()
        .oneshot(message(Some(KEY), "sold"))
        .await
        .unwrap();
    assert_eq!(again.id, first.id);
    assert!(again.replayed);
    let other = svc
        .clone()
        .oneshot(message(Some(KEY), "another text"))
        .await
        .unwrap_err();
    assert_eq!(other.code(), codes::KEY_REUSED);
    assert_eq!(provider.calls(), 1);
    assert_eq!(store.ops(), ["reserve", "complete", "reserve", "reserve"]);
    store.assert_only_hashed_keys();
    assert!(store.seen().iter().all(|(_, k)| k == ALERTS_KEY_HASHED));
}

#[tokio::test]
async fn a_key_freed_after_a_send_that_did_not_go_is_freed_under_its_hashed_form() {
    let store = Recording::default();
    let provider = Provider::answering(|n, _| async move {
        if n == 1 {
            Err(BoxError::from(SendError::permanent(
                "provider.rejected",
                "bad sender",
            )))
        } else {
            Ok(Receipt::new("msg-2", "fake"))
        }
    });
    let svc = hashed_layer(store.clone()).layer(provider.clone());
    let refused = svc.clone().oneshot(message(Some(KEY), "sold")).await;
    assert!(refused.is_err());
    // The key was freed: the next attempt sends.
    let sent = svc
        .clone()
        .oneshot(message(Some(KEY), "sold"))
        .await
        .unwrap();
    assert_eq!(sent.id, "msg-2");
    assert_eq!(provider.calls(), 2);
    assert_eq!(store.ops(), ["reserve", "release", "reserve", "complete"]);
    store.assert_only_hashed_keys();
}

#[tokio::test(start_paused = true)]
async fn a_slow_send_renews_and_a_waiting_repeat_polls_under_the_hashed_key() {
    let store = Recording::default();
    let provider = Provider::answering(|n, _| async move {
        tokio::time::sleep(Duration::from_secs(90)).await;
        Ok(Receipt::new(format!("msg-{n}"), "fake"))
    });
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("alerts")
        .key_form(KeyForm::Hashed)
        .lease(Duration::from_secs(60))
        .wait_for_in_flight(Duration::from_secs(120))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service(provider.clone());

    let first = tokio::spawn(svc.clone().oneshot(message(Some(KEY), "sold")));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let repeat = svc
        .clone()
        .oneshot(message(Some(KEY), "sold"))
        .await
        .unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(repeat.id, first.id);
    assert!(repeat.replayed);
    assert_eq!(provider.calls(), 1);
    let ops = store.ops();
    assert!(ops.contains(&"extend"), "{ops:?}");
    assert!(
        ops.iter().filter(|op| **op == "reserve").count() > 2,
        "{ops:?}"
    );
    store.assert_only_hashed_keys();
}

#[tokio::test]
async fn logs_carry_the_hash_of_the_stored_key_and_never_the_key() {
    let (captured, _guard) = capture();
    let svc = hashed_layer(MemoryStore::new()).layer(Provider::ok());
    svc.clone()
        .oneshot(message(Some(KEY), "sold"))
        .await
        .unwrap();
    svc.clone()
        .oneshot(message(Some(KEY), "sold"))
        .await
        .unwrap();
    let _ = svc.clone().oneshot(message(Some(KEY), "other")).await;
    let lines = captured.lines();
    assert!(
        lines.iter().any(|l| l.contains("key_hash")),
        "no event with a key_hash: {lines:?}"
    );
    for line in &lines {
        assert!(!line.contains(ADDRESS) && !line.contains("ord_1"), "{line}");
        assert!(
            !line.contains(&ALERTS_KEY_HASHED["alerts:h1:".len()..]),
            "{line}"
        );
    }
}

// ---- Batches ---------------------------------------------------------------------------------

fn keyed(n: usize) -> Message {
    message(
        Some(&format!("order.created:ord_{n}:email:{ADDRESS}")),
        &format!("m{n}"),
    )
}

#[tokio::test]
async fn a_batch_reserves_and_keeps_hashed_keys_and_replays_in_place() {
    let store = Recording::default();
    let provider = BatchProvider::ok();
    let layer = hashed_layer(store.clone());
    let svc = layer.layer(provider.clone());

    let first = svc
        .clone()
        .oneshot(Batch::from(vec![keyed(1), keyed(2), keyed(1)]))
        .await
        .unwrap();
    assert_eq!(first.len(), 3);
    assert_eq!(first[0].as_ref().unwrap().id, "id-m1");
    assert_eq!(first[1].as_ref().unwrap().id, "id-m2");
    // The repeat within the batch is answered in place.
    let repeat = first[2].as_ref().unwrap();
    assert_eq!(repeat.id, "id-m1");
    assert!(repeat.replayed);

    let again = svc
        .clone()
        .oneshot(Batch::from(vec![keyed(2), keyed(3)]))
        .await
        .unwrap();
    let replay = again[0].as_ref().unwrap();
    assert_eq!(replay.id, "id-m2");
    assert!(replay.replayed);
    assert_eq!(again[1].as_ref().unwrap().id, "id-m3");
    assert_eq!(
        provider.batches().iter().map(Vec::len).collect::<Vec<_>>(),
        [2, 1]
    );

    store.assert_only_hashed_keys();
    let expected: Vec<String> = (1..=3)
        .map(|n| {
            layer
                .stored_key_for(&format!("order.created:ord_{n}:email:{ADDRESS}"))
                .unwrap()
        })
        .collect();
    for (op, key) in store.seen() {
        assert!(expected.contains(&key), "{op} saw {key}");
    }
}

// ---- Real servers ----------------------------------------------------------------------------

/// What the backend tests send: two single messages (one kept as delivered, one as a timeout
/// of unknown delivery), a repeat, and a batch, all under keys that end in an address.
#[cfg(any(feature = "redis", feature = "postgres"))]
async fn send_through(layer: &IdempotencyLayer) {
    let provider = Provider::answering(|n, m| {
        let timed_out = m.text() == Some("times out");
        async move {
            if timed_out {
                Err(BoxError::from(SendError::unknown_delivery(
                    "provider.timeout",
                    "timed out",
                )))
            } else {
                Ok(Receipt::new(format!("msg-{n}"), "fake"))
            }
        }
    });
    let svc = layer.clone().layer(provider.clone());
    let first = svc.clone().oneshot(keyed(1)).await.unwrap();
    let again = svc.clone().oneshot(keyed(1)).await.unwrap();
    assert_eq!(again.id, first.id);
    assert!(again.replayed);
    let unknown = message(
        Some(&format!("order.created:ord_9:email:{ADDRESS}")),
        "times out",
    );
    assert!(svc.clone().oneshot(unknown.clone()).await.is_err());
    let kept = svc.clone().oneshot(unknown).await.unwrap_err();
    assert!(kept.is_replayed());
    assert_eq!(provider.calls(), 2);

    let batch = layer.clone().layer(BatchProvider::ok());
    let outcomes = batch
        .oneshot(Batch::from(vec![keyed(2), keyed(3), keyed(1)]))
        .await
        .unwrap();
    assert!(outcomes[0].is_ok() && outcomes[1].is_ok());
    assert!(outcomes[2].as_ref().unwrap().replayed);
}

#[cfg(feature = "redis")]
#[tokio::test]
#[cfg_attr(
    not(backend_redis),
    ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
)]
async fn no_raw_key_reaches_redis() {
    use support::stores::redis_admin::admin;
    use support::stores::{backend_url, unique_prefix};
    use tower_idempotency::RedisStore;

    let Some(url) = backend_url("REDIS_URL") else {
        return;
    };
    let prefix = unique_prefix("hashed");
    let store = RedisStore::connect(&url)
        .await
        .expect("connect to REDIS_URL")
        .key_prefix(prefix.clone());
    let index = store.unknown_index_key();
    let layer = hashed_layer(store);
    send_through(&layer).await;

    // Every key under the test's own prefix, and every value.
    let mut admin = admin(&url).await;
    let mut keys: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut admin)
            .await
            .expect("SCAN");
        keys.extend(page);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    keys.sort();
    // The operators' index of unknown outcomes lists stored keys: hashed ones too.
    let indexed: Vec<String> = redis::cmd("ZRANGE")
        .arg(&index)
        .arg(0)
        .arg(-1)
        .query_async(&mut admin)
        .await
        .expect("ZRANGE");
    for member in &indexed {
        assert!(is_hashed_form(member, "alerts"), "{member}");
        assert!(
            !member.contains(ADDRESS) && !member.contains("ord_"),
            "{member}"
        );
    }
    let all_keys = keys.clone();
    keys.retain(|key| *key != index);
    let mut expected: Vec<String> = [1, 2, 3, 9]
        .iter()
        .map(|n| {
            let key = layer
                .stored_key_for(&format!("order.created:ord_{n}:email:{ADDRESS}"))
                .unwrap();
            format!("{prefix}{key}")
        })
        .collect();
    expected.sort();
    assert_eq!(keys, expected);
    for key in &keys {
        let stored = key.strip_prefix(&prefix).unwrap_or(key);
        assert!(is_hashed_form(stored, "alerts"), "{key}");
        assert!(!key.contains(ADDRESS) && !key.contains("ord_"), "{key}");
        let value: Vec<u8> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut admin)
            .await
            .expect("GET");
        let value = String::from_utf8_lossy(&value);
        assert!(!value.is_empty());
        assert!(
            !value.contains(ADDRESS) && !value.contains("ord_"),
            "{value}"
        );
    }
    let () = redis::cmd("DEL")
        .arg(&all_keys)
        .query_async(&mut admin)
        .await
        .expect("DEL");
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use support::stores::postgres_admin::{admin, drop_table};
    use support::stores::{backend_url, unique};
    use tower_idempotency::store::postgres::PostgresStore;

    async fn setup(test: &str) -> Option<(String, PostgresStore, IdempotencyLayer)> {
        let url = backend_url("DATABASE_URL")?;
        let store = PostgresStore::connect(&url)
            .await
            .expect("connect")
            .table(&unique(test))
            .expect("valid table name");
        store.migrate().await.expect("migrate");
        let layer = hashed_layer(store.clone());
        Some((url, store, layer))
    }

    #[tokio::test]
    #[cfg_attr(
        not(backend_postgres),
        ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
    )]
    async fn no_raw_key_reaches_the_postgres_table() {
        let Some((url, store, layer)) = setup("hashed_rows").await else {
            return;
        };
        send_through(&layer).await;

        let client = admin(&url).await;
        let table = store.table_name();
        let keys: Vec<String> = client
            .query(&format!("SELECT key FROM \"{table}\" ORDER BY key"), &[])
            .await
            .expect("select keys")
            .iter()
            .map(|row| row.get(0))
            .collect();
        let mut expected: Vec<String> = [1, 2, 3, 9]
            .iter()
            .map(|n| {
                layer
                    .stored_key_for(&format!("order.created:ord_{n}:email:{ADDRESS}"))
                    .unwrap()
            })
            .collect();
        expected.sort();
        assert_eq!(keys, expected);
        assert!(
            keys.iter().all(|key| is_hashed_form(key, "alerts")),
            "{keys:?}"
        );
        // Whole rows, every column as text.
        let rows: Vec<String> = client
            .query(&format!("SELECT t::text FROM \"{table}\" t"), &[])
            .await
            .expect("select rows")
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert_eq!(rows.len(), 4);
        for row in rows {
            assert!(!row.contains(ADDRESS) && !row.contains("ord_"), "{row}");
        }
        drop_table(&url, store.table_name()).await;
    }

    #[tokio::test]
    #[cfg_attr(
        not(backend_postgres),
        ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
    )]
    async fn a_claim_under_a_hashed_key_is_taken_by_the_send() {
        let Some((url, store, layer)) = setup("hashed_claim").await else {
            return;
        };
        let claim = layer.claim(&keyed(1)).unwrap().expect("keyed");
        assert_eq!(
            claim.key,
            layer
                .stored_key_for(&format!("order.created:ord_1:email:{ADDRESS}"))
                .unwrap()
        );
        assert!(is_hashed_form(&claim.key, "alerts"));
        let mut client = admin(&url).await;
        let tx = client.transaction().await.unwrap();
        assert!(store.claim_in(&tx, &claim).await.unwrap());
        tx.commit().await.unwrap();
        // The stored key is a digest; the waiting claim maps back to the event's message
        // through the layer's claim of it, and to no other event's.
        let waiting = store.claims(10).await.unwrap();
        assert_eq!(waiting.len(), 1, "{waiting:?}");
        assert!(waiting[0].is_claim_of(&claim));
        let other = layer.claim(&keyed(2)).unwrap().expect("keyed");
        assert!(!waiting[0].is_claim_of(&other));

        let provider = Provider::ok();
        let svc = layer.clone().layer(provider.clone());
        let sent = svc.clone().oneshot(keyed(1)).await.unwrap();
        assert!(!sent.replayed);
        assert_eq!(provider.calls(), 1);
        assert!(store.claims(10).await.unwrap().is_empty());
        let again = svc.clone().oneshot(keyed(1)).await.unwrap();
        assert!(again.replayed);
        assert_eq!(again.id, sent.id);
        assert_eq!(provider.calls(), 1);
        drop_table(&url, store.table_name()).await;
    }
}
