//! [`MemoryStore`]: the default store, in this process, bounded and sharded.

use std::collections::VecDeque;
use std::fmt;
use std::hash::RandomState;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use tokio::time::Instant;

use super::{Record, RecordState, Reservation, Store, StoreError, Token};
use crate::fingerprint::Fingerprint;
use crate::outcome::Outcome;
use index::{ExpiryIndex, Lane};
use kept::KeptOutcome;
use key::{Hashed, Map, Slot};

mod admin;
mod index;
mod kept;
mod key;

/// The default bound on the records a [`MemoryStore`] keeps.
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;

/// The locks of a large store.
const SHARDS: usize = 32;

/// The bound under which a store is small: one lock, and an exact eviction order.
const SMALL: usize = 2048;

/// An idempotency store in this process's memory.
///
/// It deduplicates across every layer given it (clones share the records), not across
/// processes, and forgets on restart: for several processes use a networked store.
///
/// - **Bounded.** It keeps at most `max_entries` records ([`DEFAULT_MAX_ENTRIES`]). To make
///   room it drops expired records first, then the oldest done ones (by completion time) even
///   within their ttl (a message sent again under such a key goes again). It never drops a
///   pending record before its lease ends: when only those remain, it refuses with a
///   [`Capacity`](super::StoreErrorKind::Capacity) error and the layer answers `store_failed`
///   without sending.
///
///   A small store (under 2048 records) keeps that order exactly: its records are under one
///   lock. A large one makes room in the shard the new key falls in: its expired records,
///   else up to 64 of its oldest done ones, looking across all shards only when that shard
///   has neither. The order is then oldest-first within each of 32 shards, which keys fill
///   evenly; in exchange a full store needs no store-wide scan per insert, and threads on
///   distinct keys do not serialise on eviction.
/// - **Sharded.** A large store spreads keys over 32 independent locks, so unrelated keys do
///   not contend. A small one has a single lock, held for a map lookup and a write per call:
///   exact order without a scan of every shard per insert.
/// - **Settled by hand.** It implements [`StoreAdmin`](super::admin::StoreAdmin); each
///   operation is one step under the key's shard lock. The listing walks every shard (one
///   lock at a time) and sorts what it finds, so a page costs time in proportion to the
///   records held. A pending record whose lease passed stays until room is made, and is
///   listed until then.
/// - **Takeovers and re-sends.** A pending record whose lease passed stays until room is
///   made, so a reserve that takes it over answers
///   [`TakenOver`](super::Reservation::TakenOver) until then. Records keep the first
///   attempt's instant, by the same clock, for [`retake`](super::Store::retake) and
///   [`first_attempt_age`](super::Record::first_attempt_age).
/// - **Its own clock.** Expiry uses [`tokio::time::Instant`], so tests control it with tokio's
///   paused clock (`#[tokio::test(start_paused = true)]` and `tokio::time::advance`).
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::{Fingerprint, Message, MemoryStore, store::{Reservation, Store}};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::with_max_entries(10_000);
/// let message = Message::builder().from("a@example.com").to("b@example.com").text("hi").build()?;
/// let fingerprint = Fingerprint::of(&message);
///
/// let first = store.reserve("welcome:42", fingerprint, Duration::from_secs(600)).await?;
/// assert!(matches!(first, Reservation::Reserved { .. }));
/// let second = store.reserve("welcome:42", fingerprint, Duration::from_secs(600)).await?;
/// assert!(matches!(second, Reservation::Held { .. }));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    max_entries: usize,
    len: OwnLine<AtomicUsize>,
    /// When the store was made: its [`Tick`]s, and so listing cursors, count from it.
    epoch: Instant,
}

/// A value alone on its cache line. The record count changes with every new record: beside
/// the shards, the hasher and the clock's epoch, which every call reads, it would make each
/// thread's next read of them miss after another thread added a record.
#[repr(align(64))]
struct OwnLine<T>(T);

// The count fills its line: nothing else of the store's is on it.
const _: () = assert!(std::mem::size_of::<OwnLine<AtomicUsize>>() == 64);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// One lock's worth of records with two indexes: by expiry (to drop expired records first) and,
/// for done records, in order of completion (to drop the oldest done one next). Completion
/// times come from the clock rather than a shared counter, so shards never touch a common
/// cache line.
///
/// The map alone holds the keys. An index names a record by its key's hash and its version
/// (`seq`, unique in the shard): the map finds it from the hash and knows it by the version,
/// so the indexes keep no key, clone no `Arc`, and hash nothing.
struct Shard {
    /// The records by key, each key hashed once per call by the store's hasher (see [`key`]).
    map: Map<Entry>,
    /// Every record's key's hash at its place by expiry, whose tie-breaker is the record's
    /// version (see [`index`]).
    by_expiry: ExpiryIndex<Order, u64>,
    /// Done records in the order they were completed, oldest first: the version of each and
    /// its key's hash. Writes come in that order, so a queue keeps it; a record rewritten or
    /// removed since leaves a stale element, skipped when it reaches the front and swept out
    /// once the queue holds twice as many elements as the shard holds records (and 64).
    completed: VecDeque<(u64, u64)>,
    next_seq: u64,
}

/// A record's place in an index: a tick, then its version to break ties.
type Order = (Tick, u64);

/// An instant by the store's clock, as nanoseconds since the store was made: half the room of
/// an `Instant` in every record and index entry, and good for 584 years.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Tick(u64);

impl Tick {
    /// `d` after this tick, saturating at the end of time rather than overflowing.
    fn after(self, d: Duration) -> Self {
        Self(self.0.saturating_add(nanos(d)))
    }

    /// How long after `earlier` this tick is; zero when it is not.
    fn since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A tick, or none, in the room of one: a record keeps when its first attempt began when it
/// knows it. No first attempt begins at the end of time (a reserve's own `now`, 584 years on),
/// so that tick stands for none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MaybeTick(Tick);

impl MaybeTick {
    const NONE: Self = Self(Tick(u64::MAX));

    fn get(self) -> Option<Tick> {
        (self != Self::NONE).then_some(self.0)
    }
}

impl From<Option<Tick>> for MaybeTick {
    fn from(tick: Option<Tick>) -> Self {
        tick.map_or(Self::NONE, Self)
    }
}

struct Entry {
    fingerprint: Fingerprint,
    token: Token,
    /// The kept outcome: a record is done exactly when it has one, pending otherwise.
    outcome: Option<KeptOutcome>,
    expires_at: Tick,
    /// When the record was written; for a done record, its completion time.
    written_at: Tick,
    /// When the first attempt under the key began: the reserve that first took it, kept
    /// through retakes and takeovers of the same message.
    first_at: MaybeTick,
    /// Unique (within the shard) id of this version of the record; breaks ties in the indexes.
    seq: u64,
}

// A record and its key fill two cache lines of the map's table: what a new key writes.
const _: () = assert!(std::mem::size_of::<(key::StoredKey, Entry)>() == 128);

impl Entry {
    /// A pending record under `token`, held for `lease` from `now`, whose first attempt
    /// began at `first_at`, as version `seq` of the shard: what a reserve and a retake write.
    fn pending(
        fingerprint: Fingerprint,
        token: Token,
        now: Tick,
        lease: Duration,
        first_at: Tick,
        seq: u64,
    ) -> Self {
        Self {
            fingerprint,
            token,
            outcome: None,
            expires_at: now.after(lease),
            written_at: now,
            first_at: Some(first_at).into(),
            seq,
        }
    }

    fn state(&self) -> RecordState {
        match self.outcome {
            Some(_) => RecordState::Done,
            None => RecordState::Pending,
        }
    }

    /// Where the record stands in the expiry index.
    fn expiry_order(&self) -> Order {
        (self.expires_at, self.seq)
    }

    /// When a done record was completed, then its version: how the oldest done records of
    /// different shards compare.
    fn completion_order(&self) -> Option<Order> {
        (self.state() == RecordState::Done).then_some((self.written_at, self.seq))
    }

    fn is_live(&self, now: Tick) -> bool {
        self.expires_at > now
    }

    fn record(&self, now: Tick) -> Record {
        Record {
            state: self.state(),
            fingerprint: self.fingerprint,
            outcome: self.outcome.as_ref().map(KeptOutcome::outcome),
            first_attempt_age: self.first_at.get().map(|at| now.since(at)),
        }
    }
}

impl Shard {
    fn new() -> Self {
        Self {
            map: Map::default(),
            by_expiry: ExpiryIndex::new(),
            completed: VecDeque::new(),
            next_seq: 0,
        }
    }

    fn get(&self, key: Hashed<'_>) -> Option<&Entry> {
        self.map.get(key)
    }

    fn get_mut(&mut self, key: Hashed<'_>) -> Option<&mut Entry> {
        self.map.get_mut(key)
    }

    /// The record an index names: version `seq` of a key whose hash is `hash`.
    fn version(&self, hash: u64, seq: u64) -> Option<&Entry> {
        self.map.find(hash, |entry| entry.seq == seq)
    }

    fn next_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// Adds `entry` as the record of `key`, which the shard does not hold.
    fn add(&mut self, key: Hashed<'_>, entry: Entry) {
        self.index(key.hash, entry.expiry_order(), entry.state());
        self.map.insert_new(key.stored(), entry);
    }

    /// Replaces the record of `key` with `entry`, or adds it. A key already held keeps its
    /// stored copy.
    fn replace(&mut self, key: Hashed<'_>, entry: Entry) {
        let Some(slot) = self.get_mut(key) else {
            return self.add(key, entry);
        };
        let (expiry, state) = (entry.expiry_order(), entry.state());
        let old = std::mem::replace(slot, entry);
        self.reindex(key, &old, expiry, state);
    }

    /// Moves the record of `key`, just rewritten in place from `old`, in the indexes, to
    /// `expiry` and `state`.
    fn reindex(&mut self, key: Hashed<'_>, old: &Entry, expiry: Order, state: RecordState) {
        self.unindex(old);
        self.index(key.hash, expiry, state);
    }

    /// Indexes a record in `state` whose key's hash is `hash` and whose place by expiry is
    /// `expiry` (its version the tie-breaker).
    fn index(&mut self, hash: u64, expiry: Order, state: RecordState) {
        let lane = match state {
            RecordState::Pending => Lane::Pending,
            RecordState::Done => {
                if self.completed.len() > 2 * self.map.len() + 64 {
                    self.sweep_completed();
                }
                self.completed.push_back((expiry.1, hash));
                Lane::Done
            }
        };
        self.by_expiry.insert(expiry, hash, lane);
    }

    /// Takes `entry` out of the expiry index. (Its place in the completion queue goes stale.)
    fn unindex(&mut self, entry: &Entry) {
        self.by_expiry.remove(&entry.expiry_order());
    }

    /// Whether `element` of the completion queue is still the done record it was queued for.
    fn is_current(&self, &(seq, hash): &(u64, u64)) -> bool {
        self.version(hash, seq).is_some()
    }

    /// Drops the stale elements of the completion queue.
    fn sweep_completed(&mut self) {
        let mut completed = std::mem::take(&mut self.completed);
        completed.retain(|element| self.is_current(element));
        self.completed = completed;
    }

    /// The completion order of the oldest done record, dropping stale elements in front of it.
    fn oldest_done(&mut self) -> Option<Order> {
        while let Some(&(seq, hash)) = self.completed.front() {
            if let Some(entry) = self.version(hash, seq) {
                return entry.completion_order();
            }
            self.completed.pop_front();
        }
        None
    }

    fn remove(&mut self, key: Hashed<'_>) -> bool {
        match self.map.remove(key) {
            Some(entry) => {
                self.unindex(&entry);
                true
            }
            None => false,
        }
    }

    /// Drops up to `n` of the oldest done records, and the stale elements of the completion
    /// queue in front of them; answers how many records went.
    fn evict_oldest_done(&mut self, n: usize) -> usize {
        let mut dropped = 0;
        while dropped < n {
            let Some((seq, hash)) = self.completed.pop_front() else {
                break;
            };
            if let Some(entry) = self.map.remove_found(hash, |entry| entry.seq == seq) {
                self.unindex(&entry);
                dropped += 1;
            }
        }
        dropped
    }

    /// Drops every expired record; answers how many went.
    fn purge_expired(&mut self, now: Tick) -> usize {
        let mut dropped = 0;
        while let Some(((_, seq), hash)) = self.by_expiry.pop_first_if(|&(at, _)| at <= now) {
            if self
                .map
                .remove_found(hash, |entry| entry.seq == seq)
                .is_some()
            {
                dropped += 1;
            }
        }
        dropped
    }
}

impl MemoryStore {
    /// A store that keeps at most [`DEFAULT_MAX_ENTRIES`] records.
    pub fn new() -> Self {
        Self::with_max_entries(DEFAULT_MAX_ENTRIES)
    }

    /// A store that keeps at most `max_entries` records. With `0` it refuses every
    /// reservation with a capacity error.
    pub fn with_max_entries(max_entries: usize) -> Self {
        let hasher = RandomState::new();
        Self {
            inner: Arc::new(Inner {
                shards: (0..if max_entries < SMALL { 1 } else { SHARDS })
                    .map(|_| Mutex::new(Shard::new()))
                    .collect(),
                hasher,
                max_entries,
                len: OwnLine(AtomicUsize::new(0)),
                epoch: Instant::now(),
            }),
        }
    }

    /// The bound on records.
    pub fn max_entries(&self) -> usize {
        self.inner.max_entries
    }

    /// The records held, counting expired ones not dropped yet.
    pub fn len(&self) -> usize {
        self.inner.len.load(Ordering::Acquire)
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("len", &self.len())
            .field("max_entries", &self.inner.max_entries)
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// Now, by the store's clock.
    fn now(&self) -> Tick {
        Tick(nanos(Instant::now().saturating_duration_since(self.epoch)))
    }

    /// `key` hashed once for this call: for its shard and its shard's map.
    fn hashed<'a>(&self, key: &'a str) -> Hashed<'a> {
        Hashed::new(&self.hasher, key)
    }

    fn shard_index(&self, key: Hashed<'_>) -> usize {
        key.shard(self.shards.len())
    }

    fn shard(&self, key: Hashed<'_>) -> MutexGuard<'_, Shard> {
        lock(&self.shards[self.shard_index(key)])
    }

    /// Takes a slot for a new key, if the bound allows one.
    fn take_slot(&self) -> bool {
        self.len
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |len| {
                (len < self.max_entries).then_some(len + 1)
            })
            .is_ok()
    }

    /// Drops expired records, or else the oldest done ones, first in the new key's `home`
    /// shard (a small store's only one), then across shards; refuses when only live pending
    /// records remain. Never called with a shard lock held.
    fn make_room(&self, now: Tick, home: usize) -> Result<(), StoreError> {
        {
            let mut shard = lock(&self.shards[home]);
            let mut dropped = shard.purge_expired(now);
            if dropped == 0 {
                dropped = shard.evict_oldest_done(self.eviction_batch());
            }
            if dropped > 0 {
                self.len.fetch_sub(dropped, Ordering::AcqRel);
                return Ok(());
            }
        }
        if self.shards.len() == 1 {
            return Err(StoreError::capacity(self.max_entries));
        }
        let mut dropped = 0;
        for shard in self.shards.iter() {
            dropped += lock(shard).purge_expired(now);
        }
        if dropped > 0 {
            self.len.fetch_sub(dropped, Ordering::AcqRel);
            return Ok(());
        }
        let oldest = self
            .shards
            .iter()
            .enumerate()
            .filter_map(|(i, shard)| lock(shard).oldest_done().map(|order| (order, i)))
            .min();
        let Some((_, index)) = oldest else {
            return Err(StoreError::capacity(self.max_entries));
        };
        // Drop a few of that shard's oldest done records, so a full store scans the shards
        // once per batch of inserts rather than on every one.
        let dropped = lock(&self.shards[index]).evict_oldest_done(self.eviction_batch());
        self.len.fetch_sub(dropped, Ordering::AcqRel);
        Ok(())
    }

    /// How many done records one eviction drops: one in a small store (exact oldest-first
    /// order), up to 64 in a large one (oldest first within a shard).
    fn eviction_batch(&self) -> usize {
        (self.max_entries / 1024).clamp(1, 64)
    }

    fn reserve(
        &self,
        key: Hashed<'_>,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        loop {
            let now = self.now();
            {
                let mut guard = self.shard(key);
                let shard = &mut *guard;
                let seq = shard.next_seq();
                // One lookup: the record there, or room for a new one.
                match shard.map.slot(key) {
                    Slot::Taken(entry) => {
                        if entry.is_live(now) {
                            return Ok(Reservation::Held {
                                record: entry.record(now),
                            });
                        }
                        // A pending record whose lease passed lingers until room is made:
                        // taking it over is reported, and keeps the first attempt of the
                        // same message.
                        let previous =
                            (entry.state() == RecordState::Pending).then(|| entry.record(now));
                        let first_at = entry
                            .first_at
                            .get()
                            .filter(|_| previous.is_some() && entry.fingerprint == fingerprint)
                            .unwrap_or(now);
                        let token = Token::new();
                        let taken = Entry::pending(fingerprint, token, now, lease, first_at, seq);
                        let (expiry, state) = (taken.expiry_order(), taken.state());
                        let old = std::mem::replace(entry, taken);
                        shard.reindex(key, &old, expiry, state);
                        return Ok(match previous {
                            Some(previous) => Reservation::TakenOver { token, previous },
                            None => Reservation::Reserved { token },
                        });
                    }
                    Slot::Free(room) if self.take_slot() => {
                        let token = Token::new();
                        let added = Entry::pending(fingerprint, token, now, lease, now, seq);
                        let (expiry, state) = (added.expiry_order(), added.state());
                        room.fill(key.stored(), added);
                        shard.index(key.hash, expiry, state);
                        return Ok(Reservation::Reserved { token });
                    }
                    Slot::Free(_) => {}
                }
            }
            self.make_room(now, self.shard_index(key))?;
        }
    }

    fn complete(
        &self,
        key: Hashed<'_>,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        loop {
            let now = self.now();
            {
                let mut shard = self.shard(key);
                let seq = shard.next_seq();
                let done = |first_at: Option<Tick>| Entry {
                    fingerprint,
                    token,
                    outcome: Some(KeptOutcome::of(outcome)),
                    expires_at: now.after(ttl),
                    written_at: now,
                    first_at: first_at.into(),
                    seq,
                };
                // One lookup: a record there is rewritten in place.
                match shard.get_mut(key) {
                    Some(entry) if entry.is_live(now) && entry.token != token => return Ok(false),
                    Some(slot) => {
                        // The first attempt is known when this token's own record is still
                        // there.
                        let first_at = slot.first_at.get().filter(|_| slot.token == token);
                        let entry = done(first_at);
                        let (expiry, state) = (entry.expiry_order(), entry.state());
                        let old = std::mem::replace(slot, entry);
                        shard.reindex(key, &old, expiry, state);
                        return Ok(true);
                    }
                    None if self.take_slot() => {
                        shard.add(key, done(None));
                        return Ok(true);
                    }
                    None => {}
                }
            }
            self.make_room(now, self.shard_index(key))?;
        }
    }

    fn release(&self, key: Hashed<'_>, token: Token) -> bool {
        let mut shard = self.shard(key);
        let holds = shard
            .get(key)
            .is_some_and(|e| e.token == token && e.state() == RecordState::Pending);
        if holds && shard.remove(key) {
            self.len.fetch_sub(1, Ordering::AcqRel);
            return true;
        }
        false
    }

    fn extend(&self, key: Hashed<'_>, token: Token, lease: Duration) -> bool {
        let now = self.now();
        let mut shard = self.shard(key);
        let (fingerprint, written_at, first_at) = match shard.get(key) {
            Some(e) if e.is_live(now) && e.token == token && e.state() == RecordState::Pending => {
                (e.fingerprint, e.written_at, e.first_at)
            }
            _ => return false,
        };
        // Re-inserted under a new sequence number, so the expiry index moves with it.
        let entry = Entry {
            fingerprint,
            token,
            outcome: None,
            expires_at: now.after(lease),
            written_at,
            first_at,
            seq: shard.next_seq(),
        };
        shard.replace(key, entry);
        true
    }

    fn retake(
        &self,
        key: Hashed<'_>,
        fingerprint: Fingerprint,
        lease: Duration,
        within: Duration,
    ) -> Option<Token> {
        let now = self.now();
        let mut shard = self.shard(key);
        let entry = shard.get(key)?;
        let record = entry.record(now);
        let first_at = entry.first_at.get()?;
        let retakes = entry.is_live(now)
            && record.fingerprint == fingerprint
            && record.is_unknown_delivery()
            && record.first_attempt_age.is_some_and(|age| age < within);
        if !retakes {
            return None;
        }
        let token = Token::new();
        let entry = Entry::pending(fingerprint, token, now, lease, first_at, shard.next_seq());
        shard.replace(key, entry);
        Some(token)
    }
}

/// The records stay consistent whatever a panicking thread left half done: every mutation
/// here completes before it can panic, so a poisoned lock is safe to use.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Store for MemoryStore {
    fn reserve<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        std::future::ready(
            self.inner
                .reserve(self.inner.hashed(key), fingerprint, lease),
        )
        .boxed()
    }

    fn reserve_now(
        &self,
        key: &Arc<str>,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Option<Result<Reservation, StoreError>> {
        let key = Hashed::shared(&self.inner.hasher, key);
        Some(self.inner.reserve(key, fingerprint, lease))
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        std::future::ready(self.inner.complete(
            self.inner.hashed(key),
            token,
            fingerprint,
            outcome,
            ttl,
        ))
        .boxed()
    }

    fn complete_now(
        &self,
        key: &Arc<str>,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Option<Result<bool, StoreError>> {
        let key = Hashed::shared(&self.inner.hasher, key);
        Some(self.inner.complete(key, token, fingerprint, outcome, ttl))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        std::future::ready(Ok(self.inner.release(self.inner.hashed(key), token))).boxed()
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        std::future::ready(Ok(self.inner.extend(self.inner.hashed(key), token, lease))).boxed()
    }

    fn retake<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
        within: Duration,
    ) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        std::future::ready(Ok(self.inner.retake(
            self.inner.hashed(key),
            fingerprint,
            lease,
            within,
        )))
        .boxed()
    }
}

#[cfg(test)]
mod tests;
