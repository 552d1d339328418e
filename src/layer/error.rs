//! [`ConfigError`]: why a layer could not be built, with its advice in `Debug` too.

use std::error::Error;
use std::fmt;

/// Why a layer could not be built.
///
/// A layer without a store is not among them:
/// [`build`](crate::layer::IdempotencyLayerBuilder::build) exists only once a store is set.
/// Its `Debug` form says what to do as its `Display` form does, so a `main` that returns the
/// error prints the advice.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
///
/// let error = IdempotencyLayer::builder()
///     .store(MemoryStore::new())
///     .lease(Duration::ZERO)
///     .build()
///     .unwrap_err();
/// assert!(format!("{error:?}").contains("must be longer than zero"));
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The namespace is empty, longer than 64 bytes, or holds `:` or a control character.
    InvalidNamespace(String),
    /// A duration option is zero.
    ZeroDuration(&'static str),
    /// The ttl is shorter than the lease: a done record would expire before a pending one.
    TtlShorterThanLease,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidNamespace(ns) => write!(
                f,
                "invalid namespace {ns:?}: 1 to 64 bytes, no ':' and no control characters"
            ),
            Self::ZeroDuration(option) => write!(f, "the {option} must be longer than zero"),
            Self::TtlShorterThanLease => f.write_str("the ttl must be at least the lease"),
        }
    }
}

// `main() -> Result<(), BoxError>` prints its error with `Debug`: the advice belongs there too.
impl fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidNamespace(ns) => write!(f, "InvalidNamespace({ns:?})")?,
            Self::ZeroDuration(option) => write!(f, "ZeroDuration({option:?})")?,
            Self::TtlShorterThanLease => f.write_str("TtlShorterThanLease")?,
        }
        write!(f, ": {self}")
    }
}

impl Error for ConfigError {}
