//! Batches: one pipeline of the single operations' commands per call (per hash slot on a
//! cluster), and the reload of scripts the server forgot. See [Batches](super#batches).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, Script, Value};

use super::scripts::{FirstStep, first_step, reservation, script_reply};
use super::{Connection, RedisStore, server_error};
use crate::fingerprint::Fingerprint;
use crate::store::{Completion, Reservation, StoreError, StoreErrorKind, Token};

impl RedisStore {
    /// Each key's `SET NX GET` and `PTTL` in one pipeline; the keys found held by a pending
    /// record then run the reserve script, in a second pipeline.
    pub(super) async fn reserve_batch(
        &self,
        requests: &[(&str, Fingerprint)],
        lease: Duration,
        tokens: &[Token],
    ) -> Result<Vec<Result<Reservation, StoreError>>, StoreError> {
        let mut commands = Vec::with_capacity(requests.len() * 2);
        let mut pending = Vec::with_capacity(requests.len());
        for ((key, fingerprint), &token) in requests.iter().zip(tokens) {
            let fast = self.fast_reserve(key, token, *fingerprint, lease)?;
            let [set, pttl] = fast.commands;
            let redis_key = self.redis_key(key);
            commands.push((redis_key.clone(), set));
            commands.push((redis_key, pttl));
            pending.push(fast.pending);
        }
        let mut replies = self.send_batch(&commands).await?.into_iter();
        let mut answers = Vec::with_capacity(requests.len());
        let mut scripted = Vec::new();
        for (i, &token) in tokens.iter().enumerate() {
            let (set, pttl) = (replies.next(), replies.next());
            let step = match (set, pttl) {
                (Some(set), Some(pttl)) => set.and_then(|set| first_step(set, pttl?, token)),
                _ => Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    "a batch entry got no reply",
                )),
            };
            answers.push(match step {
                Ok(FirstStep::Answered(reservation)) => Ok(reservation),
                Ok(FirstStep::Pending) => {
                    scripted.push(i);
                    Err(StoreError::new(
                        StoreErrorKind::Unavailable,
                        "the reserve script did not answer",
                    ))
                }
                Err(error) => Err(error),
            });
        }
        if scripted.is_empty() {
            return Ok(answers);
        }
        let scripts: Vec<(String, Cmd)> = scripted
            .iter()
            .map(|&i| {
                let (key, fingerprint) = requests[i];
                let cmd = self.reserve_cmd(key, fingerprint, lease, &pending[i]);
                (self.redis_key(key), cmd)
            })
            .collect();
        let replies = self.send_scripts(&self.reserve, &scripts).await?;
        for (i, reply) in scripted.into_iter().zip(replies) {
            answers[i] = reply.and_then(|reply| reservation(reply, tokens[i]));
        }
        Ok(answers)
    }

    pub(super) async fn complete_batch(
        &self,
        completions: &[Completion<'_>],
        ttl: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        let mut commands = Vec::with_capacity(completions.len());
        for c in completions {
            commands.push((self.redis_key(c.key), self.complete_cmd(c, ttl)?));
        }
        let replies = self.send_scripts(&self.complete, &commands).await?;
        let written = replies
            .into_iter()
            .map(|reply| script_reply(reply?, "complete"))
            .collect::<Result<Vec<bool>, StoreError>>()?;
        let unknown: Vec<&str> = completions
            .iter()
            .zip(&written)
            .filter(|(c, written)| **written && super::admin::is_indexed(c.outcome))
            .map(|(c, _)| c.key)
            .collect();
        self.index_unknown(&unknown, ttl).await?;
        Ok(written)
    }

    pub(super) async fn release_batch(
        &self,
        releases: &[(&str, Token)],
    ) -> Result<Vec<bool>, StoreError> {
        let commands: Vec<(String, Cmd)> = releases
            .iter()
            .map(|(key, token)| (self.redis_key(key), self.release_cmd(key, *token)))
            .collect();
        let replies = self.send_scripts(&self.release, &commands).await?;
        replies
            .into_iter()
            .map(|reply| script_reply(reply?, "release"))
            .collect()
    }

    /// [`send_batch`](Self::send_batch) for `EVALSHA` commands of `script`: the entries the
    /// server answered `NOSCRIPT` (after a restart or `SCRIPT FLUSH`) did not run, so the
    /// script is loaded and those entries alone are sent once more. At most three round trips.
    pub(super) async fn send_scripts(
        &self,
        script: &Script,
        commands: &[(String, Cmd)],
    ) -> Result<Vec<Result<Value, StoreError>>, StoreError> {
        let mut replies = self.send_batch(commands).await?;
        let unknown: Vec<usize> = replies
            .iter()
            .enumerate()
            .filter(
                |(_, reply)| matches!(reply, Ok(Value::ServerError(e)) if e.code() == "NOSCRIPT"),
            )
            .map(|(i, _)| i)
            .collect();
        if unknown.is_empty() {
            return Ok(replies);
        }
        let mut connection = self.connection.clone();
        script
            .load_async(&mut connection)
            .await
            .map_err(server_error)?;
        let again: Vec<(String, Cmd)> = unknown.iter().map(|&i| commands[i].clone()).collect();
        for (i, reply) in unknown.into_iter().zip(self.send_batch(&again).await?) {
            replies[i] = reply;
        }
        Ok(replies)
    }

    /// Sends one command per key and answers one reply per command, in order. A reply the
    /// server answered with an error stays a [`Value::ServerError`], for the caller to judge.
    ///
    /// On one node: one pipeline, whose failure fails the call. On a cluster: one pipeline
    /// per hash slot (a cluster pipeline may not cross slots), all sent at once; a slot whose
    /// pipeline fails gets that error for each of its entries, and the other slots' replies
    /// stand.
    async fn send_batch(
        &self,
        commands: &[(String, Cmd)],
    ) -> Result<Vec<Result<Value, StoreError>>, StoreError> {
        if commands.is_empty() {
            return Ok(Vec::new());
        }
        match &self.connection {
            Connection::Single(_) => Ok(self
                .pipeline(commands.iter().map(|(_, cmd)| cmd))
                .await?
                .into_iter()
                .map(Ok)
                .collect()),
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(_) => Ok(self.send_by_slot(commands).await),
        }
    }

    #[cfg(feature = "redis-cluster")]
    async fn send_by_slot(&self, commands: &[(String, Cmd)]) -> Vec<Result<Value, StoreError>> {
        use redis::cluster_routing::Slot;
        use std::collections::HashMap;

        let mut slots: HashMap<Slot, Vec<usize>> = HashMap::new();
        for (i, (key, _)) in commands.iter().enumerate() {
            slots.entry(Slot::for_key(key)).or_default().push(i);
        }
        let sent = futures_util::future::join_all(slots.into_values().map(|entries| async move {
            let replies = self.pipeline(entries.iter().map(|&i| &commands[i].1)).await;
            (entries, replies)
        }))
        .await;
        let mut replies: Vec<Option<Result<Value, StoreError>>> = std::iter::repeat_with(|| None)
            .take(commands.len())
            .collect();
        for (entries, answer) in sent {
            match answer {
                Ok(values) => {
                    for (i, value) in entries.into_iter().zip(values) {
                        replies[i] = Some(Ok(value));
                    }
                }
                Err(error) => {
                    for i in entries {
                        replies[i] = Some(Err(StoreError::new(error.kind(), error.to_string())));
                    }
                }
            }
        }
        replies
            .into_iter()
            .map(|reply| {
                reply.unwrap_or_else(|| {
                    Err(StoreError::new(
                        StoreErrorKind::Unavailable,
                        "a batch entry was sent in no pipeline",
                    ))
                })
            })
            .collect()
    }

    /// Sends `commands` as one pipeline: one write, one read of all replies. The number of
    /// replies is checked, so a short or long answer is an error, never a misplaced reply.
    pub(super) async fn pipeline<'c>(
        &self,
        commands: impl Iterator<Item = &'c Cmd>,
    ) -> Result<Vec<Value>, StoreError> {
        let mut pipe = redis::pipe();
        for cmd in commands {
            pipe.add_command(cmd.clone());
        }
        let sent = pipe.len();
        let mut connection = self.connection.clone();
        let replies = connection
            .req_packed_commands(&pipe, 0, sent)
            .await
            .map_err(server_error)?;
        if replies.len() != sent {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                format!(
                    "the server answered a pipeline of {sent} commands with {} replies",
                    replies.len()
                ),
            ));
        }
        Ok(replies)
    }
}
