//! [`TwilioWebhook`]: Twilio's message status callbacks, signed with `X-Twilio-Signature`,
//! settle the key the callback URL's [`idempotency_digest`](crate::http::mark::KEY_DIGEST)
//! names (the [codec](crate::http::twilio::TwilioCodec::status_callback) put it there).

use std::fmt;

use hmac::{Hmac, Mac};
use sha1::Sha1;

use super::{Event, EventKind, Provider, Refused, WebhookReceiver};
use crate::http::codec::twilio::TWILIO;
use crate::http::mark::KEY_DIGEST;
use crate::outcome::BoxError;

/// The receiver of Twilio's status callbacks: a [`WebhookReceiver`] of [`TwilioEvents`].
///
/// ```
/// use tower_idempotency::http::webhook::twilio::{TwilioEvents, TwilioWebhook};
/// use tower_idempotency::MemoryStore;
///
/// // The origin Twilio calls, as the codec's `status_callback` URL names it.
/// let events = TwilioEvents::new("auth-token", "https://hooks.shop.example");
/// let receiver: TwilioWebhook<MemoryStore> = TwilioWebhook::new(MemoryStore::new(), events);
/// # let _ = receiver;
/// ```
pub type TwilioWebhook<S> = WebhookReceiver<S, TwilioEvents>;

/// Twilio's status callbacks, for a [`WebhookReceiver`].
///
/// The signature is a base64 HMAC-SHA1, keyed by the account's auth token, of the full URL
/// Twilio requested followed by each `POST` parameter's name and value, sorted by name. The
/// receiver sees only the path and query: the origin Twilio used (scheme, host, port) is
/// configured, as a proxy in front may change it.
#[derive(Clone)]
pub struct TwilioEvents {
    auth_token: String,
    origin: String,
}

impl TwilioEvents {
    /// Checks signatures with `auth_token`, for callbacks Twilio sends to `origin` (such as
    /// `https://hooks.shop.example`) and the request's path and query.
    pub fn new(auth_token: impl Into<String>, origin: impl Into<String>) -> Self {
        Self {
            auth_token: auth_token.into(),
            origin: origin.into().trim_end_matches('/').to_owned(),
        }
    }

    /// The signature Twilio sends for `url` and the `POST` parameters `params`.
    pub fn signature(&self, url: &str, params: &[(String, String)]) -> String {
        self.mac(url, params)
            .map(|mac| crate::base64::encode(&mac.finalize().into_bytes()))
            .unwrap_or_default()
    }

    /// `None` never happens: HMAC takes a key of any length.
    fn mac(&self, url: &str, params: &[(String, String)]) -> Option<Hmac<Sha1>> {
        let mut sorted: Vec<&(String, String)> = params.iter().collect();
        sorted.sort();
        let mut mac = Hmac::<Sha1>::new_from_slice(self.auth_token.as_bytes()).ok()?;
        mac.update(url.as_bytes());
        for (name, value) in sorted {
            mac.update(name.as_bytes());
            mac.update(value.as_bytes());
        }
        Some(mac)
    }
}

impl fmt::Debug for TwilioEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TwilioEvents")
            .field("auth_token", &"<redacted>")
            .field("origin", &self.origin)
            .finish()
    }
}

/// The pairs of a form-encoded body or a query.
pub(crate) fn form_pairs(text: &[u8]) -> Option<Vec<(String, String)>> {
    let text = std::str::from_utf8(text).ok()?;
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            Some((decode(name)?, decode(value)?))
        })
        .collect()
}

fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let byte = crate::hex::byte(*bytes.get(i + 1)?, *bytes.get(i + 2)?)?;
                out.push(byte);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

impl Provider for TwilioEvents {
    fn transport(&self) -> &'static str {
        TWILIO
    }

    fn authenticate(
        &self,
        parts: &http::request::Parts,
        body: &[u8],
    ) -> Result<Option<String>, Refused> {
        let signature = parts
            .headers
            .get("x-twilio-signature")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| crate::base64::decode(v.trim()))
            .ok_or(Refused::BadSignature)?;
        let params = form_pairs(body).ok_or(Refused::BadSignature)?;
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let url = format!("{}{path}", self.origin);
        // `verify_slice` compares in constant time.
        self.mac(&url, &params)
            .ok_or(Refused::BadSignature)?
            .verify_slice(&signature)
            .map_err(|_| Refused::BadSignature)?;
        // Twilio gives no delivery id: a repeated callback settles nothing twice anyway.
        Ok(None)
    }

    fn event(&self, parts: &http::request::Parts, body: &[u8]) -> Result<Option<Event>, BoxError> {
        let params = form_pairs(body).ok_or("the callback is not a form")?;
        let get = |name: &str| {
            params
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let sid = get("MessageSid").ok_or("the callback names no MessageSid")?;
        let status = get("MessageStatus").ok_or("the callback names no MessageStatus")?;
        let kind = match status {
            "accepted"
            | "scheduled"
            | "queued"
            | "sending"
            | "sent"
            | "delivered"
            | "undelivered"
            | "read"
            | "partially_delivered" => EventKind::Took,
            "failed" | "canceled" => EventKind::FailedBeforeSending,
            _ => return Ok(None),
        };
        let query = parts.uri.query().unwrap_or_default();
        let digest = form_pairs(query.as_bytes())
            .and_then(|pairs| pairs.into_iter().find(|(n, _)| n == KEY_DIGEST))
            .map(|(_, v)| v);
        Ok(digest.map(|digest| Event::new(digest, sid, kind)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twilios_published_example_signs_as_documented() {
        let events = TwilioEvents::new("12345", "https://mycompany.com");
        let params: Vec<(String, String)> = [
            ("CallSid", "CA1234567890ABCDE"),
            ("Caller", "+12349013030"),
            ("Digits", "1234"),
            ("From", "+12349013030"),
            ("To", "+18005551212"),
        ]
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect();
        assert_eq!(
            events.signature("https://mycompany.com/myapp.php?foo=1&bar=2", &params),
            "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
        );
    }
}
