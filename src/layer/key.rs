//! Key derivation: which key a request is stored under ([`StoredKeys`], in the layer's
//! [`KeyForm`]), and the hash that stands for it in logs.

use std::fmt;
use std::io::Write;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::config::{Config, KeyForm, validate_namespace};
use super::error::ConfigError;
use super::request::IdempotentRequest;
use super::stats::bump;
use crate::message::{KeyError, MAX_KEY_LEN, validate_key};
use crate::outcome::{SendError, codes};

/// The marker of version 1 of the hashed form, after the namespace.
const HASHED_V1: &str = "h1";

/// The stored form of the keys of one namespace: what an operator tool computes to find the
/// record of a key it was given (from a provider's dashboard, a customer's ticket, a log).
///
/// It needs no store and no layer: the namespace and the [`KeyForm`] the layer was built
/// with are all it takes. [`IdempotencyLayer::stored_keys`](super::IdempotencyLayer::stored_keys)
/// gives the one of a layer.
///
/// ```
/// use tower_idempotency::layer::{KeyForm, StoredKeys};
///
/// let raw = StoredKeys::new("alerts", KeyForm::Raw)?;
/// assert_eq!(raw.of("order.created:ord_1:email")?, "alerts:order.created:ord_1:email");
///
/// // The same digest `printf '%s' 'alerts:order.created:ord_1:email' | sha256sum` prints.
/// let hashed = StoredKeys::new("alerts", KeyForm::Hashed)?;
/// assert_eq!(
///     hashed.of("order.created:ord_1:email")?,
///     "alerts:h1:f1d874af6b5ff0dfe4b936c669e1b037c210e374c68b519d7236f61ae3815b54",
/// );
/// assert_eq!(hashed.prefix(), "alerts:h1:");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct StoredKeys {
    namespace: Arc<str>,
    form: KeyForm,
}

impl StoredKeys {
    /// The stored keys of `namespace` in `form`.
    ///
    /// # Errors
    /// [`ConfigError::InvalidNamespace`] for a namespace no layer accepts (empty, longer than
    /// 64 bytes, holding `:` or a control character).
    pub fn new(namespace: &str, form: KeyForm) -> Result<Self, ConfigError> {
        validate_namespace(namespace)?;
        Ok(Self::checked(Arc::from(namespace), form))
    }

    /// From a namespace the layer's builder already checked.
    pub(crate) fn checked(namespace: Arc<str>, form: KeyForm) -> Self {
        Self { namespace, form }
    }

    /// The key `key` is stored under: `namespace:key`, or `namespace:h1:<64 hex digits>`.
    ///
    /// # Errors
    /// [`KeyError`] for a key the layer refuses (empty, longer than
    /// [`MAX_KEY_LEN`](crate::message::MAX_KEY_LEN) bytes, a control character): the layer
    /// never stores such a key, in either form.
    pub fn of(&self, key: &str) -> Result<String, KeyError> {
        validate_key(key)?;
        Ok(stored_form(&self.namespace, self.form, key))
    }

    /// What every stored key of this namespace and form begins with: `namespace:` for raw
    /// keys, `namespace:h1:` for hashed ones. A raw key that itself begins with `h1:` also
    /// matches the hashed prefix; tell them apart by length if a namespace ever held both.
    pub fn prefix(&self) -> String {
        match self.form {
            KeyForm::Raw => format!("{}:", self.namespace),
            KeyForm::Hashed => format!("{}:{HASHED_V1}:", self.namespace),
        }
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The form.
    pub fn form(&self) -> KeyForm {
        self.form
    }
}

impl fmt::Debug for StoredKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredKeys")
            .field("namespace", &self.namespace)
            .field("form", &self.form)
            .finish()
    }
}

/// The longest stored form: a namespace of 64 bytes, `:`, and a key of [`MAX_KEY_LEN`] bytes
/// (the hashed form is shorter).
const MAX_STORED_LEN: usize = 64 + 1 + MAX_KEY_LEN;

/// The stored form of a key already checked, under a namespace already checked, as the
/// layer holds it: written on the stack and allocated once, as every keyed send makes one.
fn stored_arc(namespace: &str, form: KeyForm, key: &str) -> Arc<str> {
    let mut buf = [0; MAX_STORED_LEN];
    let mut rest = &mut buf[..];
    if write_stored_form(&mut rest, namespace, form, key).is_ok() {
        let len = MAX_STORED_LEN - rest.len();
        if let Ok(stored) = std::str::from_utf8(&buf[..len]) {
            return Arc::from(stored);
        }
    }
    // Unreachable for checked input (it fits, and it is text); spelled out, not trusted.
    Arc::from(stored_form(namespace, form, key))
}

/// The stored form as a `String`, for operator tools.
fn stored_form(namespace: &str, form: KeyForm, key: &str) -> String {
    let mut stored = Vec::with_capacity(MAX_STORED_LEN);
    // Writing to a `Vec` cannot fail.
    let _ = write_stored_form(&mut stored, namespace, form, key);
    String::from_utf8_lossy(&stored).into_owned()
}

/// Writes the stored form of `key` under `namespace` in `form`.
fn write_stored_form(
    out: &mut impl Write,
    namespace: &str,
    form: KeyForm,
    key: &str,
) -> std::io::Result<()> {
    out.write_all(namespace.as_bytes())?;
    out.write_all(b":")?;
    match form {
        KeyForm::Raw => out.write_all(key.as_bytes()),
        KeyForm::Hashed => {
            // The namespace holds no `:`, so the first `:` ends it: `namespace:key` names one
            // (namespace, key) pair only.
            let digest = Sha256::new()
                .chain_update(namespace)
                .chain_update(":")
                .chain_update(key)
                .finalize();
            out.write_all(HASHED_V1.as_bytes())?;
            out.write_all(b":")?;
            for b in digest {
                out.write_all(&crate::hex::pair(b))?;
            }
            Ok(())
        }
    }
}

/// What the layer makes of a request's key.
pub(crate) enum KeyOf {
    /// No key: sent as it is, the store untouched.
    Unkeyed,
    /// A key the rules refuse: answered `idempotency.invalid_key`, not sent.
    Invalid(SendError),
    /// The key as stored, in the layer's [`KeyForm`].
    Keyed(Arc<str>),
}

/// The request's key in the store, in the layer's [`KeyForm`], without counting or logging:
/// `None` for no key, an error for a key the rules refuse.
///
/// The layer's key function for the request's type, when one was set, overrides the
/// request's own key.
pub(crate) fn derive_key<R: IdempotentRequest>(
    config: &Config,
    request: &R,
) -> Option<Result<Arc<str>, KeyError>> {
    let stored = |key: &str| -> Result<Arc<str>, KeyError> {
        validate_key(key)?;
        Ok(stored_arc(&config.namespace, config.key_form, key))
    };
    match config.keys.get::<R>() {
        Some(key_fn) => key_fn(request).map(|key| stored(&key)),
        None => request.idempotency_key().map(stored),
    }
}

/// The key the request carries (its own, or its type's key function's), as it was given,
/// before the layer's [`KeyForm`]: what a verification service asks the provider about.
pub(crate) fn raw_key<R: IdempotentRequest>(config: &Config, request: &R) -> Option<String> {
    match config.keys.get::<R>() {
        Some(key_fn) => key_fn(request),
        None => request.idempotency_key().map(str::to_owned),
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
    digest[..6]
        .iter()
        .flat_map(|&b| crate::hex::pair(b).map(char::from))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first six bytes of the key's SHA-256 in lowercase hex, as
    /// `printf '%s' a | sha256sum | cut -c1-12` prints: what logs name a key by.
    #[test]
    fn a_keys_hash_in_logs_is_the_start_of_its_sha256() {
        assert_eq!(key_hash("a"), "ca978112ca1b");
        assert_eq!(key_hash(""), "e3b0c44298fc");
    }

    /// The key a send holds is the stored form an operator computes, at the shortest keys, at
    /// the longest key under the longest namespace, and between.
    #[test]
    fn a_sends_key_is_the_stored_form_at_every_length() {
        let longest_namespace = "n".repeat(64);
        for namespace in ["alerts", longest_namespace.as_str()] {
            for form in [KeyForm::Raw, KeyForm::Hashed] {
                for len in (1..=8).chain(120..=136).chain([MAX_KEY_LEN]) {
                    let key = "k".repeat(len);
                    let expected = stored_form(namespace, form, &key);
                    let held = stored_arc(namespace, form, &key);
                    assert_eq!(&*held, expected.as_str(), "{namespace}, {form:?}, {len}");
                }
            }
        }
        assert_eq!(
            &*stored_arc(&longest_namespace, KeyForm::Raw, &"k".repeat(MAX_KEY_LEN)),
            format!("{longest_namespace}:{}", "k".repeat(MAX_KEY_LEN)),
        );
        assert_eq!(
            &*stored_arc("alerts", KeyForm::Hashed, "k"),
            format!("alerts:h1:{}", hex_of_sha256("alerts:k")),
        );
    }

    fn hex_of_sha256(text: &str) -> String {
        Sha256::digest(text)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}
