//! The cases on [`StoreAdmin`]: reading a record, forgetting and resolving a key (never taken
//! from a live send unless forced), and listing the keys of unknown delivery oldest first.

use std::collections::HashSet;
use std::time::Duration;

use super::{Conformance, fp};
use crate::outcome::{Category, Outcome, Receipt, SendError};
use crate::store::admin::{
    AdminOutcome, Cursor, Expiry, Force, Inspected, KeyState, Resolution, StoreAdmin,
};
use crate::store::{RecordState, Reservation, StoreErrorKind, Token};

/// More pages than any listing in these cases needs: a store whose cursor never ends fails.
const MAX_PAGES: usize = 10_000;

fn unknown() -> Outcome {
    Outcome::failed(SendError::unknown_delivery("provider.timeout", "timed out"))
}

impl Conformance {
    /// The store's admin operations, or `None` when the suite was built without them: the
    /// case is then reported as not run.
    fn admin(&self) -> Option<&dyn StoreAdmin> {
        if self.admin.is_none() {
            self.cannot_run(
                "the suite was built with Conformance::new, not with_admin, so the StoreAdmin \
                 cases cannot run",
            );
        }
        self.admin.as_deref()
    }

    /// A ttl the admin cases outlast by far, on a slow server too.
    fn admin_ttl(&self) -> Duration {
        self.lease * 40
    }

    /// Reserves `key` and completes it with `outcome` for the admin ttl.
    async fn kept(&self, key: &str, outcome: &Outcome) -> Token {
        let token = self.reserved(key, fp(1)).await;
        let written = self
            .store
            .complete(key, token, fp(1), outcome, self.admin_ttl())
            .await
            .unwrap_or_else(|e| panic!("complete failed: {e}"));
        assert!(written, "the holder's complete wrote nothing");
        token
    }

    async fn inspect(&self, admin: &dyn StoreAdmin, key: &str) -> Option<Inspected> {
        admin
            .inspect(key)
            .await
            .unwrap_or_else(|e| panic!("inspect of {key} failed: {e}"))
    }

    async fn forget(&self, admin: &dyn StoreAdmin, key: &str, force: Force) -> AdminOutcome {
        admin
            .forget(key, force)
            .await
            .unwrap_or_else(|e| panic!("forget of {key} failed: {e}"))
    }

    async fn resolve(
        &self,
        admin: &dyn StoreAdmin,
        key: &str,
        resolution: &Resolution,
        force: Force,
    ) -> AdminOutcome {
        admin
            .resolve(key, resolution, force)
            .await
            .unwrap_or_else(|e| panic!("resolve of {key} failed: {e}"))
    }

    fn delivered(&self, id: &str) -> Resolution {
        Resolution::delivered(Receipt::new(id, "conformance"), self.admin_ttl())
    }

    /// Every key of the whole listing under this suite's prefix, in the order listed, paging
    /// `page` keys at a time.
    async fn listed(&self, admin: &dyn StoreAdmin, page: usize) -> Vec<Inspected> {
        let mut cursor: Option<Cursor> = None;
        let mut mine = Vec::new();
        for _ in 0..MAX_PAGES {
            let answer = admin
                .list(cursor.as_ref(), page)
                .await
                .unwrap_or_else(|e| panic!("list failed: {e}"));
            assert!(answer.entries.len() <= page, "a page longer than asked");
            mine.extend(
                answer
                    .entries
                    .into_iter()
                    .filter(|e| e.key.starts_with(&self.prefix)),
            );
            match answer.next {
                Some(next) => cursor = Some(next),
                None => return mine,
            }
        }
        panic!("the listing did not end after {MAX_PAGES} pages");
    }

    /// Inspect reads nothing for a free key; a pending record with its fingerprint, no
    /// outcome and its lease left; a done one with its outcome and its ttl left.
    pub async fn admin_inspect_reads_state_fingerprint_outcome_and_time_left(&self) {
        let Some(admin) = self.admin() else { return };
        let key = self.key("admin-inspect");
        assert!(self.inspect(admin, &key).await.is_none());
        let token = self.reserved(&key, fp(3)).await;
        let pending = self.inspect(admin, &key).await.expect("a pending record");
        assert_eq!(pending.key, key);
        assert_eq!(pending.state, KeyState::Pending);
        assert_eq!(pending.fingerprint, fp(3));
        assert!(pending.outcome.is_none());
        assert!(pending.is_held_live());
        match pending.expires {
            Expiry::In(left) => assert!(left <= self.lease, "{left:?} left of {:?}", self.lease),
            other => panic!("a pending record within its lease expires {other:?}"),
        }
        let written = self
            .store
            .complete(&key, token, fp(3), &unknown(), self.admin_ttl())
            .await
            .expect("complete");
        assert!(written);
        let done = self.inspect(admin, &key).await.expect("a done record");
        assert_eq!(done.state, KeyState::Done);
        assert_eq!(done.fingerprint, fp(3));
        let outcome = done.outcome.as_ref().expect("a done record has an outcome");
        assert_eq!(outcome.category(), Category::Unknown);
        assert_eq!(
            outcome.error().map(SendError::code),
            Some("provider.timeout")
        );
        assert!(done.is_unknown_delivery());
        assert!(!done.is_held_live());
        match done.expires {
            Expiry::In(left) => assert!(left > self.lease && left <= self.admin_ttl()),
            other => panic!("a done record within its ttl expires {other:?}"),
        }
    }

    /// Forget and resolve answer `HeldByLiveSend` for a key a send holds within its lease,
    /// and change nothing; forced, they take it. A forced resolve as delivered keeps the
    /// receipt under a token of its own: the forced-out holder's late complete is fenced out.
    pub async fn admin_forget_and_resolve_leave_a_live_send_alone_unless_forced(&self) {
        let Some(admin) = self.admin() else { return };
        let key = self.key("admin-live");
        let holder = self.reserved(&key, fp(1)).await;
        let live = AdminOutcome::HeldByLiveSend;
        assert_eq!(self.forget(admin, &key, Force::No).await, live);
        let delivered = self.delivered("msg-forced");
        assert_eq!(self.resolve(admin, &key, &delivered, Force::No).await, live);
        let not_sent = Resolution::not_sent();
        assert_eq!(self.resolve(admin, &key, &not_sent, Force::No).await, live);
        let record = self.inspect(admin, &key).await.expect("still held");
        assert_eq!(record.state, KeyState::Pending);
        assert_eq!(record.fingerprint, fp(1));

        assert_eq!(
            self.resolve(admin, &key, &delivered, Force::Yes).await,
            AdminOutcome::Done
        );
        let late = Outcome::sent(Receipt::new("msg-late", "conformance"));
        assert!(
            !self.complete(&key, holder, fp(1), &late).await,
            "the forced-out holder overwrote the resolution"
        );
        let kept = self.inspect(admin, &key).await.expect("resolved");
        assert_eq!(
            kept.outcome
                .and_then(|o| o.receipt().map(|r| r.id.clone()))
                .as_deref(),
            Some("msg-forced")
        );

        let other = self.key("admin-live-forget");
        self.reserved(&other, fp(1)).await;
        assert_eq!(
            self.forget(admin, &other, Force::Yes).await,
            AdminOutcome::Done
        );
        assert!(self.inspect(admin, &other).await.is_none());
        self.reserved(&other, fp(2)).await;
    }

    /// A send forced out by a forget or a resolve as not sent (nothing holds its key then)
    /// still keeps its outcome with its late complete: it may have reached the provider, and
    /// a send that went is never forgotten. Its late release and extend change nothing. Once
    /// another send reserved the key, the late complete is fenced out.
    pub async fn admin_a_forced_out_send_keeps_its_outcome_unless_another_holds_the_key(&self) {
        let Some(admin) = self.admin() else { return };
        let late = Outcome::sent(Receipt::new("msg-late", "conformance"));
        let not_sent = Resolution::not_sent();
        for (name, forced) in [
            ("admin-forced-forget", false),
            ("admin-forced-not-sent", true),
        ] {
            let key = self.key(name);
            let holder = self.reserved(&key, fp(1)).await;
            let answer = if forced {
                self.resolve(admin, &key, &not_sent, Force::Yes).await
            } else {
                self.forget(admin, &key, Force::Yes).await
            };
            assert_eq!(answer, AdminOutcome::Done, "{name}");
            assert!(
                !self.release(&key, holder).await,
                "{name}: the forced-out holder released a key nothing held"
            );
            let extended = self
                .store
                .extend(&key, holder, self.lease)
                .await
                .unwrap_or_else(|e| panic!("extend failed: {e}"));
            assert!(!extended, "{name}: the forced-out holder's lease came back");
            assert!(
                self.complete(&key, holder, fp(1), &late).await,
                "{name}: the forced-out holder's outcome was dropped"
            );
            let kept = self.inspect(admin, &key).await.expect("kept");
            assert_eq!(kept.state, KeyState::Done, "{name}");
            assert_eq!(kept.fingerprint, fp(1), "{name}");
            assert_eq!(
                kept.outcome
                    .and_then(|o| o.receipt().map(|r| r.id.clone()))
                    .as_deref(),
                Some("msg-late"),
                "{name}"
            );
        }

        let key = self.key("admin-forced-then-taken");
        let holder = self.reserved(&key, fp(1)).await;
        assert_eq!(
            self.forget(admin, &key, Force::Yes).await,
            AdminOutcome::Done
        );
        self.reserved(&key, fp(2)).await;
        assert!(
            !self.complete(&key, holder, fp(1), &late).await,
            "the forced-out holder overwrote the next send's key"
        );
        let record = self.inspect(admin, &key).await.expect("the next send's");
        assert_eq!(record.state, KeyState::Pending);
        assert_eq!(record.fingerprint, fp(2));
    }

    /// A key of unknown delivery resolved as delivered: a reserve finds it done with the
    /// given receipt (a repeat is replayed, never sent), and it is no longer listed.
    pub async fn admin_resolve_as_delivered_answers_repeats_with_the_receipt(&self) {
        let Some(admin) = self.admin() else { return };
        let key = self.key("admin-delivered");
        self.kept(&key, &unknown()).await;
        let resolution = self.delivered("msg-resolved");
        assert_eq!(
            self.resolve(admin, &key, &resolution, Force::No).await,
            AdminOutcome::Done
        );
        match self.reserve(&key, fp(1)).await {
            Reservation::Held { record } => {
                assert_eq!(record.state, RecordState::Done);
                assert_eq!(
                    record.fingerprint,
                    fp(1),
                    "the record's fingerprint is kept"
                );
                let receipt = record
                    .outcome
                    .expect("a done record has an outcome")
                    .replay()
                    .expect("resolved as delivered: a receipt");
                assert_eq!(receipt.id, "msg-resolved");
                assert_eq!(receipt.transport, "conformance");
            }
            Reservation::Reserved { .. } | Reservation::TakenOver { .. } => {
                panic!("a resolved key was reserved: it would send")
            }
        }
        assert!(
            !self.listed(admin, 100).await.iter().any(|e| e.key == key),
            "a delivered key is listed"
        );
    }

    /// A key of unknown delivery resolved as not sent is free: the next reserve takes it.
    pub async fn admin_resolve_as_not_sent_frees_the_key(&self) {
        let Some(admin) = self.admin() else { return };
        let key = self.key("admin-not-sent");
        let first = self.kept(&key, &unknown()).await;
        assert_eq!(
            self.resolve(admin, &key, &Resolution::not_sent(), Force::No)
                .await,
            AdminOutcome::Done
        );
        assert!(self.inspect(admin, &key).await.is_none());
        let again = self.reserved(&key, fp(1)).await;
        assert_ne!(again, first);
        assert!(
            !self.listed(admin, 100).await.iter().any(|e| e.key == key),
            "a freed key is listed"
        );
    }

    /// Forget deletes a done record whatever its outcome; on a free key, forget and resolve
    /// answer `NothingThere` and write nothing.
    pub async fn admin_forget_deletes_any_record_and_nothing_answers_nothing_there(&self) {
        let Some(admin) = self.admin() else { return };
        let key = self.key("admin-forget");
        self.kept(&key, &Outcome::sent(Receipt::new("m", "conformance")))
            .await;
        assert_eq!(
            self.forget(admin, &key, Force::No).await,
            AdminOutcome::Done
        );
        assert!(self.inspect(admin, &key).await.is_none());
        self.reserved(&key, fp(2)).await;

        let free = self.key("admin-free");
        let nothing = AdminOutcome::NothingThere;
        assert_eq!(self.forget(admin, &free, Force::No).await, nothing);
        assert_eq!(self.forget(admin, &free, Force::Yes).await, nothing);
        let delivered = self.delivered("msg-nowhere");
        assert_eq!(
            self.resolve(admin, &free, &delivered, Force::No).await,
            nothing
        );
        let not_sent = Resolution::not_sent();
        assert_eq!(
            self.resolve(admin, &free, &not_sent, Force::Yes).await,
            nothing
        );
        assert!(
            self.inspect(admin, &free).await.is_none(),
            "resolve wrote a record for a free key"
        );
    }

    /// The listing pages through the keys of unknown delivery oldest first (the order they
    /// were kept, with one ttl), each once, and never lists a delivered, freed, resolved,
    /// forgotten or pending key.
    pub async fn admin_list_pages_through_unknown_keys_oldest_first(&self) {
        let Some(admin) = self.admin() else { return };
        // Kept in the reverse of their names' order, so a listing by name fails.
        let names = ["list-e", "list-d", "list-c", "list-b", "list-a"];
        let mut expected = Vec::new();
        for name in names {
            let key = self.key(name);
            self.kept(&key, &unknown()).await;
            expected.push(key);
            // Distinct times on the store's clock (milliseconds on Redis).
            self.pass(Duration::from_millis(5)).await;
        }
        let delivered = self.key("list-delivered");
        self.kept(&delivered, &Outcome::sent(Receipt::new("m", "conformance")))
            .await;
        let released = self.key("list-released");
        let token = self.reserved(&released, fp(1)).await;
        assert!(self.release(&released, token).await);
        let pending = self.key("list-pending");
        self.reserved(&pending, fp(1)).await;
        let resolved = self.key("list-resolved");
        self.kept(&resolved, &unknown()).await;
        let resolution = self.delivered("msg-listed");
        assert_eq!(
            self.resolve(admin, &resolved, &resolution, Force::No).await,
            AdminOutcome::Done
        );
        let forgotten = self.key("list-forgotten");
        self.kept(&forgotten, &unknown()).await;
        assert_eq!(
            self.forget(admin, &forgotten, Force::No).await,
            AdminOutcome::Done
        );

        for page in [1, 2, 3, 100] {
            let listed = self.listed(admin, page).await;
            let keys: Vec<&str> = listed.iter().map(|e| e.key.as_str()).collect();
            assert_eq!(keys, expected, "pages of {page}");
            assert!(listed.iter().all(Inspected::is_unknown_delivery));
            let distinct: HashSet<&str> = keys.iter().copied().collect();
            assert_eq!(distinct.len(), keys.len(), "a key listed twice");
        }

        // Settling the oldest one takes it off the listing.
        assert_eq!(
            self.resolve(admin, &expected[0], &Resolution::not_sent(), Force::No)
                .await,
            AdminOutcome::Done
        );
        let keys: Vec<String> = self
            .listed(admin, 2)
            .await
            .into_iter()
            .map(|e| e.key)
            .collect();
        assert_eq!(keys, expected[1..]);

        // A cursor the store did not make is refused, not misread.
        let error = admin
            .list(Some(&Cursor::new("not a cursor")), 10)
            .await
            .expect_err("a made-up cursor was accepted");
        assert_eq!(error.kind(), StoreErrorKind::InvalidInput);
    }

    /// A pending key whose lease passed is listed (as pending, lease passed) by a store that
    /// still keeps it, and is absent from a store that dropped it; either way it is no longer
    /// held by a live send, so forget needs no force.
    pub async fn admin_list_shows_a_pending_key_past_its_lease_only_where_kept(&self) {
        let Some(admin) = self.admin() else { return };
        let key = self.key("admin-stale");
        self.reserved(&key, fp(1)).await;
        self.outlive(self.lease).await;
        let kept = self.inspect(admin, &key).await;
        let listed: Vec<Inspected> = self
            .listed(admin, 10)
            .await
            .into_iter()
            .filter(|e| e.key == key)
            .collect();
        match &kept {
            Some(record) => {
                assert!(record.is_stale(), "{record:?}");
                assert!(!record.is_held_live());
                assert_eq!(listed.len(), 1, "a kept stale pending key is listed once");
                assert!(listed[0].is_stale());
            }
            None => assert!(listed.is_empty(), "a dropped key is listed"),
        }
        let answer = self.forget(admin, &key, Force::No).await;
        let expected = if kept.is_some() {
            AdminOutcome::Done
        } else {
            AdminOutcome::NothingThere
        };
        assert_eq!(answer, expected);
        self.reserved(&key, fp(2)).await;
    }
}
