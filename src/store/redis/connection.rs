//! The connection a [`RedisStore`](super::RedisStore) runs on: one server's, a cluster's
//! (which heals, see [`heal`](super::heal)), or the primary's that Redis Sentinel names
//! (found again after a failover, see [`sentinel`](super::sentinel)).

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, Pipeline, RedisFuture, Value};

#[cfg(feature = "redis-cluster")]
use super::heal;
#[cfg(feature = "redis-sentinel")]
use super::sentinel;

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
