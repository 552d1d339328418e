//! Webhook receivers that settle keys: per provider, a tower
//! `Service<http::Request<B>>` (any [`http_body::Body`]: axum's, hyper's `Incoming`,
//! `Full<Bytes>`) that mounts in axum (`Router::route_service`) or hyper, checks the
//! provider's signature before it reads anything else, and settles the key the event names.
//!
//! | provider | receiver | authenticity | events that settle as delivered | events that free the key |
//! |---|---|---|---|---|
//! | Resend | [`ResendWebhook`](resend::ResendWebhook) | Svix: `svix-id`, `svix-timestamp`, `svix-signature` (`v1,<base64>` HMAC-SHA256 over `{id}.{timestamp}.{body}` with the `whsec_` secret), timestamps within [`SVIX_TOLERANCE`](svix::SVIX_TOLERANCE) (5 min), a redelivered `svix-id` answered without acting twice | `email.sent`, `email.delivered`, `email.delivery_delayed`, `email.bounced`, `email.complained`, `email.opened`, `email.clicked` | `email.failed` |
//! | Twilio | [`TwilioWebhook`](twilio::TwilioWebhook) | `X-Twilio-Signature`: base64 HMAC-SHA1 over the URL and the sorted form parameters, keyed by the auth token | `MessageStatus` `accepted`, `scheduled`, `queued`, `sending`, `sent`, `delivered`, `undelivered`, `read`, `partially_delivered` | `failed`, `canceled` |
//! | Postmark | [`PostmarkWebhook`](postmark::PostmarkWebhook) | HTTP Basic credentials you put in the webhook's URL (Postmark signs nothing) | `Delivery`, `Bounce`, `SpamComplaint`, `Open`, `Click` | none: Postmark refuses at send time |
//!
//! | Amazon SES through SNS (feature `ses`) | `ses::SesWebhook` | SNS's RSA signature (`SignatureVersion` 1, SHA-1, or 2, SHA-256) checked against the certificate you configure (never fetched) while it is valid (`notBefore`/`notAfter`), the configured `TopicArn`, a `Timestamp` within `ses::SNS_TOLERANCE` (1 h), a redelivered `MessageId` acted on once | `Send`, `Delivery`, `Bounce`, `Complaint`, `DeliveryDelay`, `Open`, `Click` | `Reject`, `Rendering Failure` |
//!
//! A bounce or a complaint still proves the provider took the message: its key is settled as
//! delivered, so the message is never sent again under it.
//!
//! | the request | the answer | the store |
//! |---|---|---|
//! | not a `POST` | 405 | untouched |
//! | a body longer than [`max_body`](WebhookReceiver::max_body) (default [`DEFAULT_MAX_BODY`]) | 413 | untouched |
//! | a missing or wrong signature, a timestamp outside the tolerance, another SNS topic | 401 | untouched |
//! | an event already handled (the same `svix-id`) | 200 | untouched |
//! | a body that does not parse, after a good signature | 400 | untouched |
//! | an event of no interest, or about no unsettled key of this store | 200 | untouched |
//! | an event about a key of unknown delivery, or pending with its lease passed | 200 | settled |
//! | an event about a key a live send holds, or that holds an outcome | 200 | untouched (the send settles its own) |
//! | the store fails | 503 (the provider delivers it again) | as it was |
//!
//! An event about a key a live send still holds is remembered (only events proving the
//! provider took the message): should that send end of unknown delivery, the
//! [`verifier`](WebhookReceiver::verifier) answers the reconciler from it, asked before a
//! lookup with [`FirstKnown`].
//!
//! Every answer is counted ([`WebhookStats`]). An event finds its key by the digest the codec
//! marked the message with ([`mark`](super::mark)): the receiver lists the store's unsettled
//! keys (as the reconciler does) when a digest is new to it.

pub mod postmark;
mod receiver;
pub mod resend;
#[cfg(feature = "ses")]
pub mod ses;
mod settle;
pub mod svix;
pub mod twilio;
mod verifier;

pub use receiver::{DEFAULT_MAX_BODY, Provider, Refused, WebhookReceiver, WebhookStats};
pub use settle::{Event, EventKind};
pub use verifier::{FirstKnown, WebhookVerifier};

/// Whether `a` and `b` are equal, in time that depends on their lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
