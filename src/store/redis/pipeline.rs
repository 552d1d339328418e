//! Batches: one pipeline of the single operations' commands per call (per hash slot on a
//! cluster), and the reload of scripts the server forgot. See [Batches](super#batches).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, Script, Value};

#[cfg(feature = "redis-cluster")]
use super::Connection;
use super::scripts::{FirstStep, first_step, reservation, script_reply};
use super::{RedisStore, server_error};
use crate::fingerprint::Fingerprint;
use crate::store::{Completion, Reservation, StoreError, StoreErrorKind, Token};

/// A batch's replies, one per command, and per command why its pipeline's writes were not
/// acknowledged by the replicas required (`None` when they were, or none were asked).
pub(super) type Batch = (Vec<Result<Value, StoreError>>, Vec<Option<String>>);

impl RedisStore {
    /// Each key's `SET NX GET` in one pipeline; the keys whose answer needs the server's
    /// clock (see [`first_step`]) then run the reserve script, in a second pipeline.
    pub(super) async fn reserve_batch(
        &self,
        requests: &[(&str, Fingerprint)],
        lease: Duration,
        tokens: &[Token],
    ) -> Result<Vec<Result<Reservation, StoreError>>, StoreError> {
        let mut commands = Vec::with_capacity(requests.len());
        let mut pending = Vec::with_capacity(requests.len());
        for ((key, fingerprint), &token) in requests.iter().zip(tokens) {
            let fast = self.fast_reserve(key, token, *fingerprint, lease)?;
            commands.push((self.redis_key(key), fast.set));
            pending.push(fast.pending);
        }
        let (replies, mut short) = self.send_batch(&commands, true).await?;
        let mut replies = replies.into_iter();
        let mut answers = Vec::with_capacity(requests.len());
        let mut scripted = Vec::new();
        for (i, &token) in tokens.iter().enumerate() {
            let step = match replies.next() {
                Some(set) => set.and_then(|set| first_step(set, token)),
                None => Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    "a batch entry got no reply",
                )),
            };
            answers.push(match step {
                Ok(FirstStep::Answered(reservation)) => Ok(reservation),
                Ok(FirstStep::Script) => {
                    scripted.push(i);
                    Err(StoreError::new(
                        StoreErrorKind::Unavailable,
                        "the reserve script did not answer",
                    ))
                }
                Err(error) => Err(error),
            });
        }
        if !scripted.is_empty() {
            let scripts: Vec<(String, Cmd)> = scripted
                .iter()
                .map(|&i| {
                    let (key, fingerprint) = requests[i];
                    let cmd = self.reserve_cmd(key, fingerprint, lease, &pending[i]);
                    (self.redis_key(key), cmd)
                })
                .collect();
            let (replies, script_short) = self
                .send_scripts_acked(&self.reserve, &scripts, true)
                .await?;
            for ((i, reply), unacked) in scripted.into_iter().zip(replies).zip(script_short) {
                answers[i] = reply.and_then(|reply| reservation(reply, tokens[i]));
                short[i] = unacked;
            }
        }
        self.refuse_unacknowledged(requests, tokens, answers, short)
            .await
    }

    /// Turns each reservation whose write the replicas did not acknowledge into a store
    /// failure, after releasing it (one pipeline): nothing is sent for it, and its key is
    /// not left held. When that release fails the whole call fails, so that the caller's
    /// guard releases the keys in the background.
    async fn refuse_unacknowledged(
        &self,
        requests: &[(&str, Fingerprint)],
        tokens: &[Token],
        mut answers: Vec<Result<Reservation, StoreError>>,
        short: Vec<Option<String>>,
    ) -> Result<Vec<Result<Reservation, StoreError>>, StoreError> {
        let mut refused = Vec::new();
        for (i, unacked) in short.into_iter().enumerate() {
            let Some(unacked) = unacked else { continue };
            if matches!(&answers[i], Ok(reservation) if reservation.token().is_some()) {
                refused.push((requests[i].0, tokens[i]));
                answers[i] = Err(StoreError::new(StoreErrorKind::Unavailable, unacked));
            }
        }
        if !refused.is_empty() {
            self.release_batch(&refused, false).await?;
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
        let (replies, short) = self
            .send_scripts_acked(&self.complete, &commands, true)
            .await?;
        if let Some(unacked) = short.into_iter().flatten().next() {
            return Err(StoreError::new(StoreErrorKind::Unavailable, unacked));
        }
        let written = replies
            .into_iter()
            .map(|reply| script_reply(reply?, "complete"))
            .collect::<Result<Vec<bool>, StoreError>>()?;
        let unknown: Vec<&str> = completions
            .iter()
            .zip(&written)
            .filter(|(c, written)| **written && super::scripts::is_unknown_delivery(c.outcome))
            .map(|(c, _)| c.key)
            .collect();
        self.index_unknown(&unknown, ttl).await?;
        Ok(written)
    }

    /// With `ack`, a release the replicas did not acknowledge fails the call, as
    /// [`release`](crate::store::Store::release) does (see `release_once`); each release ran.
    pub(super) async fn release_batch(
        &self,
        releases: &[(&str, Token)],
        ack: bool,
    ) -> Result<Vec<bool>, StoreError> {
        let commands: Vec<(String, Cmd)> = releases
            .iter()
            .map(|(key, token)| (self.redis_key(key), self.release_cmd(key, *token)))
            .collect();
        let (replies, short) = self
            .send_scripts_acked(&self.release, &commands, ack)
            .await?;
        let released = replies
            .into_iter()
            .map(|reply| script_reply(reply?, "release"))
            .collect::<Result<Vec<bool>, StoreError>>()?;
        let unacked = released
            .iter()
            .zip(short)
            .find_map(|(&released, unacked)| unacked.filter(|_| released));
        match unacked {
            Some(unacked) => Err(StoreError::new(StoreErrorKind::Unavailable, unacked)),
            None => Ok(released),
        }
    }

    /// [`send_batch`](Self::send_batch) for `EVALSHA` commands of `script`: the entries the
    /// server answered `NOSCRIPT` (after a restart or `SCRIPT FLUSH`) did not run, so the
    /// script is loaded and those entries alone are sent once more. At most three round trips.
    pub(super) async fn send_scripts(
        &self,
        script: &Script,
        commands: &[(String, Cmd)],
    ) -> Result<Vec<Result<Value, StoreError>>, StoreError> {
        Ok(self.send_scripts_acked(script, commands, false).await?.0)
    }

    /// [`send_scripts`](Self::send_scripts), each pipeline followed by `WAIT` when `ack` is
    /// set and the store [requires replicas](Self::require_replicas): also answers, per
    /// entry, why its pipeline's write was not acknowledged by enough replicas.
    pub(super) async fn send_scripts_acked(
        &self,
        script: &Script,
        commands: &[(String, Cmd)],
        ack: bool,
    ) -> Result<Batch, StoreError> {
        let (mut replies, mut short) = self.send_batch(commands, ack).await?;
        let unknown: Vec<usize> = replies
            .iter()
            .enumerate()
            .filter(
                |(_, reply)| matches!(reply, Ok(Value::ServerError(e)) if e.code() == "NOSCRIPT"),
            )
            .map(|(i, _)| i)
            .collect();
        if unknown.is_empty() {
            return Ok((replies, short));
        }
        let mut connection = self.connection.clone();
        script
            .load_async(&mut connection)
            .await
            .map_err(server_error)?;
        let again: Vec<(String, Cmd)> = unknown.iter().map(|&i| commands[i].clone()).collect();
        let (again_replies, again_short) = self.send_batch(&again, ack).await?;
        for ((i, reply), unacked) in unknown.into_iter().zip(again_replies).zip(again_short) {
            replies[i] = reply;
            short[i] = unacked;
        }
        Ok((replies, short))
    }

    /// Sends one command per key and answers one reply per command, in order. A reply the
    /// server answered with an error stays a [`Value::ServerError`], for the caller to judge.
    ///
    /// On one node: one pipeline, whose failure fails the call. On a cluster: one pipeline
    /// per hash slot (a cluster pipeline may not cross slots), all sent at once; a slot whose
    /// pipeline fails gets that error for each of its entries, and the other slots' replies
    /// stand.
    ///
    /// With `ack` (and replicas required), each pipeline ends with `WAIT`; its entries'
    /// shortfalls say why a pipeline's writes were not acknowledged, `None` when they were.
    async fn send_batch(&self, commands: &[(String, Cmd)], ack: bool) -> Result<Batch, StoreError> {
        if commands.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        #[cfg(feature = "redis-cluster")]
        if let Connection::Cluster(_) = &self.connection {
            return Ok(self.send_by_slot(commands, ack).await);
        }
        // One node: a single server, or the primary Sentinel names.
        let (values, short) = self
            .pipeline_acked(commands.iter().map(|(_, cmd)| cmd.clone()), ack)
            .await?;
        let short = short.map(|e| e.to_string());
        Ok((
            values.into_iter().map(Ok).collect(),
            vec![short; commands.len()],
        ))
    }

    #[cfg(feature = "redis-cluster")]
    async fn send_by_slot(&self, commands: &[(String, Cmd)], ack: bool) -> Batch {
        use redis::cluster_routing::Slot;
        use std::collections::HashMap;

        let mut slots: HashMap<Slot, Vec<usize>> = HashMap::new();
        for (i, (key, _)) in commands.iter().enumerate() {
            slots.entry(Slot::for_key(key)).or_default().push(i);
        }
        let sent = futures_util::future::join_all(slots.into_values().map(|entries| async move {
            let replies = self
                .pipeline_acked(entries.iter().map(|&i| commands[i].1.clone()), ack)
                .await;
            (entries, replies)
        }))
        .await;
        let mut replies: Vec<Option<Result<Value, StoreError>>> = std::iter::repeat_with(|| None)
            .take(commands.len())
            .collect();
        let mut short: Vec<Option<String>> = vec![None; commands.len()];
        for (entries, answer) in sent {
            match answer {
                Ok((values, unacked)) => {
                    let unacked = unacked.map(|e| e.to_string());
                    for (i, value) in entries.into_iter().zip(values) {
                        replies[i] = Some(Ok(value));
                        short[i].clone_from(&unacked);
                    }
                }
                Err(error) => {
                    for i in entries {
                        replies[i] = Some(Err(StoreError::new(error.kind(), error.to_string())));
                    }
                }
            }
        }
        let replies = replies
            .into_iter()
            .map(|reply| {
                reply.unwrap_or_else(|| {
                    Err(StoreError::new(
                        StoreErrorKind::Unavailable,
                        "a batch entry was sent in no pipeline",
                    ))
                })
            })
            .collect();
        (replies, short)
    }

    /// Sends `commands` as one pipeline: one write, one read of all replies. The number of
    /// replies is checked, so a short or long answer is an error, never a misplaced reply.
    ///
    /// Followed by `WAIT` in the same pipeline when `ack` is set and the store
    /// [requires replicas](Self::require_replicas). Answers the commands'
    /// replies (not `WAIT`'s) and, when `WAIT` counted fewer replicas than required, the
    /// store failure that says so: the writes ran on the primary all the same. Takes the
    /// commands by value: a single reserve's are its own, and only a batch, which keeps its
    /// commands for the next slot or a script reload, pays for copies.
    pub(super) async fn pipeline_acked(
        &self,
        commands: impl IntoIterator<Item = Cmd>,
        ack: bool,
    ) -> Result<(Vec<Value>, Option<StoreError>), StoreError> {
        let mut pipe = redis::pipe();
        for cmd in commands {
            pipe.add_command(cmd);
        }
        let durability = self.durability.filter(|_| ack);
        if let Some(durability) = durability {
            pipe.add_command(durability.wait_cmd());
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
        let mut replies = replies;
        let short = match durability {
            Some(durability) => durability.judge(replies.pop()),
            None => None,
        };
        Ok((replies, short))
    }
}
