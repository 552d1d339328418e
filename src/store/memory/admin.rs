//! [`StoreAdmin`] for [`MemoryStore`]: each operation under the key's shard lock; the listing
//! walks every shard.

use std::sync::atomic::Ordering;

use futures_util::future::{BoxFuture, FutureExt};

use super::{Entry, Inner, KeptOutcome, MemoryStore, Tick, lock};
use crate::outcome::Outcome;
use crate::store::admin::{
    AdminOutcome, Cursor, Expiry, Force, Inspected, KeyState, Page, Resolution, StoreAdmin,
    split_cursor,
};
use crate::store::{RecordState, StoreError, StoreErrorKind, Token};

impl Entry {
    fn inspected(&self, key: &str, now: Tick) -> Inspected {
        let state = match self.state() {
            RecordState::Pending => KeyState::Pending,
            RecordState::Done => KeyState::Done,
        };
        let expires = if self.is_live(now) {
            Expiry::In(self.expires_at.since(now))
        } else {
            Expiry::Passed
        };
        let outcome = self.outcome.as_ref().map(KeptOutcome::outcome);
        Inspected::new(key, state, self.fingerprint, outcome, expires)
    }
}

impl Inner {
    /// Where `expires_at` falls in the listing's order, counted from the store's making.
    fn position(&self, expires_at: Tick) -> u128 {
        u128::from(expires_at.0)
    }

    fn inspect(&self, key: &str) -> Option<Inspected> {
        let now = self.now();
        let key = self.hashed(key);
        let shard = self.shard(key);
        shard.get(key).map(|entry| entry.inspected(key.key, now))
    }

    /// Applies `change` to the record of `key` under its shard lock, unless a live send holds
    /// it and the call is not forced. `change` answers whether the entry stays (replaced by
    /// the entry it gives) or goes.
    fn settle(
        &self,
        key: &str,
        force: Force,
        change: impl FnOnce(&Entry, u64, Tick) -> Option<Entry>,
    ) -> AdminOutcome {
        let now = self.now();
        let key = self.hashed(key);
        let mut shard = self.shard(key);
        let seq = shard.next_seq();
        let Some(entry) = shard.get(key) else {
            return AdminOutcome::NothingThere;
        };
        if entry.inspected(key.key, now).is_held_live() && !force.is_forced() {
            return AdminOutcome::HeldByLiveSend;
        }
        match change(entry, seq, now) {
            Some(replacement) => shard.replace(key, replacement),
            None => {
                if shard.remove(key) {
                    self.len.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        AdminOutcome::Done
    }

    fn resolve(&self, key: &str, resolution: &Resolution, force: Force) -> AdminOutcome {
        match resolution {
            Resolution::Delivered { receipt, ttl } => {
                let outcome = Outcome::sent(receipt.clone());
                self.settle(key, force, |entry, seq, now| {
                    Some(Entry {
                        fingerprint: entry.fingerprint,
                        // A new token fences out a forced-out holder's late settlement.
                        token: Token::new(),
                        outcome: Some(KeptOutcome::of(&outcome)),
                        expires_at: now.after(*ttl),
                        written_at: now,
                        first_at: entry.first_at,
                        seq,
                    })
                })
            }
            Resolution::NotSent => self.settle(key, force, |_, _, _| None),
        }
    }

    fn list(&self, after: Option<&Cursor>, limit: usize) -> Result<Page, StoreError> {
        let after = after
            .map(|cursor| {
                let (at, key) = split_cursor(cursor)?;
                let at: u128 = at.parse().map_err(|_| {
                    StoreError::new(
                        StoreErrorKind::InvalidInput,
                        format!("{cursor:?} is not a cursor of this store"),
                    )
                })?;
                Ok::<_, StoreError>((at, key.to_owned()))
            })
            .transpose()?;
        let now = self.now();
        let mut found: Vec<(u128, Inspected)> = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for (stored, entry) in shard.map.iter() {
                let key = &stored.key;
                let record = entry.inspected(key, now);
                if !(record.is_unknown_delivery() && entry.is_live(now) || record.is_stale()) {
                    continue;
                }
                let at = self.position(entry.expires_at);
                let listed_before = after.as_ref().is_some_and(|(after_at, after_key)| {
                    (at, key.as_ref()) <= (*after_at, after_key.as_str())
                });
                if listed_before {
                    continue;
                }
                found.push((at, record));
            }
        }
        found.sort_by(|a, b| (a.0, &a.1.key).cmp(&(b.0, &b.1.key)));
        let more = found.len() > limit;
        found.truncate(limit);
        let next = match found.last() {
            Some((at, last)) if more => Some(Cursor::new(format!("{at}:{}", last.key))),
            _ => None,
        };
        Ok(Page::new(
            found.into_iter().map(|(_, record)| record).collect(),
            next,
        ))
    }
}

/// Every operation is one step under a shard lock; the listing locks one shard at a time, so
/// it never stops the store, and a key changed while it runs is listed as it was or as it is.
impl StoreAdmin for MemoryStore {
    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Inspected>, StoreError>> {
        std::future::ready(Ok(self.inner.inspect(key))).boxed()
    }

    fn forget<'a>(
        &'a self,
        key: &'a str,
        force: Force,
    ) -> BoxFuture<'a, Result<AdminOutcome, StoreError>> {
        std::future::ready(Ok(self.inner.settle(key, force, |_, _, _| None))).boxed()
    }

    fn resolve<'a>(
        &'a self,
        key: &'a str,
        resolution: &'a Resolution,
        force: Force,
    ) -> BoxFuture<'a, Result<AdminOutcome, StoreError>> {
        std::future::ready(Ok(self.inner.resolve(key, resolution, force))).boxed()
    }

    fn list<'a>(
        &'a self,
        after: Option<&'a Cursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Page, StoreError>> {
        std::future::ready(self.inner.list(after, limit)).boxed()
    }
}
