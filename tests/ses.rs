//! Amazon SES v2 through `HttpTransport` and `SesCodec` against moto's server mode, an
//! independent implementation of SES, with a fault proxy in front of it for what moto does not
//! do by itself (throttling, a reply lost after SES took the message). A message sent through
//! the layer with retries and a timeout reaches SES once per key; a replay sends nothing; a
//! rejected message frees its key; a lost reply keeps it. Every message SES takes carries the
//! stored key's mark (the `idempotency_digest` tag the SNS receiver finds the key by) as a
//! `MessageTag` of `SendEmail`'s `EmailTags`; moto keeps no tags of a sent message (its
//! `SendEmail` reads no `EmailTags`), so they are read from the request the proxy forwarded to
//! moto, which moto accepted.
#![cfg(feature = "ses")]

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_credential_types::Credentials;
use bytes::Bytes;
use http_body_util::BodyExt;
use support::http::{HyperClient, hyper_client};
use support::python::Moto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::batch::{Batch, PerMessage};
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::mark::{KEY_DIGEST, key_digest};
use tower_idempotency::http::ses::{SES_IDEMPOTENCY_TAG, SesCodec, ses_key_tag};
use tower_idempotency::outcome::{Category, codes};
use tower_idempotency::{Attachment, IdempotencyLayer, Message, Receipt, RetryPolicy, SendError};

const VERIFIED: &str = "shop@shop.example";

// ---------------------------------------------------------------------------------------------
// moto, and a fault proxy in front of it
// ---------------------------------------------------------------------------------------------

/// What the proxy does with the n-th request.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Passes it to moto and its answer back.
    Forward,
    /// Answers SES's 429 `TooManyRequestsException`; moto never sees it.
    Throttle,
    /// Passes it to moto, which takes the message, then closes the connection unanswered.
    ForwardThenDrop,
}

struct Proxy {
    addr: SocketAddr,
    bodies: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl Proxy {
    async fn start(moto: SocketAddr, script: Vec<Fault>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::new(AtomicUsize::new(0));
        let recorded = Arc::clone(&bodies);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let n = seen.fetch_add(1, Ordering::SeqCst);
                let fault = script[n.min(script.len() - 1)];
                let recorded = Arc::clone(&recorded);
                tokio::spawn(proxy_one(client, moto, fault, recorded));
            }
        });
        Self { addr, bodies }
    }

    fn base_url(&self) -> http::Uri {
        format!("http://{}", self.addr).parse().unwrap()
    }

    fn requests(&self) -> Vec<serde_json::Value> {
        self.bodies.lock().unwrap().clone()
    }
}

/// Reads one HTTP/1.1 request (head, then `content-length` bytes of body).
async fn read_request(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    while buffer.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    Some(buffer)
}

async fn proxy_one(
    mut client: TcpStream,
    moto: SocketAddr,
    fault: Fault,
    recorded: Arc<Mutex<Vec<serde_json::Value>>>,
) {
    let Some(request) = read_request(&mut client).await else {
        return;
    };
    let body_at = request.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    recorded
        .lock()
        .unwrap()
        .push(serde_json::from_slice(&request[body_at..]).unwrap_or_default());
    match fault {
        Fault::Throttle => {
            let body = r#"{"message":"Too Many Requests"}"#;
            let answer = format!(
                "HTTP/1.1 429 Too Many Requests\r\nx-amzn-ErrorType: TooManyRequestsException\r\n\
                 content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = client.write_all(answer.as_bytes()).await;
        }
        Fault::Forward | Fault::ForwardThenDrop => {
            let mut upstream = TcpStream::connect(moto).await.unwrap();
            upstream.write_all(&request).await.unwrap();
            // werkzeug answers with `Connection: close`: its answer ends at EOF.
            let mut answer = Vec::new();
            upstream.read_to_end(&mut answer).await.unwrap();
            if matches!(fault, Fault::Forward) {
                let _ = client.write_all(&answer).await;
            }
        }
    }
    let _ = client.shutdown().await;
}

/// An AWS-shaped `Authorization` header: moto reads the region from it, and checks no
/// signature.
const MOTO_AUTH: &str = "AWS4-HMAC-SHA256 Credential=AKIDTEST/20250101/us-east-1/ses/aws4_request, \
                         SignedHeaders=host, Signature=0";

async fn moto_call(moto: &Moto, method: &str, path: &str, body: &str) -> serde_json::Value {
    let request = http::Request::builder()
        .method(method)
        .uri(format!("{}{path}", moto.base_url()))
        .header("authorization", MOTO_AUTH)
        .header("content-type", "application/json")
        .body(Bytes::from(body.to_owned()))
        .unwrap();
    let response = hyper_client().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert!(status.is_success(), "{path}: {status} {bytes:?}");
    serde_json::from_slice(&bytes).unwrap()
}

async fn verify(moto: &Moto, identity: &str) {
    let body = format!(r#"{{"EmailIdentity":"{identity}"}}"#);
    moto_call(moto, "POST", "/v2/email/identities", &body).await;
}

/// The messages moto's SES keeps: simple (`Message`) and raw (`RawMessage`).
async fn sent(moto: &Moto) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let data = moto_call(moto, "GET", "/moto-api/data.json", "").await;
    let list = |kind: &str| data["ses"][kind].as_array().cloned().unwrap_or_default();
    (list("Message"), list("RawMessage"))
}

async fn simple_sent_with_subject(moto: &Moto, subject: &str) -> usize {
    let (simple, _) = sent(moto).await;
    simple.iter().filter(|m| m["subject"] == subject).count()
}

// ---------------------------------------------------------------------------------------------
// The stack
// ---------------------------------------------------------------------------------------------

fn transport(base_url: http::Uri) -> HttpTransport<HyperClient, SesCodec> {
    let credentials = Credentials::new("AKIDTEST", "secret", None, None, "static");
    let codec = SesCodec::new("us-east-1", credentials)
        .configuration_set("transactional")
        .base_url(base_url);
    HttpTransport::new(hyper_client(), codec)
}

/// The layer outside a retry (three attempts) and a timeout, as a user stacks them.
fn stack(
    layer: &IdempotencyLayer,
    base_url: http::Uri,
) -> impl Service<Message, Response = Receipt, Error = SendError> + use<> {
    let retry = RetryPolicy::new()
        .max_attempts(3)
        .base_delay(Duration::from_millis(10))
        .classifier(layer.classifier());
    ServiceBuilder::new()
        .layer(layer.clone())
        .layer(RetryLayer::new(retry))
        .timeout(Duration::from_secs(30))
        .service(transport(base_url))
}

fn message(from: &str, subject: &str, key: &str) -> Message {
    Message::builder()
        .from(from)
        .to("buyer@example.com")
        .subject(subject)
        .text("It ships today.")
        .metadata("kind", "order_shipped")
        .idempotency_key(key)
        .build()
        .unwrap()
}

/// Checks `body`'s `EmailTags` as SES v2's `SendEmail` takes them (a list of `MessageTag`,
/// `{"Name", "Value"}`, each of ASCII letters, digits, `_` and `-`, at most 256 characters,
/// names unique), and that they mark the message with `stored`'s digest and key tag.
fn assert_marked(body: &serde_json::Value, stored: &str) {
    let tags = body["EmailTags"].as_array().expect("EmailTags is a list");
    let tag_text = |text: &str| {
        text.len() <= 256
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    let mut names = Vec::new();
    for tag in tags {
        let tag = tag.as_object().expect("a MessageTag is an object");
        assert_eq!(tag.len(), 2, "Name and Value only: {tag:?}");
        let (name, value) = (
            tag["Name"].as_str().unwrap(),
            tag["Value"].as_str().unwrap(),
        );
        assert!(
            !name.is_empty() && tag_text(name) && tag_text(value),
            "{tag:?}"
        );
        names.push(name);
    }
    let count = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), count, "tag names are unique: {tags:?}");
    let value = |name: &str| tags.iter().find(|t| t["Name"] == name).map(|t| &t["Value"]);
    assert_eq!(
        value(KEY_DIGEST),
        Some(&serde_json::Value::from(key_digest(stored))),
        "{tags:?}"
    );
    assert_eq!(
        value(SES_IDEMPOTENCY_TAG),
        Some(&serde_json::Value::from(ses_key_tag(stored))),
        "{tags:?}"
    );
}

async fn send<S>(service: &mut S, message: Message) -> Result<Receipt, SendError>
where
    S: Service<Message, Response = Receipt, Error = SendError>,
{
    service.ready().await?.call(message).await
}

// ---------------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------------

#[cfg_attr(not(backend_moto), ignore = "moto not found: run .ci/python-fakes.sh")]
#[tokio::test]
async fn a_throttled_message_is_retried_and_reaches_ses_once_per_key() {
    let moto = Moto::start();
    verify(&moto, VERIFIED).await;
    let proxy = Proxy::start(
        moto.addr,
        vec![Fault::Throttle, Fault::Throttle, Fault::Forward],
    )
    .await;
    let layer = IdempotencyLayer::in_memory();
    let mut ses = stack(&layer, proxy.base_url());

    let receipt = send(
        &mut ses,
        message(VERIFIED, "Order 1 shipped", "order:1:shipped"),
    )
    .await
    .unwrap();
    assert_eq!(receipt.transport, "ses");
    assert!(!receipt.replayed);
    assert_eq!(
        proxy.requests().len(),
        3,
        "two throttled attempts, then the send"
    );
    assert_eq!(simple_sent_with_subject(&moto, "Order 1 shipped").await, 1);

    // The stored key rode along as tags of the request moto took, beside the metadata's tag,
    // with the configuration set whose event destination publishes them.
    let body = &proxy.requests()[2];
    let stored = layer.stored_key_for("order:1:shipped").unwrap();
    assert_marked(body, &stored);
    assert!(
        body["EmailTags"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["Name"] == "kind" && t["Value"] == "order_shipped"),
        "{body}"
    );
    assert_eq!(body["ConfigurationSetName"], "transactional");

    let again = send(
        &mut ses,
        message(VERIFIED, "Order 1 shipped", "order:1:shipped"),
    )
    .await
    .unwrap();
    assert!(again.replayed);
    assert_eq!(again.id, receipt.id);
    assert_eq!(proxy.requests().len(), 3, "a replay sends nothing");
    assert_eq!(simple_sent_with_subject(&moto, "Order 1 shipped").await, 1);
}

#[cfg_attr(not(backend_moto), ignore = "moto not found: run .ci/python-fakes.sh")]
#[tokio::test]
async fn a_message_ses_rejects_frees_its_key() {
    let moto = Moto::start();
    let base_url: http::Uri = moto.base_url().parse().unwrap();
    let mut ses = stack(&IdempotencyLayer::in_memory(), base_url);
    let shipped = || message(VERIFIED, "Order 2 shipped", "order:2:shipped");

    let error = send(&mut ses, shipped()).await.unwrap_err();
    assert_eq!(error.code(), codes::IDENTITY_NOT_VERIFIED);
    assert_eq!(error.category(), Category::Permanent);
    assert!(error.message().contains("MessageRejected"), "{error}");
    assert_eq!(simple_sent_with_subject(&moto, "Order 2 shipped").await, 0);

    // Freed: once the identity is verified, the same message goes under the same key.
    verify(&moto, VERIFIED).await;
    let receipt = send(&mut ses, shipped()).await.unwrap();
    assert!(!receipt.replayed);
    assert_eq!(simple_sent_with_subject(&moto, "Order 2 shipped").await, 1);
}

#[cfg_attr(not(backend_moto), ignore = "moto not found: run .ci/python-fakes.sh")]
#[tokio::test]
async fn a_reply_lost_after_ses_took_the_message_keeps_the_key_of_unknown_delivery() {
    let moto = Moto::start();
    verify(&moto, VERIFIED).await;
    let proxy = Proxy::start(moto.addr, vec![Fault::ForwardThenDrop, Fault::Forward]).await;
    let mut ses = stack(&IdempotencyLayer::in_memory(), proxy.base_url());
    let shipped = || message(VERIFIED, "Order 3 shipped", "order:3:shipped");

    let error = send(&mut ses, shipped()).await.unwrap_err();
    assert_eq!(error.category(), Category::Unknown, "{error}");
    assert!(error.delivery_unknown());
    assert_eq!(simple_sent_with_subject(&moto, "Order 3 shipped").await, 1);
    assert_eq!(
        proxy.requests().len(),
        1,
        "an unknown delivery is not retried"
    );

    let again = send(&mut ses, shipped()).await.unwrap_err();
    assert!(again.is_replayed());
    assert_eq!(proxy.requests().len(), 1);
    assert_eq!(simple_sent_with_subject(&moto, "Order 3 shipped").await, 1);
}

#[cfg_attr(not(backend_moto), ignore = "moto not found: run .ci/python-fakes.sh")]
#[tokio::test]
async fn a_message_with_attachments_goes_raw_once() {
    let moto = Moto::start();
    verify(&moto, VERIFIED).await;
    let proxy = Proxy::start(moto.addr, vec![Fault::Forward]).await;
    let layer = IdempotencyLayer::in_memory();
    let mut ses = stack(&layer, proxy.base_url());
    let invoice = || {
        Message::builder()
            .from(VERIFIED)
            .to("buyer@example.com")
            .subject("Invoice 4")
            .text("Attached.")
            .attachment(Attachment::new(
                "invoice-4.pdf",
                "application/pdf",
                &b"%PDF-1.7"[..],
            ))
            .idempotency_key("order:4:invoice")
            .build()
            .unwrap()
    };
    send(&mut ses, invoice()).await.unwrap();
    assert!(send(&mut ses, invoice()).await.unwrap().replayed);
    let (_, raw) = sent(&moto).await;
    assert_eq!(raw.len(), 1, "{raw:?}");
    let text = raw[0].to_string();
    assert!(text.contains("invoice-4.pdf"), "{text}");
    assert!(text.contains(".idempotency@shop.example"), "{text}");

    // A raw message is marked as a simple one is: tags are the request's, not the MIME's.
    let requests = proxy.requests();
    assert_eq!(requests.len(), 1, "the replay sent nothing");
    assert!(requests[0]["Content"]["Raw"].is_object(), "{}", requests[0]);
    assert_marked(
        &requests[0],
        &layer.stored_key_for("order:4:invoice").unwrap(),
    );
}

#[cfg_attr(not(backend_moto), ignore = "moto not found: run .ci/python-fakes.sh")]
#[tokio::test]
async fn a_batch_goes_message_by_message_and_each_key_follows_its_own_outcome() {
    let moto = Moto::start();
    verify(&moto, VERIFIED).await;
    let base_url: http::Uri = moto.base_url().parse().unwrap();
    let mut ses = ServiceBuilder::new()
        .layer(IdempotencyLayer::in_memory())
        .service(PerMessage::new(transport(base_url)));
    let batch = || {
        Batch::from(vec![
            message(VERIFIED, "Batch a", "batch:a"),
            message("nobody@unverified.example", "Batch b", "batch:b"),
            message(VERIFIED, "Batch c", "batch:c"),
        ])
    };
    let first = ServiceExt::<Batch>::ready(&mut ses)
        .await
        .unwrap()
        .call(batch())
        .await
        .unwrap();
    assert!(first[0].is_ok() && first[2].is_ok(), "{first:?}");
    assert_eq!(
        first[1].as_ref().unwrap_err().code(),
        codes::IDENTITY_NOT_VERIFIED
    );

    let second = ServiceExt::<Batch>::ready(&mut ses)
        .await
        .unwrap()
        .call(batch())
        .await
        .unwrap();
    assert!(second[0].as_ref().unwrap().replayed);
    assert!(second[2].as_ref().unwrap().replayed);
    // The rejected message's key was freed: it went again, and was rejected again.
    let rejected = second[1].as_ref().unwrap_err();
    assert!(!rejected.is_replayed());
    assert_eq!(rejected.code(), codes::IDENTITY_NOT_VERIFIED);
    for subject in ["Batch a", "Batch c"] {
        assert_eq!(simple_sent_with_subject(&moto, subject).await, 1);
    }
}

#[cfg_attr(not(backend_moto), ignore = "moto not found: run .ci/python-fakes.sh")]
#[tokio::test]
async fn throttling_past_the_last_attempt_frees_the_key_unsent() {
    let moto = Moto::start();
    verify(&moto, VERIFIED).await;
    let script = vec![
        Fault::Throttle,
        Fault::Throttle,
        Fault::Throttle,
        Fault::Forward,
    ];
    let proxy = Proxy::start(moto.addr, script).await;
    let mut ses = stack(&IdempotencyLayer::in_memory(), proxy.base_url());
    let shipped = || message(VERIFIED, "Order 5 shipped", "order:5:shipped");

    let error = send(&mut ses, shipped()).await.unwrap_err();
    assert_eq!(error.code(), codes::RATE_LIMITED);
    assert_eq!(error.category(), Category::Retryable);
    assert_eq!(proxy.requests().len(), 3, "three attempts");
    assert_eq!(simple_sent_with_subject(&moto, "Order 5 shipped").await, 0);

    // Freed: a later send under the same key goes.
    let receipt = send(&mut ses, shipped()).await.unwrap();
    assert!(!receipt.replayed);
    assert_eq!(simple_sent_with_subject(&moto, "Order 5 shipped").await, 1);
}
