//! Keys hashed once per call: the store hashes a key with its `RandomState` when a call
//! begins, and that one hash picks the shard and finds the record, so no lookup hashes the
//! key again.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};
use std::sync::Arc;

/// A key and its hash by the store's hasher, made once per call.
#[derive(Clone, Copy)]
pub(super) struct Hashed<'a> {
    pub(super) hash: u64,
    pub(super) key: &'a str,
    /// The caller's own shared copy of the key, when it gave one: the store keeps a clone
    /// of it rather than a copy of the text.
    shared: Option<&'a Arc<str>>,
}

impl<'a> Hashed<'a> {
    /// `key` hashed by `hasher`, the store's.
    pub(super) fn new(hasher: &RandomState, key: &'a str) -> Self {
        Self {
            hash: hasher.hash_one(key),
            key,
            shared: None,
        }
    }

    /// `key` hashed by `hasher`; the store keeps `key` itself if it adds a record.
    pub(super) fn shared(hasher: &RandomState, key: &'a Arc<str>) -> Self {
        Self {
            shared: Some(key),
            ..Self::new(hasher, key)
        }
    }

    /// Which of `shards` holds the key. The bits are the hash's middle ones: a map's buckets
    /// take the low bits and its control bytes the top seven, so the keys of one shard still
    /// spread over all of its map.
    pub(super) fn shard(self, shards: usize) -> usize {
        ((self.hash >> 32) as usize) % shards
    }

    /// The store's copy of the key, with its hash.
    pub(super) fn stored(self) -> StoredKey {
        StoredKey {
            hash: self.hash,
            key: self.owned(),
        }
    }

    /// The key as the store keeps it: the caller's shared copy, or a copy of the text.
    pub(super) fn owned(self) -> Arc<str> {
        match self.shared {
            Some(shared) => Arc::clone(shared),
            None => Arc::from(self.key),
        }
    }
}

/// A key as the map keeps it: the store's copy and its hash.
pub(super) struct StoredKey {
    hash: u64,
    pub(super) key: Arc<str>,
}

impl StoredKey {
    /// `key` with `hash`, its hash by the store's hasher (kept from the call that made it).
    pub(super) fn with_hash(hash: u64, key: Arc<str>) -> Self {
        Self { hash, key }
    }

    /// The key and its hash, for a lookup that hashes nothing.
    pub(super) fn hashed(&self) -> Hashed<'_> {
        Hashed {
            hash: self.hash,
            key: &self.key,
            shared: None,
        }
    }
}

/// The records of a shard by key. Its hasher passes the hash each key carries through.
pub(super) type Map<V> = HashMap<StoredKey, V, BuildHasherDefault<PassThrough>>;

/// What the map compares, stored or borrowed: the hash, then the text.
pub(super) trait MapKey {
    fn parts(&self) -> (u64, &str);
}

impl MapKey for StoredKey {
    fn parts(&self) -> (u64, &str) {
        (self.hash, &self.key)
    }
}

impl MapKey for Hashed<'_> {
    fn parts(&self) -> (u64, &str) {
        (self.hash, self.key)
    }
}

impl Hashed<'_> {
    /// The key as the map's lookups take it.
    pub(super) fn lookup(&self) -> &dyn MapKey {
        self
    }
}

impl Hash for dyn MapKey + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.parts().0);
    }
}

impl PartialEq for dyn MapKey + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn MapKey + '_ {}

// A stored key hashes and compares as its borrowed form does, as `Borrow` requires.
impl Hash for StoredKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self as &dyn MapKey).hash(state);
    }
}

impl PartialEq for StoredKey {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for StoredKey {}

impl<'a> Borrow<dyn MapKey + 'a> for StoredKey {
    fn borrow(&self) -> &(dyn MapKey + 'a) {
        self
    }
}

/// The map's hasher: a key's hash is written once, as a `u64`, and passed through. (Other
/// writes, which the map never makes, are folded in rather than trusted.)
#[derive(Default)]
pub(super) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_key_is_found_by_its_borrowed_form_and_by_nothing_else() {
        let hasher = RandomState::new();
        let mut map: Map<u32> = Map::default();
        map.insert(Hashed::new(&hasher, "a").stored(), 1);
        map.insert(Hashed::new(&hasher, "b").stored(), 2);
        assert_eq!(map.get(Hashed::new(&hasher, "a").lookup()), Some(&1));
        assert_eq!(map.get(Hashed::new(&hasher, "b").lookup()), Some(&2));
        assert_eq!(map.get(Hashed::new(&hasher, "c").lookup()), None);
        // The same text under another hash is another key: hashes are never mixed.
        let forged = Hashed {
            hash: 1,
            ..Hashed::new(&hasher, "a")
        };
        assert_eq!(map.get(forged.lookup()), None);
    }

    #[test]
    fn shards_take_bits_the_map_does_not() {
        let hasher = RandomState::new();
        let mut per_shard = [0usize; 32];
        let mut low_bits_in_shard_0 = std::collections::HashSet::new();
        for n in 0..10_000 {
            let key = format!("k{n}");
            let hashed = Hashed::new(&hasher, &key);
            let shard = hashed.shard(32);
            per_shard[shard] += 1;
            if shard == 0 {
                low_bits_in_shard_0.insert(hashed.hash & 0xf);
            }
        }
        assert!(per_shard.iter().all(|&n| n > 200), "{per_shard:?}");
        // One shard's ~300 keys still take every value of the low bits, so its map's
        // buckets all fill (a shard picked by the low bits would leave it one).
        assert_eq!(low_bits_in_shard_0.len(), 16);
    }
}
