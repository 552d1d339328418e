//! `peers/redis/*`: our layer on a `RedisStore`, the `idempotent` crate's `ValkeyStore`, and
//! the raw commands our store issues through the same client. Skipped without `REDIS_URL`.

use std::sync::Arc;

use criterion::Criterion;
use redis::Script;
use redis::aio::ConnectionManager;
use tower::Layer;
use tower_idempotency::RedisStore;
use tower_idempotency::outcome::Receipt;
use tower_idempotency::store::Token;
use tower_idempotency::{Fingerprint, IdempotencyLayer, Message};

// TODO(baseline): the raw scripts are placeholders until raw has scripts of its own.
use crate::raw_redis::{COMPLETE_SCRIPT, RESERVE_SCRIPT, RawRedis};

use super::{Hashing, NAMESPACE, Ours, Peer, Sender, TTL, compare, interleaved, provider, runtime};

/// The commands `RedisStore` sends, none of our code.
#[derive(Clone)]
struct Raw {
    manager: ConnectionManager,
    commands: Arc<RawRedis>,
    prefix: Arc<str>,
}

impl Sender for Raw {
    async fn send(&mut self, message: Message) -> Receipt {
        let key = message.idempotency_key().expect("keyed");
        let key = format!("{}{NAMESPACE}:{}", self.prefix, key.as_str());
        let fingerprint = Fingerprint::of(&message);
        self.commands
            .send(&mut self.manager, &key, fingerprint, TTL, TTL)
            .await;
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
    let manager = rt
        .block_on(ConnectionManager::new(client.clone()))
        .expect("connect to REDIS_URL");

    let store = RedisStore::new(manager.clone()).key_prefix(prefix.clone());
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

    let raw = Raw {
        manager,
        commands: Arc::new(RawRedis {
            reserve: Script::new(RESERVE_SCRIPT),
            complete: Script::new(COMPLETE_SCRIPT),
        }),
        prefix: Arc::from(prefix.as_str()),
    };
    // Load the scripts once, as `RedisStore` does, so EVALSHA finds them.
    for script in [&raw.commands.reserve, &raw.commands.complete] {
        rt.block_on(script.prepare_invoke().load_async(&mut raw.manager.clone()))
            .expect("SCRIPT LOAD");
    }
    if let Some(rounds) = super::interleave::rounds("PEERS_INTERLEAVED") {
        interleaved(
            &rt,
            "peers/redis",
            rounds,
            None,
            ("ours", || ours.clone()),
            ("raw", || raw.clone()),
        );
        return;
    }
    compare(c, "peers/redis", "ours", &rt, || ours.clone());
    compare(c, "peers/redis", "raw", &rt, || raw.clone());

    for (name, hashing) in [
        ("idempotent-xxh3", Hashing::Shipped),
        ("idempotent-sha256", Hashing::Sha256),
    ] {
        let peer_prefix = format!("{prefix}{name}");
        let store = rt
            .block_on(idempotent::store::valkey::ValkeyStore::with_prefix(
                client.clone(),
                Some(&peer_prefix),
            ))
            .expect("connect the peer");
        let peer = Peer {
            store: Arc::new(store),
            hashing,
        };
        compare(c, "peers/redis", name, &rt, || peer.clone());
    }
}
