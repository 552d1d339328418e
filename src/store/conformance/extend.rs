//! The cases on [`Store::extend`](crate::store::Store::extend): only the holder of a pending
//! key moves its lease, the moved lease holds the key and then ends, and nothing lost is
//! revived.

use super::{Conformance, fp};
use crate::outcome::{Outcome, Receipt};
use crate::store::{RecordState, Reservation, Token};

impl Conformance {
    /// The holder extends its pending key: a reserve after the first lease has passed still
    /// finds it held by the holder's record.
    pub async fn extend_by_the_holder_keeps_the_key_past_its_first_lease(&self) {
        let key = self.key("extend-holder");
        let token = self.reserved(&key, fp(1)).await;
        self.pass(self.lease / 2).await;
        // From here the key is held until about 4.5 leases after the reserve: a wide margin
        // for a slow server on the real clock.
        assert!(self.extend(&key, token, self.lease * 4).await);
        // Half a lease past the first lease's end: it would be free without the extend.
        self.pass(self.lease).await;
        self.assert_pending(&key, fp(1)).await;
        // The holder still settles its own send.
        let outcome = Outcome::sent(Receipt::new("extended", "conformance"));
        assert!(self.complete(&key, token, fp(1), &outcome).await);
    }

    /// An extended lease ends like any other: once it has passed, a reserve takes the key
    /// under a new token, and the old holder can no longer extend it.
    pub async fn an_extended_lease_ends(&self) {
        let key = self.key("extend-ends");
        let token = self.reserved(&key, fp(1)).await;
        assert!(self.extend(&key, token, self.lease * 2).await);
        self.outlive(self.lease * 2).await;
        let owner = self.reserved(&key, fp(2)).await;
        assert_ne!(owner, token);
        assert!(!self.extend(&key, token, self.lease * 2).await);
        self.assert_pending(&key, fp(2)).await;
    }

    /// The lease ends `lease` after the extend, by the store's clock: set, not added to what
    /// was left, so a shorter lease makes the key free sooner.
    pub async fn extend_sets_the_end_from_now_even_when_sooner(&self) {
        let key = self.key("extend-sooner");
        let token = self.reserved(&key, fp(1)).await;
        let short = self.lease / 3;
        assert!(self.extend(&key, token, short).await);
        self.outlive(short).await;
        // The first lease has not passed yet, but the key is free.
        self.reserved(&key, fp(2)).await;
    }

    /// Another token cannot extend a pending key, and its attempt leaves the holder's lease as
    /// it was: once that passes, the key is free.
    pub async fn extend_by_another_token_changes_nothing(&self) {
        let key = self.key("extend-other");
        self.reserved(&key, fp(1)).await;
        assert!(!self.extend(&key, Token::new(), self.lease * 10).await);
        self.assert_pending(&key, fp(1)).await;
        self.outlive(self.lease).await;
        self.reserved(&key, fp(2)).await;
    }

    /// A done key cannot be extended, even by the token that completed it; it stays done with
    /// its outcome.
    pub async fn extend_of_a_done_key_changes_nothing(&self) {
        let key = self.key("extend-done");
        let token = self.reserved(&key, fp(1)).await;
        let outcome = Outcome::sent(Receipt::new("kept", "conformance"));
        assert!(self.complete(&key, token, fp(1), &outcome).await);
        assert!(!self.extend(&key, token, self.lease).await);
        match self.reserve(&key, fp(1)).await {
            Reservation::Held { record } => {
                assert_eq!(record.state, RecordState::Done);
                let kept = record.outcome.expect("a done record has an outcome");
                assert_eq!(kept.replay().expect("a receipt").id, "kept");
            }
            Reservation::Reserved { .. } | Reservation::TakenOver { .. } => {
                panic!("a done key was reserved again")
            }
        }
    }

    /// A released key cannot be extended by its old token, and stays free.
    pub async fn extend_of_a_released_key_changes_nothing(&self) {
        let key = self.key("extend-released");
        let token = self.reserved(&key, fp(1)).await;
        assert!(self.release(&key, token).await);
        assert!(!self.extend(&key, token, self.lease).await);
        self.reserved(&key, fp(1)).await;
        // Nor can a key that was never reserved.
        let never = self.key("extend-never");
        assert!(!self.extend(&never, Token::new(), self.lease).await);
        self.reserved(&never, fp(1)).await;
    }

    /// A key whose lease passed cannot be extended, even by its holder: it is lost, and stays
    /// free for a new reserve.
    pub async fn extend_after_the_lease_passed_revives_nothing(&self) {
        let key = self.key("extend-late");
        let token = self.reserved(&key, fp(1)).await;
        self.outlive(self.lease).await;
        assert!(!self.extend(&key, token, self.lease * 10).await);
        let owner = self.reserved(&key, fp(2)).await;
        assert_ne!(owner, token);
    }

    async fn extend(&self, key: &str, token: Token, lease: std::time::Duration) -> bool {
        self.store
            .extend(key, token, lease)
            .await
            .unwrap_or_else(|e| panic!("extend failed ({:?}): {e}", e.kind()))
    }

    /// Asserts that a reserve finds `key` held pending by the message with `fingerprint`.
    async fn assert_pending(&self, key: &str, fingerprint: crate::fingerprint::Fingerprint) {
        match self.reserve(key, fp(99)).await {
            Reservation::Held { record } => {
                assert_eq!(record.state, RecordState::Pending);
                assert_eq!(record.fingerprint, fingerprint);
            }
            Reservation::Reserved { .. } | Reservation::TakenOver { .. } => {
                panic!("{key} was free: its lease did not hold")
            }
        }
    }
}
