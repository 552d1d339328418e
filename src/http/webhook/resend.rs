//! [`ResendWebhook`]: Resend's events (`email.sent`, `email.delivered`, …), signed by Svix,
//! settle the key the message's [`idempotency_digest`](crate::http::mark::KEY_DIGEST) tag
//! names.

use std::time::SystemTime;

use serde::Deserialize;
use serde_json::Value;

use super::svix::SvixSecret;
use super::{Event, EventKind, Provider, Refused, WebhookReceiver};
use crate::http::codec::resend::RESEND;
use crate::http::mark::KEY_DIGEST;
use crate::outcome::BoxError;

/// The receiver of Resend's webhook: a [`WebhookReceiver`] of [`ResendEvents`].
///
/// ```
/// use tower_idempotency::http::webhook::resend::{ResendEvents, ResendWebhook};
/// use tower_idempotency::MemoryStore;
///
/// let events = ResendEvents::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// let receiver: ResendWebhook<MemoryStore> = ResendWebhook::new(MemoryStore::new(), events);
/// // axum: Router::new().route_service("/webhooks/resend", receiver)
/// # let _ = receiver;
/// # Ok::<(), tower_idempotency::BoxError>(())
/// ```
pub type ResendWebhook<S> = WebhookReceiver<S, ResendEvents>;

/// Resend's webhook, for a [`WebhookReceiver`]: Svix signatures, and the events that settle.
#[derive(Clone, Debug)]
pub struct ResendEvents {
    secret: SvixSecret,
}

impl ResendEvents {
    /// Checks signatures with the endpoint's signing secret (`whsec_…`).
    ///
    /// # Errors
    /// When the secret is not `whsec_` and base64.
    pub fn new(signing_secret: &str) -> Result<Self, BoxError> {
        Ok(Self {
            secret: SvixSecret::new(signing_secret)?,
        })
    }

    /// Checks with `secret` (a tolerance of your own).
    pub fn with_secret(secret: SvixSecret) -> Self {
        Self { secret }
    }
}

#[derive(Deserialize)]
struct Payload {
    #[serde(rename = "type")]
    kind: String,
    data: Data,
}

#[derive(Deserialize)]
struct Data {
    email_id: String,
    #[serde(default)]
    tags: Value,
}

/// The value of the tag named `name`, whether Resend writes the tags as an object
/// (`{"name": "value"}`) or as a list (`[{"name", "value"}]`).
fn tag<'a>(tags: &'a Value, name: &str) -> Option<&'a str> {
    match tags {
        Value::Object(map) => map.get(name)?.as_str(),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some(name))?
            .get("value")?
            .as_str(),
        _ => None,
    }
}

impl Provider for ResendEvents {
    fn transport(&self) -> &'static str {
        RESEND
    }

    fn authenticate(
        &self,
        parts: &http::request::Parts,
        body: &[u8],
    ) -> Result<Option<String>, Refused> {
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .ok_or(Refused::BadSignature)
        };
        let id = header("svix-id")?;
        let timestamp = header("svix-timestamp")?;
        let signatures = header("svix-signature")?;
        self.secret
            .verify(id, timestamp, body, signatures, SystemTime::now())?;
        Ok(Some(id.to_owned()))
    }

    fn event(&self, _parts: &http::request::Parts, body: &[u8]) -> Result<Option<Event>, BoxError> {
        let payload: Payload = serde_json::from_slice(body)?;
        let kind = match payload.kind.as_str() {
            "email.sent"
            | "email.delivered"
            | "email.delivery_delayed"
            | "email.bounced"
            | "email.complained"
            | "email.opened"
            | "email.clicked" => EventKind::Took,
            "email.failed" => EventKind::FailedBeforeSending,
            _ => return Ok(None),
        };
        let Some(digest) = tag(&payload.data.tags, KEY_DIGEST) else {
            return Ok(None);
        };
        Ok(Some(Event::new(digest, payload.data.email_id, kind)))
    }
}
