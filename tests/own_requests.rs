//! A request type of the user's own through the layer: it says its key, fingerprints itself
//! through the crate's encoder, and names the recipients a kept receipt points into.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_idempotency::batch::{Batch, BatchOutcomes};
use tower_idempotency::fingerprint::{Encoder, Fingerprint, Fingerprinted};
use tower_idempotency::layer::IdempotentRequest;
use tower_idempotency::outcome::codes;
use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Receipt, SendError};

/// A push notification to devices, keyed by the event that caused it.
#[derive(Clone, Debug)]
struct Push {
    key: Option<String>,
    devices: Vec<String>,
    text: String,
}

fn push(key: Option<&str>, text: &str) -> Push {
    Push {
        key: key.map(str::to_owned),
        devices: vec!["dev-1".to_owned(), "dev-2".to_owned()],
        text: text.to_owned(),
    }
}

impl Fingerprinted for Push {
    fn fingerprint(&self) -> Fingerprint {
        let mut e = Encoder::new("tests/push/v1");
        e.list(&self.devices).str(&self.text);
        e.finish()
    }
}

impl IdempotentRequest for Push {
    fn idempotency_key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    fn recipients(&self) -> Vec<&str> {
        self.devices.iter().map(String::as_str).collect()
    }
}

/// A push service that counts its calls and accepts every device.
fn pusher(
    calls: &Arc<AtomicUsize>,
) -> impl Service<Push, Response = Receipt, Error = BoxError, Future: Send> + Clone + Send + 'static
{
    let calls = Arc::clone(calls);
    tower::service_fn(move |p: Push| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Ok::<_, BoxError>(Receipt::new(format!("push-{n}"), "fcm").with_accepted(p.devices))
        }
    })
}

#[tokio::test]
async fn own_request_is_sent_once_per_key_and_replayed_with_its_recipients() {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::in_memory())
        .service(pusher(&calls));

    let first = svc
        .ready()
        .await
        .unwrap()
        .call(push(Some("e1"), "hi"))
        .await
        .unwrap();
    let again = svc
        .ready()
        .await
        .unwrap()
        .call(push(Some("e1"), "hi"))
        .await
        .unwrap();
    assert!(!first.replayed);
    assert!(again.replayed);
    assert_eq!(again.id, first.id);
    assert_eq!(again.accepted, ["dev-1", "dev-2"]);

    let reused = svc
        .ready()
        .await
        .unwrap()
        .call(push(Some("e1"), "other"))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), codes::KEY_REUSED);
    svc.ready()
        .await
        .unwrap()
        .call(push(None, "hi"))
        .await
        .unwrap();
    svc.ready()
        .await
        .unwrap()
        .call(push(None, "hi"))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3, "unkeyed pushes always go");
}

#[tokio::test]
async fn an_invalid_own_key_is_refused_unsent() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = IdempotencyLayer::in_memory().layer(pusher(&calls));
    for bad in ["", "line\nbreak"] {
        let err = svc
            .clone()
            .oneshot(push(Some(bad), "hi"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), codes::INVALID_KEY);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_layers_key_function_overrides_the_requests_own_key() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .key_for::<Push>(|p| Some(format!("text:{}", p.text)))
        .build()
        .unwrap();
    let svc = layer.layer(pusher(&calls));
    svc.clone().oneshot(push(Some("a"), "hi")).await.unwrap();
    // Another own key, or none at all, but the same derived key: a repeat.
    assert!(
        svc.clone()
            .oneshot(push(Some("b"), "hi"))
            .await
            .unwrap()
            .replayed
    );
    assert!(
        svc.clone()
            .oneshot(push(None, "hi"))
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let invalid = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .key_for::<Push>(|_| Some(String::new()))
        .build()
        .unwrap();
    let err = invalid
        .layer(pusher(&calls))
        .oneshot(push(Some("fine"), "hi"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), codes::INVALID_KEY);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn own_requests_go_in_batches_too() {
    let batches = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&batches);
    let bulk = tower::service_fn(move |batch: Batch<Push>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async move {
            let outcomes: BatchOutcomes = batch
                .iter()
                .map(|p| Ok::<_, SendError>(Receipt::new(format!("push-{}", p.text), "fcm")))
                .collect();
            Ok::<_, BoxError>(outcomes)
        }
    });
    let svc = IdempotencyLayer::in_memory().layer(bulk);
    let batch = Batch::from(vec![
        push(Some("a"), "1"),
        push(Some("b"), "2"),
        push(Some("a"), "1"),
    ]);
    let answers = svc.clone().oneshot(batch).await.unwrap();
    assert_eq!(answers.len(), 3);
    assert!(!answers[0].as_ref().unwrap().replayed);
    assert!(answers[2].as_ref().unwrap().replayed);
    let again = svc
        .oneshot(Batch::from(vec![push(Some("b"), "2")]))
        .await
        .unwrap();
    assert!(again[0].as_ref().unwrap().replayed);
    assert_eq!(
        batches.load(Ordering::SeqCst),
        1,
        "the repeat batch made no inner call"
    );
}
