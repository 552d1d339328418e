//! Key derivation: which key a request is stored under, and the hash that stands for it in
//! logs.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::config::Config;
use super::request::IdempotentRequest;
use super::stats::bump;
use crate::message::{KeyError, validate_key};
use crate::outcome::{SendError, codes};

/// What the layer makes of a request's key.
pub(crate) enum KeyOf {
    /// No key: sent as it is, the store untouched.
    Unkeyed,
    /// A key the rules refuse: answered `idempotency.invalid_key`, not sent.
    Invalid(SendError),
    /// The key as stored: `namespace:key`.
    Keyed(Arc<str>),
}

/// The request's key in the store, `namespace:key`, without counting or logging: `None`
/// for no key, an error for a key the rules refuse.
///
/// The layer's key function for the request's type, when one was set, overrides the
/// request's own key.
pub(crate) fn derive_key<R: IdempotentRequest>(
    config: &Config,
    request: &R,
) -> Option<Result<Arc<str>, KeyError>> {
    let stored = |key: &str| -> Result<Arc<str>, KeyError> {
        validate_key(key)?;
        Ok(Arc::from(format!("{}:{key}", config.namespace)))
    };
    match config.keys.get::<R>() {
        Some(key_fn) => key_fn(request).map(|key| stored(&key)),
        None => request.idempotency_key().map(stored),
    }
}

/// The request's key in the store ([`derive_key`]), counting and logging what is not one.
pub(crate) fn store_key<R: IdempotentRequest>(config: &Config, request: &R) -> KeyOf {
    let key = derive_key(config, request);
    match key {
        None => {
            bump(&config.counters.unkeyed);
            KeyOf::Unkeyed
        }
        Some(Err(error)) => {
            bump(&config.counters.invalid_key);
            tracing::warn!(
                namespace = %config.namespace,
                code = codes::INVALID_KEY,
                error = %error,
                "idempotency key refused"
            );
            KeyOf::Invalid(SendError::invalid_key(error))
        }
        Some(Ok(key)) => KeyOf::Keyed(key),
    }
}

/// A short, stable hash of a key for logs: keys often hold an address, so the raw key is
/// never logged.
pub(crate) fn key_hash(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}
