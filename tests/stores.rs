//! Store conformance and the memory store's own rules.

mod support;

use std::time::Duration;

use support::stores::fp;
use tower_idempotency::MemoryStore;
use tower_idempotency::outcome::{Outcome, Receipt};
use tower_idempotency::store::conformance::Conformance;
use tower_idempotency::store::{RecordState, Reservation, Store, StoreErrorKind, Token};

mod memory_conformance {
    use super::*;

    async fn suite() -> Option<Conformance> {
        Some(Conformance::with_admin(MemoryStore::new()).paused_clock())
    }

    tower_idempotency::store_conformance_tests!(
        #[tokio::test(start_paused = true)]
        suite()
    );
}

/// A setup that answers `None` (a server missing) fails every case as not run: none of
/// them passes without checking anything.
mod a_setup_that_answers_none_runs_nothing {
    tower_idempotency::store_conformance_tests!(
        #[tokio::test]
        #[should_panic(expected = "not run: ")]
        async {
            None::<tower_idempotency::store::conformance::Conformance>
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_suite_without_admin_reports_the_admin_cases_as_not_run() {
    let report = Conformance::new(MemoryStore::new())
        .paused_clock()
        .run_all()
        .await;
    assert!(!report.is_complete());
    let not_run: Vec<&str> = report.not_run.iter().map(|n| n.case).collect();
    assert!(
        not_run.contains(&"admin_list_pages_through_unknown_keys_oldest_first"),
        "{report}"
    );
    assert!(
        not_run.iter().all(|case| case.starts_with("admin_")),
        "{report}"
    );
    assert!(
        !report.passed.iter().any(|case| case.starts_with("admin_")),
        "{report}"
    );
    assert!(report.passed.contains(&"reserve_on_nothing_reserves"));
    assert!(report.to_string().contains("not run: admin_"), "{report}");
    let incomplete = std::panic::catch_unwind(|| report.assert_complete());
    assert!(
        incomplete.is_err(),
        "a report with cases not run is not complete"
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_suite_on_the_memory_store_runs_every_case() {
    let report = Conformance::with_admin(MemoryStore::new())
        .paused_clock()
        .run_all()
        .await;
    report.assert_complete();
    assert!(
        report
            .passed
            .contains(&"admin_a_forced_out_send_keeps_its_outcome_unless_another_holds_the_key")
    );
}

#[tokio::test(start_paused = true)]
async fn a_suite_without_resend_reports_those_cases_as_not_run() {
    let report = Conformance::with_admin(MemoryStore::new())
        .paused_clock()
        .without_resend()
        .run_all()
        .await;
    let not_run: Vec<&str> = report.not_run.iter().map(|n| n.case).collect();
    assert!(
        not_run.contains(&"concurrent_retakes_of_one_key_take_it_back_once"),
        "{report}"
    );
    assert!(
        !report
            .passed
            .contains(&"concurrent_retakes_of_one_key_take_it_back_once"),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_passes_the_suite_under_real_threads() {
    // The race case again, with the reserves spread across OS threads.
    Conformance::new(MemoryStore::new())
        .concurrent_reserves_of_one_key_reserve_once()
        .await;
}

const LEASE: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(3600);

async fn reserve(store: &MemoryStore, key: &str) -> Result<Token, StoreErrorKind> {
    match store.reserve(key, fp(7), LEASE).await {
        Ok(Reservation::Reserved { token }) => Ok(token),
        Ok(Reservation::Held { record }) => panic!("{key} unexpectedly held: {record:?}"),
        Ok(other) => panic!("{key}: unexpected reservation {other:?}"),
        Err(e) => Err(e.kind()),
    }
}

async fn done(store: &MemoryStore, key: &str) {
    let token = reserve(store, key).await.expect("room to reserve");
    let outcome = Outcome::sent(Receipt::new(key, "test"));
    assert!(
        store
            .complete(key, token, fp(7), &outcome, TTL)
            .await
            .unwrap()
    );
}

async fn state(store: &MemoryStore, key: &str) -> Option<RecordState> {
    match store.reserve(key, fp(7), LEASE).await.unwrap() {
        Reservation::Held { record } => Some(record.state),
        Reservation::Reserved { token } => {
            store.release(key, token).await.unwrap();
            None
        }
        other => panic!("{key}: unexpected reservation {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn full_store_drops_expired_records_before_done_ones() {
    let store = MemoryStore::with_max_entries(3);
    done(&store, "done-old").await;
    reserve(&store, "pending-short").await.unwrap();
    done(&store, "done-new").await;
    // The pending lease passes, the done records are still within their ttl.
    tokio::time::advance(LEASE + Duration::from_secs(1)).await;
    reserve(&store, "incoming")
        .await
        .expect("an expired record makes room");
    assert_eq!(state(&store, "done-old").await, Some(RecordState::Done));
    assert_eq!(state(&store, "done-new").await, Some(RecordState::Done));
    assert_eq!(store.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn full_store_drops_the_oldest_done_record_and_never_a_live_pending_one() {
    let store = MemoryStore::with_max_entries(3);
    reserve(&store, "pending").await.unwrap();
    done(&store, "done-1").await;
    // "Oldest" is by completion time on the store's clock.
    tokio::time::advance(Duration::from_secs(1)).await;
    done(&store, "done-2").await;

    reserve(&store, "incoming-1")
        .await
        .expect("the oldest done record makes room");
    // Three records: pending, done-2 and incoming-1, so done-1 is the one that went.
    assert_eq!(store.len(), 3);
    assert_eq!(state(&store, "pending").await, Some(RecordState::Pending));
    assert_eq!(state(&store, "done-2").await, Some(RecordState::Done));

    reserve(&store, "incoming-2")
        .await
        .expect("done-2 makes room");
    // Only live pending records remain: the next one is refused, none of them dropped.
    assert_eq!(
        reserve(&store, "incoming-3").await,
        Err(StoreErrorKind::Capacity)
    );
    for key in ["pending", "incoming-1", "incoming-2"] {
        assert_eq!(
            state(&store, key).await,
            Some(RecordState::Pending),
            "{key}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn full_store_of_live_pending_records_refuses_with_a_capacity_error() {
    let store = MemoryStore::with_max_entries(2);
    reserve(&store, "a").await.unwrap();
    reserve(&store, "b").await.unwrap();
    assert_eq!(reserve(&store, "c").await, Err(StoreErrorKind::Capacity));
    assert_eq!(state(&store, "a").await, Some(RecordState::Pending));
    assert_eq!(state(&store, "b").await, Some(RecordState::Pending));
    // Once a lease has passed, that record is expired and makes room.
    tokio::time::advance(LEASE).await;
    reserve(&store, "c")
        .await
        .expect("expired pending records make room");
}

#[tokio::test(start_paused = true)]
async fn completing_a_new_key_in_a_full_store_also_makes_room() {
    let store = MemoryStore::with_max_entries(1);
    done(&store, "old").await;
    let outcome = Outcome::sent(Receipt::new("m", "test"));
    assert!(
        store
            .complete("new", Token::new(), fp(7), &outcome, TTL)
            .await
            .unwrap()
    );
    assert_eq!(state(&store, "new").await, Some(RecordState::Done));
}

#[tokio::test(start_paused = true)]
async fn a_large_full_store_drops_done_records_a_few_at_a_time_and_no_pending_one() {
    // 4096 entries: an eviction may drop up to 4 done records of one shard at once.
    let store = MemoryStore::with_max_entries(4096);
    for i in 0..4090 {
        reserve(&store, &format!("pending-{i}")).await.unwrap();
    }
    for i in 0..6 {
        done(&store, &format!("done-{i}")).await;
    }
    assert_eq!(store.len(), 4096);
    // Six done records make room for exactly six inserts, however they are batched.
    for i in 0..6 {
        reserve(&store, &format!("incoming-{i}"))
            .await
            .expect("a done record makes room");
        assert!(store.len() <= 4096);
    }
    assert_eq!(
        reserve(&store, "incoming-6").await,
        Err(StoreErrorKind::Capacity)
    );
    assert_eq!(store.len(), 4096);
    for i in (0..4090).step_by(409) {
        let key = format!("pending-{i}");
        assert_eq!(
            state(&store, &key).await,
            Some(RecordState::Pending),
            "{key}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_large_full_store_evicts_old_done_records_and_keeps_the_newest() {
    let store = MemoryStore::with_max_entries(4096);
    for i in 0..4096 {
        done(&store, &format!("done-{i}")).await;
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    for i in 0..64 {
        reserve(&store, &format!("incoming-{i}"))
            .await
            .expect("old done records make room");
    }
    assert!(store.len() <= 4096);
    // Eviction is oldest-first per shard: the 64 newest done records all survive.
    for i in 4096 - 64..4096 {
        let key = format!("done-{i}");
        assert_eq!(state(&store, &key).await, Some(RecordState::Done), "{key}");
    }
}

#[tokio::test]
async fn zero_capacity_refuses_instead_of_panicking() {
    let store = MemoryStore::with_max_entries(0);
    assert_eq!(reserve(&store, "k").await, Err(StoreErrorKind::Capacity));
}

#[tokio::test]
async fn huge_leases_do_not_overflow_the_clock() {
    let store = MemoryStore::new();
    let r = store
        .reserve("forever", fp(7), Duration::MAX)
        .await
        .unwrap();
    assert!(matches!(r, Reservation::Reserved { .. }));
}

#[tokio::test]
async fn clones_share_records() {
    let a = MemoryStore::new();
    let b = a.clone();
    reserve(&a, "shared").await.unwrap();
    assert_eq!(state(&b, "shared").await, Some(RecordState::Pending));
}
