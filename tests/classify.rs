//! One judge of "was it sent?": the layer, the retry policy, the HTTP transport and the
//! breaker predicate read an error the same way.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::classify::{Classifier, default_classifier};
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::resend::ResendCodec;
use tower_idempotency::outcome::{Category, codes};
use tower_idempotency::{
    BoxError, IdempotencyLayer, MemoryStore, Message, Receipt, RetryPolicy, SendError,
    counts_against_provider,
};

fn message() -> Message {
    Message::builder()
        .from("shop@example.com")
        .to("seller@example.com")
        .subject("Hi")
        .text("hi")
        .idempotency_key("k")
        .build()
        .unwrap()
}

/// An application error that keeps what it wraps as its source.
#[derive(Debug)]
struct JobFailed(BoxError);

impl fmt::Display for JobFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the job failed")
    }
}

impl Error for JobFailed {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.0)
    }
}

/// "quota exceeded" did not send; anything else is judged by default.
fn quota(error: &(dyn Error + 'static)) -> Category {
    if error.to_string().contains("quota") {
        Category::Retryable
    } else {
        default_classifier(error)
    }
}

/// A provider that fails `failures` times with "quota exceeded", then sends.
fn over_quota(
    failures: usize,
    calls: &Arc<AtomicUsize>,
) -> impl Service<Message, Response = Receipt, Error = BoxError, Future: Send> + Clone + Send + 'static
{
    let calls = Arc::clone(calls);
    tower::service_fn(move |_m: Message| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            if n <= failures {
                Err(BoxError::from("quota exceeded"))
            } else {
                Ok(Receipt::new(format!("msg-{n}"), "fake"))
            }
        }
    })
}

#[tokio::test(start_paused = true)]
async fn the_retry_policy_given_the_layers_classifier_retries_what_the_layer_frees() {
    let layer = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .classify(quota)
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .layer(RetryLayer::new(
            RetryPolicy::new()
                .max_attempts(3)
                .classifier(layer.classifier()),
        ))
        .service(over_quota(2, &calls));
    assert_eq!(svc.oneshot(message()).await.unwrap().id, "msg-3");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn without_the_classifier_the_retry_policy_does_not_retry_a_foreign_error() {
    let layer = IdempotencyLayer::builder()
        .store(MemoryStore::new())
        .classify(quota)
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(RetryLayer::new(RetryPolicy::new().max_attempts(3)))
        .service(over_quota(2, &calls));
    let err = svc.oneshot(message()).await.unwrap_err();
    // The layer judged it not sent (and freed the key); the default policy did not retry.
    assert_eq!(err.code(), codes::NOT_SENT);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn a_send_error_wrapped_in_another_error_is_judged_by_the_inner_send_error() {
    let wrapped = |e: SendError| -> BoxError { Box::new(JobFailed(Box::new(e))) };
    assert!(!counts_against_provider(&Err::<(), _>(wrapped(
        SendError::in_flight()
    ))));
    assert!(!counts_against_provider(&Err::<(), _>(wrapped(
        SendError::circuit_open()
    ))));
    assert!(counts_against_provider(&Err::<(), _>(wrapped(
        SendError::retryable("provider.unavailable", "503")
    ))));
    let foreign: BoxError = Box::new(JobFailed("connection reset".into()));
    assert!(counts_against_provider(&Err::<(), _>(foreign)));
}

#[tokio::test]
async fn the_transport_takes_a_send_error_from_under_it_and_judges_the_rest_by_its_classifier() {
    // A breaker between the transport and the client answers an open circuit: not sent.
    let open = tower::service_fn(|_: http::Request<bytes::Bytes>| async {
        Err::<http::Response<String>, _>(BoxError::from(SendError::circuit_open()))
    });
    let err = HttpTransport::new(open, ResendCodec::new("re_test"))
        .oneshot(message())
        .await
        .unwrap_err();
    assert_eq!(err.code(), codes::CIRCUIT_OPEN);
    assert!(err.is_retryable());

    let over = tower::service_fn(|_: http::Request<bytes::Bytes>| async {
        Err::<http::Response<String>, _>(BoxError::from("quota exceeded"))
    });
    let transport = HttpTransport::new(over, ResendCodec::new("re_test"));
    let unknown = transport.clone().oneshot(message()).await.unwrap_err();
    assert!(unknown.delivery_unknown());
    let not_sent = transport
        .classifier(Classifier::new(quota))
        .oneshot(message())
        .await
        .unwrap_err();
    assert_eq!(not_sent.code(), codes::CONNECT);
    assert!(not_sent.is_retryable());
}
