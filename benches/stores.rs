//! Networked stores against the raw commands they issue, in one run.
//!
//! Each backend runs when its URL is set (`REDIS_URL`, `DATABASE_URL`, `MYSQL_URL`) and its
//! feature is on:
//! `cargo bench --all-features --bench stores`. `record/*` (the stored form's encoding, no
//! server) always runs. With `STORES_INTERLEAVED=<rounds>`, the PostgreSQL and MySQL pairs and
//! the sqlx claims run in alternating slices instead of criterion's benchmarks, filtered by
//! the name filter criterion would take (`^prefix` or a substring).

use criterion::{Criterion, criterion_group, criterion_main};

#[cfg(feature = "sqlx")]
#[path = "stores/claim_sqlx.rs"]
mod claim_sqlx;
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[path = "common/filter.rs"]
mod filter;
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[path = "common/interleave.rs"]
mod interleave;
#[cfg(feature = "mysql")]
#[path = "stores/mysql.rs"]
mod mysql;
#[cfg(feature = "postgres")]
#[path = "stores/outbox.rs"]
mod outbox;
#[cfg(feature = "postgres")]
#[path = "stores/postgres.rs"]
mod postgres;
#[cfg(feature = "redis")]
#[path = "stores/raw_redis.rs"]
mod raw_redis;
#[path = "stores/record.rs"]
mod record;
#[cfg(feature = "redis")]
#[path = "stores/redis.rs"]
mod redis;
#[cfg(feature = "redis")]
#[path = "stores/redis_durable.rs"]
mod redis_durable;

fn benches(c: &mut Criterion) {
    record::bench(c);
    #[cfg(feature = "redis")]
    redis::bench(c);
    #[cfg(feature = "redis")]
    redis_durable::bench(c);
    #[cfg(feature = "postgres")]
    postgres::bench(c);
    #[cfg(feature = "postgres")]
    outbox::bench(c);
    #[cfg(feature = "sqlx")]
    claim_sqlx::bench(c);
    #[cfg(feature = "mysql")]
    mysql::bench(c);
    let _ = c;
}

criterion_group!(stores, benches);
criterion_main!(stores);
