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

use super::{Store, Token};

/// The waits between the attempts to release an unanswered reserve's tokens: a store that
/// lost a reply often answers again within seconds (a reconnect, a failover).
pub(crate) const RETRIES: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_secs(1),
    Duration::from_secs(5),
];

/// Releases its tokens when dropped before [`answered`](Self::answered); see the
/// [module docs](self).
pub(crate) struct Unanswered<'a, S: Store + Clone> {
    store: &'a S,
    reserved: Vec<(&'a str, Token)>,
}

impl<'a, S: Store + Clone> Unanswered<'a, S> {
    /// Armed for the reserves of `reserved`, before the store is asked.
    pub(crate) fn arm(store: &'a S, reserved: Vec<(&'a str, Token)>) -> Self {
        Self { store, reserved }
    }

    /// The answer was read: whatever it says, its caller knows which keys it holds.
    pub(crate) fn answered(mut self) {
        self.reserved.clear();
    }
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
            .drain(..)
            .map(|(key, token)| (key.to_owned(), token))
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
