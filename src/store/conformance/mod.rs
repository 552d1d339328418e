//! The conformance suite every [`Store`] must pass (feature `test-util`).
//!
//! Each case is a method of [`Conformance`]; [`store_conformance_tests!`](crate::store_conformance_tests)
//! turns them into one test each. A third-party store runs it like this:
//!
//! ```no_run
//! use tower_idempotency::{store::conformance::Conformance, MemoryStore};
//!
//! async fn suite() -> Option<Conformance> {
//!     // A store on a real server would connect here; `None` fails every case as not run.
//!     Some(Conformance::with_admin(MemoryStore::new()).paused_clock())
//! }
//!
//! tower_idempotency::store_conformance_tests!(#[tokio::test(start_paused = true)] suite());
//! # fn main() {}
//! ```
//!
//! Time: a store whose clock is tokio's (like [`MemoryStore`](super::memory::MemoryStore)) runs with
//! [`paused_clock`](Conformance::paused_clock) and time is advanced instantly; a store on a
//! server runs with the default real clock, short leases, and waits for them to pass.
//!
//! # What it ran
//!
//! A case that could not run is reported as **not run**, never as passed. The cases on
//! [`StoreAdmin`] (reading, forgetting, resolving and listing keys) run when the suite is
//! built with [`with_admin`](Conformance::with_admin); built with [`new`](Conformance::new),
//! for a store that does not implement it, they cannot. Nor can the cases on re-sends and
//! takeovers of a suite built [`without_resend`](Conformance::without_resend). So:
//!
//! - [`run_all`](Conformance::run_all) answers a [`Report`]: the cases that passed and those
//!   not run, with the reason; [`Report::assert_complete`] fails unless every case ran.
//! - [`store_conformance_tests!`](crate::store_conformance_tests) fails the test of a case
//!   that did not run (its message starts with `not run:`), as it fails every case when the
//!   setup answers `None`: libtest cannot mark a test ignored at run time, and a test that
//!   passed without checking anything would say the store conforms. Mark the tests
//!   `ignore`d when their server is missing (the macro takes a second attribute, such as
//!   `#[cfg_attr(not(my_server), ignore = "no server")]`). A store without [`StoreAdmin`]
//!   calls the cases it runs one by one (each is a public method), or runs
//!   [`run_all`](Conformance::run_all) and checks [`Report::not_run`] is what it expects.
//!
//! The cases on [`Store::extend`] fail for a store that keeps the trait's default (an
//! [`Unsupported`](super::StoreErrorKind::Unsupported) error): without it the layer cannot
//! renew the lease of a send that outlives it. So do the cases on [`Store::retake`] and on
//! takeover reports ([`Reservation::TakenOver`], [`Record::first_attempt_age`](super::Record::first_attempt_age)),
//! unless the suite is built [`without_resend`](Conformance::without_resend).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::admin::StoreAdmin;
use super::{RecordState, Reservation, Store, StoreError, Token};
use crate::fingerprint::Fingerprint;
use crate::outcome::{Outcome, Receipt, SendError};

mod admin;
mod batch;
mod expiry;
mod extend;
mod resend;

#[derive(Debug, Clone, Copy)]
enum Clock {
    Paused,
    Real,
}

/// A store under test, with the key prefix and clock its cases use.
pub struct Conformance {
    store: Arc<dyn Store>,
    admin: Option<Arc<dyn StoreAdmin>>,
    prefix: String,
    clock: Clock,
    lease: Duration,
    resend: bool,
    /// Why the case running now cannot run, once it found out.
    not_run: Mutex<Option<&'static str>>,
}

/// What [`Conformance::run_all`] ran: the cases that passed, and those it could not run.
///
/// A case that fails panics, as a test does; a report is made only when none failed.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Report {
    /// The cases that ran and passed, in the order they ran.
    pub passed: Vec<&'static str>,
    /// The cases that could not run (so checked nothing), with the reason.
    pub not_run: Vec<NotRun>,
}

/// A case of the suite that could not run.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NotRun {
    /// The case's name, its method's.
    pub case: &'static str,
    /// Why it could not run.
    pub reason: &'static str,
}

impl Report {
    /// Whether every case ran.
    pub fn is_complete(&self) -> bool {
        self.not_run.is_empty()
    }

    /// Panics, listing the cases not run, unless every case ran.
    #[track_caller]
    pub fn assert_complete(&self) {
        assert!(self.is_complete(), "{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} conformance cases passed, {} not run",
            self.passed.len(),
            self.not_run.len()
        )?;
        for not_run in &self.not_run {
            write!(f, "\nnot run: {}: {}", not_run.case, not_run.reason)?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Conformance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conformance")
            .field("prefix", &self.prefix)
            .field("clock", &self.clock)
            .field("lease", &self.lease)
            .field("admin", &self.admin.is_some())
            .finish_non_exhaustive()
    }
}

const CONCURRENT_RESERVES: usize = 64;

impl Conformance {
    /// The suite over `store`, with a fresh random key prefix and the real clock (leases of
    /// 300 ms that the cases wait out).
    pub fn new(store: impl Store) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// The suite over a shared store.
    pub fn from_arc(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            admin: None,
            prefix: format!("conformance:{}:", Token::new()),
            clock: Clock::Real,
            lease: Duration::from_millis(300),
            resend: true,
            not_run: Mutex::new(None),
        }
    }

    /// The suite over a store that also implements [`StoreAdmin`]: the admin cases run too.
    pub fn with_admin(store: impl StoreAdmin) -> Self {
        let store: Arc<dyn StoreAdmin> = Arc::new(store);
        let mut suite = Self::from_arc(Arc::clone(&store) as Arc<dyn Store>);
        suite.admin = Some(store);
        suite
    }

    /// Advances tokio's paused clock instead of waiting; for stores whose clock is tokio's,
    /// in tests with `start_paused = true`.
    #[must_use]
    pub fn paused_clock(mut self) -> Self {
        self.clock = Clock::Paused;
        self.lease = Duration::from_secs(10);
        self
    }

    /// Sets the lease the real-clock cases wait out (default 300 ms). Longer is slower but
    /// more tolerant of a slow server.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// For a store that keeps the trait's default [`Store::retake`] and does not report
    /// takeovers ([`Reservation::TakenOver`]): the cases on them are reported as not run
    /// (see [What it ran](self#what-it-ran)). The layer then replays kept outcomes of unknown delivery inside the provider's
    /// window, and sends after a takeover without checking first.
    #[must_use]
    pub fn without_resend(mut self) -> Self {
        self.resend = false;
        self
    }

    /// Sets the key prefix (default: `conformance:<random>:`).
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Why the case that ran last could not run, when it could not (it then checked
    /// nothing); cleared by asking. [`store_conformance_tests!`](crate::store_conformance_tests)
    /// asks after each case, and fails the case's test with it.
    pub fn take_not_run(&self) -> Option<&'static str> {
        self.not_run
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// This suite for one case of [`run_all`](Self::run_all), under a prefix of its own: a
    /// case that lists keys sees its own only, as it does in a test of its own.
    fn for_case(&self, case: &str) -> Self {
        Self {
            store: Arc::clone(&self.store),
            admin: self.admin.clone(),
            prefix: format!("{}{case}:", self.prefix),
            clock: self.clock,
            lease: self.lease,
            resend: self.resend,
            not_run: Mutex::new(None),
        }
    }

    /// Records that the case running now cannot run, and why.
    fn cannot_run(&self, reason: &'static str) {
        *self.not_run.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason);
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn ttl(&self) -> Duration {
        self.lease * 2
    }

    /// Lets `d` pass on the store's clock.
    async fn pass(&self, d: Duration) {
        match self.clock {
            Clock::Paused => tokio::time::advance(d).await,
            // Waits for the server's clock: a deadline on the server, not synchronisation.
            Clock::Real => tokio::time::sleep(d).await,
        }
    }

    /// Waits until a record made with `d` has surely expired.
    async fn outlive(&self, d: Duration) {
        self.pass(d + d / 2 + Duration::from_millis(20)).await;
    }

    async fn reserve(&self, key: &str, fp: Fingerprint) -> Reservation {
        self.store
            .reserve(key, fp, self.lease)
            .await
            .unwrap_or_else(|e| panic!("reserve failed: {e}"))
    }

    async fn reserved(&self, key: &str, fp: Fingerprint) -> Token {
        match self.reserve(key, fp).await {
            // A reserve after a lease passed may report the takeover: it still reserves.
            Reservation::Reserved { token } | Reservation::TakenOver { token, .. } => token,
            Reservation::Held { record } => panic!("expected reserved, found held: {record:?}"),
        }
    }

    async fn complete(&self, key: &str, token: Token, fp: Fingerprint, outcome: &Outcome) -> bool {
        self.store
            .complete(key, token, fp, outcome, self.ttl())
            .await
            .unwrap_or_else(|e| panic!("complete failed: {e}"))
    }

    async fn release(&self, key: &str, token: Token) -> bool {
        self.store
            .release(key, token)
            .await
            .unwrap_or_else(|e| panic!("release failed: {e}"))
    }

    /// Every case, one after the other; answers which passed and which could not run.
    ///
    /// A case that fails panics. Call [`Report::assert_complete`] on the answer to fail
    /// unless every case ran.
    pub async fn run_all(&self) -> Report {
        let mut report = Report::default();
        macro_rules! run {
            ($($case:ident),* $(,)?) => {$(
                let suite = self.for_case(stringify!($case));
                suite.$case().await;
                match suite.take_not_run() {
                    Some(reason) => report.not_run.push(NotRun {
                        case: stringify!($case),
                        reason,
                    }),
                    None => report.passed.push(stringify!($case)),
                }
            )*};
        }
        run!(
            reserve_on_nothing_reserves,
            reserve_while_pending_is_held,
            complete_then_reserve_is_held_done_with_outcome,
            complete_keeps_an_error_outcome,
            release_by_holder_frees_the_key,
            release_by_another_token_changes_nothing,
            release_of_a_done_key_changes_nothing,
            reserve_after_lease_takes_key_with_new_token,
            stale_token_cannot_complete_or_release_new_owners_key,
            complete_when_nothing_holds_the_key_writes_done,
            done_key_is_free_after_ttl,
            keys_are_independent,
            concurrent_reserves_of_one_key_reserve_once,
            reserve_now_answers_what_reserve_would,
            complete_now_keeps_the_outcome_fenced_by_token,
            reserve_many_reserves_free_keys_and_reports_held_ones,
            complete_many_and_release_many_are_fenced_by_token,
            batch_calls_with_nothing_in_them_answer_nothing,
            concurrent_overlapping_batches_reserve_each_key_once,
            extend_by_the_holder_keeps_the_key_past_its_first_lease,
            an_extended_lease_ends,
            extend_sets_the_end_from_now_even_when_sooner,
            extend_by_another_token_changes_nothing,
            extend_of_a_done_key_changes_nothing,
            extend_of_a_released_key_changes_nothing,
            extend_after_the_lease_passed_revives_nothing,
            admin_inspect_reads_state_fingerprint_outcome_and_time_left,
            admin_forget_and_resolve_leave_a_live_send_alone_unless_forced,
            admin_a_forced_out_send_keeps_its_outcome_unless_another_holds_the_key,
            admin_resolve_as_delivered_answers_repeats_with_the_receipt,
            admin_resolve_as_not_sent_frees_the_key,
            admin_forget_deletes_any_record_and_nothing_answers_nothing_there,
            admin_list_pages_through_unknown_keys_oldest_first,
            admin_list_shows_a_pending_key_past_its_lease_only_where_kept,
            records_carry_the_first_attempts_age,
            reserve_after_a_lease_passed_reports_the_takeover,
            retake_takes_back_a_key_of_unknown_delivery_inside_the_window,
            retake_leaves_other_messages_old_attempts_and_free_keys_alone,
            concurrent_retakes_of_one_key_take_it_back_once,
        );
        report
    }

    /// Reserve on an empty key answers reserved.
    pub async fn reserve_on_nothing_reserves(&self) {
        self.reserved(&self.key("fresh"), fp(1)).await;
    }

    /// Reserve while a pending record holds the key answers held, pending, with its
    /// fingerprint and no outcome.
    pub async fn reserve_while_pending_is_held(&self) {
        let key = self.key("pending");
        self.reserved(&key, fp(1)).await;
        match self.reserve(&key, fp(2)).await {
            Reservation::Held { record } => {
                assert_eq!(record.state, RecordState::Pending);
                assert_eq!(record.fingerprint, fp(1));
                assert!(record.outcome.is_none());
            }
            Reservation::Reserved { .. } | Reservation::TakenOver { .. } => {
                panic!("a pending key was reserved twice")
            }
        }
    }

    /// After complete, reserve answers held, done, with the outcome.
    pub async fn complete_then_reserve_is_held_done_with_outcome(&self) {
        let key = self.key("done");
        let token = self.reserved(&key, fp(1)).await;
        let outcome = Outcome::sent(Receipt::new("msg-1", "conformance").with_accepted(["a@x"]));
        assert!(self.complete(&key, token, fp(1), &outcome).await);
        match self.reserve(&key, fp(1)).await {
            Reservation::Held { record } => {
                assert_eq!(record.state, RecordState::Done);
                assert_eq!(record.fingerprint, fp(1));
                let receipt = record
                    .outcome
                    .expect("a done record has an outcome")
                    .replay()
                    .expect("the outcome was a receipt");
                assert_eq!(receipt.id, "msg-1");
                assert_eq!(receipt.transport, "conformance");
                assert_eq!(receipt.accepted, ["a@x"]);
            }
            Reservation::Reserved { .. } | Reservation::TakenOver { .. } => {
                panic!("a done key was reserved again")
            }
        }
    }

    /// A kept error outcome comes back with its code and category.
    pub async fn complete_keeps_an_error_outcome(&self) {
        let key = self.key("unknown");
        let token = self.reserved(&key, fp(1)).await;
        let outcome = Outcome::failed(SendError::unknown_delivery("provider.timeout", "timed out"));
        assert!(self.complete(&key, token, fp(1), &outcome).await);
        let Reservation::Held { record } = self.reserve(&key, fp(1)).await else {
            panic!("a done key was reserved again")
        };
        let error = record.outcome.expect("outcome").replay().unwrap_err();
        assert_eq!(error.code(), "provider.timeout");
        assert!(error.delivery_unknown());
    }

    /// Release by the holder frees the key for a new reserve.
    pub async fn release_by_holder_frees_the_key(&self) {
        let key = self.key("release");
        let token = self.reserved(&key, fp(1)).await;
        assert!(self.release(&key, token).await);
        let again = self.reserved(&key, fp(1)).await;
        assert_ne!(again, token, "a new reservation gets a new token");
    }

    /// Release with another token leaves the pending record in place.
    pub async fn release_by_another_token_changes_nothing(&self) {
        let key = self.key("release-other");
        self.reserved(&key, fp(1)).await;
        assert!(!self.release(&key, Token::new()).await);
        assert!(matches!(
            self.reserve(&key, fp(1)).await,
            Reservation::Held { record } if record.state == RecordState::Pending
        ));
    }

    /// Release of a done key, even by its own token, leaves it done.
    pub async fn release_of_a_done_key_changes_nothing(&self) {
        let key = self.key("release-done");
        let token = self.reserved(&key, fp(1)).await;
        let outcome = Outcome::sent(Receipt::new("m", "conformance"));
        assert!(self.complete(&key, token, fp(1), &outcome).await);
        assert!(!self.release(&key, token).await);
        assert!(matches!(
            self.reserve(&key, fp(1)).await,
            Reservation::Held { record } if record.state == RecordState::Done
        ));
    }

    /// Records under one key do not touch another.
    pub async fn keys_are_independent(&self) {
        let a = self.key("independent-a");
        let b = self.key("independent-b");
        let token = self.reserved(&a, fp(1)).await;
        self.reserved(&b, fp(1)).await;
        assert!(!self.release(&b, token).await);
        assert!(self.release(&a, token).await);
    }

    /// 64 concurrent reserves of one key: exactly one is reserved, the others see it held.
    pub async fn concurrent_reserves_of_one_key_reserve_once(&self) {
        let key = self.key("race");
        let lease = self.lease * 20;
        let tasks = self.racing(|store, _| {
            let key = key.clone();
            async move { store.reserve(&key, fp(1), lease).await }
        });
        let reserved = reserved_by(tasks).await;
        assert_eq!(
            reserved, 1,
            "{CONCURRENT_RESERVES} racing reserves of one key"
        );
    }

    /// A store that answers [`reserve_now`](Store::reserve_now) answers what `reserve`
    /// would, and a key raced through both is reserved once. A store that answers `None`
    /// passes: the layer then calls `reserve`.
    pub async fn reserve_now_answers_what_reserve_would(&self) {
        let key: Arc<str> = self.key("now").into();
        let Some(first) = self.store.reserve_now(&key, fp(1), self.lease * 20) else {
            return;
        };
        let token = match first {
            Ok(Reservation::Reserved { token }) => token,
            other => panic!("reserve_now of a free key answered {other:?}"),
        };
        let held = |answer: Option<Result<Reservation, StoreError>>| match answer {
            Some(Ok(Reservation::Held { record })) => {
                format!("{:?}", (record.state, record.fingerprint, record.outcome))
            }
            other => panic!("a held key answered {other:?}"),
        };
        let now = held(self.store.reserve_now(&key, fp(2), self.lease));
        let later = held(Some(self.store.reserve(&key, fp(2), self.lease).await));
        assert_eq!(now, later, "pending");
        let outcome = Outcome::sent(Receipt::new("msg-now", "conformance"));
        assert!(self.complete(&key, token, fp(1), &outcome).await);
        let now = held(self.store.reserve_now(&key, fp(1), self.lease));
        let later = held(Some(self.store.reserve(&key, fp(1), self.lease).await));
        assert_eq!(now, later, "done");
        assert!(now.contains("msg-now"), "{now}");

        let key: Arc<str> = self.key("now-race").into();
        let lease = self.lease * 20;
        let tasks = self.racing(|store, i| {
            let key = Arc::clone(&key);
            async move {
                // Half the tasks ask at once, half by the future.
                let now = (i % 2 == 0)
                    .then(|| store.reserve_now(&key, fp(1), lease))
                    .flatten();
                match now {
                    Some(answer) => answer,
                    None => store.reserve(&key, fp(1), lease).await,
                }
            }
        });
        let reserved = reserved_by(tasks).await;
        assert_eq!(reserved, 1, "racing reserve_now and reserve of one key");
    }

    /// A store that answers [`complete_now`](Store::complete_now) keeps the outcome for the
    /// token that holds the key and for no other, as `complete` does. A store that answers
    /// `None` passes.
    pub async fn complete_now_keeps_the_outcome_fenced_by_token(&self) {
        let key: Arc<str> = self.key("complete-now").into();
        let token = self.reserved(&key, fp(1)).await;
        let outcome = Outcome::sent(Receipt::new("msg-now", "conformance"));
        let ttl = self.lease * 20;
        let Some(stale) = self
            .store
            .complete_now(&key, Token::new(), fp(1), &outcome, ttl)
        else {
            return;
        };
        assert!(
            !stale.expect("complete_now by another token"),
            "not its key"
        );
        match self.reserve(&key, fp(1)).await {
            Reservation::Held { record } => assert_eq!(record.state, RecordState::Pending),
            other => panic!("a pending key answered {other:?}"),
        }
        let kept = self.store.complete_now(&key, token, fp(1), &outcome, ttl);
        assert!(matches!(kept, Some(Ok(true))), "{kept:?}");
        match self.reserve(&key, fp(1)).await {
            Reservation::Held { record } => {
                assert_eq!(record.state, RecordState::Done);
                let receipt = record.outcome.and_then(|o| o.replay().ok());
                assert_eq!(receipt.map(|r| r.id).as_deref(), Some("msg-now"));
            }
            other => panic!("a done key answered {other:?}"),
        }
    }
}

/// How many of the racing reserves `tasks` were answered with a reservation.
impl Conformance {
    /// [`CONCURRENT_RESERVES`] tasks, each running `call(store, i)` once all of them are
    /// spawned and waiting, so their calls reach the store together.
    fn racing<T, F>(
        &self,
        call: impl Fn(Arc<dyn Store>, usize) -> F,
    ) -> Vec<tokio::task::JoinHandle<T>>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let barrier = Arc::new(tokio::sync::Barrier::new(CONCURRENT_RESERVES));
        (0..CONCURRENT_RESERVES)
            .map(|i| {
                let barrier = Arc::clone(&barrier);
                let call = call(Arc::clone(&self.store), i);
                tokio::spawn(async move {
                    barrier.wait().await;
                    call.await
                })
            })
            .collect()
    }
}

async fn reserved_by(
    tasks: Vec<tokio::task::JoinHandle<Result<Reservation, StoreError>>>,
) -> usize {
    let mut reserved = 0;
    for task in tasks {
        match task.await.expect("task panicked") {
            Ok(Reservation::Reserved { .. } | Reservation::TakenOver { .. }) => reserved += 1,
            Ok(Reservation::Held { .. }) => {}
            Err(e) => panic!("reserve failed under concurrency: {e}"),
        }
    }
    reserved
}

/// A distinct fingerprint per `n`.
fn fp(n: u8) -> Fingerprint {
    Fingerprint::from_bytes([n; 32])
}

/// Generates one test per conformance case.
///
/// Give it the test attribute (and optionally one more that every case carries, such as
/// `#[cfg_attr(not(my_server), ignore = "no server")]`) and an expression that evaluates to a
/// future of `Option<Conformance>`. The expression is evaluated afresh for each case. A case
/// that could not run fails its test with a message that starts with `not run:`: when the
/// expression answers `None`, or the case needs what the suite was built without
/// ([`with_admin`](crate::store::conformance::Conformance::with_admin), re-sends). See the
/// [module docs](crate::store::conformance#what-it-ran).
#[macro_export]
macro_rules! store_conformance_tests {
    // One arm per count of attributes: an expression may start with an attribute, so a
    // repetition of attributes before `$setup:expr` would be ambiguous.
    (#[$test:meta] #[$extra:meta] $setup:expr) => {
        $crate::store_conformance_tests!(@cases [#[$test] #[$extra]] $setup);
    };
    (#[$test:meta] $setup:expr) => {
        $crate::store_conformance_tests!(@cases [#[$test]] $setup);
    };
    (@cases [$(#[$attr:meta])+] $setup:expr) => {
        $crate::__store_conformance_cases!([$(#[$attr])+] $setup;
            reserve_on_nothing_reserves,
            reserve_while_pending_is_held,
            complete_then_reserve_is_held_done_with_outcome,
            complete_keeps_an_error_outcome,
            release_by_holder_frees_the_key,
            release_by_another_token_changes_nothing,
            release_of_a_done_key_changes_nothing,
            reserve_after_lease_takes_key_with_new_token,
            stale_token_cannot_complete_or_release_new_owners_key,
            complete_when_nothing_holds_the_key_writes_done,
            done_key_is_free_after_ttl,
            keys_are_independent,
            concurrent_reserves_of_one_key_reserve_once,
            reserve_now_answers_what_reserve_would,
            complete_now_keeps_the_outcome_fenced_by_token,
            reserve_many_reserves_free_keys_and_reports_held_ones,
            complete_many_and_release_many_are_fenced_by_token,
            batch_calls_with_nothing_in_them_answer_nothing,
            concurrent_overlapping_batches_reserve_each_key_once,
            extend_by_the_holder_keeps_the_key_past_its_first_lease,
            an_extended_lease_ends,
            extend_sets_the_end_from_now_even_when_sooner,
            extend_by_another_token_changes_nothing,
            extend_of_a_done_key_changes_nothing,
            extend_of_a_released_key_changes_nothing,
            extend_after_the_lease_passed_revives_nothing,
            admin_inspect_reads_state_fingerprint_outcome_and_time_left,
            admin_forget_and_resolve_leave_a_live_send_alone_unless_forced,
            admin_a_forced_out_send_keeps_its_outcome_unless_another_holds_the_key,
            admin_resolve_as_delivered_answers_repeats_with_the_receipt,
            admin_resolve_as_not_sent_frees_the_key,
            admin_forget_deletes_any_record_and_nothing_answers_nothing_there,
            admin_list_pages_through_unknown_keys_oldest_first,
            admin_list_shows_a_pending_key_past_its_lease_only_where_kept,
            records_carry_the_first_attempts_age,
            reserve_after_a_lease_passed_reports_the_takeover,
            retake_takes_back_a_key_of_unknown_delivery_inside_the_window,
            retake_leaves_other_messages_old_attempts_and_free_keys_alone,
            concurrent_retakes_of_one_key_take_it_back_once
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __store_conformance_cases {
    (@case [$(#[$attr:meta])+] $setup:expr; $case:ident) => {
        $(#[$attr])+
        async fn $case() {
            let suite: ::std::option::Option<$crate::store::conformance::Conformance> = $setup.await;
            let ::std::option::Option::Some(suite) = suite else {
                ::std::panic!(
                    "not run: {}: the suite's setup answered None, so the case checked nothing \
                     (mark the test ignored when its server is missing instead)",
                    ::std::stringify!($case)
                );
            };
            suite.$case().await;
            if let ::std::option::Option::Some(reason) = suite.take_not_run() {
                ::std::panic!("not run: {}: {}", ::std::stringify!($case), reason);
            }
        }
    };
    // `$attrs` stays one token tree here, so it can repeat once per case.
    ($attrs:tt $setup:expr; $($case:ident),* $(,)?) => {
        $(
            $crate::__store_conformance_cases!(@case $attrs $setup; $case);
        )*
    };
}
