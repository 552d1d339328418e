//! [`Settler`]: finds the stored key an event's digest names, and settles it, through the
//! store's public admin operations only (the same ones the reconciler uses).

use std::collections::HashMap;
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use crate::http::mark::key_digest;
use crate::outcome::Receipt;
use crate::store::StoreError;
use crate::store::admin::{AdminOutcome, Cursor, Force, Resolution, StoreAdmin};

/// The most keys one re-listing of the store reads.
const MAX_LISTED: usize = 100_000;
/// Keys per store call while listing.
const PAGE: usize = 500;

/// What a provider's event says of the message it names.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventKind {
    /// The provider took the message (sent, delivered, bounced, complained, …): the key is
    /// settled as delivered with the provider's id.
    Took,
    /// The provider says it never sent the message and never will: the key is freed.
    FailedBeforeSending,
}

/// One event of a provider about one message it was sent.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Event {
    /// The [`key_digest`] the message was marked with.
    pub digest: String,
    /// The provider's id of the message.
    pub message_id: String,
    /// What it says.
    pub kind: EventKind,
}

impl Event {
    /// An event about the message marked `digest`, the provider's `message_id`.
    pub fn new(digest: impl Into<String>, message_id: impl Into<String>, kind: EventKind) -> Self {
        Self {
            digest: digest.into(),
            message_id: message_id.into(),
            kind,
        }
    }
}

/// What settling an event did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settled {
    /// The key was settled as delivered.
    Delivered,
    /// The key was freed.
    Freed,
    /// No unsettled key has this digest (settled already, never ours, or gone).
    UnknownKey,
    /// The key is held by a live send, or already holds an outcome: left to it.
    Left,
}

#[derive(Default)]
struct Index {
    keys: HashMap<String, String>,
}

/// Finds keys by digest and settles them.
pub(crate) struct Settler<S> {
    store: S,
    transport: &'static str,
    index: tokio::sync::Mutex<Index>,
    /// Listings of the store taken so far: a question that waited for one taken after it
    /// arrived needs no other.
    listings: AtomicU64,
}

impl<S: StoreAdmin> Settler<S> {
    pub(crate) fn new(store: S, transport: &'static str) -> Self {
        Self {
            store,
            transport,
            index: tokio::sync::Mutex::new(Index::default()),
            listings: AtomicU64::new(0),
        }
    }

    /// Settles what `event` says, if it names an unsettled key.
    pub(crate) async fn settle(&self, event: &Event, ttl: Duration) -> Result<Settled, StoreError> {
        let Some(key) = self.find(&event.digest).await? else {
            return Ok(Settled::UnknownKey);
        };
        let Some(record) = self.store.inspect(&key).await? else {
            self.forget(&event.digest).await;
            return Ok(Settled::UnknownKey);
        };
        if !(record.is_unknown_delivery() || record.is_stale()) {
            return Ok(Settled::Left);
        }
        let resolution = match event.kind {
            EventKind::Took => {
                Resolution::delivered(Receipt::new(event.message_id.clone(), self.transport), ttl)
            }
            EventKind::FailedBeforeSending => Resolution::not_sent(),
        };
        let outcome = self.store.resolve(&key, &resolution, Force::No).await?;
        self.forget(&event.digest).await;
        Ok(match (outcome, &event.kind) {
            (AdminOutcome::Done, EventKind::Took) => Settled::Delivered,
            (AdminOutcome::Done, EventKind::FailedBeforeSending) => Settled::Freed,
            (AdminOutcome::HeldByLiveSend, _) => Settled::Left,
            _ => Settled::UnknownKey,
        })
    }

    async fn forget(&self, digest: &str) {
        self.index.lock().await.keys.remove(digest);
    }

    /// The unsettled key whose digest is `digest`, listing the store again when it is not
    /// known; questions that arrive together share one listing.
    async fn find(&self, digest: &str) -> Result<Option<String>, StoreError> {
        let arrived = self.listings.load(Ordering::Acquire);
        let mut index = self.index.lock().await;
        if let Some(key) = index.keys.get(digest) {
            return Ok(Some(key.clone()));
        }
        if self.listings.load(Ordering::Acquire) > arrived {
            // A listing taken since this question arrived did not find it.
            return Ok(None);
        }
        let mut keys = HashMap::new();
        let mut cursor: Option<Cursor> = None;
        let mut listed = 0;
        // Bounded: a store may answer empty pages while the listing goes on.
        for _ in 0..(MAX_LISTED / PAGE + 4) {
            let page = self.store.list(cursor.as_ref(), PAGE).await?;
            for entry in page.entries {
                listed += 1;
                if entry.is_unknown_delivery() || entry.is_stale() {
                    keys.insert(key_digest(&entry.key), entry.key);
                }
            }
            match page.next {
                Some(next) if listed < MAX_LISTED => cursor = Some(next),
                _ => break,
            }
        }
        index.keys = keys;
        self.listings.fetch_add(1, Ordering::AcqRel);
        Ok(index.keys.get(digest).cloned())
    }
}
