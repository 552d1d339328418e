//! [`PostmarkWebhook`]: Postmark's events (`Delivery`, `Bounce`, `SpamComplaint`, `Open`,
//! `Click`) settle the key the message's `Metadata`
//! [`idempotency_digest`](crate::http::mark::KEY_DIGEST) names. Postmark signs nothing: it
//! documents HTTP Basic credentials in the webhook's URL (`https://user:password@host/path`),
//! which it sends as `Authorization: Basic`, and an IP allow-list.

use std::collections::HashMap;
use std::fmt;

use serde::Deserialize;

use super::{Event, EventKind, Provider, Refused, WebhookReceiver, constant_time_eq};
use crate::http::codec::postmark::POSTMARK;
use crate::http::mark::KEY_DIGEST;
use crate::outcome::BoxError;

/// The receiver of Postmark's webhook: a [`WebhookReceiver`] of [`PostmarkEvents`].
///
/// ```
/// use tower_idempotency::http::webhook::postmark::{PostmarkEvents, PostmarkWebhook};
/// use tower_idempotency::MemoryStore;
///
/// // The webhook's URL at Postmark: https://hooks:long-random-password@hooks.shop.example/postmark
/// let events = PostmarkEvents::new("hooks", "long-random-password");
/// let receiver: PostmarkWebhook<MemoryStore> = PostmarkWebhook::new(MemoryStore::new(), events);
/// # let _ = receiver;
/// ```
pub type PostmarkWebhook<S> = WebhookReceiver<S, PostmarkEvents>;

/// Postmark's webhook, for a [`WebhookReceiver`]: Basic credentials, and the events that
/// settle.
#[derive(Clone)]
pub struct PostmarkEvents {
    expected: String,
}

impl PostmarkEvents {
    /// Accepts requests carrying `user` and `password` (HTTP Basic), as the webhook's URL at
    /// Postmark names them.
    pub fn new(user: &str, password: &str) -> Self {
        Self {
            expected: format!(
                "Basic {}",
                crate::base64::encode(format!("{user}:{password}").as_bytes())
            ),
        }
    }
}

impl fmt::Debug for PostmarkEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostmarkEvents")
            .field("credentials", &"<redacted>")
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Payload {
    record_type: String,
    #[serde(rename = "MessageID")]
    message_id: String,
    #[serde(default)]
    metadata: HashMap<String, String>,
}

impl Provider for PostmarkEvents {
    fn transport(&self) -> &'static str {
        POSTMARK
    }

    fn authenticate(
        &self,
        parts: &http::request::Parts,
        _body: &[u8],
    ) -> Result<Option<String>, Refused> {
        let given = parts
            .headers
            .get(http::header::AUTHORIZATION)
            .map(http::HeaderValue::as_bytes)
            .ok_or(Refused::BadSignature)?;
        if constant_time_eq(given, self.expected.as_bytes()) {
            Ok(None)
        } else {
            Err(Refused::BadSignature)
        }
    }

    fn event(&self, _parts: &http::request::Parts, body: &[u8]) -> Result<Option<Event>, BoxError> {
        let payload: Payload = serde_json::from_slice(body)?;
        let kind = match payload.record_type.as_str() {
            "Delivery" | "Bounce" | "SpamComplaint" | "Open" | "Click" => EventKind::Took,
            _ => return Ok(None),
        };
        Ok(payload
            .metadata
            .get(KEY_DIGEST)
            .map(|digest| Event::new(digest.clone(), payload.message_id, kind)))
    }
}
