//! The connection a [`RedisStore`](super::RedisStore) runs on: one server's, a cluster's
//! (which heals, see [`heal`](super::heal)), or the primary's that Redis Sentinel names
//! (found again after a failover, see [`sentinel`](super::sentinel)); and the constructors
//! of a store on a cluster or on Sentinel's primary.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, Pipeline, RedisFuture, Value};

#[cfg(feature = "redis-cluster")]
use super::heal::{self, HealingCluster};
#[cfg(feature = "redis-sentinel")]
use super::sentinel::{self, SentinelPrimary};
#[cfg(feature = "redis-cluster")]
use super::unavailable;
#[cfg(any(feature = "redis-cluster", feature = "redis-sentinel"))]
use super::{DEFAULT_TIMEOUT, RedisStore};
#[cfg(any(feature = "redis-cluster", feature = "redis-sentinel"))]
use crate::store::StoreError;
#[cfg(feature = "redis-sentinel")]
use crate::store::StoreErrorKind;

/// The connection kinds a store runs on.
#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    #[cfg(feature = "redis-cluster")]
    Cluster(heal::HealingCluster),
    #[cfg(feature = "redis-sentinel")]
    Sentinel(sentinel::SentinelPrimary),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(c) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(c) => c.req_packed_command(cmd),
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
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(c) => c.get_db(),
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(c) => c.get_db(),
        }
    }
}

#[cfg(feature = "redis-cluster")]
impl RedisStore {
    /// A store on a Redis Cluster connection (the `redis` crate's, version 1, with its
    /// `cluster-async` feature), with the default prefix and timeout.
    ///
    /// Without the client that made it, the store cannot replace a connection that stops
    /// answering (see [Cluster connections heal](super#cluster-connections-heal)): prefer
    /// [`connect_cluster`](Self::connect_cluster).
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub fn from_cluster(connection: redis::cluster_async::ClusterConnection) -> Self {
        Self::with_connection(Connection::Cluster(HealingCluster::fixed(connection)))
    }

    /// A store on a Redis Cluster connection and the client that opened it (the `redis`
    /// crate's, version 1, with its `cluster-async` feature), with the default prefix and
    /// timeout: for a client built with settings of your own (TLS, credentials, timeouts).
    /// The store replaces the connection with a new one from `client` when it stops
    /// answering (see [Cluster connections heal](super#cluster-connections-heal)); a new
    /// connection, and its check, are bounded by [`DEFAULT_TIMEOUT`].
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub fn from_cluster_client(
        client: redis::cluster::ClusterClient,
        connection: redis::cluster_async::ClusterConnection,
    ) -> Self {
        Self::with_connection(Connection::Cluster(HealingCluster::new(
            client,
            connection,
            DEFAULT_TIMEOUT,
        )))
    }

    /// Connects to the Redis Cluster that `urls` (some of its nodes) belong to.
    ///
    /// The connection discovers the other nodes, routes each key to its slot's primary and
    /// reconnects to nodes it lost by itself. The store keeps the client, to replace a
    /// connection that stops answering (see
    /// [Cluster connections heal](super#cluster-connections-heal) and
    /// [`heal_after`](Self::heal_after)). Fails like [`connect`](Self::connect).
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
        Ok(Self::from_cluster_client(client, connection))
    }
}

#[cfg(feature = "redis-sentinel")]
impl RedisStore {
    /// Connects to the primary that the Redis Sentinels at `sentinels` (the sentinels'
    /// addresses, `redis://host:26379`, not the servers') name `primary_name` (the name in
    /// their `sentinel monitor` lines), and follows it through failovers.
    ///
    /// The store asks the sentinels again when its connection drops, when the server answers
    /// `READONLY` (it is a replica now), or when calls go unanswered for
    /// [`heal_after`](Self::heal_after); calls made meanwhile wait for the answer within the
    /// store's [`timeout`](Self::timeout), and the call that failed fails as a store failure,
    /// on which nothing is sent. See [Redis Sentinel](super#redis-sentinel).
    ///
    /// The sentinels are asked once before this returns, so a wrong name or no sentinel fails
    /// here: with a [`Misconfigured`](StoreErrorKind::Misconfigured) error for an address that
    /// is not a Redis URL; with an [`Unavailable`](StoreErrorKind::Unavailable) error, naming
    /// `primary_name`, when no sentinel names a primary that answers (the name is wrong, or a
    /// failover is under way); with a [`Timeout`](StoreErrorKind::Timeout) error when the
    /// search takes longer than [`DEFAULT_TIMEOUT`]. Credentials of the sentinels go in their
    /// URLs; for credentials, a database or TLS on the primary, build the `redis` crate's
    /// `SentinelClient` and hand it to [`from_sentinel_client`](Self::from_sentinel_client).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_idempotency::RedisStore;
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let sentinels = [
    ///     "redis://10.0.0.1:26379",
    ///     "redis://10.0.0.2:26379",
    ///     "redis://10.0.0.3:26379",
    /// ];
    /// let store = RedisStore::connect_sentinel(sentinels, "idempotency")
    ///     .await?
    ///     // A reservation is kept by a replica before its message goes: a failover loses none.
    ///     .require_replicas(1, Duration::from_millis(100));
    /// # Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-sentinel")))]
    pub async fn connect_sentinel<I, T>(
        sentinels: I,
        primary_name: &str,
    ) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: redis::IntoConnectionInfo,
    {
        let client = redis::sentinel::SentinelClient::build(
            sentinels.into_iter().collect(),
            // A `String`: the `redis` crate takes one unless its TLS features are on.
            String::from(primary_name),
            None,
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(|e| {
            StoreError::misconfigured(
                "a Redis Sentinel address is invalid (redis://[user:password@]host:port)",
            )
            .with_source(e)
        })?;
        let store = Self::from_sentinel_client(client);
        if let Connection::Sentinel(primary) = &store.connection {
            tokio::time::timeout(DEFAULT_TIMEOUT, primary.found())
                .await
                .map_err(|_| {
                    StoreError::new(
                        StoreErrorKind::Timeout,
                        format!(
                            "the sentinels did not name the primary {primary_name:?} within \
                             {DEFAULT_TIMEOUT:?}"
                        ),
                    )
                })?
                .map_err(|e| {
                    StoreError::new(
                        StoreErrorKind::Unavailable,
                        format!("no sentinel named a primary {primary_name:?} that answers"),
                    )
                    .with_source(e)
                })?;
        }
        Ok(store)
    }

    /// A store on the primary that `client` finds (the `redis` crate's, version 1, with its
    /// `sentinel` feature), built with `SentinelServerType::Master`: for sentinels or a
    /// primary with settings of your own (credentials, a database, TLS). Follows the primary
    /// as [`connect_sentinel`](Self::connect_sentinel) does; the first call asks the
    /// sentinels. Each search (the sentinels' answer, the primary's check and its
    /// connection) is bounded by [`DEFAULT_TIMEOUT`].
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-sentinel")))]
    pub fn from_sentinel_client(client: redis::sentinel::SentinelClient) -> Self {
        Self::with_connection(Connection::Sentinel(SentinelPrimary::new(
            client,
            DEFAULT_TIMEOUT,
        )))
    }
}
