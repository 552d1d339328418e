//! [`StoreAdmin`] for [`RedisStore`], and the index of keys of unknown delivery that makes the
//! listing cheap. See [Settling a key by hand](super#settling-a-key-by-hand).

use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use redis::aio::ConnectionLike;
use redis::{Cmd, Script, Value};

use super::inspect::{Raw, garbage, held_live, inspected, raw};
use super::scripts::millis;
use super::{RedisStore, server_error};
use crate::outcome::Outcome;
use crate::store::admin::{
    AdminOutcome, Cursor, Force, Inspected, Page, Resolution, StoreAdmin, split_cursor,
};
use crate::store::{StoreError, StoreErrorKind, Token, record};

/// What follows the store's prefix in the name of its index of keys of unknown delivery: a
/// sorted set, `<prefix>unknown-index`. No key of the layer (`namespace:key`) can take that
/// name, since it holds no `:`.
pub const UNKNOWN_INDEX_SUFFIX: &str = "unknown-index";

/// The Lua script that reads a record with the time left on it, atomically.
///
/// `KEYS[1]` the key. Answers `{0}` when there is no key, `{2}` when it holds another Redis
/// type, `{1, value, pttl}` otherwise: the record's times are relative to its expiry.
const INSPECT_SCRIPT: &str = r"
local current = redis.pcall('GET', KEYS[1])
if not current then return {0} end
if type(current) ~= 'string' then return {2} end
return {1, current, redis.call('PTTL', KEYS[1])}
";

/// The Lua script that replaces a record only if it is still the one read: the
/// compare-and-set behind `forget` and `resolve`, whose decisions are made by the store on
/// the record read.
///
/// `KEYS[1]` the key, `ARGV[1]` the value read, `ARGV[2]` the new value (empty: delete the
/// key), `ARGV[3]` its ttl in ms. Answers 1 when it changed the key, 0 when the value is no
/// longer the one read (nothing changed).
const SETTLE_SCRIPT: &str = r"
local current = redis.pcall('GET', KEYS[1])
if type(current) ~= 'string' or current ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
";

/// The Lua script that adds a key to the index of unknown outcomes.
///
/// `KEYS[1]` the index, `ARGV[1]` the key (without the prefix), `ARGV[2]` the record's ttl in
/// ms. The score is when the record expires, by the index's server clock; entries whose
/// record has surely expired are trimmed on the way, so the index never outgrows the live
/// records of unknown delivery.
const INDEX_ADD_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%d', now))
redis.call('ZADD', KEYS[1], string.format('%d', now + tonumber(ARGV[2])), ARGV[1])
return 1
";

/// The Lua script that reads one page of the index, after a cursor.
///
/// `KEYS[1]` the index, `ARGV[1]` the cursor's score (empty: from the start), `ARGV[2]` its
/// key, `ARGV[3]` the page size. Answers `[key, score, key, score, …]` in (score, key) order,
/// strictly after the cursor, whether or not the cursor's own entry is still there: when it
/// is, its rank says where to start; when not, the entries before it are counted (those of
/// a lower score, then those of its score with a key not above its own, compared byte by
/// byte as Redis orders them). `O(log N + page)` unless many entries share the cursor's
/// score.
const INDEX_PAGE_SCRIPT: &str = r"
local function le(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a <= #b
end
local start = 0
if ARGV[1] ~= '' then
  local score = tonumber(ARGV[1])
  local current = redis.call('ZSCORE', KEYS[1], ARGV[2])
  if current and tonumber(current) == score then
    start = redis.call('ZRANK', KEYS[1], ARGV[2]) + 1
  else
    start = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. ARGV[1])
    local ties = redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[1], 'BYSCORE')
    for _, member in ipairs(ties) do
      if le(member, ARGV[2]) then start = start + 1 else break end
    end
  end
end
return redis.call('ZRANGE', KEYS[1], start, start + tonumber(ARGV[3]) - 1, 'WITHSCORES')
";

/// The Lua script that drops entries from the index, each only while it has the score it
/// was read with (a key kept unknown again meanwhile has a new score and stays).
///
/// `KEYS[1]` the index, `ARGV` pairs of key and score. Answers how many went.
const INDEX_DROP_SCRIPT: &str = r"
local dropped = 0
for i = 1, #ARGV, 2 do
  local current = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if current and tonumber(current) == tonumber(ARGV[i + 1]) then
    dropped = dropped + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return dropped
";

/// How often `forget` and `resolve` read again when the record changed between their read
/// and their write.
const SETTLE_ATTEMPTS: usize = 5;

/// The scripts of the admin operations and of the index.
pub(super) struct Scripts {
    inspect: Script,
    settle: Script,
    pub(super) index_add: Script,
    index_page: Script,
    index_drop: Script,
    pub(super) pending: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            inspect: Script::new(INSPECT_SCRIPT),
            settle: Script::new(SETTLE_SCRIPT),
            index_add: Script::new(INDEX_ADD_SCRIPT),
            index_page: Script::new(INDEX_PAGE_SCRIPT),
            index_drop: Script::new(INDEX_DROP_SCRIPT),
            pending: super::stale::pending_script(),
        }
    }
}

fn evalsha(script: &Script, key: String, args: &[&[u8]]) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(1).arg(key);
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

impl RedisStore {
    /// The name of this store's index of keys of unknown delivery.
    pub fn unknown_index_key(&self) -> String {
        self.redis_key(UNKNOWN_INDEX_SUFFIX)
    }

    pub(super) async fn run(&self, cmd: &Cmd) -> Result<Value, StoreError> {
        let mut connection = self.connection.clone();
        connection
            .req_packed_command(cmd)
            .await
            .map_err(server_error)
    }

    /// Runs `cmd`, an `EVALSHA` of `script`, loading the script first when the server forgot
    /// it.
    pub(super) async fn run_script(&self, script: &Script, cmd: &Cmd) -> Result<Value, StoreError> {
        match self.run(cmd).await? {
            // Rare (a restarted or flushed server): boxed, so every script's future does not
            // carry the load's state.
            Value::ServerError(e) if e.code() == "NOSCRIPT" => {
                Box::pin(async {
                    let mut connection = self.connection.clone();
                    script
                        .load_async(&mut connection)
                        .await
                        .map_err(server_error)?;
                    self.run(cmd).await
                })
                .await
            }
            reply => Ok(reply),
        }
    }

    async fn read_raw(&self, key: &str) -> Result<Raw, StoreError> {
        let cmd = evalsha(&self.admin.inspect, self.redis_key(key), &[]);
        raw(self.run_script(&self.admin.inspect, &cmd).await?)
    }

    /// Adds the keys completed with an outcome of unknown delivery to the index, in one
    /// pipeline (the index is one key, so one slot). Called after their records were written.
    pub(super) async fn index_unknown(
        &self,
        keys: &[&str],
        ttl: Duration,
    ) -> Result<(), StoreError> {
        if keys.is_empty() {
            return Ok(());
        }
        let ttl = millis(ttl).to_string();
        let index = self.unknown_index_key();
        let commands: Vec<(String, Cmd)> = keys
            .iter()
            .map(|key| {
                let cmd = evalsha(
                    &self.admin.index_add,
                    index.clone(),
                    &[key.as_bytes(), ttl.as_bytes()],
                );
                (index.clone(), cmd)
            })
            .collect();
        for reply in self.send_scripts(&self.admin.index_add, &commands).await? {
            reply?.extract_error().map_err(server_error)?;
        }
        Ok(())
    }

    /// Drops `entries` (key, score) from the index, each while it still has that score.
    /// Best effort: an entry left behind is skipped and dropped by a later listing.
    async fn unindex(&self, entries: &[(String, String)]) {
        if entries.is_empty() {
            return;
        }
        let mut args: Vec<&[u8]> = Vec::with_capacity(entries.len() * 2);
        for (key, score) in entries {
            args.push(key.as_bytes());
            args.push(score.as_bytes());
        }
        let cmd = evalsha(&self.admin.index_drop, self.unknown_index_key(), &args);
        if let Err(error) = self
            .run_script(&self.admin.index_drop, &cmd)
            .await
            .and_then(|reply| reply.extract_error().map_err(server_error))
        {
            tracing::debug!(%error, "could not drop stale entries from the unknown index");
        }
    }

    /// Drops `key` from the index whatever its score, after its record was settled by hand.
    async fn unindex_settled(&self, key: &str) {
        let mut cmd = redis::cmd("ZREM");
        cmd.arg(self.unknown_index_key()).arg(key);
        if let Err(error) = self
            .run(&cmd)
            .await
            .and_then(|reply| reply.extract_error().map_err(server_error))
        {
            tracing::debug!(%error, "could not drop a settled key from the unknown index");
        }
    }

    async fn try_inspect(&self, key: &str) -> Result<Option<Inspected>, StoreError> {
        match self.read_raw(key).await? {
            Raw::Nothing => Ok(None),
            Raw::OtherType => Err(StoreError::corrupt(
                "the key holds a value of another Redis type",
            )),
            Raw::Value { bytes, pttl } => inspected(key, &bytes, pttl),
        }
    }

    /// Reads the record, decides, and writes with a compare-and-set; reads again when the
    /// record changed in between.
    async fn settle(
        &self,
        key: &str,
        resolution: &Resolution,
        force: Force,
    ) -> Result<AdminOutcome, StoreError> {
        for _ in 0..SETTLE_ATTEMPTS {
            let (bytes, record) = match self.read_raw(key).await? {
                Raw::Nothing => return Ok(AdminOutcome::NothingThere),
                Raw::OtherType
                    if force.is_forced() && matches!(resolution, Resolution::NotSent) =>
                {
                    let mut cmd = redis::cmd("DEL");
                    cmd.arg(self.redis_key(key));
                    self.run(&cmd)
                        .await?
                        .extract_error()
                        .map_err(server_error)?;
                    return Ok(AdminOutcome::Done);
                }
                Raw::OtherType => {
                    return Err(StoreError::corrupt(
                        "the key holds a value of another Redis type; only a forced forget \
                         deletes it",
                    ));
                }
                Raw::Value { bytes, pttl } => {
                    let record = record::decode_record_times(&bytes)
                        .map(|(_, record, times)| (held_live(record.state, times, pttl), record));
                    (bytes, record)
                }
            };
            let new_value = match (record, resolution) {
                (Err(e), Resolution::NotSent) if force.is_forced() => {
                    drop(e);
                    Vec::new()
                }
                (Err(e), _) => {
                    return Err(StoreError::corrupt(
                        "the value under the key is not a record; only a forced forget \
                         deletes it",
                    )
                    .with_source(e));
                }
                // A pending record within its lease: its holder is live.
                (Ok((true, _)), _) if !force.is_forced() => {
                    return Ok(AdminOutcome::HeldByLiveSend);
                }
                (Ok(_), Resolution::NotSent) => Vec::new(),
                (Ok((_, record)), Resolution::Delivered { receipt, .. }) => record::done_value(
                    // A new token fences out a forced-out holder's late settlement.
                    Token::new(),
                    record.fingerprint,
                    &Outcome::sent(receipt.clone()),
                )?,
            };
            let ttl = match resolution {
                Resolution::Delivered { ttl, .. } => millis(*ttl),
                Resolution::NotSent => 1,
            }
            .to_string();
            let cmd = evalsha(
                &self.admin.settle,
                self.redis_key(key),
                &[&bytes, &new_value, ttl.as_bytes()],
            );
            let reply = self.run_script(&self.admin.settle, &cmd).await?;
            let reply = reply.extract_error().map_err(server_error)?;
            let changed: i64 = redis::from_redis_value(reply).map_err(|_| garbage("a settle"))?;
            if changed == 1 {
                self.unindex_settled(key).await;
                return Ok(AdminOutcome::Done);
            }
        }
        Err(StoreError::new(
            StoreErrorKind::Unavailable,
            format!(
                "the record changed under every one of {SETTLE_ATTEMPTS} attempts to settle it"
            ),
        ))
    }

    /// The stale pending keys first (found by `SCAN`, see [`stale`](super::stale)), then the
    /// keys of unknown delivery (read from the index, oldest first).
    async fn try_list(&self, after: Option<&Cursor>, limit: usize) -> Result<Page, StoreError> {
        if limit == 0 {
            return Ok(Page::new(Vec::new(), after.cloned()));
        }
        // Where the index starts: the listing's second part.
        let index_start = || Cursor::new("0:");
        let from = match after {
            None => Some(None),
            Some(cursor) => super::stale::Position::of(cursor).transpose()?.map(Some),
        };
        if let Some(from) = from {
            let mut page = self.list_stale(from, limit, index_start()).await?;
            if page.entries.len() < limit && page.next == Some(index_start()) {
                // The stale keys ended inside this page: the index fills the rest of it, so
                // a page short of `limit` is never followed by more.
                let rest = self.list_index(None, limit - page.entries.len()).await?;
                page.entries.extend(rest.entries);
                page.next = rest.next;
            }
            return Ok(page);
        }
        self.list_index(after, limit).await
    }

    /// The listing's second part: keys of unknown delivery, from the index, after `after`.
    async fn list_index(&self, after: Option<&Cursor>, limit: usize) -> Result<Page, StoreError> {
        let (score, after_key) = match after {
            None => ("", ""),
            Some(cursor) => {
                let (score, key) = split_cursor(cursor)?;
                if score.parse::<u64>().is_err() {
                    return Err(StoreError::new(
                        StoreErrorKind::InvalidInput,
                        format!("{cursor:?} is not a cursor of this store"),
                    ));
                }
                (score, key)
            }
        };
        let count = limit.to_string();
        let cmd = evalsha(
            &self.admin.index_page,
            self.unknown_index_key(),
            &[score.as_bytes(), after_key.as_bytes(), count.as_bytes()],
        );
        let reply = self.run_script(&self.admin.index_page, &cmd).await?;
        let reply = reply.extract_error().map_err(server_error)?;
        let flat: Vec<String> = redis::from_redis_value(reply).map_err(|_| garbage("a page"))?;
        let indexed: Vec<(String, String)> = flat
            .chunks_exact(2)
            .map(|pair| (pair[0].clone(), pair[1].clone()))
            .collect();
        let next = (indexed.len() == limit)
            .then(|| {
                indexed
                    .last()
                    .map(|(key, score)| Cursor::new(format!("{score}:{key}")))
            })
            .flatten();
        // Each record read where it lives (one pipeline per slot on a cluster).
        let reads: Vec<(String, Cmd)> = indexed
            .iter()
            .map(|(key, _)| {
                let redis_key = self.redis_key(key);
                (
                    redis_key.clone(),
                    evalsha(&self.admin.inspect, redis_key, &[]),
                )
            })
            .collect();
        let replies = self.send_scripts(&self.admin.inspect, &reads).await?;
        let mut entries = Vec::with_capacity(indexed.len());
        let mut stale = Vec::new();
        for ((key, score), reply) in indexed.into_iter().zip(replies) {
            let listed = match raw(reply?)? {
                Raw::Value { bytes, pttl } => inspected(&key, &bytes, pttl)
                    .ok()
                    .flatten()
                    .filter(Inspected::is_unknown_delivery),
                Raw::Nothing | Raw::OtherType => None,
            };
            match listed {
                Some(record) => entries.push(record),
                // Expired, settled, taken again, or unreadable: not a key of unknown delivery.
                None => stale.push((key, score)),
            }
        }
        self.unindex(&stale).await;
        Ok(Page::new(entries, next))
    }
}

/// Each operation is bounded by the store's timeout. `forget` and `resolve` read the record,
/// decide, and write it with a compare-and-set script, reading again if
/// it changed meanwhile, so the decision holds for the record they replace.
impl StoreAdmin for RedisStore {
    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Inspected>, StoreError>> {
        self.bounded(move || self.try_inspect(key)).boxed()
    }

    fn forget<'a>(
        &'a self,
        key: &'a str,
        force: Force,
    ) -> BoxFuture<'a, Result<AdminOutcome, StoreError>> {
        self.bounded(move || async move { self.settle(key, &Resolution::NotSent, force).await })
            .boxed()
    }

    fn resolve<'a>(
        &'a self,
        key: &'a str,
        resolution: &'a Resolution,
        force: Force,
    ) -> BoxFuture<'a, Result<AdminOutcome, StoreError>> {
        self.bounded(move || self.settle(key, resolution, force))
            .boxed()
    }

    fn list<'a>(
        &'a self,
        after: Option<&'a Cursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Page, StoreError>> {
        self.bounded(move || self.try_list(after, limit)).boxed()
    }
}
