//! [`RedisStore`] (feature `redis`): keys on a Redis 7 server, or on a Redis Cluster (feature
//! `redis-cluster`), shared by every process that talks to it.
//!
//! # Operations
//!
//! Each operation is one step on the server, so processes racing for a key need no lock:
//!
//! | operation | command |
//! |---|---|
//! | [`reserve`](Store::reserve) | `SET key pending NX GET PX lease`: sets the pending record only when no key exists, and answers the value that holds it otherwise |
//! | [`complete`](Store::complete) | the Lua script [`COMPLETE_SCRIPT`] (`EVALSHA`): writes the done record with `PX ttl` when the token holds the key or nothing does |
//! | [`release`](Store::release) | the Lua script [`RELEASE_SCRIPT`] (`EVALSHA`): deletes the key when the token holds it pending |
//!
//! Scripts run with `EVALSHA` and are loaded again by themselves when the server answers
//! `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).
//!
//! # Batches
//!
//! [`reserve_many`](Store::reserve_many), [`complete_many`](Store::complete_many) and
//! [`release_many`](Store::release_many) send the same commands, one per key, as one pipeline:
//! one write and one read of all the replies, so a batch of any size costs one round trip
//! (three for a script batch that meets `NOSCRIPT`: the pipeline, `SCRIPT LOAD`, then the
//! entries that answered `NOSCRIPT` once more). Each command is still its own atomic step, so
//! every key gets exactly the answer its single operation would give; the batch as a whole is
//! not a transaction.
//!
//! - `reserve_many` answers per key: a value under one key that cannot be read is a
//!   [`Corrupt`](super::StoreErrorKind::Corrupt) error in that key's entry, and the other keys
//!   are reserved or reported held.
//! - `complete_many` and `release_many` answer one `bool` per key, so a key whose value cannot
//!   be read fails the whole call with a `Corrupt` error, as `complete` and `release` fail.
//!   The other scripts of the pipeline ran: their keys were completed or released. Running
//!   `complete_many` again is harmless (the holder's complete writes the same record); a
//!   release that ran answers `false` the second time.
//! - The timeout bounds the whole call. A failed or timed-out `reserve_many` may still have
//!   reserved keys on the server; their leases free them.
//! - The number of replies is checked against the number of commands; a mismatch fails the
//!   call with an [`Unavailable`](super::StoreErrorKind::Unavailable) error.
//!
//! On Redis Cluster a pipeline may not cross hash slots (the cluster client refuses it), so a
//! batch is split into one pipeline per slot, all sent at once; the call waits for the
//! slowest. Keys with no hash tag spread over slots, so a batch of N keys is then about N
//! small pipelines in parallel over the cluster client's connections: one round trip of
//! latency, but N requests. A prefix with a hash tag (`{idem}:`) puts every key in one slot,
//! and one pipeline, at the price of one node holding all keys. When a slot's pipeline fails
//! (its node is unreachable), `reserve_many` reports that error in the entries of that slot
//! alone, and `complete_many` and `release_many` fail as a whole.
//!
//! # Expiry
//!
//! Every record is written with `PX`, so the server's clock decides expiry and an expired
//! record is simply absent: nothing lingers and no purge is needed. A lease or ttl is sent in
//! whole milliseconds, at least 1 ms and at most [`MAX_EXPIRY`] (about 100 years; Redis refuses
//! expiry times that overflow its clock).
//!
//! # Key layout and values
//!
//! A record lives under `<prefix><key>` (prefix [`DEFAULT_KEY_PREFIX`], `idem:`, unless set
//! with [`RedisStore::key_prefix`]), as a plain string holding the whole record in the
//! stored form of [`store::record`](super::record) (version 1, JSON):
//!
//! ```json
//! {"state":"pending","token":"6f1c…","fingerprint":"9a0e…"}
//! {"state":"done","token":"6f1c…","fingerprint":"9a0e…","outcome":{"sent":{"id":"msg_1","transport":"resend","accepted":[],"replayed":false}}}
//! ```
//!
//! `state` is `pending` or `done`, `token` the reservation's UUID, `fingerprint` the message
//! fingerprint in hex, `outcome` the kept [`Outcome`] (done records only). No message content
//! is stored. The scripts read `state` and `token` of that JSON. A value that is not such JSON, a done record without an outcome, or a key of
//! another Redis type makes the operation fail with a
//! [`Corrupt`](super::StoreErrorKind::Corrupt) error; the scripts never overwrite or delete a
//! value they cannot read.
//!
//! # Guarantee
//!
//! On one server, or one primary per slot, reservations are atomic: of concurrent reserves of
//! a key exactly one gets it. Redis replicates asynchronously, so a failover that loses the
//! last writes can lose a reservation or a kept outcome, and a message may then go again: the
//! store gives at-least-once delivery with deduplication, not exactly-once. Forward the
//! `Idempotency-Key` to providers that deduplicate on it as the second net.
//!
//! # Connections
//!
//! [`RedisStore::connect`] uses a [`ConnectionManager`]: one multiplexed connection that
//! reconnects by itself in the background after it drops. Operations in flight when it drops
//! fail with an [`Unavailable`](super::StoreErrorKind::Unavailable) error; later ones succeed
//! once the connection is back, with no action from the caller.
//!
//! With `redis-cluster`, `RedisStore::connect_cluster` uses a
//! `redis::cluster_async::ClusterConnection`, which routes each command by
//! its key's slot, follows `MOVED`/`ASK` redirections, and reconnects to nodes it lost by
//! itself, retrying the command. Each operation touches one key, so keys may live in any slot;
//! batches are split by slot (see [Batches](#batches)).
//!
//! Every operation is bounded by a timeout ([`DEFAULT_TIMEOUT`], 2 s, set with
//! [`RedisStore::timeout`]); when it passes the operation fails with a
//! [`Timeout`](super::StoreErrorKind::Timeout) error. A timed-out `reserve` may still have
//! reserved the key on the server; the lease frees it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{Completion, Reservation, Store, StoreError, StoreErrorKind, Token, record};
use crate::fingerprint::Fingerprint;
use crate::outcome::Outcome;
use futures_util::future::{BoxFuture, FutureExt};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Script, Value};

/// The prefix put before every key unless [`RedisStore::key_prefix`] sets another.
pub const DEFAULT_KEY_PREFIX: &str = "idem:";

/// The default bound on one store operation, connection waits included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest lease or ttl sent to the server (100 years); longer ones are cut to it.
pub const MAX_EXPIRY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The Lua script behind [`complete`](Store::complete).
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

/// The Lua script behind [`release`](Store::release).
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

/// An idempotency store on Redis, shared by every process that uses the same server and
/// prefix. See the [module docs](self) for the commands, the key layout and the guarantee.
///
/// Clones share the connection.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_idempotency::store::{RedisStore, Reservation, Store};
/// use tower_idempotency::Fingerprint;
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379")
///     .await?
///     .key_prefix("billing:idem:")
///     .timeout(Duration::from_millis(500));
///
/// let fingerprint = Fingerprint::from_bytes([0; 32]);
/// match store.reserve("invoice:42:email", fingerprint, Duration::from_secs(600)).await? {
///     Reservation::Reserved { token } => println!("ours to send, token {token}"),
///     Reservation::Held { record } => println!("already {:?}", record.state),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    prefix: Arc<str>,
    timeout: Duration,
    complete: Arc<Script>,
    release: Arc<Script>,
}

/// The connection kinds a store runs on.
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(c) => c.get_db(),
        }
    }
}

impl RedisStore {
    /// A store on the connection manager, with the default prefix and timeout.
    pub fn new(manager: ConnectionManager) -> Self {
        Self::with_connection(Connection::Single(manager))
    }

    /// Connects to the server at `url` (`redis://[user:password@]host:port[/db]`, or
    /// `rediss://` with the `redis` crate's TLS features) through a reconnecting
    /// [`ConnectionManager`].
    ///
    /// Fails with an [`Unavailable`](super::StoreErrorKind::Unavailable) error when the URL is
    /// invalid or the server cannot be reached, and with a
    /// [`Timeout`](super::StoreErrorKind::Timeout) error after [`DEFAULT_TIMEOUT`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(unavailable)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(DEFAULT_TIMEOUT))
            // Our own timeout bounds each operation; the manager's would cut it shorter.
            .set_response_timeout(None);
        let manager = tokio::time::timeout(
            DEFAULT_TIMEOUT,
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| StoreError::timeout())?
        .map_err(unavailable)?;
        Ok(Self::new(manager))
    }

    /// A store on a Redis Cluster connection, with the default prefix and timeout.
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub fn from_cluster(connection: redis::cluster_async::ClusterConnection) -> Self {
        Self::with_connection(Connection::Cluster(connection))
    }

    /// Connects to the Redis Cluster that `urls` (some of its nodes) belong to.
    ///
    /// The connection discovers the other nodes, routes each key to its slot's primary and
    /// reconnects to nodes it lost by itself. Fails like [`connect`](Self::connect).
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub async fn connect_cluster<I, T>(urls: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: redis::IntoConnectionInfo,
    {
        let client = redis::cluster::ClusterClientBuilder::new(urls)
            .connection_timeout(DEFAULT_TIMEOUT)
            .response_timeout(DEFAULT_TIMEOUT)
            .build()
            .map_err(unavailable)?;
        let connection = tokio::time::timeout(DEFAULT_TIMEOUT, client.get_async_connection())
            .await
            .map_err(|_| StoreError::timeout())?
            .map_err(unavailable)?;
        Ok(Self::from_cluster(connection))
    }

    fn with_connection(connection: Connection) -> Self {
        Self {
            connection,
            prefix: Arc::from(DEFAULT_KEY_PREFIX),
            timeout: DEFAULT_TIMEOUT,
            complete: Arc::new(Script::new(COMPLETE_SCRIPT)),
            release: Arc::new(Script::new(RELEASE_SCRIPT)),
        }
    }

    /// Sets the prefix put before every key (default [`DEFAULT_KEY_PREFIX`]); stores that
    /// should see each other's keys must use the same one.
    #[must_use]
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Arc::from(prefix.into());
        self
    }

    /// Sets the bound on each operation (default [`DEFAULT_TIMEOUT`]). When it passes, the
    /// operation fails with a [`Timeout`](super::StoreErrorKind::Timeout) error.
    ///
    /// A store from `connect_cluster` (feature `redis-cluster`) also bounds each attempt the
    /// cluster client makes by [`DEFAULT_TIMEOUT`]; a longer bound here lets it retry.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn redis_key(&self, key: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + key.len());
        k.push_str(&self.prefix);
        k.push_str(key);
        k
    }

    async fn bounded<T>(
        &self,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, operation)
            .await
            .unwrap_or_else(|_| Err(StoreError::timeout()))
    }

    /// `SET key pending NX GET PX lease`, and the token it reserves under.
    fn reserve_cmd(
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
    fn complete_cmd(&self, c: &Completion<'_>, ttl: Duration) -> Result<Cmd, StoreError> {
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
    fn release_cmd(&self, key: &str, token: Token) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.release.get_hash())
            .arg(1)
            .arg(self.redis_key(key))
            .arg(token.to_string());
        cmd
    }

    async fn reserve_once(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let (cmd, token) = self.reserve_cmd(key, fingerprint, lease)?;
        let mut connection = self.connection.clone();
        let reply = connection
            .req_packed_command(&cmd)
            .await
            .map_err(server_error)?;
        reservation(reply, token)
    }

    async fn complete_once(
        &self,
        key: &str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let done = record::done_json(token, fingerprint, outcome)?;
        let mut connection = self.connection.clone();
        let answer: i64 = self
            .complete
            .key(self.redis_key(key))
            .arg(token.to_string())
            .arg(done)
            .arg(millis(ttl))
            .invoke_async(&mut connection)
            .await
            .map_err(server_error)?;
        script_answer(answer, "complete")
    }

    async fn release_once(&self, key: &str, token: Token) -> Result<bool, StoreError> {
        let mut connection = self.connection.clone();
        let answer: i64 = self
            .release
            .key(self.redis_key(key))
            .arg(token.to_string())
            .invoke_async(&mut connection)
            .await
            .map_err(server_error)?;
        script_answer(answer, "release")
    }

    async fn reserve_batch(
        &self,
        requests: &[(&str, Fingerprint)],
        lease: Duration,
    ) -> Result<Vec<Result<Reservation, StoreError>>, StoreError> {
        let mut commands = Vec::with_capacity(requests.len());
        let mut tokens = Vec::with_capacity(requests.len());
        for (key, fingerprint) in requests {
            let (cmd, token) = self.reserve_cmd(key, *fingerprint, lease)?;
            commands.push((self.redis_key(key), cmd));
            tokens.push(token);
        }
        let replies = self.send_batch(&commands).await?;
        Ok(replies
            .into_iter()
            .zip(tokens)
            .map(|(reply, token)| reservation(reply?, token))
            .collect())
    }

    async fn complete_batch(
        &self,
        completions: &[Completion<'_>],
        ttl: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        let mut commands = Vec::with_capacity(completions.len());
        for c in completions {
            commands.push((self.redis_key(c.key), self.complete_cmd(c, ttl)?));
        }
        let replies = self.send_scripts(&self.complete, &commands).await?;
        replies
            .into_iter()
            .map(|reply| script_reply(reply?, "complete"))
            .collect()
    }

    async fn release_batch(&self, releases: &[(&str, Token)]) -> Result<Vec<bool>, StoreError> {
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
    async fn send_scripts(
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
    async fn pipeline<'c>(
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

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.connection {
            Connection::Single(_) => "single",
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore")
            .field("connection", &kind)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Store for RedisStore {
    fn reserve<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        self.bounded(self.reserve_once(key, fingerprint, lease))
            .boxed()
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.bounded(self.complete_once(key, token, fingerprint, outcome, ttl))
            .boxed()
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.bounded(self.release_once(key, token)).boxed()
    }

    fn reserve_many<'a>(
        &'a self,
        requests: &'a [(&'a str, Fingerprint)],
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<Result<Reservation, StoreError>>, StoreError>> {
        self.bounded(self.reserve_batch(requests, lease)).boxed()
    }

    fn complete_many<'a>(
        &'a self,
        completions: &'a [Completion<'a>],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        self.bounded(self.complete_batch(completions, ttl)).boxed()
    }

    fn release_many<'a>(
        &'a self,
        releases: &'a [(&'a str, Token)],
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        self.bounded(self.release_batch(releases)).boxed()
    }
}

/// What the reply to `SET NX GET` says: nothing held the key, so `token` reserved it; or the
/// value that holds it.
fn reservation(reply: Value, token: Token) -> Result<Reservation, StoreError> {
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
fn script_reply(reply: Value, operation: &str) -> Result<bool, StoreError> {
    let reply = reply.extract_error().map_err(server_error)?;
    let answer: i64 = redis::from_redis_value(reply).map_err(|e| server_error(e.into()))?;
    script_answer(answer, operation)
}

fn script_answer(answer: i64, operation: &str) -> Result<bool, StoreError> {
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

/// A key of another Redis type is a record we cannot read; the client's own response timeout
/// is a timeout; anything else is the backend.
fn server_error(error: RedisError) -> StoreError {
    if error.code() == Some("WRONGTYPE") {
        StoreError::corrupt("the key holds a value of another Redis type").with_source(error)
    } else if error.is_timeout() {
        StoreError::timeout().with_source(error)
    } else {
        unavailable(error)
    }
}

fn unavailable(error: RedisError) -> StoreError {
    StoreError::unavailable(error)
}

/// Whole milliseconds for `PX`, within what Redis accepts.
fn millis(d: Duration) -> u64 {
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
