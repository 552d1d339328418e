//! Why a store operation failed: [`StoreError`] and its [`StoreErrorKind`], and the answer
//! the layer makes of one.

use std::fmt;

use crate::outcome::{BoxError, Category, SendError, codes};

/// The kinds of [`StoreError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The backend could not be reached or answered with an error.
    Unavailable,
    /// The operation did not finish in time.
    Timeout,
    /// A record could not be decoded, or breaks the record rules.
    Corrupt,
    /// The store is full of records it may not drop.
    Capacity,
    /// The call itself was invalid, such as a batch that names one key twice.
    InvalidInput,
    /// The store does not offer this operation (a trait method the store keeps the default of).
    Unsupported,
    /// The store is set up wrong and stays so until someone changes its configuration: an
    /// invalid URL, a SQLite path that is a directory or a file that is not a database.
    /// Never retried: the layer answers a reserve that fails with it
    /// `idempotency.store_misconfigured` (not sent, category
    /// [`Permanent`](crate::Category::Permanent), not retryable), and a settlement gives up
    /// at once.
    Misconfigured,
}

/// Why a store operation failed. The source error is kept.
#[derive(Debug)]
pub struct StoreError {
    // Visible to the stores, which rebuild an error with another kind or detail.
    pub(super) kind: StoreErrorKind,
    pub(super) detail: String,
    pub(super) source: Option<BoxError>,
}

impl StoreError {
    /// An error of `kind` with a description.
    pub fn new(kind: StoreErrorKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            source: None,
        }
    }

    /// The backend failed; `source` is its error.
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        Self::new(StoreErrorKind::Unavailable, "the store backend failed").with_source(source)
    }

    /// The store is set up wrong (see [`StoreErrorKind::Misconfigured`]); `detail` says what
    /// to change.
    pub fn misconfigured(detail: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Misconfigured, detail)
    }

    /// The operation timed out.
    pub fn timeout() -> Self {
        Self::new(StoreErrorKind::Timeout, "the store operation timed out")
    }

    /// A record could not be decoded.
    pub fn corrupt(detail: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Corrupt, detail)
    }

    /// The store is full of pending records.
    pub fn capacity(max_entries: usize) -> Self {
        Self::new(
            StoreErrorKind::Capacity,
            format!("the store holds {max_entries} records, all pending within their lease"),
        )
    }

    /// Keeps `source` as the cause.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// The kind.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

// Here, beside the kinds it reads, so `outcome` names no store type.
impl SendError {
    /// The layer's answer when the store could not reserve the key; the message was not sent.
    ///
    /// `error` is the store's error (a [`StoreError`] from a
    /// [`Store`](super::Store)), kept as the [source](std::error::Error::source). Code
    /// `idempotency.store_failed`, retryable; but a store error of kind
    /// [`Misconfigured`](StoreErrorKind::Misconfigured) gives code
    /// `idempotency.store_misconfigured`, category [`Permanent`](Category::Permanent), not
    /// retryable: no retry mends a configuration.
    pub fn store_failed(error: impl Into<BoxError>) -> Self {
        let error = error.into();
        let misconfigured = error
            .downcast_ref::<StoreError>()
            .is_some_and(|e| e.kind() == StoreErrorKind::Misconfigured);
        if misconfigured {
            return Self::new(
                codes::STORE_MISCONFIGURED,
                Category::Permanent,
                false,
                "the idempotency store is misconfigured; the message was not sent",
            )
            .with_source(error);
        }
        Self::new(
            codes::STORE_FAILED,
            Category::Unknown,
            true,
            "the idempotency store could not reserve the key; the message was not sent",
        )
        .with_source(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misconfigured_store_is_a_permanent_answer_never_retried() {
        let error = SendError::store_failed(StoreError::misconfigured("not a database"));
        assert_eq!(error.code(), codes::STORE_MISCONFIGURED);
        assert_eq!(error.category(), Category::Permanent);
        assert!(!error.is_retryable());
        assert!(error.is_idempotency_answer());
        assert!(!error.counts_against_provider());
        let passing = SendError::store_failed(StoreError::timeout());
        assert_eq!(passing.code(), codes::STORE_FAILED);
        assert!(passing.is_retryable());
    }
}
