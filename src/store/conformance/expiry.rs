//! The cases on time: leases that pass, the fencing of a stale owner, ttls.

use super::{Conformance, fp};
use crate::outcome::{Outcome, Receipt};
use crate::store::{RecordState, Reservation, Token};

impl Conformance {
    /// Once the lease of a pending key has passed, a reserve takes it under a new token.
    pub async fn reserve_after_lease_takes_key_with_new_token(&self) {
        let key = self.key("lease");
        let first = self.reserved(&key, fp(1)).await;
        self.outlive(self.lease).await;
        let second = self.reserved(&key, fp(2)).await;
        assert_ne!(first, second);
    }

    /// Fencing: after the lease passed and a new owner reserved, the stale owner's complete
    /// and release leave the new owner's record alone.
    pub async fn stale_token_cannot_complete_or_release_new_owners_key(&self) {
        let key = self.key("fencing");
        let stale = self.reserved(&key, fp(1)).await;
        self.outlive(self.lease).await;
        let owner = self.reserved(&key, fp(2)).await;

        let late = Outcome::sent(Receipt::new("stale", "conformance"));
        assert!(!self.complete(&key, stale, fp(1), &late).await);
        assert!(!self.release(&key, stale).await);
        match self.reserve(&key, fp(2)).await {
            Reservation::Held { record } => {
                assert_eq!(record.state, RecordState::Pending);
                assert_eq!(record.fingerprint, fp(2));
            }
            Reservation::Reserved { .. } | Reservation::TakenOver { .. } => {
                panic!("the stale owner freed the new owner's key")
            }
        }
        // The new owner still completes its own send.
        let mine = Outcome::sent(Receipt::new("owner", "conformance"));
        assert!(self.complete(&key, owner, fp(2), &mine).await);
        let Reservation::Held { record } = self.reserve(&key, fp(2)).await else {
            panic!("done key reserved")
        };
        assert_eq!(record.outcome.unwrap().replay().unwrap().id, "owner");
    }

    /// Complete when nothing holds the key (never reserved, or the lease passed) writes done.
    pub async fn complete_when_nothing_holds_the_key_writes_done(&self) {
        let key = self.key("complete-free");
        let outcome = Outcome::sent(Receipt::new("m", "conformance"));
        assert!(self.complete(&key, Token::new(), fp(1), &outcome).await);
        assert!(matches!(
            self.reserve(&key, fp(1)).await,
            Reservation::Held { record } if record.state == RecordState::Done
        ));

        let key = self.key("complete-after-lease");
        let token = self.reserved(&key, fp(1)).await;
        self.outlive(self.lease).await;
        assert!(self.complete(&key, token, fp(1), &outcome).await);
        assert!(matches!(
            self.reserve(&key, fp(1)).await,
            Reservation::Held { record } if record.state == RecordState::Done
        ));
    }

    /// After its ttl a done key is free again.
    pub async fn done_key_is_free_after_ttl(&self) {
        let key = self.key("ttl");
        let token = self.reserved(&key, fp(1)).await;
        let outcome = Outcome::sent(Receipt::new("m", "conformance"));
        assert!(self.complete(&key, token, fp(1), &outcome).await);
        self.outlive(self.ttl()).await;
        self.reserved(&key, fp(1)).await;
    }
}
