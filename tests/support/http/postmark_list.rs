//! A fake Postmark outbound message search: `GET /messages/outbound?count=…&offset=…`,
//! newest first, answering `TotalCount` and `Messages` with their `Metadata`, as Postmark's
//! messages API documents it. `count` above 500 or `count + offset` above 10,000 is refused.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use serde_json::json;

#[derive(Default)]
pub struct Inner {
    /// (MessageID, digest), oldest first.
    pub messages: Mutex<Vec<(String, Option<String>)>>,
    pub requests: AtomicUsize,
}

#[derive(Clone)]
pub struct PostmarkList {
    pub addr: SocketAddr,
    pub inner: Arc<Inner>,
}

impl PostmarkList {
    pub async fn start() -> Self {
        let inner = Arc::new(Inner::default());
        let app = Router::new()
            .route("/messages/outbound", get(list))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, inner }
    }

    pub fn base_url(&self) -> http::Uri {
        format!("http://{}", self.addr).parse().unwrap()
    }

    pub fn push(&self, digest: Option<String>) -> String {
        let mut messages = self.inner.messages.lock().unwrap();
        let id = format!("0ac29aee-e1cd-480d-b08d-{:012}", messages.len());
        messages.push((id.clone(), digest));
        id
    }

    pub fn requests(&self) -> usize {
        self.inner.requests.load(Ordering::SeqCst)
    }
}

async fn list(State(inner): State<Arc<Inner>>, uri: axum::http::Uri) -> (StatusCode, String) {
    inner.requests.fetch_add(1, Ordering::SeqCst);
    let query = uri.query().unwrap_or_default().to_owned();
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse::<usize>().ok())
    };
    let (Some(count), Some(offset)) = (param("count"), param("offset")) else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            r#"{"ErrorCode":402}"#.into(),
        );
    };
    if count > 500 || count + offset > 10_000 {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            r#"{"ErrorCode":402}"#.into(),
        );
    }
    let messages = inner.messages.lock().unwrap();
    let newest_first: Vec<_> = messages.iter().rev().collect();
    let start = offset.min(newest_first.len());
    let end = (offset + count).min(newest_first.len());
    let page: Vec<_> = newest_first[start..end]
        .iter()
        .map(|(id, digest)| {
            let metadata = match digest {
                Some(d) => json!({ "idempotency_digest": d, "color": "blue" }),
                None => json!({}),
            };
            json!({
                "MessageID": id,
                "Status": "Sent",
                "ReceivedAt": "2099-01-01T00:00:00.0000000-05:00",
                "MessageStream": "outbound",
                "Metadata": metadata,
            })
        })
        .collect();
    let body = json!({ "TotalCount": newest_first.len(), "Messages": page });
    (StatusCode::OK, body.to_string())
}
