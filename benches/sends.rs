//! A loop of sends through the layer over a `MemoryStore`, for instruction counts: what a send
//! costs beyond the fingerprint, repeatable on a loaded machine where times are not.
//!
//! ```text
//! cargo bench --bench sends --no-run
//! valgrind --tool=callgrind target/release/deps/sends-<hash> fresh 6000
//! valgrind --tool=callgrind target/release/deps/sends-<hash> fresh 2000
//! ```
//!
//! Instructions per send are (the first count − the second) / 4,000, so what runs once
//! (the runtime, the store, the message) cancels out. The kinds: `bare` (the inner service
//! alone, a message clone per send), `fresh` (a new key each send), `fresh-full` (the same on a
//! store of 1,000 records, full after the first thousand: each later send makes room),
//! `fresh-full-10k` (the same on 10,000 records, a large store: count from 12,000 sends up),
//! `fresh-null` (the same through a store that keeps nothing: the layer's own share),
//! `fresh-map` (through a std `HashMap` under one lock: the floor of a store that remembers) and
//! `replay` (one key sent again); `fresh-64` and `replay-64` send the same from 64 tasks on two threads, for their
//! CPU time (`time`) or their counts. The keyed messages are made before the loop;
//! `messages` makes and drops them alone, to subtract from `fresh`. With `REDIS_URL` set, `redis` sends fresh keys through the layer
//! on a `RedisStore` and `redis-raw` issues the minimal commands a user would write instead (the
//! stores bench's baseline: `SET NX GET`, then a fenced write), so their difference is our
//! client's cost per send; the server's work runs in its own process and is not counted.
//! `redis-replay` and `redis-raw-replay` send one key again and again (raw stops at the
//! `SET NX GET`'s answer; ours decodes the kept record to answer with it). Without arguments (as under
//! `cargo bench`) it runs 1,000 of each and prints their times.
//!
//! `targets ROUNDS` times instead of counting: the layer's two microsecond targets (a fresh
//! send over the bare service and the fingerprint, a replay likewise), each round five
//! interleaved slices of `SENDS_PER_SLICE` sends (100 unless set), medians of the rounds:
//! `SENDS_PER_SLICE=100 target/release/deps/sends-<hash> targets 3000`. The fresh sends go to
//! an unbounded store, which grows all run long; `FRESH_MAX_ENTRIES=100000` bounds it (the
//! default store's size), so after it fills every fresh send also makes room. In the same
//! rounds the fresh sends also go to two floors (`common/floor_stores.rs`): a std `HashMap`
//! under one lock (the plainest store that remembers its keys) and a store that keeps
//! nothing (the layer's own share). `FRESH_GROWN=<n>` grows both remembering stores to `n`
//! keys and empties them before the rounds (with `n` above the rounds' sends, none of them
//! grows a table or touches memory the process never had): what a fresh send costs a store
//! that has its room, against the default's growing one.

use std::hint::black_box;
use std::time::{Duration, Instant};

use tower::{Layer, Service, ServiceExt};
use tower_idempotency::outcome::Receipt;
use tower_idempotency::store::{Reservation, Store};
use tower_idempotency::{IdempotencyLayer, MemoryStore, Message};

#[path = "common/floor_stores.rs"]
mod floor_stores;
#[path = "common/messages.rs"]
mod messages;
use floor_stores::{MapStore, NullStore};
use messages::{message, provider};

/// The keyed messages of a `fresh` run, one key each.
fn fresh_messages(sends: usize) -> Vec<Message> {
    keyed_messages(0..sends)
}

/// Messages under the keys `fresh:{n}` for each `n` of `keys`.
fn keyed_messages(keys: std::ops::Range<usize>) -> Vec<Message> {
    keys.map(|n| message(2048, Some(format!("fresh:{n}"))))
        .collect()
}

async fn run(kind: &str, sends: usize) {
    let store = MemoryStore::with_max_entries(usize::MAX);
    let mut layered = IdempotencyLayer::new(store).layer(provider());
    match kind {
        "bare" => {
            let mut bare = provider();
            let unkeyed = message(2048, None);
            for _ in 0..sends {
                let sent = bare.ready().await.expect("ready").call(unkeyed.clone());
                black_box(sent.await.expect("sent"));
            }
        }
        "messages" => {
            let messages: Vec<Message> = fresh_messages(sends);
            black_box(messages);
        }
        "fresh" | "fresh-null" | "fresh-map" => {
            if kind == "fresh-null" {
                layered = IdempotencyLayer::new(NullStore).layer(provider());
            }
            if kind == "fresh-map" {
                layered = IdempotencyLayer::new(MapStore::default()).layer(provider());
            }
            for m in fresh_messages(sends) {
                let sent = layered.ready().await.expect("ready").call(m);
                black_box(sent.await.expect("sent"));
            }
        }
        "fresh-full" | "fresh-full-10k" => {
            // A store of 1,000 (or 10,000) records, full after the first thousand (ten
            // thousand) sends: every later one makes room (the steady state of a bounded
            // store), where `fresh` never does. The small store keeps the exact order, the
            // larger one evicts in batches from the new key's shard.
            let max = if kind == "fresh-full" { 1_000 } else { 10_000 };
            let store = MemoryStore::with_max_entries(max);
            let mut full = IdempotencyLayer::new(store).layer(provider());
            for m in fresh_messages(sends) {
                let sent = full.ready().await.expect("ready").call(m);
                black_box(sent.await.expect("sent"));
            }
        }
        "replay" => {
            let replayed = message(2048, Some("replay-key".into()));
            for _ in 0..sends {
                let sent = layered.ready().await.expect("ready").call(replayed.clone());
                black_box(sent.await.expect("sent"));
            }
        }
        "fresh-64" | "replay-64" => workers64(kind == "replay-64", sends).await,
        "redis" | "redis-raw" => redis(kind == "redis-raw", false, sends).await,
        "redis-replay" | "redis-raw-replay" => {
            redis(kind == "redis-raw-replay", true, sends).await;
        }
        other => {
            panic!("unknown kind {other:?}: see the module docs")
        }
    }
}

/// Fresh keys, or one key sent again, from 64 tasks at once on the runtime `main` made (two
/// threads for these kinds): what 64 concurrent senders cost in CPU time, contention on the
/// shared counts included, as `peers/memory/64-workers` runs it. The messages are made
/// before the tasks start.
async fn workers64(replay: bool, sends: usize) {
    let store = MemoryStore::with_max_entries(usize::MAX);
    let layered = IdempotencyLayer::new(store).layer(provider());
    let messages = if replay {
        let replayed = message(2048, Some("replay-key".into()));
        layered
            .clone()
            .oneshot(replayed.clone())
            .await
            .expect("first send");
        vec![replayed; sends]
    } else {
        fresh_messages(sends)
    };
    let mut shares: Vec<Vec<Message>> = (0..64).map(|_| Vec::new()).collect();
    for (i, m) in messages.into_iter().enumerate() {
        shares[i % 64].push(m);
    }
    let tasks: Vec<_> = shares
        .into_iter()
        .map(|share| {
            let layered = layered.clone();
            tokio::spawn(async move {
                for m in share {
                    black_box(layered.clone().oneshot(m).await.expect("sent"));
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("worker");
    }
}

/// Fresh keys, or one key sent again, over Redis at `REDIS_URL`: through the layer, or as
/// the minimal commands.
async fn redis(raw: bool, replay: bool, sends: usize) {
    use tower_idempotency::RedisStore;

    let url = std::env::var("REDIS_URL").expect("REDIS_URL for the redis kinds");
    let client = redis::Client::open(url).expect("a valid REDIS_URL");
    let manager = redis::aio::ConnectionManager::new(client)
        .await
        .expect("connect to REDIS_URL");
    let prefix = format!("bench-sends:{}:", tower_idempotency::store::Token::new());
    let messages = if replay {
        // The first send of the key is the one fresh one, in both counts.
        vec![message(2048, Some("replayed".into())); sends]
    } else {
        fresh_messages(sends)
    };
    if raw {
        let commands = raw_redis::MinimalRedis::load(&mut manager.clone()).await;
        let ttl = Duration::from_secs(60);
        for m in messages {
            let key = m.idempotency_key().expect("keyed");
            let key = format!("{prefix}default:{}", key.as_str());
            let mut connection = manager.clone();
            commands.send(&mut connection, &key, ttl, ttl).await;
            black_box(Receipt::new("msg_1", "bench"));
        }
    } else {
        let store = RedisStore::new(manager).key_prefix(prefix);
        // Leased and kept as long as raw's records: the same commands, and a run leaves
        // nothing in the server for a day.
        let mut layered = IdempotencyLayer::builder()
            .store(store)
            .lease(Duration::from_secs(60))
            .ttl(Duration::from_secs(60))
            .build()
            .expect("valid layer")
            .layer(provider());
        for m in messages {
            let sent = layered.ready().await.expect("ready").call(m);
            black_box(sent.await.expect("sent"));
        }
    }
}

/// The layer's two targets in microseconds (`layer` measures them as separate criterion
/// benches, minutes apart on a machine whose speed drifts): a fresh send over the bare
/// service fed the same messages and over the fingerprint, and a replay over the bare
/// service and the fingerprint, each worked out within one round of interleaved slices
/// (their order rotating round to round), then the median and range of the rounds. As in
/// `layer`, the fresh sends' stores grow for the whole run and each message is made before
/// its slice is timed. The fresh side runs on three stores in the same rounds: the
/// `MemoryStore`, and the two floors of `floor_stores` (a std `HashMap` under one lock,
/// and a store that keeps nothing: the layer's own share).
async fn targets(rounds: usize) {
    let per: usize = std::env::var("SENDS_PER_SLICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    // The memory store: unbounded unless `FRESH_MAX_ENTRIES` bounds it, when it fills
    // within the first rounds and then makes room on every send (a bounded store's steady
    // state).
    let fresh_max = std::env::var("FRESH_MAX_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX);
    let memory = MemoryStore::with_max_entries(fresh_max);
    let map = MapStore::default();
    // `FRESH_GROWN=<n>`: both remembering stores take `n` keys and give them back before the
    // rounds, so their tables hold room for `n` and their allocator's heap the memory of as
    // many keys: the rounds' sends then neither grow a table nor fault in a new page.
    if let Some(grown) = std::env::var("FRESH_GROWN")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        grow_and_empty(&memory, grown).await;
        grow_and_empty(&map, grown).await;
        println!("sends/targets: both remembering stores grown to {grown} keys and emptied");
    }
    let mut fresh = [
        IdempotencyLayer::new(memory).layer(provider()),
        IdempotencyLayer::new(map).layer(provider()),
        IdempotencyLayer::new(NullStore).layer(provider()),
    ];
    const FRESH: [&str; 3] = ["fresh", "fresh (map floor)", "fresh (null store)"];
    let mut replay_layer = IdempotencyLayer::new(MemoryStore::new()).layer(provider());
    let mut bare = provider();
    let unkeyed = message(2048, None);
    let replayed = message(2048, Some("replay-key".into()));
    replay_layer
        .ready()
        .await
        .expect("ready")
        .call(replayed.clone())
        .await
        .expect("first send");
    let mut next = 0usize;
    let mut keyed = || {
        next += per;
        keyed_messages(next - per..next)
    };
    let per_send = |start: Instant| start.elapsed().as_secs_f64() * 1e6 / per as f64;
    // Slices: bare fed keyed messages, bare, replay, fingerprint, then each fresh store.
    const SLICES: usize = 4 + FRESH.len();
    let mut parts: [Vec<f64>; SLICES] = Default::default();
    for round in 0..rounds {
        let mut t = [0.0f64; SLICES];
        for slice in 0..SLICES {
            let which = (slice + round) % SLICES;
            t[which] = match which {
                0 => {
                    let batch = keyed();
                    let start = Instant::now();
                    for m in batch {
                        let sent = bare.ready().await.expect("ready").call(m);
                        black_box(sent.await.expect("sent"));
                    }
                    per_send(start)
                }
                1 => {
                    let start = Instant::now();
                    for _ in 0..per {
                        let sent = bare.ready().await.expect("ready").call(unkeyed.clone());
                        black_box(sent.await.expect("sent"));
                    }
                    per_send(start)
                }
                2 => {
                    let start = Instant::now();
                    for _ in 0..per {
                        let sent = replay_layer
                            .ready()
                            .await
                            .expect("ready")
                            .call(replayed.clone());
                        black_box(sent.await.expect("sent"));
                    }
                    per_send(start)
                }
                3 => {
                    let start = Instant::now();
                    for _ in 0..per {
                        black_box(tower_idempotency::Fingerprint::of(black_box(&unkeyed)));
                    }
                    per_send(start)
                }
                store => {
                    let batch = keyed();
                    let layer = &mut fresh[store - 4];
                    let start = Instant::now();
                    for m in batch {
                        let sent = layer.ready().await.expect("ready").call(m);
                        black_box(sent.await.expect("sent"));
                    }
                    per_send(start)
                }
            };
        }
        for (part, value) in parts.iter_mut().zip(t) {
            part.push(value);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    // Each round's difference, then their median: the slices of one round ran moments apart.
    let over = |parts: &[Vec<f64>; SLICES], side: usize, base: usize| -> Vec<f64> {
        (0..rounds)
            .map(|r| parts[side][r] - parts[base][r] - parts[3][r])
            .collect()
    };
    let mut lines: Vec<(String, Vec<f64>)> = FRESH
        .iter()
        .enumerate()
        .map(|(i, name)| {
            (
                format!("{name} - bare_batched - fingerprint"),
                over(&parts, 4 + i, 0),
            )
        })
        .collect();
    lines.push(("replay - bare - fingerprint".into(), over(&parts, 2, 1)));
    for (name, mut v) in lines {
        let (m, lo, hi) = median(&mut v);
        println!(
            "sends/targets/{name}: median {m:.3} µs, range {lo:.3} to {hi:.3} ({rounds} rounds of {per})"
        );
    }
    let names = ["bare_batched", "bare", "replay", "fingerprint"]
        .into_iter()
        .chain(FRESH);
    for (name, v) in names.zip(parts.iter_mut()) {
        println!("sends/targets/{name}: median {:.3} µs", median(v).0);
    }
}

/// Reserves `n` keys in `store` (none of the rounds' keys), then releases every one: the
/// store is empty again, with the room it grew.
async fn grow_and_empty(store: &impl Store, n: usize) {
    let fingerprint = tower_idempotency::Fingerprint::from_bytes([1; 32]);
    let lease = Duration::from_secs(600);
    let keys: Vec<String> = (0..n).map(|i| format!("default:grown:{i}")).collect();
    let mut tokens = Vec::with_capacity(n);
    for key in &keys {
        match store.reserve(key, fingerprint, lease).await {
            Ok(Reservation::Reserved { token }) => tokens.push(token),
            other => panic!("a fresh key is reserved: {other:?}"),
        }
    }
    for (key, token) in keys.iter().zip(tokens) {
        assert!(store.release(key, token).await.expect("released"));
    }
}

#[path = "stores/raw_redis.rs"]
mod raw_redis;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let runtime = if args.first().is_some_and(|kind| kind.ends_with("-64")) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
    .expect("runtime");
    match args.as_slice() {
        [kind, rounds] if kind == "targets" => {
            runtime.block_on(targets(rounds.parse().expect("a number of rounds")));
        }
        [kind, sends] => {
            let sends = sends.parse().expect("a number of sends");
            runtime.block_on(run(kind, sends));
        }
        _ => {
            for kind in ["bare", "fresh", "replay"] {
                let start = Instant::now();
                runtime.block_on(run(kind, 1_000));
                println!("sends/{kind}: 1,000 in {:?}", start.elapsed());
            }
        }
    }
}
