//! A fake Twilio Messages list: `GET /2010-04-01/Accounts/{sid}/Messages.json`, filtered by
//! `To` and `From`, newest first, `PageSize` a page, with `next_page_uri` as Twilio writes it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use serde_json::{Value, json};

#[derive(Clone, Debug)]
pub struct Sms {
    pub sid: String,
    pub to: String,
    pub from: String,
    pub body: String,
    pub status: &'static str,
}

#[derive(Default)]
pub struct Inner {
    pub messages: Mutex<Vec<Sms>>,
    pub requests: AtomicUsize,
}

#[derive(Clone)]
pub struct TwilioList {
    pub addr: SocketAddr,
    pub inner: Arc<Inner>,
}

impl TwilioList {
    pub async fn start() -> Self {
        let inner = Arc::new(Inner::default());
        let app = Router::new()
            .route("/2010-04-01/Accounts/{sid}/Messages.json", get(list))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, inner }
    }

    pub fn base_url(&self) -> http::Uri {
        format!("http://{}", self.addr).parse().unwrap()
    }

    pub fn push(&self, to: &str, from: &str, body: &str, status: &'static str) -> String {
        let mut messages = self.inner.messages.lock().unwrap();
        let sid = format!("SM{:032x}", messages.len());
        messages.push(Sms {
            sid: sid.clone(),
            to: to.into(),
            from: from.into(),
            body: body.into(),
            status,
        });
        sid
    }

    pub fn requests(&self) -> usize {
        self.inner.requests.load(Ordering::SeqCst)
    }
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

async fn list(State(inner): State<Arc<Inner>>, uri: axum::http::Uri) -> String {
    inner.requests.fetch_add(1, Ordering::SeqCst);
    let query = uri.query().unwrap_or_default().to_owned();
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('=').map(decode))
    };
    let size: usize = param("PageSize").map_or(50, |s| s.parse().unwrap());
    let page: usize = param("Page").map_or(0, |s| s.parse().unwrap());
    let (to, from) = (param("To"), param("From"));
    let messages = inner.messages.lock().unwrap();
    let matching: Vec<&Sms> = messages
        .iter()
        .rev()
        .filter(|m| to.as_ref().is_none_or(|t| &m.to == t))
        .filter(|m| from.as_ref().is_none_or(|f| &m.from == f))
        .collect();
    let start = page * size;
    let end = (start + size).min(matching.len());
    let data: Vec<Value> = matching[start.min(end)..end]
        .iter()
        .map(|m| {
            json!({
                "sid": m.sid, "to": m.to, "from": m.from, "body": m.body, "status": m.status,
                "direction": "outbound-api",
                "date_created": httpdate::fmt_http_date(std::time::SystemTime::now()).replace("GMT", "+0000"),
            })
        })
        .collect();
    let next = (end < matching.len()).then(|| {
        format!(
            "{}?{}&Page={}",
            uri.path(),
            query.split("&Page=").next().unwrap(),
            page + 1
        )
    });
    json!({ "messages": data, "next_page_uri": next, "page": page, "page_size": size }).to_string()
}
