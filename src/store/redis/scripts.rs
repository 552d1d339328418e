//! The Lua scripts and the commands a [`RedisStore`](super::RedisStore) sends, and how
//! their replies read.

use std::time::Duration;

use redis::{Cmd, Value};

use super::{MAX_EXPIRY, RedisStore, server_error};
use crate::fingerprint::Fingerprint;
use crate::outcome::{Category, Outcome};
use crate::store::record::{self, Times};
use crate::store::{Completion, Record, RecordState, Reservation, StoreError, Token};

// The scripts read the stored form of `store::record`, version 2, by its fixed places
// (1-based in Lua): the version byte at 1, the state at 2 (`P` or `D`), the token at 3-38, the
// fingerprint at 39-102, then `first_attempt_before_expiry_ms,kept_after_lease_ms\n` from
// 103. Times are relative to the key's expiry, so `PTTL` and `PX` carry the server's clock.

/// The Lua script behind the [`reserve`](crate::store::Store::reserve) of a key that
/// `SET NX GET` found held by another send's pending record (whether its lease passed needs
/// the server's clock) or by a done record of unknown delivery (its first attempt's age
/// does).
///
/// `KEYS[1]` the key, `ARGV[1]` the new pending record, `ARGV[2]` the fingerprint in hex,
/// `ARGV[3]` its `PX` (the lease plus the time kept after it), `ARGV[4]` the time kept after
/// the lease, in ms. Sets the pending record when the key is free, or held by a pending
/// record whose lease passed: a takeover, which keeps the first attempt's time for the same
/// fingerprint. Answers `{0}` when it reserved a free key, `{1, value, pttl}` when a live
/// record holds it, `{2, value, pttl}` when it took it over, `{-1}` when the key holds
/// another Redis type. A value that is not a record this store writes is answered as held,
/// for the store to report as corrupt.
pub(super) const RESERVE_SCRIPT: &str = r"
local current = redis.pcall('GET', KEYS[1])
if type(current) == 'table' then return {-1} end
if not current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  return {0}
end
local left = redis.call('PTTL', KEYS[1])
if string.byte(current, 1) ~= 2 or string.sub(current, 2, 2) ~= 'P' then
  return {1, current, left}
end
local first, kept = string.match(current, '^(%d+),(%d+)\n', 103)
if not kept or left > tonumber(kept) then return {1, current, left} end
local value = ARGV[1]
if string.sub(current, 39, 102) == ARGV[2] then
  value = string.sub(value, 1, 102) .. string.format('%d,%s\n',
    math.max(tonumber(first) - left, 0) + tonumber(ARGV[3]), ARGV[4])
end
redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
return {2, current, left}
";

/// The Lua script behind [`retake`](crate::store::Store::retake).
///
/// `KEYS[1]` the key, `ARGV[1]` the new pending record, `ARGV[2]` the fingerprint in hex,
/// `ARGV[3]` its `PX` (the lease plus the time kept after it), `ARGV[4]` the window in ms,
/// `ARGV[5]` the time kept after the lease in ms. Answers 1 when it took the key back (a
/// done record of that fingerprint, a failure of category `unknown`, its first attempt
/// younger than the window; the first attempt's time is kept), 0 when it changed nothing,
/// -1 when the value under the key cannot be read. The one script that decodes JSON: only a
/// repeat inside the provider's window of an outcome of unknown delivery runs it.
pub(super) const RETAKE_SCRIPT: &str = r"
local current = redis.pcall('GET', KEYS[1])
if not current then return 0 end
if type(current) ~= 'string' or string.byte(current, 1) ~= 2 then return -1 end
if string.sub(current, 2, 2) ~= 'D' or string.sub(current, 39, 102) ~= ARGV[2] then
  return 0
end
local first, at = string.match(current, '^(%d+),%d*\n()', 103)
if not first then return 0 end
local ok, outcome = pcall(cjson.decode, string.sub(current, at))
if not ok or type(outcome) ~= 'table' or type(outcome.failed) ~= 'table'
    or outcome.failed.category ~= 'unknown' then
  return 0
end
local age = math.max(tonumber(first) - redis.call('PTTL', KEYS[1]), 0)
if age >= tonumber(ARGV[4]) then return 0 end
redis.call('SET', KEYS[1], string.sub(ARGV[1], 1, 102) .. string.format('%d,%s\n',
  age + tonumber(ARGV[3]), ARGV[5]), 'PX', ARGV[3])
return 1
";

/// The Lua script behind [`complete`](crate::store::Store::complete): a fenced write.
///
/// `KEYS[1]` the key, `ARGV[1]` the token, `ARGV[2]` the done record without times,
/// `ARGV[3]` the ttl in ms, `ARGV[4]` `1` when the outcome is of unknown delivery. Writes
/// when the token holds the key (compared on the value's front), when nothing does, or when
/// another token's pending record has passed its lease (by `PTTL`). A record of unknown
/// delivery keeps the first attempt's time of the token's own record, which a re-send inside
/// the provider's window is decided on; no other outcome is ever re-sent, so its record is
/// written as it came, with no clock read. Answers 1 when it wrote, 0 when another token
/// holds the key, -1 when the value under the key cannot be read (it is then left as it is).
pub(super) const COMPLETE_SCRIPT: &str = r"
local current = redis.pcall('GET', KEYS[1])
local value = ARGV[2]
if current then
  if type(current) ~= 'string' or string.byte(current, 1) ~= 2 then return -1 end
  if string.sub(current, 3, 38) ~= ARGV[1] then
    if string.sub(current, 2, 2) ~= 'P' then return 0 end
    local kept = string.match(current, '^%d*,(%d+)\n', 103)
    if not kept then return -1 end
    if redis.call('PTTL', KEYS[1]) > tonumber(kept) then return 0 end
  elseif ARGV[4] == '1' then
    local first = string.match(current, '^(%d+),', 103)
    if first then
      local age = math.max(tonumber(first) - redis.call('PTTL', KEYS[1]), 0)
      value = string.sub(value, 1, 102) .. string.format('%d', age + tonumber(ARGV[3]))
        .. string.sub(value, 103)
    end
  end
end
redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
return 1
";

/// The Lua script behind [`release`](crate::store::Store::release).
///
/// `KEYS[1]` the key, `ARGV[1]` `P` and the token: the value's front when the token holds
/// it pending. Answers 1 when it deleted the key, 0 when the token does not hold it pending,
/// -1 when the value under the key is not a record (it is then left as it is).
pub(super) const RELEASE_SCRIPT: &str = r"
local current = redis.pcall('GET', KEYS[1])
if not current then return 0 end
if type(current) ~= 'string' or string.byte(current, 1) ~= 2 then return -1 end
if string.sub(current, 2, 38) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
";

/// The Lua script behind [`extend`](crate::store::Store::extend).
///
/// `KEYS[1]` the key, `ARGV[1]` `P` and the token, `ARGV[2]` the new `PX` (the lease plus the
/// time kept after it), `ARGV[3]` the time kept after the lease, in ms. Answers 1 when it
/// moved the lease's end to the new lease from now (the record's first attempt moves with
/// its expiry, so its age stays), 0 when the token does not hold it pending within its
/// lease (a lease that passed is never revived), -1 when the value under the key cannot be
/// read (it is then left as it is).
pub(super) const EXTEND_SCRIPT: &str = r"
local current = redis.pcall('GET', KEYS[1])
if not current then return 0 end
if type(current) ~= 'string' or string.byte(current, 1) ~= 2 then return -1 end
if string.sub(current, 2, 38) ~= ARGV[1] then return 0 end
local first, kept = string.match(current, '^(%d+),(%d+)\n', 103)
if not kept then return -1 end
local left = redis.call('PTTL', KEYS[1])
if left <= tonumber(kept) then return 0 end
redis.call('SET', KEYS[1], string.sub(current, 1, 102) .. string.format('%d,%s\n',
  math.max(tonumber(first) - left, 0) + tonumber(ARGV[2]), ARGV[3]), 'PX', ARGV[2])
return 1
";

/// A reserve's first step, and what it can answer without a script.
pub(super) struct FastReserve {
    /// `SET key <pending record> NX GET PX <lease + kept>`: one command, one round trip.
    pub(super) set: Cmd,
    /// The pending record, for the script when one is needed.
    pub(super) pending: Vec<u8>,
}

impl RedisStore {
    /// `PX` of a pending record: the lease, then the time it is kept after it.
    fn pending_px(&self, lease: Duration) -> (u64, u64) {
        let kept = millis_or_zero(self.pending_kept);
        (millis(lease).saturating_add(kept), kept)
    }

    /// The commands of a reserve's first step, under `token`.
    pub(super) fn fast_reserve(
        &self,
        key: &str,
        token: Token,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<FastReserve, StoreError> {
        let (px, kept) = self.pending_px(lease);
        let pending = record::pending_value(
            token,
            fingerprint,
            Times {
                first_attempt_before_expiry_ms: Some(px),
                kept_after_lease_ms: Some(kept),
            },
        )?;
        let redis_key = self.redis_key(key);
        // Sized up front: every reserve builds it, and grown argument by argument its
        // buffers were reallocated several times a call.
        let mut set = Cmd::with_capacity(7, redis_key.len() + pending.len() + 32);
        set.arg("SET")
            .arg(&redis_key)
            .arg(&pending)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(px);
        Ok(FastReserve { set, pending })
    }

    /// `EVALSHA` of [`RESERVE_SCRIPT`] for a key `SET NX GET` found held pending.
    pub(super) fn reserve_cmd(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
        pending: &[u8],
    ) -> Cmd {
        let (px, kept) = self.pending_px(lease);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.reserve.get_hash())
            .arg(1)
            .arg(self.redis_key(key))
            .arg(pending)
            .arg(&fingerprint.hex()[..])
            .arg(px)
            .arg(kept);
        cmd
    }

    /// `EVALSHA` of [`RETAKE_SCRIPT`] for one key, and the token it takes the key under.
    pub(super) fn retake_cmd(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
        within: Duration,
    ) -> Result<(Cmd, Token), StoreError> {
        let token = Token::new();
        let (px, kept) = self.pending_px(lease);
        let pending = record::pending_value(token, fingerprint, Times::default())?;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.retake.get_hash())
            .arg(1)
            .arg(self.redis_key(key))
            .arg(pending)
            .arg(&fingerprint.hex()[..])
            .arg(px)
            .arg(millis(within))
            .arg(kept);
        Ok((cmd, token))
    }

    /// `EVALSHA` of [`COMPLETE_SCRIPT`] for one key, as a command a pipeline can carry.
    pub(super) fn complete_cmd(
        &self,
        c: &Completion<'_>,
        ttl: Duration,
    ) -> Result<Cmd, StoreError> {
        let done = record::done_value(c.token, c.fingerprint, c.outcome)?;
        let unknown = is_unknown_delivery(c.outcome);
        let redis_key = self.redis_key(c.key);
        // Sized up front, as a reserve's `SET`: every fresh send builds one.
        let mut cmd = Cmd::with_capacity(8, redis_key.len() + done.len() + 128);
        cmd.arg("EVALSHA")
            .arg(self.complete.get_hash())
            .arg(1)
            .arg(redis_key)
            .arg(c.token.text().as_str())
            .arg(done)
            .arg(millis(ttl))
            .arg(if unknown { "1" } else { "0" });
        Ok(cmd)
    }

    /// `EVALSHA` of [`RELEASE_SCRIPT`] for one key, as a command a pipeline can carry.
    pub(super) fn release_cmd(&self, key: &str, token: Token) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.release.get_hash())
            .arg(1)
            .arg(self.redis_key(key))
            .arg(format!("P{token}"));
        cmd
    }

    /// `EVALSHA` of [`EXTEND_SCRIPT`] for one key.
    pub(super) fn extend_cmd(&self, key: &str, token: Token, lease: Duration) -> Cmd {
        let (px, kept) = self.pending_px(lease);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.extend.get_hash())
            .arg(1)
            .arg(self.redis_key(key))
            .arg(format!("P{token}"))
            .arg(px)
            .arg(kept);
        cmd
    }
}

/// What a reserve's first step found: its answer, or a record whose answer needs the
/// script.
pub(super) enum FirstStep {
    Answered(Reservation),
    Script,
}

/// What the reply to [`FastReserve`]'s `SET NX GET` says. No old value: the key is
/// reserved. A pending record of our own token is ours (a reserve whose first reply was lost
/// and that the client sent again). A done record of known delivery is answered as held,
/// without its first attempt's age: the age decides only a re-send inside the provider's
/// window, which only an outcome of unknown delivery gets, so a replay needs no second
/// command. Another pending record (in flight, or a lease that passed) and a done record of
/// unknown delivery need the server's clock: the script reads the record and its `PTTL` at
/// once.
pub(super) fn first_step(set: Value, token: Token) -> Result<FirstStep, StoreError> {
    let value: Option<Vec<u8>> = from_reply(set)?;
    let Some(value) = value else {
        return Ok(FirstStep::Answered(Reservation::Reserved { token }));
    };
    let (held_by, record, _times) = record::decode_record_times(&value)?;
    Ok(match record.state {
        RecordState::Done if !record.is_unknown_delivery() => {
            FirstStep::Answered(Reservation::Held { record })
        }
        RecordState::Pending if held_by == token => {
            FirstStep::Answered(Reservation::Reserved { token })
        }
        RecordState::Done | RecordState::Pending => FirstStep::Script,
    })
}

/// What the reply to [`RESERVE_SCRIPT`] says: `token` reserved a free key, or took it over
/// from the pending record answered; or the value that holds it.
pub(super) fn reservation(reply: Value, token: Token) -> Result<Reservation, StoreError> {
    let reply = reply.extract_error().map_err(server_error)?;
    let Value::Array(parts) = reply else {
        return Err(StoreError::corrupt("reserve: the script answered no list"));
    };
    let mut parts = parts.into_iter();
    let tag: i64 = from_reply(parts.next().unwrap_or(Value::Nil))?;
    let value: Option<Vec<u8>> = from_reply(parts.next().unwrap_or(Value::Nil))?;
    let left: Option<i64> = from_reply(parts.next().unwrap_or(Value::Nil))?;
    let record = || -> Result<_, StoreError> {
        let value = value.as_deref().ok_or_else(|| {
            StoreError::corrupt("reserve: the script answered a record without its value")
        })?;
        held(value, left.unwrap_or(-1))
    };
    match tag {
        0 => Ok(Reservation::Reserved { token }),
        1 => match record()? {
            (holder, record) if holder == token && record.state == RecordState::Pending => {
                Ok(Reservation::Reserved { token })
            }
            (_, record) => Ok(Reservation::Held { record }),
        },
        2 => Ok(Reservation::TakenOver {
            token,
            previous: record()?.1,
        }),
        -1 => Err(StoreError::corrupt(
            "the key holds a value of another Redis type",
        )),
        other => Err(StoreError::corrupt(format!(
            "reserve: the script answered {other}"
        ))),
    }
}

/// The record in `value`, with its first attempt's age when the key has `left` ms to live
/// (`PTTL`: negative when the key has no expiry or is gone, and the age unknown).
fn held(value: &[u8], left: i64) -> Result<(Token, Record), StoreError> {
    let (holder, mut record, times) = record::decode_record_times(value)?;
    record.first_attempt_age = u64::try_from(left)
        .ok()
        .and_then(|left| times.first_attempt_age(left));
    Ok((holder, record))
}

fn from_reply<T: redis::FromRedisValue>(reply: Value) -> Result<T, StoreError> {
    let reply = reply.extract_error().map_err(server_error)?;
    redis::from_redis_value(reply).map_err(|e| server_error(e.into()))
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

/// Whether `outcome` is of unknown delivery: its key is indexed for settling by hand, and
/// its record keeps the first attempt's time for a re-send inside the provider's window.
pub(super) fn is_unknown_delivery(outcome: &Outcome) -> bool {
    outcome.category() == Category::Unknown
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::{Outcome, Receipt};

    fn answered(step: FirstStep) -> Reservation {
        match step {
            FirstStep::Answered(reservation) => reservation,
            FirstStep::Script => panic!("the script was asked for"),
        }
    }

    #[test]
    fn the_first_step_decides_what_needs_no_clock() {
        let (ours, fingerprint) = (Token::new(), Fingerprint::from_bytes([1; 32]));
        let times = Times {
            first_attempt_before_expiry_ms: Some(61_000),
            kept_after_lease_ms: Some(1_000),
        };
        // A free key: SET NX answered no old value.
        let free = first_step(Value::Nil, ours).unwrap();
        assert!(matches!(answered(free), Reservation::Reserved { token } if token == ours));
        // Our own pending record: a reserve the client sent again after its reply was lost.
        let pending = record::pending_value(ours, fingerprint, times).unwrap();
        let again = first_step(Value::BulkString(pending.clone()), ours);
        assert!(
            matches!(answered(again.unwrap()), Reservation::Reserved { token } if token == ours)
        );
        // Another token's pending record: whether its lease passed needs the server's clock.
        let other = first_step(Value::BulkString(pending), Token::new());
        assert!(matches!(other.unwrap(), FirstStep::Script));
        // A done record of known delivery is held, with no second command for its age.
        let sent = Outcome::sent(Receipt::new("m", "t"));
        let done = record::done_value(ours, fingerprint, &sent).unwrap();
        let held = first_step(Value::BulkString(done), Token::new());
        let Reservation::Held { record } = answered(held.unwrap()) else {
            panic!("a done key is held")
        };
        let replayed = record.outcome.map(|o| o.replay().map(|r| r.id));
        assert!(matches!(replayed, Some(Ok(id)) if id == "m"));
        // One of unknown delivery may be re-sent inside the provider's window: its first
        // attempt's age needs the server's clock.
        let unknown = Outcome::failed(crate::SendError::unknown_delivery("t.timeout", "lost"));
        let done = record::done_value(ours, fingerprint, &unknown).unwrap();
        let step = first_step(Value::BulkString(done), Token::new());
        assert!(matches!(step.unwrap(), FirstStep::Script));
        // Garbage is corrupt, never a reservation.
        let garbage = first_step(Value::BulkString(b"garbage".to_vec()), ours);
        assert_eq!(
            garbage.err().map(|e| e.kind()),
            Some(crate::store::StoreErrorKind::Corrupt)
        );
    }

    #[test]
    fn expiry_is_clamped_to_what_redis_accepts() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(10)), 1);
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), millis(MAX_EXPIRY));
        assert!(u128::from(millis(Duration::MAX)) < u128::from(i64::MAX as u64) / 2);
    }
}
