//! Verification: the question a service of yours answers about one key, "did the provider
//! take this message?" ([`Verify`]), and its answer ([`Verified`]).
//!
//! Two parts of the crate ask it, with the same service: the
//! [`Reconciler`](crate::reconcile::Reconciler), about the keys kept with an outcome of
//! unknown delivery, and the layer, about a key a send takes over from a crashed holder,
//! before that send
//! ([`verify_takeovers`](crate::IdempotencyLayerBuilder::verify_takeovers)). The types are
//! plain data, so both can name them without importing each other.

use crate::fingerprint::Fingerprint;
use crate::outcome::Receipt;
use crate::store::admin::{Expiry, Inspected, KeyState};

/// "Did you take this message?": what a verification service is asked about one key.
///
/// A verification service is any tower `Service<Verify, Response = Verified>` the user
/// supplies: it looks the message up at the provider (a message listing filtered on the
/// `Idempotency-Key` header, a metadata tag the client set on send, the provider's own
/// idempotency records) and answers what it found.
///
/// # Raw and hashed keys
///
/// [`stored_key`](Self::stored_key) is the key as the layer keeps it in the store
/// (`namespace:key`, or `namespace:h1:<64 hex digits>` with
/// [`KeyForm::Hashed`](crate::layer::KeyForm::Hashed)). [`raw_key`](Self::raw_key) is the
/// key the message carried, known only for raw keys when the reconciler was given the
/// layer's [`StoredKeys`](crate::layer::StoredKeys). A hashed store never knew the raw key:
/// a verification service for hashed keys must map stored keys itself, for example by
/// tagging each message at the provider with its stored key, or by hashing the keys of the
/// messages the provider lists with [`StoredKeys::of`](crate::layer::StoredKeys::of) and
/// matching them against `stored_key`.
///
/// A message sent through the idempotency layer and
/// `HttpTransport` (feature `http`) reached the provider under its stored key
/// ([`Message::provider_key`](crate::Message::provider_key), fitted by the codec), so the
/// stored key finds it, raw or hashed:
///
/// ```
/// use tower_idempotency::verify::Verify;
///
/// fn provider_key(question: &Verify) -> &str {
///     &question.stored_key
/// }
/// # let _ = provider_key;
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Verify {
    /// The key as stored.
    pub stored_key: String,
    /// The key the message carried, when the reconciler can tell (raw keys of a known
    /// namespace); `None` for hashed keys.
    pub raw_key: Option<String>,
    /// The record as the store listed it: its state, fingerprint, kept outcome, expiry.
    pub record: Inspected,
}

impl Verify {
    /// The question about the listed `record`, whose message carried `raw_key` when known.
    pub fn new(record: Inspected, raw_key: Option<String>) -> Self {
        Self {
            stored_key: record.key.clone(),
            raw_key,
            record,
        }
    }

    /// The question about `stored_key` (whose message carried `raw_key` when known) for a
    /// caller that holds no listed record of it, such as a send that takes a key over from
    /// a crashed one: the record reads as pending, its lease passed, with `fingerprint`.
    pub fn for_key(
        stored_key: impl Into<String>,
        raw_key: Option<String>,
        fingerprint: Fingerprint,
    ) -> Self {
        let record = Inspected::new(
            stored_key,
            KeyState::Pending,
            fingerprint,
            None,
            Expiry::Passed,
        );
        Self::new(record, raw_key)
    }
}

/// What the provider knows about a message: the answer of a verification service.
///
/// An error of the verification service counts as [`Unknown`](Self::Unknown) for that key:
/// the reconciler leaves it as it is.
///
/// Later releases may add answers; a `match` outside this crate needs a wildcard arm.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verified {
    /// The provider took the message, under this receipt: the key is settled as delivered,
    /// and a repeat is answered with the receipt, never sent.
    Delivered(Receipt),
    /// The provider certainly never took it: the key is freed, and the next send goes.
    NotSent,
    /// The provider cannot tell (yet): the key is left as it is.
    Unknown,
}
