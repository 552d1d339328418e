//! The mark a codec puts on what it sends, so that a lookup or a webhook can find the stored
//! key again: a digest of the stored key ([`key_digest`]), never the key itself (a key may
//! hold an order number or an address, and the provider's dashboard shows its tags and
//! metadata to anyone with access).
//!
//! | provider | where the digest goes | who reads it |
//! |---|---|---|
//! | Resend | a tag named [`KEY_DIGEST`], and the `Message-ID` header `<ti-{digest}@{sender's domain}>` when the message sets none of its own | the webhook (its events carry the tags), the lookup (`GET /emails` lists `message_id`, not tags) |
//! | Postmark | the `Metadata` entry [`KEY_DIGEST`] | the lookup (message search filters on metadata), the webhook (its events carry the metadata) |
//! | Amazon SES | the message tag [`KEY_DIGEST`] (beside the codec's own `idempotency-key` tag) | the SNS receiver (SES writes a message's tags into every event, `mail.tags`); no lookup: SES lists nothing it sent |
//! | Twilio | the query parameter [`KEY_DIGEST`] of the `StatusCallback` URL, when the codec has one | the webhook (Twilio calls that URL back); the Messages resource has no field of the sender's, so the lookup matches by `To`, `From` and `Body` |

use sha2::{Digest, Sha256};

/// The name of the tag (Resend, Amazon SES), metadata entry (Postmark) and query parameter (Twilio's
/// `StatusCallback`) that carries [`key_digest`]: 18 characters of Resend's tag charset
/// (ASCII letters, digits, `_`), short enough for a Postmark metadata name.
pub const KEY_DIGEST: &str = "idempotency_digest";

/// The digest of a stored key as the codecs mark messages with it: 32 lowercase hex digits
/// (the first 128 bits of a SHA-256 of the key, in a domain of its own), within every
/// provider's rules for tags, metadata values and URL query values.
///
/// ```
/// use tower_idempotency::http::mark::key_digest;
///
/// let digest = key_digest("alerts:order.created:ord_1:email");
/// assert_eq!(digest.len(), 32);
/// assert_eq!(digest, key_digest("alerts:order.created:ord_1:email"));
/// assert_ne!(digest, key_digest("alerts:order.created:ord_2:email"));
/// ```
pub fn key_digest(stored_key: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(b"tower-idempotency/mark/v1\0");
    hash.update(stored_key.as_bytes());
    let hash = hash.finalize();
    let mut out = String::with_capacity(32);
    for byte in &hash[..16] {
        let [high, low] = crate::hex::pair(*byte);
        out.push(char::from(high));
        out.push(char::from(low));
    }
    out
}

/// The `Message-ID` a Resend message is marked with: `<ti-{digest}@{domain}>`, the domain
/// taken from the sender's address (`idempotency.invalid` when it has none).
pub(crate) fn message_id(digest: &str, from: &str) -> String {
    let address = from
        .rsplit_once('<')
        .map_or(from, |(_, rest)| rest.trim_end_matches('>'));
    let domain = address
        .rsplit_once('@')
        .map(|(_, domain)| domain.trim())
        .filter(|d| {
            !d.is_empty()
                && d.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        })
        .unwrap_or("idempotency.invalid");
    format!("<ti-{digest}@{domain}>")
}

/// The digest a `Message-ID` made by [`message_id`] carries, if it is one.
pub(crate) fn digest_of_message_id(message_id: &str) -> Option<&str> {
    let id = message_id.trim().trim_start_matches('<');
    let digest = id.strip_prefix("ti-")?.split('@').next()?;
    (digest.len() == 32 && digest.bytes().all(|b| b.is_ascii_hexdigit())).then_some(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_id_carries_the_digest_under_the_senders_domain() {
        let digest = key_digest("k");
        let id = message_id(&digest, "Shop <hello@shop.example>");
        assert_eq!(id, format!("<ti-{digest}@shop.example>"));
        assert_eq!(digest_of_message_id(&id), Some(digest.as_str()));
        assert_eq!(
            digest_of_message_id(id.trim_matches(['<', '>'])),
            Some(digest.as_str())
        );
        assert!(message_id(&digest, "no address").ends_with("@idempotency.invalid>"));
        assert_eq!(
            digest_of_message_id("<202301010000.4ef9a417@email.example.com>"),
            None
        );
    }
}
