//! The hot path against a peer and against the wire, in one run.
//!
//! - `peers/memory/*`: a keyed 2 KiB message through our layer on a `MemoryStore`, against
//!   the `idempotent` crate's `MemoryStore` behind an adapter giving it the same contract
//!   (claim, send, complete; a replay answers the stored receipt), with its own fingerprint
//!   as shipped (xxh3 over the body), with SHA-256 over the body, and with SHA-256 over the
//!   same bytes ours hashes (the whole message: equal hashing). Fresh keys and replays, from 1
//!   worker and from 64 concurrent workers (long-lived tasks, each sending its share one
//!   send after another): criterion reports the time per send and sends per second.
//! - `peers/redis/*` (when `REDIS_URL` is set): our layer on a `RedisStore`, the peer's
//!   `ValkeyStore` behind the same adapter, and "minimal": what a user would write instead,
//!   through the same client (`SET NX GET`, then a fenced write of the done record), alone and
//!   after SHA-256 over the body, with none of our code.
//!
//! The peer is a dev-dependency only: no user and not the quickstart builds it. `cargo bench
//! --bench peers -- --warm-up-time 1 --measurement-time 3`.
//!
//! On a shared, noisy machine, `PEERS_INTERLEAVED=15 cargo bench --bench peers` instead
//! times ours against the peer with SHA-256, over the same bytes and over the body (memory,
//! in alternating slices of 50,000 sends), and against the minimal commands and the peer (Redis, in alternating slices of
//! about 0.2 s), and prints the median ratio per case, by wall time and by the process's
//! CPU time (which time stolen by other work on a shared machine does not inflate; for Redis
//! it leaves out the server's work, so the wall ratio is the one that counts there): see
//! [`interleaved`].

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use idempotent::entry::{CachedResponse, ExistingEntry, IdempotencyEntry, Metadata};
use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
use idempotent::key::IdempotencyKey;
use idempotent::store::{IdempotencyStore, InsertResult};
use sha2::{Digest, Sha256};
use tower::{Layer, Service, ServiceExt};
use tower_idempotency::outcome::Receipt;
use tower_idempotency::{BoxError, Fingerprint, IdempotencyLayer, MemoryStore, Message};

use interleave::{Compared, alternate};

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
    /// SHA-256 over the same body, the digest then given to its strategy.
    Sha256,
    /// SHA-256 over the same bytes ours hashes (the whole message in our fingerprint's
    /// encoding, `Fingerprint::of`: body, addresses, subject, framing, about 0.18 µs more
    /// than the body alone at 2 KiB), the digest then given to its strategy: equal hashing.
    SameBytes,
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
            Hashing::SameBytes => {
                DefaultFingerprintStrategy.compute("send", Fingerprint::of(&message).as_bytes())
            }
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

/// One way of sending a keyed message. Each worker holds a clone of its own and sends
/// through it one message after another (ours as a tower service is driven: `ready`, then
/// `call`, on the worker's own handle), so no side clones a handle per send.
trait Sender: Clone + Send + Sync + 'static {
    fn send(&mut self, message: Message) -> impl Future<Output = Receipt> + Send;
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
    async fn send(&mut self, message: Message) -> Receipt {
        let ready = self.0.ready().await.expect("ready");
        ready.call(message).await.expect("sent")
    }
}

impl<S: IdempotencyStore> Sender for Peer<S> {
    async fn send(&mut self, message: Message) -> Receipt {
        Peer::send(self, message).await.expect("peer sent")
    }
}

/// A fresh key per message.
#[derive(Clone)]
struct Keys(Arc<(AtomicU64, String)>);

impl Keys {
    fn new(tag: &str) -> Self {
        Self(Arc::new((
            AtomicU64::new(0),
            format!("{tag}:{}", uuid::Uuid::new_v4()),
        )))
    }

    fn next(&self) -> Message {
        let (next, tag) = &*self.0;
        message(format!("{tag}:{}", next.fetch_add(1, Ordering::Relaxed)))
    }
}

/// What a slice sends: a new key each time, or one message again.
#[derive(Clone)]
enum Messages {
    Fresh(Keys),
    Replay(Message),
}

impl Messages {
    fn next(&self) -> Message {
        match self {
            Self::Fresh(keys) => keys.next(),
            Self::Replay(message) => message.clone(),
        }
    }
}

/// Benchmarks the senders `new` makes on fresh keys and replays, with 1 worker and with 64.
///
/// A worker is a task that sends its share of the messages one after another; the workers
/// of a sample run side by side on a 2-thread runtime, live for the whole sample, and the
/// clock runs from the moment they all start to the last answer. One iteration is one send,
/// so criterion reports the time per send and, as throughput, sends per second. The
/// messages (a fresh key each, or the replayed one) are made before the clock starts, and
/// each sample gets a sender from `new` (an empty store, for the in-memory ones: a store
/// grown by every earlier sample would make later samples pay for its size).
fn compare<T: Sender>(
    c: &mut Criterion,
    group: &str,
    name: &str,
    rt: &tokio::runtime::Runtime,
    new: impl Fn() -> T,
) {
    let keys = Keys::new(name);
    let new = &new;
    let keys = &keys;
    for workers in WORKERS {
        let mut g = c.benchmark_group(format!("{group}/{workers}-workers"));
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::new("fresh", name), |b| {
            b.to_async(rt).iter_custom(|sends| async move {
                let sender = new();
                let messages = Messages::Fresh(keys.clone());
                run(&sender, workers, sends as usize, messages).await
            })
        });
        g.bench_function(BenchmarkId::new("replay", name), |b| {
            b.to_async(rt).iter_custom(|sends| async move {
                let mut sender = new();
                let replayed = keys.next();
                sender.send(replayed.clone()).await;
                run(&sender, workers, sends as usize, Messages::Replay(replayed)).await
            })
        });
        g.finish();
    }
}

/// The numbers of concurrent workers each case runs with.
const WORKERS: [usize; 2] = [1, 64];

/// Sends `sends` messages from `workers` tasks, each sending its share one after another,
/// and answers the time from their common start to the last answer.
async fn run<T: Sender>(sender: &T, workers: usize, sends: usize, messages: Messages) -> Duration {
    run_timed(sender, workers, sends, messages).await.0
}

/// [`run`], answering the process's CPU time over the same span too.
///
/// Each worker makes its share of the messages itself, before the clock starts, on the
/// runtime's thread that runs it, as a service makes the message it sends. Messages made on
/// the main thread and dropped by senders on the runtime's two made those threads queue on
/// the allocator's lock for the main thread's memory (glibc's `__lll_lock_wait_private` in
/// `perf`), which held our 64-worker fresh sends back.
async fn run_timed<T: Sender>(
    sender: &T,
    workers: usize,
    sends: usize,
    messages: Messages,
) -> (Duration, Duration) {
    // Every worker is spawned, has made its messages and is waiting before the clock starts.
    let start = Arc::new(tokio::sync::Barrier::new(workers + 1));
    let tasks: Vec<_> = (0..workers)
        .map(|worker| {
            let mut sender = sender.clone();
            let start = Arc::clone(&start);
            let messages = messages.clone();
            // Message `i` is worker `i % workers`'s.
            let share = (sends + workers - 1 - worker) / workers;
            tokio::spawn(async move {
                let share: Vec<Message> = (0..share).map(|_| messages.next()).collect();
                start.wait().await;
                for m in share {
                    black_box(sender.send(m).await);
                }
            })
        })
        .collect();
    start.wait().await;
    let (began, cpu) = (Instant::now(), process_cpu_time());
    for t in tasks {
        t.await.expect("worker");
    }
    (began.elapsed(), process_cpu_time().saturating_sub(cpu))
}

/// The CPU time every thread of this process has used so far.
fn process_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec; the clock id is a constant Linux knows.
    let read = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    assert_eq!(read, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// The most sends in one slice of [`interleaved`], and the in-memory cases' every slice:
/// 0.05–0.3 s of sends there on our machines.
const MAX_SLICE: usize = 50_000;

/// Times `ours` and `other` in alternating slices (which goes first alternates too),
/// `rounds` times per case, and prints each one's median time per send and the median over
/// the rounds of other's time ÷ ours (above 1: we are faster). The two sides of a ratio are
/// measured a fraction of a second apart, so load that comes and goes on a shared machine
/// hits both alike, where criterion's benchmarks of the two run seconds or minutes apart.
///
/// A slice is `per_slice` sends when given, else about 0.2 s of ours as a 256-send probe
/// times it. The in-memory cases give it: a slice's sends are its stores' records (each
/// slice starts on a new sender), so a size picked from a probe made the store, and so the
/// time per send, differ from run to run on both sides.
fn interleaved<A: Sender, B: Sender>(
    rt: &tokio::runtime::Runtime,
    group: &str,
    rounds: usize,
    per_slice: Option<usize>,
    ours: (&str, impl Fn() -> A),
    other: (&str, impl Fn() -> B),
) {
    let (ours_keys, other_keys) = (Keys::new(ours.0), Keys::new(other.0));
    for workers in WORKERS {
        for replay in [false, true] {
            let case = if replay { "replay" } else { "fresh" };
            let label = format!("{group}/{workers}-workers/{case}");
            if !selected(&label) {
                continue;
            }
            // Sends per slice: as given, or about 0.2 s of ours; at most 50,000 (100 MB of
            // messages made up front: more makes the allocator's work part of what is
            // measured).
            let sends = match per_slice {
                Some(sends) => sends,
                None => {
                    let probe = rt
                        .block_on(slice(&ours.1, &ours_keys, replay, workers, 256))
                        .0;
                    (0.2e6 / probe) as usize
                }
            }
            .clamp(256, MAX_SLICE);
            let pairs = alternate(
                rounds,
                || rt.block_on(slice(&ours.1, &ours_keys, replay, workers, sends)),
                || rt.block_on(slice(&other.1, &other_keys, replay, workers, sends)),
            );
            let wall = Compared::of(&pairs, |(wall, _)| wall);
            let (ratios, cpu_ratios) =
                (wall.b_over_a, Compared::of(&pairs, |(_, cpu)| cpu).b_over_a);
            println!(
                "{label}: {} {:.3} µs, {} {:.3} µs a send (medians \
                 of {rounds} slices of {sends} sends); {} ÷ {}: median {:.2}, range {:.2} to \
                 {:.2}; by this process's CPU time: median {:.2}, range {:.2} to {:.2}",
                ours.0,
                wall.a.median,
                other.0,
                wall.b.median,
                other.0,
                ours.0,
                ratios.median,
                ratios.low,
                ratios.high,
                cpu_ratios.median,
                cpu_ratios.low,
                cpu_ratios.high,
            );
        }
    }
}

/// Whether the interleaved case `label` runs: every case when `PEERS_ONLY` is unset, else
/// only those whose label contains its value (`PEERS_ONLY=redis/64`), so that a run spends
/// its minutes on the cases it is about.
fn selected(label: &str) -> bool {
    std::env::var("PEERS_ONLY").map_or(true, |only| label.contains(only.as_str()))
}

/// One slice of [`interleaved`]: `sends` sends by `workers` workers from a new sender, in
/// µs per send: wall time, and the process's CPU time.
async fn slice<T: Sender>(
    new: &impl Fn() -> T,
    keys: &Keys,
    replay: bool,
    workers: usize,
    sends: usize,
) -> (f64, f64) {
    let mut sender = new();
    let messages = if replay {
        let replayed = keys.next();
        sender.send(replayed.clone()).await;
        Messages::Replay(replayed)
    } else {
        Messages::Fresh(keys.clone())
    };
    let (wall, cpu) = run_timed(&sender, workers, sends, messages).await;
    let per_send = |d: Duration| d.as_secs_f64() * 1e6 / sends as f64;
    (per_send(wall), per_send(cpu))
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
    if let Some(rounds) = interleave::rounds("PEERS_INTERLEAVED") {
        let ours = || {
            Ours(IdempotencyLayer::new(MemoryStore::with_max_entries(usize::MAX)).layer(provider()))
        };
        let peer = |hashing| {
            move || Peer {
                store: Arc::new(idempotent::store::memory::MemoryStore::new(
                    1024,
                    Duration::from_secs(60),
                )),
                hashing,
            }
        };
        let _enter = rt.enter();
        for (name, hashing) in [
            ("idempotent-same-bytes", Hashing::SameBytes),
            ("idempotent-sha256", Hashing::Sha256),
        ] {
            interleaved(
                &rt,
                "peers/memory",
                rounds,
                Some(MAX_SLICE),
                ("ours", ours),
                (name, peer(hashing)),
            );
        }
        return;
    }
    compare(c, "peers/memory", "ours", &rt, || {
        Ours(IdempotencyLayer::new(MemoryStore::with_max_entries(usize::MAX)).layer(provider()))
    });
    for (name, hashing) in [
        ("idempotent-xxh3", Hashing::Shipped),
        ("idempotent-sha256", Hashing::Sha256),
        ("idempotent-same-bytes", Hashing::SameBytes),
    ] {
        // Made inside the runtime: the store spawns its actor task.
        compare(c, "peers/memory", name, &rt, || Peer {
            store: Arc::new(idempotent::store::memory::MemoryStore::new(
                1024,
                Duration::from_secs(60),
            )),
            hashing,
        });
    }
}

#[path = "common/interleave.rs"]
mod interleave;
#[path = "stores/raw_redis.rs"]
mod raw_redis;
#[path = "peers/redis.rs"]
mod redis_peers;

criterion_group!(peers, memory, redis_peers::bench);
criterion_main!(peers);
