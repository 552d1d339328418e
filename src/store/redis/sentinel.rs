//! A connection to the primary that Redis Sentinel names, found again after a failover.
//!
//! The `redis` crate's `SentinelClient` finds the primary (and checks with `ROLE` that the
//! server it names is one), but a connection it opened stays on that server. [`SentinelPrimary`]
//! keeps the client and one multiplexed connection to the primary, shared by a store's
//! clones, and drops the connection when the server stops being the primary:
//!
//! - a call failed without an answer from the server (its connection dropped: the server is
//!   gone, or a failover's sentinels closed its clients);
//! - the server answered `READONLY` (it is a replica now: the write was not made);
//! - calls have gone unanswered for `heal_after` while they were made (a primary that hangs, or
//!   a host gone without closing its connections).
//!
//! Then it asks the sentinels again, in a task of its own (so a caller's timeout cannot cut the
//! search short), one search at a time. Calls made meanwhile wait for that search, within
//! their own timeout, and go to the primary it found. The call that failed fails as a store
//! failure, on which nothing is sent. A search that finds no primary (the failover is not over)
//! is tried again by a later call, no sooner than [`RETRY_AFTER`] after.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};
use tokio::sync::watch;
use tokio::time::Instant;

/// The least time between two searches when the last one found no primary: during a
/// failover the sentinels name the old primary, or none, until it is over.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// The primary's connection, shared by a store's clones, and the sentinels that name it.
#[derive(Clone)]
pub(super) struct SentinelPrimary {
    shared: Arc<Shared>,
    heal_after: Duration,
}

struct Shared {
    /// Built for the primary (`SentinelServerType::Master`); behind a lock as its lookups
    /// take it mutably, though only one search runs at a time.
    client: tokio::sync::Mutex<SentinelClient>,
    /// The bound on a search: the sentinels' answer, the primary's check and the connection.
    search_timeout: Duration,
    state: watch::Sender<State>,
    /// When the oldest call begun since the last answer began; `None` once a call is answered.
    unanswered_since: Mutex<Option<Instant>>,
}

#[derive(Clone)]
struct State {
    /// `None` while no primary is known: a search is under way, or the last one failed.
    connection: Option<MultiplexedConnection>,
    /// Counts the connections, so a failure drops the connection only if it is the one
    /// that failed.
    generation: u64,
    searching: bool,
    /// When the last search ended without a primary, and why.
    last_failure: Option<(Instant, Arc<str>)>,
}

/// What a failed search left for the calls that waited for it.
fn no_primary(why: &str) -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "no Redis primary: the sentinels were asked",
        why.to_owned(),
    ))
}

impl SentinelPrimary {
    /// No connection yet: the first call searches.
    pub(super) fn new(client: SentinelClient, search_timeout: Duration) -> Self {
        let (state, _) = watch::channel(State {
            connection: None,
            generation: 0,
            searching: false,
            last_failure: None,
        });
        Self {
            shared: Arc::new(Shared {
                client: tokio::sync::Mutex::new(client),
                search_timeout,
                state,
                unanswered_since: Mutex::new(None),
            }),
            heal_after: super::HEAL_AFTER,
        }
    }

    /// Sets how long calls may go unanswered before the connection is dropped.
    pub(super) fn set_heal_after(&mut self, heal_after: Duration) {
        self.heal_after = heal_after;
    }

    /// Searches now and waits for the answer: a store's first connection, whose failure
    /// fails the store's construction.
    pub(super) async fn found(&self) -> Result<(), RedisError> {
        self.connection().await.map(|_| ())
    }

    /// The primary's connection and its generation; waits for a search when none is known.
    async fn connection(&self) -> Result<(MultiplexedConnection, u64), RedisError> {
        let mut state = self.shared.state.subscribe();
        {
            let known = state.borrow_and_update();
            if let Some(connection) = &known.connection {
                return Ok((connection.clone(), known.generation));
            }
        }
        self.search()?;
        let known = state
            .wait_for(|s| s.connection.is_some() || !s.searching)
            .await
            .map_err(|_| no_primary("the store was dropped"))?;
        match (&known.connection, &known.last_failure) {
            (Some(connection), _) => Ok((connection.clone(), known.generation)),
            (None, Some((_, why))) => Err(no_primary(why)),
            (None, None) => Err(no_primary("the search ended without an answer")),
        }
    }

    /// Starts a search in a task of its own unless one is under way or a primary is known;
    /// fails with the last search's failure when it ended less than [`RETRY_AFTER`] ago.
    fn search(&self) -> Result<(), RedisError> {
        let mut start = Ok(false);
        self.shared.state.send_if_modified(|s| {
            if s.connection.is_some() || s.searching {
                return false;
            }
            if let Some((at, why)) = &s.last_failure
                && at.elapsed() < RETRY_AFTER
            {
                start = Err(no_primary(why));
                return false;
            }
            s.searching = true;
            start = Ok(true);
            true
        });
        if start? {
            let shared = Arc::clone(&self.shared);
            tokio::spawn(async move { shared.search().await });
        }
        Ok(())
    }

    /// Drops the connection of `generation` (unless a newer one replaced it) and starts a
    /// search for the primary.
    fn lost(&self, generation: u64, why: &dyn std::fmt::Display) {
        let dropped = self.shared.state.send_if_modified(|s| {
            if s.generation != generation || s.connection.is_none() {
                return false;
            }
            s.connection = None;
            true
        });
        if dropped {
            // The next connection's calls are counted afresh.
            *self.shared.unanswered() = None;
            tracing::warn!(
                "Redis primary lost ({why}): asking the sentinels for the primary again"
            );
        }
        // Started now, so the next call finds it under way; a failure is that call's to see.
        let _ = self.search();
    }

    /// The connection to send a call on; drops it first when calls have gone unanswered too
    /// long.
    async fn begin(&self) -> Result<(MultiplexedConnection, u64), RedisError> {
        let now = Instant::now();
        let since = *self.shared.unanswered().get_or_insert(now);
        let (connection, generation) = self.connection().await?;
        if now.duration_since(since) >= self.heal_after {
            *self.shared.unanswered() = None;
            self.lost(
                generation,
                &format_args!("unanswered for {:?}", self.heal_after),
            );
            return self.connection().await;
        }
        Ok((connection, generation))
    }

    /// Notes the result of a call: an answer shows the server works, but a `READONLY` one
    /// that it is the primary no more; no answer, that the connection is gone.
    fn finish(&self, generation: u64, failure: Option<&RedisError>, replies: &[Value]) {
        let read_only = replies
            .iter()
            .find(|reply| matches!(reply, Value::ServerError(e) if e.code() == "READONLY"));
        match failure {
            Some(error) if error.code().is_none() => self.lost(generation, error),
            Some(error) if error.code() == Some("READONLY") => self.lost(generation, error),
            _ if read_only.is_some() => {
                *self.shared.unanswered() = None;
                self.lost(generation, &"the server answered READONLY");
            }
            _ => *self.shared.unanswered() = None,
        }
    }
}

impl Shared {
    fn unanswered(&self) -> MutexGuard<'_, Option<Instant>> {
        // A plain value, assigned whole: a panic elsewhere cannot leave it torn.
        self.unanswered_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks the sentinels for the primary and connects to it, within the search's bound;
    /// publishes the connection, or why there is none.
    async fn search(&self) {
        let found = tokio::time::timeout(self.search_timeout, async {
            let mut client = self.client.lock().await;
            let primary = client.async_get_client().await?;
            let address = primary.get_connection_info().addr().to_string();
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.search_timeout))
                // The store's own timeout bounds each operation.
                .set_response_timeout(None);
            let connection = primary
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            Ok::<_, RedisError>((connection, address))
        })
        .await
        .unwrap_or_else(|_| {
            Err(no_primary(&format!(
                "no answer within {:?}",
                self.search_timeout
            )))
        });
        self.state.send_modify(|s| {
            s.searching = false;
            match found {
                Ok((connection, address)) => {
                    s.connection = Some(connection);
                    s.generation += 1;
                    s.last_failure = None;
                    *self.unanswered() = None;
                    tracing::info!(%address, "Redis Sentinel named the primary");
                }
                Err(error) => {
                    tracing::warn!(%error, "the sentinels named no primary that answers");
                    s.last_failure = Some((Instant::now(), Arc::from(error.to_string())));
                }
            }
        });
    }
}

impl ConnectionLike for SentinelPrimary {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (mut connection, generation) = self.begin().await?;
            let result = connection.req_packed_command(cmd).await;
            match &result {
                Ok(reply) => self.finish(generation, None, std::slice::from_ref(reply)),
                Err(error) => self.finish(generation, Some(error), &[]),
            }
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
            let (mut connection, generation) = self.begin().await?;
            let result = connection
                .req_packed_commands(pipeline, offset, count)
                .await;
            match &result {
                Ok(replies) => self.finish(generation, None, replies),
                Err(error) => self.finish(generation, Some(error), &[]),
            }
            result
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
