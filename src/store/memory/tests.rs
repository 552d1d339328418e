//! The memory store's own bookkeeping: its completion queue and its copies of keys, which
//! the conformance suite cannot see.

use std::sync::Arc;
use std::time::Duration;

use super::MemoryStore;
use crate::fingerprint::Fingerprint;
use crate::outcome::{Outcome, Receipt, SendError};
use crate::store::{RecordState, Reservation, Store, Token};

const LEASE: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(3600);

fn fp() -> Fingerprint {
    Fingerprint::from_bytes([7; 32])
}

async fn reserve(store: &MemoryStore, key: &str) -> Token {
    match store.reserve(key, fp(), LEASE).await {
        Ok(Reservation::Reserved { token }) => token,
        other => panic!("{key}: expected a reservation, got {other:?}"),
    }
}

async fn complete(store: &MemoryStore, key: &str, token: Token) {
    let outcome = Outcome::sent(Receipt::new(key, "test"));
    assert!(
        store
            .complete(key, token, fp(), &outcome, TTL)
            .await
            .unwrap()
    );
}

fn state(store: &MemoryStore, key: &str) -> Option<RecordState> {
    let key = store.inner.hashed(key);
    store.inner.shard(key).get(key).map(|entry| entry.state())
}

#[tokio::test(start_paused = true)]
async fn a_record_completed_again_is_as_old_as_its_latest_completion() {
    let store = MemoryStore::with_max_entries(2);
    let a = reserve(&store, "a").await;
    complete(&store, "a", a).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    let b = reserve(&store, "b").await;
    complete(&store, "b", b).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    // The same token keeps "a" again: its first completion is now stale.
    complete(&store, "a", a).await;

    reserve(&store, "c").await;
    assert_eq!(state(&store, "b"), None, "b is the oldest completion");
    assert_eq!(state(&store, "a"), Some(RecordState::Done));
}

#[tokio::test(start_paused = true)]
async fn rewrites_do_not_grow_the_completion_queue_without_bound() {
    let store = MemoryStore::with_max_entries(10);
    let token = reserve(&store, "k").await;
    for _ in 0..10_000 {
        complete(&store, "k", token).await;
    }
    // Swept once it holds more than twice the records and 64, before the next element.
    let queued = store.inner.shard(store.inner.hashed("k")).completed.len();
    assert!(
        queued <= 2 + 64 + 1,
        "{queued} elements queued for one record"
    );
}

#[tokio::test(start_paused = true)]
async fn outcomes_come_back_as_they_were_kept() {
    let store = MemoryStore::new();
    let given = [
        Outcome::sent(Receipt::new("m1", "resend")),
        Outcome::sent(Receipt::new("m2", "resend").with_accepted(["a@example.com"])),
        Outcome::failed(SendError::aborted()),
        // The id and transport share one allocation: where one ends is kept exactly.
        Outcome::sent(Receipt::new("", "resend")),
        Outcome::sent(Receipt::new("m\u{e9}\u{1f4e7}", "")),
        Outcome::sent(Receipt::new("m5", "tr\u{e4}nsport")),
        // Accepted recipients by position, as the layer keeps them.
        Outcome::kept(
            &Ok(Receipt::new("m6", "resend").with_accepted(["b@example.com"])),
            &["a@example.com", "b@example.com"],
        ),
    ];
    for (i, outcome) in given.iter().enumerate() {
        let key = format!("k{i}");
        let token = reserve(&store, &key).await;
        assert!(
            store
                .complete(&key, token, fp(), outcome, TTL)
                .await
                .unwrap()
        );
        let Ok(Reservation::Held { record }) = store.reserve(&key, fp(), LEASE).await else {
            panic!("{key} is held");
        };
        let kept = record.outcome.expect("a done record keeps its outcome");
        assert_eq!(format!("{kept:?}"), format!("{outcome:?}"), "{key}");
    }
}

#[test]
fn a_key_given_shared_is_kept_shared_not_copied() {
    let store = MemoryStore::new();
    let key: Arc<str> = Arc::from("shared");
    let reserved = store.reserve_now(&key, fp(), LEASE);
    let Some(Ok(Reservation::Reserved { token })) = reserved else {
        panic!("a free key is reserved: {reserved:?}");
    };
    // The map holds a clone of the caller's key; the indexes name the record by its hash.
    assert_eq!(Arc::strong_count(&key), 2);
    let outcome = Outcome::sent(Receipt::new("m1", "test"));
    let kept = store.complete_now(&key, token, fp(), &outcome, TTL);
    assert!(matches!(kept, Some(Ok(true))), "{kept:?}");
    // Completed: still the map's one clone; the completion queue holds the key's hash.
    assert_eq!(Arc::strong_count(&key), 2);
    let queued = store
        .inner
        .shard(store.inner.hashed("shared"))
        .completed
        .len();
    assert_eq!(queued, 1);
}

#[test]
fn a_maybe_tick_is_a_tick_or_none_in_eight_bytes() {
    use super::{MaybeTick, Tick};
    assert_eq!(std::mem::size_of::<MaybeTick>(), 8);
    assert_eq!(MaybeTick::from(None).get(), None);
    for tick in [0, 1, u64::MAX - 1] {
        assert_eq!(MaybeTick::from(Some(Tick(tick))).get(), Some(Tick(tick)));
    }
}

#[test]
fn a_small_store_has_one_lock_and_a_large_one_thirty_two() {
    for (max, locks) in [(0, 1), (1, 1), (2047, 1), (2048, 32), (usize::MAX, 32)] {
        let store = MemoryStore::with_max_entries(max);
        assert_eq!(store.inner.shards.len(), locks, "max_entries {max}");
    }
}
