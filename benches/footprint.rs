//! `MemoryStore` memory per record: 100,000 done records put through `reserve` + `complete`,
//! the heap counted by a global allocator that tallies live bytes. Prints bytes per record.
//! `cargo bench --bench footprint`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use tower_idempotency::MemoryStore;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::outcome::{Outcome, Receipt};
use tower_idempotency::store::{Reservation, Store};

/// The system allocator, counting the bytes it holds for the program.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as it is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: as for `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const RECORDS: usize = 100_000;

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Made before counting: the keys are the caller's, not the store's.
    let keys: Vec<String> = (0..RECORDS)
        .map(|i| format!("default:order.created:ord_{i:06}:email"))
        .collect();
    let key_bytes: usize = keys.iter().map(String::len).sum();
    let outcome = Outcome::sent(Receipt::new("msg_0123456789abcdef", "resend"));
    let fingerprint = Fingerprint::from_bytes([7; 32]);
    let ttl = Duration::from_secs(3600);

    let before = LIVE.load(Ordering::Relaxed);
    let store = MemoryStore::with_max_entries(RECORDS);
    rt.block_on(async {
        for key in &keys {
            let Ok(Reservation::Reserved { token }) = store.reserve(key, fingerprint, ttl).await
            else {
                panic!("reserve of a fresh key");
            };
            assert!(
                store
                    .complete(key, token, fingerprint, &outcome, ttl)
                    .await
                    .expect("complete")
            );
        }
    });
    let held = LIVE.load(Ordering::Relaxed) - before;
    assert_eq!(store.len(), RECORDS);
    let per_record = held as f64 / RECORDS as f64;
    println!(
        "MemoryStore: {RECORDS} done records hold {held} bytes: {per_record:.0} bytes per record \
         (keys average {:.0} bytes; receipt id {} bytes)",
        key_bytes as f64 / RECORDS as f64,
        "msg_0123456789abcdef".len()
    );
    drop(store);
}
