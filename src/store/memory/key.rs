//! Keys hashed once per call: the store hashes a key with its `RandomState` when a call
//! begins, and that one hash picks the shard and finds the record, so no lookup hashes the
//! key again.

use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::Arc;

use hashbrown::HashTable;
use hashbrown::hash_table::{Entry, VacantEntry};

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
        // The key's bytes in one write: a `str`'s `Hash` adds a second write (a terminator
        // byte that keeps a tuple's fields apart), which a key hashed alone does not need.
        let mut state = hasher.build_hasher();
        state.write(key.as_bytes());
        Self {
            hash: state.finish(),
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
    fn owned(self) -> Arc<str> {
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
    /// Whether this is `key`: the same hash (compared first, as it rules out almost every
    /// other key at once) and the same text.
    fn is(&self, key: Hashed<'_>) -> bool {
        self.hash == key.hash && *self.key == *key.key
    }
}

/// The records of a shard by key, found by the hash each key carries: no lookup hashes
/// anything, and a table that grows moves its keys by the hashes they keep.
pub(super) struct Map<V> {
    table: HashTable<(StoredKey, V)>,
}

/// A key's place in a [`Map`], from one lookup: its value, or room for one.
pub(super) enum Slot<'a, V> {
    Taken(&'a mut V),
    Free(Free<'a, V>),
}

/// Room for a key's value in a [`Map`], found by [`Map::slot`].
pub(super) struct Free<'a, V> {
    room: VacantEntry<'a, (StoredKey, V)>,
}

impl<V> Free<'_, V> {
    /// Fills the room with `key`, the store's copy of the key it was found for, and `value`.
    pub(super) fn fill(self, key: StoredKey, value: V) {
        self.room.insert((key, value));
    }
}

impl<V> Default for Map<V> {
    fn default() -> Self {
        Self {
            table: HashTable::new(),
        }
    }
}

impl<V> Map<V> {
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    pub(super) fn get(&self, key: Hashed<'_>) -> Option<&V> {
        let (_, value) = self.table.find(key.hash, |(k, _)| k.is(key))?;
        Some(value)
    }

    pub(super) fn get_mut(&mut self, key: Hashed<'_>) -> Option<&mut V> {
        let (_, value) = self.table.find_mut(key.hash, |(k, _)| k.is(key))?;
        Some(value)
    }

    /// The value of `key`, or room for one, from a single lookup.
    pub(super) fn slot(&mut self, key: Hashed<'_>) -> Slot<'_, V> {
        match self
            .table
            .entry(key.hash, |(k, _)| k.is(key), |(k, _)| k.hash)
        {
            Entry::Occupied(taken) => Slot::Taken(&mut taken.into_mut().1),
            Entry::Vacant(room) => Slot::Free(Free { room }),
        }
    }

    /// Adds `value` under `key`, which the map does not hold.
    pub(super) fn insert_new(&mut self, key: StoredKey, value: V) {
        self.table
            .insert_unique(key.hash, (key, value), |(k, _)| k.hash);
    }

    pub(super) fn remove(&mut self, key: Hashed<'_>) -> Option<V> {
        let found = self.table.find_entry(key.hash, |(k, _)| k.is(key)).ok()?;
        let ((_, value), _) = found.remove();
        Some(value)
    }

    /// The value under a key whose hash is `hash` that `is` picks out (one at most, as a
    /// unique version in the value does): how an index finds a record without its key.
    pub(super) fn find(&self, hash: u64, mut is: impl FnMut(&V) -> bool) -> Option<&V> {
        let (_, value) = self.table.find(hash, |(_, v)| is(v))?;
        Some(value)
    }

    /// Takes out the value [`find`](Self::find) would answer, from the same one lookup.
    pub(super) fn remove_found(&mut self, hash: u64, mut is: impl FnMut(&V) -> bool) -> Option<V> {
        let found = self.table.find_entry(hash, |(_, v)| is(v)).ok()?;
        let ((_, value), _) = found.remove();
        Some(value)
    }

    /// Every key with its value, in no order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&StoredKey, &V)> {
        self.table.iter().map(|(key, value)| (key, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_the_value_there_or_room_for_one_and_a_value_is_found_by_its_hash() {
        let hasher = RandomState::new();
        let mut map: Map<u32> = Map::default();
        let a = Hashed::new(&hasher, "a");
        match map.slot(a) {
            Slot::Free(room) => room.fill(a.stored(), 1),
            Slot::Taken(_) => panic!("an empty map holds nothing"),
        }
        match map.slot(a) {
            Slot::Taken(value) => *value += 1,
            Slot::Free(_) => panic!("the key was just added"),
        }
        assert_eq!((map.get(a), map.len()), (Some(&2), 1));
        // Found by the hash and the value, as the indexes find records.
        assert_eq!(map.find(a.hash, |&v| v == 1), None);
        assert_eq!(map.find(a.hash, |&v| v == 2), Some(&2));
        assert_eq!(
            map.remove_found(a.hash, |&v| v == 1),
            None,
            "not picked: kept"
        );
        assert_eq!(map.get(a), Some(&2));
        assert_eq!(map.remove_found(a.hash, |&v| v == 2), Some(2));
        assert_eq!((map.get(a), map.len()), (None, 0));
        assert_eq!(map.remove(a), None);
    }

    #[test]
    fn a_table_that_grows_still_finds_every_key() {
        let hasher = RandomState::new();
        let keys: Vec<String> = (0..5_000).map(|n| format!("k{n}")).collect();
        let mut map: Map<usize> = Map::default();
        for (n, key) in keys.iter().enumerate() {
            map.insert_new(Hashed::new(&hasher, key).stored(), n);
        }
        for (n, key) in keys.iter().enumerate() {
            assert_eq!(map.get(Hashed::new(&hasher, key)), Some(&n));
        }
        assert_eq!(map.iter().count(), keys.len());
    }

    #[test]
    fn a_stored_key_is_found_by_its_hash_and_text_and_by_nothing_else() {
        let hasher = RandomState::new();
        let mut map: Map<u32> = Map::default();
        map.insert_new(Hashed::new(&hasher, "a").stored(), 1);
        map.insert_new(Hashed::new(&hasher, "b").stored(), 2);
        assert_eq!(map.get(Hashed::new(&hasher, "a")), Some(&1));
        assert_eq!(map.get(Hashed::new(&hasher, "b")), Some(&2));
        assert_eq!(map.get(Hashed::new(&hasher, "c")), None);
        // The same text under another hash is another key: hashes are never mixed.
        let forged = Hashed {
            hash: 1,
            ..Hashed::new(&hasher, "a")
        };
        assert_eq!(map.get(forged), None);
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
