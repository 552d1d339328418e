//! [`IdempotencyKey`]: the key a message is deduplicated by, and its rules.

use std::fmt;
use std::sync::Arc;

/// The longest idempotency key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 256;

/// A validated idempotency key: 1 to [`MAX_KEY_LEN`] bytes, no control characters.
///
/// Derive it from the business event, never from the clock or a random id: a key made at call
/// time is different on every retry and deduplicates nothing.
///
/// ```
/// use tower_idempotency::IdempotencyKey;
///
/// let key = IdempotencyKey::new("order.created:ord_20481:email")?;
/// assert_eq!(key.as_str(), "order.created:ord_20481:email");
/// assert!(IdempotencyKey::new("").is_err());
/// # Ok::<(), tower_idempotency::message::KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(Arc<str>);

impl IdempotencyKey {
    /// Validates `key` and wraps it.
    pub fn new(key: impl AsRef<str>) -> Result<Self, KeyError> {
        let key = key.as_ref();
        validate_key(key)?;
        Ok(Self(Arc::from(key)))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Checks the rules of [`IdempotencyKey`] without allocating.
pub(crate) fn validate_key(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong { len: key.len() });
    }
    // The usual key is printable ASCII, which a byte scan clears at once; anything else is
    // read character by character.
    if key.bytes().all(|b| (b' '..=b'~').contains(&b)) {
        return Ok(());
    }
    if let Some(position) = key
        .char_indices()
        .find(|(_, c)| c.is_control())
        .map(|(i, _)| i)
    {
        return Err(KeyError::ControlCharacter { position });
    }
    Ok(())
}

impl fmt::Debug for IdempotencyKey {
    // Keys often embed an address; Debug output lands in logs, so show only its length.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey(<{} bytes>)", self.0.len())
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Why a key was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is the empty string.
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`] bytes.
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The key holds a control character (newline, NUL, …).
    ControlCharacter {
        /// The byte offset of the first one.
        position: usize,
    },
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("idempotency key is empty"),
            Self::TooLong { len } => write!(
                f,
                "idempotency key is {len} bytes long, the limit is {MAX_KEY_LEN}"
            ),
            Self::ControlCharacter { position } => {
                write!(
                    f,
                    "idempotency key holds a control character at byte {position}"
                )
            }
        }
    }
}

impl std::error::Error for KeyError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_debug_output_hides_the_key() {
        let key = IdempotencyKey::new("welcome:seller@example.com").unwrap();
        assert!(!format!("{key:?}").contains("seller"));
    }

    #[test]
    fn control_characters_are_refused_in_and_out_of_ascii_and_other_text_is_kept() {
        for (key, position) in [("a\tb", 1), ("ab\x7f", 2), ("\0", 0), ("é\u{85}x", 2)] {
            assert_eq!(
                validate_key(key),
                Err(KeyError::ControlCharacter { position }),
                "{key:?}"
            );
        }
        for key in ["order.created:ord_1:email", " ~", "commande:é:😀"] {
            assert_eq!(validate_key(key), Ok(()), "{key:?}");
        }
    }
}
