//! A provider client of the user's own on reqwest, answering its errors with `?`: with the
//! `reqwest` feature the layer answers each `reqwest::Error` as `HttpTransport` answers the
//! same failure, the same code and category from one status table (a codec may place its
//! provider's error names more precisely, as Resend's 422 is a validation error). Against the
//! one fake provider (a real server on 127.0.0.1).
#![cfg(all(feature = "reqwest", feature = "http"))]

mod support;

use std::time::Duration;

use tower::{Layer, ServiceExt};
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::postmark::PostmarkCodec;
use tower_idempotency::outcome::Category;
use tower_idempotency::{BoxError, IdempotencyLayer, Message, Receipt, SendError};

use support::http::{FakeProvider, Reply, ReqwestClient};
use support::message;

/// The client a user writes: post, `error_for_status()?`, read the id.
fn own_client(
    client: reqwest::Client,
    url: String,
) -> impl tower::Service<Message, Response = Receipt, Error = BoxError, Future: Send> + Clone {
    tower::service_fn(move |message: Message| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let response = client
                .post(&url)
                .body(message.text().unwrap_or_default().to_owned())
                .send()
                .await?
                .error_for_status()?;
            let sent: serde_json::Value = serde_json::from_str(&response.text().await?)?;
            let id = sent["id"].as_str().ok_or("no id")?;
            Ok(Receipt::new(id, "own"))
        }
    })
}

fn reqwest_client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .retry(reqwest::retry::never())
        .build()
        .expect("a client")
}

/// What the layer answers the user's client for a provider answering `reply`.
async fn through_own_client(reply: Reply) -> Result<Receipt, SendError> {
    let provider = FakeProvider::answering(reply).await;
    let url = format!("http://{}/emails", provider.addr);
    let layer = IdempotencyLayer::in_memory();
    let service = layer.layer(own_client(reqwest_client(Duration::from_secs(5)), url));
    service.oneshot(message(Some("k"), "hello")).await
}

/// What `HttpTransport` over reqwest answers for a provider answering `reply` (a codec that
/// reads no error body of its own, so the status alone decides).
async fn through_the_transport(reply: Reply) -> SendError {
    let provider = FakeProvider::answering(reply).await;
    let codec = PostmarkCodec::new("token").base_url(provider.base_url());
    HttpTransport::new(ReqwestClient::new(), codec)
        .oneshot(message(Some("k"), "hello"))
        .await
        .expect_err("a failure status")
}

#[tokio::test]
async fn statuses_give_the_same_code_and_category_as_through_the_http_transport() {
    for (status, expected) in [
        (400, Category::Permanent),
        (404, Category::Permanent),
        (408, Category::Retryable),
        (409, Category::Permanent),
        (422, Category::Permanent),
        (429, Category::Retryable),
        (500, Category::Unknown),
        (502, Category::Retryable),
        (503, Category::Retryable),
        (504, Category::Retryable),
        (599, Category::Unknown),
    ] {
        let own = through_own_client(Reply::new(status, "no"))
            .await
            .expect_err("a failure status");
        assert_eq!(own.category(), expected, "{status}: {own}");
        assert_eq!(
            own.delivery_unknown(),
            expected == Category::Unknown,
            "{status}"
        );
        assert!(
            own.to_string().contains(&status.to_string()),
            "the error's text names the status: {own}"
        );
        let transport = through_the_transport(Reply::new(status, "no")).await;
        assert_eq!(
            (own.code(), own.category()),
            (transport.code(), transport.category()),
            "{status}: one status table for both"
        );
    }
}

#[tokio::test]
async fn a_refused_connection_is_not_sent_and_frees_the_key() {
    let nothing = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let layer = IdempotencyLayer::in_memory();
    let service = layer.layer(own_client(
        reqwest_client(Duration::from_secs(5)),
        format!("http://{nothing}/emails"),
    ));
    for attempt in 1..=2 {
        let error = service
            .clone()
            .oneshot(message(Some("refused"), "hello"))
            .await
            .expect_err("nothing listens");
        // The second attempt is refused by the server again, not answered as in flight or
        // replayed: the first one freed the key.
        assert_eq!(error.category(), Category::Retryable, "{attempt}: {error}");
        assert!(!error.delivery_unknown(), "{attempt}: {error}");
        assert!(!error.is_replayed(), "{attempt}: {error}");
    }
}

#[tokio::test]
async fn a_timeout_after_the_request_left_keeps_the_key_and_a_repeat_is_not_sent() {
    let provider = FakeProvider::answering(Reply::stall()).await;
    let layer = IdempotencyLayer::in_memory();
    let service = layer.layer(own_client(
        reqwest_client(Duration::from_millis(300)),
        format!("http://{}/emails", provider.addr),
    ));
    let error = service
        .clone()
        .oneshot(message(Some("slow"), "hello"))
        .await
        .expect_err("the provider never answers");
    assert_eq!(error.category(), Category::Unknown, "{error}");
    assert!(error.delivery_unknown(), "{error}");
    provider.received(1).await;

    let repeat = service
        .oneshot(message(Some("slow"), "hello"))
        .await
        .expect_err("the kept outcome");
    assert!(repeat.is_replayed(), "{repeat}");
    assert_eq!(provider.requests().len(), 1, "the repeat was not sent");
}

#[tokio::test]
async fn a_request_that_cannot_be_built_is_invalid_and_not_sent() {
    let layer = IdempotencyLayer::in_memory();
    let service = layer.layer(own_client(
        reqwest_client(Duration::from_secs(5)),
        "not a url".to_owned(),
    ));
    let error = service
        .oneshot(message(Some("bad-url"), "hello"))
        .await
        .expect_err("no URL");
    assert_eq!(error.category(), Category::Validation, "{error}");
}
