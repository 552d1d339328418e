//! The cases on re-sends and takeovers: the first attempt's age a store reports, the
//! takeover of a pending key whose lease passed
//! ([`Reservation::TakenOver`](crate::store::Reservation::TakenOver)), and
//! [`Store::retake`](crate::store::Store::retake).

use std::time::Duration;

use super::{CONCURRENT_RESERVES, Conformance, fp};
use crate::fingerprint::Fingerprint;
use crate::outcome::{Outcome, Receipt, SendError};
use crate::store::{Record, RecordState, Reservation, Token};

fn unknown() -> Outcome {
    Outcome::failed(SendError::unknown_delivery(
        "provider.server_error",
        "HTTP 500",
    ))
}

impl Conformance {
    /// Whether the resend cases run; a case that cannot is reported as not run.
    fn resend_cases(&self) -> bool {
        if !self.resend {
            self.cannot_run(
                "the suite was built without_resend (no retake, no takeover reports), so the \
                 re-send cases cannot run",
            );
        }
        self.resend
    }

    async fn retake(&self, key: &str, fp: Fingerprint, within: Duration) -> Option<Token> {
        self.store
            .retake(key, fp, self.lease, within)
            .await
            .unwrap_or_else(|e| panic!("retake failed: {e}"))
    }

    async fn held(&self, key: &str, fp: Fingerprint) -> Record {
        match self.reserve(key, fp).await {
            Reservation::Held { record } => record,
            other => panic!("expected held, found {other:?}"),
        }
    }

    /// The age a store reports lies within `[at_least, at_least + the slack of a real
    /// clock]`.
    fn assert_age(&self, record: &Record, at_least: Duration) {
        let age = record
            .first_attempt_age
            .unwrap_or_else(|| panic!("the first attempt's age is unknown: {record:?}"));
        let slack = Duration::from_millis(5) + self.lease * 4;
        // A server clock in whole milliseconds may read a millisecond short.
        let floor = at_least.saturating_sub(Duration::from_millis(2));
        assert!(
            age >= floor && age <= at_least + slack,
            "age {age:?}, expected about {at_least:?}"
        );
    }

    /// A record reports how long ago its first attempt began: pending, and done of unknown
    /// delivery (the records a re-send inside the provider's window is decided on).
    pub async fn records_carry_the_first_attempts_age(&self) {
        if !self.resend_cases() {
            return;
        }
        let key = self.key("first-attempt");
        let token = self.reserved(&key, fp(1)).await;
        self.pass(self.lease / 2).await;
        let pending = self.held(&key, fp(1)).await;
        self.assert_age(&pending, self.lease / 2);
        assert!(self.complete(&key, token, fp(1), &unknown()).await);
        let done = self.held(&key, fp(1)).await;
        assert_eq!(done.state, RecordState::Done);
        self.assert_age(&done, self.lease / 2);
    }

    /// A reserve after the lease of a pending key passed reports the takeover, with the
    /// stale record; for the same message the first attempt's time is kept, for another one
    /// it starts again.
    pub async fn reserve_after_a_lease_passed_reports_the_takeover(&self) {
        if !self.resend_cases() {
            return;
        }
        let key = self.key("takeover");
        let stale = self.reserved(&key, fp(1)).await;
        self.outlive(self.lease).await;
        let taken = match self.reserve(&key, fp(1)).await {
            Reservation::TakenOver { token, previous } => {
                assert_eq!(previous.state, RecordState::Pending);
                assert_eq!(previous.fingerprint, fp(1));
                assert!(previous.outcome.is_none());
                self.assert_age(&previous, self.lease);
                token
            }
            other => panic!("expected a takeover, found {other:?}"),
        };
        assert_ne!(taken, stale);
        self.assert_age(&self.held(&key, fp(1)).await, self.lease);
        // The stale holder is fenced out.
        let late = Outcome::sent(Receipt::new("stale", "conformance"));
        assert!(!self.complete(&key, stale, fp(1), &late).await);

        let other = self.key("takeover-other");
        self.reserved(&other, fp(1)).await;
        self.outlive(self.lease).await;
        match self.reserve(&other, fp(2)).await {
            Reservation::TakenOver { previous, .. } => assert_eq!(previous.fingerprint, fp(1)),
            found => panic!("expected a takeover, found {found:?}"),
        }
        let fresh = self.held(&other, fp(2)).await;
        self.assert_age(&fresh, Duration::ZERO);
    }

    /// Retake takes back a done key of unknown delivery of the same message inside the
    /// window, once, keeping the first attempt's time; the retaken key is pending under the
    /// new token, which settles it.
    pub async fn retake_takes_back_a_key_of_unknown_delivery_inside_the_window(&self) {
        if !self.resend_cases() {
            return;
        }
        let key = self.key("retake");
        let first = self.reserved(&key, fp(1)).await;
        assert!(self.complete(&key, first, fp(1), &unknown()).await);
        self.pass(self.lease / 2).await;
        let window = self.lease * 20;
        let token = self
            .retake(&key, fp(1), window)
            .await
            .expect("a key of unknown delivery inside the window is taken back");
        assert_ne!(token, first);
        let pending = self.held(&key, fp(1)).await;
        assert_eq!(pending.state, RecordState::Pending);
        self.assert_age(&pending, self.lease / 2);
        assert_eq!(
            self.retake(&key, fp(1), window).await,
            None,
            "taken back once"
        );
        // The first token no longer settles it; the new one does.
        assert!(!self.release(&key, first).await);
        let receipt = Outcome::sent(Receipt::new("original", "conformance"));
        assert!(self.complete(&key, token, fp(1), &receipt).await);
        let done = self.held(&key, fp(1)).await;
        // A store may leave the age out on a done record of known delivery; told, it is right.
        if done.first_attempt_age.is_some() {
            self.assert_age(&done, self.lease / 2);
        }
        assert_eq!(done.outcome.unwrap().replay().unwrap().id, "original");
        assert_eq!(
            self.retake(&key, fp(1), window).await,
            None,
            "a receipt is never taken back"
        );
    }

    /// Retake changes nothing for another message, a first attempt older than the window, a
    /// free key, or a pending one.
    pub async fn retake_leaves_other_messages_old_attempts_and_free_keys_alone(&self) {
        if !self.resend_cases() {
            return;
        }
        let key = self.key("retake-refused");
        let token = self.reserved(&key, fp(1)).await;
        let window = self.lease * 20;
        assert_eq!(self.retake(&key, fp(1), window).await, None, "pending");
        assert!(self.complete(&key, token, fp(1), &unknown()).await);
        assert_eq!(
            self.retake(&key, fp(2), window).await,
            None,
            "another message"
        );
        self.pass(self.lease / 2).await;
        assert_eq!(
            self.retake(&key, fp(1), self.lease / 4).await,
            None,
            "outside the window"
        );
        let kept = self.held(&key, fp(1)).await;
        assert!(kept.is_unknown_delivery(), "left as it was: {kept:?}");
        let free = self.key("retake-free");
        assert_eq!(
            self.retake(&free, fp(1), window).await,
            None,
            "nothing there"
        );
        self.reserved(&free, fp(1)).await;
    }

    /// 64 concurrent retakes of one key: exactly one takes it back.
    pub async fn concurrent_retakes_of_one_key_take_it_back_once(&self) {
        if !self.resend_cases() {
            return;
        }
        let key = self.key("retake-race");
        let token = self.reserved(&key, fp(1)).await;
        assert!(self.complete(&key, token, fp(1), &unknown()).await);
        let lease = self.lease * 20;
        let tasks = self.racing(|store, _| {
            let key = key.clone();
            async move { store.retake(&key, fp(1), lease, lease * 10).await }
        });
        let mut taken = 0;
        for task in tasks {
            match task.await.expect("task panicked") {
                Ok(Some(_)) => taken += 1,
                Ok(None) => {}
                Err(e) => panic!("retake failed under concurrency: {e}"),
            }
        }
        assert_eq!(taken, 1, "{CONCURRENT_RESERVES} racing retakes of one key");
    }
}
