//! The promise under faults, against real servers of the tests' own (see
//! `support::servers`): a key reaches the provider twice only after a crash. Through the
//! README's production stack, store connections are killed while an outcome is kept
//! (Redis, Redis Cluster, PostgreSQL) and while duplicates from two layers race; a send
//! outlasts its lease three times over; renewal stops with its send and with a drop. At the
//! end the provider's calls are counted per key.
//!
//! Every server here is private to this binary (Redis per test, one Redis Cluster and one
//! PostgreSQL cluster shared by its tests, each test in its own database or ACL user), so the
//! kills never reach the shared servers other tests use. Leases are short (under a second
//! where the store recovers fast) and every wait is bounded: the binary runs in seconds.
#![cfg(all(feature = "redis", feature = "redis-cluster", feature = "postgres"))]

mod support;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use support::servers::{
    PostgresCluster, RedisCluster, RedisServer, kill_redis_connections, terminate_postgres_sessions,
};
use support::stores::{postgres_admin, redis_admin, unique, unique_prefix, until_settled};
use support::{Provider, message, poll_until, wait_until};
use tower::retry::RetryLayer;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::Outcome;
use tower_idempotency::outcome::codes;
use tower_idempotency::store::admin::StoreAdmin;
use tower_idempotency::store::{Completion, Reservation, StoreError, Token};
use tower_idempotency::{
    IdempotencyLayer, Message, PostgresStore, Receipt, RedisStore, RetryPolicy, SendError, Store,
};

/// The lease of the tests where a repeat comes after it.
const LEASE: Duration = Duration::from_secs(1);
/// The bound on each store operation: well within the lease, as it must be for the layer's
/// settlement retries and renewals to fit in it (the stores' default, 2 s, suits the
/// default lease of minutes, not these).
const STORE_TIMEOUT: Duration = Duration::from_millis(200);

fn layer(store: impl Store, lease: Duration) -> IdempotencyLayer {
    IdempotencyLayer::builder()
        .store(store)
        .namespace("faults")
        .lease(lease)
        .build()
        .expect("valid layer")
}

/// The README's production stack over `provider`, outermost first: the layer, a retry
/// judged by the layer's classifier, a concurrency limit, a per-attempt timeout.
fn production_stack(
    layer: &IdempotencyLayer,
    provider: Provider,
) -> impl tower::Service<Message, Response = Receipt, Error = SendError, Future: Send>
+ Clone
+ Send
+ use<> {
    let retry = RetryPolicy::new()
        .max_attempts(3)
        .base_delay(Duration::from_millis(20))
        .classifier(layer.classifier());
    ServiceBuilder::new()
        .layer(layer.clone())
        .layer(RetryLayer::new(retry))
        .concurrency_limit(16)
        .timeout(Duration::from_secs(1))
        .service(provider)
}

fn alert(key: &str) -> Message {
    message(Some(key), "Vintage Nikon FM2 just sold.")
}

/// The idempotency key of `m`, which every message here has.
fn key_of(m: &Message) -> String {
    m.idempotency_key()
        .map(|k| k.as_str().to_owned())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// One dropped connection while the outcome is kept.

/// The provider accepts the first message and, before it answers, `fault` makes the store's
/// connection fail under the `complete` that follows; `killed` counts the connections the
/// fault killed. A repeat after the lease must be replayed: the provider called once.
async fn dropped_connection_while_keeping_the_outcome<S, F, Fut>(
    store: S,
    fault: F,
    killed: Arc<AtomicUsize>,
    settlement: Settlement,
) where
    S: StoreAdmin + Clone,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let fault = Arc::new(fault);
    let provider = Provider::answering(move |n, _| {
        let fault = Arc::clone(&fault);
        async move {
            if n == 1 {
                fault().await;
            }
            Ok(Receipt::new(format!("msg-{n}"), "fake"))
        }
    });
    let layer = layer(store.clone(), LEASE);
    let service = production_stack(&layer, provider.clone());

    let first = service
        .clone()
        .oneshot(alert("order.created:ord_1:email"))
        .await
        .expect("the provider accepted");
    poll_until("the fault killed a connection", LEASE, || {
        std::future::ready(killed.load(Ordering::SeqCst) > 0)
    })
    .await;
    // The outcome is kept once a settlement lands; had none landed, the lease passes on
    // the server's clock, and the repeat then sends again.
    let stored = layer
        .stored_key_for("order.created:ord_1:email")
        .expect("a valid key");
    until_settled(&store, &[&stored]).await;
    let again = service.oneshot(alert("order.created:ord_1:email")).await;

    assert_eq!(
        provider.calls(),
        1,
        "the repeat after the lease was sent again; stats {:?}",
        layer.stats()
    );
    let again = again.expect("the repeat is answered from the store");
    assert!(again.replayed, "{again:?}");
    assert_eq!(again.id, first.id);
    let stats = layer.stats();
    assert_eq!(
        stats.store_failed_after_send, 0,
        "the outcome was kept in the end"
    );
    match settlement {
        Settlement::RetriedByTheLayer => assert!(stats.settle_retries >= 1, "{stats:?}"),
        Settlement::RetriedByTheClient => {}
    }
}

/// Who retries a `complete` whose connection was killed under it.
enum Settlement {
    /// The store answers the error; the layer's settlement retries.
    RetriedByTheLayer,
    /// The Redis Cluster client resends the command on a new connection by itself, so the
    /// store may answer without error.
    RetriedByTheClient,
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn one_dropped_redis_connection_while_keeping_the_outcome_does_not_send_twice() {
    let Some(server) = RedisServer::start().await else {
        return;
    };
    let store = server.store(unique_prefix("dropped"), STORE_TIMEOUT).await;
    let admin = redis_admin::admin(&server.url).await;
    let killed = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&killed);
    let fault = move || {
        let mut admin = admin.clone();
        let count = Arc::clone(&count);
        async move {
            let n = kill_redis_connections(&mut admin)
                .await
                .expect("CLIENT KILL");
            count.fetch_add(usize::try_from(n).unwrap_or(0), Ordering::SeqCst);
        }
    };
    dropped_connection_while_keeping_the_outcome(
        store,
        fault,
        killed,
        Settlement::RetriedByTheLayer,
    )
    .await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn one_dropped_cluster_connection_while_keeping_the_outcome_does_not_send_twice() {
    let Some(cluster) = RedisCluster::shared() else {
        return;
    };
    let user = cluster.user().await;
    let store = RedisStore::connect_cluster(user.urls.iter().map(String::as_str))
        .await
        .expect("connect to the private cluster")
        .key_prefix(unique_prefix("cluster-dropped"))
        .timeout(STORE_TIMEOUT);
    let user = Arc::new(tokio::sync::Mutex::new(user));
    let killed = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&killed);
    let fault = move || {
        let user = Arc::clone(&user);
        let count = Arc::clone(&count);
        async move {
            let n = user
                .lock()
                .await
                .kill_connections()
                .await
                .expect("CLIENT KILL");
            count.fetch_add(usize::try_from(n).unwrap_or(0), Ordering::SeqCst);
        }
    };
    dropped_connection_while_keeping_the_outcome(
        store,
        fault,
        killed,
        Settlement::RetriedByTheClient,
    )
    .await;
}

/// A store on a new database of the private PostgreSQL cluster, and that database's URL.
async fn postgres_store(cluster: &PostgresCluster) -> (PostgresStore, String) {
    let url = cluster.database().await;
    let store = PostgresStore::connect(&url)
        .await
        .expect("connect to the private cluster")
        .table(&unique("faults"))
        .expect("valid table name")
        .timeout(STORE_TIMEOUT);
    store.migrate().await.expect("migrate");
    (store, url)
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres_binaries),
    ignore = "no PostgreSQL server binaries"
)]
async fn one_killed_postgres_session_while_keeping_the_outcome_does_not_send_twice() {
    let Some(cluster) = PostgresCluster::shared() else {
        return;
    };
    let (store, url) = postgres_store(cluster).await;
    let table = store.table_name().to_owned();
    // The fault holds a lock on the table, so the store's `complete` waits on the server;
    // once it does, every other session of the database is terminated, then the lock freed.
    let holder = Arc::new(postgres_admin::admin(&url).await);
    let watcher = Arc::new(postgres_admin::admin(&url).await);
    let killed = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&killed);
    let fault = move || {
        let (holder, watcher, count) = (
            Arc::clone(&holder),
            Arc::clone(&watcher),
            Arc::clone(&count),
        );
        let table = table.clone();
        async move {
            holder
                .batch_execute(&format!("BEGIN; LOCK TABLE {table} IN EXCLUSIVE MODE"))
                .await
                .expect("lock the table");
            tokio::spawn(async move {
                let start = Instant::now();
                loop {
                    let waiting: i64 = watcher
                        .query_one(
                            "SELECT count(*) FROM pg_stat_activity \
                             WHERE datname = current_database() AND wait_event_type = 'Lock'",
                            &[],
                        )
                        .await
                        .expect("read pg_stat_activity")
                        .get(0);
                    if waiting > 0 {
                        break;
                    }
                    assert!(
                        start.elapsed() < Duration::from_secs(5),
                        "the store's complete never waited on the lock"
                    );
                    // Polls the server's view; nothing in the test depends on this period.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let n = terminate_postgres_sessions(&holder)
                    .await
                    .expect("pg_terminate_backend");
                holder
                    .batch_execute("ROLLBACK")
                    .await
                    .expect("free the lock");
                count.fetch_add(n, Ordering::SeqCst);
            });
        }
    };
    dropped_connection_while_keeping_the_outcome(
        store,
        fault,
        killed,
        Settlement::RetriedByTheLayer,
    )
    .await;
}

// ---------------------------------------------------------------------------------------
// A send that outlasts its lease.

/// The first send holds the provider for three leases while repeats come through two
/// layers (two processes) on `stores`: each must be answered `in_flight`, none sent; a
/// repeat through a layer that waits for in-flight sends gets the first send's receipt once
/// it is kept; after the send, a repeat replays it.
async fn send_outlasting_its_lease<S: Store + Clone>(stores: [S; 2]) {
    let lease = Duration::from_millis(400);
    let hold = Arc::new(tokio::sync::Notify::new());
    let held = Arc::clone(&hold);
    let provider = Provider::answering(move |n, _| {
        let held = Arc::clone(&held);
        async move {
            if n == 1 {
                held.notified().await;
            }
            Ok(Receipt::new(format!("msg-{n}"), "fake"))
        }
    });
    let [a, b] = stores;
    let waiting = IdempotencyLayer::builder()
        .store(b.clone())
        .namespace("faults")
        .lease(lease)
        .wait_for_in_flight(10 * lease)
        .build()
        .expect("valid layer");
    let layers = [layer(a, lease), layer(b, lease)];
    let services: Vec<_> = layers
        .iter()
        .map(|l| {
            ServiceBuilder::new()
                .layer(l.clone())
                .service(provider.clone())
        })
        .collect();

    let key = "order.created:ord_2:email";
    let first = tokio::spawn(services[0].clone().oneshot(alert(key)));
    wait_until(|| provider.calls() == 1).await;
    let waiter = tokio::spawn(
        ServiceBuilder::new()
            .layer(waiting)
            .service(provider.clone())
            .oneshot(alert(key)),
    );
    let start = Instant::now();
    let mut repeats = 0;
    while start.elapsed() < 3 * lease {
        for service in &services {
            let answer = service.clone().oneshot(alert(key)).await;
            match answer {
                Err(e) if e.code() == codes::IN_FLIGHT => repeats += 1,
                other => panic!(
                    "a repeat {:?} into the send got {other:?}; provider calls {}",
                    start.elapsed(),
                    provider.calls()
                ),
            }
        }
        // Paces the repeats over the three leases; the answers do not depend on it.
        tokio::time::sleep(lease / 4).await;
    }
    hold.notify_one();
    let first = first
        .await
        .expect("no panic")
        .expect("the provider accepted");
    let waited = waiter
        .await
        .expect("no panic")
        .expect("the waiting repeat gets the first send's receipt");
    assert!(waited.replayed && waited.id == first.id, "{waited:?}");
    let again = services[1]
        .clone()
        .oneshot(alert(key))
        .await
        .expect("the repeat after the send is answered from the store");
    assert!(again.replayed && again.id == first.id, "{again:?}");
    assert_eq!(provider.calls(), 1);
    assert!(repeats >= 12, "{repeats} repeats over three leases");
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn redis_send_lasting_three_leases_lets_no_repeat_through() {
    let Some(server) = RedisServer::start().await else {
        return;
    };
    let prefix = unique_prefix("slow");
    let mut stores = Vec::new();
    for _ in 0..2 {
        stores.push(server.store(prefix.clone(), STORE_TIMEOUT).await);
    }
    let stores: [RedisStore; 2] = stores.try_into().expect("two stores");
    send_outlasting_its_lease(stores).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn cluster_send_lasting_three_leases_lets_no_repeat_through() {
    let Some(cluster) = RedisCluster::shared() else {
        return;
    };
    let prefix = unique_prefix("cluster-slow");
    let mut stores = Vec::new();
    for _ in 0..2 {
        stores.push(
            RedisStore::connect_cluster(cluster.urls())
                .await
                .expect("connect")
                .key_prefix(prefix.clone())
                .timeout(STORE_TIMEOUT),
        );
    }
    let stores: [RedisStore; 2] = stores.try_into().expect("two stores");
    send_outlasting_its_lease(stores).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres_binaries),
    ignore = "no PostgreSQL server binaries"
)]
async fn postgres_send_lasting_three_leases_lets_no_repeat_through() {
    let Some(cluster) = PostgresCluster::shared() else {
        return;
    };
    let (a, url) = postgres_store(cluster).await;
    let b = PostgresStore::connect(&url)
        .await
        .expect("connect")
        .table(a.table_name())
        .expect("valid table name")
        .timeout(STORE_TIMEOUT);
    send_outlasting_its_lease([a, b]).await;
}

// ---------------------------------------------------------------------------------------
// Renewal ends with its send.

/// A store that counts the lease extensions it is asked for, and those it refused.
#[derive(Clone)]
struct CountingExtends<S> {
    inner: S,
    extends: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

impl<S> CountingExtends<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            extends: Arc::default(),
            refused: Arc::default(),
        }
    }

    fn extends(&self) -> usize {
        self.extends.load(Ordering::SeqCst)
    }
}

impl<S: Store> Store for CountingExtends<S> {
    fn reserve<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        self.inner.reserve(key, fingerprint, lease)
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner.complete(key, token, fingerprint, outcome, ttl)
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner.release(key, token)
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.extends.fetch_add(1, Ordering::SeqCst);
        async move {
            let answer = self.inner.extend(key, token, lease).await;
            if matches!(answer, Ok(false)) {
                self.refused.fetch_add(1, Ordering::SeqCst);
            }
            answer
        }
        .boxed()
    }

    fn reserve_many<'a>(
        &'a self,
        requests: &'a [(&'a str, Fingerprint)],
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<Result<Reservation, StoreError>>, StoreError>> {
        self.inner.reserve_many(requests, lease)
    }

    fn complete_many<'a>(
        &'a self,
        completions: &'a [Completion<'a>],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        self.inner.complete_many(completions, ttl)
    }

    fn release_many<'a>(
        &'a self,
        releases: &'a [(&'a str, Token)],
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        self.inner.release_many(releases)
    }
}

/// A send is held until the real store renewed its lease twice; once it ends, and once a
/// caller drops another send, no renewal follows (two more leases pass), and the dropped
/// send's key is kept as aborted, not sent again.
async fn renewal_stops_after_the_send_and_after_a_drop<S: Store + Clone>(store: S) {
    let lease = Duration::from_millis(300);
    let store = CountingExtends::new(store);
    let release = Arc::new(tokio::sync::Notify::new());
    let held = Arc::clone(&release);
    let provider = Provider::answering(move |n, _| {
        let held = Arc::clone(&held);
        async move {
            held.notified().await;
            Ok(Receipt::new(format!("msg-{n}"), "fake"))
        }
    });
    let layer = layer(store.clone(), lease);
    let service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(provider.clone());

    let first = tokio::spawn(service.clone().oneshot(alert("order.created:ord_3:email")));
    poll_until("the first send is renewed", 3 * lease, || {
        std::future::ready(store.extends() >= 2)
    })
    .await;
    release.notify_one();
    first
        .await
        .expect("no panic")
        .expect("the provider accepted");
    let after_send = store.extends();
    // That no renewal follows needs a span of real time, and nothing to signal: a lease
    // holds three renewals (one each third), had they gone on.
    tokio::time::sleep(lease).await;
    assert_eq!(store.extends(), after_send, "renewed after the send ended");

    let dropped = tokio::spawn(service.clone().oneshot(alert("order.created:ord_4:email")));
    poll_until("the second send is renewed", 3 * lease, || {
        std::future::ready(store.extends() > after_send)
    })
    .await;
    dropped.abort();
    assert!(dropped.await.is_err_and(|e| e.is_cancelled()));
    // The key is kept as aborted from the background; a repeat sees it once it landed.
    let start = Instant::now();
    loop {
        let answer = service
            .clone()
            .oneshot(alert("order.created:ord_4:email"))
            .await;
        match answer {
            Err(e) if e.code() == codes::ABORTED => break,
            Err(e) if e.code() == codes::IN_FLIGHT && start.elapsed() < lease => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => panic!("a repeat of the dropped send got {other:?}"),
        }
    }
    let after_drop = store.extends();
    // As above: three renewals' time, had they gone on.
    tokio::time::sleep(lease).await;
    assert_eq!(store.extends(), after_drop, "renewed after the drop");
    assert_eq!(
        store.refused.load(Ordering::SeqCst),
        0,
        "a renewal found its key lost"
    );
    assert_eq!(provider.calls(), 2);
    assert_eq!(layer.stats().renewal_lost, 0);
}

#[tokio::test]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn redis_renewal_stops_after_the_send_and_after_a_drop() {
    let Some(server) = RedisServer::start().await else {
        return;
    };
    let store = server.store(unique_prefix("renewal"), STORE_TIMEOUT).await;
    renewal_stops_after_the_send_and_after_a_drop(store).await;
}

#[tokio::test]
#[cfg_attr(
    not(backend_postgres_binaries),
    ignore = "no PostgreSQL server binaries"
)]
async fn postgres_renewal_stops_after_the_send_and_after_a_drop() {
    let Some(cluster) = PostgresCluster::shared() else {
        return;
    };
    let (store, _) = postgres_store(cluster).await;
    renewal_stops_after_the_send_and_after_a_drop(store).await;
}

// ---------------------------------------------------------------------------------------
// Duplicates racing while connections die.

const KEYS: usize = 8;
const DUPLICATES: usize = 50;
/// The killer kills for this long, a little past the last arrival, in at most
/// [`MAX_KILL_ROUNDS`] rounds. Faults, not an outage: settlements that began under the kills
/// land once the store is back, well within the lease, which is the promise under test (a
/// store down for a whole lease is outside it).
const STORM: Duration = Duration::from_millis(300);
const MAX_KILL_ROUNDS: usize = 1_000;
/// The duplicates of a key arrive this far apart (50 of them over 200 ms).
const ARRIVALS_EVERY: Duration = Duration::from_millis(4);
/// How long a store may take to answer again once the kills stop.
const RECOVERY: Duration = Duration::from_secs(5);

/// The storms on PostgreSQL and Redis Cluster run with a longer store timeout, and a lease
/// to match: both clients reconnect inside the caller's request, so a timeout shorter than a
/// reconnection takes under the crowd abandons every attempt, and the client stays unusable
/// for a second or more after the kills stop (seen with 200 ms: deadpool opens a connection
/// in the waiting caller's future; the cluster client reconnects to its initial nodes and
/// refreshes slots). An outage longer than the lease is outside the promise; the lease must
/// outlast the recovery.
const SLOW_STORM_TIMEOUT: Duration = Duration::from_secs(1);
const SLOW_STORM_LEASE: Duration = Duration::from_secs(3);

/// Kills the stores' connections once; answers how many it killed.
type Kill = Box<dyn FnMut() -> BoxFuture<'static, usize> + Send>;

/// Two layers (two processes) on stores from `connect` each send every one of [`KEYS`] keys
/// [`DUPLICATES`] times at once, while `kill` runs every `every`. Then: at most one provider
/// call per key, and every receipt a caller got is the one the provider gave for its key.
/// After the lease, a last repeat of every key through each layer must be answered with that
/// receipt (or, for a key no send reached, send it once).
async fn duplicates_under_connection_kills<S, C, Fut>(
    connect: C,
    mut kill: Kill,
    every: Duration,
    lease: Duration,
) where
    S: StoreAdmin,
    C: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    let given: Arc<Mutex<HashMap<String, Vec<String>>>> = Arc::default();
    let ledger = Arc::clone(&given);
    let provider = Provider::answering(move |n, m| {
        let id = format!("msg-{n}");
        ledger
            .lock()
            .expect("ledger")
            .entry(key_of(m))
            .or_default()
            .push(id.clone());
        async move {
            // A provider takes a moment: kills land while sends run, too.
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok(Receipt::new(id, "fake"))
        }
    });
    let layers = [layer(connect().await, lease), layer(connect().await, lease)];
    let services: Vec<_> = layers
        .iter()
        .map(|l| production_stack(l, provider.clone()))
        .collect();
    let keys: Vec<String> = (0..KEYS)
        .map(|k| format!("order.created:ord_{k}:email"))
        .collect();

    let killer = tokio::spawn(async move {
        let start = Instant::now();
        let (mut rounds, mut killed) = (0, 0);
        while rounds < MAX_KILL_ROUNDS && start.elapsed() < STORM {
            killed += kill().await;
            rounds += 1;
            // The fault's period, not a synchronisation.
            tokio::time::sleep(every).await;
        }
        (rounds, killed)
    });

    let mut sends = Vec::new();
    for duplicate in 0..DUPLICATES {
        for key in &keys {
            for service in &services {
                let send = service.clone().oneshot(alert(key));
                // The duplicates of a key arrive over the storm, not in one burst that a
                // single kill fails whole: some sends then run, and settle, between kills.
                let arrival = ARRIVALS_EVERY * u32::try_from(duplicate).unwrap_or(0);
                sends.push((
                    key.clone(),
                    tokio::spawn(async move {
                        tokio::time::sleep(arrival).await;
                        send.await
                    }),
                ));
            }
        }
    }
    let mut answers = Vec::new();
    for (key, send) in sends {
        answers.push((key, send.await.expect("no panic")));
    }
    let (rounds, killed) = killer.await.expect("no panic");

    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for (_, answer) in &answers {
        let kind = match answer {
            Ok(r) if r.replayed => "replayed".to_owned(),
            Ok(_) => "sent".to_owned(),
            Err(e) => match std::error::Error::source(e) {
                Some(source) => format!("{} ({source})", e.code()),
                None => e.code().to_owned(),
            },
        };
        *tally.entry(kind).or_default() += 1;
    }
    let report = format!(
        "killer: {rounds} rounds, {killed} connections; answers {tally:?}; stats {:?} / {:?}",
        layers[0].stats(),
        layers[1].stats()
    );
    eprintln!("{report}");
    assert!(killed > 0, "no connection was killed: {report}");
    check_ledger(&given, &answers, &report);
    for (_, answer) in &answers {
        if let Err(e) = answer {
            assert!(
                [codes::IN_FLIGHT, codes::STORE_FAILED].contains(&e.code()),
                "an answer no fault explains: {e:?}; {report}"
            );
        }
    }

    // Once the store holds every key settled (or, where the kills left it pending, past
    // its lease, by which the layer gave up its settlement retries), each key is kept with
    // the one receipt, or (no send reached it) free. Two more processes, on new
    // connections, ask: what the store holds is the question here, not how soon the
    // killed clients recover.
    let later = [connect().await, connect().await];
    let stored: Vec<String> = keys
        .iter()
        .map(|key| layers[0].stored_key_for(key).expect("a valid key"))
        .collect();
    let stored: Vec<&str> = stored.iter().map(String::as_str).collect();
    until_settled(&later[0], &stored).await;
    let later: Vec<_> = later
        .into_iter()
        .map(|store| production_stack(&layer(store, lease), provider.clone()))
        .collect();
    let mut last = Vec::new();
    let recovered_by = Instant::now() + RECOVERY;
    for key in &keys {
        for service in &later {
            let answer = send_until_the_store_answers(service, key, recovered_by).await;
            last.push((key.clone(), answer));
        }
    }
    check_ledger(&given, &last, &report);
    let given = given.lock().expect("ledger");
    for (key, answer) in &last {
        assert!(
            answer.is_ok(),
            "{key}: the last repeat, with no fault, failed: {answer:?}; {report}"
        );
        assert_eq!(given.get(key).map(Vec::len), Some(1), "{key}: {report}");
    }
}

/// Sends `key` again while the answer is `store_failed` (not sent, retryable: what a caller
/// does), until `deadline`: a connection killed by the last kill fails its next command
/// once, and a cluster client takes a moment to find its nodes again.
async fn send_until_the_store_answers<S>(
    service: &S,
    key: &str,
    deadline: Instant,
) -> Result<Receipt, SendError>
where
    S: tower::Service<Message, Response = Receipt, Error = SendError> + Clone,
{
    loop {
        let answer = service.clone().oneshot(alert(key)).await;
        match &answer {
            Err(e) if e.code() == codes::STORE_FAILED && Instant::now() < deadline => {
                // Backs off while the store reconnects; bounded by the deadline.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ => return answer,
        }
    }
}

/// At most one provider call per key, and every `Ok` answer carries the receipt the provider
/// gave for that key.
fn check_ledger(
    given: &Mutex<HashMap<String, Vec<String>>>,
    answers: &[(String, Result<Receipt, SendError>)],
    report: &str,
) {
    let given = given.lock().expect("ledger");
    for (key, ids) in given.iter() {
        assert!(
            ids.len() <= 1,
            "{key} reached the provider {ids:?}; {report}"
        );
    }
    for (key, answer) in answers {
        if let Ok(receipt) = answer {
            let ids = given.get(key).cloned().unwrap_or_default();
            assert!(
                ids.contains(&receipt.id),
                "{key}: a receipt {} the provider did not give (it gave {ids:?}); {report}",
                receipt.id
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn redis_duplicates_from_two_layers_under_connection_kills_reach_the_provider_once() {
    let Some(server) = RedisServer::start().await else {
        return;
    };
    let prefix = unique_prefix("storm");
    let connect = || server.store(prefix.clone(), STORE_TIMEOUT);
    let admin = redis_admin::admin(&server.url).await;
    let kill: Kill = Box::new(move || {
        let mut admin = admin.clone();
        async move {
            let n = kill_redis_connections(&mut admin)
                .await
                .expect("CLIENT KILL");
            usize::try_from(n).unwrap_or(0)
        }
        .boxed()
    });
    duplicates_under_connection_kills(connect, kill, Duration::from_millis(3), LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_redis_binaries),
    ignore = "no redis-server and redis-cli on PATH"
)]
async fn cluster_duplicates_from_two_layers_under_connection_kills_reach_the_provider_once() {
    let Some(cluster) = RedisCluster::shared() else {
        return;
    };
    let user = cluster.user().await;
    let prefix = unique_prefix("cluster-storm");
    let urls = user.urls.clone();
    let connect = || async {
        RedisStore::connect_cluster(urls.iter().map(String::as_str))
            .await
            .expect("connect")
            .key_prefix(prefix.clone())
            .timeout(SLOW_STORM_TIMEOUT)
    };
    let user = Arc::new(tokio::sync::Mutex::new(user));
    let kill: Kill = Box::new(move || {
        let user = Arc::clone(&user);
        async move {
            let n = user
                .lock()
                .await
                .kill_connections()
                .await
                .expect("CLIENT KILL");
            usize::try_from(n).unwrap_or(0)
        }
        .boxed()
    });
    duplicates_under_connection_kills(connect, kill, Duration::from_millis(5), SLOW_STORM_LEASE)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(backend_postgres_binaries),
    ignore = "no PostgreSQL server binaries"
)]
async fn postgres_duplicates_from_two_layers_under_connection_kills_reach_the_provider_once() {
    let Some(cluster) = PostgresCluster::shared() else {
        return;
    };
    let (store, url) = postgres_store(cluster).await;
    let table = store.table_name().to_owned();
    let connect = || async {
        PostgresStore::connect(&url)
            .await
            .expect("connect")
            .table(&table)
            .expect("valid table name")
            .timeout(SLOW_STORM_TIMEOUT)
    };
    let admin = Arc::new(postgres_admin::admin(&url).await);
    let kill: Kill = Box::new(move || {
        let admin = Arc::clone(&admin);
        async move {
            terminate_postgres_sessions(&admin)
                .await
                .expect("pg_terminate_backend")
        }
        .boxed()
    });
    duplicates_under_connection_kills(connect, kill, Duration::from_millis(5), SLOW_STORM_LEASE)
        .await;
}
