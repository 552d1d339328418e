//! The Lua scripts and the commands a [`RedisStore`](super::RedisStore) sends, and how
//! their replies read.

use std::time::Duration;

use redis::{Cmd, Value};

use super::{MAX_EXPIRY, RedisStore, server_error};
use crate::fingerprint::Fingerprint;
use crate::store::{Completion, Reservation, StoreError, Token, record};

/// The Lua script behind [`complete`](crate::store::Store::complete).
///
/// `KEYS[1]` the key, `ARGV[1]` the token, `ARGV[2]` the done record, `ARGV[3]` the ttl in ms.
/// Answers 1 when it wrote, 0 when another token holds the key, -1 when the value under the
/// key cannot be read (it is then left as it is).
pub const COMPLETE_SCRIPT: &str = r"
local current = redis.pcall('GET', KEYS[1])
if current then
  if type(current) ~= 'string' then return -1 end
  local ok, record = pcall(cjson.decode, current)
  if not ok or type(record) ~= 'table' or type(record.token) ~= 'string' then return -1 end
  if record.token ~= ARGV[1] then return 0 end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
";

/// The Lua script behind [`release`](crate::store::Store::release).
///
/// `KEYS[1]` the key, `ARGV[1]` the token. Answers 1 when it deleted the key, 0 when the token
/// does not hold it pending, -1 when the value under the key cannot be read (it is then left
/// as it is).
pub const RELEASE_SCRIPT: &str = r"
local current = redis.pcall('GET', KEYS[1])
if not current then return 0 end
if type(current) ~= 'string' then return -1 end
local ok, record = pcall(cjson.decode, current)
if not ok or type(record) ~= 'table' or type(record.token) ~= 'string' then return -1 end
if record.token ~= ARGV[1] or record.state ~= 'pending' then return 0 end
return redis.call('DEL', KEYS[1])
";

/// The Lua script behind [`extend`](crate::store::Store::extend).
///
/// `KEYS[1]` the key, `ARGV[1]` the token, `ARGV[2]` the new lease in ms. Answers 1 when it
/// set the key to expire `ARGV[2]` ms from now, 0 when the token does not hold it pending (a
/// key whose lease passed is gone, so it answers 0 and stays gone), -1 when the value under
/// the key cannot be read (it is then left as it is). The record itself is not rewritten:
/// `PEXPIRE` moves its expiry only.
pub const EXTEND_SCRIPT: &str = r"
local current = redis.pcall('GET', KEYS[1])
if not current then return 0 end
if type(current) ~= 'string' then return -1 end
local ok, record = pcall(cjson.decode, current)
if not ok or type(record) ~= 'table' or type(record.token) ~= 'string' then return -1 end
if record.token ~= ARGV[1] or record.state ~= 'pending' then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
";

impl RedisStore {
    /// `SET key pending NX GET PX lease`, and the token it reserves under.
    pub(super) fn reserve_cmd(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<(Cmd, Token), StoreError> {
        let token = Token::new();
        let pending = record::pending_json(token, fingerprint)?;
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.redis_key(key))
            .arg(pending)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(millis(lease));
        Ok((cmd, token))
    }

    /// `EVALSHA` of [`COMPLETE_SCRIPT`] for one key, as a command a pipeline can carry.
    pub(super) fn complete_cmd(
        &self,
        c: &Completion<'_>,
        ttl: Duration,
    ) -> Result<Cmd, StoreError> {
        let done = record::done_json(c.token, c.fingerprint, c.outcome)?;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.complete.get_hash())
            .arg(1)
            .arg(self.redis_key(c.key))
            .arg(c.token.to_string())
            .arg(done)
            .arg(millis(ttl));
        Ok(cmd)
    }

    /// `EVALSHA` of [`RELEASE_SCRIPT`] for one key, as a command a pipeline can carry.
    pub(super) fn release_cmd(&self, key: &str, token: Token) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.release.get_hash())
            .arg(1)
            .arg(self.redis_key(key))
            .arg(token.to_string());
        cmd
    }
}

/// What the reply to `SET NX GET` says: nothing held the key, so `token` reserved it; or the
/// value that holds it.
pub(super) fn reservation(reply: Value, token: Token) -> Result<Reservation, StoreError> {
    let reply = reply.extract_error().map_err(server_error)?;
    let previous: Option<Vec<u8>> =
        redis::from_redis_value(reply).map_err(|e| server_error(e.into()))?;
    match previous {
        None => Ok(Reservation::Reserved { token }),
        Some(value) => {
            record::decode_record(&value).map(|(_, record)| Reservation::Held { record })
        }
    }
}

/// What the reply to a script says, as [`script_answer`] reads it.
pub(super) fn script_reply(reply: Value, operation: &str) -> Result<bool, StoreError> {
    let reply = reply.extract_error().map_err(server_error)?;
    let answer: i64 = redis::from_redis_value(reply).map_err(|e| server_error(e.into()))?;
    script_answer(answer, operation)
}

pub(super) fn script_answer(answer: i64, operation: &str) -> Result<bool, StoreError> {
    match answer {
        1 => Ok(true),
        0 => Ok(false),
        -1 => Err(StoreError::corrupt(format!(
            "{operation}: the value under the key is not a record; it was left as it is"
        ))),
        other => Err(StoreError::corrupt(format!(
            "{operation}: the script answered {other}"
        ))),
    }
}

/// Whole milliseconds for `PX`, within what Redis accepts.
pub(super) fn millis(d: Duration) -> u64 {
    let ms = u64::try_from(d.min(MAX_EXPIRY).as_millis()).unwrap_or(u64::MAX);
    ms.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_clamped_to_what_redis_accepts() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(10)), 1);
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), millis(MAX_EXPIRY));
        assert!(u128::from(millis(Duration::MAX)) < u128::from(i64::MAX as u64) / 2);
    }
}
