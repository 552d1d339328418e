//! `peers/redis/*`: our layer on a `RedisStore`, the `idempotent` crate's `ValkeyStore`, and
//! the minimal commands a user would write instead (`stores/raw_redis.rs`), through the same
//! client: alone, and after SHA-256 over the message body, the work any check of key reuse
//! needs. Skipped without `REDIS_URL`.

use std::sync::Arc;

use criterion::Criterion;
use redis::aio::ConnectionManager;
use sha2::{Digest, Sha256};
use tower::Layer;
use tower_idempotency::RedisStore;
use tower_idempotency::outcome::Receipt;
use tower_idempotency::store::Token;
use tower_idempotency::{IdempotencyLayer, Message};

use crate::raw_redis::MinimalRedis;

use super::{Hashing, NAMESPACE, Ours, Peer, Sender, TTL, compare, interleaved, provider, runtime};

/// The minimal commands, none of our code; with `hash_body`, SHA-256 over the body first.
#[derive(Clone)]
struct Minimal {
    manager: ConnectionManager,
    commands: Arc<MinimalRedis>,
    prefix: Arc<str>,
    hash_body: bool,
}

impl Sender for Minimal {
    async fn send(&mut self, message: Message) -> Receipt {
        if self.hash_body {
            let body = message.text().unwrap_or_default();
            std::hint::black_box(Sha256::digest(body.as_bytes()));
        }
        let key = message.idempotency_key().expect("keyed");
        let key = format!("{}{NAMESPACE}:{}", self.prefix, key.as_str());
        self.commands.send(&mut self.manager, &key, TTL, TTL).await;
        Receipt::new("msg_1", "bench")
    }
}

/// Benchmarks the three on `REDIS_URL`; skips when it is unset.
pub(super) fn bench(c: &mut Criterion) {
    let Some(url) = std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()) else {
        eprintln!("skipped: REDIS_URL is not set (peers/redis)");
        return;
    };
    let rt = runtime();
    let client = redis::Client::open(url.as_str()).expect("valid REDIS_URL");
    let prefix = format!("bench-peers:{}:", Token::new());
    let mut manager = rt
        .block_on(ConnectionManager::new(client.clone()))
        .expect("connect to REDIS_URL");
    let commands = Arc::new(rt.block_on(MinimalRedis::load(&mut manager)));

    // Ours as its users build it (`RedisStore::connect`: the store bounds each call, the
    // client sets no timer of its own); the minimal commands and the peer on the client's
    // defaults (a response timeout), as theirs would.
    let store = rt
        .block_on(RedisStore::connect(&url))
        .expect("connect to REDIS_URL")
        .key_prefix(prefix.clone());
    // Leased and kept as long as raw's records (and the peer's entries): the same commands,
    // and a run leaves nothing in the server for a day.
    let ours = IdempotencyLayer::builder()
        .store(store)
        .lease(TTL)
        .ttl(TTL)
        .build()
        .expect("valid layer")
        .layer(provider());
    let ours = Ours(ours);

    let minimal = Minimal {
        manager,
        commands,
        prefix: Arc::from(prefix.as_str()),
        hash_body: false,
    };
    let minimal_sha256 = Minimal {
        hash_body: true,
        ..minimal.clone()
    };
    let peer = |name: &str, hashing| Peer {
        store: Arc::new(
            rt.block_on(idempotent::store::valkey::ValkeyStore::with_prefix(
                client.clone(),
                Some(&format!("{prefix}{name}")),
            ))
            .expect("connect the peer"),
        ),
        hashing,
    };
    if let Some(rounds) = super::interleave::rounds("PEERS_INTERLEAVED") {
        for (name, side) in [("minimal", &minimal), ("minimal+sha256", &minimal_sha256)] {
            interleaved(
                &rt,
                "peers/redis",
                rounds,
                None,
                ("ours", || ours.clone()),
                (name, || side.clone()),
            );
        }
        let sha256 = peer("idempotent-sha256", Hashing::Sha256);
        interleaved(
            &rt,
            "peers/redis",
            rounds,
            None,
            ("ours", || ours.clone()),
            ("idempotent-sha256", || sha256.clone()),
        );
        return;
    }
    compare(c, "peers/redis", "ours", &rt, || ours.clone());
    compare(c, "peers/redis", "minimal", &rt, || minimal.clone());
    compare(c, "peers/redis", "minimal+sha256", &rt, || {
        minimal_sha256.clone()
    });
    for (name, hashing) in [
        ("idempotent-xxh3", Hashing::Shipped),
        ("idempotent-sha256", Hashing::Sha256),
    ] {
        let peer = peer(name, hashing);
        compare(c, "peers/redis", name, &rt, || peer.clone());
    }
}
