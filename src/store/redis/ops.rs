//! The store's operations: each one attempt on the server (the `*_once` methods), bounded
//! by the store's timeout, and the [`Store`] implementation made of them.

use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};

use super::RedisStore;
use super::scripts::{FirstStep, first_step, is_unknown_delivery, reservation, script_reply};
use crate::fingerprint::Fingerprint;
use crate::outcome::Outcome;
use crate::store::unanswered::{self, Unanswered};
use crate::store::{Completion, Reservation, Store, StoreError, Token};

impl RedisStore {
    /// Runs the call `operation` makes within the timeout, failing it as timed out past it:
    /// the store bounds its own calls, with the layer or without it.
    pub(super) fn bounded<T, F>(
        &self,
        operation: impl FnOnce() -> F,
    ) -> impl Future<Output = Result<T, StoreError>>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        tokio::time::timeout(self.timeout, operation())
            .map(|bounded| bounded.unwrap_or_else(|_elapsed| Err(StoreError::timeout())))
    }

    /// The outer error: the answer is lost, the caller's guard must release `token`. The
    /// inner one: an answer (a reservation the replicas did not acknowledge, released).
    async fn reserve_once(
        &self,
        key: &str,
        token: Token,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<Result<Reservation, StoreError>, StoreError> {
        // The script and the release below are the rare paths (a key another send holds, a
        // write the replicas did not acknowledge): boxed, so the usual reserve's future, made
        // and moved on every call, does not carry their state.
        let fast = self.fast_reserve(key, token, fingerprint, lease)?;
        let (set, short) = self.run_acked(fast.set).await?;
        let (reservation, short) = match first_step(set, token)? {
            FirstStep::Answered(reservation) => (reservation, short),
            FirstStep::Script => {
                let cmd = self.reserve_cmd(key, fingerprint, lease, &fast.pending);
                let (reply, short) = Box::pin(self.run_script_acked(&self.reserve, &cmd)).await?;
                (reservation(reply, token)?, short)
            }
        };
        match short {
            // Taken but not acknowledged: free the key before answering the failure.
            Some(unacked) if reservation.token().is_some() => {
                Box::pin(self.release_once(key, token, false)).await?;
                Ok(Err(unacked))
            }
            _ => Ok(Ok(reservation)),
        }
    }

    async fn retake_once(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
        within: Duration,
    ) -> Result<Option<Token>, StoreError> {
        let (cmd, token) = self.retake_cmd(key, fingerprint, lease, within)?;
        let (reply, short) = self.run_script_acked(&self.retake, &cmd).await?;
        let retaken = script_reply(reply, "retake")?;
        match short {
            Some(unacked) if retaken => {
                self.release_once(key, token, false).await?;
                Err(unacked)
            }
            _ => Ok(retaken.then_some(token)),
        }
    }

    async fn complete_once(
        &self,
        key: &str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let completion = Completion {
            key,
            token,
            fingerprint,
            outcome,
        };
        let cmd = self.complete_cmd(&completion, ttl)?;
        let (reply, short) = self.run_script_acked(&self.complete, &cmd).await?;
        let written = script_reply(reply, "complete")?;
        if let Some(unacked) = short {
            return Err(unacked);
        }
        if written && is_unknown_delivery(outcome) {
            // After the record, so a listing never drops the entry of a record it read
            // before this complete wrote it. Boxed as the rare path (see `reserve_once`).
            Box::pin(self.index_unknown(&[key], ttl)).await?;
        }
        Ok(written)
    }

    /// With `ack` (and replicas required), a release the replicas did not acknowledge fails
    /// though the key was freed on the primary: a failover would bring its reservation back,
    /// held by nobody until the lease ends, and the layer's settlement retry releases it
    /// again, on the new primary if there was one. Without it (freeing a reservation the
    /// replicas never acknowledged), the release is not waited for.
    async fn release_once(&self, key: &str, token: Token, ack: bool) -> Result<bool, StoreError> {
        let cmd = self.release_cmd(key, token);
        if !ack {
            return script_reply(self.run_script(&self.release, &cmd).await?, "release");
        }
        let (reply, short) = self.run_script_acked(&self.release, &cmd).await?;
        let released = script_reply(reply, "release")?;
        match short {
            Some(unacked) if released => Err(unacked),
            _ => Ok(released),
        }
    }

    async fn extend_once(
        &self,
        key: &str,
        token: Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let cmd = self.extend_cmd(key, token, lease);
        script_reply(self.run_script(&self.extend, &cmd).await?, "extend")
    }
}

impl Store for RedisStore {
    fn reserve<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        async move {
            let token = Token::new();
            // Frees the key if the reserve lands but its answer is lost (a timeout, a dropped
            // connection, a caller that stops waiting).
            let reserved = [(key, token)];
            let guard = Unanswered::arm(self, &reserved);
            let answer = self
                .bounded(move || self.reserve_once(key, token, fingerprint, lease))
                .await;
            guard.answered(answer)?
        }
        .boxed()
    }

    /// Every call is bounded by the store's [`timeout`](RedisStore::timeout).
    fn call_timeout(&self) -> Option<Duration> {
        Some(self.timeout)
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.bounded(move || self.complete_once(key, token, fingerprint, outcome, ttl))
            .boxed()
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.bounded(move || self.release_once(key, token, true))
            .boxed()
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.bounded(move || self.extend_once(key, token, lease))
            .boxed()
    }

    fn retake<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
        within: Duration,
    ) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        self.bounded(move || self.retake_once(key, fingerprint, lease, within))
            .boxed()
    }

    fn reserve_many<'a>(
        &'a self,
        requests: &'a [(&'a str, Fingerprint)],
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<Result<Reservation, StoreError>>, StoreError>> {
        async move {
            let tokens: Vec<Token> = requests.iter().map(|_| Token::new()).collect();
            let reserved = unanswered::pairs(requests, &tokens);
            let guard = Unanswered::arm(self, &reserved);
            let answer = self
                .bounded(|| self.reserve_batch(requests, lease, &tokens))
                .await;
            guard.answered(answer)
        }
        .boxed()
    }

    fn complete_many<'a>(
        &'a self,
        completions: &'a [Completion<'a>],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        self.bounded(move || self.complete_batch(completions, ttl))
            .boxed()
    }

    fn release_many<'a>(
        &'a self,
        releases: &'a [(&'a str, Token)],
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        self.bounded(move || self.release_batch(releases, true))
            .boxed()
    }
}
