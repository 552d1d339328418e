//! `record/*`: what the networked stores' record encoding costs on our side, per send, with
//! no server: the JSON `RedisStore` writes and reads around its scripts.
//!
//! - `encode-pending`: the pending record a reserve sends (every reserve, fresh or replay).
//! - `encode-done`: the done record a complete sends (a fresh send).
//! - `decode-done`: the done record a replayed reserve gets back, times included.
//! - `fingerprint-hex`, `token-text`: the fingerprint and the token as text, part of each.
//! - `fresh-send` and `replay`: the encoding work of one reserve + complete of a fresh key
//!   (two encodes), and of one replayed reserve (an encode, a decode).
//!
//! Compare with a round trip of `peers/redis/*` or `redis/*` in the same run. Runs without a
//! server: `cargo bench --bench stores -- record/`.

use std::hint::black_box;

use criterion::Criterion;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::{Outcome, Receipt};
use tower_idempotency::store::record::{decode_record, encode_record};
use tower_idempotency::store::{Record, Token};

pub(crate) fn bench(c: &mut Criterion) {
    let token = Token::new();
    let fingerprint = Fingerprint::from_bytes([0x5a; 32]);
    let pending = Record::pending(fingerprint);
    let done = Record::done(fingerprint, Outcome::sent(Receipt::new("msg_1", "bench")));
    // As the complete script leaves it: the first attempt's time put in its place.
    let written = encode_record(token, &done).expect("encodes");
    let mut stored = written[..102].to_vec();
    stored.extend_from_slice(b"86403000");
    stored.extend_from_slice(&written[102..]);
    assert!(decode_record(&stored).is_ok());

    let mut g = c.benchmark_group("record");
    g.bench_function("encode-pending", |b| {
        b.iter(|| encode_record(black_box(token), black_box(&pending)))
    });
    g.bench_function("encode-done", |b| {
        b.iter(|| encode_record(black_box(token), black_box(&done)))
    });
    g.bench_function("decode-done", |b| {
        b.iter(|| decode_record(black_box(&stored)))
    });
    // Parts of the above: the fingerprint's hex (its `Display`, which `Serialize` uses) and
    // the token's text, each written once into every record.
    g.bench_function("fingerprint-hex", |b| {
        b.iter(|| black_box(fingerprint).to_string())
    });
    g.bench_function("token-text", |b| b.iter(|| black_box(token).to_string()));
    g.bench_function("fresh-send", |b| {
        b.iter(|| {
            let p = encode_record(black_box(token), black_box(&pending));
            let d = encode_record(black_box(token), black_box(&done));
            (p, d)
        })
    });
    g.bench_function("replay", |b| {
        b.iter(|| {
            let p = encode_record(black_box(token), black_box(&pending));
            let r = decode_record(black_box(&stored));
            (p, r)
        })
    });
    g.finish();
}
