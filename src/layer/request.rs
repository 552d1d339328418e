//! [`IdempotentRequest`]: what the layer asks of a request it deduplicates.

use std::sync::Arc;

use crate::fingerprint::Fingerprinted;
use crate::message::{Message, RawMessage};

/// A request the layer can deduplicate: it says its own idempotency key, its
/// [fingerprint](Fingerprinted), and the recipients a kept receipt points into.
///
/// [`Message`] and [`RawMessage`] implement it; so can your own request types, for a provider
/// client that is a `Service<YourRequest>`. Fingerprint them through the crate's canonical
/// [`Encoder`](crate::fingerprint::Encoder), under a domain of your own, so two different
/// requests never share a fingerprint. A key function set on the builder
/// ([`key_for`](super::IdempotencyLayerBuilder::key_for)) overrides the request's own key.
///
/// ```
/// use tower::{Service, ServiceBuilder, ServiceExt};
/// use tower_idempotency::fingerprint::{Encoder, Fingerprint, Fingerprinted};
/// use tower_idempotency::layer::IdempotentRequest;
/// use tower_idempotency::{BoxError, IdempotencyLayer, Receipt};
///
/// /// A push notification, keyed by the event that caused it.
/// #[derive(Clone)]
/// struct Push {
///     event_id: String,
///     device: String,
///     text: String,
/// }
///
/// impl Fingerprinted for Push {
///     fn fingerprint(&self) -> Fingerprint {
///         // Every field that makes it another notification; not the key.
///         let mut e = Encoder::new("my-app/push/v1");
///         e.str(&self.device).str(&self.text);
///         e.finish()
///     }
/// }
///
/// impl IdempotentRequest for Push {
///     fn idempotency_key(&self) -> Option<&str> {
///         Some(&self.event_id)
///     }
///     fn recipients(&self) -> Vec<&str> {
///         vec![&self.device]
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), BoxError> {
/// let push_service = tower::service_fn(|push: Push| async move {
///     Ok::<_, BoxError>(Receipt::new(format!("push-{}", push.event_id), "fcm"))
/// });
/// let mut service = ServiceBuilder::new()
///     .layer(IdempotencyLayer::in_memory())
///     .service(push_service);
///
/// let push = Push { event_id: "order.shipped:42".into(), device: "dev-7".into(), text: "On its way".into() };
/// let first = service.ready().await?.call(push.clone()).await?;
/// let again = service.ready().await?.call(push).await?;
/// assert_eq!(first.id, again.id);
/// assert!(again.replayed);
/// # Ok(()) }
/// ```
pub trait IdempotentRequest: Fingerprinted + Clone + Send + Sync + 'static {
    /// The request's own idempotency key; `None` sends it without deduplication.
    ///
    /// The layer checks it like [`IdempotencyKey`](crate::IdempotencyKey) (1 to 256 bytes, no
    /// control characters) and refuses a bad one with `idempotency.invalid_key`, unsent.
    fn idempotency_key(&self) -> Option<&str>;

    /// Every recipient, in a fixed order: a kept receipt's accepted recipients are stored as
    /// positions in this list (never as addresses), and restored from it on a replay.
    ///
    /// The default is none: a replayed receipt then has no accepted recipients.
    fn recipients(&self) -> Vec<&str> {
        Vec::new()
    }

    /// This request, told the key the layer reserved for it: its stored key (after the key
    /// function and the namespace, see
    /// [`IdempotencyLayer::stored_key_for`](super::IdempotencyLayer::stored_key_for)), or
    /// `None` when the layer sends it unkeyed (no key, or a key function that answered
    /// `None`). The layer calls it just before it hands the request to the inner service, so
    /// a provider client can send the provider the very key the store holds, and none for an
    /// unkeyed send.
    ///
    /// The key is the layer's own `Arc`: clone it to keep it, sharing rather than copying.
    /// The default ignores it. [`Message`] keeps it for its transport
    /// ([`Message::provider_key`]).
    #[must_use]
    fn with_stored_key(self, key: Option<&Arc<str>>) -> Self {
        let _ = key;
        self
    }
}

/// The message's own key, `to`, `cc` and `bcc` in order.
impl IdempotentRequest for Message {
    fn idempotency_key(&self) -> Option<&str> {
        Message::idempotency_key(self).map(|key| key.as_str())
    }

    fn recipients(&self) -> Vec<&str> {
        Message::recipients(self).collect()
    }

    fn with_stored_key(self, key: Option<&Arc<str>>) -> Self {
        self.with_provider_key(key)
    }
}

/// No key of its own: only [`raw_key`](super::IdempotencyLayerBuilder::raw_key) gives it one.
/// Its recipients are the envelope's.
impl IdempotentRequest for RawMessage {
    fn idempotency_key(&self) -> Option<&str> {
        None
    }

    fn recipients(&self) -> Vec<&str> {
        self.envelope().to().iter().map(String::as_str).collect()
    }
}
