//! The layer's own cost over a bare service, fingerprint throughput against raw SHA-256, and
//! the memory store's scaling across threads. `cargo bench --bench layer`;
//! `MEMORY_INTERLEAVED=21 cargo bench --bench layer -- memory_store` times the scaling with
//! one thread and two in alternating slices instead (see [`scaling_interleaved`]).

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use sha2::{Digest, Sha256};
use tower::Service;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::{Outcome, Receipt};
use tower_idempotency::store::{Reservation, Store};
use tower_idempotency::{BoxError, IdempotencyLayer, MemoryStore, Message};

#[path = "common/floor_stores.rs"]
#[allow(dead_code, reason = "`MapStore` is the `sends` bench's floor")]
mod floor_stores;
#[path = "common/interleave.rs"]
mod interleave;
#[path = "common/messages.rs"]
mod messages;
use floor_stores::NullStore;
use interleave::{Compared, alternate};
use messages::{message, provider};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn layer_cost(c: &mut Criterion) {
    let rt = runtime();
    for (label, len) in [("2KiB", 2 * 1024), ("200KiB", 200 * 1024)] {
        let mut group = c.benchmark_group(format!("layer/{label}"));
        let unkeyed = message(len, None);
        let replay = message(len, Some("replay-key".into()));

        group.bench_function("bare", |b| {
            let mut svc = provider();
            b.to_async(&rt).iter(|| {
                let m = unkeyed.clone();
                let fut = svc.call(m);
                async move { black_box(fut.await.expect("sent")) }
            })
        });

        group.bench_function("unkeyed", |b| {
            let mut svc = IdempotencyLayer::in_memory().layer_service(provider());
            b.to_async(&rt).iter(|| {
                let fut = svc.call(unkeyed.clone());
                async move { black_box(fut.await.expect("sent")) }
            })
        });

        // The bare service fed as `fresh_key` is: each message built outside the timing and
        // dropped inside it, so the pair differs by the layer alone.
        group.bench_function("bare_batched", |b| {
            fresh_sends(b, &rt, provider(), len);
        });

        group.bench_function("fresh_key", |b| {
            // Room for every key the run makes, so this measures the send, not eviction.
            let store = MemoryStore::with_max_entries(usize::MAX);
            fresh_sends(
                b,
                &rt,
                IdempotencyLayer::new(store).layer_service(provider()),
                len,
            );
        });

        // The same sends through a store that keeps nothing: the layer's own share of
        // `fresh_key` (SPEC: "the layer's own cost over a bare service"), the rest being
        // what the `MemoryStore` costs to remember a new key.
        group.bench_function("fresh_key_null_store", |b| {
            fresh_sends(
                b,
                &rt,
                IdempotencyLayer::new(NullStore).layer_service(provider()),
                len,
            );
        });

        group.bench_function("replayed", |b| {
            let mut svc = IdempotencyLayer::in_memory().layer_service(provider());
            rt.block_on(svc.call(replay.clone())).expect("first send");
            b.to_async(&rt).iter(|| {
                let fut = svc.call(replay.clone());
                async move { black_box(fut.await.expect("replayed")) }
            })
        });
        group.finish();
    }

    // Renewal's cost: an inner service that is not ready at its first poll (it yields once),
    // so the layer arms its renewal, against the same send with renewal off; and the bare
    // yielding service as the baseline.
    let mut group = c.benchmark_group("layer/2KiB-pending-send");
    let yielding = || {
        tower::service_fn(|_m: Message| async {
            tokio::task::yield_now().await;
            Ok::<_, BoxError>(Receipt::new("msg_1", "bench"))
        })
    };
    let unkeyed = message(2048, None);
    group.bench_function("bare", |b| {
        let mut svc = yielding();
        b.to_async(&rt).iter(|| {
            let fut = svc.call(unkeyed.clone());
            async move { black_box(fut.await.expect("sent")) }
        })
    });
    for (label, renew) in [("fresh_key_renew_on", true), ("fresh_key_renew_off", false)] {
        let layer = IdempotencyLayer::builder()
            .store(MemoryStore::with_max_entries(usize::MAX))
            .renew(renew)
            .build()
            .expect("layer");
        let mut svc = layer.layer_service(yielding());
        let next = AtomicU64::new(0);
        group.bench_function(label, |b| {
            b.to_async(&rt).iter_batched(
                || {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    message(2048, Some(format!("{label}:{n}")))
                },
                |m| {
                    let fut = svc.call(m);
                    async move { black_box(fut.await.expect("sent")) }
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();

    // Fresh keys on a full store: every send first evicts the oldest done record.
    let mut group = c.benchmark_group("layer/2KiB-at-capacity");
    let store = MemoryStore::with_max_entries(10_000);
    let mut svc = IdempotencyLayer::new(store).layer_service(provider());
    let next = AtomicU64::new(0);
    group.bench_function("fresh_key", |b| {
        b.to_async(&rt).iter_batched(
            || {
                message(
                    2048,
                    Some(format!("cap:{}", next.fetch_add(1, Ordering::Relaxed))),
                )
            },
            |m| {
                let fut = svc.call(m);
                async move { black_box(fut.await.expect("sent")) }
            },
            BatchSize::NumIterations(FRESH_BATCH),
        )
    });
    group.finish();
}

/// Sends through `svc` messages of `len` bytes under a new key each, each built outside
/// the timing and dropped inside it (by the service).
/// Messages made per batch in the fresh-key benches: ~250 KiB of 2 KiB messages, made just
/// before they are sent, as a service makes each message just before it sends it.
const FRESH_BATCH: u64 = 100;

fn fresh_sends<S>(
    b: &mut criterion::Bencher<'_>,
    rt: &tokio::runtime::Runtime,
    mut svc: S,
    len: usize,
) where
    S: Service<Message, Response = Receipt, Error: std::fmt::Debug>,
{
    let next = AtomicU64::new(0);
    b.to_async(rt).iter_batched(
        || {
            let n = next.fetch_add(1, Ordering::Relaxed);
            message(len, Some(format!("fresh:{n}")))
        },
        |m| {
            let fut = svc.call(m);
            async move { black_box(fut.await.expect("sent")) }
        },
        // A fixed batch, so both sides drop messages made as recently: criterion sizes a
        // `SmallInput` batch by the iterations of a sample, which gave the fast bare service
        // batches ten times larger than the layer's, messages cold by the time they were
        // dropped, and a baseline up to 0.4 µs slower than it is.
        BatchSize::NumIterations(FRESH_BATCH),
    )
}

fn fingerprint_throughput(c: &mut Criterion) {
    for (label, len) in [("2KiB", 2 * 1024), ("200KiB", 200 * 1024)] {
        let m = message(len, None);
        let bytes = m.text().expect("text").as_bytes().to_vec();
        let mut group = c.benchmark_group(format!("fingerprint/{label}"));
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_function("raw_sha256", |b| {
            b.iter(|| black_box(Sha256::digest(black_box(&bytes))))
        });
        group.bench_function("fingerprint", |b| {
            b.iter(|| black_box(Fingerprint::of(black_box(&m))))
        });
        group.finish();
    }
}

/// reserve + complete pairs on distinct keys, split over `threads` OS threads.
fn store_pairs(store: &MemoryStore, threads: usize, iters: u64, run: u64) -> Duration {
    let per_thread = iters.div_ceil(threads as u64);
    let outcome = Arc::new(Outcome::sent(Receipt::new("m", "bench")));
    let keys: Vec<Vec<String>> = (0..threads)
        .map(|t| {
            (0..per_thread)
                .map(|i| format!("k:{run}:{t}:{i}"))
                .collect()
        })
        .collect();
    let barrier = Arc::new(std::sync::Barrier::new(threads + 1));
    let handles: Vec<_> = keys
        .into_iter()
        .map(|keys| {
            let store = store.clone();
            let outcome = Arc::clone(&outcome);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let fp = Fingerprint::from_bytes([1; 32]);
                barrier.wait();
                let start = Instant::now();
                for key in &keys {
                    let r = futures_util::FutureExt::now_or_never(store.reserve(
                        key,
                        fp,
                        Duration::from_secs(600),
                    ));
                    if let Some(Ok(Reservation::Reserved { token })) = r {
                        let _ = futures_util::FutureExt::now_or_never(store.complete(
                            key,
                            token,
                            fp,
                            &outcome,
                            Duration::from_secs(3600),
                        ));
                    }
                }
                start.elapsed()
            })
        })
        .collect();
    barrier.wait();
    handles
        .into_iter()
        .map(|h| h.join().expect("bench thread"))
        .max()
        .unwrap_or_default()
}

/// reserve + release pairs over a fixed pool of keys per thread (distinct across threads), so
/// the store neither grows nor evicts: what is measured is the locking.
fn store_cycles(store: &MemoryStore, threads: usize, iters: u64) -> Duration {
    const POOL: usize = 4096;
    let per_thread = iters.div_ceil(threads as u64);
    let barrier = Arc::new(std::sync::Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let store = store.clone();
            let barrier = Arc::clone(&barrier);
            let keys: Vec<String> = (0..POOL).map(|i| format!("cycle:{t}:{i}")).collect();
            std::thread::spawn(move || {
                let fp = Fingerprint::from_bytes([1; 32]);
                barrier.wait();
                let start = Instant::now();
                for key in keys.iter().cycle().take(per_thread as usize) {
                    let r = futures_util::FutureExt::now_or_never(store.reserve(
                        key,
                        fp,
                        Duration::from_secs(600),
                    ));
                    if let Some(Ok(Reservation::Reserved { token })) = r {
                        let _ = futures_util::FutureExt::now_or_never(store.release(key, token));
                    }
                }
                start.elapsed()
            })
        })
        .collect();
    barrier.wait();
    handles
        .into_iter()
        .map(|h| h.join().expect("bench thread"))
        .max()
        .unwrap_or_default()
}

/// The full store of the `memory_store/reserve_complete_at_capacity` cases: every new key
/// first makes room, the steady state of a long-running service (a store that grew without
/// bound would measure the kernel's page faults instead).
const CAPACITY: usize = 65_536;

fn full_store() -> MemoryStore {
    let store = MemoryStore::with_max_entries(CAPACITY);
    store_pairs(&store, 1, CAPACITY as u64, u64::MAX);
    store
}

/// Times each workload with one thread and with two in alternating slices of the same number
/// of operations ([`alternate`], the two-thread slice first in even rounds), `rounds` times, and prints the median of one thread's time ÷
/// two threads' (the throughput two threads reach over one) and its range.
fn scaling_interleaved(rounds: usize) {
    const OPS: u64 = 200_000;
    let cycles = MemoryStore::new();
    let full = full_store();
    let run = AtomicU64::new(0);
    let workloads: [(&str, &dyn Fn(usize) -> Duration); 2] = [
        ("memory_store/reserve_release", &|threads| {
            store_cycles(&cycles, threads, OPS)
        }),
        ("memory_store/reserve_complete_at_capacity", &|threads| {
            store_pairs(&full, threads, OPS, run.fetch_add(1, Ordering::Relaxed))
        }),
    ];
    let per_op = |d: Duration| d.as_secs_f64() * 1e9 / OPS as f64;
    for (name, time) in workloads {
        // Two threads as `a`: one thread's time ÷ theirs is the throughput they reach over it.
        let c = Compared::of(&alternate(rounds, || time(2), || time(1)), per_op);
        let ratio = c.b_over_a;
        println!(
            "{name}: 1 thread {:.0} ns, 2 threads {:.0} ns an operation (medians of {rounds} \
             slices of {OPS}); 2 threads ÷ 1 in throughput: median {:.2}, range {:.2} to {:.2}",
            c.b.median, c.a.median, ratio.median, ratio.low, ratio.high,
        );
    }
}

fn memory_store_scaling(c: &mut Criterion) {
    if let Some(rounds) = interleave::rounds("MEMORY_INTERLEAVED") {
        return scaling_interleaved(rounds);
    }
    let mut group = c.benchmark_group("memory_store/reserve_release");
    let store = MemoryStore::new();
    for threads in [1usize, 2] {
        group.throughput(Throughput::Elements(1));
        group.bench_function(format!("threads={threads}"), |b| {
            b.iter_custom(|iters| store_cycles(&store, threads, iters))
        });
    }
    group.finish();

    let store = full_store();
    let mut group = c.benchmark_group("memory_store/reserve_complete_at_capacity");
    let run = AtomicU64::new(0);
    for threads in [1usize, 2] {
        group.throughput(Throughput::Elements(1));
        group.bench_function(format!("threads={threads}"), |b| {
            b.iter_custom(|iters| {
                store_pairs(&store, threads, iters, run.fetch_add(1, Ordering::Relaxed))
            })
        });
    }
    group.finish();
}

trait LayerService {
    fn layer_service<S>(&self, inner: S) -> tower_idempotency::Idempotency<S>;
}

impl LayerService for IdempotencyLayer {
    fn layer_service<S>(&self, inner: S) -> tower_idempotency::Idempotency<S> {
        tower::Layer::layer(self, inner)
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = layer_cost, fingerprint_throughput, memory_store_scaling
}
criterion_main!(benches);
