//! A reserve whose answer never reached its caller.
//!
//! A networked store's reserve can take its key and lose the answer: the connection drops
//! after the server ran the statement, the store's own timeout fires while the reply is on
//! its way, or the caller stops waiting (the layer's reserve timeout drops the future). The
//! caller then reports the message as not sent, and the pending record its reserve wrote
//! would hold the key with nobody sending until the lease ends: every repeat meanwhile
//! answered "in progress", a reconciler seeing a stale send.
//!
//! [`Unanswered`] frees such a key. A store arms it with the keys and tokens before it asks
//! its server, and disarms it once it has read the answer. Dropped while armed, it releases
//! those tokens in the background: `release` deletes only a pending record of the same
//! token, so a key the reserve never took, or that another reserve holds, is left alone.
//! The release is asked again a few times over seconds ([`RETRIES`]), as the lost reserve may
//! land after the first release; a key none of them freed frees itself at the lease's end.

use std::time::Duration;

use super::{Store, StoreError, Token};
use crate::fingerprint::Fingerprint;

/// The waits between the attempts to release an unanswered reserve's tokens: a store that
/// lost a reply often answers again within seconds (a reconnect, a failover).
pub(crate) const RETRIES: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_secs(1),
    Duration::from_secs(5),
];

/// Releases its tokens when dropped before its call answered ([`answered`](Self::answered)); see the
/// [module docs](self).
pub(crate) struct Unanswered<'a, S: Store + Clone> {
    store: &'a S,
    /// Borrowed from the caller, who holds its keys and tokens for the call anyway: a single
    /// reserve arms its guard without an allocation. Empty once disarmed.
    reserved: &'a [(&'a str, Token)],
}

impl<'a, S: Store + Clone> Unanswered<'a, S> {
    /// Armed for the reserves of `reserved`, before the store is asked.
    pub(crate) fn arm(store: &'a S, reserved: &'a [(&'a str, Token)]) -> Self {
        Self { store, reserved }
    }

    /// Takes the answer of the store's call, awaited while the guard was armed: an answer
    /// read, whatever it says, tells its caller which keys it holds, and disarms the guard. A
    /// failed call (its answer lost) leaves it armed, and dropping it releases the tokens.
    ///
    /// A plain method after a plain `.await`, not a future wrapping the call: the call's
    /// future then is not carried twice in its caller's (it is made and moved on every
    /// reserve).
    pub(crate) fn answered<T>(mut self, answer: Result<T, StoreError>) -> Result<T, StoreError> {
        if answer.is_ok() {
            self.reserved = &[];
        }
        answer
    }
}

/// What a batch's guard is armed with: each key of `requests` beside the token at the same
/// position in `tokens`.
pub(crate) fn pairs<'a>(
    requests: &'a [(&'a str, Fingerprint)],
    tokens: &[Token],
) -> Vec<(&'a str, Token)> {
    requests
        .iter()
        .map(|(key, _)| *key)
        .zip(tokens.iter().copied())
        .collect()
}

impl<S: Store + Clone> Drop for Unanswered<'_, S> {
    fn drop(&mut self) {
        if self.reserved.is_empty() {
            return;
        }
        // Outside a runtime (a store dropped at the end of `main`) nothing can be sent; the
        // lease frees the keys.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.store.clone();
        let reserved: Vec<(String, Token)> = self
            .reserved
            .iter()
            .map(|&(key, token)| (key.to_owned(), token))
            .collect();
        runtime.spawn(async move {
            // The reserve may land after a first release found nothing (its statement queued
            // behind a lock, or on a connection being torn down): keep asking for the keys
            // not released yet.
            let mut left = reserved;
            for wait in RETRIES {
                let releases: Vec<(&str, Token)> = left
                    .iter()
                    .map(|(key, token)| (key.as_str(), *token))
                    .collect();
                if let Ok(released) = store.release_many(&releases).await {
                    let mut released = released.into_iter();
                    left.retain(|_| !released.next().unwrap_or(false));
                    if left.is_empty() {
                        return;
                    }
                }
                tokio::time::sleep(wait).await;
            }
            tracing::debug!(
                keys = left.len(),
                "released none of these keys of a reserve whose answer was lost: it never \
                 took them, or their lease frees them"
            );
        });
    }
}
