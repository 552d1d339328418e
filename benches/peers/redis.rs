//! `peers/redis/*`: our layer on a `RedisStore`, the `idempotent` crate's `ValkeyStore`, and
//! the raw commands our store issues through the same client. Skipped without `REDIS_URL`.

use std::sync::Arc;

use criterion::Criterion;
use redis::Script;
use redis::aio::ConnectionManager;
use tower::Layer;
use tower_idempotency::outcome::Receipt;
use tower_idempotency::store::redis::{COMPLETE_SCRIPT, RESERVE_SCRIPT};
use tower_idempotency::store::{RedisStore, Token};
use tower_idempotency::{Fingerprint, IdempotencyLayer, Message};

use super::{Hashing, NAMESPACE, Ours, Peer, Sender, TTL, compare, provider, runtime};

const RECEIPT_JSON: &str =
    r#"{"sent":{"id":"msg_1","transport":"bench","accepted":[],"replayed":false}}"#;

/// The commands `RedisStore` issues for a send, built with `format!`, none of our code.
#[derive(Clone)]
struct Raw {
    manager: ConnectionManager,
    reserve: Arc<Script>,
    script: Arc<Script>,
    prefix: Arc<str>,
}

impl Sender for Raw {
    async fn send(&self, message: Message) -> Receipt {
        let key = message.idempotency_key().expect("keyed");
        let key = format!("{}{NAMESPACE}:{}", self.prefix, key.as_str());
        let fingerprint = Fingerprint::of(&message);
        let token = Token::new().to_string();
        let pending =
            format!(r#"{{"state":"pending","token":"{token}","fingerprint":"{fingerprint}"}}"#);
        let mut connection = self.manager.clone();
        let reserved: Vec<redis::Value> = self
            .reserve
            .key(&key)
            .arg(pending)
            .arg(fingerprint.to_string())
            .arg(TTL.as_millis() as u64)
            .arg(TTL.as_millis() as u64)
            .invoke_async(&mut connection)
            .await
            .expect("EVALSHA reserve");
        if reserved.first() != Some(&redis::Value::Int(0)) {
            return Receipt::new("msg_1", "bench");
        }
        let done = format!(
            r#"{{"state":"done","token":"{token}","fingerprint":"{fingerprint}","outcome":{RECEIPT_JSON}}}"#
        );
        let wrote: i64 = self
            .script
            .key(&key)
            .arg(&token)
            .arg(done)
            .arg(TTL.as_millis() as u64)
            .invoke_async(&mut connection)
            .await
            .expect("EVALSHA complete");
        assert_eq!(wrote, 1);
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
    let ours = IdempotencyLayer::new(store).layer(provider());
    compare(c, "peers/redis", "ours", &rt, Ours(ours));

    let raw = Raw {
        manager,
        reserve: Arc::new(Script::new(RESERVE_SCRIPT)),
        script: Arc::new(Script::new(COMPLETE_SCRIPT)),
        prefix: Arc::from(prefix.as_str()),
    };
    // Load the scripts once, as `RedisStore` does, so EVALSHA finds them.
    for script in [&raw.reserve, &raw.script] {
        rt.block_on(script.prepare_invoke().load_async(&mut raw.manager.clone()))
            .expect("SCRIPT LOAD");
    }
    compare(c, "peers/redis", "raw", &rt, raw);

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
        compare(c, "peers/redis", name, &rt, peer);
    }
}
