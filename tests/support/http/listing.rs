//! A fake Resend that keeps what it took and lists it as Resend's `GET /emails` does (newest
//! first, `limit` up to 100, paged with `after`), counting every request by route. What it
//! does with the next `POST /emails` is scripted ([`OnSend`]); by default it takes the message
//! and answers its id.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use bytes::Bytes;
use serde_json::{Value, json};

/// What the fake does with a `POST /emails`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnSend {
    /// Takes the message and answers 200 with its id.
    Answer,
    /// Takes the message, then answers 500: the client cannot tell it went.
    TakeThen500,
    /// Answers 500 without taking it.
    Only500,
    /// Takes the message and answers only after a minute: the client times out.
    TakeThenHang,
}

/// One email the fake took.
#[derive(Clone, Debug)]
pub struct Taken {
    pub id: String,
    pub message_id: Option<String>,
    pub tags: Vec<(String, String)>,
    pub created_at: String,
}

#[derive(Default)]
pub struct Inner {
    pub taken: Mutex<Vec<Taken>>,
    pub script: Mutex<VecDeque<OnSend>>,
    pub sends: AtomicUsize,
    pub listings: AtomicUsize,
}

/// The fake, serving on 127.0.0.1.
#[derive(Clone)]
pub struct ListingResend {
    pub addr: SocketAddr,
    pub inner: Arc<Inner>,
}

impl ListingResend {
    pub async fn start() -> Self {
        let inner = Arc::new(Inner::default());
        let app = Router::new()
            .route("/emails", get(list).post(send))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, inner }
    }

    pub fn base_url(&self) -> http::Uri {
        format!("http://{}", self.addr).parse().unwrap()
    }

    /// What the next `POST /emails` do, in order.
    pub fn script(&self, takes: impl IntoIterator<Item = OnSend>) {
        self.inner.script.lock().unwrap().extend(takes);
    }

    /// `POST /emails` received.
    pub fn sends(&self) -> usize {
        self.inner.sends.load(Ordering::SeqCst)
    }

    /// `GET /emails` received.
    pub fn listings(&self) -> usize {
        self.inner.listings.load(Ordering::SeqCst)
    }

    pub fn taken(&self) -> Vec<Taken> {
        self.inner.taken.lock().unwrap().clone()
    }

    /// Takes an email marked with the digest of `stored_key`, as the codec marks it: what a
    /// process that crashed after its send left at the provider. Answers its id.
    pub fn take_marked(&self, stored_key: &str) -> String {
        let digest = tower_idempotency::http::mark::key_digest(stored_key);
        let mut taken = self.inner.taken.lock().unwrap();
        let id = format!("re-{}", taken.len());
        taken.push(Taken {
            id: id.clone(),
            message_id: Some(format!("<ti-{digest}@shop.example>")),
            tags: vec![("idempotency_digest".into(), digest)],
            created_at: resend_time(SystemTime::now()),
        });
        id
    }

    /// Takes an email as if sent by someone else (no mark).
    pub fn take_unmarked(&self, n: usize) {
        let mut taken = self.inner.taken.lock().unwrap();
        for _ in 0..n {
            let id = format!("other-{}", taken.len());
            taken.push(Taken {
                id,
                message_id: None,
                tags: Vec::new(),
                created_at: resend_time(SystemTime::now()),
            });
        }
    }
}

async fn send(
    State(inner): State<Arc<Inner>>,
    _headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    inner.sends.fetch_add(1, Ordering::SeqCst);
    let take = inner
        .script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or(OnSend::Answer);
    let email: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = {
        let mut taken = inner.taken.lock().unwrap();
        let id = format!("re-{}", taken.len());
        if take != OnSend::Only500 {
            let tags = email["tags"]
                .as_array()
                .map(|tags| {
                    tags.iter()
                        .map(|t| {
                            (
                                t["name"].as_str().unwrap_or_default().to_owned(),
                                t["value"].as_str().unwrap_or_default().to_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            taken.push(Taken {
                id: id.clone(),
                message_id: email["headers"]["Message-ID"].as_str().map(str::to_owned),
                tags,
                created_at: resend_time(SystemTime::now()),
            });
        }
        id
    };
    if take == OnSend::TakeThenHang {
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    }
    match take {
        OnSend::Answer => (StatusCode::OK, json!({ "id": id }).to_string()),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"name": "internal_server_error", "message": "oops"}).to_string(),
        ),
    }
}

async fn list(State(inner): State<Arc<Inner>>, uri: axum::http::Uri) -> (StatusCode, String) {
    inner.listings.fetch_add(1, Ordering::SeqCst);
    let param = |name: &str| {
        uri.query().unwrap_or_default().split('&').find_map(|pair| {
            pair.strip_prefix(name)?
                .strip_prefix('=')
                .map(str::to_owned)
        })
    };
    let limit = match param("limit").map(|l| l.parse::<usize>()) {
        None => 20,
        Some(Ok(limit)) => limit,
        Some(Err(_)) => {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                r#"{"name":"validation_error"}"#.into(),
            );
        }
    };
    let after = param("after");
    if !(1..=100).contains(&limit) {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            r#"{"name":"validation_error"}"#.into(),
        );
    }
    let taken = inner.taken.lock().unwrap();
    let newest_first: Vec<&Taken> = taken.iter().rev().collect();
    let start = match &after {
        Some(after) => match newest_first.iter().position(|t| &t.id == after) {
            Some(i) => i + 1,
            None => {
                return (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    r#"{"name":"validation_error"}"#.into(),
                );
            }
        },
        None => 0,
    };
    let end = (start + limit).min(newest_first.len());
    let data: Vec<Value> = newest_first[start..end]
        .iter()
        .map(|t| {
            json!({
                "object": "email",
                "id": t.id,
                "message_id": t.message_id.clone().unwrap_or_else(|| format!("<{}@resend.dev>", t.id)),
                "to": ["seller@example.com"],
                "from": "hello@shop.example",
                "created_at": t.created_at,
                "subject": "New order",
                "last_event": "delivered",
            })
        })
        .collect();
    let body = json!({ "object": "list", "has_more": end < newest_first.len(), "data": data });
    (StatusCode::OK, body.to_string())
}

/// A time as Resend writes `created_at`: `2023-04-03 22:13:42.674981+00`.
pub fn resend_time(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap();
    let secs = since.as_secs() as i64;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:06}+00",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_micros()
    )
}
