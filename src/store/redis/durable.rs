//! Writes the replicas must acknowledge: `WAIT` after a reservation's or a completion's
//! commands, in the same pipeline. See [Durability](super#durability).

use std::time::Duration;

use redis::{Cmd, Script, Value};

use super::RedisStore;
use crate::store::{StoreError, StoreErrorKind};

/// How many replicas must acknowledge a write, and how long the primary waits for them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Durability {
    replicas: u32,
    timeout: Duration,
}

impl Durability {
    pub(super) fn new(replicas: u32, timeout: Duration) -> Self {
        Self { replicas, timeout }
    }

    /// `WAIT n timeout_ms`: answers how many replicas acknowledged every write this
    /// connection made before it, once `n` did or the timeout passed (at least 1 ms: `WAIT`
    /// with 0 would block for good).
    pub(super) fn wait_cmd(self) -> Cmd {
        let ms = u64::try_from(self.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.replicas).arg(ms);
        wait
    }

    /// `None` when `WAIT` counted enough replicas; else the store failure that says how
    /// many acknowledged.
    pub(super) fn judge(self, reply: Option<Value>) -> Option<StoreError> {
        let unacknowledged = |detail: String| {
            Some(StoreError::new(
                StoreErrorKind::Unavailable,
                format!(
                    "the write was not acknowledged by {} replica(s) within {:?}: {detail}",
                    self.replicas, self.timeout
                ),
            ))
        };
        match reply {
            Some(Value::Int(acknowledged)) if acknowledged >= i64::from(self.replicas) => None,
            Some(Value::Int(acknowledged)) => {
                unacknowledged(format!("{acknowledged} acknowledged"))
            }
            Some(Value::ServerError(error)) => {
                unacknowledged(format!("WAIT failed: {}", error.details().unwrap_or("")))
            }
            Some(other) => unacknowledged(format!("WAIT answered {other:?}")),
            None => unacknowledged("WAIT got no reply".to_owned()),
        }
    }
}

impl RedisStore {
    /// Runs one command, followed by `WAIT` in the same pipeline when replicas are required:
    /// its reply, and the failure when too few replicas acknowledged.
    pub(super) async fn run_acked(
        &self,
        cmd: Cmd,
    ) -> Result<(Value, Option<StoreError>), StoreError> {
        if self.durability.is_none() {
            return Ok((self.run(&cmd).await?, None));
        }
        // Boxed, as in `run_script_acked` below.
        let (replies, short) = Box::pin(self.pipeline_acked([cmd], true)).await?;
        let [reply] = replies
            .try_into()
            .map_err(|_| StoreError::corrupt("the server answered one command otherwise"))?;
        Ok((reply, short))
    }

    /// [`run_script`](Self::run_script) with `WAIT` in the same pipeline when replicas are
    /// required: the script's reply, and the failure when too few replicas acknowledged.
    pub(super) async fn run_script_acked(
        &self,
        script: &Script,
        cmd: &Cmd,
    ) -> Result<(Value, Option<StoreError>), StoreError> {
        if self.durability.is_none() {
            return Ok((self.run_script(script, cmd).await?, None));
        }
        let commands = [(String::new(), cmd.clone())];
        // Boxed: without replicas required (the default) every script's future would
        // otherwise carry this path's state.
        let (replies, short) = Box::pin(self.send_scripts_acked(script, &commands, true)).await?;
        let reply = replies.into_iter().next().unwrap_or_else(|| {
            Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "the script got no reply",
            ))
        })?;
        let short = short
            .into_iter()
            .flatten()
            .next()
            .map(|unacked| StoreError::new(StoreErrorKind::Unavailable, unacked));
        Ok((reply, short))
    }
}
