//! One judge of "was it sent?": the layer, the retry policy, the HTTP transport and the
//! breaker predicate read an error the same way; and what never left is never kept: a send
//! that failed before a byte of the request left (an unresolvable host, an `https` URL over a
//! plain-HTTP client, a TLS handshake that fails, a refused connect) frees its key, over
//! hyper-util's client and reqwest, against real sockets on 127.0.0.1.

mod support;

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use support::http::tls::https_client;
use support::http::{
    AnyClient, ClientKind, DEADLINE, Reply, Resetting, any_client, plain_port, resend,
};
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::classify::{Classifier, default_classifier, never_connected};
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

// ---- What never left is never kept: a failure before a request byte leaves frees the key. ----

/// An order email under `key` (each test its own).
fn order(key: &str) -> Message {
    Message::builder()
        .from("orders@marketplace.example")
        .to("seller@example.com")
        .subject("New order")
        .text("Vintage Nikon FM2 just sold.")
        .idempotency_key(key)
        .build()
        .unwrap()
}

/// Sends `message` through the idempotency layer over an `HttpTransport` (Resend's codec at
/// `base`) over `client`, bounded by [`DEADLINE`].
async fn send(
    layer: &IdempotencyLayer,
    client: AnyClient,
    base: &str,
    message: &Message,
) -> Result<Receipt, SendError> {
    let codec = ResendCodec::new("re_test").base_url(base.parse().unwrap());
    ServiceBuilder::new()
        .layer(layer.clone())
        .timeout(DEADLINE)
        .service(HttpTransport::new(client, codec))
        .oneshot(message.clone())
        .await
}

/// The proof of a failure that never left: the send to `wrong` fails as not sent and frees
/// the key; the same message to the right address then goes, once, and a repeat is
/// replayed. Returns the first error.
async fn fails_unsent_then_goes_once(client: AnyClient, wrong: &str, key: &str) -> SendError {
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let message = order(key);
    let error = send(&layer, client.clone(), wrong, &message)
        .await
        .expect_err("nothing answers there");
    assert!(!error.delivery_unknown(), "{error}");
    assert_ne!(error.code(), codes::TIMEOUT, "{error}");
    assert!(!error.is_replayed(), "{error}");

    let provider = resend::answering(Reply::accepted(1)).await;
    let right = format!("http://{}", provider.addr);
    let receipt = send(&layer, client.clone(), &right, &message)
        .await
        .expect("the key was freed, so the send goes");
    assert_eq!(receipt.id, "msg-1");
    assert!(!receipt.replayed);
    let again = send(&layer, client, &right, &message).await.unwrap();
    assert!(again.replayed, "a repeat is answered from the store");
    assert_eq!(provider.requests().len(), 1, "the provider saw one request");
    error
}

#[tokio::test]
async fn an_unresolvable_host_frees_the_key_and_the_right_address_then_sends_once() {
    for kind in [ClientKind::HyperUtil, ClientKind::Reqwest] {
        let key = format!("unresolvable:{kind:?}");
        let error =
            fails_unsent_then_goes_once(kind.client(), "http://provider.invalid", &key).await;
        assert_eq!(error.code(), codes::CONNECT, "{kind:?}: {error}");
        assert!(error.is_retryable(), "{kind:?}: {error}");
    }
}

#[tokio::test]
async fn an_https_url_over_a_plain_http_client_frees_the_key_and_the_right_address_then_sends_once()
{
    // Nothing listens there: the client must refuse the scheme before it connects.
    let nothing = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    for kind in [ClientKind::HyperUtil, ClientKind::Reqwest] {
        let key = format!("https-over-http:{kind:?}");
        let error =
            fails_unsent_then_goes_once(kind.client(), &format!("https://{nothing}"), &key).await;
        assert!(
            error.to_string().contains("scheme"),
            "the error's text ends with the cause: {kind:?}: {error}"
        );
    }
}

#[tokio::test]
async fn a_tls_handshake_against_a_plain_port_frees_the_key_and_the_right_address_then_sends_once()
{
    let plain = plain_port(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").await;
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let message = order("tls-handshake");
    let error = send(
        &layer,
        any_client(https_client()),
        &format!("https://localhost:{}", plain.port()),
        &message,
    )
    .await
    .expect_err("no TLS server there");
    assert_eq!(error.code(), codes::CONNECT, "{error}");
    assert!(!error.delivery_unknown(), "{error}");

    let provider = resend::answering(Reply::accepted(1)).await;
    let right = format!("http://{}", provider.addr);
    let receipt = send(&layer, ClientKind::HyperUtil.client(), &right, &message)
        .await
        .expect("the key was freed, so the send goes");
    assert!(!receipt.replayed);
    assert_eq!(provider.requests().len(), 1);
}

#[tokio::test]
async fn a_refused_connect_frees_the_key_and_the_right_address_then_sends_once() {
    for kind in [ClientKind::HyperUtil, ClientKind::Reqwest] {
        let nothing = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap();
        let key = format!("refused:{kind:?}");
        let error =
            fails_unsent_then_goes_once(kind.client(), &format!("http://{nothing}"), &key).await;
        assert_eq!(error.code(), codes::CONNECT, "{kind:?}: {error}");
    }
}

#[tokio::test]
async fn a_server_that_reads_the_request_and_resets_keeps_the_key_as_unknown() {
    for kind in [ClientKind::HyperUtil, ClientKind::Reqwest] {
        let server = Resetting::start().await;
        let layer = IdempotencyLayer::new(MemoryStore::new());
        let message = order(&format!("reset:{kind:?}"));
        let base = format!("http://{}", server.addr);
        let error = send(&layer, kind.client(), &base, &message)
            .await
            .expect_err("the server resets");
        assert_eq!(error.code(), codes::UNKNOWN, "{kind:?}: {error}");
        assert!(error.delivery_unknown(), "{kind:?}: {error}");
        assert_eq!(server.requests_read(), 1, "{kind:?}: the request left");

        let again = send(&layer, kind.client(), &base, &message)
            .await
            .expect_err("the kept outcome");
        assert!(again.is_replayed(), "{kind:?}: {again}");
        assert_eq!(
            server.requests_read(),
            1,
            "{kind:?}: the repeat was not sent"
        );
    }
}

#[test]
fn the_default_judge_reads_a_failed_connect_of_either_client_as_not_sent() {
    let refused = JobFailed(Box::new(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "refused",
    )));
    assert!(never_connected(&refused));
    assert_eq!(default_classifier(&refused), Category::Retryable);
    let reset = JobFailed(Box::new(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "reset",
    )));
    assert!(
        !never_connected(&reset),
        "a reset may come after the request left"
    );
    assert_eq!(default_classifier(&reset), Category::Unknown);
}
