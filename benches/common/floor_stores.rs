//! Stores that set floors under the memory store's cost in `sends targets`. `NullStore`
//! keeps nothing, so a send through it costs the layer alone. `MapStore` keeps each key and
//! its receipt's id in a std `HashMap` (std's hasher, as keys may come from anyone) under one
//! lock and does nothing else: no bound, no expiry, no order to evict by. A store that keeps
//! the contract does all of that and more, so a send through `MapStore` is what the plainest
//! in-process store costs, a floor for `MemoryStore` measured in the same run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tower_idempotency::Fingerprint;
use tower_idempotency::outcome::{Outcome, Receipt};
use tower_idempotency::store::{Record, Reservation, Store, StoreError, Token};

/// A store that grants every reserve and keeps every outcome at once, remembering nothing.
#[derive(Clone)]
pub struct NullStore;

impl Store for NullStore {
    fn reserve<'a>(
        &'a self,
        _: &'a str,
        _: Fingerprint,
        _: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        Box::pin(std::future::ready(Ok(Reservation::Reserved {
            token: Token::new(),
        })))
    }
    fn reserve_now(
        &self,
        _: &Arc<str>,
        _: Fingerprint,
        _: Duration,
    ) -> Option<Result<Reservation, StoreError>> {
        Some(Ok(Reservation::Reserved {
            token: Token::new(),
        }))
    }
    fn complete<'a>(
        &'a self,
        _: &'a str,
        _: Token,
        _: Fingerprint,
        _: &'a Outcome,
        _: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(true)))
    }
    fn complete_now(
        &self,
        _: &Arc<str>,
        _: Token,
        _: Fingerprint,
        _: &Outcome,
        _: Duration,
    ) -> Option<Result<bool, StoreError>> {
        Some(Ok(true))
    }
    fn release<'a>(&'a self, _: &'a str, _: Token) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(true)))
    }
}

/// A key's record in `MapStore`: the reserve's fingerprint and token, then the receipt's id.
struct Kept {
    fingerprint: Fingerprint,
    token: Token,
    receipt_id: Option<Box<str>>,
}

/// Keys and receipts in a std `HashMap` (std's hasher: keys may come from anyone) under one
/// lock: one hash, one probe and one write per call, one allocation per receipt.
#[derive(Clone, Default)]
pub struct MapStore {
    records: Arc<Mutex<HashMap<Arc<str>, Kept>>>,
}

impl MapStore {
    fn reserve_shared(&self, key: &Arc<str>, fingerprint: Fingerprint) -> Reservation {
        let mut records = self.records.lock().expect("unpoisoned");
        match records.entry(Arc::clone(key)) {
            std::collections::hash_map::Entry::Occupied(held) => {
                let kept = held.get();
                let record = match &kept.receipt_id {
                    Some(id) => {
                        Record::done(kept.fingerprint, Outcome::sent(Receipt::new(&**id, "")))
                    }
                    None => Record::pending(kept.fingerprint),
                };
                Reservation::Held { record }
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                let token = Token::new();
                slot.insert(Kept {
                    fingerprint,
                    token,
                    receipt_id: None,
                });
                Reservation::Reserved { token }
            }
        }
    }

    fn complete_shared(&self, key: &str, token: Token, outcome: &Outcome) -> bool {
        let mut records = self.records.lock().expect("unpoisoned");
        match records.get_mut(key) {
            Some(kept) if kept.token == token => {
                kept.receipt_id = outcome.receipt().map(|r| r.id.as_str().into());
                true
            }
            _ => false,
        }
    }
}

impl Store for MapStore {
    fn reserve<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        _: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        let reserved = self.reserve_shared(&Arc::from(key), fingerprint);
        Box::pin(std::future::ready(Ok(reserved)))
    }
    fn reserve_now(
        &self,
        key: &Arc<str>,
        fingerprint: Fingerprint,
        _: Duration,
    ) -> Option<Result<Reservation, StoreError>> {
        Some(Ok(self.reserve_shared(key, fingerprint)))
    }
    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        _: Fingerprint,
        outcome: &'a Outcome,
        _: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(
            self.complete_shared(key, token, outcome)
        )))
    }
    fn complete_now(
        &self,
        key: &Arc<str>,
        token: Token,
        _: Fingerprint,
        outcome: &Outcome,
        _: Duration,
    ) -> Option<Result<bool, StoreError>> {
        Some(Ok(self.complete_shared(key, token, outcome)))
    }
    fn release<'a>(
        &'a self,
        key: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let mut records = self.records.lock().expect("unpoisoned");
        let held = records
            .get(key)
            .is_some_and(|k| k.token == token && k.receipt_id.is_none());
        if held {
            records.remove(key);
        }
        Box::pin(std::future::ready(Ok(held)))
    }
}
