//! [`ExpiryIndex`]: a shard's records by their place in time, to drop expired ones first.
//!
//! Most records are placed twice within moments: pending at their reserve, and moved to
//! their done place when the send completes. An insert into and a removal from a `BTreeMap`
//! cost ~0.4 k instructions each, so the newest places wait in a short queue before they go
//! into the tree: a place taken out soon after it was put in (a send that completes before
//! [`RECENT`] other places are indexed in its shard) never touches the tree. Every place is
//! in exactly one of the two, so what the index answers is what a tree alone would answer.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// How many of the newest places wait outside the tree.
const RECENT: usize = 32;

/// Keys by a unique, ordered place `O` (a time, then a version to break ties).
pub(super) struct ExpiryIndex<O> {
    tree: BTreeMap<O, Arc<str>>,
    /// The newest places, oldest first; at most [`RECENT`].
    recent: VecDeque<(O, Arc<str>)>,
}

impl<O: Ord> ExpiryIndex<O> {
    pub(super) fn new() -> Self {
        Self {
            tree: BTreeMap::new(),
            recent: VecDeque::new(),
        }
    }

    /// Places `key` at `place`, which no other key holds.
    pub(super) fn insert(&mut self, place: O, key: Arc<str>) {
        if self.recent.len() >= RECENT
            && let Some((oldest, key)) = self.recent.pop_front()
        {
            self.tree.insert(oldest, key);
        }
        self.recent.push_back((place, key));
    }

    /// Takes out the key at `place`, if one is there. The newest places are looked at first:
    /// they are the likeliest to go (a send completing).
    pub(super) fn remove(&mut self, place: &O) -> Option<Arc<str>> {
        match self.recent.iter().rposition(|(p, _)| p == place) {
            Some(i) => self.recent.remove(i).map(|(_, key)| key),
            None => self.tree.remove(place),
        }
    }

    /// Takes out the key at the earliest place, when `due` says that place is due.
    pub(super) fn pop_first_if(&mut self, due: impl Fn(&O) -> bool) -> Option<Arc<str>> {
        // The earliest place may be among the newest (a shorter lease than the others'):
        // the queue goes into the tree first, so the tree's first place is the earliest.
        while let Some((place, key)) = self.recent.pop_front() {
            self.tree.insert(place, key);
        }
        let first = self.tree.first_entry()?;
        due(first.key()).then(|| first.remove())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::{ExpiryIndex, RECENT};

    /// The index against a plain `BTreeMap` under the same random operations: inserts of
    /// places near the newest (as reserves and completes make them) and far from it,
    /// removals of the newest, of random and of absent places, and pops of due places.
    /// Each answer must be the map's.
    #[test]
    fn answers_as_an_ordered_map_would() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |bound: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % bound
        };
        let mut index = ExpiryIndex::new();
        let mut model: BTreeMap<(u64, u64), Arc<str>> = BTreeMap::new();
        let mut placed: Vec<(u64, u64)> = Vec::new();
        let mut version = 0;
        let (mut removed_recent, mut popped) = (0, 0);
        for _ in 0..20_000 {
            match next(50) {
                0..=21 => {
                    version += 1;
                    let time = if next(4) == 0 {
                        next(1_000)
                    } else {
                        900 + next(100)
                    };
                    let key: Arc<str> = Arc::from(format!("k{version}"));
                    index.insert((time, version), Arc::clone(&key));
                    model.insert((time, version), key);
                    placed.push((time, version));
                }
                22..=45 if !placed.is_empty() => {
                    // Mostly one of the newest places, as a completing send removes.
                    let newest = placed.len().saturating_sub(RECENT);
                    let i = if next(3) > 0 {
                        newest + next((placed.len() - newest) as u64) as usize
                    } else {
                        next(placed.len() as u64) as usize
                    };
                    let place = placed.swap_remove(i);
                    if index.recent.iter().any(|(p, _)| *p == place) {
                        removed_recent += 1;
                    }
                    assert_eq!(index.remove(&place), model.remove(&place));
                }
                46 | 47 => {
                    let absent = (next(1_000), u64::MAX);
                    assert_eq!(index.remove(&absent), None);
                }
                _ => {
                    let now = next(1_000);
                    let due = |p: &(u64, u64)| p.0 <= now;
                    let expected = model.first_entry().filter(|e| due(e.key())).map(|e| {
                        let place = *e.key();
                        placed.retain(|p| *p != place);
                        e.remove()
                    });
                    let got = index.pop_first_if(due);
                    popped += usize::from(got.is_some());
                    assert_eq!(got, expected);
                }
            }
            assert!(index.recent.len() <= RECENT);
        }
        // Both paths were taken many times.
        assert!(
            removed_recent > 1_000,
            "{removed_recent} removals from the queue"
        );
        assert!(popped > 100, "{popped} due places popped");
    }
}
