//! A fake HTTP provider on 127.0.0.1:0 that records every request, and the two real clients
//! (hyper-util's legacy client, reqwest) as `Service<http::Request<Bytes>>`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
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

/// What the fake provider answers.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    /// Never answers (the request is recorded first).
    pub stall: bool,
}

impl Reply {
    pub fn new(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
            stall: false,
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub fn stall() -> Self {
        Self {
            stall: true,
            ..Self::new(200, "")
        }
    }
}

/// A request as the provider received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
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

struct Shared {
    replies: Vec<Reply>,
    requests: Mutex<Vec<Recorded>>,
    count: watch::Sender<usize>,
}

/// A provider that answers the n-th request with the n-th reply (the last one repeats).
pub struct FakeProvider {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FakeProvider {
    pub async fn start(replies: Vec<Reply>) -> Self {
        assert!(!replies.is_empty());
        let shared = Arc::new(Shared {
            replies,
            requests: Mutex::new(Vec::new()),
            count: watch::Sender::new(0),
        });
        let app = Router::new()
            .fallback(record_and_reply)
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, shared }
    }

    pub async fn answering(reply: Reply) -> Self {
        Self::start(vec![reply]).await
    }

    pub fn base_url(&self) -> http::Uri {
        format!("http://{}", self.addr).parse().unwrap()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Waits until the provider has received `n` requests.
    pub async fn received(&self, n: usize) {
        let mut count = self.shared.count.subscribe();
        count.wait_for(|c| *c >= n).await.unwrap();
    }
}

async fn record_and_reply(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let n = {
        let mut requests = shared.requests.lock().unwrap();
        requests.push(Recorded {
            method,
            uri,
            headers,
            body,
        });
        requests.len()
    };
    shared.count.send_replace(n);
    let reply = shared.replies[(n - 1).min(shared.replies.len() - 1)].clone();
    if reply.stall {
        std::future::pending::<()>().await;
    }
    let mut response = (StatusCode::from_u16(reply.status).unwrap(), reply.body).into_response();
    for (name, value) in reply.headers {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

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
        fn boxed<B>(response: http::Response<B>) -> http::Response<AnyBody>
        where
            B: http_body::Body<Data = Bytes> + Send + 'static,
            B::Error: Into<BoxError>,
        {
            response.map(|b| b.map_err(Into::into).boxed_unsync())
        }
        match self {
            Self::HyperUtil => BoxCloneService::new(
                hyper_client()
                    .map_response(boxed)
                    .map_err(|e| -> BoxError { Box::new(e) }),
            ),
            Self::Reqwest => BoxCloneService::new(ReqwestClient::new().map_response(boxed)),
        }
    }
}
