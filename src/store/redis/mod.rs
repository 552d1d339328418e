//! [`RedisStore`] (feature `redis`): keys on a Redis 7 server, on a Redis Cluster (feature
//! `redis-cluster`), or on the primary Redis Sentinel names (feature `redis-sentinel`), shared
//! by every process that talks to it.
//!
//! # Operations
//!
//! Each operation is one step on the server, so processes racing for a key need no lock. A
//! fresh reserve and a replay run no script; a script runs only where a decision needs the
//! server's clock (a pending record: in flight, or a lease that passed) or a fenced write:
//!
//! | operation | command |
//! |---|---|
//! | [`reserve`](crate::store::Store::reserve) | `SET key <pending record> NX GET PX <lease + kept>`, one command: no old value, the key is reserved; a done record is answered as held, decided by the client. Only when another send's pending record holds the key does a Lua script (`EVALSHA`, a second round trip) tell by its `PTTL` whether its lease passed, and take it over if so; a done record of unknown delivery takes the same script, for its first attempt's age (see [Expiry](#expiry)) |
//! | [`complete`](crate::store::Store::complete) | a Lua script (`EVALSHA`): compares the token at the value's front and writes the done record with `PX ttl` when the token holds the key or nothing does; only an outcome of unknown delivery also reads the `PTTL`, to keep the first attempt's time |
//! | [`release`](crate::store::Store::release) | a Lua script (`EVALSHA`): deletes the key when its front is the token's pending record |
//! | [`extend`](crate::store::Store::extend) | a Lua script (`EVALSHA`): when its front is the token's pending record within its lease, writes it again with the new `PX` |
//! | [`retake`](crate::store::Store::retake) | a Lua script (`EVALSHA`): holds a done record of unknown delivery pending again when its first attempt is younger than the window (the one script that decodes JSON, run only inside the provider's window) |
//!
//! Scripts run with `EVALSHA` and are loaded again by themselves when the server answers
//! `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).
//!
//! A `complete` whose outcome is of unknown delivery also adds the key to the store's index
//! (see [Settling a key by hand](#settling-a-key-by-hand)): one more round trip, for those
//! completions only (one pipeline for all of a `complete_many`). When that fails the call
//! fails, though the record was written; completing again, as the layer's settlement retry
//! does, writes the same record and indexes it.
//!
//! # Batches
//!
//! [`reserve_many`](crate::store::Store::reserve_many), [`complete_many`](crate::store::Store::complete_many) and
//! [`release_many`](crate::store::Store::release_many) send the same commands, one per key, as one
//! pipeline; the keys of a `reserve_many` that need the reserve script (as a single
//! `reserve` would) then run it, in a second pipeline:
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
//! The server's clock decides expiry. A done record is written with `PX ttl` and is simply
//! absent once expired: no purge is needed. A pending record is written with `PX` of the
//! lease plus [`RedisStore::pending_kept_for`] (a day by default): past its lease it holds
//! nothing, but a reserve that takes it over can tell ([`Reservation::TakenOver`](crate::store::Reservation::TakenOver)), and the
//! layer checks before it sends. An extend that comes after the lease revives nothing. A
//! lease or ttl is sent in whole milliseconds, at least 1 ms and at most [`MAX_EXPIRY`] (about
//! 100 years; Redis refuses expiry times that overflow its clock).
//!
//! A record's times are kept relative to its key's expiry, so the server's clock carries
//! them and a reserve writes its record with no clock of its own: a pending record says how
//! long before the key expires its first attempt began (the lease plus the kept time, when
//! the reserve wrote it) and how long it is kept after its lease; its lease has passed when
//! the key's `PTTL` is no more than the kept time. A first attempt's age is the time before
//! expiry less the `PTTL`. `extend`, a takeover and `retake` carry the first attempt's time
//! over to the new expiry, and so does a `complete` with an outcome of unknown delivery,
//! the one outcome a re-send inside the provider's window is decided on; a `reserve`
//! reports the age there and on pending records. A done record of known delivery keeps no
//! time, answered from `SET NX GET` alone ([`store::record`](super::record)).
//!
//! # Key layout and values
//!
//! A record lives under `<prefix><key>` (prefix [`DEFAULT_KEY_PREFIX`], `idem:`, unless set
//! with [`RedisStore::key_prefix`]), as a plain string holding the whole record in the
//! stored form of [`store::record`](super::record) (version 2):
//!
//! ```text
//! \x02P6f1c…<64 hex digits of fingerprint>86520000,86400000\n
//! \x02D6f1c…<64 hex digits of fingerprint>,\n{"sent":{"id":"msg_1","transport":"resend","accepted":[],"replayed":false}}
//! ```
//!
//! The version byte, the state (`P` pending, `D` done) and the token sit at fixed places, so
//! a script fences a write by comparing the value's front, without decoding it; then the
//! fingerprint in hex, the two times (`first_attempt_before_expiry_ms`, on every pending
//! record and on a done one of unknown delivery whose holder completed it;
//! `kept_after_lease_ms`, on pending records), and a done record's outcome in JSON. No message content is stored. A value that
//! is not such a record, a record that breaks the [record
//! rules](super::record#the-record-rules) (a pending record with an outcome, a done one
//! without, a failure of category `delivered`: the same damage every store reports), or a
//! key of another Redis type makes the operation fail with a
//! [`Corrupt`](super::StoreErrorKind::Corrupt) error, and so does a pending record without
//! its times for a reserve or an extend; the scripts never overwrite or delete a value they
//! cannot read.
//!
//! # Settling a key by hand
//!
//! [`StoreAdmin`](super::admin::StoreAdmin) reads, forgets and resolves keys, and lists the
//! stale pending keys (crashed sends) and the keys of unknown delivery:
//!
//! - `inspect` is one script: the value and its `PTTL`, read at once.
//! - `forget` and `resolve` read the record, decide (a pending record is a live send: it
//!   expires with its lease), and write with a compare-and-set script,
//!   which changes the key only if it still holds the value read, and reads again if not. A
//!   resolved record is written in the stored form above, under a new token, with the
//!   record's fingerprint.
//! - `list` finds the stale pending keys first, by `SCAN` over the prefix (every primary of
//!   a cluster, one after another), reading each key's record when it is pending; then the
//!   keys of unknown delivery, from an index, oldest first.
//!
//! The index is a sorted set of its own, `<prefix>unknown-index`
//! ([`UNKNOWN_INDEX_SUFFIX`]; a key of the layer, `namespace:key`, cannot take that name).
//! Its members are keys (without the prefix), scored by when their record expires, in
//! milliseconds of the index's server clock:
//!
//! - `complete` (single or batch) adds a key, after writing its record, when the outcome is
//!   of unknown delivery (a script that also trims entries whose record has
//!   surely expired, so the index stays as small as the live records of unknown delivery);
//! - `forget` and `resolve` remove the key once they changed its record;
//! - `list` reads a page by rank after its cursor (one script, `O(log N + page)`),
//!   reads each record where it lives, lists those still of unknown delivery, and drops the
//!   others from the index (one script, each only while it has the score read).
//!
//! The index is best effort and heals itself: records and index are separate keys (in
//! different slots on a cluster, since record keys carry no common hash tag), so they are
//! written by separate commands, never one script. An entry whose record expired, was taken
//! by a new reserve, or was changed around the store is skipped by the next listing and
//! dropped; a record that a failed index write left out is indexed again when its
//! settlement is retried. On a cluster, the index is one key on one node, which every
//! listing and every unknown `complete` reaches.
//!
//! Stale pending keys are not indexed: indexing them would take an index write on every
//! reserve, another key in another slot on a cluster. A listing scans for them instead: its
//! cost grows with the keys under the prefix (each page makes at most a few `SCAN` calls and
//! may hold fewer entries than asked, even none, with a cursor to go on). `SCAN` may answer
//! a key twice when the server resizes its table meanwhile, so a stale key may be listed
//! twice; settling it twice is harmless.
//!
//! # Guarantee
//!
//! On one server, or one primary per slot, reservations are atomic: of concurrent reserves of
//! a key exactly one gets it. Redis replicates asynchronously, so a failover that loses the
//! last writes can lose a reservation or a kept outcome, and a message may then go again: the
//! store gives at-least-once delivery with deduplication, not exactly-once. Forward the
//! `Idempotency-Key` to providers that deduplicate on it as the second net.
//!
//! # Durability
//!
//! [`RedisStore::require_replicas`]`(n, timeout)` (off by default) closes that gap: every
//! reservation, completion and release ends its pipeline with `WAIT n timeout_ms`, so the
//! write and the wait for `n` replicas cost one round trip, on the key's node (on a cluster,
//! the pipeline of the key's slot; under Sentinel, the primary's). When fewer than `n`
//! acknowledge in time, the operation is an
//! [`Unavailable`](super::StoreErrorKind::Unavailable) error naming how many did:
//!
//! - a reservation so refused is first released under its own token, so the key is not left
//!   held by nobody, and the layer sends nothing (`idempotency.store_failed`); that release is
//!   not waited for, as the replicas did not acknowledge the reservation it frees either (one
//!   that got the reservation late and is promoted before the release reaches it holds the
//!   key until its lease ends). A replay or an "in progress" answer wrote nothing and is
//!   answered as usual;
//! - a refused completion was written on the primary all the same; the layer's settlement
//!   retry writes it again;
//! - a refused release freed the key on the primary, but a failover would bring back its
//!   acknowledged reservation, held by nobody until its lease ends: the layer's settlement
//!   retry releases it again, on the new primary if there was a failover (a release that
//!   freed nothing is not refused).
//!
//! A lease renewal ([`extend`](crate::store::Store::extend)) is not waited for: a failover that loses one
//! leaves the lease the last acknowledged write gave, and the layer renews every third of the
//! lease, so the next renewal, on the new primary, comes before that lease ends. Waiting
//! would turn a replica's absence into failed renewals of sends already under way.
//!
//! What the option buys: in the tests' failover (replication to the one replica cut, ten
//! messages sent, the primary killed, the replica promoted), every message reserved on the
//! primary alone went a second time with the option off (ten of ten, by Sentinel or by
//! hand), and none with it on, where those reservations were refused and the messages went
//! once after the failover. In a failover nobody forced, the messages lost are those of the
//! replication lag: from none to the last second's writes.
//!
//! It covers a primary that is lost: the replica promoted (Sentinel picks the one with the
//! most data) has every write `WAIT` counted. It cannot cover an old primary that keeps
//! taking writes while a failover runs around it (a forced failover before the sentinels
//! demote it, a partition that leaves one of its replicas on its side): a replica that
//! acknowledged such a write is pointed at the new primary and drops it. Redis's own `min-replicas-to-write` and
//! `min-replicas-max-lag` on the primary narrow that window.
//!
//! The price, measured on loopback (one primary, one replica, `require_replicas(1, 100 ms)`,
//! `cargo bench --features redis --bench stores -- redis-durable`, on a 2-core machine
//! busy with other work, so read the ratios): one reserve at a time took 63 µs with the
//! option off and 166 µs with it on (2.6 ×); 32 at once took 0.47 ms (68,000 reserves a
//! second) off and 3.3 ms (9,700 a second) on, `WAIT` queueing behind the replica's
//! acknowledgements (the issue's 6-node cluster measured 0.8 ms and 2.4 ms a reserve at 32
//! at once). A shard (or a lone primary) without a live replica refuses **every** send while
//! the option is on, after waiting `timeout` each time: the option trades availability for
//! never losing a reservation. Turn it on when a failover must not send a message twice:
//! on a 6-node cluster, killing a master after a second of writes its replica never got
//! sent 23 to 30 of 2,000 keys again; an experiment with `WAIT 1 100` in the reserve's
//! pipeline sent none. Give every primary at least `n + 1` replicas if it must keep sending
//! while one is down, and keep `timeout` well under the store's
//! [`timeout`](RedisStore::timeout).
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
//! ## Cluster connections heal
//!
//! Under a storm of killed connections (about ten a second for a few seconds) the cluster
//! client can get stuck for good: every later call times out while a new connection from the
//! same client works at once. A store from `connect_cluster` (or `from_cluster_client`) keeps
//! its client: when calls have gone unanswered for `heal_after` (`HEAL_AFTER`, 4 s, by
//! default) while they were made, one caller at a time opens a new connection (bounded by
//! [`DEFAULT_TIMEOUT`]), checks that it answers `PING`, and swaps it in for every clone,
//! logging a warning. Calls in flight on the old connection fail as store failures, on which
//! nothing is sent. A failed attempt is tried again on a later call, no sooner than 500 ms
//! after. A store from `from_cluster` has no client and cannot heal: prefer
//! `connect_cluster`.
//!
//! ## Redis Sentinel
//!
//! With `redis-sentinel`, `RedisStore::connect_sentinel(sentinels, primary_name)` asks the
//! sentinels for the primary (the `redis` crate's `SentinelClient`, which checks with `ROLE`
//! that the server it names is one) and keeps one multiplexed connection to it, shared by the
//! store's clones. It asks again, in a task of its own and one search at a time, when the
//! connection drops (the primary died, or a failover closed its clients), when the server
//! answers `READONLY` (it is a replica now, and the write was not made), or when calls go
//! unanswered for `heal_after` (a primary that hangs, a host gone without closing its
//! connections). The call that failed fails as a store failure, on which nothing is sent;
//! calls made meanwhile wait for the search within the store's timeout, and a search that
//! finds no primary yet (the failover is under way) is tried again by a later call, no sooner
//! than 100 ms after. No proxy is needed: sends resume once the sentinels have promoted a
//! replica. A failover loses what the replicas had not received: see [Durability](#durability)
//! for the option that makes a reservation reach a replica before its message goes.
//!
//! Every operation is bounded by a timeout ([`DEFAULT_TIMEOUT`], 2 s, set with
//! [`RedisStore::timeout`]); when it passes the operation fails with a
//! [`Timeout`](super::StoreErrorKind::Timeout) error. A `reserve` whose answer is lost (it
//! timed out, its connection dropped, or its caller stopped waiting) may still reserve the
//! key on the server; the store then releases the key under that reserve's token in the
//! background, asking again a few times over seconds as the reserve may land late, so the
//! key is not held with nobody sending until its lease ends. A reserve that the client sends
//! again and that finds the key held by its own token answers it as reserved.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script};

use super::StoreError;

mod admin;
mod connection;
mod durable;
#[cfg(feature = "redis-cluster")]
mod heal;
mod inspect;
mod ops;
mod pipeline;
mod scripts;
#[cfg(feature = "redis-sentinel")]
mod sentinel;
mod stale;

use connection::Connection;

pub use admin::UNKNOWN_INDEX_SUFFIX;

use scripts::{COMPLETE_SCRIPT, EXTEND_SCRIPT, RELEASE_SCRIPT, RESERVE_SCRIPT, RETAKE_SCRIPT};

/// The prefix put before every key unless [`RedisStore::key_prefix`] sets another.
pub const DEFAULT_KEY_PREFIX: &str = "idem:";

/// The default bound on one store operation, connection waits included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest lease or ttl sent to the server (100 years); longer ones are cut to it.
pub const MAX_EXPIRY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How long calls must go unanswered (not one answer since the first of them began) before a
/// store on Redis Cluster (`RedisStore::connect_cluster`, feature `redis-cluster`) or Redis
/// Sentinel (`RedisStore::connect_sentinel`, feature `redis-sentinel`) replaces its
/// connection, unless
/// [`RedisStore::heal_after`] says otherwise: twice [`DEFAULT_TIMEOUT`].
#[cfg(any(feature = "redis-cluster", feature = "redis-sentinel"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "redis-cluster", feature = "redis-sentinel")))
)]
pub const HEAL_AFTER: Duration = Duration::from_secs(4);

/// How long a pending record is kept past its lease unless
/// [`RedisStore::pending_kept_for`] says otherwise: a day, the layer's default ttl.
pub const DEFAULT_PENDING_KEPT: Duration = Duration::from_secs(24 * 60 * 60);

/// An idempotency store on Redis, shared by every process that uses the same server and
/// prefix. See the [module docs](self) for the commands, the key layout and the guarantee.
///
/// Clones share the connection.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_idempotency::store::{Reservation, Store};
/// use tower_idempotency::{Fingerprint, RedisStore};
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379")
///     .await?
///     .key_prefix("billing:idem:")
///     .timeout(Duration::from_millis(500));
///
/// let fingerprint = Fingerprint::from_bytes([0; 32]);
/// let reservation = store.reserve("invoice:42:email", fingerprint, Duration::from_secs(600)).await?;
/// // `token()` says whether we hold the key: `Reserved`, or `TakenOver` from a crashed holder.
/// if let Some(token) = reservation.token() {
///     println!("ours to send, then complete or release under {token}");
/// } else if let Reservation::Held { record } = reservation {
///     println!("held by another send: {:?}", record.state);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    prefix: Arc<str>,
    timeout: Duration,
    pending_kept: Duration,
    durability: Option<durable::Durability>,
    reserve: Arc<Script>,
    retake: Arc<Script>,
    complete: Arc<Script>,
    release: Arc<Script>,
    extend: Arc<Script>,
    admin: Arc<admin::Scripts>,
}

impl RedisStore {
    /// A store on the connection manager, with the default prefix and timeout.
    ///
    /// `manager` is the `redis` crate's, version 1: add `redis = "1"` (with its
    /// `tokio-comp` and `connection-manager` features) to your dependencies to hand one in.
    /// [`connect`](Self::connect) needs none.
    ///
    /// The store bounds each call by its own [`timeout`](Self::timeout). A manager built on
    /// the `redis` crate's defaults also times every command out itself (after 500 ms): a
    /// second timer per command, and a bound shorter than the store's. Build it as
    /// `connect` does, to leave the bound to the store:
    ///
    /// ```no_run
    /// use redis::aio::{ConnectionManager, ConnectionManagerConfig};
    /// use tower_idempotency::RedisStore;
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let config = ConnectionManagerConfig::new().set_response_timeout(None);
    /// let manager = ConnectionManager::new_with_config(client, config).await?;
    /// let store = RedisStore::new(manager);
    /// # Ok(()) }
    /// ```
    pub fn new(manager: ConnectionManager) -> Self {
        Self::with_connection(Connection::Single(manager))
    }

    /// Connects to the server at `url` (`redis://[user:password@]host:port[/db]`, or
    /// `rediss://` with the `redis` crate's TLS features) through a reconnecting
    /// [`ConnectionManager`].
    ///
    /// The first connection is tried once, so a server that refuses it fails at once rather
    /// than after the manager's reconnect backoff. Fails with an
    /// [`Unavailable`](super::StoreErrorKind::Unavailable) error, naming the address and the
    /// cause (`connection refused`, say), when the server cannot be reached; with a
    /// [`Timeout`](super::StoreErrorKind::Timeout) error, naming the address, when it does not
    /// answer within [`DEFAULT_TIMEOUT`]; and with a
    /// [`Misconfigured`](super::StoreErrorKind::Misconfigured) error for a URL that is not a
    /// Redis URL or credentials the server refuses.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        // The URL may hold a password: errors name the address only.
        let client = redis::Client::open(url).map_err(|e| {
            StoreError::misconfigured(
                "the Redis URL is invalid (redis://[user:password@]host:port[/db])",
            )
            .with_source(e)
        })?;
        let address = client.get_connection_info().addr().to_string();
        let failed = |error: RedisError| {
            let refused_credentials = error.kind() == redis::ErrorKind::AuthenticationFailed
                || matches!(error.code(), Some("WRONGPASS" | "NOAUTH"));
            if refused_credentials {
                StoreError::misconfigured(format!("Redis at {address} refused the credentials"))
                    .with_source(error)
            } else if error.is_timeout() {
                StoreError::new(
                    super::StoreErrorKind::Timeout,
                    format!("Redis at {address} did not answer within {DEFAULT_TIMEOUT:?}"),
                )
                .with_source(error)
            } else {
                StoreError::new(
                    super::StoreErrorKind::Unavailable,
                    format!("cannot connect to Redis at {address}"),
                )
                .with_source(error)
            }
        };
        let timed_out = || {
            StoreError::new(
                super::StoreErrorKind::Timeout,
                format!("Redis at {address} did not answer within {DEFAULT_TIMEOUT:?}"),
            )
        };
        // One attempt first: the manager retries a refused first connection with backoff
        // until our timeout, which would hide the refusal behind a timeout.
        let first =
            redis::AsyncConnectionConfig::new().set_connection_timeout(Some(DEFAULT_TIMEOUT));
        tokio::time::timeout(
            DEFAULT_TIMEOUT,
            client.get_multiplexed_async_connection_with_config(&first),
        )
        .await
        .map_err(|_| timed_out())?
        .map_err(&failed)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(DEFAULT_TIMEOUT))
            // Our own timeout bounds each operation; the manager's would cut it shorter.
            .set_response_timeout(None);
        let manager = tokio::time::timeout(
            DEFAULT_TIMEOUT,
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| timed_out())?
        .map_err(failed)?;
        Ok(Self::new(manager))
    }

    /// How long calls may go unanswered, while they are made, before a store from
    /// `connect_cluster` (feature `redis-cluster`) replaces its connection with a new one from
    /// its client, or one from `connect_sentinel` (feature `redis-sentinel`) asks the
    /// sentinels for the primary again (default [`HEAL_AFTER`], 4 s). Keep it above the
    /// store's [`timeout`](Self::timeout), so that one slow call is not taken for a stuck
    /// connection. Has no effect on a store on a single server, or from `from_cluster`, which
    /// cannot heal.
    #[cfg(any(feature = "redis-cluster", feature = "redis-sentinel"))]
    #[cfg_attr(
        docsrs,
        doc(cfg(any(feature = "redis-cluster", feature = "redis-sentinel")))
    )]
    #[must_use]
    pub fn heal_after(mut self, unanswered: Duration) -> Self {
        match &mut self.connection {
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(cluster) => cluster.set_heal_after(unanswered),
            #[cfg(feature = "redis-sentinel")]
            Connection::Sentinel(primary) => primary.set_heal_after(unanswered),
            _ => {}
        }
        self
    }

    fn with_connection(connection: Connection) -> Self {
        Self {
            connection,
            prefix: Arc::from(DEFAULT_KEY_PREFIX),
            timeout: DEFAULT_TIMEOUT,
            pending_kept: DEFAULT_PENDING_KEPT,
            durability: None,
            reserve: Arc::new(Script::new(RESERVE_SCRIPT)),
            retake: Arc::new(Script::new(RETAKE_SCRIPT)),
            complete: Arc::new(Script::new(COMPLETE_SCRIPT)),
            release: Arc::new(Script::new(RELEASE_SCRIPT)),
            extend: Arc::new(Script::new(EXTEND_SCRIPT)),
            admin: Arc::new(admin::Scripts::new()),
        }
    }

    /// Sets the prefix put before every key (default [`DEFAULT_KEY_PREFIX`]); stores that
    /// should see each other's keys must use the same one.
    ///
    /// The prefix says where this crate's records live in the keyspace; the layer's namespace,
    /// already part of the key the store is given, says whose keys they are. A layer of
    /// namespace `alerts` keeps the key `k` under `idem:alerts:k`: change the prefix only when
    /// other applications share the server, and never repeat the namespace in it.
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

    /// How long a pending record is kept past its lease (default [`DEFAULT_PENDING_KEPT`],
    /// a day): while it is, a reserve after the lease reports that it took the key over
    /// from a holder that never settled it
    /// ([`Reservation::TakenOver`](crate::store::Reservation::TakenOver)), so the layer can check
    /// before it sends. After it, the record is gone and such a reserve answers
    /// `Reserved`, as a store without the record would. Zero keeps it no longer than its
    /// lease.
    #[must_use]
    pub fn pending_kept_for(mut self, kept: Duration) -> Self {
        self.pending_kept = kept;
        self
    }

    /// Requires `replicas` replicas to acknowledge each reservation, completion and release
    /// within `timeout` (`WAIT` in the write's own pipeline), else the operation fails as
    /// [`Unavailable`](super::StoreErrorKind::Unavailable) and nothing is sent; off by
    /// default, and `replicas` 0 turns it off. See [Durability](self#durability).
    #[must_use]
    pub fn require_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.durability = (replicas > 0).then(|| durable::Durability::new(replicas, timeout));
        self
    }

    fn redis_key(&self, key: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + key.len());
        k.push_str(&self.prefix);
        k.push_str(key);
        k
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.connection {
            Connection::Single(_) => "single",
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(_) => "cluster",
            #[cfg(feature = "redis-sentinel")]
            Connection::Sentinel(_) => "sentinel",
        };
        f.debug_struct("RedisStore")
            .field("connection", &kind)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
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
