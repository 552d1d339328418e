//! The one fake HTTP provider, a real axum server on 127.0.0.1:0 that records every request
//! and answers by a script, and the two real clients (hyper-util's legacy client, reqwest) as
//! `Service<http::Request<Bytes>>`.
//!
//! A provider started with a [`Schema`] ([`FakeProvider::enforcing`]) checks every request
//! against that provider's published request description first, and answers a request the
//! real provider would refuse with the provider's own validation error, keeping the
//! violation ([`FakeProvider::violations`]). One module per provider holds its schema:
//! [`resend`], [`twilio`], [`postmark`].

pub mod listing;
pub mod postmark;
pub mod postmark_list;
pub mod resend;
pub mod signing;
pub mod tls;
pub mod twilio;
pub mod twilio_list;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::watch;
use tower::util::{BoxCloneService, MapRequest};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::BoxError;

/// The longest the provider, or a test waiting on it, waits for a signal: a bound, never
/// reached when the tests pass.
pub const DEADLINE: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// What the provider answers
// ---------------------------------------------------------------------------------------------

/// One answer of the fake provider.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    /// Never answers (the request is recorded first).
    pub stall: bool,
}

impl Reply {
    /// `status` with `body`, no headers.
    pub fn new(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
            stall: false,
        }
    }

    /// `status` with a JSON `body`.
    pub fn json(status: u16, body: impl Into<String>) -> Self {
        Self::new(status, body).header("content-type", "application/json")
    }

    /// Resend's 200 with the message id `msg-<n>`.
    pub fn accepted(n: usize) -> Self {
        Self::json(200, format!(r#"{{"id":"msg-{n}"}}"#))
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// Takes the request and never answers.
    pub fn stall() -> Self {
        Self {
            stall: true,
            ..Self::new(200, "")
        }
    }
}

type Answer = Arc<dyn Fn(usize, Arc<ProviderState>) -> BoxFuture<'static, Reply> + Send + Sync>;

/// Answers the `n`-th request (from 1), given the provider's state to wait on.
pub struct Script(Answer);

/// A script that may wait on the provider's state before it answers.
pub fn script<F, Fut>(f: F) -> Script
where
    F: Fn(usize, Arc<ProviderState>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    Script(Arc::new(move |n, provider| f(n, provider).boxed()))
}

/// The simplest script: the n-th request gets the n-th reply, and the last one repeats.
impl From<Vec<Reply>> for Script {
    fn from(replies: Vec<Reply>) -> Self {
        assert!(!replies.is_empty(), "a provider needs at least one reply");
        script(move |n, _| {
            let reply = replies[(n - 1).min(replies.len() - 1)].clone();
            async move { reply }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The provider
// ---------------------------------------------------------------------------------------------

/// A request as the provider received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// When it arrived.
    pub at: Instant,
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    /// Its `Idempotency-Key` header, which most tests check.
    pub key: Option<String>,
    pub body: Bytes,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("the provider received JSON")
    }
}

/// A provider's published request rules: `Ok` for a request the real provider takes, else
/// its answer to the request (its documented validation error) and why.
pub type Schema = fn(&Recorded) -> Result<(), (Reply, String)>;

/// What the provider has seen, which scripts read to decide when to answer.
pub struct ProviderState {
    schema: Option<Schema>,
    violations: Mutex<Vec<String>>,
    requests: Mutex<Vec<Recorded>>,
    received: watch::Sender<usize>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    released: watch::Sender<bool>,
}

impl ProviderState {
    /// Waits until `n` requests have arrived, at most [`DEADLINE`] (then answers anyway).
    pub async fn arrived(&self, n: usize) {
        let mut received = self.received.subscribe();
        let _ = tokio::time::timeout(DEADLINE, received.wait_for(|c| *c >= n)).await;
    }

    /// Waits until the test releases the provider, at most [`DEADLINE`].
    pub async fn released(&self) {
        let mut released = self.released.subscribe();
        let _ = tokio::time::timeout(DEADLINE, released.wait_for(|r| *r)).await;
    }
}

/// A fake provider on 127.0.0.1:0. Dropping it releases every waiting script and stops the
/// server.
pub struct FakeProvider {
    pub addr: SocketAddr,
    state: Arc<ProviderState>,
    server: tokio::task::JoinHandle<()>,
}

impl ProviderState {
    /// The `n`-th request (from 1), once it arrived.
    pub fn nth(&self, n: usize) -> Option<Recorded> {
        self.requests
            .lock()
            .unwrap()
            .get(n.checked_sub(1)?)
            .cloned()
    }
}

/// A listener that closes its first `drop` connections as soon as they are accepted, before
/// a byte is read: requests on them never reach the provider, and the client sees the
/// connection break after it connected (not a refused connection).
struct Dropping {
    inner: tokio::net::TcpListener,
    drop: usize,
}

impl axum::serve::Listener for Dropping {
    type Io = tokio::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let accepted = axum::serve::Listener::accept(&mut self.inner).await;
            if self.drop == 0 {
                return accepted;
            }
            self.drop -= 1;
            drop(accepted);
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

impl FakeProvider {
    /// Starts a provider that answers by `script`: a [`script`] or a list of replies.
    pub async fn start(script: impl Into<Script>) -> Self {
        Self::serve(None, script.into(), 0).await
    }

    /// [`start`](Self::start), closing the first `drop` connections unread.
    pub async fn start_dropping(script: impl Into<Script>, drop: usize) -> Self {
        Self::serve(None, script.into(), drop).await
    }

    /// Starts a provider that checks every request against `schema` first: a request that
    /// breaks it is answered the provider's validation error (the script is not asked) and
    /// kept in [`violations`](Self::violations).
    pub async fn enforcing(schema: Schema, script: impl Into<Script>) -> Self {
        Self::serve(Some(schema), script.into(), 0).await
    }

    /// What the schema refused, in order; empty when every request was one the real provider
    /// takes.
    pub fn violations(&self) -> Vec<String> {
        self.state.violations.lock().unwrap().clone()
    }

    /// Fails the test when any request broke the schema.
    pub fn assert_no_violations(&self) {
        let violations = self.violations();
        assert!(
            violations.is_empty(),
            "the provider would have refused: {violations:?}"
        );
    }

    async fn serve(schema: Option<Schema>, script: Script, drop: usize) -> Self {
        let state = Arc::new(ProviderState {
            schema,
            violations: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            received: watch::Sender::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            released: watch::Sender::new(false),
        });
        let app = Router::new()
            .fallback(record_and_answer)
            .with_state((Arc::clone(&state), script.0));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let listener = Dropping {
            inner: listener,
            drop,
        };
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            state,
            server,
        }
    }

    /// Starts a provider that answers every request with `reply`.
    pub async fn answering(reply: Reply) -> Self {
        Self::start(vec![reply]).await
    }

    pub fn base_url(&self) -> http::Uri {
        format!("http://{}", self.addr).parse().unwrap()
    }

    /// Every request so far, in the order they arrived.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Waits until the provider has received `n` requests; fails the test after [`DEADLINE`].
    pub async fn received(&self, n: usize) {
        let mut received = self.state.received.subscribe();
        let waited = tokio::time::timeout(DEADLINE, received.wait_for(|c| *c >= n)).await;
        assert!(
            matches!(waited, Ok(Ok(_))),
            "the provider did not receive {n} requests within {DEADLINE:?}"
        );
    }

    /// The most requests the provider held unanswered at once.
    pub fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }

    /// Lets every script waiting in [`ProviderState::released`] answer.
    pub fn release(&self) {
        self.state.released.send_replace(true);
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.release();
        self.server.abort();
    }
}

/// Counts a request out of flight when its handler ends, answered or dropped.
struct InFlight(Arc<ProviderState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn record_and_answer(
    State((state, script)): State<(Arc<ProviderState>, Answer)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let at = Instant::now();
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let _in_flight = InFlight(Arc::clone(&state));
    let n = {
        let mut requests = state.requests.lock().unwrap();
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        requests.push(Recorded {
            at,
            method,
            uri,
            headers,
            key,
            body,
        });
        requests.len()
    };
    state.received.send_replace(n);
    let refusal = state.schema.and_then(|schema| {
        let requests = state.requests.lock().unwrap();
        schema(&requests[n - 1]).err()
    });
    let reply = match refusal {
        Some((reply, why)) => {
            state.violations.lock().unwrap().push(why);
            reply
        }
        None => script(n, Arc::clone(&state)).await,
    };
    if reply.stall {
        std::future::pending::<()>().await;
    }
    let mut response = (StatusCode::from_u16(reply.status).unwrap(), reply.body).into_response();
    for (name, value) in reply.headers {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

/// Sends `message` through an `HttpTransport` over hyper-util with `codec`, once.
pub async fn send_with<C>(
    codec: C,
    message: tower_idempotency::Message,
) -> Result<tower_idempotency::Receipt, tower_idempotency::SendError>
where
    C: tower_idempotency::http::Codec,
{
    let mut transport = tower_idempotency::http::HttpTransport::new(hyper_client(), codec);
    super::send(&mut transport, message).await
}

// ---------------------------------------------------------------------------------------------
// A provider that deduplicates on the idempotency key, like Resend
// ---------------------------------------------------------------------------------------------

/// What the deduplicating provider does with a request whose key it has not taken yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Takes the message and answers 200 with its id.
    None,
    /// Takes the message, then answers 500 (a proxy that lost the answer).
    TakeThen500,
    /// Takes the message and never answers.
    TakeThenStall,
}

/// The messages a deduplicating provider took, by idempotency key: a request under a key it
/// took before is answered 200 with the first message's id and takes nothing, as Resend
/// answers a repeat of a request within its 24-hour window. Requests without a key are
/// taken each time.
#[derive(Default)]
pub struct Ledger {
    taken: Mutex<HashMap<String, String>>,
    messages: Mutex<HashMap<String, usize>>,
    faults: Mutex<VecDeque<Fault>>,
    next_id: AtomicUsize,
}

impl Ledger {
    /// A ledger whose first new messages meet `faults`, in order; later ones are taken and
    /// answered.
    pub fn new(faults: impl IntoIterator<Item = Fault>) -> Arc<Self> {
        Arc::new(Self {
            faults: Mutex::new(faults.into_iter().collect()),
            ..Self::default()
        })
    }

    /// The provider's script over this ledger.
    pub fn script(self: &Arc<Self>) -> Script {
        let ledger = Arc::clone(self);
        script(move |n, state| {
            let ledger = Arc::clone(&ledger);
            async move {
                let key = state.nth(n).and_then(|r| r.key).unwrap_or_default();
                if let Some(id) = ledger.taken(&key) {
                    return Reply::json(200, format!(r#"{{"id":"{id}"}}"#));
                }
                let fault = ledger.faults.lock().unwrap().pop_front();
                let id = format!("msg-{}", ledger.next_id.fetch_add(1, Ordering::SeqCst) + 1);
                ledger.taken.lock().unwrap().insert(key.clone(), id.clone());
                *ledger.messages.lock().unwrap().entry(key).or_default() += 1;
                match fault.unwrap_or(Fault::None) {
                    Fault::None => Reply::json(200, format!(r#"{{"id":"{id}"}}"#)),
                    Fault::TakeThen500 => Reply::json(
                        500,
                        r#"{"statusCode":500,"name":"internal_server_error","message":"oops"}"#,
                    ),
                    Fault::TakeThenStall => Reply::stall(),
                }
            }
        })
    }

    /// The id of the message taken under `key`, if one was.
    pub fn taken(&self, key: &str) -> Option<String> {
        self.taken.lock().unwrap().get(key).cloned()
    }

    /// How many messages the provider took under `key`: more than one is a duplicate.
    pub fn messages(&self, key: &str) -> usize {
        self.messages.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    /// How many messages it took in all.
    pub fn total_messages(&self) -> usize {
        self.messages.lock().unwrap().values().sum()
    }
}

// ---------------------------------------------------------------------------------------------
// The clients
// ---------------------------------------------------------------------------------------------

/// hyper-util's legacy client, with the codec's bytes wrapped in `Full`.
pub type HyperClient = MapRequest<
    Client<HttpConnector, Full<Bytes>>,
    fn(http::Request<Bytes>) -> http::Request<Full<Bytes>>,
>;

pub fn hyper_client() -> HyperClient {
    let full: fn(http::Request<Bytes>) -> http::Request<Full<Bytes>> = |r| r.map(Full::new);
    ServiceBuilder::new()
        .map_request(full)
        .service(Client::builder(TokioExecutor::new()).build_http())
}

/// reqwest 0.13's `Client` (a `Service<reqwest::Request>`) as a `Service<http::Request<Bytes>>`,
/// with its own retries and redirects off.
#[derive(Clone, Debug)]
pub struct ReqwestClient(reqwest::Client);

impl ReqwestClient {
    pub fn new() -> Self {
        let client = reqwest::Client::builder()
            .retry(reqwest::retry::never())
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .unwrap();
        Self(client)
    }
}

impl Service<http::Request<Bytes>> for ReqwestClient {
    type Response = http::Response<reqwest::Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Service::<reqwest::Request>::poll_ready(&mut self.0, cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Bytes>) -> Self::Future {
        let sent = reqwest::Request::try_from(request).map(|r| self.0.call(r));
        Box::pin(async move { Ok(http::Response::from(sent?.await?)) })
    }
}

/// Which real client a test runs over.
#[derive(Clone, Copy, Debug)]
pub enum ClientKind {
    HyperUtil,
    Reqwest,
}

pub type AnyBody = UnsyncBoxBody<Bytes, BoxError>;
pub type AnyClient = BoxCloneService<http::Request<Bytes>, http::Response<AnyBody>, BoxError>;

impl ClientKind {
    /// The client, its body and error boxed so one test body runs over both.
    pub fn client(self) -> AnyClient {
        match self {
            Self::HyperUtil => any_client(hyper_client()),
            Self::Reqwest => any_client(ReqwestClient::new()),
        }
    }
}

/// `client` with its body and error boxed, so one test body runs over any client.
pub fn any_client<S, B>(client: S) -> AnyClient
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    BoxCloneService::new(
        client
            .map_response(|r: http::Response<B>| r.map(|b| b.map_err(Into::into).boxed_unsync()))
            .map_err(Into::into),
    )
}

// ---------------------------------------------------------------------------------------------
// Servers that are not providers
// ---------------------------------------------------------------------------------------------

/// A TCP port on 127.0.0.1 that speaks neither HTTP nor TLS: every connection is answered
/// `garbage` and closed, whatever it sent.
pub async fn plain_port(garbage: &'static [u8]) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = tokio::io::AsyncWriteExt::write_all(&mut stream, garbage).await;
        }
    });
    addr
}

/// A server on 127.0.0.1 that reads each request's head whole, counts it, then resets the
/// connection without answering: the request left, the answer never came.
pub struct Resetting {
    pub addr: SocketAddr,
    read: watch::Sender<usize>,
}

impl Resetting {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let read = watch::Sender::new(0);
        let counter = read.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                if head.windows(4).any(|w| w == b"\r\n\r\n") {
                    counter.send_modify(|n| *n += 1);
                }
                // A zero linger makes the close a reset (RST), not an orderly end.
                let _ = stream.set_zero_linger();
                drop(stream);
            }
        });
        Self { addr, read }
    }

    /// How many whole request heads the server has read.
    pub fn requests_read(&self) -> usize {
        *self.read.borrow()
    }
}
