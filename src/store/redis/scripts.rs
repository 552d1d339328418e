//! The Lua scripts and the commands a [`RedisStore`](super::RedisStore) sends, and how
//! their replies read.

use std::time::Duration;

use redis::{Cmd, Value};

use super::{MAX_EXPIRY, RedisStore, server_error};
use crate::fingerprint::Fingerprint;
use crate::store::{Completion, Reservation, StoreError, Token, record};

/// The Lua script behind [`reserve`](crate::store::Store::reserve): one round trip.
///
/// `KEYS[1]` the key, `ARGV[1]` the pending record without its times, `ARGV[2]` the
/// fingerprint in hex, `ARGV[3]` the lease in ms, `ARGV[4]` how long a pending record is kept
/// past its lease in ms. The record gets `first_attempt_at_ms` and `lease_until_ms` by the
/// server's `TIME`, and lives `PX` lease plus that time, so a reserve after the lease can tell
/// it takes the key over. Answers `{0}` when it reserved a free key, `{1, value, now}` when a
/// live record holds it (`now` the server's time in ms), `{2, value, now}` when it took it
/// over from a pending record whose lease passed (keeping its first attempt's time for the
/// same fingerprint), `{-1}` when the key holds another Redis type. A value that is not a
/// record this store writes (not JSON, or a pending record without its times) is answered as
/// held, for the store to report as corrupt.
pub(super) const RESERVE_SCRIPT: &str = r#"
local current = redis.pcall('GET', KEYS[1])
if type(current) == 'table' then return {-1} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local first = now
if current then
  local ok, record = pcall(cjson.decode, current)
  if not ok or type(record) ~= 'table' or record.state ~= 'pending'
      or type(record.lease_until_ms) ~= 'number' or type(record.first_attempt_at_ms) ~= 'number'
      or record.lease_until_ms > now then
    return {1, current, now}
  end
  if record.fingerprint == ARGV[2] then
    first = record.first_attempt_at_ms
  end
end
local lease = tonumber(ARGV[3])
local value = string.sub(ARGV[1], 1, -2) .. string.format(
  ',"first_attempt_at_ms":%d,"lease_until_ms":%d}', first, now + lease)
redis.call('SET', KEYS[1], value, 'PX', lease + tonumber(ARGV[4]))
if current then return {2, current, now} end
return {0}
"#;

/// The Lua script behind [`retake`](crate::store::Store::retake).
///
/// `KEYS[1]` the key, `ARGV[1]` the pending record without its times, `ARGV[2]` the
/// fingerprint in hex, `ARGV[3]` the lease in ms, `ARGV[4]` the window in ms, `ARGV[5]` how
/// long a pending record is kept past its lease in ms. Answers 1 when it took the key back
/// (a done record of that fingerprint, a failure of category `unknown`, its first attempt
/// younger than the window by the server's `TIME`; the first attempt's time is kept), 0
/// when it changed nothing, -1 when the value under the key cannot be read.
pub(super) const RETAKE_SCRIPT: &str = r#"
local current = redis.pcall('GET', KEYS[1])
if not current then return 0 end
if type(current) ~= 'string' then return -1 end
local ok, record = pcall(cjson.decode, current)
if not ok or type(record) ~= 'table' then return -1 end
if record.state ~= 'done' or record.fingerprint ~= ARGV[2]
    or type(record.first_attempt_at_ms) ~= 'number' or type(record.outcome) ~= 'table'
    or type(record.outcome.failed) ~= 'table' or record.outcome.failed.category ~= 'unknown' then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now - record.first_attempt_at_ms >= tonumber(ARGV[4]) then return 0 end
local lease = tonumber(ARGV[3])
local value = string.sub(ARGV[1], 1, -2) .. string.format(
  ',"first_attempt_at_ms":%d,"lease_until_ms":%d}', record.first_attempt_at_ms, now + lease)
redis.call('SET', KEYS[1], value, 'PX', lease + tonumber(ARGV[5]))
return 1
"#;

/// The Lua script behind [`complete`](crate::store::Store::complete).
///
/// `KEYS[1]` the key, `ARGV[1]` the token, `ARGV[2]` the done record, `ARGV[3]` the ttl in ms.
/// Writes when the token holds the key, when nothing does, or when another token's pending
/// record has passed its lease (by the server's `TIME`); the record keeps the first attempt's
/// time of the token's own record. Answers 1 when it wrote, 0 when another token holds the
/// key, -1 when the value under the key cannot be read (it is then left as it is).
pub(super) const COMPLETE_SCRIPT: &str = r#"
local current = redis.pcall('GET', KEYS[1])
local value = ARGV[2]
if current then
  if type(current) ~= 'string' then return -1 end
  local ok, record = pcall(cjson.decode, current)
  if not ok or type(record) ~= 'table' or type(record.token) ~= 'string' then return -1 end
  if record.token ~= ARGV[1] then
    if record.state ~= 'pending' or type(record.lease_until_ms) ~= 'number' then return 0 end
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if record.lease_until_ms > now then return 0 end
  elseif type(record.first_attempt_at_ms) == 'number' then
    value = string.sub(value, 1, -2) .. string.format(
      ',"first_attempt_at_ms":%d}', record.first_attempt_at_ms)
  end
end
redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
return 1
"#;

/// The Lua script behind [`release`](crate::store::Store::release).
///
/// `KEYS[1]` the key, `ARGV[1]` the token. Answers 1 when it deleted the key, 0 when the token
/// does not hold it pending, -1 when the value under the key cannot be read (it is then left
/// as it is).
pub(super) const RELEASE_SCRIPT: &str = r"
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
/// `KEYS[1]` the key, `ARGV[1]` the token, `ARGV[2]` the new lease in ms, `ARGV[3]` how long a
/// pending record is kept past its lease in ms. Answers 1 when it moved the lease's end to
/// `ARGV[2]` ms from now (by the server's `TIME`, in the record's `lease_until_ms`, and its
/// `PX` with it), 0 when the token does not hold it pending within its lease (a lease that
/// passed is never revived), -1 when the value under the key cannot be read, a pending record
/// without `lease_until_ms` included (it is then left as it is).
pub(super) const EXTEND_SCRIPT: &str = r#"
local current = redis.pcall('GET', KEYS[1])
if not current then return 0 end
if type(current) ~= 'string' then return -1 end
local ok, record = pcall(cjson.decode, current)
if not ok or type(record) ~= 'table' or type(record.token) ~= 'string' then return -1 end
if record.token ~= ARGV[1] or record.state ~= 'pending' then return 0 end
if type(record.lease_until_ms) ~= 'number' then return -1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if record.lease_until_ms <= now then return 0 end
local lease = tonumber(ARGV[2])
local value = string.gsub(current, '"lease_until_ms":%d+',
  string.format('"lease_until_ms":%d', now + lease), 1)
redis.call('SET', KEYS[1], value, 'PX', lease + tonumber(ARGV[3]))
return 1
"#;

impl RedisStore {
    /// `EVALSHA` of [`RESERVE_SCRIPT`] for one key, and the token it reserves under.
    pub(super) fn reserve_cmd(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<(Cmd, Token), StoreError> {
        let token = Token::new();
        let pending = record::pending_json(token, fingerprint)?;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.reserve.get_hash())
            .arg(1)
            .arg(self.redis_key(key))
            .arg(pending)
            .arg(&fingerprint.hex()[..])
            .arg(millis(lease))
            .arg(millis_or_zero(self.pending_kept));
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

/// What the reply to [`RESERVE_SCRIPT`] says: `token` reserved a free key, or took it over
/// from the pending record answered; or the value that holds it. A record's first attempt's
/// age is measured against the server's time the script answered.
pub(super) fn reservation(reply: Value, token: Token) -> Result<Reservation, StoreError> {
    let reply = reply.extract_error().map_err(server_error)?;
    let (tag, value, now): (i64, Option<Vec<u8>>, Option<u64>) = match reply {
        Value::Array(parts) => {
            let mut parts = parts.into_iter();
            let mut next = || parts.next().unwrap_or(Value::Nil);
            let tag = redis::from_redis_value(next()).map_err(|e| server_error(e.into()))?;
            let value = redis::from_redis_value(next()).map_err(|e| server_error(e.into()))?;
            let now = redis::from_redis_value(next()).map_err(|e| server_error(e.into()))?;
            (tag, value, now)
        }
        _ => (99, None, None),
    };
    let record = || -> Result<_, StoreError> {
        let value = value.as_deref().ok_or_else(|| {
            StoreError::corrupt("reserve: the script answered a record without its value")
        })?;
        let (_, mut record, times) = record::decode_record_times(value)?;
        record.first_attempt_age = now.and_then(|now| times.first_attempt_age(now));
        Ok(record)
    };
    match tag {
        0 => Ok(Reservation::Reserved { token }),
        1 => Ok(Reservation::Held { record: record()? }),
        2 => Ok(Reservation::TakenOver {
            token,
            previous: record()?,
        }),
        -1 => Err(StoreError::corrupt(
            "the key holds a value of another Redis type",
        )),
        other => Err(StoreError::corrupt(format!(
            "reserve: the script answered {other}"
        ))),
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

/// Whole milliseconds of a time added to a lease, zero allowed, at most [`MAX_EXPIRY`].
pub(super) fn millis_or_zero(d: Duration) -> u64 {
    u64::try_from(d.min(MAX_EXPIRY).as_millis()).unwrap_or(u64::MAX)
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
