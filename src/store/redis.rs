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
//! with [`RedisStore::key_prefix`]), as a plain string holding JSON:
//!
//! ```json
//! {"state":"pending","token":"6f1c…","fingerprint":"9a0e…"}
//! {"state":"done","token":"6f1c…","fingerprint":"9a0e…","outcome":{"sent":{"id":"msg_1","transport":"resend","accepted":[],"replayed":false}}}
//! ```
//!
//! `state` is `pending` or `done`, `token` the reservation's UUID, `fingerprint` the message
//! fingerprint in hex, `outcome` the kept [`Outcome`] (done records only). No message content
//! is stored. A value that is not such JSON, a done record without an outcome, or a key of
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
//! itself, retrying the command. Each operation touches one key, so keys may live in any slot.
//!
//! Every operation is bounded by a timeout ([`DEFAULT_TIMEOUT`], 2 s, set with
//! [`RedisStore::timeout`]); when it passes the operation fails with a
//! [`Timeout`](super::StoreErrorKind::Timeout) error. A timed-out `reserve` may still have
//! reserved the key on the server; the lease frees it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Script, Value};
use serde::{Deserialize, Serialize};

use super::{Record, RecordState, Reservation, Store, StoreError, Token};
use crate::fingerprint::Fingerprint;
use crate::outcome::Outcome;

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

    async fn reserve_once(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let token = Token::new();
        let pending = encode(&StoredRef {
            state: RecordState::Pending,
            token,
            fingerprint,
            outcome: None,
        })?;
        let mut connection = self.connection.clone();
        let previous: Option<Vec<u8>> = redis::cmd("SET")
            .arg(self.redis_key(key))
            .arg(pending)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(millis(lease))
            .query_async(&mut connection)
            .await
            .map_err(server_error)?;
        match previous {
            None => Ok(Reservation::Reserved { token }),
            Some(value) => decode(&value).map(|record| Reservation::Held { record }),
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
        let done = encode(&StoredRef {
            state: RecordState::Done,
            token,
            fingerprint,
            outcome: Some(outcome),
        })?;
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
}

/// A record as it is written.
#[derive(Serialize)]
struct StoredRef<'a> {
    state: RecordState,
    token: Token,
    fingerprint: Fingerprint,
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<&'a Outcome>,
}

/// A record as it is read. The token is read as well, so a value without one is corrupt here
/// as it is to the scripts.
#[derive(Deserialize)]
struct Stored {
    state: RecordState,
    #[serde(rename = "token")]
    _token: Token,
    fingerprint: Fingerprint,
    #[serde(default)]
    outcome: Option<Outcome>,
}

fn encode(record: &StoredRef<'_>) -> Result<String, StoreError> {
    serde_json::to_string(record)
        .map_err(|e| StoreError::corrupt("the record could not be encoded").with_source(e))
}

fn decode(value: &[u8]) -> Result<Record, StoreError> {
    let stored: Stored = serde_json::from_slice(value).map_err(|e| {
        StoreError::corrupt("the value under the key is not a record").with_source(e)
    })?;
    match (stored.state, stored.outcome) {
        (RecordState::Pending, _) => Ok(Record {
            state: RecordState::Pending,
            fingerprint: stored.fingerprint,
            outcome: None,
        }),
        (RecordState::Done, Some(outcome)) => Ok(Record {
            state: RecordState::Done,
            fingerprint: stored.fingerprint,
            outcome: Some(outcome),
        }),
        (RecordState::Done, None) => Err(StoreError::corrupt(
            "the value under the key is a done record without an outcome",
        )),
    }
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
    use crate::outcome::Receipt;

    #[test]
    fn expiry_is_clamped_to_what_redis_accepts() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(10)), 1);
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), millis(MAX_EXPIRY));
        assert!(u128::from(millis(Duration::MAX)) < u128::from(i64::MAX as u64) / 2);
    }

    #[test]
    fn records_round_trip_through_their_json() {
        let fp = Fingerprint::from_bytes([3; 32]);
        let outcome = Outcome::Sent(Receipt::new("m", "t"));
        let json = encode(&StoredRef {
            state: RecordState::Done,
            token: Token::new(),
            fingerprint: fp,
            outcome: Some(&outcome),
        })
        .unwrap();
        let record = decode(json.as_bytes()).unwrap();
        assert_eq!(record.state, RecordState::Done);
        assert_eq!(record.fingerprint, fp);
        assert_eq!(record.outcome.unwrap().replay().unwrap().id, "m");
    }

    #[test]
    fn undecodable_values_are_corrupt() {
        let fp = Fingerprint::from_bytes([3; 32]);
        let done_without_outcome = format!(
            r#"{{"state":"done","token":"{}","fingerprint":"{fp}"}}"#,
            Token::new()
        );
        for value in [
            &b"garbage"[..],
            b"",
            b"null",
            b"{}",
            b"\xff\xfe",
            done_without_outcome.as_bytes(),
        ] {
            let err = decode(value).unwrap_err();
            assert_eq!(err.kind(), super::super::StoreErrorKind::Corrupt);
        }
    }
}
