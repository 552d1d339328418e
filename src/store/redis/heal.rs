//! A Redis Cluster connection that replaces itself when it stops answering.
//!
//! The `redis` crate's `ClusterConnection` reconnects to nodes by itself, but under a storm of
//! killed connections it can get stuck for good: every later call times out, its last log line
//! "beginning slot refresh", while a new connection from the same client works at once.
//! [`HealingCluster`] keeps the client, notes when calls stop being answered, and once none
//! has been answered for [`HEAL_AFTER`](super::HEAL_AFTER) while calls were made, opens a new
//! connection (one at a time, in a task of its own so a caller's timeout cannot cut it short),
//! checks that it answers `PING`, and swaps it in for every clone. Calls in flight on the old
//! connection fail as store failures, on which nothing is sent.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::time::Instant;

/// The least time between two attempts at a new connection when the last one failed.
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// A cluster connection shared by a store's clones, and, when the store has its client, the
/// means to replace it.
#[derive(Clone)]
pub(super) struct HealingCluster {
    shared: Arc<Shared>,
    heal_after: Duration,
}

struct Shared {
    /// `None` for a connection handed in without its client: it cannot be replaced.
    client: Option<ClusterClient>,
    /// The bound on opening a new connection and on its `PING`.
    connect_timeout: Duration,
    state: Mutex<State>,
    /// Whether a replacement is under way (single flight).
    healing: AtomicBool,
}

struct State {
    current: ClusterConnection,
    /// When the oldest call begun since the last answer began; `None` once a call is answered.
    unanswered_since: Option<Instant>,
    /// When the last failed replacement ended.
    last_failed_attempt: Option<Instant>,
    /// How many times the connection was replaced.
    replacements: u64,
}

impl HealingCluster {
    /// A connection that `client` can replace.
    pub(super) fn new(
        client: ClusterClient,
        connection: ClusterConnection,
        connect_timeout: Duration,
    ) -> Self {
        Self::build(Some(client), connection, connect_timeout)
    }

    /// A connection handed in without its client: it is never replaced.
    pub(super) fn fixed(connection: ClusterConnection) -> Self {
        Self::build(None, connection, super::DEFAULT_TIMEOUT)
    }

    fn build(
        client: Option<ClusterClient>,
        connection: ClusterConnection,
        connect_timeout: Duration,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                client,
                connect_timeout,
                state: Mutex::new(State {
                    current: connection,
                    unanswered_since: None,
                    last_failed_attempt: None,
                    replacements: 0,
                }),
                healing: AtomicBool::new(false),
            }),
            heal_after: super::HEAL_AFTER,
        }
    }

    /// Sets how long calls may go unanswered before the connection is replaced.
    pub(super) fn set_heal_after(&mut self, heal_after: Duration) {
        self.heal_after = heal_after;
    }

    /// The connection to send a call on; starts a replacement when calls have gone unanswered
    /// too long.
    fn begin(&self) -> ClusterConnection {
        let now = Instant::now();
        let mut state = self.shared.lock();
        let since = *state.unanswered_since.get_or_insert(now);
        let connection = state.current.clone();
        let stuck = now.duration_since(since) >= self.heal_after;
        let waited = state
            .last_failed_attempt
            .is_none_or(|at| now.duration_since(at) >= RETRY_AFTER);
        drop(state);
        if stuck && waited {
            self.heal();
        }
        connection
    }

    /// Notes the result of a call: any answer from the cluster, an error reply included, shows
    /// the connection works.
    fn finish<T>(&self, result: &RedisResult<T>) {
        let answered = match result {
            Ok(_) => true,
            Err(error) => answered_with_error(error),
        };
        if answered {
            self.shared.lock().unanswered_since = None;
        }
    }

    /// Starts a replacement in a task of its own unless one is under way or the store has no
    /// client.
    fn heal(&self) {
        let Some(client) = self.shared.client.clone() else {
            return;
        };
        if self.shared.healing.swap(true, Ordering::AcqRel) {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let unanswered_for = self.heal_after;
        tokio::spawn(async move {
            let result = replacement(&client, shared.connect_timeout).await;
            let mut state = shared.lock();
            match result {
                Ok(connection) => {
                    state.current = connection;
                    state.unanswered_since = None;
                    state.last_failed_attempt = None;
                    state.replacements += 1;
                    tracing::warn!(
                        replacements = state.replacements,
                        "Redis Cluster connection unanswered for {unanswered_for:?}: replaced \
                         with a new one that answers PING"
                    );
                }
                Err(error) => {
                    state.last_failed_attempt = Some(Instant::now());
                    tracing::warn!(
                        %error,
                        "Redis Cluster connection unanswered for {unanswered_for:?}; a new \
                         one could not be opened, will try again"
                    );
                }
            }
            drop(state);
            shared.healing.store(false, Ordering::Release);
        });
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is only ever assigned whole, so a panic elsewhere cannot leave it torn.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A new connection from `client` that answers `PING`, both within `timeout`.
async fn replacement(client: &ClusterClient, timeout: Duration) -> RedisResult<ClusterConnection> {
    let timed_out = || RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
    let mut connection = tokio::time::timeout(timeout, client.get_async_connection())
        .await
        .map_err(|_| timed_out())??;
    let () = tokio::time::timeout(timeout, redis::cmd("PING").query_async(&mut connection))
        .await
        .map_err(|_| timed_out())?
        .map(|_: Value| ())?;
    Ok(connection)
}

/// Whether `error` is a reply from a server (the connection works) rather than a failure to
/// get one.
fn answered_with_error(error: &RedisError) -> bool {
    error.code().is_some()
}

impl HealingCluster {
    /// `cmd` sent where `routing` says (every primary, one node by address), noted as any
    /// other call: the stale-key listing asks each primary by name.
    pub(super) async fn route_command(
        &self,
        cmd: Cmd,
        routing: redis::cluster_routing::RoutingInfo,
    ) -> RedisResult<Value> {
        let mut connection = self.begin();
        let result = connection.route_command(cmd, routing).await;
        self.finish(&result);
        result
    }
}

impl ConnectionLike for HealingCluster {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut connection = self.begin();
            let result = connection.req_packed_command(cmd).await;
            self.finish(&result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut connection = self.begin();
            let result = connection
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.finish(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
