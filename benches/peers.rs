//! The hot path against a peer and against the wire, in one run (issue 15).
//!
//! - `peers/memory/*`: a keyed 2 KiB message through our layer on a `MemoryStore`, against
//!   the `idempotent` crate's `MemoryStore` behind an adapter giving it the same contract
//!   (claim, send, complete; a replay answers the stored receipt), with its own fingerprint
//!   as shipped (xxh3) and with SHA-256 over the same bytes. Fresh keys and replays, at 1
//!   task and at 64 tasks.
//! - `peers/redis/*` (when `REDIS_URL` is set): our layer on a `RedisStore`, the peer's
//!   `ValkeyStore` behind the same adapter, and "raw": the commands our store issues, through
//!   the same client (`EVALSHA` of the reserve script, then of the complete script), with none of
//!   our code.
//!
//! The peer is a dev-dependency of the `suite` member only: no user and not the quickstart
//! builds it. `cargo bench --bench peers -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use idempotent::entry::{CachedResponse, ExistingEntry, IdempotencyEntry, Metadata};
use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
use idempotent::key::IdempotencyKey;
use idempotent::store::{IdempotencyStore, InsertResult};
use sha2::{Digest, Sha256};
use tower::{Layer, Service, ServiceExt};
use tower_idempotency::outcome::Receipt;
use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message};

const BODY: usize = 2 * 1024;
const TTL: Duration = Duration::from_secs(60);
const NAMESPACE: &str = "default";

fn message(key: String) -> Message {
    Message::builder()
        .from("orders@marketplace.example")
        .to("seller@example.com")
        .subject("New order ord_20481")
        .text("x".repeat(BODY))
        .idempotency_key(key)
        .build()
        .expect("valid message")
}

fn provider()
-> impl Service<Message, Response = Receipt, Error = BoxError, Future: Send> + Clone + Send + 'static
{
    tower::service_fn(|_m: Message| {
        std::future::ready(Ok::<_, BoxError>(Receipt::new("msg_1", "bench")))
    })
}

/// How the peer fingerprints a message.
#[derive(Clone, Copy)]
enum Hashing {
    /// Its own default: xxh3 over the body.
    Shipped,
    /// SHA-256 over the same body, the digest then given to its strategy: what ours pays.
    Sha256,
}

/// The `idempotent` crate's store, given our contract: one send per key, a replay answers
/// the first receipt, a reused key with another message is refused.
struct Peer<S> {
    store: Arc<S>,
    hashing: Hashing,
}

impl<S> Clone for Peer<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            hashing: self.hashing,
        }
    }
}

impl<S: IdempotencyStore> Peer<S> {
    async fn send(&self, message: Message) -> Result<Receipt, BoxError> {
        let key = message.idempotency_key().ok_or("unkeyed")?;
        let key = IdempotencyKey::new(format!("{NAMESPACE}:{}", key.as_str()))?;
        let body = message.text().unwrap_or_default().as_bytes();
        let fingerprint = match self.hashing {
            Hashing::Shipped => DefaultFingerprintStrategy.compute("send", body),
            Hashing::Sha256 => DefaultFingerprintStrategy.compute("send", &Sha256::digest(body)),
        };
        let entry = IdempotencyEntry::new(fingerprint, TTL);
        match self.store.try_insert(&key, entry.clone()).await? {
            InsertResult::Claimed { fencing_token } => {
                let receipt = provider().oneshot(message).await?;
                let response = CachedResponse {
                    status_code: 200,
                    metadata: Metadata::default(),
                    body: receipt.id.clone().into(),
                };
                self.store
                    .complete(&key, entry.complete(response), fencing_token)
                    .await?;
                Ok(receipt)
            }
            InsertResult::Exists(ExistingEntry::Completed(done)) => {
                if !done.fingerprint_matches(fingerprint) {
                    return Err("key reused".into());
                }
                let id = String::from_utf8(done.response().body.to_vec())?;
                Ok(Receipt::new(id, "bench"))
            }
            InsertResult::Exists(ExistingEntry::Processing(_)) => Err("in flight".into()),
        }
    }
}

/// One way of sending a keyed message, cloned into each task.
trait Sender: Clone + Send + Sync + 'static {
    fn send(&self, message: Message) -> impl Future<Output = Receipt> + Send;
}

#[derive(Clone)]
struct Ours<S>(S);

impl<S> Sender for Ours<S>
where
    S: Service<Message, Response = Receipt, Error = tower_idempotency::SendError>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
{
    async fn send(&self, message: Message) -> Receipt {
        self.0.clone().oneshot(message).await.expect("sent")
    }
}

impl<S: IdempotencyStore> Sender for Peer<S> {
    async fn send(&self, message: Message) -> Receipt {
        Peer::send(self, message).await.expect("peer sent")
    }
}

/// A fresh key per message.
struct Keys(AtomicU64, String);

impl Keys {
    fn new(tag: &str) -> Self {
        Self(AtomicU64::new(0), format!("{tag}:{}", uuid::Uuid::new_v4()))
    }

    fn next(&self) -> Message {
        message(format!(
            "{}:{}",
            self.1,
            self.0.fetch_add(1, Ordering::Relaxed)
        ))
    }
}

/// Benchmarks `sender` on fresh keys and replays, at 1 task (inline) and 64 (spawned).
fn compare<T: Sender>(
    c: &mut Criterion,
    group: &str,
    name: &str,
    rt: &tokio::runtime::Runtime,
    sender: T,
) {
    let keys = Keys::new(name);
    let replayed = keys.next();
    rt.block_on(sender.send(replayed.clone()));
    for tasks in [1usize, 64] {
        let mut g = c.benchmark_group(format!("{group}/{tasks}-tasks"));
        g.throughput(Throughput::Elements(tasks as u64));
        g.bench_function(BenchmarkId::new("fresh", name), |b| {
            b.to_async(rt).iter_batched(
                || (0..tasks).map(|_| keys.next()).collect::<Vec<_>>(),
                |messages| run(&sender, messages),
                BatchSize::SmallInput,
            )
        });
        g.bench_function(BenchmarkId::new("replay", name), |b| {
            b.to_async(rt).iter_batched(
                || vec![replayed.clone(); tasks],
                |messages| run(&sender, messages),
                BatchSize::SmallInput,
            )
        });
        g.finish();
    }
}

async fn run<T: Sender>(sender: &T, messages: Vec<Message>) {
    if messages.len() == 1 {
        for m in messages {
            black_box(sender.send(m).await);
        }
        return;
    }
    let tasks: Vec<_> = messages
        .into_iter()
        .map(|m| {
            let sender = sender.clone();
            tokio::spawn(async move { black_box(sender.send(m).await) })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn memory(c: &mut Criterion) {
    let rt = runtime();
    let ours = IdempotencyLayer::new(MemoryStore::with_max_entries(usize::MAX)).layer(provider());
    compare(c, "peers/memory", "ours", &rt, Ours(ours));
    for (name, hashing) in [
        ("idempotent-xxh3", Hashing::Shipped),
        ("idempotent-sha256", Hashing::Sha256),
    ] {
        let store = rt.block_on(async {
            idempotent::store::memory::MemoryStore::new(1024, Duration::from_secs(60))
        });
        let peer = Peer {
            store: Arc::new(store),
            hashing,
        };
        compare(c, "peers/memory", name, &rt, peer);
    }
}

#[path = "stores/raw_redis.rs"]
mod raw_redis;
#[path = "peers/redis.rs"]
mod redis_peers;

criterion_group!(peers, memory, redis_peers::bench);
criterion_main!(peers);
