//! The cases on batches: `reserve_many`, `complete_many` and `release_many`.

use std::sync::Arc;

use super::{Conformance, fp};
use crate::fingerprint::Fingerprint;
use crate::outcome::{Outcome, Receipt};
use crate::store::{Completion, RecordState, Reservation, Store, Token};

impl Conformance {
    async fn reserve_many(&self, requests: &[(&str, Fingerprint)]) -> Vec<Reservation> {
        self.store
            .reserve_many(requests, self.lease)
            .await
            .unwrap_or_else(|e| panic!("reserve_many failed: {e}"))
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("reserve_many entry failed: {e}")))
            .collect()
    }

    /// `reserve_many` answers per key, in order: free keys reserved, held keys reported.
    pub async fn reserve_many_reserves_free_keys_and_reports_held_ones(&self) {
        let (a, b, c) = (self.key("many-a"), self.key("many-b"), self.key("many-c"));
        self.reserved(&b, fp(2)).await;
        let answers = self
            .reserve_many(&[
                (a.as_str(), fp(1)),
                (b.as_str(), fp(1)),
                (c.as_str(), fp(3)),
            ])
            .await;
        assert_eq!(answers.len(), 3);
        assert!(matches!(answers[0], Reservation::Reserved { .. }));
        match &answers[1] {
            Reservation::Held { record } => {
                assert_eq!(record.state, RecordState::Pending);
                assert_eq!(record.fingerprint, fp(2));
            }
            Reservation::Reserved { .. } | Reservation::TakenOver { .. } => {
                panic!("a held key was reserved in a batch")
            }
        }
        assert!(matches!(answers[2], Reservation::Reserved { .. }));
        // Each reservation is real: a second reserve sees it held with its fingerprint.
        match self.reserve(&c, fp(3)).await {
            Reservation::Held { record } => assert_eq!(record.fingerprint, fp(3)),
            Reservation::Reserved { .. } | Reservation::TakenOver { .. } => {
                panic!("batch reservation not kept")
            }
        }
    }

    /// `complete_many` and `release_many` act only where the token holds the key.
    pub async fn complete_many_and_release_many_are_fenced_by_token(&self) {
        let keys: Vec<String> = (0..4)
            .map(|i| self.key(&format!("fence-many-{i}")))
            .collect();
        let requests: Vec<(&str, Fingerprint)> = keys.iter().map(|k| (k.as_str(), fp(1))).collect();
        let tokens: Vec<Token> = self
            .reserve_many(&requests)
            .await
            .into_iter()
            .map(|r| match r {
                Reservation::Reserved { token } => token,
                other => panic!("fresh key not reserved: {other:?}"),
            })
            .collect();
        let sent = Outcome::sent(Receipt::new("m", "conformance"));
        let completions = [
            Completion {
                key: &keys[0],
                token: tokens[0],
                fingerprint: fp(1),
                outcome: &sent,
            },
            Completion {
                key: &keys[1],
                token: Token::new(),
                fingerprint: fp(1),
                outcome: &sent,
            },
        ];
        let written = self
            .store
            .complete_many(&completions, self.ttl())
            .await
            .unwrap_or_else(|e| panic!("complete_many failed: {e}"));
        assert_eq!(written, [true, false]);
        let releases = [
            (keys[2].as_str(), tokens[2]),
            (keys[3].as_str(), Token::new()),
            (keys[0].as_str(), tokens[0]),
        ];
        let released = self
            .store
            .release_many(&releases)
            .await
            .unwrap_or_else(|e| panic!("release_many failed: {e}"));
        assert_eq!(
            released,
            [true, false, false],
            "only the pending holder frees a key"
        );

        let states: Vec<Option<RecordState>> = self
            .reserve_many(&requests)
            .await
            .into_iter()
            .map(|r| match r {
                Reservation::Held { record } => Some(record.state),
                Reservation::Reserved { .. } | Reservation::TakenOver { .. } => None,
            })
            .collect();
        assert_eq!(
            states,
            [
                Some(RecordState::Done),
                Some(RecordState::Pending),
                None,
                Some(RecordState::Pending)
            ]
        );
    }

    /// Empty batch calls answer empty lists.
    pub async fn batch_calls_with_nothing_in_them_answer_nothing(&self) {
        assert!(self.reserve_many(&[]).await.is_empty());
        let done = self
            .store
            .complete_many(&[], self.ttl())
            .await
            .expect("complete_many");
        assert!(done.is_empty());
        let released = self.store.release_many(&[]).await.expect("release_many");
        assert!(released.is_empty());
    }

    /// Overlapping batches racing: every key is reserved by exactly one of them.
    pub async fn concurrent_overlapping_batches_reserve_each_key_once(&self) {
        const TASKS: usize = 16;
        const KEYS: usize = 8;
        let keys: Arc<Vec<String>> = Arc::new(
            (0..KEYS)
                .map(|i| self.key(&format!("batch-race-{i}")))
                .collect(),
        );
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let store = Arc::clone(&self.store);
                let keys = Arc::clone(&keys);
                let barrier = Arc::clone(&barrier);
                let lease = self.lease * 20;
                tokio::spawn(async move {
                    // Each task asks for the keys in its own rotation, to vary the order.
                    let requests: Vec<(&str, Fingerprint)> = (0..KEYS)
                        .map(|i| (keys[(i + t) % KEYS].as_str(), fp(1)))
                        .collect();
                    barrier.wait().await;
                    let answers = store
                        .reserve_many(&requests, lease)
                        .await
                        .expect("reserve_many under concurrency");
                    answers
                        .into_iter()
                        .zip(&requests)
                        .filter(|(r, _)| matches!(r, Ok(Reservation::Reserved { .. })))
                        .map(|(_, (key, _))| (*key).to_owned())
                        .collect::<Vec<String>>()
                })
            })
            .collect();
        let mut reserved: Vec<String> = Vec::new();
        for task in tasks {
            reserved.extend(task.await.expect("task panicked"));
        }
        reserved.sort();
        let mut expected: Vec<String> = keys.to_vec();
        expected.sort();
        assert_eq!(reserved, expected, "each key reserved exactly once");
    }
}
